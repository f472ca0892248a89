"""The periodic sampler that the CuPy and JAX lenses share (the PyTorch lens has its own)."""

import os
import threading
import time


def float_env(name, default):
    try:
        return max(float(os.environ.get(name, default)), 0.0)
    except ValueError:
        return default


_started = set()


def start(name, sample_once):
    """Calls `sample_once()` every VRAMHOOK_LENS_INTERVAL_S (default 1 s) on a daemon thread,
    until it raises (the interpreter is shutting down, or the framework is gone). Once per
    `name`: a framework imported again (or through a second hook) keeps its one sampler."""
    if name in _started:
        return None
    _started.add(name)
    interval = float_env("VRAMHOOK_LENS_INTERVAL_S", 1.0)
    if interval <= 0:
        return None

    def loop():
        while True:
            time.sleep(interval)
            try:
                sample_once()
            except Exception:
                return

    t = threading.Thread(target=loop, name="vramhook-lens-" + name, daemon=True)
    t.start()
    return t
