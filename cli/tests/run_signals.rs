//! Signals through `vramhook run` as if it were not there: each case is run untraced and
//! under `run`, and the program must see the same signals and end with the same status.
//!
//! The program counts SIGINTs and, at SIGTERM, exits with 10 + the count ("count" mode), or
//! keeps the dispositions it was given ("plain" mode: it dies of what kills it). A SIGTERM
//! sent after a SIGINT reached the program is the barrier: a SIGINT passed on wrongly is
//! pending with it at the latest, and a program takes pending signals lowest first, so it
//! shows in the exit status. No timing is involved.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vramhook_testkit::{collect_output, interposer, sigcount, vramhook_bin};

/// How the program is started: as itself, or under `vramhook run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Untraced,
    Traced,
}

/// The words that start the program in `mode` (for a shell line or a Command).
fn argv(mode: Mode, rings: &Path, how: &str) -> Vec<String> {
    let prog = sigcount().display().to_string();
    match mode {
        Mode::Untraced => vec![prog, how.into()],
        Mode::Traced => vec![
            "env".into(),
            format!("VRAMHOOK_LIB={}", interposer().display()),
            vramhook_bin().display().to_string(),
            "run".into(),
            "--quiet".into(),
            "--ring-dir".into(),
            rings.display().to_string(),
            "--".into(),
            prog,
            how.into(),
        ],
    }
}

fn text(out: &Mutex<String>) -> String {
    out.lock().map(|o| o.clone()).unwrap_or_default()
}

fn wait_for(what: &str, get: impl Fn() -> String) -> String {
    let start = Instant::now();
    loop {
        let t = get();
        if t.contains(what) {
            return t;
        }
        // A bound for a hang, not a measure.
        assert!(start.elapsed() < Duration::from_secs(60), "no {what:?} in {t:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The program's "ready" line: (its pid, its parent's pid, its SIGINT disposition).
fn ready(t: &str) -> (i32, i32, String) {
    let line = t.lines().find(|l| l.starts_with("ready ")).unwrap_or_else(|| panic!("no ready line in {t:?}"));
    let field = |k: &str| {
        line.split_whitespace().find_map(|w| w.strip_prefix(k)).unwrap_or_else(|| panic!("{k} in {line:?}")).to_string()
    };
    (field("pid=").parse().expect("pid"), field("ppid=").parse().expect("ppid"), field("int="))
}

fn kill(pid: i32, sig: libc::c_int) {
    // SAFETY: signalling a process (or process group) this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
}

/// A job: a process group leader (as a shell starts a job), killed with its whole group
/// when dropped, so that a failed test leaves nothing running.
struct Job(Child);

impl Job {
    fn id(&self) -> u32 {
        self.0.id()
    }

    /// Its exit status (panics after a minute: a bound for a hang, not a measure).
    fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(status);
            }
            assert!(start.elapsed() < Duration::from_secs(60), "job {} still running after a minute", self.id());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // SAFETY: killing the process group this test started (gone already after a pass).
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The signals under test back to their defaults in a child: a test run in the background
/// of a non-interactive shell inherits SIGINT and SIGQUIT ignored (and a job of its would
/// then never die of them); a shell with job control starts a job with the defaults.
fn default_signals(cmd: &mut Command) -> &mut Command {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        })
    }
}

/// Starts `words` as a job, stdout collected.
fn start_job(words: &[String]) -> (Job, Arc<Mutex<String>>) {
    let mut child = default_signals(&mut Command::new(&words[0]))
        .args(&words[1..])
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the job");
    let out = collect_output(child.stdout.take().expect("stdout"));
    (Job(child), out)
}

fn rings() -> tempfile::TempDir {
    vramhook_testkit::shm_dir("signals")
}

