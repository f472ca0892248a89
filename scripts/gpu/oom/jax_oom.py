"""A real JAX (XLA BFC allocator) OOM with its allocator dump, from a fragmenting program.

usage: jax_oom.py
Fills a BFC pool (XLA_PYTHON_CLIENT_MEM_FRACTION, default here 0.05 of the GPU) with
64 MiB arrays, frees every other one, then asks for more than the largest free chunk but
less than all the free bytes. XLA logs its BFC dump (bins, chunks, Stats:) on stderr."""
import json
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.05")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
import jax
import jax.numpy as jnp

MiB = 1 << 20
arrays = []
try:
    while True:
        a = jnp.zeros((64 * MiB // 4,), dtype=jnp.float32)
        a.block_until_ready()
        arrays.append(a)
except Exception as e:  # noqa: BLE001 - XLA raises its own error type
    print(json.dumps({"phase": "filled", "arrays": len(arrays), "error": type(e).__name__}), flush=True)
for a in arrays[::2]:
    a.delete()
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"phase": "fragmented", "pid": os.getpid(), "stats": {k: int(v) for k, v in stats.items()}}), flush=True)
request = 4 * 64 * MiB  # four freed neighbours' worth: never contiguous, always free in total
b = jnp.zeros((request // 4,), dtype=jnp.float32)
b.block_until_ready()
print(json.dumps({"phase": "no_oom"}), flush=True)
