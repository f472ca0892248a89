"""Unit tests of the lenses' `framework_stats` records: the largest allocation each lens
reports (the fit's demand: requests served from the cache, which the driver never sees).
Run: python3 lens/unit-tests/test_lens_stats.py"""

import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vramhook_lens import jax_lens, ring, torch_lens  # noqa: E402

MiB = 1 << 20


class Recorded:
    """Stands in for ring.emit: keeps each record's fields."""

    def __init__(self):
        self.records = []

    def __call__(self, kind, framework, device, a, b, c, d, pieces=0):
        self.records.append((kind, framework, device, a, b, c, d))


class LensStats(unittest.TestCase):
    def setUp(self):
        self.emit = Recorded()
        self.saved = ring.emit
        ring.emit = self.emit

    def tearDown(self):
        ring.emit = self.saved

    def test_pytorchs_largest_request_given_back(self):
        def seg(addr, size, *blocks, device=0):
            return {"device": device, "address": addr, "total_size": size,
                    "blocks": [{"address": addr + o, "size": sz, "state": st} for o, sz, st in blocks]}
        before = {"segments": [
            seg(0, 1024 * MiB, (0, 1024 * MiB, "active_allocated")),  # held whole since: weights
            seg(1 << 40, 96 * MiB, (0, 64 * MiB, "active_allocated"), (64 * MiB, 32 * MiB, "inactive")),
            seg(2 << 40, 40 * MiB, (0, 40 * MiB, "active_allocated")),
            seg(3 << 40, 900 * MiB, (0, 900 * MiB, "inactive"), device=1),
        ]}
        # A segment split or free is a request given back; one held whole is not.
        self.assertEqual(torch_lens._largest_request(before, 0), 96 * MiB)
        self.assertEqual(torch_lens._largest_request(before, 1), 900 * MiB)
        self.assertEqual(torch_lens._largest_request(before, 2), ring.UNKNOWN)
        # The 40 MiB block gone at the next snapshot (its segment released): given back.
        after = {"segments": before["segments"][:2]}
        active = torch_lens._active_blocks(before, 0)
        self.assertEqual(torch_lens._largest_request({"segments": before["segments"][:1]}, 0, active), 64 * MiB)
        self.assertEqual(torch_lens._largest_request(after, 0, active), 96 * MiB)
        # With expandable segments a segment's size is no request's: blocks gone count only.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        try:
            self.assertEqual(torch_lens._largest_request(after, 0, active), 40 * MiB)
            self.assertEqual(torch_lens._largest_request(before, 0), ring.UNKNOWN)
        finally:
            del os.environ["PYTORCH_CUDA_ALLOC_CONF"]

    def test_pytorchs_stats_carry_it(self):
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            memory_stats=lambda device: {"inactive_split_bytes.all.current": 5 * MiB}))
        torch_lens._emit_stats(torch, 0, 96 * MiB)
        torch_lens._emit_stats(torch, 0)
        self.assertEqual([r[5] for r in self.emit.records], [96 * MiB, ring.UNKNOWN])
        self.assertEqual(self.emit.records[0][:4], (ring.STATS, ring.PYTORCH, 0, 5 * MiB))

    def test_pytorchs_expandable_segments_strand_nothing(self):
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            memory_stats=lambda device: {"inactive_split_bytes.all.current": 5 * MiB}))
        saved = {k: os.environ.pop(k, None) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        try:
            for name, conf, stranded in [
                ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128, expandable_segments:True", 0),
                ("PYTORCH_ALLOC_CONF", "expandable_segments:true", 0),
                ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False", 5 * MiB),
            ]:
                os.environ[name] = conf
                self.emit.records.clear()
                torch_lens._emit_stats(torch, 0)
                del os.environ[name]
                self.assertEqual(self.emit.records[0][3], stranded, conf)
        finally:
            for k, v in saved.items():
                if v is not None:
                    os.environ[k] = v

    def test_jaxs_largest_alloc_size_and_limit(self):
        class Device:
            def __init__(self, stats):
                self.stats = stats

            def memory_stats(self):
                return self.stats

        jax_lens._emit_stats(Device({"bytes_limit": 8 << 30, "largest_alloc_size": 300 * MiB}), 0)
        jax_lens._emit_stats(Device({"largest_alloc_size": 300 * MiB}), 1)
        jax_lens._emit_stats(Device({}), 2)  # nothing known: no record
        self.assertEqual([(r[2], r[4], r[5]) for r in self.emit.records],
                         [(0, 8 << 30, 300 * MiB), (1, ring.UNKNOWN, 300 * MiB)])


if __name__ == "__main__":
    unittest.main()