/// `kill -INT -PGID` by a user (supervisors stop jobs so): the whole group gets it, the
/// program directly. The rule: `run` does not pass it on, because the command, in its
/// process group, already got it (its sentinel got it too, so it was sent to the group).
#[test]
fn a_users_sigint_to_the_process_group_reaches_the_program_once() {
    let rings = rings();
    let mut statuses = Vec::new();
    for mode in [Mode::Untraced, Mode::Traced] {
        let (mut job, out) = start_job(&argv(mode, rings.path(), "count"));
        let (pid, ppid, _) = ready(&wait_for("ready", || text(&out)));
        let leader = job.id() as i32;
        assert_eq!(if mode == Mode::Traced { ppid } else { pid }, leader, "the job's leader");
        kill(-leader, libc::SIGINT);
        wait_for("int 1", || text(&out));
        kill(leader, libc::SIGTERM); // to the leader alone: `run` passes it on
        let status = job.wait().expect("wait");
        assert_eq!(status.code(), Some(11), "{mode:?}: one SIGINT (exit 10 + count); output {:?}", text(&out));
        statuses.push(status);
    }
    assert_eq!(statuses[0], statuses[1], "the same status traced as untraced");
}

/// A SIGINT to `run` alone (`run_pid`) reaches the program once: it counts it, and the
/// SIGTERM after it ends the program with 10 + that count.
fn sigint_run_alone_reaches_the_program_once(mut job: Job, out: &Mutex<String>, run_pid: i32) {
    kill(run_pid, libc::SIGINT);
    wait_for("int 1", || text(out));
    kill(run_pid, libc::SIGTERM);
    let status = job.wait().expect("wait");
    assert_eq!(status.code(), Some(11), "one SIGINT passed on; output {:?}", text(out));
}

/// `kill -INT PID` of `run` alone: the program did not get it; `run` passes it on, once.
#[test]
fn a_sigint_to_run_alone_is_passed_on_once() {
    let rings = rings();
    let (job, out) = start_job(&argv(Mode::Traced, rings.path(), "count"));
    let (_, run_pid, _) = ready(&wait_for("ready", || text(&out)));
    sigint_run_alone_reaches_the_program_once(job, &out, run_pid);
}

/// The sentinel's signals are matched with `run`'s by sender: one that another process sent
/// the sentinel alone does not make a signal sent to `run` alone look like the group's (it
/// would not be passed on, and the program would never see it).
#[test]
fn a_signal_to_the_sentinel_alone_swallows_nothing() {
    let rings = rings();
    let (job, out) = start_job(&argv(Mode::Traced, rings.path(), "count"));
    let (_, run_pid, _) = ready(&wait_for("ready", || text(&out)));
    let children = std::fs::read_to_string(format!("/proc/{run_pid}/task/{run_pid}/children")).expect("run's children");
    let sentinel: i32 = children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|p: &i32| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "vramhook-signal"))
        .unwrap_or_else(|| panic!("no sentinel among run's children {children:?}"));
    let by_another = Command::new("kill").args(["-INT", &sentinel.to_string()]).status().expect("kill(1)");
    assert!(by_another.success());
    // Then one to `run` alone, by this test: passed on.
    sigint_run_alone_reaches_the_program_once(job, &out, run_pid);
}

/// A job started with `&` by a non-interactive shell has SIGINT ignored. Untraced, a
/// `kill -INT` of the job leaves it running; under `run` (before: killed, exit 130) too:
/// `run` leaves the signal ignored, for itself and for the program. The SIGTERM after it
/// is the barrier (a SIGINT that got through would have ended it first, 130 not 143).
#[test]
fn a_sigint_ignored_on_entry_stays_ignored() {
    let rings = rings();
    let mut statuses = Vec::new();
    for mode in [Mode::Untraced, Mode::Traced] {
        let line = argv(mode, rings.path(), "plain").join(" ");
        let words: Vec<String> =
            ["sh", "-c", &format!("{line} & echo job=$!; wait $!")].iter().map(|s| s.to_string()).collect();
        let (mut sh, out) = start_job(&words);
        let t = wait_for("ready", || text(&out));
        let (pid, ppid, disposition) = ready(&t);
        assert_eq!(disposition, "ign", "{mode:?}: the program finds SIGINT ignored, as its shell left it: {t:?}");
        let job: i32 = t
            .lines()
            .find_map(|l| l.strip_prefix("job="))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("job pid in {t:?}"));
        assert_eq!(job, if mode == Mode::Traced { ppid } else { pid });
        kill(job, libc::SIGINT);
        kill(pid, libc::SIGINT);
        kill(job, libc::SIGTERM);
        let status = sh.wait().expect("wait");
        assert_eq!(status.code(), Some(143), "{mode:?}: SIGINT ignored, SIGTERM ends it (128 + 15): {t:?}");
        statuses.push(status);
    }
    assert_eq!(statuses[0], statuses[1], "the shell's $? traced as untraced");
}

