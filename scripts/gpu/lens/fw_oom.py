"""CuPy or JAX on the GPU machine: fill the device with 1 GiB buffers (until the framework
raises), free them all (they stay cached), keep 600 MiB in each cached chunk, wait for the
lens to sample, then ask for 2 GiB. Prints JSON lines: the framework's own numbers before
the request ("before") and after its OOM ("oom").
    fw_oom.py cupy|jax OUT            the OOM case (run under vramhook run)
    fw_oom.py bench cupy|jax          µs per lens sample (sample_once) over a cache of 2,000 buffers
For JAX set XLA_PYTHON_CLIENT_PREALLOCATE=false and XLA_PYTHON_CLIENT_MEM_FRACTION=1.0, so
the pool grows from the driver and a failed growth is a driver failure."""
import json
import os
import sys
import time

MiB, GiB = 1 << 20, 1 << 30
fw = sys.argv[2] if sys.argv[1] == "bench" else sys.argv[1]


def say(**kw):
    print(json.dumps(kw), flush=True)


if fw == "cupy":
    import cupy

    pool = cupy.get_default_memory_pool()
    OOM = cupy.cuda.memory.OutOfMemoryError

    def alloc(n):
        return cupy.empty((n,), dtype=cupy.uint8)

    def drop(x):
        del x

    def numbers():
        return {"reserved": pool.total_bytes(), "allocated": pool.used_bytes(), "largest": None}
else:
    import jax
    import jax.numpy as jnp

    dev = jax.local_devices()[0]
    OOM = Exception

    def alloc(n):
        return jax.block_until_ready(jnp.zeros((n,), dtype=jnp.uint8))

    def drop(x):
        x.delete()

    def numbers():
        st = dev.memory_stats()
        return {"reserved": st.get("pool_bytes", st.get("bytes_reserved")), "allocated": st["bytes_in_use"],
                "largest": st.get("largest_free_block_bytes")}

if sys.argv[1] == "bench":
    sys.path.insert(0, os.environ.get("VRAMHOOK_LENS_DIR", "lens"))
    from vramhook_lens import cupy_lens, jax_lens

    keep = [alloc((i % 64 + 1) * MiB) for i in range(2000)]
    for i in range(0, len(keep), 3):
        drop(keep[i])
        keep[i] = None
    sample = (lambda: cupy_lens.sample_once(cupy)) if fw == "cupy" else (lambda: jax_lens.sample_once(jax))
    sample()
    n = 500
    t = time.perf_counter()
    for _ in range(n):
        got = sample()
    us = (time.perf_counter() - t) / n * 1e6
    say(framework=fw, sample_us=us, samples=got, cpu_percent_at_1s=us / 1e4)
    sys.exit(0)

# Let the lens sample the empty pool first (a program that dies early still leaves samples).
time.sleep(float(os.environ.get("FW_WAIT_S", "3")) / 3)
bufs = []
try:
    while True:
        bufs.append(alloc(GiB))
except OOM as e:
    say(phase="fill_oom", buffers=len(bufs), error=str(e)[:200])
for b in bufs:
    drop(b)
b = bufs = None  # the loop variable held the last buffer
say(phase="freed", **numbers())
kept = []
try:
    for _ in range(max(1, int(numbers()["reserved"] // GiB))):
        kept.append(alloc(600 * MiB))
except OOM as e:
    say(phase="keep_oom", kept=len(kept), error=str(e)[:300], **numbers())
n = numbers()
say(phase="before", kept=len(kept), **n)
time.sleep(float(os.environ.get("FW_WAIT_S", "3")))
# Between the largest free block and all the cache's free bytes, where the framework says
# its largest block (JAX: its BFC allocator coalesces, so 2 GiB would fit); else 2 GiB.
free = (n["reserved"] or 0) - (n["allocated"] or 0)
ask = n["largest"] + (free - n["largest"]) // 2 if n["largest"] and free > n["largest"] + 2 * MiB else 2 * GiB
say(phase="ask", bytes=ask)
try:
    alloc(ask)
    say(phase="no_oom", **numbers())
except OOM as e:
    say(phase="oom", error=str(e)[:300], **numbers())
