#!/usr/bin/env python3
"""Checks of issue #12 over what scripts/gpu/ollama/run.sh left in DIR (/tmp/vho, or the run's
raw.tar.gz unpacked); prints the report that becomes docs/measurements/gpu/ollama.txt and exits 1 on a mismatch.

What a runner's NVML figure is made of, each part measured in the same run:
  * the cold context: NVML - live for a process holding only its cudart context (and for
    runners before their first allocation, and warm_probe before its first kernel);
  * what the driver takes with no memory call once kernels run: warm_probe launches kernels of
    known stack frames and reads NVML after each (local memory: on the H200 nothing beyond the
    cold context for frames up to 1 KiB), then creates a cuBLAS handle and runs one GEMM as
    ggml does (cuBLAS's allocations, which vramhook sees, and what NVML adds beyond them);
  * the warm context of each engine: NVML - live of its scenario-1 runner after its first
    generation, a runner whose every allocation is known (checked below). What it holds beyond
    the cold context and cuBLAS is not made by any memory call and depends on the kernels the
    runner loaded, so it is measured per engine, not derived.
Per runner, at each checkpoint of an agent mode:
  * live <= NVML - cold context (vramhook never counts more than the driver holds for it);
  * NVML - live - warm context within 1% of NVML (warm context: the engine's, or for a runner
    with no layer on the GPU, cold context + cuBLAS's NVML cost beyond its allocations);
  * default engine: live = the CUDA0 buffers llama.cpp logged + ggml's VMM pool + cuBLAS's
    allocations as warm_probe showed them, to the logged precision;
  * new engine: size_vram - live = the host-resident bytes ollama's log names (token embedding
    and CPU graph, which llm/server.go MemorySize adds when every layer is on the GPU)
    - cuBLAS's allocations, to the logged precision.
ollama's size_vram is reported, not checked against live: with the default engine it is the
estimate ollama logs before the runner loads (shown against that log), not what it allocated.
Per runner, every mode: the CUDA0 buffers the runner logged are all in its live bytes.
Every mode: the Go parent is silent, the discovery children hold nothing and have no ring,
every runner is traced, every process NVML saw on the GPU is traced, the failing case
(scenario 5) has an incident whose request is the buffer ggml logged as failed, judged against
the device's free bytes, and analyze names the process holding the GPU as its top holder.
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
# What a runner's peak may exceed its final live bytes by and still count as "never fell".
SCRATCH = 2 << 20
NVML_PAGE = 2 * MIB  # NVML's per-process figure moves in 2 MiB steps
fails = []
lines = []
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def out(s=""):
    lines.append(s)
    print(s, flush=True)


def check(ok, what):
    out(("  PASS " if ok else "  FAIL ") + what)
    if not ok:
        fails.append(what)
    return ok


def mib(b):
    return "-" if b is None else f"{b / MIB:,.2f} MiB"


def jsonl(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    except FileNotFoundError:
        return []


def load_json(path):
    try:
        return json.load(open(path))
    except (FileNotFoundError, ValueError):
        return None


def blob_names():
    """blob sha256 -> model name, from ollama's manifests."""
    names = {}
    for f in glob.glob(f"{R}/models/manifests/*/*/*/*") + glob.glob(f"{R}/*/manifests/*/*/*/*"):
        m = load_json(f)
        for layer in (m or {}).get("layers", []):
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


