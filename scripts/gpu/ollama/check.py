#!/usr/bin/env python3
"""Checks of issue #12 over what scripts/gpu/ollama/run.sh left in DIR (/tmp/vho); prints the
report that becomes docs/gpu/ollama.txt and exits 1 on a mismatch.

Per runner, at each checkpoint of the agent mode:
  * ollama's /api/ps size_vram <= vramhook's live bytes for that runner;
  * NVML's per-process usage - vramhook's live bytes = the CUDA context overhead within 1% of
    NVML's figure, the overhead measured in the same run from processes that hold only their
    context (a runner before its first allocation, and a process that only initialised cudart;
    ollama's GPU-discovery children create no context: they read free memory through NVML).
Per runner, every mode: the CUDA0 buffers the runner logged are all in its live bytes.
Every mode: the Go parent is silent, the discovery children hold nothing and have no ring,
every runner is traced, every process NVML saw on the GPU is traced, and the failing case
(scenario 5) has an incident whose request is the buffer ggml logged as failed, judged
against the device's free bytes.
Modes: agent (default engine), run (`vramhook run`), agent-new (OLLAMA_NEW_ENGINE=1).
"""
import glob
import json
import os
import re
import statistics
import sys

MIB = 1 << 20
R = sys.argv[1] if len(sys.argv) > 1 else "/tmp/vho"
fails = []
lines = []


def out(s=""):
    lines.append(s)
    print(s, flush=True)


def check(ok, what):
    out(("  PASS " if ok else "  FAIL ") + what)
    if not ok:
        fails.append(what)


def mib(b):
    return "-" if b is None else f"{b / MIB:,.2f} MiB"


