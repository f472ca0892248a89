"""Sees a framework's out-of-memory exception when it is raised, without changing the program.

Python 3.12+: a `sys.monitoring` (PEP 669) tool with a RAISE callback whose only work for an
exception of any other type is one dict lookup of its exact type (`scripts/gpu/lens/
raise_cost.py` times it). RAISE fires in every frame the exception passes through: each
exception is handled once (a mark on it). Where monitoring is missing (Python 3.11) or no
tool id is free, chained `sys.excepthook` and `threading.excepthook`: they see only uncaught
exceptions, at exit, so the record is stamped then, and the lens says so on stderr once.
Nothing is installed until a lens asks to watch a type (a program that imports no framework
pays nothing). A handler never raises into the program.
"""

import sys
import threading

TOOL_NAME = "vramhook-lens"
# Tool ids tried in turn (0-2 and 5 are the debugger's, coverage's, profiler's, optimizer's).
TOOL_IDS = (4, 3)
_MARK = "_vramhook_lens_seen"

_handlers = {}  # exact exception class -> (framework name, handler(exc, at_raise))
_lookup = _handlers.get
_mode = None  # "monitoring", "excepthook", or None (nothing installed yet)
_said_late = False


def mode():
    return _mode


def _first_time(exc):
    """True the first time `exc` reaches us (RAISE fires once per frame it unwinds)."""
    try:
        if getattr(exc, _MARK, False):
            return False
        setattr(exc, _MARK, True)
    except Exception:
        pass  # an exception without attributes: seen again only if re-raised through frames
    return True


def _handle(entry, exc, at_raise):
    if not _first_time(exc):
        return
    try:
        entry[1](exc, at_raise)
    except Exception as e:
        try:
            sys.stderr.write("vramhook lens: at %s's out-of-memory error: %r\n" % (entry[0], e))
        except Exception:
            pass


def _on_raise(code, offset, exc):
    entry = _lookup(type(exc))
    if entry is not None:
        _handle(entry, exc, True)


def _watched_in(exc):
    """The first watched exception in `exc`'s chain (a program may wrap the framework's)."""
    seen = 0
    while exc is not None and seen < 16:
        entry = _lookup(type(exc))
        if entry is not None:
            return entry, exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None, None


def _at_exit(exc):
    global _said_late
    entry, exc = _watched_in(exc)
    if entry is None or getattr(exc, _MARK, False):
        return
    if not _said_late:
        _said_late = True
        try:
            sys.stderr.write(
                "vramhook lens: %s's out-of-memory error seen when uncaught, at exit (%s): its record is "
                "stamped now, not when it was raised\n" % (entry[0], why_late())
            )
        except Exception:
            pass
    _handle(entry, exc, False)


def why_late():
    if not hasattr(sys, "monitoring"):
        return "Python %d.%d has no sys.monitoring" % sys.version_info[:2]
    return "no sys.monitoring tool id was free"


def start_monitoring(monitoring=None):
    """Registers the RAISE callback under the first free tool id; False when none is free or
    there is no sys.monitoring."""
    mon = monitoring if monitoring is not None else getattr(sys, "monitoring", None)
    if mon is None:
        return False
    for tool in TOOL_IDS:
        try:
            if mon.get_tool(tool) is not None:
                continue
            mon.use_tool_id(tool, TOOL_NAME)
        except ValueError:
            continue  # taken meanwhile
        mon.register_callback(tool, mon.events.RAISE, _on_raise)
        mon.set_events(tool, mon.get_events(tool) | mon.events.RAISE)
        return True
    return False


def start_excepthooks():
    prev = sys.excepthook

    def excepthook(t, v, tb):
        try:
            _at_exit(v)
        except Exception:
            pass
        prev(t, v, tb)

    sys.excepthook = excepthook
    prev_thread = threading.excepthook

    def thread_excepthook(args):
        try:
            _at_exit(args.exc_value)
        except Exception:
            pass
        prev_thread(args)

    threading.excepthook = thread_excepthook


def watch(types, framework, handler):
    """Calls `handler(exc, at_raise)` once for each exception of exactly one of `types`
    (`at_raise`: False when seen only uncaught, at exit). Installs the watcher the first time."""
    global _mode
    for t in types:
        if isinstance(t, type):
            _handlers[t] = (framework, handler)
    if _mode is None and _handlers:
        _mode = "monitoring" if start_monitoring() else "excepthook"
        if _mode == "excepthook":
            start_excepthooks()
    return _mode
