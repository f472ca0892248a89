"""The CuPy lens: the default memory pool's own numbers into the process's vramhook ring.

Every VRAMHOOK_LENS_INTERVAL_S (default 1 s), per device whose CUDA context is active, a
`framework_sample`: reserved = `MemoryPool.total_bytes()` (what the pool holds from the
driver), allocated = `used_bytes()` (what arrays use); CuPy does not say its largest free
block (recorded as unknown). Only the default pool (`cupy.get_default_memory_pool()`) is
seen: a program that set another allocator (`set_allocator`, `MemoryAsyncPool`, RMM) shows
an empty pool and no samples. CuPy has no out-of-memory observer (it raises
`cupy.cuda.memory.OutOfMemoryError` after freeing its wholly free chunks and retrying): the
latest sample is what the verdict has. The pool's numbers for a device are read with that
device current on the lens's own thread; a device with no active context is never made
current (that would create a context on it).
"""

import ctypes

from . import ring, sampling


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
        out.append((device, reserved, allocated))
    return out


def attach(cupy):
    sampling.start("cupy", lambda: sample_once(cupy))
