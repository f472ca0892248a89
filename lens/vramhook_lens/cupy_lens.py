"""The CuPy lens: the default memory pool's own numbers into the process's vramhook ring.

Every VRAMHOOK_LENS_INTERVAL_S (default 1 s), per device whose CUDA context is active, a
`framework_sample`: reserved = `MemoryPool.total_bytes()` (what the pool holds from the
driver), allocated = `used_bytes()` (what arrays use); CuPy does not say its largest free
block (recorded as unknown). Only the default pool (`cupy.get_default_memory_pool()`) is
seen: a program that set another allocator (`set_allocator`, `MemoryAsyncPool`, RMM) shows
an empty pool and no samples. The pool's numbers for a device are read with that device
current on the lens's own thread; a device with no active context is never made
current (that would create a context on it).

At CuPy's `cupy.cuda.memory.OutOfMemoryError` (raised after CuPy freed its wholly free
blocks and retried), seen as it is raised (raise_watch.py; on Python < 3.12 only when
uncaught, at exit), a `framework_oom`: the request read from CuPy's message and the current
device's pool then (`total_bytes()`, `used_bytes()`; no largest free block).
"""

import ctypes

from . import oom_messages, raise_watch, ring, sampling


def _active_devices(count):
    """Ordinals whose primary context is active, asked of the driver (never creating one)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        state = cuda.cuDevicePrimaryCtxGetState
    except (OSError, AttributeError):
        return [0]
    out = []
    for ordinal in range(count):
        dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            continue
        if state(dev, ctypes.byref(flags), ctypes.byref(active)) == 0 and active.value:
            out.append(ordinal)
    return out


def _emit_limit(cupy, pool, device):
    """The pool's own ceiling (`set_limit`, `CUPY_GPU_MEMORY_LIMIT`), as a `framework_stats`
    record; none when unlimited (0)."""
    try:
        with cupy.cuda.Device(device):
            limit = int(pool.get_limit())
    except Exception:
        return
    if limit > 0:
        ring.emit(ring.STATS, ring.CUPY, device, ring.UNKNOWN, limit, 0, 0)


def sample_once(cupy):
    """One sample of each active device's pool; returns [(device, reserved, allocated)]."""
    pool = cupy.get_default_memory_pool()
    count = cupy.cuda.runtime.getDeviceCount()
    devices = [0] if count == 1 else _active_devices(count)
    out = []
    for device in devices:
        with cupy.cuda.Device(device):
            reserved, allocated = pool.total_bytes(), pool.used_bytes()
        if reserved == 0:
            continue
        ring.emit(ring.SAMPLE, ring.CUPY, device, reserved, allocated, ring.UNKNOWN, 0)
        _emit_limit(cupy, pool, device)
        out.append((device, reserved, allocated))
    return out


def on_oom(cupy, exc, at_raise=True):
    """CuPy's OutOfMemoryError: one `framework_oom` with the current device's pool."""
    request, _ = oom_messages.cupy(str(exc))
    try:
        device = int(cupy.cuda.runtime.getDevice())
    except Exception:
        device = 0
    pool = cupy.get_default_memory_pool()
    reserved, allocated = pool.total_bytes(), pool.used_bytes()
    ring.emit(ring.OOM, ring.CUPY, device, request if request is not None else 0, reserved, allocated, ring.UNKNOWN)
    _emit_limit(cupy, pool, device)
    return device, request, reserved, allocated


def error_types(cupy):
    t = getattr(getattr(getattr(cupy, "cuda", None), "memory", None), "OutOfMemoryError", None)
    return [t] if isinstance(t, type) else []


def attach(cupy):
    raise_watch.watch(error_types(cupy), "CuPy", lambda exc, at_raise: on_oom(cupy, exc, at_raise))
    sampling.start("cupy", lambda: sample_once(cupy))
