"""Unit tests of the raise watcher (vramhook_lens.raise_watch) and the OOM message parsers,
runnable on any Python (3.11 has no sys.monitoring: its registration is tested against a
stand-in namespace with the same calls). Run: python3 lens/unit-tests/test_raise_watch.py
(a directory name Python cannot import: lens/ is on the traced program's PYTHONPATH)."""

import importlib
import os
import sys
import threading
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vramhook_lens import oom_messages  # noqa: E402

MiB = 1 << 20


def fresh():
    from vramhook_lens import raise_watch

    return importlib.reload(raise_watch)


class FakeMonitoring:
    """sys.monitoring's calls that the watcher makes, with tool ids that may be taken."""

    def __init__(self, taken=()):
        self.tools = {t: "other" for t in taken}
        self.callbacks = {}
        self.event_sets = {}
        self.events = types.SimpleNamespace(RAISE=1 << 5, PY_START=1)

    def get_tool(self, tool):
        return self.tools.get(tool)

    def use_tool_id(self, tool, name):
        if tool in self.tools:
            raise ValueError("tool %d is already in use" % tool)
        self.tools[tool] = name

    def register_callback(self, tool, event, fn):
        self.callbacks[(tool, event)] = fn

    def get_events(self, tool):
        return self.event_sets.get(tool, 0)

    def set_events(self, tool, events):
        self.event_sets[tool] = events


class OOM(MemoryError):
    pass


class Other(RuntimeError):
    pass


class Watcher(unittest.TestCase):
    def setUp(self):
        self.rw = fresh()
        self.seen = []
        self.saved = (sys.excepthook, threading.excepthook)

    def tearDown(self):
        sys.excepthook, threading.excepthook = self.saved

    def test_monitoring_registers_raise_on_the_first_free_tool_id(self):
        mon = FakeMonitoring(taken=(4,))
        self.assertTrue(self.rw.start_monitoring(mon))
        self.assertEqual(mon.tools[3], self.rw.TOOL_NAME)
        self.assertIs(mon.callbacks[(3, mon.events.RAISE)], self.rw._on_raise)
        self.assertEqual(mon.event_sets[3], mon.events.RAISE)

    def test_monitoring_taken_or_missing_falls_back(self):
        self.assertFalse(self.rw.start_monitoring(FakeMonitoring(taken=self.rw.TOOL_IDS)))
        if not hasattr(sys, "monitoring"):
            self.assertFalse(self.rw.start_monitoring())
            self.rw.watch([OOM], "Fake", lambda e, at: None)
            self.assertEqual(self.rw.mode(), "excepthook")

    def test_raise_callback_filters_by_exact_type_and_handles_each_exception_once(self):
        self.rw._handlers[OOM] = ("Fake", lambda e, at: self.seen.append((e, at)))
        e = OOM("out of memory")
        for _frame in range(3):  # RAISE fires in each frame the exception unwinds
            self.rw._on_raise(None, 0, e)
        self.rw._on_raise(None, 0, Other("x"))
        self.rw._on_raise(None, 0, MemoryError("a base class is not watched"))
        self.assertEqual(self.seen, [(e, True)])

    def test_a_handler_that_fails_never_raises_into_the_program(self):
        def bad(e, at):
            raise KeyError("boom")

        self.rw._handlers[OOM] = ("Fake", bad)
        self.rw._on_raise(None, 0, OOM())  # no exception out of here

    def test_excepthooks_chain_see_uncaught_and_wrapped_errors_once(self):
        calls = []
        sys.excepthook = lambda t, v, tb: calls.append(("sys", t))
        threading.excepthook = lambda args: calls.append(("thread", args.exc_type))
        self.rw.start_excepthooks()
        self.rw._handlers[OOM] = ("Fake", lambda e, at: self.seen.append((e, at)))
        e = OOM("x")
        try:
            try:
                raise e
            except OOM as inner:
                raise Other("wrapped") from inner
        except Other as outer:
            wrapped = outer
        sys.excepthook(Other, wrapped, None)
        sys.excepthook(OOM, e, None)  # already seen
        t = threading.Thread(target=lambda: (_ for _ in ()).throw(OOM("in a thread")))
        t.start()
        t.join()
        self.assertEqual([s[1] for s in self.seen], [False, False])
        self.assertIs(self.seen[0][0], e)
        self.assertEqual([c[0] for c in calls], ["sys", "sys", "thread"], "the previous hooks still run")

    def test_an_exception_seen_at_the_raise_is_not_recorded_again_at_exit(self):
        self.rw._handlers[OOM] = ("Fake", lambda e, at: self.seen.append(at))
        e = OOM()
        self.rw._on_raise(None, 0, e)
        self.rw._at_exit(e)
        self.assertEqual(self.seen, [True])


class Messages(unittest.TestCase):
    def test_jax(self):
        m = ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 256.00MiB with allocator GPU_0_bfc on "
             "device 0. [tf-allocator-allocation-error=''] [executable_name='jit_broadcast_in_dim']")
        self.assertEqual(oom_messages.jax(m), (256 * MiB, 0))
        self.assertEqual(oom_messages.jax("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 268435456 bytes."),
                         (268435456, None))
        self.assertEqual(oom_messages.jax("Failed to allocate request for 2.00GiB (2147483648B) on device ordinal 1"),
                         (2147483648, 1))
        self.assertEqual(oom_messages.jax("RESOURCE_EXHAUSTED: something else"), (None, None))

    def test_cupy(self):
        m = "Out of memory allocating 3,221,225,472 bytes (allocated so far: 76,235,669,504 bytes)."
        self.assertEqual(oom_messages.cupy(m), (3221225472, None))
        m = "Out of memory allocating 512 bytes (allocated so far: 1,024 bytes, limit set to: 1,024 bytes)."
        self.assertEqual(oom_messages.cupy(m), (512, None))

    def test_tensorflow(self):
        m = ("{{function_node __wrapped__Fill_device_/job:localhost/replica:0/task:0/device:GPU:1}} OOM when allocating "
             "tensor with shape[300,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:1 by "
             "allocator GPU_0_bfc [Op:Fill] name: ")
        self.assertEqual(oom_messages.tensorflow(m), (300 * 1024 * 1024 * 4, 1))
        self.assertEqual(oom_messages.tensorflow("OOM when allocating tensor of shape [] and type half"), (2, None))


if __name__ == "__main__":
    unittest.main()
