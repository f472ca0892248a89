"""vramhook's PyTorch lens, loaded by Python at start-up from this directory.

`vramhook run` puts this directory first on PYTHONPATH; with LD_PRELOAD, add it yourself:
    PYTHONPATH=$(vramhook lens-dir):$PYTHONPATH LD_PRELOAD=libvramhook.so python3 serve.py
It imports nothing heavy: the lens wakes only if the program imports torch, and does nothing
unless libvramhook.so is loaded in the process. Like opentelemetry-instrument's, it first
runs any other sitecustomize that this one hides, so a site's own start-up code still runs.
"""

import os
import sys


def _chain_to_the_hidden_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.get("sitecustomize")
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        del sys.modules["sitecustomize"]
        import importlib

        try:
            importlib.import_module("sitecustomize")
        except ImportError:
            pass
    except Exception as e:  # a broken site hook must not take the program down with it
        sys.stderr.write("vramhook lens: the other sitecustomize failed: %r\n" % (e,))
    finally:
        sys.path[:] = saved
        if me is not None:
            sys.modules["sitecustomize"] = me


_chain_to_the_hidden_sitecustomize()

if os.environ.get("VRAMHOOK_LENS", "1") != "0":
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import vramhook_lens

        vramhook_lens.install()
    except Exception as e:
        sys.stderr.write("vramhook lens: not installed: %r\n" % (e,))
    finally:
        try:
            sys.path.remove(os.path.dirname(os.path.abspath(__file__)))
        except ValueError:
            pass
