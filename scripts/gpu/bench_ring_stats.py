#!/usr/bin/env python3
"""bench_ring_stats.py RING_DIR: one JSON line of what the hooked benchmark left in its
ring (read from the ring header, see ring/src/lib.rs): lanes, events written
(the lanes' write cursors summed) and events dropped. A hooked run that dropped events
measured the cheaper drop path, not the recording one."""
import json
import os
import struct
import sys

d = sys.argv[1]
rings = [f for f in os.listdir(d) if f.endswith(".ring")]
if len(rings) != 1:
    print(json.dumps({"error": f"expected one ring in {d}, found {len(rings)}"}))
    sys.exit(1)
with open(os.path.join(d, rings[0]), "rb") as f:
    head = f.read(4096)
if head[:8] != b"VRHKRING":
    print(json.dumps({"error": "not a ring"}))
    sys.exit(1)
lanes = struct.unpack_from("<I", head, 80)[0] or 1
written = struct.unpack_from("<Q", head, 256)[0]
for lane in range(1, lanes):
    written += struct.unpack_from("<Q", head, 1024 + (lane - 1) * 64)[0]
dropped = struct.unpack_from("<Q", head, 384)[0]
capacity = struct.unpack_from("<Q", head, 16)[0]
clock = {0: "monotonic", 1: "tsc"}.get(struct.unpack_from("<I", head, 48)[0], "unknown")
print(json.dumps({"ring_lanes": lanes, "ring_slots_per_lane": capacity, "ring_events": written, "ring_dropped": dropped,
                  "ring_clock": clock}))
