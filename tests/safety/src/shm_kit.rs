//! Helpers for the ring-directory tests (`shm`, `rlimits`, `ring_dir`): private ring
//! directories, a private `/dev/shm` in a mount namespace, rlimits, ring files and their
//! cursors.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh directory `name` (mode `mode`) inside `parent`.
pub fn private_dir(parent: &Path, name: &str, mode: u32) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
    dir
}

/// Runs `cmd` in its own mount namespace with `dir` bind-mounted on `/dev/shm`, so that
/// the default ring directory `/dev/shm/vramhook/<uid>` is private to the test (needs
/// root). Call before [`crate::as_uid`]: hooks run in the order they were added.
pub fn private_dev_shm<'a>(cmd: &'a mut Command, dir: &Path) -> &'a mut Command {
    let dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(dir.as_ptr(), c"/dev/shm".as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Whether this host lets us make a mount namespace (a quick probe).
pub fn can_unshare_mounts() -> bool {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new("true");
    private_dev_shm(&mut cmd, dir.path());
    cmd.status().map(|s| s.success()).unwrap_or(false)
}

/// Sets `RLIMIT_FSIZE` (soft and hard) of the child to `bytes`.
pub fn limit_file_size(cmd: &mut Command, bytes: u64) -> &mut Command {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let rl = libc::rlimit { rlim_cur: bytes as libc::rlim_t, rlim_max: bytes as libc::rlim_t };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// The workload run without the interposer: what a traced run must equal.
pub fn untraced(name: &str) -> Output {
    Command::new(crate::workload(name))
        .env("LD_LIBRARY_PATH", crate::sim_dir())
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run untraced workload")
}

/// Asserts that a traced run ended as the untraced one did: no signal, same exit code,
/// same stdout.
pub fn assert_same_as_untraced(traced: &Output, untraced: &Output, what: &str) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        traced.status.signal(),
        None,
        "{what}: the traced program died of signal {:?}; stderr: {}",
        traced.status.signal(),
        String::from_utf8_lossy(&traced.stderr)
    );
    assert_eq!(traced.status.code(), untraced.status.code(), "{what}: exit code differs");
    assert_eq!(
        String::from_utf8_lossy(&traced.stdout),
        String::from_utf8_lossy(&untraced.stdout),
        "{what}: output differs"
    );
}

/// The lines vramhook printed on stderr.
pub fn vramhook_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("vramhook")).map(str::to_string).collect()
}

/// Names in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Ring files (`*.ring`) in `dir`, sorted.
pub fn rings(dir: &Path) -> Vec<PathBuf> {
    names(dir).into_iter().filter(|n| n.ends_with(".ring")).map(|n| dir.join(n)).collect()
}

/// Every ring file anywhere below `dir`.
pub fn rings_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.filter_map(|e| e.ok()) {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                _ if p.to_string_lossy().contains(".ring") => out.push(p),
                _ => {}
            }
        }
    }
    out
}

const LANE_CURSORS_OFFSET: usize = 1024;
const LANE_READ_OFFSET: usize = LANE_CURSORS_OFFSET + 15 * 64;

/// Marks every event of a ring read and recorded (what a reader does as it drains and
/// stops cleanly): each lane's read cursor set to its write cursor, and the header's
/// `recorded` (offset 424) to their sum.
pub fn mark_drained(ring: &Path) {
    let mut b = std::fs::read(ring).expect("read ring");
    let lanes = u32::from_le_bytes(b[80..84].try_into().expect("lanes")).clamp(1, 16) as usize;
    let mut total = 0u64;
    for lane in 0..lanes {
        let (w, r) =
            if lane == 0 { (256, 320) } else { (LANE_CURSORS_OFFSET + (lane - 1) * 64, LANE_READ_OFFSET + lane * 8) };
        let wv: [u8; 8] = b[w..w + 8].try_into().expect("cursor");
        total += u64::from_le_bytes(wv);
        b[r..r + 8].copy_from_slice(&wv);
    }
    b[424..432].copy_from_slice(&total.to_le_bytes());
    std::fs::write(ring, &b).expect("write ring");
}

/// Events written and not yet read, over all lanes.
pub fn pending(ring: &Path) -> u64 {
    let b = std::fs::read(ring).expect("read ring");
    let lanes = u32::from_le_bytes(b[80..84].try_into().expect("lanes")).clamp(1, 16) as usize;
    let at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("u64"));
    (0..lanes)
        .map(|lane| {
            let (w, r) = if lane == 0 {
                (256, 320)
            } else {
                (LANE_CURSORS_OFFSET + (lane - 1) * 64, LANE_READ_OFFSET + lane * 8)
            };
            at(w).saturating_sub(at(r))
        })
        .sum()
}

/// Stamps a ring as found gone by a gc `secs_ago` seconds ago (its header's
/// `gone_since_s`, at offset 408): the keep-hours budget counts from there.
pub fn set_gone_since(ring: &Path, secs_ago: u64) {
    use std::os::unix::fs::FileExt;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let f = std::fs::OpenOptions::new().write(true).open(ring).expect("open ring");
    f.write_all_at(&now.saturating_sub(secs_ago).to_le_bytes(), 408).expect("stamp");
}

/// Sets a file's modification time to `secs_ago` seconds before now.
pub fn set_age(path: &Path, secs_ago: u64) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let t = now.saturating_sub(secs_ago) as libc::time_t;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let times = [libc::timespec { tv_sec: t, tv_nsec: 0 }, libc::timespec { tv_sec: t, tv_nsec: 0 }];
    // SAFETY: valid path and times.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) }, 0, "utimensat");
}

/// Free bytes of the file system holding `path`.
pub fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs into a zeroed struct.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c.as_ptr(), &mut st), 0, "statvfs");
        st.f_bavail * st.f_frsize
    }
}

/// `vramhook gc` on `dir` with extra arguments and environment.
pub fn gc(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(crate::vramhook_bin());
    cmd.arg("gc").arg("--ring-dir").arg(dir).args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run vramhook gc")
}

/// A pid that no process has (above the kernel's pid_max).
pub const DEAD_PID: u32 = 4_194_304 + 17;
