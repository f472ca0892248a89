"""The checker on made-up results: the H200's numbers as they should come out pass; each
mutation (the async mode counted as its live allocations only, as before the pool samples;
its 128 streams not counted; an overhead 3 % off in one mode; a missing mode) must fail.
Exit 1 if the checker is wrong."""
import contextlib
import io
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pools_check  # noqa: E402

CONTEXT = 543_162_368  # NVML − reserved on the H200 (cuda-facts.md)
RESERVED = {"default": 1_564_475_392, "expandable": 1_551_892_480, "async": 1_543_503_872}
LIVE = {"default": 1_564_475_392, "expandable": 1_551_892_480, "async": 807_403_520}
# PyTorch's stream pool (128 streams) in the async mode only, as vramhook counts it, and the
# driver's 70 MiB for it in NVML's figure.
STREAMS = {"default": 0, "expandable": 0, "async": 128}
STREAM_BYTES = 560 << 10
NVML_STREAMS = {"default": 0, "expandable": 0, "async": 70 << 20}


def write(d, held=None, nvml=None, skip=(), streams=None):
    for mode in pools_check.MODES:
        if mode in skip:
            continue
        h = (held or {}).get(mode, RESERVED[mode])
        used = (nvml or {}).get(mode, RESERVED[mode] + CONTEXT + NVML_STREAMS[mode])
        n = (streams or STREAMS)[mode]
        with open(os.path.join(d, mode + ".out"), "w") as f:
            f.write(json.dumps({"phase": "point", "mode": mode, "pid": 7, "reserved": RESERVED[mode],
                                "allocated": 807_403_520, "nvml_used": used, "nvml_source": "made up",
                                "nvml_match": "by pid", "nvml_processes": [[7, used]]}) + "\n")
        with open(os.path.join(d, mode + ".summary.json"), "w") as f:
            json.dump({"processes": [{"pid": 7, "command": "python3 scripts/gpu/pools/pools_probe.py " + mode,
                                      "final_held_bytes": h, "final_live_bytes": LIVE[mode], "exit_status": 0,
                                      "dropped_events": 0, "final_streams": n,
                                      "final_stream_bytes": n * STREAM_BYTES}]}, f)


def outcome(**kw):
    with tempfile.TemporaryDirectory() as d:
        write(d, **kw)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            rc = pools_check.check(d)
        return rc, out.getvalue()


cases = [
    ("the H200's numbers", {}, 0),
    ("async counted as its live allocations", {"held": {"async": LIVE["async"]}}, 1),
    ("the async mode's streams not counted", {"streams": {"default": 0, "expandable": 0, "async": 0}}, 1),
    ("one mode's NVML 3 % off", {"nvml": {"expandable": RESERVED["expandable"] + int(CONTEXT * 1.03)}}, 1),
    ("a mode missing", {"skip": ("expandable",)}, 1),
]
bad = 0
for name, kw, want in cases:
    rc, text = outcome(**kw)
    ok = rc == want
    bad += 0 if ok else 1
    print("%s checker self-test: %s -> exit %d (want %d)" % ("PASS" if ok else "FAIL", name, rc, want))
    if not ok:
        print(text)
sys.exit(1 if bad else 0)
