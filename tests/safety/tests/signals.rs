//! Signals through `vramhook run`: a program gets each signal once. ^C on a terminal goes
//! to the whole foreground process group, `run` and its command alike: `run` must not
//! pass it on again (a handler counted 2 under `run`, 1 untraced). A signal sent to `run`
//! alone (`kill PID`) must be passed on, once.
//!
//! The program counts SIGINTs and exits with 10 + count at SIGTERM. SIGTERM sent to `run`
//! after the SIGINT reached the program is the barrier: `run` handles its pending signals
//! in signal order, and the program takes pending signals lowest first, so a SIGINT passed
//! on wrongly arrives before the SIGTERM and shows in the exit status. No timing involved.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vramhook_safety_tests::{interposer, vramhook_bin};
use vramhook_testkit::{collect_output, sigcount};

fn run_cmd(ring_dir: &Path) -> Command {
    let mut cmd = Command::new(vramhook_bin());
    cmd.args(["run", "--quiet", "--ring-dir"])
        .arg(ring_dir)
        .arg("--")
        .arg(sigcount())
        .arg("count")
        .env("VRAMHOOK_LIB", interposer());
    cmd
}

fn wait_for(out: &Mutex<String>, what: &str) {
    let start = Instant::now();
    while !out.lock().map(|o| o.contains(what)).unwrap_or(false) {
        // A bound for a hang, not a measure.
        assert!(start.elapsed() < Duration::from_secs(60), "no {what:?} in {:?}", out.lock().map(|o| o.clone()));
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill(pid: u32, sig: libc::c_int) {
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// ^C typed on the terminal of a new session whose foreground group is `run` and its command.
#[test]
fn ctrl_c_on_the_terminal_reaches_the_program_once() {
    let rings = tempfile::tempdir().expect("ring dir");
    // SAFETY: plain pty calls on descriptors we own.
    let (master, slave_path) = unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        (std::fs::File::from_raw_fd(m), std::ffi::CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned())
    };
    let slave = std::fs::OpenOptions::new().read(true).write(true).open(&slave_path).expect("open the pty");
    let mut cmd = run_cmd(rings.path());
    cmd.stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut run = cmd.spawn().expect("vramhook run on a pty");
    drop(cmd); // our copies of the slave
    let out = collect_output(master.try_clone().expect("dup master"));
    wait_for(&out, "ready");
    let mut m = master;
    m.write_all(&[0x03]).expect("type ^C"); // the line discipline signals the foreground group
    wait_for(&out, "int 1");
    // Not needed for a pass (the SIGTERM below is the barrier), but it lets a `run` that
    // forwards the ^C anyway do it before the SIGTERM arrives: an older `run` kept one
    // pending signal, and a SIGTERM overwriting it hid the duplicate.
    std::thread::sleep(Duration::from_millis(200));
    kill(run.id(), libc::SIGTERM); // to run alone: passed on
    let status = run.wait().expect("run");
    assert_eq!(
        status.code(),
        Some(11),
        "the program saw one SIGINT (exit 10 + count); output: {:?}",
        out.lock().map(|o| o.clone())
    );
    let _ = m.as_raw_fd();
}

/// `kill -INT <run's pid>`: the program did not get it, so `run` passes it on, once.
#[test]
fn a_signal_sent_to_run_alone_is_passed_on_once() {
    let rings = tempfile::tempdir().expect("ring dir");
    let mut run = run_cmd(rings.path()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("vramhook run");
    let out = collect_output(run.stdout.take().expect("stdout"));
    wait_for(&out, "ready");
    kill(run.id(), libc::SIGINT);
    wait_for(&out, "int 1");
    kill(run.id(), libc::SIGTERM);
    let status = run.wait().expect("run");
    assert_eq!(status.code(), Some(11), "one SIGINT passed on; output: {:?}", out.lock().map(|o| o.clone()));
}
