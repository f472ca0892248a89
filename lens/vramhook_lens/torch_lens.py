"""The PyTorch lens: the caching allocator's own numbers into the process's vramhook ring.

- At every PyTorch out-of-memory error (its OOM observer, called after the allocator has
  given back its whole free segments and before it raises): first the request, reserved and
  allocated bytes (stamped at that moment; the largest free block unknown), then each segment
  of that device (bytes, allocated, largest free block, free pieces) from
  `torch.cuda.memory._snapshot()`, which takes seconds with the memory history on.
- Periodically, per device in use: `memory_stats()`'s reserved and allocated bytes and
  segment count (every VRAMHOOK_LENS_INTERVAL_S, default 1 s: about 175 µs a call on an
  H200), and the largest free block and the largest request given back (the fit's demand)
  from a snapshot at a slower interval (VRAMHOOK_LENS_SNAPSHOT_S, default 30 s: about 20 ms
  for 20,000 blocks).
- On request (VRAMHOOK_LENS_STACKS=1; off by default: PyTorch then captures the Python stack
  of every allocation and free), PyTorch's memory history
  (`torch.cuda.memory._record_memory_history(stacks="python", max_entries=N)`, N from
  VRAMHOOK_LENS_STACKS_ENTRIES, default 20,000) from the moment the lens attaches, and at
  each of the first VRAMHOOK_LENS_STACKS_MAX (default 3) OOMs of the process, PyTorch's
  snapshot (what `_dump_snapshot` writes) in a new file of VRAMHOOK_LENS_STACKS_DIR (default:
  the current directory; `vramhook run --record` sets the capture's), named
  `vramhook-stacks-PID-UTCTIME-N.pickle`, never over an existing file; one line on stderr
  names it. `vramhook analyze` lists the stacks of the allocations live at each OOM.
With `backend:cudaMallocAsync` the allocator keeps no segments: the lens gives reserved and
allocated bytes only. Every call is guarded: the lens never raises into the program.
"""

import os
import pickle
import sys
import threading
import time

from . import ring
from .sampling import float_env as _float_env

_attached = False
# Snapshots still to dump at an OOM (0: stacks off, or the limit reached).
_stacks_left = 0
_stacks_dumped = 0


def _int_env(name, default):
    try:
        return max(int(os.environ.get(name, default)), 0)
    except ValueError:
        return default


def _start_stacks(torch):
    """PyTorch's memory history, when asked for (VRAMHOOK_LENS_STACKS=1)."""
    global _stacks_left
    if os.environ.get("VRAMHOOK_LENS_STACKS", "0") in ("", "0"):
        return
    entries = _int_env("VRAMHOOK_LENS_STACKS_ENTRIES", 20000)
    try:
        record = torch.cuda.memory._record_memory_history
        try:
            record(enabled="all", context="all", stacks="python", max_entries=entries)
        except TypeError:  # PyTorch 2.0: (enabled, record_context, trace_alloc_max_entries)
            record(True, trace_alloc_max_entries=entries)
    except Exception as e:
        sys.stderr.write("vramhook lens: PyTorch's memory history could not be started: %r\n" % (e,))
        return
    _stacks_left = _int_env("VRAMHOOK_LENS_STACKS_MAX", 3)


def _dump_stacks(torch, snap=None):
    """PyTorch's snapshot (with the history's stacks) into a new file: what
    `_dump_snapshot(path)` writes, but never over an existing file. `snap`: one already taken."""
    global _stacks_left, _stacks_dumped
    if _stacks_left <= 0:
        return
    _stacks_left -= 1
    _stacks_dumped += 1
    path = None
    try:
        if snap is None:
            snap = torch.cuda.memory._snapshot()
        directory = os.environ.get("VRAMHOOK_LENS_STACKS_DIR") or os.curdir
        name = "vramhook-stacks-%d-%s-%d.pickle" % (
            os.getpid(), time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), _stacks_dumped)
        path = os.path.join(directory, name)
        with open(path, "xb") as f:
            try:
                pickle.dump(snap, f)
            except Exception:
                f.close()
                os.unlink(path)
                raise
        sys.stderr.write("vramhook lens: PyTorch memory snapshot with stacks at this OOM: %s\n" % (path,))
    except Exception as e:
        sys.stderr.write("vramhook lens: no snapshot with stacks at this OOM (%s): %r\n" % (path, e))


