"""The request of a framework's out-of-memory error, read from its message (the exception
carries no number). Each parser returns (bytes or None, device or None).

- JAX/XLA (jaxlib 0.4 to 0.11): "RESOURCE_EXHAUSTED: Out of memory while trying to allocate
  256.00MiB with allocator GPU_0_bfc on device 0. ..." (tsl's human-readable bytes: two
  decimals, so a request that is not a round size is known to 0.5%), older "... allocate
  268435456 bytes.", PJRT's "Failed to allocate request for 2.00GiB (2147483648B) on device
  ordinal 0".
- CuPy: "Out of memory allocating 314,572,800 bytes (allocated so far: 943,718,400 bytes)."
  (", limit set to: N bytes" when `set_limit` refused it).
- TensorFlow: "OOM when allocating tensor with shape[300,1024,1024] and type float on
  /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc": shape × dtype size.
"""

import re

_UNITS = {"": 1, "B": 1, "BYTES": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}

_JAX_EXACT = re.compile(r"\((\d+)\s*B\)")
_JAX_SIZE = re.compile(r"(?:allocate|request for)\s+([\d.]+)\s*([KMGT]i?B?|B|bytes)?\b", re.I)
_JAX_DEVICE = re.compile(r"(?:on device|device ordinal)\s+(\d+)")
_CUPY = re.compile(r"Out of memory allocating ([\d,]+) bytes")
_TF_SHAPE = re.compile(r"OOM when allocating tensor (?:with|of) shape\s*\[([^\]]*)\] and type (\w+)")
_TF_DEVICE = re.compile(r"device:GPU:(\d+)")

# TensorFlow's DataTypeString names.
_TF_DTYPE = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2,
             "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16,
             "float8_e4m3fn": 1, "float8_e5m2": 1, "qint8": 1, "quint8": 1, "qint32": 4}


def jax(message):
    m = _JAX_EXACT.search(message)
    size = int(m.group(1)) if m else None
    if size is None:
        m = _JAX_SIZE.search(message)
        if m:
            unit = (m.group(2) or "").upper()
            size = int(round(float(m.group(1)) * _UNITS.get(unit, 1)))
    d = _JAX_DEVICE.search(message)
    return size, int(d.group(1)) if d else None


def cupy(message):
    m = _CUPY.search(message)
    return (int(m.group(1).replace(",", "")) if m else None), None


def tensorflow(message):
    m = _TF_SHAPE.search(message)
    size = None
    if m and m.group(2) in _TF_DTYPE:
        n = 1
        for dim in m.group(1).split(","):
            dim = dim.strip()
            if dim:
                n *= int(dim)
        size = n * _TF_DTYPE[m.group(2)]
    d = _TF_DEVICE.search(message)
    return size, int(d.group(1)) if d else None