def runner_blocks(mode):
    """Per runner start, in order: what the serve log says about that runner's memory.
    llama: llama.cpp's CUDA0 buffer lines (MiB, two decimals; the default engine's runner);
    est: ollama's own summary lines (`model weights`/`kv cache`/`compute graph` per device,
    format.HumanBytes2, one decimal): the default engine's estimate before loading, the new
    engine's runner-reported allocation; the last one of each per runner;
    offloaded: (layers on the GPU, layers) as the runner logged it."""
    blocks = []
    for name in ("main", "parallel", "fail"):
        f = f"{R}/{mode}/serve-{name}.log"
        if not os.path.exists(f):
            continue
        for l in open(f, errors="replace"):
            if 'msg="starting runner"' in l and "--model" in l:
                blocks.append({"llama": {}, "llama_lines": 0, "est": {}, "offloaded": None, "log": f"serve-{name}.log"})
            if not blocks:
                continue
            b = blocks[-1]
            m = re.search(r"(\w+): +CUDA0 (model|KV|compute|output) buffer size = +([0-9.]+) MiB", l)
            if m:
                b["llama"][m.group(2)] = b["llama"].get(m.group(2), 0) + float(m.group(3))
                b["llama_lines"] += 1
            m = re.search(r'msg="(model weights|kv cache|compute graph)" device=(\S+) size="([0-9.]+) (B|KiB|MiB|GiB)"', l)
            if m:
                unit = UNITS[m.group(4)]
                tol = 0 if unit == 1 else 0.05 * unit  # %.1f
                b["est"][(m.group(1), m.group(2))] = (float(m.group(3)) * unit, tol)
            m = re.search(r"offloaded (\d+)/(\d+) layers to GPU", l)
            if m:
                b["offloaded"] = (int(m.group(1)), int(m.group(2)))
    return blocks


def est_sum(b, device=None, exclude_device=None):
    """ollama's summary lines added up: (bytes, tolerance from their rounding)."""
    v = t = 0.0
    for (_, dev), (x, tol) in b["est"].items():
        if (device is None or dev == device) and dev != exclude_device:
            v += x
            t += tol
    return v, t


def all_on_gpu(b):
    return b["offloaded"] is not None and b["offloaded"][0] == b["offloaded"][1]


def host_resident(b):
    """Bytes size_vram counts that stay in host memory: llm/server.go MemorySize adds the input
    weights (token embedding) and the CPU graph when no layer is on the CPU."""
    if not all_on_gpu(b):
        return 0.0, 0.0
    return est_sum(b, device="CPU")


def warm_probe(mode, cks):
    """warm_probe's steps and what they show. Returns a dict of measured figures (bytes)."""
    rows = jsonl(f"{R}/{mode}/warm.jsonl")
    dev = next((r for r in rows if "sms" in r), None)
    steps = {r["step"]: r for r in rows if "step" in r}
    w = {"steps": steps, "dev": dev}
    if not dev or "cold" not in steps or steps["cold"]["nvml"] < 0:
        err = open(f"{R}/{mode}/warm.log", errors="replace").read()[-400:] if os.path.exists(f"{R}/{mode}/warm.log") else "no output"
        check(False, f"{mode}: warm_probe ran and NVML saw it ({err.strip()})")
        return w
    threads = dev["sms"] * dev["max_threads_per_sm"]
    cold = steps["cold"]["nvml"]
    pid = str(steps["cold"]["pid"])
    out(f"  warm_probe (pid {pid}, {dev['device']}, {dev['sms']} SMs x {dev['max_threads_per_sm']} threads = {threads:,} threads):")
    out(f"    step           | frame B | NVML        | NVML - cold | frame x threads | device free - cold's | stack limit")
    for name, r in steps.items():
        f = r["local_size_bytes"]
        out(f"    {name:14} | {f:7} | {mib(r['nvml']):>11} | {mib(r['nvml'] - cold):>11} | {mib(f * threads) if f else '-':>15} | "
            f"{mib(steps['cold']['free'] - r['free']):>11} | {r['stack_limit']}")
    w["cold"] = cold
    w["local"] = {r["local_size_bytes"]: r["nvml"] - cold for r in steps.values() if r["local_size_bytes"]}
    w["threads"] = threads
    # vramhook's view of the probe: nothing live until cuBLAS, then cuBLAS's own allocations
    # (its GEMM's operands are freed before the reading).
    for c in ("warm-cold", "warm-stacks", "warm-cublas"):
        if c in cks:
            w[c] = cks[c]["live"].get(pid, {}).get("live", 0)
            w[c + "-nvml"] = cks[c]["nvml"].get(pid)
    if "cublas" in steps and "stacks" in steps and "warm-cublas" in w:
        w["cublas_live"] = w["warm-cublas"]
        w["cublas_nvml"] = steps["cublas"]["nvml"] - steps["stacks"]["nvml"]
        w["cublas_extra"] = w["cublas_nvml"] - w["cublas_live"]
        out(f"    cuBLAS (handle, own stream, one GEMM): vramhook live {mib(w['cublas_live'])}; NVML +{mib(w['cublas_nvml'])}: "
            f"{mib(w['cublas_extra'])} beyond its allocations (its kernels' code and page rounding)")
        check(w.get("warm-cold", 0) == 0 and w.get("warm-stacks", 0) == 0 and w["cublas_live"] > 0,
              f"{mode}: vramhook saw nothing of warm_probe until cuBLAS, then cuBLAS's {mib(w['cublas_live'])}")
    else:
        check(False, f"{mode}: warm_probe's cuBLAS step read by vramhook (steps {list(steps)}, checkpoints {[c for c in cks if c.startswith('warm')]})")
    # Measured on the H200 (docs/measurements/gpu/ollama.txt): frames up to 1 KiB, the default stack limit,
    # add nothing: the cold context already holds that local memory. Reported, not assumed.
    grown = max(w["local"].values(), default=None)
    out(f"    kernels with stack frames of {sorted(w['local'])} B grew NVML's figure by at most {mib(grown)}: "
        f"{'the cold context already holds their local memory' if grown is not None and grown < NVML_PAGE else 'local memory taken on launch'}")
    return w


