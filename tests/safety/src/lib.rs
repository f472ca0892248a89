//! Test kit for the safety suite in `tests/`: where the built binaries are, how to run a
//! program as another user or on a small tmpfs, and how a test that cannot run says so.
//!
//! A test that needs root, a mount or a second uid and cannot have it prints
//! `not run: <reason>` and appends that line to `$VRAMHOOK_NOT_RUN_LOG` (scripts/test.sh
//! counts them). Under CI (`CI=true`, which runs as root) a test that cannot run fails.

pub mod files_kit;
pub mod load_kit;
pub mod ring_kit;

use std::path::Path;
use std::process::Command;

// Where the built binaries and the simulated driver are: shared with every crate's tests.
pub use vramhook_testkit::{interposer, profile_dir, repo_root, sim_dir, traced_workload, vramhook_bin, workload};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Reports a test that cannot run here. Under CI this fails the test: CI runs as root with
/// mounts, so a test that cannot run there is a broken set-up, never a pass.
pub fn not_run(test: &str, reason: &str) {
    let line = format!("not run: {test}: {reason}");
    if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
        panic!("{line} (CI runs as root, so this must run there)");
    }
    eprintln!("{line}");
    if let Ok(log) = std::env::var("VRAMHOOK_NOT_RUN_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Returns true when the test may go on as root; otherwise reports it not run.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        true
    } else {
        not_run(test, "needs root (a second uid, a tmpfs mount or rlimits beyond ours)");
        false
    }
}

/// A tmpfs of a fixed size mounted on a fresh directory; unmounted when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` bytes; `Err` says why it could not.
    pub fn mount(size: u64) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=1777"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the file system until `left` bytes remain free (or less).
    pub fn fill_leaving(&self, left: u64) {
        // SAFETY: statvfs into a zeroed struct.
        let free = unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            let path = std::ffi::CString::new(self.path().as_os_str().as_encoded_bytes()).expect("path");
            assert_eq!(libc::statvfs(path.as_ptr(), &mut st), 0, "statvfs");
            st.f_bavail * st.f_frsize
        };
        if free > left {
            let filler = vec![0xA5u8; (free - left) as usize];
            // A short write is fine: the file system is then fuller still.
            let _ = std::fs::write(self.path().join("filler"), &filler);
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// A uid no account uses, for a hostile local user (root can switch to any uid).
pub const HOSTILE_UID: u32 = 54_321;

/// Makes `cmd` run as `uid` (and the same gid), dropping root in the child.
pub fn as_uid(cmd: &mut Command, uid: u32) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}
pub mod shm_kit;
