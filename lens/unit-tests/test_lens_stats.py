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

    def test_pytorchs_largest_active_block_of_the_device(self):
        snap = {"segments": [
            {"device": 0, "blocks": [{"size": 64 * MiB, "state": "active_allocated"},
                                     {"size": 512 * MiB, "state": "inactive"}]},
            {"device": 0, "blocks": [{"size": 96 * MiB, "state": "active_pending_free"}]},
            {"device": 1, "blocks": [{"size": 900 * MiB, "state": "active_allocated"}]},
        ]}
        self.assertEqual(torch_lens._largest_active(snap, 0), 96 * MiB)
        self.assertEqual(torch_lens._largest_active(snap, 2), ring.UNKNOWN)

    def test_pytorchs_stats_carry_it(self):
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            memory_stats=lambda device: {"inactive_split_bytes.all.current": 5 * MiB}))
        torch_lens._emit_stats(torch, 0, 96 * MiB)
        torch_lens._emit_stats(torch, 0)
        self.assertEqual([r[5] for r in self.emit.records], [96 * MiB, ring.UNKNOWN])
        self.assertEqual(self.emit.records[0][:4], (ring.STATS, ring.PYTORCH, 0, 5 * MiB))

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