def cold_context(mode, cks, samples, w):
    """The cold context: NVML - live for processes that hold only their context."""
    first_alloc = {}
    for s in samples:
        for pid, v in s["live"].items():
            if v["live"] > 0:
                first_alloc.setdefault(pid, s["t_ns"])
    pre = {}
    for s in samples:
        for pid, v in s["live"].items():
            if is_runner(v["command"]) and pid in s["nvml"] and v["live"] == 0 and v["alive"] \
                    and s["t_ns"] < first_alloc.get(pid, 1 << 63):
                pre.setdefault(pid, []).append(s["nvml"][pid])
    ctx_pre = {p: max(v) for p, v in pre.items()}
    out(f"  cold context, runners before their first allocation (NVML, live 0): {[(p, mib(v), len(pre[p])) for p, v in ctx_pre.items()]}")
    ctx_only = None
    c = cks.get("context-only")
    info = load_json(f"{R}/{mode}/context.out")
    if c and info:
        pid = str(info["pid"])
        if pid in c["nvml"]:
            ctx_only = c["nvml"][pid] - c["live"].get(pid, {}).get("live", 0)
    out(f"  cold context, a process holding only its cudart context: {mib(ctx_only)}")
    refs = list(ctx_pre.values()) + ([ctx_only] if ctx_only is not None else []) + ([w["cold"]] if "cold" in w else [])
    out(f"  cold context, warm_probe before its first kernel: {mib(w.get('cold'))}")
    ref = statistics.median(refs) if refs else None
    check(ref is not None and max(refs) - min(refs) <= NVML_PAGE,
          f"{mode}: cold context measured in this run: {mib(ref)} (readings {sorted(set(mib(r) for r in refs))}, all within 2 MiB)")
    return ref


def stack_sizes():
    try:
        st = open(f"{R}/stack-sizes.txt").read()
        return max(int(x) for x in re.findall(r"STACK:(\d+)", st))
    except (FileNotFoundError, ValueError):
        return None


def runner_readings(cks, names):
    """(checkpoint, pid, model, reading) for every live runner at every scenario checkpoint."""
    for name, c in cks.items():
        if name.startswith("warm") or name == "context-only":
            continue
        for pid, v in c["live"].items():
            if v["alive"] and is_runner(v["command"]):
                yield name, pid, runner_model(v["command"], names), c, v


