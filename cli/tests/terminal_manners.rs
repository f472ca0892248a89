//! Terminal manners: `vramhook top` draws when it starts in a background process group
//! (under `timeout`, which puts its command in a group of its own) and gives the terminal
//! back; `vramhook agent` that cannot start says why once and leaves nothing it made.

#[allow(unused_imports)]
mod agent_support;

use agent_support::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// tmux on a server of the session's own (`-L NAME`): another test's server, exiting when
/// its last session ends, never takes a new session down with it.
fn tmux(server: &str, args: &[&str]) -> String {
    let out = Command::new("tmux").arg("-L").arg(server).args(args).output().unwrap_or_else(|e| {
        panic!("MISSING tmux ({e}): these tests drive `vramhook top` in a terminal; install it with `apt-get install -y tmux`")
    });
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A detached tmux session running `script` under bash (its own terminal).
struct Session(String);

impl Session {
    fn start(tag: &str, script: &str) -> Session {
        let name = format!("vhterm-{tag}-{}-{}", std::process::id(), free_port());
        let session = Session(name.clone());
        tmux(&name, &["new-session", "-d", "-s", &name, "-x", "140", "-y", "34", "bash", "-c", script]);
        session
    }

    fn screen(&self) -> String {
        tmux(&self.0, &["capture-pane", "-p", "-t", &self.0])
    }

    fn wait_screen(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "never showed {what}; screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn alternate_screen(&self) -> bool {
        tmux(&self.0, &["display", "-p", "-t", &self.0, "#{alternate_on}"]).trim() == "1"
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        tmux(&self.0, &["kill-server"]);
        // The server's socket stays behind it.
        let base = std::env::var_os("TMUX_TMPDIR").map_or_else(|| std::path::PathBuf::from("/tmp"), Into::into);
        // SAFETY: geteuid has no preconditions.
        let _ = std::fs::remove_file(base.join(format!("tmux-{}", unsafe { libc::geteuid() })).join(&self.0));
    }
}

fn top_under_timeout(rings: &Path, pid_file: &Path) -> String {
    // A non-interactive shell's job: `timeout` runs `top` in a process group of its own,
    // not the terminal's foreground one (before, `top` stopped at once on SIGTTOU).
    format!(
        "timeout 120 {} top --direct --ring-dir {} --interval 200 & echo $! > {}; wait $!; echo rc=$?; sleep 600",
        vramhook_bin().display(),
        rings.display(),
        pid_file.display()
    )
}

fn drew(screen: &str) -> bool {
    screen.contains("vramhook top — rings") && screen.contains("(direct)") && screen.contains("processes (")
}

#[test]
fn top_under_timeout_draws_and_quits_on_q() {
    let rings = ring_dir("term-q");
    let dir = tempfile::tempdir().expect("dir");
    let session = Session::start("q", &top_under_timeout(rings.path(), &dir.path().join("pid")));
    session.wait_screen("top's first frame", drew);
    assert!(session.alternate_screen(), "top draws on the alternate screen");
    tmux(&session.0, &["send-keys", "-t", &session.0, "q"]);
    let screen = session.wait_screen("top's exit", |s| s.contains("rc="));
    assert!(screen.contains("rc=0"), "q quits with status 0:\n{screen}");
    assert!(!session.alternate_screen(), "the terminal is given back (main screen):\n{screen}");
}

#[test]
fn top_under_timeout_stopped_by_sigterm_restores_the_terminal() {
    let rings = ring_dir("term-sigterm");
    let dir = tempfile::tempdir().expect("dir");
    let pid_file = dir.path().join("pid");
    let session = Session::start("term", &top_under_timeout(rings.path(), &pid_file));
    session.wait_screen("top's first frame", drew);
    let pid: i32 = std::fs::read_to_string(&pid_file).expect("timeout's pid").trim().parse().expect("a pid");
    // `timeout` passes SIGTERM on to `top`, as when its time is up.
    // SAFETY: signalling a process this test started (through its tmux session).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let screen = session.wait_screen("top's exit", |s| s.contains("rc="));
    assert!(screen.contains("rc=143"), "top ends by the SIGTERM (128 + 15), as a shell expects:\n{screen}");
    assert!(!session.alternate_screen(), "the terminal is restored (main screen):\n{screen}");
}

/// A unique ring directory path under /dev/shm that does not exist yet, with its parent
/// missing too.
fn missing_ring_dir(tag: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let holder = ring_dir(tag);
    let dir = holder.path().join("missing-parent").join("rings");
    (holder, dir)
}

#[test]
fn agent_on_a_busy_port_says_why_once_and_makes_nothing() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = busy.local_addr().expect("addr");
    let (holder, rings) = missing_ring_dir("busy");
    let cap = tempfile::tempdir().expect("dir");
    let captures = cap.path().join("captures");
    let stderr = agent_failing(&["--listen", &addr.to_string()], &rings, &captures);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(&format!("cannot listen on {addr}")), "{stderr}");
    assert_eq!(stderr.matches("Address already in use").count(), 1, "the cause once: {stderr}");
    assert!(!rings.parent().expect("parent").exists(), "no ring directory left: {}", rings.display());
    assert!(!captures.exists(), "no capture directory left");
    drop(holder);
}

