"""The JAX lens: XLA's allocator's own numbers (`Device.memory_stats()`) into the ring.

Every VRAMHOOK_LENS_INTERVAL_S (default 1 s), once JAX's backends exist (the lens never
starts them: that would create a CUDA context and, by default, preallocate), per local GPU
device, a `framework_sample`: reserved = `pool_bytes` (what the BFC allocator holds from the
driver; `bytes_reserved` when there is no pool_bytes), allocated = `bytes_in_use`, largest
free block = `largest_free_block_bytes`.

At XLA's out-of-memory error (`JaxRuntimeError`, `XlaRuntimeError` in older jaxlib, with
RESOURCE_EXHAUSTED), seen as it is raised (raise_watch.py; on Python < 3.12 only when uncaught,
at exit), a `framework_oom`: the request read from XLA's message, and `memory_stats()` of that
device then (`bytes_in_use`, `pool_bytes` or `bytes_reserved`, `largest_free_block_bytes`).
With the default preallocation XLA takes its whole pool up front and never asks the driver
again: an OOM inside the pool is no driver failure, and this record is the incident. XLA's
`bytes_limit` has no place in the record (the pool's size is its reserve).
"""

import sys

from . import oom_messages, raise_watch, ring, sampling


def _backends_ready():
    try:
        from jax._src import xla_bridge
    except Exception:
        return False
    ready = getattr(xla_bridge, "backends_are_initialized", None)
    if ready is not None:
        return bool(ready())
    return bool(getattr(xla_bridge, "_backends", None))


def _device_numbers(d):
    """(device ordinal, reserved, allocated, largest free block) of one JAX device."""
    st = d.memory_stats() or {}
    allocated = int(st.get("bytes_in_use", 0))
    reserved = int(st["pool_bytes"]) if "pool_bytes" in st else int(st.get("bytes_reserved", 0))
    reserved = max(reserved, allocated)
    largest = int(st["largest_free_block_bytes"]) if "largest_free_block_bytes" in st else ring.UNKNOWN
    device = getattr(d, "local_hardware_id", None)
    device = d.id if device is None else device
    return device, reserved, allocated, largest


def _emit_stats(d, device):
    """XLA's own ceiling for this device (`bytes_limit`: the preallocated pool, or
    XLA_PYTHON_CLIENT_MEM_FRACTION of the device) and the largest allocation it has served
    (`largest_alloc_size`: the fit's demand, requests the driver never sees), as a
    `framework_stats` record."""
    try:
        st = d.memory_stats() or {}
        limit = int(st.get("bytes_limit", 0))
        largest = int(st.get("largest_alloc_size", 0))
    except Exception:
        return
    if limit > 0 or largest > 0:
        ring.emit(ring.STATS, ring.JAX, device, ring.UNKNOWN, limit if limit > 0 else ring.UNKNOWN,
                  largest if largest > 0 else ring.UNKNOWN, 0)


def _gpus(jax):
    return [d for d in jax.local_devices() if getattr(d, "platform", "") in ("gpu", "cuda")]


def on_oom(jax, exc, at_raise=True):
    """XLA's RESOURCE_EXHAUSTED: one `framework_oom` with memory_stats() of the device."""
    message = str(exc)
    if "RESOURCE_EXHAUSTED" not in message:
        return None
    request, ordinal = oom_messages.jax(message)
    gpus = _gpus(jax)
    if not gpus:
        return None
    numbers = [_device_numbers(d) for d in gpus]
    pick = [n for n in numbers if n[0] == ordinal] or numbers
    device, reserved, allocated, largest = pick[0]
    ring.emit(ring.OOM, ring.JAX, device, request if request is not None else 0, reserved, allocated, largest)
    for d in gpus:
        if _device_numbers(d)[0] == device:
            _emit_stats(d, device)
    return device, request, reserved, allocated, largest


def error_types(jax):
    """XLA's runtime error classes this JAX raises (one class under several names)."""
    out = []
    errors = getattr(jax, "errors", None)
    for name in ("JaxRuntimeError", "XlaRuntimeError"):
        t = getattr(errors, name, None)
        if isinstance(t, type):
            out.append(t)
    for mod in ("jaxlib.xla_extension", "jaxlib._jax", "jax._src.lib"):
        m = sys.modules.get(mod)
        for name in ("JaxRuntimeError", "XlaRuntimeError"):
            t = getattr(m, name, None) if m is not None else None
            if isinstance(t, type):
                out.append(t)
    t = getattr(getattr(sys.modules.get("jax._src.lib"), "xla_client", None), "XlaRuntimeError", None)
    if isinstance(t, type):
        out.append(t)
    return out


def sample_once(jax):
    """One sample of each local GPU; returns [(device, reserved, allocated, largest)]."""
    if not _backends_ready():
        return []
    out = []
    for d in _gpus(jax):
        device, reserved, allocated, largest = _device_numbers(d)
        if reserved == 0:
            continue
        ring.emit(ring.SAMPLE, ring.JAX, device, reserved, allocated, largest, 0)
        _emit_stats(d, device)
        out.append((device, reserved, allocated, largest))
    return out


def attach(jax):
    raise_watch.watch(error_types(jax), "JAX", lambda exc, at_raise: on_oom(jax, exc, at_raise))
    sampling.start("jax", lambda: sample_once(jax))
