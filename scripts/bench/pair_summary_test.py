#!/usr/bin/env python3
"""Tests of pair_summary.py's judging of issue #15's targets, on made-up runs whose
figures sit on each side of every threshold (run by scripts/test.sh)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pair_summary.py")


def run(config, threads, rnd, alloc_added, free_added, alloc_p99=20, free_p99=20, mean=None):
    """One bench_pair process: plain calls of 300 / 400 ns (p99 +100), hooked ones `*_added`
    more at the median and `*_p99` more at the p99."""
    row = {"config": config, "round": rnd, "threads": threads, "minflt": 0, "majflt": 0, "errors": 0}
    for call, plain, add, add99 in (("alloc", 300, alloc_added, alloc_p99), ("free", 400, free_added, free_p99)):
        row.update({
            f"plain_{call}_p50_ns": plain, f"plain_{call}_p99_ns": plain + 100, f"plain_{call}_p999_ns": plain + 500,
            f"hooked_{call}_p50_ns": plain + add, f"hooked_{call}_p99_ns": plain + 100 + add99,
            f"hooked_{call}_p999_ns": plain + 500 + add99,
            f"paired_{call}_p50_ns": add, f"paired_{call}_mean_ns": add if mean is None else mean,
        })
    return row


def targets(rows, driver):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    try:
        out = subprocess.run([sys.executable, SCRIPT, f.name, "--targets", driver],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    return out[out.index("#15 targets"):].splitlines()


def line(lines, start):
    found = [l for l in lines if l.strip().startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0]


class Targets(unittest.TestCase):
    def test_h200_median_at_and_over_30_ns(self):
        at = targets([run("hooked", 1, r, 30, 29) for r in range(3)], "h200")
        self.assertTrue(line(at, "1 thread, added p50").endswith(": met"), at)
        over = targets([run("hooked", 1, r, 30, 31) for r in range(3)], "h200")
        self.assertIn("NOT MET", line(over, "1 thread, added p50"))

    def test_the_median_over_rounds_is_judged_not_one_round(self):
        rows = [run("hooked", 1, 0, 80, 20), run("hooked", 1, 1, 25, 20), run("hooked", 1, 2, 28, 20)]
        self.assertIn("alloc +28", line(targets(rows, "h200"), "1 thread, added p50"))

    def test_p99_over_100_ns_is_not_met(self):
        rows = [run("hooked", 1, r, 20, 20, alloc_p99=101) for r in range(3)]
        self.assertIn("NOT MET", line(targets(rows, "h200"), "1 thread, added p99"))
        rows = [run("hooked", 1, r, 20, 20, alloc_p99=100, free_p99=100) for r in range(3)]
        self.assertTrue(line(targets(rows, "h200"), "1 thread, added p99").endswith(": met"))

    def test_the_floor_is_shown_beside_and_not_judged(self):
        rows = [run("hooked", 1, 0, 20, 20), run("floor", 1, 0, 41, 32)]
        out = targets(rows, "h200")
        self.assertIn("the floor, same rounds: +41 / +32", line(out, "1 thread, added p50"))
        self.assertFalse(any("floor:" in l for l in out), out)

    def test_sim_median_and_the_16_thread_ratio(self):
        rows = [run("hooked", 1, 0, 15, 10), run("hooked", 16, 0, 18, 12)]
        out = targets(rows, "sim")
        self.assertTrue(line(out, "1 thread, added p50 <= 15").endswith(": met"), out)
        self.assertTrue(line(out, "16 threads, added p50 <= 1.2x").endswith(": met"), out)
        rows = [run("hooked", 1, 0, 15, 10), run("hooked", 16, 0, 19, 12)]
        self.assertIn("NOT MET", line(targets(rows, "sim"), "16 threads, added p50 <= 1.2x"))

    def test_sim_p99_is_judged_at_every_thread_count(self):
        rows = [run("hooked", 1, 0, 10, 10), run("hooked", 16, 0, 10, 10, free_p99=300)]
        out = targets(rows, "sim")
        self.assertTrue(line(out, "1 thread, added p99").endswith(": met"), out)
        self.assertIn("NOT MET", line(out, "16 threads, added p99"))

    def test_a_run_without_one_thread_says_so(self):
        out = targets([run("lanes16", 16, 0, 10, 10)], "sim")
        self.assertIn("NOT MEASURED", line(out, "1 thread"))


if __name__ == "__main__":
    unittest.main()
