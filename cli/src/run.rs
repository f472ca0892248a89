//! `vramhook run`: trace a command and all its descendants.

use crate::summary::{self, Recorder};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use vramhook_agent::nvml::Feed;
use vramhook_protocol::capture::ProcessEnd;
use vramhook_protocol::clock::TscClock;
use vramhook_protocol::record::Event;
use vramhook_ring::dir::default_ring_dir;
use vramhook_ring::source::{RingFilter, RingSource, SourceItem};

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

/// The signals `run` passes on to its command (the ones a user or a supervisor sends to
/// stop, reload or poke a program; job control's stop and continue act on the whole process
/// group by themselves).
const FORWARDED: [libc::c_int; 6] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2];
const N_FORWARDED: usize = FORWARDED.len();
/// Received and not yet handled, per signal of [`FORWARDED`]: sent by a process (`kill`),
/// and sent by the kernel (the terminal's ^C, ^\ and hangup, to its whole foreground group).
static PENDING_SENT: [AtomicU32; N_FORWARDED] = [const { AtomicU32::new(0) }; N_FORWARDED];
static PENDING_TTY: [AtomicU32; N_FORWARDED] = [const { AtomicU32::new(0) }; N_FORWARDED];
/// The sender (`si_pid`) of the last signal of each kind sent by a process.
static SENDER: [AtomicI32; N_FORWARDED] = [const { AtomicI32::new(0) }; N_FORWARDED];
/// `si_code` of a signal the kernel sent: the terminal's (it is not in the libc crate).
const SI_KERNEL: libc::c_int = 0x80;

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let Some(i) = FORWARDED.iter().position(|s| *s == sig) else { return };
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let code = if info.is_null() { 0 } else { unsafe { (*info).si_code } };
    if code != SI_KERNEL && !info.is_null() {
        // SAFETY: as above; a signal a process sent carries its pid.
        SENDER[i].store(unsafe { (*info).si_pid() }, Ordering::Relaxed);
    }
    let pending = if code == SI_KERNEL { &PENDING_TTY } else { &PENDING_SENT };
    pending[i].fetch_add(1, Ordering::Relaxed);
}