def agent_mode(names, mode="agent", title="vramhook agent + LD_PRELOAD=libvramhook.so ollama serve"):
    new_engine = mode == "agent-new"
    out("")
    out(f"== {mode}: {title} ==")
    cks = {c["name"]: c for c in jsonl(f"{R}/{mode}/checkpoints.jsonl")}
    samples = jsonl(f"{R}/{mode}/samples.jsonl")
    out(f"  checkpoints: {list(cks)}; samples: {len(samples)}")
    w = warm_probe(mode, cks)
    cold = cold_context(mode, cks, samples, w)
    rep = load_json(f"{R}/{mode}/analyze.json") or {}
    procs = {p["pid"]: p["command"] for p in rep.get("processes", [])}
    runner_pids = sorted(p for p, c in procs.items() if is_runner(c))
    blocks = runner_blocks(mode)
    block_of = dict(zip((str(p) for p in runner_pids), blocks)) if len(blocks) == len(runner_pids) else {}
    cublas = w.get("cublas_live")

    def accounted(pid, v, ps_model):
        """(expected live, tolerance, how) from what the runner's log and warm_probe say."""
        b = block_of.get(pid)
        if b is None or cublas is None:
            return None
        # ggml's stream-ordered allocations (cuMemAllocAsync) live only while a graph runs.
        pool = v["by_class"].get("pool", 0)
        inflight = f" + in flight from the stream-ordered pool {mib(pool)}" if pool else ""
        if not new_engine:
            if not b["llama"]:
                return None
            logged = sum(b["llama"].values()) * MIB
            vmm = v["by_class"].get("vmm", 0)
            return logged + vmm + cublas + pool, 0.005 * MIB * b["llama_lines"] + 1024, \
                f"llama.cpp's CUDA0 buffers {mib(logged)} + ggml's VMM pool {mib(vmm)} + cuBLAS {mib(cublas)}{inflight}"
        if ps_model is None:
            return None
        host, tol = host_resident(b)
        return ps_model["size_vram"] - host + cublas + pool, tol + 0.01 * MIB, \
            f"size_vram {mib(ps_model['size_vram'])} - host-resident {mib(host)} (log) + cuBLAS {mib(cublas)}{inflight}"

    # The warm context of this engine: its scenario-1 runner after its first generation.
    warm = ref_key = None
    ref = cks.get("s1-loaded")
    for name, pid, model, c, v in runner_readings({"s1-loaded": ref} if ref else {}, names):
        ps = {m["name"].split(":")[0]: m for m in c["ps"].get("models", [])} if isinstance(c["ps"], dict) else {}
        nv = c["nvml"].get(pid)
        if model == "vh-a" and nv is not None:
            warm, ref_key = nv - v["live"], (name, pid)
    big = stack_sizes()
    if warm is not None and cold is not None:
        extra = w.get("cublas_extra")
        local = None if big is None or not w.get("local") else \
            w["local"][min((f for f in w["local"] if f >= big), default=max(w["local"]))]
        out(f"  warm context ({'new' if new_engine else 'default'} engine), measured on the scenario-1 runner pid {ref_key[1]} after its first "
            f"generation (its live bytes accounted for below): {mib(warm)} = cold {mib(cold)} + {mib(warm - cold)}")
        out(f"    of which cuBLAS beyond its allocations (warm_probe) {mib(extra)}; local memory for libggml-cuda.so's largest "
            f"frame ({big} B; warm_probe) {mib(local)}; the rest, {mib(None if extra is None else warm - cold - extra - (local or 0))}, "
            f"is not made by any memory call and not measured apart (the code of the kernels the runner loaded, and "
            f"the 2 MiB pages its allocations round up to, are what is left)")
        check(warm >= cold, f"{mode}: the warm context is no smaller than the cold one ({mib(warm)} >= {mib(cold)})")
    check(warm is not None, f"{mode}: warm context measured in this run on the scenario-1 runner after its first generation")
    warm_cpu = None if cold is None else cold + w.get("cublas_extra", 0)

    out("")
    out("  per runner:  checkpoint | model | size_vram (ollama) | live (vramhook) | NVML | NVML-live | -warm | by class | arenas")
    for name, pid, model, c, v in runner_readings(cks, names):
        ps = {m["name"].split(":")[0]: m for m in c["ps"].get("models", [])} if isinstance(c["ps"], dict) else {}
        sv = ps.get(model, {}).get("size_vram")
        nv = c["nvml"].get(pid)
        b = block_of.get(pid)
        gpu_layers = b["offloaded"][0] if b and b["offloaded"] else None
        wc = warm_cpu if gpu_layers == 0 else warm
        cls = {k: mib(x) for k, x in v["by_class"].items() if x}
        arenas = [(a["kind"], mib(a["size"]), "occupied " + mib(a["occupied"]), "largest free " + mib(a["largest_free_span"]))
                  for a in c["arenas"] if str(a["pid"]) == pid]
        over = None if nv is None else nv - v["live"]
        out(f"  {mode} {name} | {model} pid {pid} | {mib(sv)} | {mib(v['live'])} | {mib(nv)} | {mib(over)} | "
            f"{mib(None if over is None or wc is None else over - wc)} | {cls} | {arenas}")
        if b and sv is not None:
            g, gt = est_sum(b, exclude_device="CPU")
            h, _ = host_resident(b)
            what = "the estimate it logged before loading" if not new_engine else "what the runner reported allocating"
            out(f"    size_vram {mib(sv)} is {what}: GPU {mib(g)} (+-{mib(gt)}) + host-resident {mib(h)} = {mib(g + h)} "
                f"(layers on the GPU: {b['offloaded']}); live - size_vram = {mib(v['live'] - sv)}")
        if nv is None:
            continue
        if cold is not None:
            check(v["live"] <= nv - cold, f"{mode} {name} {model}: live {mib(v['live'])} <= NVML - cold context = {mib(nv - cold)}")
        if (name, pid) == ref_key:
            out(f"    (the warm context's reference reading)")
        elif wc is not None:
            d = over - wc
            check(abs(d) <= 0.01 * nv, f"{mode} {name} {model}: NVML - live - warm context ({mib(wc)}{', no layer on the GPU: cold + cuBLAS' if wc is warm_cpu else ''}) "
                  f"= {mib(d)} = {100 * d / nv:+.2f}% of NVML's {mib(nv)} (allowed 1%)")
        acc = accounted(pid, v, ps.get(model))
        if acc:
            exp, tol, how = acc
            check(abs(v["live"] - exp) <= tol, f"{mode} {name} {model}: live {mib(v['live'])} = {how} = {mib(exp)} "
                  f"(off by {v['live'] - exp:+,.0f} B, allowed {tol:,.0f} B)")
        elif b is None or cublas is None:
            check(False, f"{mode} {name} {model}: live accounted for from the runner's log and warm_probe "
                  f"({'no log block for this runner' if b is None else 'no cuBLAS figure from warm_probe'})")
        else:
            out(f"    (every-byte check not run: {'no size_vram for it in /api/ps' if new_engine else 'no CUDA0 buffer line logged'})")
    incidents = rep.get("ooms", [])
    if not incidents:  # the capture is the record; the live state is the fallback
        for c in cks.values():
            incidents += c.get("incidents", [])
    nvml_pids = set()
    for s in samples + list(cks.values()):
        nvml_pids |= {int(p) for p in s["nvml"]}
    out("")
    runners = structure(mode, procs, incidents, nvml_pids, rep)
    peaks = {p["pid"]: p["peak_bytes"] for p in rep.get("processes", []) if p["pid"] in runners}
    buffers_vs_live(mode, peaks, blocks, new_engine)