def _snapshot(torch):
    try:
        return torch.cuda.memory._snapshot()
    except Exception:
        return None  # cudaMallocAsync, or a PyTorch without snapshots


def _segments(torch, device, snap=None):
    """[(address, bytes, allocated, largest free block, free pieces)] of `device`, or None."""
    if snap is None:
        snap = _snapshot(torch)
    if snap is None:
        return None
    segs = snap.get("segments", []) if isinstance(snap, dict) else snap
    out = []
    for s in segs:
        if s.get("device", 0) != device:
            continue
        free = [b["size"] for b in s.get("blocks", []) if not str(b.get("state", "")).startswith("active")]
        out.append((s["address"], s["total_size"], s.get("allocated_size", s["total_size"] - sum(free)),
                    max(free, default=0), len(free)))
    return out


def _stats(torch, device):
    st = torch.cuda.memory_stats(device)
    reserved = st.get("reserved_bytes.all.current", torch.cuda.memory_reserved(device))
    allocated = st.get("allocated_bytes.all.current", torch.cuda.memory_allocated(device))
    segments = st.get("segment.all.current", 0)
    return reserved, allocated, segments


def _active_blocks(snap, device):
    """The blocks in use on `device` in a snapshot, as {(address, size)}."""
    segs = snap.get("segments", []) if isinstance(snap, dict) else snap
    return {(b.get("address", 0), b.get("size", 0)) for s in segs if s.get("device", 0) == device
            for b in s.get("blocks", []) if str(b.get("state", "")).startswith("active")}


def _largest_request(snap, device, before=None, now=None):
    """The largest request on `device` that the snapshots show PyTorch made and gave back
    (the fit's demand: requests served from the cache, which the driver never sees):
    - the largest segment not held whole by one block in use: PyTorch makes a segment the
      size of a request its cache cannot serve (rounded to 2 MiB), so a segment's size is a
      past request's; one held whole is memory kept since (weights, a preallocated cache);
      not with expandable segments, where one segment grows for every request;
    - the largest block in use at the previous snapshot (`before`, from `_active_blocks`)
      and gone at this one (`now`: this snapshot's, when the caller has it already).
    Memory held since it was made is state, not a request it will make again (on the H200
    a 125 GiB block held from the start read as the next request when it counted).
    UNKNOWN when neither shows one."""
    segs = snap.get("segments", []) if isinstance(snap, dict) else snap
    largest = 0
    if not _expandable_segments():
        for s in segs:
            if s.get("device", 0) != device or s.get("is_expandable"):
                continue
            size = s.get("total_size", 0)
            active = [b for b in s.get("blocks", []) if str(b.get("state", "")).startswith("active")]
            if not (len(active) == 1 and active[0].get("size", 0) == size):
                largest = max(largest, size)
    if before:
        if now is None:
            now = _active_blocks(snap, device)
        largest = max([largest] + [size for (addr, size) in before - now])
    return largest or ring.UNKNOWN