def jsonl(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except FileNotFoundError:
        return []


def blob_names():
    """blob sha256 -> model name, from ollama's manifests."""
    names = {}
    for f in glob.glob(f"{R}/models/manifests/*/*/*/*"):
        try:
            m = json.load(open(f))
        except Exception:
            continue
        for layer in m.get("layers", []):
            if layer.get("mediaType") == "application/vnd.ollama.image.model":
                names[layer["digest"].replace(":", "-")] = f.split("/")[-2]
    return names


def is_runner(command):
    """ollama's model runner: `ollama runner --model …` (the new engine adds --ollama-engine)."""
    return " runner " in command and "--model " in command


def runner_model(command, names):
    m = re.search(r"--model \S*/blobs/(sha256-[0-9a-f]+)", command)
    return names.get(m.group(1)) if m else None


def serve_pids(mode):
    try:
        return {int(l.split()[1]): l.split()[0] for l in open(f"{R}/{mode}/serve-pids.txt")}
    except FileNotFoundError:
        return {}


def failed_buffers(mode):
    """(MiB as ggml wrote it) of every `cudaMalloc failed` in the failing case's log."""
    sizes = []
    if not os.path.exists(f"{R}/{mode}/serve-fail.log"):
        return sizes
    for l in open(f"{R}/{mode}/serve-fail.log", errors="replace"):
        m = re.search(r"allocating ([0-9.]+) MiB on device \d+: cudaMalloc failed", l)
        if m:
            sizes.append(float(m.group(1)))
    return sizes


def logged_buffers(mode):
    """Per runner start, in order: ggml's CUDA0 buffer sizes as the runner logged them (MiB)."""
    blocks = []
    for name in ("main", "parallel", "fail"):
        f = f"{R}/{mode}/serve-{name}.log"
        if not os.path.exists(f):
            continue
        for l in open(f, errors="replace"):
            if 'msg="starting runner"' in l and "--model" in l:
                blocks.append({})
            m = re.search(r"(\w+): +CUDA0 (model|KV|compute|output) buffer size = +([0-9.]+) MiB", l)
            if m and blocks:
                blocks[-1][m.group(2)] = blocks[-1].get(m.group(2), 0) + float(m.group(3))
    return blocks


def structure(mode, procs, incidents, nvml_pids):
    """procs: pid -> command for every process vramhook traced in this mode."""
    serve = serve_pids(mode)
    out(f"  serve (Go parent) pids: {sorted(serve)}; traced processes: {len(procs)}")
    check(all(p not in procs for p in serve), f"{mode}: the Go parent (ollama serve) is silent: no ring, no process")
    disc = {p: c for p, c in procs.items() if "runner --ollama-engine" in c and "--model" not in c}
    runners = {p: c for p, c in procs.items() if is_runner(c)}
    started = sum(open(f, errors="replace").read().count('runner --ollama-engine --port')
                  for f in glob.glob(f"{R}/{mode}/serve-*.log"))
    loads = sum(open(f, errors="replace").read().count('msg="starting runner" cmd="') for f in glob.glob(f"{R}/{mode}/serve-*.log")) - started
    out(f"  discovery children started (serve logs): {started}; with a ring: {len(disc)}; "
        f"runners started: {loads}, traced: {len(runners)} ({sorted(runners)})")
    # ollama's discovery children read free memory through NVML and never create a CUDA
    # context: they hold no device memory, call no memory function, and so have no ring.
    check(started > 0 and not disc and not any(p not in procs for p in nvml_pids),
          f"{mode}: the {started} GPU-discovery children hold nothing on the GPU (none ever in NVML's process list) "
          f"and vramhook is silent for them")
    check(len(runners) == loads, f"{mode}: every runner traced ({len(runners)} of {loads} started)")
    untraced = sorted(p for p in nvml_pids if p not in procs)
    check(not untraced, f"{mode}: every process NVML showed on the GPU is traced (untraced: {untraced})")
    want = failed_buffers(mode)
    out(f"  failing case: ggml logged cudaMalloc failures of {want} MiB")
    hits = []
    for i in incidents:
        if any(abs(i["requested_bytes"] / MIB - w) < 0.006 for w in want):
            hits.append(i)
    for i in incidents:
        out(f"  incident pid {i['pid']} {i.get('api')} {mib(i['requested_bytes'])} free {mib(i.get('device_free_bytes'))}"
            f" verdict {i.get('verdict_name') or i.get('verdict')}: {i.get('explanation', '')[:400]}")
    check(bool(want) and bool(hits), f"{mode}: the failing case has an incident for the buffer ggml logged as failed")
    for i in hits:
        v = i.get("verdict_name") or i.get("verdict")
        free = i.get("device_free_bytes")
        check(v in ("capacity", "other_process") and free is not None and free < i["requested_bytes"],
              f"{mode}: its verdict ({v}) matches what happened: another process held the GPU, "
              f"free {mib(free)} < requested {mib(i['requested_bytes'])}")
    return runners


MODE = "agent"


def agent_mode(names, mode="agent", title="vramhook agent + LD_PRELOAD=libvramhook.so ollama serve"):
    global MODE
    MODE = mode
    out("")
    out(f"== {mode}: {title} ==")
    cks = {c["name"]: c for c in jsonl(f"{R}/{mode}/checkpoints.jsonl")}
    samples = jsonl(f"{R}/{mode}/samples.jsonl")
    out(f"  checkpoints: {list(cks)}; samples: {len(samples)}")
    # Context overhead, measured in this run.
    # A runner counts only before its first allocation (live 0 after frees is not "context only").
    first_alloc = {}
    for s in samples:
        for pid, v in s["live"].items():
            if v["live"] > 0:
                first_alloc.setdefault(pid, s["t_ns"])
    disc = {}
    for s in samples:
        for pid, v in s["live"].items():
            if is_runner(v["command"]) and pid in s["nvml"] and v["live"] == 0 and v["alive"] \
                    and s["t_ns"] < first_alloc.get(pid, 1 << 63):
                disc.setdefault(pid, []).append(s["nvml"][pid])
    ctx_disc = {p: max(v) for p, v in disc.items()}
    out(f"  context overhead, runners before their first allocation (NVML, live 0): "
        f"{[(p, mib(v), len(disc[p])) for p, v in ctx_disc.items()]}")
    ctx_only = None
    c = cks.get("context-only")
    if c:
        try:
            pid = str(json.load(open(f"{R}/{mode}/context.out"))["pid"])
            if pid in c["nvml"]:
                ctx_only = c["nvml"][pid] - c["live"].get(pid, {}).get("live", 0)
        except Exception as e:
            out(f"  context-only process unreadable: {e}")
    out(f"  context overhead, a process holding only its cudart context: {mib(ctx_only)}")
    refs = list(ctx_disc.values()) + ([ctx_only] if ctx_only is not None else [])
    ref = statistics.median(refs) if refs else None
    out(f"  reference context overhead: {mib(ref)}")
    try:  # the local memory a context reserves once a kernel with the largest stack runs
        st = open(f"{R}/stack-sizes.txt").read()
        big = max(int(x) for x in re.findall(r"STACK:(\d+)", st))
        sms, per_sm = (int(x) for x in re.search(r"SMs (\d+) max threads/SM (\d+)", st).groups())
        out(f"  largest kernel stack in libggml-cuda.so: {big} B/thread; x {per_sm} threads x {sms} SMs = "
            f"{mib(big * per_sm * sms)} of local memory if such a kernel runs (NVML counts it, no memory call makes it)")
    except Exception:
        pass
    check(ref is not None, f"{mode}: context overhead measured in this run")
    nvml_pids = set()
    for s in samples + list(cks.values()):
        nvml_pids |= {int(p) for p in s["nvml"]}
    out("")
    out("  per runner:  checkpoint | model | size_vram (ollama) | live (vramhook) | NVML | NVML-live | -context | by class | arenas")
    for name, c in cks.items():
        ps = {m["name"].split(":")[0]: m for m in (c["ps"].get("models", []) if isinstance(c["ps"], dict) else [])}
        for pid, v in c["live"].items():
            if not v["alive"] or not is_runner(v["command"]):
                continue
            model = runner_model(v["command"], names)
            sv = ps.get(model, {}).get("size_vram")
            nv = c["nvml"].get(pid)
            cls = {k: mib(b) for k, b in v["by_class"].items() if b}
            arenas = [(a["kind"], mib(a["size"]), "occupied " + mib(a["occupied"]), "largest free " + mib(a["largest_free_span"]))
                      for a in c["arenas"] if str(a["pid"]) == pid]
            over = None if nv is None else nv - v["live"]
            out(f"  {mode} {name} | {model} pid {pid} | {mib(sv)} | {mib(v['live'])} | {mib(nv)} | {mib(over)} | "
                f"{mib(None if over is None or ref is None else over - ref)} | {cls} | {arenas}")
            if sv is not None:
                check(sv <= v["live"], f"{mode} {name} {model}: size_vram {mib(sv)} <= live {mib(v['live'])} "
                      f"(live - size_vram = {mib(v['live'] - sv)})")
            if nv is not None and ref is not None:
                d = over - ref
                check(abs(d) <= 0.01 * nv, f"{mode} {name} {model}: NVML - live = {mib(over)} vs context {mib(ref)}: "
                      f"off by {mib(d)} = {100 * d / nv:+.2f}% of NVML's {mib(nv)} (allowed 1%)")
    procs = {}
    rep = json.load(open(f"{R}/{mode}/analyze.json")) if os.path.exists(f"{R}/{mode}/analyze.json") else {}
    for p in rep.get("processes", []):
        procs[p["pid"]] = p["command"]
    incidents = rep.get("ooms", [])
    if not incidents:  # the capture is the record; the live state is the fallback
        for c in cks.values():
            incidents += c.get("incidents", [])
    out("")
    runners = structure(MODE, procs, incidents, nvml_pids)
    peaks = {p["pid"]: p["peak_bytes"] for p in rep.get("processes", []) if p["pid"] in runners}
    buffers_vs_live(MODE, peaks)


def buffers_vs_live(mode, peaks):
    """The buffers each runner logged (ggml's own sizes) against its peak live bytes."""
    blocks = logged_buffers(mode)
    pids = sorted(peaks)
    out(f"  runners' own buffer lines (CUDA0 model + KV + compute + output) against vramhook's peak live:")
    if len(blocks) != len(pids):
        check(False, f"{mode}: {len(blocks)} runner starts in the logs for {len(pids)} traced runners")
        return
    for pid, b in zip(pids, blocks):
        total = sum(b.values()) * MIB
        out(f"  pid {pid}: logged {b} = {mib(total)}; peak live {mib(peaks[pid])}; "
            f"live - logged = {mib(peaks[pid] - total)} (cuBLAS workspace, ggml's VMM pool)")
        check(total <= peaks[pid] + 0.01 * MIB, f"{mode} pid {pid}: every buffer the runner logged is in its live bytes")


def run_mode(names):
    out("")
    out("== run: vramhook run -- (the same scenarios, ollama's default engine) ==")
    try:
        rep = json.load(open(f"{R}/run/analyze.json"))
    except Exception as e:
        check(False, f"run: analyze --json of the capture: {e}")
        return
    procs = {p["pid"]: p["command"] for p in rep.get("processes", [])}
    nvml_pids = set()
    cks = jsonl(f"{R}/run/checkpoints.jsonl")
    for c in cks:
        nvml_pids |= {int(p) for p in c["nvml"]}
    runners = structure("run", procs, rep.get("ooms", []), nvml_pids)
    peaks = {p["pid"]: p for p in rep.get("processes", [])}
    buffers_vs_live("run", {p: peaks[p]["peak_bytes"] for p in runners})
    out("  per runner: model | peak live | final live | exit")
    for pid, cmd in sorted(runners.items()):
        p = peaks[pid]
        out(f"  pid {pid} {runner_model(cmd, names)} | {mib(p['peak_bytes'])} | {mib(p['final_live_bytes'])} | {p.get('exit_status')}")
    for c in cks:
        for m in (c["ps"].get("models", []) if isinstance(c["ps"], dict) else []):
            name = m["name"].split(":")[0]
            # The runner of that model that NVML showed on the GPU at the checkpoint.
            cands = [p for p, cmd in runners.items() if runner_model(cmd, names) == name and str(p) in c["nvml"]]
            if len(cands) == 1 and m["size_vram"]:
                pk = peaks[cands[0]]["peak_bytes"]
                check(m["size_vram"] <= pk, f"run {c['name']} {name} pid {cands[0]}: size_vram {mib(m['size_vram'])} <= "
                      f"the runner's peak live {mib(pk)} (NVML {mib(c['nvml'][str(cands[0])])})")


def main():
    names = blob_names()
    out(f"ollama v0.24.0 under vramhook on the H200; models {sorted(set(names.values()))}")
    try:
        out(open(f"{R}/env.txt").read().splitlines()[0])
    except Exception:
        pass
    parts = [agent_mode, run_mode]
    if os.path.isdir(f"{R}/agent-new"):
        parts.append(lambda n: agent_mode(n, "agent-new", "the agent again, ollama serve with OLLAMA_NEW_ENGINE=1"))
    for part in parts:
        try:
            part(names)
        except Exception as e:  # noqa: BLE001 - reported as a failed check, the rest still runs
            import traceback
            traceback.print_exc()
            check(False, f"{part.__name__} could not be checked: {e!r}")
    out("")
    out(f"{len(fails)} check(s) failed" if fails else "all checks passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
