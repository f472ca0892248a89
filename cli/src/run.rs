//! `vramhook run`: trace a command and all its descendants.

use crate::summary::{self, Recorder};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use vramhook_agent::nvml::Feed;
use vramhook_agent::rings::{default_ring_dir, RingFilter, RingSource, SourceItem};
use vramhook_protocol::capture::ProcessEnd;
use vramhook_protocol::clock::TscClock;
use vramhook_protocol::record::Event;

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Write every event to this capture file (read it with `vramhook dump` or `analyze`).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Ring directory [default: /dev/shm/vramhook/<uid>].
    #[arg(long, value_name = "DIR")]
    pub ring_dir: Option<PathBuf>,
    /// Ring capacity per process, in 64-byte slots (a power of two) [default: 65536].
    #[arg(long, value_name = "N")]
    pub ring_slots: Option<u64>,
    /// Also write the end summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,
    /// Do not print the end summary.
    #[arg(long)]
    pub quiet: bool,
    /// Do not load the framework lenses (the PyTorch lens: its lens directory goes first
    /// on PYTHONPATH otherwise).
    #[arg(long)]
    pub no_lens: bool,
    /// Seconds between two reads of NVML's per-process usage into the capture (when
    /// libnvidia-ml.so.1 is present), which names the processes this run does not trace at
    /// an out-of-memory failure; it is also read right after each failure. 0: never.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub nvml_interval: f64,
    /// The command to run, after `--`.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// The NVML reading interval `--nvml-interval SECS` asks for: zero (off) for 0 or nonsense,
/// at least 100 ms otherwise.
pub fn nvml_interval(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs.clamp(0.1, 365.0 * 86_400.0)).unwrap_or(Duration::ZERO)
}

/// NVML's samples into the capture and the summary's model, like the rings' events.
fn record_samples(recorder: &mut Recorder, events: Vec<Event>) {
    if !events.is_empty() {
        recorder.handle(SourceItem::Events(&events));
    }
}

/// Whether `item` holds an out-of-memory failure.
fn has_oom(item: &SourceItem<'_>) -> bool {
    matches!(item, SourceItem::Events(events) if events.iter().any(Event::is_oom))
}

/// A poll that delivered at least this many events is followed by the next one at once.
const BUSY_POLL: u64 = 256;

/// The signals `run` passes on to its command.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
/// Received and not yet handled, per signal of [`FORWARDED`]: sent by a process (`kill`),
/// and sent by the kernel (the terminal's ^C and hangup, to its whole foreground group).
static PENDING_SENT: [AtomicU32; 3] = [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)];
static PENDING_TTY: [AtomicU32; 3] = [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)];
/// `si_code` of a signal the kernel sent: the terminal's (it is not in the libc crate).
const SI_KERNEL: libc::c_int = 0x80;

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let Some(i) = FORWARDED.iter().position(|s| *s == sig) else { return };
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let code = if info.is_null() { 0 } else { unsafe { (*info).si_code } };
    let pending = if code == SI_KERNEL { &PENDING_TTY } else { &PENDING_SENT };
    pending[i].fetch_add(1, Ordering::Relaxed);
}

fn install_signal_handlers() {
    for sig in FORWARDED {
        // SAFETY: a handler that only bumps atomics; sigaction with a zeroed, filled struct.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Passes on to the command the signals `run` received, each once. A signal from the
/// terminal (^C, hangup: the kernel sends it to the whole foreground process group) already
/// reached the command when it shares our process group, so it is not sent again; one
/// sent to `run` alone (`kill PID`) is forwarded.
fn forward_signals(child_pid: i32) {
    for (i, sig) in FORWARDED.iter().enumerate() {
        let sent = PENDING_SENT[i].swap(0, Ordering::Relaxed);
        let tty = PENDING_TTY[i].swap(0, Ordering::Relaxed);
        // SAFETY: getpgid/getpgrp have no memory preconditions.
        let shares_group = unsafe { libc::getpgid(child_pid) == libc::getpgrp() };
        let n = sent + if shares_group { 0 } else { tty };
        for _ in 0..n {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child_pid, *sig) };
        }
    }
}

/// How a process whose stream ended without an exit status stands with us.
enum Reaped {
    /// Our child, reaped now: its status.
    Now(i32),
    /// Our child, still running (its ring was closed on its exit mark): reaped later.
    Later,
    /// Not our child (its parent reaps it): its status cannot be known.
    NotOurs,
}