def _expandable_segments():
    """Whether PyTorch runs with `expandable_segments:True` (read from the settings it reads
    at start: PYTORCH_CUDA_ALLOC_CONF, or PYTORCH_ALLOC_CONF in newer versions)."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for option in os.environ.get(name, "").split(","):
            key, _, value = option.partition(":")
            if key.strip() == "expandable_segments" and value.strip().lower() == "true":
                return True
    return False


def _emit_stats(torch, device, largest_request=None):
    """The free bytes inside split blocks (stranded: `empty_cache()` cannot give them back),
    the per-process limit `set_per_process_memory_fraction` sets, and the largest request
    given back that the snapshots show (`_largest_request`), after a sample or an OOM
    record of the same device."""
    try:
        st = torch.cuda.memory_stats(device)
        stranded = st.get("inactive_split_bytes.all.current", ring.UNKNOWN)
        if _expandable_segments():
            # Every block of an expandable segment has neighbours, so PyTorch counts all its
            # free bytes as split; but before it raises it unmaps the free pages of every one
            # of them and maps the request anew: they are releasable, not stranded (only
            # pieces of pages still partly in use stay, under one page each).
            stranded = 0
        limit = ring.UNKNOWN
        fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if fraction is not None:
            f = float(fraction(device))
            if 0.0 < f < 1.0:
                # PyTorch's own rounding of the allowed bytes ("X allowed" in its message).
                limit = int(f * torch.cuda.get_device_properties(device).total_memory)
        largest = ring.UNKNOWN if largest_request is None else largest_request
        ring.emit(ring.STATS, ring.PYTORCH, device, stranded, limit, largest, 0)
    except Exception:
        pass  # an older PyTorch without these numbers: the samples still count


def _on_oom(torch, device, alloc, device_allocated, device_free):
    """The numbers first, stamped now (the interposer stamps a record when it is written):
    the largest free block needs the snapshot, which takes seconds with the memory history
    on, so it goes unknown here and the segments listed after the record say it (the model
    joins them to this record by order). One snapshot serves the segments and the stacks."""
    try:
        reserved, allocated, _ = _stats(torch, device)
        ring.emit(ring.OOM, ring.PYTORCH, device, alloc, reserved, allocated, ring.UNKNOWN)
    except Exception as e:
        sys.stderr.write("vramhook lens: at PyTorch's OOM: %r\n" % (e,))
        return
    _emit_stats(torch, device)  # the limit that may have been the ceiling, and the stranded bytes
    snap = None
    try:
        snap = _snapshot(torch)
        for addr, size, used, big, pieces in _segments(torch, device, snap) or []:
            ring.emit(ring.SEGMENT, ring.PYTORCH, device, addr, size, used, big, pieces)
    except Exception as e:
        sys.stderr.write("vramhook lens: at PyTorch's OOM: %r\n" % (e,))
    _dump_stacks(torch, snap)


def _sampler(torch, interval, snapshot_every):
    last_snapshot = 0.0
    active_before = {}  # device -> its blocks in use at the previous snapshot
    while True:
        time.sleep(interval)
        try:
            now = time.monotonic()
            take_snapshot = snapshot_every > 0 and now - last_snapshot >= snapshot_every
            snap = None  # one snapshot for every device
            for device in range(torch.cuda.device_count()):
                reserved, allocated, segments = _stats(torch, device)
                if reserved == 0:
                    continue
                largest, request = ring.UNKNOWN, None
                if take_snapshot:
                    if snap is None:
                        snap = _snapshot(torch)
                    segs = _segments(torch, device, snap) if snap is not None else None
                    if segs is not None:
                        largest = max((s[3] for s in segs), default=0)
                        active = _active_blocks(snap, device)
                        request = _largest_request(snap, device, active_before.get(device), active)
                        active_before[device] = active
                ring.emit(ring.SAMPLE, ring.PYTORCH, device, reserved, allocated, largest, segments)
                _emit_stats(torch, device, request)
            if take_snapshot:
                last_snapshot = now
        except Exception:
            return  # the interpreter is shutting down, or CUDA is gone


def _attach_now(torch):
    """Runs inside PyTorch's lazy CUDA init, where an exception would fail the program's
    first CUDA call (`DeferredCudaCallError`): nothing may escape."""
    try:
        _attach_guarded(torch)
    except Exception as e:
        sys.stderr.write("vramhook lens: not attached: %r\n" % (e,))


def _attach_guarded(torch):
    global _attached
    if _attached:
        return
    _attached = True
    try:
        torch._C._cuda_attach_out_of_memory_observer(
            lambda device, alloc, device_allocated, device_free: _on_oom(torch, device, alloc, device_allocated, device_free)
        )
    except Exception:
        # `backend:cudaMallocAsync` has no OOM observer (PyTorch 2.11 raises "cudaMallocAsync
        # does not yet support attachOutOfMemoryObserver"): the samples below still run.
        pass
    _start_stacks(torch)
    interval = _float_env("VRAMHOOK_LENS_INTERVAL_S", 1.0)
    if interval > 0:
        t = threading.Thread(
            target=_sampler,
            args=(torch, interval, _float_env("VRAMHOOK_LENS_SNAPSHOT_S", 30.0)),
            name="vramhook-lens",
            daemon=True,
        )
        t.start()


def attach(torch):
    """Attaches once PyTorch's CUDA state exists (its observers live in the per-device
    allocators, which exist only after CUDA's lazy init)."""
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return
    lazy = getattr(cuda, "_lazy_call", None)
    if lazy is not None:
        lazy(lambda: _attach_now(torch))
    elif cuda.is_initialized():
        _attach_now(torch)
