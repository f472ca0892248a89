"""The TensorFlow lens: at TensorFlow's out-of-memory error only.

At `tf.errors.ResourceExhaustedError` whose message is an allocation's ("OOM when allocating
tensor with shape[...] and type ..."), seen as it is raised (raise_watch.py; on Python < 3.12
only when uncaught, at exit), a `framework_oom`: the request (the tensor's shape times its
type's size, from the message), the bytes in use from
`tf.config.experimental.get_memory_info` (its "current"). TensorFlow does not say what its
BFC allocator holds from the driver nor its largest free block: both are sent unknown, and
the model counts the process's bytes held on the device (its allocator's regions) as
reserved. No periodic samples (there is no reserve to sample).
"""

import sys

from . import oom_messages, raise_watch, ring


def on_oom(tf, exc, at_raise=True):
    request, device = oom_messages.tensorflow(str(exc))
    if request is None:
        return None  # a ResourceExhaustedError of another kind (a queue, a host allocator)
    device = 0 if device is None else device
    allocated = 0
    try:
        allocated = int(tf.config.experimental.get_memory_info("GPU:%d" % device).get("current", 0))
    except Exception:
        pass
    ring.emit(ring.OOM, ring.TENSORFLOW, device, request, ring.UNKNOWN, allocated, ring.UNKNOWN)
    return device, request, allocated


def error_types(tf):
    out = []
    t = getattr(getattr(tf, "errors", None), "ResourceExhaustedError", None)
    if isinstance(t, type):
        out.append(t)
    m = sys.modules.get("tensorflow.python.framework.errors_impl")
    t = getattr(m, "ResourceExhaustedError", None) if m is not None else None
    if isinstance(t, type) and t not in out:
        out.append(t)
    return out


def attach(tf):
    raise_watch.watch(error_types(tf), "TensorFlow", lambda exc, at_raise: on_oom(tf, exc, at_raise))
