//! `peak_rss OUT CMD ARGS...`: runs CMD (stdin, stdout and stderr passed through), writes
//! its peak resident memory in KiB (`wait4`'s `ru_maxrss`) to OUT, and exits as it did.
//!
//! A child's `ru_maxrss` starts from the memory of the process that forked it (a fork copies
//! its pages, a vfork shares them until exec): measured straight from a test process that
//! holds a large report, a small analysis would read as large. This helper is small, so
//! what it measures is the command's own peak.

use std::os::unix::process::ExitStatusExt;

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: peak_rss OUT CMD ARGS...");
        std::process::exit(64);
    }
    let child = std::process::Command::new(&args[1]).args(&args[2..]).spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("peak_rss: cannot run {:?}: {e}", args[1]);
            std::process::exit(127);
        }
    };
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage filled by wait4 for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    if rc != pid {
        eprintln!("peak_rss: wait4 failed");
        std::process::exit(70);
    }
    std::mem::forget(child);
    let _ = std::fs::write(&args[0], ru.ru_maxrss.to_string());
    let st = std::process::ExitStatus::from_raw(status);
    std::process::exit(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
}