/// Catches the signals of [`FORWARDED`], except those `run` inherited as ignored: they
/// stay ignored, for `run` and for its command (`exec` keeps an ignored signal ignored; a
/// caught one it resets to the default, which made a job started with `&` by a
/// non-interactive shell, whose SIGINT is ignored, die of a `kill -INT`).
fn install_signal_handlers() {
    for sig in FORWARDED {
        // SAFETY: reading the current disposition; then a handler that only bumps atomics,
        // installed with a zeroed, filled struct.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A process of `run`'s own, in its process group, that only receives signals: a signal
/// sent to the group reaches it as it reaches `run` and the command; one sent to `run`
/// alone does not. Its siginfo alone cannot tell `run` which of the two it got; the
/// sentinel can. It keeps the signals of [`FORWARDED`] blocked and pending, and on each
/// question from `run` hands over those it holds (signal, `si_code`, sender).
///
/// It dies with `run` (`PR_SET_PDEATHSIG`), and is killed once the command is reaped.
struct Sentinel {
    pid: i32,
    ask: OwnedFd,
    answers: OwnedFd,
}

/// One of the sentinel's answers: signal number (0 ends an answer), `si_code`, sender pid.
const ANSWER: usize = 12;

impl Sentinel {
    fn spawn() -> Option<Sentinel> {
        let (ask_r, ask_w) = pipe()?;
        let (ans_r, ans_w) = pipe()?;
        // SAFETY: signal masks of this thread; fork, and in the child only async-signal-safe
        // calls (prctl, close, read, sigtimedwait, write, _exit) on its own descriptors.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in FORWARDED {
                libc::sigaddset(&mut set, sig);
            }
            // Blocked across the fork: the sentinel never runs `run`'s handlers.
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            let parent = libc::getpid();
            let pid = libc::fork();
            if pid == 0 {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                libc::prctl(libc::PR_SET_NAME, c"vramhook-signal".as_ptr());
                for fd in [0, 1, 2, ask_w.as_raw_fd(), ans_r.as_raw_fd()] {
                    libc::close(fd);
                }
                sentinel_loop(ask_r.as_raw_fd(), ans_w.as_raw_fd(), &set);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            if pid < 0 {
                return None;
            }
            Some(Sentinel { pid, ask: ask_w, answers: ans_r })
        }
    }

    /// The signals the sentinel received since the last question: (index in
    /// [`FORWARDED`], `si_code`, sender). `None` when it does not answer within 2 s.
    fn received(&self) -> Option<Vec<(usize, libc::c_int, i32)>> {
        // SAFETY: writes, polls and reads on our own pipe descriptors into our buffers.
        unsafe {
            if libc::write(self.ask.as_raw_fd(), [1u8].as_ptr().cast(), 1) != 1 {
                return None;
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut buf: Vec<u8> = Vec::with_capacity(ANSWER * 4);
            let mut out = Vec::new();
            loop {
                while buf.len() >= ANSWER {
                    let rec: Vec<u8> = buf.drain(..ANSWER).collect();
                    let field = |i: usize| i32::from_ne_bytes([rec[i], rec[i + 1], rec[i + 2], rec[i + 3]]);
                    if field(0) == 0 {
                        return Some(out);
                    }
                    if let Some(i) = FORWARDED.iter().position(|s| *s == field(0)) {
                        out.push((i, field(4), field(8)));
                    }
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                let mut pfd = libc::pollfd { fd: self.answers.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                if libc::poll(&mut pfd, 1, left.as_millis().clamp(1, 2000) as i32) <= 0 {
                    continue; // EINTR (one of our signals) or not yet: the deadline decides
                }
                let mut chunk = [0u8; ANSWER * 8];
                let n = libc::read(self.answers.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len());
                if n <= 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n as usize]);
            }
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        // SAFETY: killing our own child (reaped by `run`'s waitpid(-1) loop).
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
    }
}

/// The sentinel's life: at each byte from `run`, every signal it holds, then an end mark.
///
/// # Safety
/// Only in the forked sentinel: async-signal-safe calls on its own descriptors.
unsafe fn sentinel_loop(ask: libc::c_int, answers: libc::c_int, set: &libc::sigset_t) -> ! {
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    loop {
        let mut b = 0u8;
        let n = libc::read(ask, (&raw mut b).cast(), 1);
        if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
            libc::_exit(0); // `run` is gone
        }
        if n < 0 {
            continue;
        }
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let sig = libc::sigtimedwait(set, &mut info, &zero);
            if sig <= 0 {
                break;
            }
            write_answer(answers, [sig, info.si_code, info.si_pid()]);
        }
        write_answer(answers, [0, 0, 0]);
    }
}

/// # Safety
/// A write of a stack buffer to a descriptor of the caller's.
unsafe fn write_answer(fd: libc::c_int, fields: [i32; 3]) {
    let mut rec = [0u8; ANSWER];
    for (i, f) in fields.iter().enumerate() {
        rec[i * 4..i * 4 + 4].copy_from_slice(&f.to_ne_bytes());
    }
    libc::write(fd, rec.as_ptr().cast(), ANSWER);
}

fn pipe() -> Option<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 into our array; the descriptors are owned below.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return None;
        }
        Some((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// Passes on to the command the signals `run` received, each once, so that the command
/// sees each signal as it would without `run`:
///
/// - from the terminal (^C, ^\, hangup: the kernel sends them to the whole foreground
///   group): passed on only if the command left `run`'s process group (it got none);
/// - from a process (`kill`): passed on unless it was sent to `run`'s process group while
///   the command is in it (then the command got it too). The sentinel, a member of the
///   group, tells which: a signal it also received, from the same sender, went to the
///   group. Without an answer
///   from it, the signal is passed on (a signal is never lost; at worst seen twice).
struct Forwarder {
    sentinel: Option<Sentinel>,
    /// Signals the sentinel received that `run` has not yet matched (a group's signal is
    /// queued to each member in one `kill()`; `run`'s handler may run just after the
    /// question), each with its sender and when it was seen; forgotten after a second.
    credit: Vec<(usize, i32, Instant)>,
}

impl Forwarder {
    fn forward(&mut self, child_pid: i32) {
        let take = |p: &[AtomicU32; N_FORWARDED]| -> [u32; N_FORWARDED] {
            std::array::from_fn(|i| p[i].swap(0, Ordering::Relaxed))
        };
        let (sent, tty) = (take(&PENDING_SENT), take(&PENDING_TTY));
        if sent.iter().chain(tty.iter()).all(|n| *n == 0) {
            return;
        }
        if let Some(s) = &self.sentinel {
            // A group's signal is queued to every member within the sender's one `kill()`
            // (under the task list lock); by the time `run` handled its copy the others are
            // queued, give or take microseconds: 2 ms covers the sender's other CPU.
            if sent.iter().any(|n| *n > 0) {
                std::thread::sleep(Duration::from_millis(2));
            }
            let now = Instant::now();
            if let Some(got) = s.received() {
                self.credit.extend(
                    got.into_iter().filter(|(_, code, _)| *code != SI_KERNEL).map(|(i, _, from)| (i, from, now)),
                );
            }
            self.credit.retain(|(_, _, at)| now.duration_since(*at) < Duration::from_secs(1));
        }
        // SAFETY: getpgid/getpgrp have no memory preconditions.
        let shares_group = unsafe { libc::getpgid(child_pid) == libc::getpgrp() };
        for (i, sig) in FORWARDED.iter().enumerate() {
            let mut n = sent[i];
            if shares_group {
                // Each of these the command received too, through the group: the sentinel
                // got the same signal from the same sender.
                let from = SENDER[i].load(Ordering::Relaxed);
                while n > 0 {
                    let Some(k) = self.credit.iter().position(|(j, pid, _)| *j == i && *pid == from) else { break };
                    self.credit.remove(k);
                    n -= 1;
                }
            } else {
                n += tty[i];
            }
            for _ in 0..n {
                // SAFETY: signalling our own child, not yet reaped.
                unsafe { libc::kill(child_pid, *sig) };
            }
        }
    }
}

/// Ends `run` as its command ended, by the same signal (its default action, with no core
/// file of `run`'s own), so that the shell sees what it would have seen without `run`:
/// `$?` of 128 + the signal, and a shell that stops at a job killed by SIGINT stops.
pub fn die_like_the_command(sig: libc::c_int) -> ExitCode {
    // SAFETY: setrlimit with a filled struct; resetting a disposition, unblocking and
    // raising a signal on ourselves.
    unsafe {
        let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    // A signal whose default is not to end a process (none the command died of).
    ExitCode::from((128 + sig).clamp(0, 255) as u8)
}

/// How a process whose stream ended without an exit status stands with us.
enum Reaped {
    /// Our child, reaped now: its wait status.
    Now(libc::c_int),
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
        p if p > 0 => Reaped::Now(status),
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

/// The signal that ended a process, from its wait status.
fn term_signal(status: libc::c_int) -> Option<libc::c_int> {
    libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status))
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
    /// The signal that ended the command, if one did (`exit_code` is then 128 + it).
    pub signal: Option<libc::c_int>,
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
    let ring_dir_fd = prepare_ring_dir(&ring_dir)?;
    let tsc = TscClock::calibrate(Duration::from_millis(10));
    let recorder = Recorder::new(run.record)?;
    let source = run_source(&ring_dir, run_id, run.ring_slots, tsc);

    // Become the reaper of orphaned descendants, so that we see every one of them exit.
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let (program, mut cmd) = command(&run, &lib, run_id)?;
    // Before the spawn, so that no signal finds us without a handler (the command starts
    // with the default dispositions: exec resets caught signals).
    install_signal_handlers();
    let mut forwarder = Forwarder { sentinel: Sentinel::spawn(), credit: Vec::new() };
    let sentinel_pid = forwarder.sentinel.as_ref().map_or(0, |s| s.pid);
    let child = cmd.spawn().with_context(|| format!("cannot start {}", program.to_string_lossy()))?;
    // NVML's per-process usage into the capture: periodic, and after each failure.
    let nvml = Feed::spawn(nvml, "vramhook", false);
    let child_pid = child.id() as i32;
    drop(child); // reaped below with waitpid(-1), together with every descendant

    let mut d = RunDrain {
        ring_dir: &ring_dir,
        source,
        recorder,
        nvml,
        child_pid,
        sentinel_pid,
        exit_code: None,
        child_signal: None,
        statuses: BTreeMap::new(),
        held: Vec::new(),
        descendants_left: true,
    };
    // Drained like the agent drains (ingest.rs): no sleep while events flow; liveness
    // looked up in /proc at most every 100 ms per ring (a ring marked exited is looked up
    // every poll); the directory scanned at most every 10 ms while busy. The batch per ring
    // stays the source's default (65,536): a lane cut short by a small batch while another
    // lane is read up to the time watermark lets a later poll deliver events older than
    // ones already delivered, and a free on one thread can then come before the alloc on
    // another that it follows (seen under load with 4,096: `trace::sixteen_threads_hammering`).
    d.source.liveness_interval = Duration::from_millis(100);
    d.source.auto_discover = false;
    let discover_every = Duration::from_millis(10);
    let mut last_discover = Instant::now() - discover_every;
    let mut idle = Duration::ZERO;
    let mut last_report = Instant::now();
    loop {
        if d.exit_code.is_none() {
            forwarder.forward(child_pid);
        } else {
            // The command is reaped: nothing to pass signals on to (its pid may be reused).
            forwarder.sentinel = None;
        }
        d.reap_exited();
        d.release_held();
        if last_discover.elapsed() >= discover_every || !idle.is_zero() {
            last_discover = Instant::now();
            d.source.discover_now();
        }
        let delivered = d.poll();
        if d.all_done() {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(1) {
            d.recorder.flush();
            last_report = Instant::now();
        }
        // Straight on while events flow, 1 ms after a trickle, backing off to 10 ms when
        // idle. "Flowing" is not "a poll came back full" (the agent's test): the batch is
        // split over a ring's lanes, so a process writing on one lane of two never fills
        // it, and a 1 ms sleep after each poll capped a one-thread process at ~2,000
        // events/ms: it dropped a third of its events with the reader on a core of its own.
        idle = if delivered >= BUSY_POLL {
            Duration::ZERO
        } else if delivered > 0 {
            Duration::from_millis(1)
        } else {
            (idle * 2).clamp(Duration::from_millis(1), Duration::from_millis(10))
        };
        if !idle.is_zero() {
            std::thread::sleep(idle);
        }
    }
    d.finish();
    let RunDrain { source, recorder, nvml: _nvml, exit_code, child_signal, .. } = d;
    // Our descendants' rings are drained and their processes gone: removed now (the
    // source's locks released first), so nothing accumulates across runs.
    drop(source);
    collect_garbage(&ring_dir_fd);
    Ok(RunOutcome { exit_code: exit_code.unwrap_or(1), signal: child_signal, recorder })
}

/// The ring directory as the rules say (parent 1777 sticky, ours 0700), or a clear
/// refusal; then what the gc rules remove (rings of gone processes), before we add ours.
fn prepare_ring_dir(ring_dir: &Path) -> Result<OwnedFd> {
    use vramhook_ring::dir as ringdir;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = ringdir::make_ring_dir(ring_dir, uid)
        .map_err(|e| anyhow::anyhow!("refusing ring directory {}: {e}", ring_dir.display()))?;
    collect_garbage(&dir);
    Ok(dir)
}

/// The source of this run's rings (those stamped with `run_id`), taking rings as big as
/// the run asked for.
fn run_source(ring_dir: &Path, run_id: u64, ring_slots: Option<u64>, tsc: Option<TscClock>) -> RingSource {
    let mut source = RingSource::new(ring_dir, RingFilter { run_id: Some(run_id) }, tsc);
    // Asked for here, or inherited from the environment (the interposer reads it too).
    let inherited = std::env::var("VRAMHOOK_RING_SLOTS").ok().and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(slots) = ring_slots.or(inherited) {
        // Rings as big as asked for are taken (two lanes' rounding to spare).
        let asked = (slots.max(1) as u128 * 64 * 2 + 4096 * 2).min(u64::MAX as u128) as u64;
        source.max_ring_bytes = source.max_ring_bytes.max(asked);
    }
    source
}

/// The command to run, with the interposer preloaded and the run's environment.
fn command<'r>(run: &'r TracedRun<'_>, lib: &Path, run_id: u64) -> Result<(&'r OsString, std::process::Command)> {
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(existing) if !existing.is_empty() => {
            let mut v = lib.to_path_buf().into_os_string();
            v.push(":");
            v.push(existing);
            v
        }
        _ => lib.to_path_buf().into_os_string(),
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
    Ok((program, cmd))
}

/// A traced run's drain: its rings into the recorder, with the exit status of every
/// descendant reaped.
struct RunDrain<'a> {
    ring_dir: &'a Path,
    source: RingSource,
    recorder: Recorder,
    nvml: Option<Feed>,
    child_pid: i32,
    sentinel_pid: i32,
    exit_code: Option<i32>,
    child_signal: Option<libc::c_int>,
    statuses: BTreeMap<u32, i32>,
    /// Streams of our children that ended before we reaped them: their end waits for the
    /// exit status (so a capture's process end never lacks a status `run` knew).
    held: Vec<ProcessEnd>,
    descendants_left: bool,
}

impl RunDrain<'_> {
    /// Reaps every descendant that has exited.
    fn reap_exited(&mut self) {
        while self.descendants_left {
            let mut status = 0;
            // SAFETY: waitpid with a valid out pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid > 0 && pid == self.sentinel_pid {
                continue;
            } else if pid > 0 {
                let code = wait_status_code(status);
                self.source.set_exit_status(pid as u32, code);
                self.recorder.note_exit_status(pid as u32, code);
                self.statuses.insert(pid as u32, code);
                if pid == self.child_pid {
                    self.exit_code = Some(code);
                    self.child_signal = term_signal(status);
                }
            } else if pid == 0 {
                break;
            } else {
                self.descendants_left = false; // ECHILD: no descendant is left
            }
        }
    }

    /// Held ends whose status is now known go on (all of them once no child is left).
    fn release_held(&mut self) {
        for end in std::mem::take(&mut self.held) {
            match self.statuses.get(&end.pid) {
                Some(code) => self.recorder.handle(SourceItem::End(ProcessEnd { exit_status: Some(*code), ..end })),
                None if self.descendants_left => self.held.push(end),
                None => self.recorder.handle(SourceItem::End(end)),
            }
        }
    }

    /// One poll of the rings into the recorder, NVML's samples after it; returns the events
    /// delivered.
    fn poll(&mut self) -> u64 {
        let (statuses, exit_code, child_signal) = (&mut self.statuses, &mut self.exit_code, &mut self.child_signal);
        let (recorder, held, ring_dir, child_pid) = (&mut self.recorder, &mut self.held, self.ring_dir, self.child_pid);
        // Reaped first, so that a closed ring's end carries the exit status.
        let mut oom = false;
        let summary = self.source.poll(&mut |item| match item {
            SourceItem::End(mut end) if end.exit_status.is_none() => match reap(end.pid) {
                Reaped::Now(status) => {
                    let code = wait_status_code(status);
                    source_statuses_note(statuses, exit_code, child_pid, end.pid, code);
                    if end.pid as i32 == child_pid {
                        *child_signal = term_signal(status);
                    }
                    recorder.note_exit_status(end.pid, code);
                    end.exit_status = Some(code);
                    recorder.handle(SourceItem::End(end));
                }
                // An older image of a process that exec'd ends while the process runs on
                // in its new image (whose ring is still there): no status to wait for.
                Reaped::Later if newer_image(ring_dir, &end) => recorder.handle(SourceItem::End(end)),
                Reaped::Later => held.push(end),
                Reaped::NotOurs => recorder.handle(SourceItem::End(end)),
            },
            other => {
                oom |= has_oom(&other);
                recorder.handle(other)
            }
        });
        if let Some(n) = &mut self.nvml {
            record_samples(&mut self.recorder, n.poll(oom));
        }
        for refusal in self.source.take_refusals() {
            eprintln!("vramhook: ignoring ring {}: {}", refusal.path.display(), refusal.reason);
        }
        summary.delivered
    }

    /// Whether every descendant is gone and every ring drained, after a last look for
    /// rings made just before the last process exited.
    fn all_done(&mut self) -> bool {
        if self.descendants_left || self.source.open_rings() != 0 {
            return false;
        }
        self.source.discover_now();
        let mut oom = false;
        let recorder = &mut self.recorder;
        self.source.poll(&mut |item| {
            oom |= has_oom(&item);
            recorder.handle(item)
        });
        if let Some(n) = &mut self.nvml {
            record_samples(&mut self.recorder, n.poll(oom));
        }
        self.source.open_rings() == 0
    }

    /// The ends still held go out, and the capture is finished.
    fn finish(&mut self) {
        if let Some(n) = &mut self.nvml {
            // The read a failure asked for, when the run ended before it came.
            record_samples(&mut self.recorder, n.finish());
        }
        for end in self.held.drain(..) {
            let exit_status = self.statuses.get(&end.pid).copied();
            self.recorder.handle(SourceItem::End(ProcessEnd { exit_status, ..end }));
        }
        self.recorder.finish();
    }
}

/// Applies the gc rules to the ring directory (rings of processes that are gone).
fn collect_garbage(dir: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    use vramhook_ring::dir as ringdir;
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
    match outcome.signal {
        Some(sig) => Ok(die_like_the_command(sig)),
        None => Ok(ExitCode::from(outcome.exit_code.clamp(0, 255) as u8)),
    }
}
