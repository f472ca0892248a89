"""vramhook's framework lenses: what a framework's own allocator knows and the driver cannot.

`install()` (called by the lens directory's sitecustomize) watches for `import torch`,
`import cupy`, `import jax` and `import tensorflow` and attaches the lens of each
(`torch_lens`, `cupy_lens`, `jax_lens`, `tf_lens`) once the module is imported; the last
three watch their framework's out-of-memory exception as it is raised (`raise_watch`). Nothing happens in a program that imports none of
them, or that runs without libvramhook.so.
"""

import importlib.abc
import sys

from . import ring

__all__ = ["install"]

_installed = False


class _AfterImport(importlib.abc.Loader):
    """Runs the real loader, then `then(module)`."""

    def __init__(self, loader, then):
        self._loader = loader
        self._then = then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._then(module)
        except Exception as e:  # the lens must never break the program's import
            sys.stderr.write("vramhook lens: %r\n" % (e,))


class _WatchImports(importlib.abc.MetaPathFinder):
    def __init__(self, name, then):
        self._name = name
        self._then = then
        self._busy = False

    def find_spec(self, name, path=None, target=None):
        if name != self._name or self._busy:
            return None
        self._busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _AfterImport(spec.loader, self._then)
                    sys.meta_path.remove(self)
                    return spec
            return None
        finally:
            self._busy = False


def _on_torch(torch):
    from . import torch_lens

    torch_lens.attach(torch)


def _on_cupy(cupy):
    from . import cupy_lens

    cupy_lens.attach(cupy)


def _on_jax(jax):
    from . import jax_lens

    jax_lens.attach(jax)


def _on_tensorflow(tf):
    from . import tf_lens

    tf_lens.attach(tf)


_LENSES = (("torch", _on_torch), ("cupy", _on_cupy), ("jax", _on_jax), ("tensorflow", _on_tensorflow))


def install():
    """Attaches the lenses of frameworks the program imports (once)."""
    global _installed
    if _installed or not ring.available():
        return
    _installed = True
    for name, then in _LENSES:
        if name in sys.modules:
            then(sys.modules[name])
        else:
            sys.meta_path.insert(0, _WatchImports(name, then))