def structure(mode, procs, incidents, nvml_pids, rep):
    """procs: pid -> command for every process vramhook traced in this mode."""
    serve = serve_pids(mode)
    out(f"  serve (Go parent) pids: {sorted(serve)}; traced processes: {len(procs)}")
    check(all(p not in procs for p in serve), f"{mode}: the Go parent (ollama serve) is silent: no ring, no process")
    disc = {p: c for p, c in procs.items() if "runner --ollama-engine" in c and "--model" not in c}
    runners = {p: c for p, c in procs.items() if is_runner(c)}
    logs = glob.glob(f"{R}/{mode}/serve-*.log")
    started = sum(open(f, errors="replace").read().count('runner --ollama-engine --port') for f in logs)
    loads = sum(open(f, errors="replace").read().count('msg="starting runner" cmd="') for f in logs) - started
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
    hits = [i for i in incidents if any(abs(i["requested_bytes"] / MIB - x) < 0.006 for x in want)]
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
    # The process that held the GPU in the failing case was traced: analyze must name it first.
    holder = load_json(f"{R}/{mode}/holder.out")
    top = rep.get("top_holders", [])
    if holder:
        out(f"  holder: pid {holder['pid']} held {mib(holder['held'])}; analyze's top holders: "
            f"{[(h['pid'], mib(h['peak_bytes'])) for h in top[:3]]}")
        check(bool(top) and top[0]["pid"] == holder["pid"] and top[0]["peak_bytes"] >= holder["held"],
              f"{mode}: analyze --json names the holder (pid {holder['pid']}) as the top holder, with at least the {mib(holder['held'])} it held")
        try:
            text = open(f"{R}/{mode}/analyze-fail.txt", errors="replace").read()
            m = re.search(r"TOP HOLDERS \(by peak\)\n\s+1\. pid (\d+)", text)
            check(bool(m) and int(m.group(1)) == holder["pid"],
                  f"{mode}: the failing case's analyze report (capture + serve-fail.log) lists the holder first under TOP HOLDERS "
                  f"(first: pid {m.group(1) if m else '-'})")
        except FileNotFoundError:
            check(False, f"{mode}: analyze-fail.txt exists")
    else:
        check(False, f"{mode}: the holder said which pid it was (holder.out)")
    return runners


