"""Issue #29's cases on the GPU machine, one program each (run under `vramhook run`).

  python3 programs.py CASE
  jax_frag        JAX, default preallocation: fill with 1 GiB arrays, drop every other, ask 2 GiB
  cupy_recover    CuPy: fill with 1 GiB blocks, free every other (they stay in CuPy's pool),
                  ask 3 GiB: CuPy frees its cache and the request succeeds (exit 0)
  cupy_fatal      CuPy: fill with 1 GiB blocks and keep them all, ask 3 GiB (exit 1)
  torch_smallpool PyTorch: 512 KiB tensors until the device is full (exit 1)
  torch_fraction  PyTorch under set_per_process_memory_fraction(0.03): 100 MiB tensors up to
                  3.8 GiB, then 648 MiB (exit 1; the message names "X allowed")
  torch_async     PyTorch, backend:cudaMallocAsync: 20 tensors of 7..140 MiB, every other freed,
                  then idle 4 s (the agent's held bytes against memory_reserved())
Each prints JSON lines with the framework's own numbers; an uncaught OOM goes to stderr.
"""
import json
import os
import sys
import time

GiB = 1 << 30
MiB = 1 << 20
case = sys.argv[1]


def out(**kw):
    kw.update(case=case, pid=os.getpid(), t=time.monotonic())
    print(json.dumps(kw), flush=True)


if case == "jax_frag":
    import jax
    import jax.numpy as jnp
    arrays = []
    try:
        while True:
            arrays.append(jnp.ones((GiB // 4,), dtype=jnp.float32))
            arrays[-1].block_until_ready()
    except Exception as e:  # RESOURCE_EXHAUSTED while filling
        out(phase="full", arrays=len(arrays), error=type(e).__name__)
    del arrays[::2]
    st = jax.local_devices()[0].memory_stats()
    out(phase="before", **{k: st.get(k) for k in ("bytes_in_use", "pool_bytes", "bytes_reserved",
                                                    "largest_free_block_bytes", "bytes_limit")})
    x = jnp.ones((2 * GiB // 4,), dtype=jnp.float32)  # raises: 2 GiB in no free block
    x.block_until_ready()
elif case in ("cupy_recover", "cupy_fatal"):
    import cupy
    blocks = []
    try:
        while True:
            blocks.append(cupy.empty(GiB, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError:
        out(phase="full", blocks=len(blocks))
    pool = cupy.get_default_memory_pool()
    if case == "cupy_recover":
        del blocks[::2]
    out(phase="before", used=pool.used_bytes(), total=pool.total_bytes())
    y = cupy.empty(3 * GiB, dtype=cupy.uint8)
    out(phase="after", used=pool.used_bytes(), total=pool.total_bytes())
elif case.startswith("torch_"):
    import torch
    if case == "torch_smallpool":
        ts = []
        try:
            while True:
                ts.append(torch.empty(512 * 1024, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            free, _ = torch.cuda.mem_get_info()
            out(phase="full", tensors=len(ts), reserved=torch.cuda.memory_reserved(),
                allocated=torch.cuda.memory_allocated(), device_free=free)
            raise
    elif case == "torch_fraction":
        torch.cuda.set_per_process_memory_fraction(0.03)
        ts = [torch.empty(100 * MiB, dtype=torch.uint8, device="cuda") for _ in range(38)]
        out(phase="before", reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated())
        ts.append(torch.empty(648 * MiB, dtype=torch.uint8, device="cuda"))
    elif case == "torch_async":
        ts = [torch.empty((7 + 7 * k) * MiB, dtype=torch.uint8, device="cuda") for k in range(20)]
        del ts[::2]
        torch.cuda.synchronize()
        out(phase="burst", reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated())
        time.sleep(4)
        out(phase="idle", reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated())
