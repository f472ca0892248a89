#!/usr/bin/env python3
"""Splits the instructions libvramhook.so adds per call into what they are for.

Usage: calls_split.py HOOKED.callgrind PLAIN.callgrind LIB CALLS

Both profiles come from `valgrind --tool=callgrind --dump-instr=yes` runs of the same
benchmark, with and without LD_PRELOAD=LIB. Every instruction executed inside LIB is
mapped to its chain of inlined functions (addr2line -i on LIB's line tables) and counted
under the first function of that chain, innermost first, that names a part of the hook.
Calls LIB makes out of itself count for the part that makes them (the driver's
cuCtxGetDevice: the device lookup; __tls_get_addr: the thread state). What the hooked run
executes outside LIB beyond the plain run (glibc, the loader) is "other".
"""
import collections
import re
import subprocess
import sys

# What each inlined function of the hook is for. addr2line names the function that holds
# each location of an inline chain, except the innermost (it repeats the outer symbol's
# name there), so the innermost location is told by its file instead.
PART_BY_FUNCTION = {
    "current_device": "device lookup",
    "thread_device": "device lookup",
    "read_tsc": "clock",
    "now": "clock",
    "enter": "thread state + guard",
    "tid": "thread state + guard",
    "drop": "thread state + guard",
    "drop_in_place<vramhook::sink::Hook>": "thread state + guard",
    "periodic_sample_due": "meminfo sampling check",
    "alloc_tick": "meminfo sampling check",
    "after_alloc": "meminfo sampling check",
    "sample_clock_due": "meminfo sampling check",
    "begin_release": "release marker (set, cleared)",
    "end_release": "release marker (set, cleared)",
    "release_marker": "release marker (set, cleared)",
    "push": "record build + ring write",
    "push_stamped": "record build + ring write",
    "emit_release": "record build + ring write",
    "stamp_at": "record build + ring write",
    "ring": "record build + ring write",
    "stamp": "record build + ring write",
    "emit": "record build + ring write",
    "to_raw": "record build + ring write",
    "lane_write_pos": "record build + ring write",
    "real": "wrapper: real fn, disabled flag, catch_unwind",
    "disabled": "wrapper: real fn, disabled flag, catch_unwind",
}
PART_BY_FILE = [
    (r"/clock\.rs$|/rdtsc\.rs$", "clock"),
    (r"/ring/writer\.rs$|/ring/mod\.rs$|/record\.rs$", "record build + ring write"),
    (r"/thread_local/|/thread/local\.rs$", "thread state + guard"),
    (r"interposer/src/real\.rs$|interposer/src/config\.rs$", "wrapper: real fn, disabled flag, catch_unwind"),
]
WRAPPER = "wrapper: real fn, disabled flag, catch_unwind"


def parse(path):
    """Self cost per (object, address), call cost per (object, callee name)."""
    names = {"ob": {}, "fn": {}, "cob": {}, "cfn": {}}
    self_cost = collections.Counter()
    call_cost = collections.Counter()
    call_count = collections.Counter()
    ob = fn = cob = cfn = None
    last = [0, 0]
    pending_call = None
    total = 0

    def name(kind, value):
        table = "ob" if kind in ("ob", "cob") else "fn"
        m = re.match(r"\((\d+)\)(?: (.*))?$", value)
        if not m:
            return value
        ident, text = m.group(1), m.group(2)
        if text is not None:
            names[table][ident] = text
        return names[table].get(ident, ident)

    def position(tok, i):
        if tok == "*":
            return last[i]
        if tok[0] in "+-":
            return last[i] + int(tok, 0)
        return int(tok, 0)

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.startswith("summary:"):
                total = int(line.split()[1])
                continue
            m = re.match(r"(ob|fn|cob|cfn|fl|fi|fe|cfi|cfl)=(.*)$", line)
            if m:
                kind, value = m.groups()
                if kind == "ob":
                    ob = name("ob", value)
                elif kind == "fn":
                    fn = name("fn", value)
                    cob = None
                elif kind == "cob":
                    cob = name("ob", value)
                elif kind == "cfn":
                    cfn = name("fn", value)
                continue
            if line.startswith("calls="):
                count = int(line.split("=")[1].split()[0])
                pending_call = count
                continue
            if not (line[0].isdigit() or line[0] in "+-*"):
                continue
            toks = line.split()
            addr = position(toks[0], 0)
            lineno = position(toks[1], 1)
            last[0], last[1] = addr, lineno
            cost = int(toks[2]) if len(toks) > 2 else 0
            if pending_call is not None:
                callee_ob = cob or ob
                call_cost[(ob, fn, callee_ob, cfn)] += cost
                call_count[(ob, fn, callee_ob, cfn)] += pending_call
                pending_call = None
                cob = None
            else:
                self_cost[(ob, addr)] += cost
    return self_cost, call_cost, call_count, total