/// Whether a ring of the same process (pid and start time) is still in the directory: the
/// ended stream was an image that the process replaced by `exec`.
fn newer_image(ring_dir: &Path, end: &ProcessEnd) -> bool {
    let prefix = format!("{}-{}-", end.pid, end.start_time);
    std::fs::read_dir(ring_dir)
        .is_ok_and(|d| d.filter_map(|e| e.ok()).any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix))))
}

fn reap(pid: u32) -> Reaped {
    let mut status = 0;
    // SAFETY: waitpid with a valid out pointer.
    match unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) } {
        p if p > 0 => Reaped::Now(wait_status_code(status)),
        0 => Reaped::Later,
        _ => Reaped::NotOurs,
    }
}

/// The framework lenses' directory (a `sitecustomize.py` and the `vramhook_lens` package):
/// $VRAMHOOK_LENS_DIR, else `lens/` beside this binary, else `../share/vramhook/lens` from
/// it (installed layouts), else the source tree this binary was built from.
pub fn find_lens_dir() -> Option<PathBuf> {
    let is_lens = |p: &Path| p.join("sitecustomize.py").is_file() && p.join("vramhook_lens").is_dir();
    if let Some(p) = std::env::var_os("VRAMHOOK_LENS_DIR") {
        return Some(PathBuf::from(p)).filter(|p| is_lens(p));
    }
    let exe_dir = std::env::current_exe().ok()?.parent()?.to_path_buf();
    [
        exe_dir.join("lens"),
        exe_dir.join("../share/vramhook/lens"),
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../lens")),
    ]
    .into_iter()
    .find(|p| is_lens(p))
}

/// `PYTHONPATH` with `dir` first.
fn python_path_with(dir: &Path) -> OsString {
    let mut v = dir.as_os_str().to_os_string();
    if let Some(existing) = std::env::var_os("PYTHONPATH").filter(|e| !e.is_empty()) {
        v.push(":");
        v.push(existing);
    }
    v
}

/// Where libvramhook.so is: $VRAMHOOK_LIB, else beside this binary, else in the data
/// directory of an installed wheel (`<prefix>/share/vramhook`, see [`crate::share_dir`]).
pub fn find_interposer() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("VRAMHOOK_LIB") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("VRAMHOOK_LIB={} does not exist", p.display());
    }
    let p = crate::beside_exe("libvramhook.so").context("cannot locate this executable")?;
    if p.is_file() {
        return Ok(p);
    }
    if let Some(shared) = crate::share_dir().map(|d| d.join("libvramhook.so")).filter(|p| p.is_file()) {
        return Ok(shared);
    }
    bail!(
        "libvramhook.so not found beside this binary ({}); build it with `cargo build --release` or set VRAMHOOK_LIB",
        p.display()
    )
}

fn random_run_id() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: getrandom into our buffer.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    let id = if n == 8 {
        u64::from_le_bytes(buf)
    } else {
        vramhook_protocol::clock::monotonic_ns() ^ u64::from(std::process::id())
    };
    id.max(1)
}

fn wait_status_code(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
}

/// The directory of `file`, absolute (the traced program may change its directory).
fn dir_of(file: &Path) -> Option<PathBuf> {
    let parent = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::path::absolute(parent).ok()
}

/// Everything `run` and `demo` share: spawn traced, drain, record, summarise.
pub struct TracedRun<'a> {
    pub program: &'a [OsString],
    pub envs: Vec<(OsString, OsString)>,
    pub record: Option<&'a Path>,
    pub ring_dir: Option<&'a Path>,
    pub ring_slots: Option<u64>,
    /// Put the lens directory first on PYTHONPATH (found by [`find_lens_dir`]).
    pub lens: bool,
}

pub struct RunOutcome {
    pub exit_code: i32,
    pub recorder: Recorder,
}

pub fn trace(run: TracedRun<'_>) -> Result<RunOutcome> {
    trace_sampled(run, nvml_interval(5.0))
}

