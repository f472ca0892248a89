"""The JAX lens: XLA's allocator's own numbers (`Device.memory_stats()`) into the ring.

Every VRAMHOOK_LENS_INTERVAL_S (default 1 s), once JAX's backends exist (the lens never
starts them: that would create a CUDA context and, by default, preallocate), per local GPU
device, a `framework_sample`: reserved = `pool_bytes` (what the BFC allocator holds from the
driver; `bytes_reserved` when there is no pool_bytes), allocated = `bytes_in_use`, largest
free block = `largest_free_block_bytes`. JAX has no out-of-memory observer (XLA raises
RESOURCE_EXHAUSTED): the latest sample is what the verdict has. With the default
preallocation XLA takes its whole pool up front and never asks the driver again, so an OOM
inside the pool is no driver failure at all (vramhook sees none); with
XLA_PYTHON_CLIENT_PREALLOCATE=false the pool grows and a failed growth is one.
"""

from . import ring, sampling


def _backends_ready():
    try:
        from jax._src import xla_bridge
    except Exception:
        return False
    ready = getattr(xla_bridge, "backends_are_initialized", None)
    if ready is not None:
        return bool(ready())
    return bool(getattr(xla_bridge, "_backends", None))


def sample_once(jax):
    """One sample of each local GPU; returns [(device, reserved, allocated, largest)]."""
    if not _backends_ready():
        return []
    out = []
    for d in jax.local_devices():
        if getattr(d, "platform", "") not in ("gpu", "cuda"):
            continue
        st = d.memory_stats() or {}
        allocated = int(st.get("bytes_in_use", 0))
        reserved = int(st["pool_bytes"]) if "pool_bytes" in st else int(st.get("bytes_reserved", 0))
        reserved = max(reserved, allocated)
        if reserved == 0:
            continue
        largest = int(st["largest_free_block_bytes"]) if "largest_free_block_bytes" in st else ring.UNKNOWN
        device = getattr(d, "local_hardware_id", None)
        device = d.id if device is None else device
        ring.emit(ring.SAMPLE, ring.JAX, device, reserved, allocated, largest, 0)
        out.append((device, reserved, allocated, largest))
    return out


def attach(jax):
    sampling.start("jax", lambda: sample_once(jax))
