"""The lens's way into this process's vramhook ring: libvramhook.so's vramhook_lens_emit."""

import ctypes

# FrameworkId codes (protocol/src/record.rs).
PYTORCH = 1
CUPY = 2
JAX = 3
TENSORFLOW = 4

SAMPLE = 1
OOM = 2
SEGMENT = 3
STATS = 4
UNKNOWN = (1 << 64) - 1


class LensRecord(ctypes.Structure):
    """interposer/src/lens.rs `LensRecord`, field for field."""

    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("framework", ctypes.c_uint32),
        ("device", ctypes.c_int32),
        ("reserved_zero", ctypes.c_uint32),
        ("a", ctypes.c_uint64),
        ("b", ctypes.c_uint64),
        ("c", ctypes.c_uint64),
        ("d", ctypes.c_uint64),
        ("pieces", ctypes.c_uint64),
    ]


def _find():
    try:
        fn = ctypes.CDLL(None).vramhook_lens_emit
    except (OSError, AttributeError):
        return None  # libvramhook.so is not loaded: this process is not traced
    fn.argtypes = [ctypes.POINTER(LensRecord)]
    fn.restype = ctypes.c_int
    return fn


_emit = _find()


def available():
    return _emit is not None


def _u64(v):
    v = int(v)
    return min(max(v, 0), UNKNOWN)


def emit(kind, framework, device, a, b, c, d, pieces=0):
    """Records one lens record; False when the process is not traced."""
    if _emit is None:
        return False
    rec = LensRecord(kind, framework, int(device), 0, _u64(a), _u64(b), _u64(c), _u64(d), _u64(pieces))
    return _emit(ctypes.byref(rec)) == 0