def buffers_vs_live(mode, peaks, blocks, new_engine):
    """The buffers each runner logged (its own sizes) against its peak live bytes."""
    pids = sorted(peaks)
    out(f"  runners' own buffer lines ({'ollama: model weights + kv cache + compute graph on CUDA0' if new_engine else 'llama.cpp: CUDA0 model + KV + compute + output'}) "
        f"against vramhook's peak live:")
    if len(blocks) != len(pids):
        check(False, f"{mode}: {len(blocks)} runner starts in the logs for {len(pids)} traced runners")
        return
    for pid, b in zip(pids, blocks):
        if new_engine:
            total, tol = est_sum(b, exclude_device="CPU")
            what = {f"{k} {d}": mib(x) for (k, d), (x, _) in b["est"].items() if d != "CPU"}
        else:
            total, tol = sum(b["llama"].values()) * MIB, 0.005 * MIB * b["llama_lines"]
            what = b["llama"]
        out(f"  pid {pid} (layers on the GPU {b['offloaded']}): logged {what} = {mib(total)}; peak live {mib(peaks[pid])}; "
            f"live - logged = {mib(peaks[pid] - total)}")
        if total == 0:
            out(f"    (nothing logged on CUDA0: no check)")
            continue
        check(total - tol <= peaks[pid], f"{mode} pid {pid}: every buffer the runner logged is in its live bytes")