/// [`trace`], with NVML read every `nvml` (zero: never).
pub fn trace_sampled(run: TracedRun<'_>, nvml: Duration) -> Result<RunOutcome> {
    let lib = find_interposer()?;
    let run_id = random_run_id();
    let ring_dir = run.ring_dir.map(Path::to_path_buf).unwrap_or_else(default_ring_dir);
    // The ring directory as the rules say (parent 1777 sticky, ours 0700), or a clear
    // refusal; then what the gc rules remove (rings of gone processes), before we add ours.
    let ring_dir_fd = {
        use vramhook_protocol::ringdir;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let dir = ringdir::make_ring_dir(&ring_dir, uid)
            .map_err(|e| anyhow::anyhow!("refusing ring directory {}: {e}", ring_dir.display()))?;
        collect_garbage(&dir);
        dir
    };
    let tsc = TscClock::calibrate(Duration::from_millis(10));
    let mut recorder = Recorder::new(run.record)?;
    let mut source = RingSource::new(&ring_dir, RingFilter { run_id: Some(run_id) }, tsc);
    if let Some(slots) = run.ring_slots {
        // Rings as big as asked for are taken (two lanes' rounding to spare).
        let asked = (slots.max(1) as u128 * 64 * 2 + 4096 * 2).min(u64::MAX as u128) as u64;
        source.max_ring_bytes = source.max_ring_bytes.max(asked);
    }

    // Become the reaper of orphaned descendants, so that we see every one of them exit.
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(existing) if !existing.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(existing);
            v
        }
        _ => lib.clone().into_os_string(),
    };
    let (program, args) = run.program.split_first().context("no command given")?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).env("LD_PRELOAD", &preload).env("VRAMHOOK_RUN_ID", run_id.to_string());
    if let Some(dir) = run.ring_dir {
        cmd.env("VRAMHOOK_DIR", dir);
    }
    if let Some(slots) = run.ring_slots {
        cmd.env("VRAMHOOK_RING_SLOTS", slots.to_string());
    }
    if run.lens {
        if let Some(dir) = find_lens_dir() {
            cmd.env("PYTHONPATH", python_path_with(&dir));
        }
        // With VRAMHOOK_LENS_STACKS=1 the lens dumps PyTorch's snapshot at an OOM: beside the
        // capture, unless the user chose a directory.
        if std::env::var_os("VRAMHOOK_LENS_STACKS_DIR").is_none() {
            if let Some(dir) = run.record.and_then(dir_of) {
                cmd.env("VRAMHOOK_LENS_STACKS_DIR", dir);
            }
        }
    }
    for (k, v) in &run.envs {
        cmd.env(k, v);
    }
    // Before the spawn, so that no signal finds us without a handler (the command starts
    // with the default dispositions: exec resets caught signals).
    install_signal_handlers();
    let child = cmd.spawn().with_context(|| format!("cannot start {}", program.to_string_lossy()))?;
    // NVML's per-process usage into the capture: periodic, and after each failure.
    let mut nvml = Feed::spawn(nvml, "vramhook", false);
    let child_pid = child.id() as i32;
    drop(child); // reaped below with waitpid(-1), together with every descendant

    // Drained like the agent drains (ingest.rs): no sleep while events flow; liveness
    // looked up in /proc at most every 100 ms per ring (a ring marked exited is looked up
    // every poll); the directory scanned at most every 10 ms while busy. The batch per ring
    // stays the source's default (65,536): a lane cut short by a small batch while another
    // lane is read up to the time watermark lets a later poll deliver events older than
    // ones already delivered, and a free on one thread can then come before the alloc on
    // another that it follows (seen under load with 4,096: `trace::sixteen_threads_hammering`).
    source.liveness_interval = Duration::from_millis(100);
    source.auto_discover = false;
    let discover_every = Duration::from_millis(10);
    let mut last_discover = Instant::now() - discover_every;

    let mut exit_code = None;
    let mut statuses: BTreeMap<u32, i32> = BTreeMap::new();
    // Streams of our children that ended before we reaped them: their end waits for the
    // exit status (so a capture's process end never lacks a status `run` knew).
    let mut held: Vec<ProcessEnd> = Vec::new();
    let mut descendants_left = true;
    let mut idle = Duration::ZERO;
    let mut last_report = Instant::now();
    loop {
        forward_signals(child_pid);
        // Reap every descendant that has exited.
        while descendants_left {
            let mut status = 0;
            // SAFETY: waitpid with a valid out pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid > 0 {
                let code = wait_status_code(status);
                source.set_exit_status(pid as u32, code);
                recorder.note_exit_status(pid as u32, code);
                statuses.insert(pid as u32, code);
                if pid == child_pid {
                    exit_code = Some(code);
                }
            } else if pid == 0 {
                break;
            } else {
                descendants_left = false; // ECHILD: no descendant is left
            }
        }
        // Held ends whose status is now known go on (all of them once no child is left).
        for end in std::mem::take(&mut held) {
            match statuses.get(&end.pid) {
                Some(code) => recorder.handle(SourceItem::End(ProcessEnd { exit_status: Some(*code), ..end })),
                None if descendants_left => held.push(end),
                None => recorder.handle(SourceItem::End(end)),
            }
        }
        if last_discover.elapsed() >= discover_every || !idle.is_zero() {
            last_discover = Instant::now();
            source.discover_now();
        }
        // Reaped first, so that a closed ring's end carries the exit status.
        let mut oom = false;
        let summary = source.poll(&mut |item| match item {
            SourceItem::End(mut end) if end.exit_status.is_none() => match reap(end.pid) {
                Reaped::Now(code) => {
                    source_statuses_note(&mut statuses, &mut exit_code, child_pid, end.pid, code);
                    recorder.note_exit_status(end.pid, code);
                    end.exit_status = Some(code);
                    recorder.handle(SourceItem::End(end));
                }
                // An older image of a process that exec'd ends while the process runs on
                // in its new image (whose ring is still there): no status to wait for.
                Reaped::Later if newer_image(&ring_dir, &end) => recorder.handle(SourceItem::End(end)),
                Reaped::Later => held.push(end),
                Reaped::NotOurs => recorder.handle(SourceItem::End(end)),
            },
            other => {
                oom |= has_oom(&other);
                recorder.handle(other)
            }
        });
        if let Some(n) = &mut nvml {
            record_samples(&mut recorder, n.poll(oom));
        }
        for refusal in source.take_refusals() {
            eprintln!("vramhook: ignoring ring {}: {}", refusal.path.display(), refusal.reason);
        }
        if !descendants_left && source.open_rings() == 0 {
            // A last look for rings made just before the last process exited.
            source.discover_now();
            let mut oom = false;
            source.poll(&mut |item| {
                oom |= has_oom(&item);
                recorder.handle(item)
            });
            if let Some(n) = &mut nvml {
                record_samples(&mut recorder, n.poll(oom));
            }
            if source.open_rings() == 0 {
                break;
            }
        }
        if last_report.elapsed() > Duration::from_secs(1) {
            recorder.flush();
            last_report = Instant::now();
        }
        // Straight on while events flow, 1 ms after a trickle, backing off to 10 ms when
        // idle. "Flowing" is not "a poll came back full" (the agent's test): the batch is
        // split over a ring's lanes, so a process writing on one lane of two never fills
        // it, and a 1 ms sleep after each poll capped a one-thread process at ~2,000
        // events/ms: it dropped a third of its events with the reader on a core of its own.
        idle = if summary.delivered >= BUSY_POLL {
            Duration::ZERO
        } else if summary.delivered > 0 {
            Duration::from_millis(1)
        } else {
            (idle * 2).clamp(Duration::from_millis(1), Duration::from_millis(10))
        };
        if !idle.is_zero() {
            std::thread::sleep(idle);
        }
    }
    if let Some(n) = &mut nvml {
        // The read a failure asked for, when the run ended before it came.
        record_samples(&mut recorder, n.finish());
    }
    for end in held.drain(..) {
        let exit_status = statuses.get(&end.pid).copied();
        recorder.handle(SourceItem::End(ProcessEnd { exit_status, ..end }));
    }
    recorder.finish();
    // Our descendants' rings are drained and their processes gone: removed now (the
    // source's locks released first), so nothing accumulates across runs.
    drop(source);
    collect_garbage(&ring_dir_fd);
    Ok(RunOutcome { exit_code: exit_code.unwrap_or(1), recorder })
}

/// Applies the gc rules to the ring directory (rings of processes that are gone).
fn collect_garbage(dir: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    use vramhook_protocol::ringdir;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    ringdir::gc_dir(dir.as_raw_fd(), uid, &ringdir::GcPolicy::from_env(), ringdir::now_secs(), false, &mut |_| {});
}

fn source_statuses_note(
    statuses: &mut BTreeMap<u32, i32>,
    exit_code: &mut Option<i32>,
    child_pid: i32,
    pid: u32,
    code: i32,
) {
    statuses.insert(pid, code);
    if pid as i32 == child_pid {
        *exit_code = Some(code);
    }
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let outcome = trace_sampled(
        TracedRun {
            program: &args.command,
            envs: Vec::new(),
            record: args.record.as_deref(),
            ring_dir: args.ring_dir.as_deref(),
            ring_slots: args.ring_slots,
            lens: !args.no_lens,
        },
        nvml_interval(args.nvml_interval),
    )?;
    let report = outcome.recorder.report();
    if !args.quiet {
        eprint!("{}", summary::render_text(&report));
    }
    if let Some(path) = &args.summary_json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(ExitCode::from(outcome.exit_code.clamp(0, 255) as u8))
}