/// The program's death by a signal is `run`'s: a shell sees the same status (`$?` of
/// 128 + n, and WIFSIGNALED, which makes a shell stop at a job killed by SIGINT).
#[test]
fn the_programs_death_by_a_signal_is_what_the_shell_sees() {
    let rings = rings();
    // (signal, sent to: the group, or the program itself)
    for (sig, to_group) in [(libc::SIGINT, true), (libc::SIGKILL, false), (libc::SIGTERM, false)] {
        let mut statuses: Vec<ExitStatus> = Vec::new();
        for mode in [Mode::Untraced, Mode::Traced] {
            let (mut job, out) = start_job(&argv(mode, rings.path(), "plain"));
            let (pid, _, _) = ready(&wait_for("ready", || text(&out)));
            let leader = job.id() as i32;
            kill(if to_group { -leader } else { pid }, sig);
            let status = job.wait().expect("wait");
            assert_eq!(status.signal(), Some(sig), "{mode:?}: the job died of signal {sig}: {status:?}");
            statuses.push(status);
        }
        assert_eq!(statuses[0], statuses[1], "signal {sig}: the same status traced as untraced");
    }
}

/// tmux on a server of the session's own (`-L NAME`): another test's server, exiting when
/// its last session ends, never takes a new session down with it.
fn tmux(server: &str, args: &[&str]) -> String {
    // The server (started by the first command) and its panes with the default dispositions.
    let out =
        default_signals(&mut Command::new("tmux")).arg("-L").arg(server).args(args).output().unwrap_or_else(|e| {
            panic!(
                "MISSING tmux ({e}): this test types ^C on a real terminal; install it with `apt-get install -y tmux`"
            )
        });
    String::from_utf8_lossy(&out.stdout).to_string()
}

struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        tmux(&self.0, &["kill-server"]);
        // The server's socket stays behind it.
        let base = std::env::var_os("TMUX_TMPDIR").map_or_else(|| std::path::PathBuf::from("/tmp"), Into::into);
        // SAFETY: geteuid has no preconditions.
        let _ = std::fs::remove_file(base.join(format!("tmux-{}", unsafe { libc::geteuid() })).join(&self.0));
    }
}

/// ^C typed on a real terminal (tmux): the line discipline sends SIGINT to the whole
/// foreground process group (bash, `run`, the program). The program sees exactly one, as
/// without `run`, and the shell's `$?` is the same.
#[test]
fn ctrl_c_on_a_real_terminal_reaches_the_program_once() {
    let rings = rings();
    let mut results = Vec::new();
    for mode in [Mode::Untraced, Mode::Traced] {
        let name = format!("vhsig-{}-{mode:?}", std::process::id());
        let line = argv(mode, rings.path(), "count").join(" ");
        let script = format!("{line}; echo rc=$?; sleep 600");
        let session = Session(name.clone());
        tmux(&name, &["new-session", "-d", "-s", &name, "-x", "160", "-y", "20", "bash", "-c", &script]);
        let screen = || tmux(&session.0, &["capture-pane", "-p", "-t", &session.0]);
        let (pid, ppid, _) = ready(&wait_for("ready", screen));
        tmux(&session.0, &["send-keys", "-t", &session.0, "C-c"]);
        wait_for("int 1", screen);
        kill(if mode == Mode::Traced { ppid } else { pid }, libc::SIGTERM);
        let t = wait_for("rc=", screen);
        let rc = t.lines().find_map(|l| l.strip_prefix("rc=")).unwrap_or_default().trim().to_string();
        assert!(!t.contains("int 2"), "{mode:?}: one SIGINT only:\n{t}");
        assert_eq!(rc, "11", "{mode:?}: one SIGINT (exit 10 + count):\n{t}");
        results.push(rc);
    }
    assert_eq!(results[0], results[1], "$? traced as untraced");
}