/// `vramhook agent ARGS --ring-dir RINGS --capture-dir CAPTURES`, which must fail to start
/// (exit 2): its stderr.
fn agent_failing(args: &[&str], rings: &Path, captures: &Path) -> String {
    let out = Command::new(vramhook_bin())
        .arg("agent")
        .args(args)
        .arg("--ring-dir")
        .arg(rings)
        .arg("--capture-dir")
        .arg(captures)
        .output()
        .expect("vramhook agent");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

#[test]
fn agent_failing_after_it_made_its_ring_directory_removes_it() {
    let (holder, rings) = missing_ring_dir("capfail");
    let file = tempfile::NamedTempFile::new().expect("file");
    // A capture directory under a regular file: the capture cannot start, after the ring
    // directory was made.
    let captures = file.path().join("captures");
    let stderr = agent_failing(&["--no-http"], &rings, &captures);
    assert!(stderr.contains("cannot start the capture in"), "{stderr}");
    assert_eq!(stderr.matches("Not a directory").count(), 1, "the cause once: {stderr}");
    assert!(!rings.exists(), "the ring directory it made is gone");
    assert!(!rings.parent().expect("parent").exists(), "and the parent it made");
    drop(holder);
}

#[test]
fn agent_failing_after_it_made_its_capture_directory_removes_both() {
    let (holder, rings) = missing_ring_dir("otlpfail");
    let cap = tempfile::tempdir().expect("dir");
    let captures = cap.path().join("captures");
    // An exporter that cannot be built: the start fails after the capture has begun.
    let out = Command::new(vramhook_bin())
        .arg("agent")
        .arg("--no-http")
        .arg("--ring-dir")
        .arg(&rings)
        .arg("--capture-dir")
        .arg(&captures)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "::not a url::")
        .output()
        .expect("vramhook agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let error: Vec<&str> = stderr.lines().filter(|l| l.starts_with("vramhook: error:")).collect();
    assert_eq!(error.len(), 1, "{stderr}");
    assert!(error[0].contains("OTLP"), "{stderr}");
    assert_eq!(stderr.matches("invalid uri character").count(), 1, "the cause once: {stderr}");
    assert!(!captures.exists(), "the capture directory it made is gone");
    assert!(!rings.exists() && !rings.parent().expect("parent").exists(), "and the ring directories");
    drop(holder);
}

/// Its terminal gone (the tmux server killed, as a closed ssh session would): `top` ends, it
/// does not spin on a terminal that reads end-of-file forever (it once did, at 40% of a CPU,
/// ignoring SIGTERM too).
#[test]
fn top_ends_when_its_terminal_hangs_up() {
    let dead = format!("127.0.0.1:{}", free_port()); // nothing listens: top shows its error
    let script = format!("exec {} top --agent {dead} --interval 200", vramhook_bin().display());
    let session = Session::start("hangup", &script);
    session.wait_screen("top's frame", |s| s.contains("vramhook top"));
    let pid: i32 =
        tmux(&session.0, &["display", "-p", "-t", &session.0, "#{pane_pid}"]).trim().parse().expect("pane pid");
    tmux(&session.0, &["kill-server"]);
    let start = Instant::now();
    // SAFETY: signal 0 only asks whether the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 {
        if start.elapsed() > Duration::from_secs(10) {
            // SAFETY: ending the process this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("top (pid {pid}) still ran 10 s after its terminal hung up");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
