//! `vramhook run`: trace a command and all its descendants.

use crate::summary::{self, Recorder};
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};
use vramhook_agent::rings::{default_ring_dir, RingFilter, RingSource};
use vramhook_protocol::clock::TscClock;

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
    /// The command to run, after `--`.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::Relaxed);
}

/// Where libvramhook.so is: $VRAMHOOK_LIB, else beside this binary.
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

/// Everything `run` and `demo` share: spawn traced, drain, record, summarise.
pub struct TracedRun<'a> {
    pub program: &'a [OsString],
    pub envs: Vec<(OsString, OsString)>,
    pub record: Option<&'a Path>,
    pub ring_dir: Option<&'a Path>,
    pub ring_slots: Option<u64>,
}

pub struct RunOutcome {
    pub exit_code: i32,
    pub recorder: Recorder,
}

pub fn trace(run: TracedRun<'_>) -> Result<RunOutcome> {
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
    for (k, v) in &run.envs {
        cmd.env(k, v);
    }
    let child = cmd.spawn().with_context(|| format!("cannot start {}", program.to_string_lossy()))?;
    let child_pid = child.id() as i32;
    drop(child); // reaped below with waitpid(-1), together with every descendant
                 // SAFETY: installing a handler that only stores an atomic.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }

    let mut exit_code = None;
    let mut descendants_left = true;
    let mut idle = Duration::from_millis(1);
    let mut last_report = Instant::now();
    loop {
        let sig = PENDING_SIGNAL.swap(0, Ordering::Relaxed);
        if sig != 0 {
            // SAFETY: forwarding a signal to our child.
            unsafe { libc::kill(child_pid, sig) };
        }
        // Reap every descendant that has exited.
        while descendants_left {
            let mut status = 0;
            // SAFETY: waitpid with a valid out pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid > 0 {
                let code = wait_status_code(status);
                source.set_exit_status(pid as u32, code);
                recorder.note_exit_status(pid as u32, code);
                if pid == child_pid {
                    exit_code = Some(code);
                }
            } else if pid == 0 {
                break;
            } else {
                descendants_left = false; // ECHILD: no descendant is left
            }
        }
        // Reaped first, so that a closed ring's end carries the exit status.
        let summary = source.poll(&mut |item| recorder.handle(item));
        for refusal in source.take_refusals() {
            eprintln!("vramhook: ignoring ring {}: {}", refusal.path.display(), refusal.reason);
        }
        if !descendants_left && source.open_rings() == 0 {
            // A last look for rings made just before the last process exited.
            source.poll(&mut |item| recorder.handle(item));
            if source.open_rings() == 0 {
                break;
            }
        }
        if last_report.elapsed() > Duration::from_secs(1) {
            recorder.flush();
            last_report = Instant::now();
        }
        // Keep up while events flow (a full ring drops); back off to 20 ms when idle.
        idle =
            if summary.delivered > 0 { Duration::from_micros(200) } else { (idle * 2).min(Duration::from_millis(20)) };
        std::thread::sleep(idle);
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

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let outcome = trace(TracedRun {
        program: &args.command,
        envs: Vec::new(),
        record: args.record.as_deref(),
        ring_dir: args.ring_dir.as_deref(),
        ring_slots: args.ring_slots,
    })?;
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