def inline_chains(lib, addrs):
    """address -> inlined function names, innermost first."""
    if not addrs:
        return {}
    out = subprocess.run(
        ["addr2line", "-i", "-f", "-C", "-a", "-e", lib] + [hex(a) for a in addrs],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    chains, cur = {}, None
    i = 0
    while i < len(out):
        if out[i].startswith("0x"):
            cur = int(out[i], 16)
            chains[cur] = []
            i += 1
            continue
        chains[cur].append((out[i], out[i + 1].rsplit(":", 1)[0] if i + 1 < len(out) else ""))
        i += 2  # function name, then file:line
    return chains


def part_of(chain):
    for level, (fn, path) in enumerate(chain):
        if level == 0:
            for pat, part in PART_BY_FILE:
                if re.search(pat, path):
                    return part
            continue
        short = re.sub(r"<.*", "", fn) if not fn.startswith("drop_in_place") else fn
        if short in PART_BY_FUNCTION:
            return PART_BY_FUNCTION[short]
    return WRAPPER


def main():
    hooked, plain, lib, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    h_self, h_call, _, h_total = parse(hooked)
    _, _, _, p_total = parse(plain)
    libname = lib.rsplit("/", 1)[-1]
    ours = {a: c for (o, a), c in h_self.items() if o and o.endswith(libname)}
    chains = inline_chains(lib, sorted(ours))
    # parts[wrapper][part]: the benchmark calls cuMemAlloc_v2 and cuMemFree_v2 alike often.
    parts = collections.defaultdict(collections.Counter)
    for a, c in ours.items():
        chain = chains.get(a, [])
        outer = chain[-1][0] if chain else "?"
        parts[outer][part_of(chain)] += c
    # Calls out of our library: the real driver function is the call being measured, not
    # ours; the device lookup and the TLS accessor are ours.
    for (o, fn, co, cfn), c in h_call.items():
        if not (o and o.endswith(libname)) or (co and co.endswith(libname)):
            continue
        if cfn == "cuCtxGetDevice":
            parts[fn]["device lookup"] += c
        elif cfn == "__tls_get_addr":
            parts[fn]["thread state + guard"] += c
        elif fn != cfn:
            parts[fn]["other calls out of the hook"] += c
    added = h_total - p_total
    per_kind = calls / 2
    alloc, free = parts.get("cuMemAlloc_v2", collections.Counter()), parts.get("cuMemFree_v2", collections.Counter())
    inside = sum(sum(v.values()) for v in parts.values())
    names = sorted(set(alloc) | set(free), key=lambda k: -(alloc[k] + free[k]))
    print(f"instructions the hook adds per call (callgrind, exact; {calls} calls): {added / calls:.1f} on average")
    print(f"  {'':48} {'per alloc':>10} {'per free':>10}")
    for part in names:
        print(f"  {part:48} {alloc[part] / per_kind:10.1f} {free[part] / per_kind:10.1f}")
    print(f"  {'total in the wrappers':48} {sum(alloc.values()) / per_kind:10.1f} {sum(free.values()) / per_kind:10.1f}")
    print(f"  (outside the wrappers, once per process: ring creation, the loader, other wrappers:"
          f" {(added - inside + sum(v for k, cnt in parts.items() if k not in ('cuMemAlloc_v2', 'cuMemFree_v2') for v in cnt.values())) / calls:.1f} per call)")


if __name__ == "__main__":
    main()