def run_mode(names):
    out("")
    out("== run: vramhook run -- (the same scenarios, ollama's default engine) ==")
    rep = load_json(f"{R}/run/analyze.json")
    if not rep:
        check(False, "run: analyze --json of the capture")
        return
    procs = {p["pid"]: p["command"] for p in rep.get("processes", [])}
    nvml_pids = set()
    cks = jsonl(f"{R}/run/checkpoints.jsonl")
    for c in cks:
        nvml_pids |= {int(p) for p in c["nvml"]}
    runners = structure("run", procs, rep.get("ooms", []), nvml_pids, rep)
    peaks = {p["pid"]: p for p in rep.get("processes", [])}
    blocks = runner_blocks("run")
    buffers_vs_live("run", {p: peaks[p]["peak_bytes"] for p in runners}, blocks, False)
    out("  per runner: model | peak live | final live | exit")
    for pid, cmd in sorted(runners.items()):
        p = peaks[pid]
        out(f"  pid {pid} {runner_model(cmd, names)} | {mib(p['peak_bytes'])} | {mib(p['final_live_bytes'])} | {p.get('exit_status')}")
    # No agent here: a runner's live bytes at a checkpoint are its final ones where they never
    # fell from the peak (ggml allocates once per load). warm_probe's cuBLAS: its final live.
    ck = {c["name"]: c for c in cks}
    steps = {r["step"]: r for r in jsonl(f"{R}/run/warm.jsonl") if "step" in r}
    wp = peaks.get(steps["cold"]["pid"]) if "cold" in steps else None
    cold = None
    info = load_json(f"{R}/run/context.out")
    if info and "context-only" in ck:
        cold = ck["context-only"]["nvml"].get(str(info["pid"]))
    out(f"  cold context (the context-only process): {mib(cold)}; warm_probe: {mib(steps.get('cold', {}).get('nvml'))}; "
        f"cuBLAS's allocations (warm_probe's final live): {mib(wp['final_live_bytes'] if wp else None)}")
    blk = dict(zip(sorted(runners), blocks)) if len(blocks) == len(runners) else {}

    def readings():
        for c in cks:
            for m in (c["ps"].get("models", []) if isinstance(c["ps"], dict) else []):
                name = m["name"].split(":")[0]
                cands = [p for p, cmd in runners.items() if runner_model(cmd, names) == name and str(p) in c["nvml"]]
                # Its final live bytes stand for its bytes at the checkpoint where they never fell
                # from the peak by more than ggml's stream-ordered scratch (a few bytes taken and
                # given back per generation: peak - final was 131 B in the H200 run).
                if len(cands) == 1 and peaks[cands[0]]["peak_bytes"] - peaks[cands[0]]["final_live_bytes"] <= SCRATCH:
                    yield c, m, name, cands[0]

    warm = next((c["nvml"][str(pid)] - peaks[pid]["final_live_bytes"] for c, m, name, pid in readings()
                 if c["name"] == "s1-loaded" and name == "vh-a"), None)
    check(warm is not None, "run: warm context measured on the scenario-1 runner after its first generation")
    for c, m, name, pid in readings():
        live, nv = peaks[pid]["final_live_bytes"], c["nvml"][str(pid)]
        out(f"  run {c['name']} {name} pid {pid}: size_vram {mib(m['size_vram'])} (ollama's estimate); live {mib(live)}; "
            f"NVML {mib(nv)}; NVML - live {mib(nv - live)}")
        if cold is not None:
            check(live <= nv - cold, f"run {c['name']} {name} pid {pid}: live {mib(live)} <= NVML - cold context = {mib(nv - cold)}")
        b = blk.get(pid)
        if wp and b and b["llama"]:
            vmm = live - sum(b["llama"].values()) * MIB - wp["final_live_bytes"]
            out(f"    live - llama.cpp's CUDA0 buffers - cuBLAS = {mib(vmm)} (ggml's VMM pool)")
        if c["name"] == "s1-loaded" and name == "vh-a":
            out(f"    warm context (this reading, the reference): {mib(warm)}")
        elif warm is not None:
            d = nv - live - warm
            check(abs(d) <= 0.01 * nv, f"run {c['name']} {name}: NVML - live - warm context ({mib(warm)}) = {mib(d)} "
                  f"= {100 * d / nv:+.2f}% of NVML's {mib(nv)} (allowed 1%)")


def main():
    names = blob_names()
    out(f"ollama v0.24.0 under vramhook on the H200; models {sorted(set(names.values()))}")
    try:
        out(open(f"{R}/env.txt").read().splitlines()[0])
    except (FileNotFoundError, IndexError):
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
            check(False, f"{getattr(part, '__name__', 'part')} could not be checked: {e!r}")
    out("")
    passed = sum(1 for l in lines if l.startswith("  PASS "))
    out(f"{passed} passed, {len(fails)} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
