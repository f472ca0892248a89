//! Squatting the ring directory: a hostile local user who made `/dev/shm/vramhook` (or a
//! user's directory in it) first, as a symlink, with their ownership or loose modes. The
//! interposer must run untraced with one line naming the problem; the agent and `gc` must
//! refuse the directory and say why. Also: the agent makes the default directories with
//! the right modes, and a new ring appears under its final name only when complete.
//!
//! `/dev/shm` is a private directory bind-mounted in a mount namespace of each traced
//! program: the real `/dev/shm/vramhook` is never touched.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use vramhook_safety_tests::shm_kit::*;
use vramhook_safety_tests::{as_uid, not_run, require_root, traced_workload, HOSTILE_UID};

const WORKLOAD: &str = "torch_caching";
/// The user being traced (the hostile one is `HOSTILE_UID`).
const VICTIM: u32 = HOSTILE_UID + 1;

fn ready(test: &str) -> bool {
    if !require_root(test) {
        return false;
    }
    if !can_unshare_mounts() {
        not_run(test, "cannot make a mount namespace here");
        return false;
    }
    true
}

/// A private stand-in for /dev/shm (1777, like the real one).
fn fake_shm() -> tempfile::TempDir {
    let shm = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(shm.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    shm
}

fn chown(path: &Path, uid: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), uid, uid) }, 0, "lchown {}", path.display());
}

/// A directory at `path` with `mode`, owned by `uid`.
fn dir_as(path: &Path, mode: u32, uid: u32) {
    std::fs::create_dir(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    chown(path, uid);
}

/// Runs the workload as the victim with `shm` as its /dev/shm and the default ring dir.
fn traced_as_victim(shm: &Path) -> Output {
    let mut cmd = traced_workload(WORKLOAD, Path::new(""));
    cmd.env_remove("VRAMHOOK_DIR");
    private_dev_shm(&mut cmd, shm);
    as_uid(&mut cmd, VICTIM);
    cmd.output().expect("run as the victim")
}

/// The victim runs untraced (same output, one line naming `problem`) and no ring is made
/// anywhere under the fake /dev/shm.
fn assert_refused(shm: &Path, problem: &str) {
    let out = traced_as_victim(shm);
    assert_same_as_untraced(&out, &untraced(WORKLOAD), problem);
    let lines = vramhook_lines(&out);
    assert_eq!(lines.len(), 1, "one line: {lines:?}");
    assert!(lines[0].contains(problem), "the line names the problem ({problem}): {lines:?}");
    assert_eq!(rings_below(shm), Vec::<PathBuf>::new(), "no ring made");
}

/// What is under the fake /dev/shm before the victim runs, made in order: a directory
/// (path, mode, owner) or a symbolic link (path, target, owner). `<victim>` in a path is
/// the victim's uid.
enum Made {
    Dir(&'static str, u32, u32),
    Link(&'static str, &'static str, u32),
}
use Made::{Dir, Link};

const USER_DIR: &str = "vramhook/<victim>";

fn make(shm: &Path, made: &[Made]) {
    let at = |path: &str| shm.join(path.replace("<victim>", &VICTIM.to_string()));
    for m in made {
        match *m {
            Dir(path, mode, uid) => dir_as(&at(path), mode, uid),
            Link(path, target, uid) => {
                std::os::unix::fs::symlink(at(target), at(path)).expect("symlink");
                chown(&at(path), uid);
            }
        }
    }
}

/// One test per squatted layout: the victim runs untraced, with one line naming `problem`.
macro_rules! refused {
    ($($name:ident: $made:expr => $problem:literal;)*) => {$(
        #[test]
        fn $name() {
            if !ready(stringify!($name)) {
                return;
            }
            let shm = fake_shm();
            make(shm.path(), &$made);
            assert_refused(shm.path(), $problem);
        }
    )*};
}

refused! {
    interposer_refuses_a_symlinked_shared_parent: [Dir("theirs", 0o1777, HOSTILE_UID), Link("vramhook", "theirs", HOSTILE_UID)] => "symbolic link";
    interposer_refuses_a_shared_parent_owned_by_another_user: [Dir("vramhook", 0o1777, HOSTILE_UID)] => "owned by another user";
    interposer_refuses_a_shared_parent_without_the_sticky_bit: [Dir("vramhook", 0o777, 0)] => "1777";
    interposer_refuses_a_symlinked_user_dir: [Dir("vramhook", 0o1777, 0), Dir("theirs", 0o777, HOSTILE_UID), Link(USER_DIR, "theirs", HOSTILE_UID)] => "symbolic link";
    interposer_refuses_a_user_dir_owned_by_another_user: [Dir("vramhook", 0o1777, 0), Dir(USER_DIR, 0o777, HOSTILE_UID)] => "owned by another user";
    interposer_refuses_a_user_dir_that_is_not_private: [Dir("vramhook", 0o1777, 0), Dir(USER_DIR, 0o755, VICTIM)] => "0700";
}

/// With nothing there, the first traced user makes the parent 1777 (sticky) and their own
/// directory 0700, and records.
#[test]
fn interposer_makes_the_default_layout_right() {
    if !ready("interposer_makes_the_default_layout_right") {
        return;
    }
    let shm = fake_shm();
    let out = traced_as_victim(shm.path());
    assert_same_as_untraced(&out, &untraced(WORKLOAD), "fresh /dev/shm");
    assert_eq!(vramhook_lines(&out), Vec::<String>::new());
    let parent = std::fs::symlink_metadata(shm.path().join("vramhook")).expect("parent");
    assert!(parent.is_dir());
    assert_eq!(parent.mode() & 0o7777, 0o1777);
    let mine = std::fs::symlink_metadata(shm.path().join(format!("vramhook/{VICTIM}"))).expect("user dir");
    assert!(mine.is_dir());
    assert_eq!((mine.mode() & 0o7777, mine.uid()), (0o700, VICTIM));
    assert_eq!(rings(&shm.path().join(format!("vramhook/{VICTIM}"))).len(), 1);
}

/// Polls every 100 ms, for at most 60 s, until `done` holds or `child` has exited; says
/// whether it exited.
fn exited_or(child: &mut Child, done: impl Fn() -> bool) -> bool {
    for _ in 0..600 {
        if child.try_wait().expect("wait").is_some() {
            return true;
        }
        if done() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// `vramhook agent` on the default ring directory of a private /dev/shm (`shm`).
fn agent_on(shm: &Path, stderr: Stdio) -> Child {
    let mut cmd = Command::new(vramhook_safety_tests::vramhook_bin());
    cmd.args(["agent", "--no-http", "--no-recover"]).stdout(Stdio::null()).stderr(stderr);
    private_dev_shm(&mut cmd, shm);
    cmd.spawn().expect("spawn agent")
}

/// Runs `vramhook` with `args` and waits at most 60 s (an agent that does not refuse runs
/// forever: it is killed and the test fails).
fn vramhook_refusing(args: &[&str]) -> Output {
    let mut child = Command::new(vramhook_safety_tests::vramhook_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vramhook");
    if exited_or(&mut child, || false) {
        return child.wait_with_output().expect("output");
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    panic!(
        "`vramhook {}` did not refuse the directory; stderr: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The agent and `vramhook gc` refuse a ring directory that is a symlink, or owned by
/// another user, and say why.
#[test]
fn agent_and_gc_refuse_a_squatted_ring_dir() {
    if !require_root("agent_and_gc_refuse_a_squatted_ring_dir") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let theirs = tmp.path().join("theirs");
    dir_as(&theirs, 0o700, HOSTILE_UID);
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&theirs, &link).expect("symlink");
    for (dir, problem) in [(&link, "symbolic link"), (&theirs, "owned by uid")] {
        let d = dir.to_str().expect("utf8");
        for args in [vec!["agent", "--no-http", "--no-recover", "--ring-dir", d], vec!["gc", "--ring-dir", d]] {
            let out = vramhook_refusing(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "`vramhook {}` must fail", args.join(" "));
            assert!(err.contains(problem), "`vramhook {}` names the problem ({problem}): {err}", args.join(" "));
        }
    }
}

/// `vramhook agent` with the default ring directory makes the parent 1777 (sticky) and the
/// user's directory 0700 (it made both 0755).
#[test]
fn agent_makes_the_default_dirs_with_the_right_modes() {
    if !ready("agent_makes_the_default_dirs_with_the_right_modes") {
        return;
    }
    let shm = fake_shm();
    let mut child = agent_on(shm.path(), Stdio::null());
    let user_dir = shm.path().join("vramhook/0");
    exited_or(&mut child, || user_dir.exists());
    let _ = child.kill();
    let _ = child.wait();
    let parent = std::fs::symlink_metadata(shm.path().join("vramhook")).expect("parent made");
    assert_eq!(parent.mode() & 0o7777, 0o1777, "parent mode");
    let mine = std::fs::symlink_metadata(&user_dir).expect("user dir made");
    assert_eq!(mine.mode() & 0o7777, 0o700, "user dir mode");
}

/// A new ring appears under its final name by a rename, complete: no `*.ring` is ever
/// created empty in the directory (the agent, woken by IN_CREATE, found a header not yet
/// written and waited for its 1 s rescan).
#[test]
fn a_new_ring_appears_complete_under_its_final_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = private_dir(tmp.path(), "rings", 0o700);
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: plain inotify calls on our own fd.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(fd >= 0);
    assert!(unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) } >= 0);
    let out = traced_workload(WORKLOAD, &dir).output().expect("run");
    assert!(out.status.success());
    let mut events = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        // SAFETY: reading into our buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n <= 0 {
            break;
        }
        let mut off = 0usize;
        while off + 16 <= n as usize {
            let mask = u32::from_ne_bytes(buf[off + 4..off + 8].try_into().expect("mask"));
            let len = u32::from_ne_bytes(buf[off + 12..off + 16].try_into().expect("len")) as usize;
            let name = &buf[off + 16..off + 16 + len];
            let name = String::from_utf8_lossy(&name[..name.iter().position(|b| *b == 0).unwrap_or(len)]).into_owned();
            events.push((mask, name));
            off += 16 + len;
        }
    }
    // SAFETY: closing our fd.
    unsafe { libc::close(fd) };
    let ring = rings(&dir);
    assert_eq!(ring.len(), 1);
    let ring_name = ring[0].file_name().expect("name").to_string_lossy().into_owned();
    assert!(
        !events.iter().any(|(m, n)| m & libc::IN_CREATE != 0 && n == &ring_name),
        "the ring was created under its final name before it was complete: {events:?}"
    );
    assert!(
        events.iter().any(|(m, n)| m & libc::IN_MOVED_TO != 0 && n == &ring_name),
        "the ring arrives by a rename: {events:?}"
    );
    assert!(names(&dir).iter().all(|n| !n.ends_with(".tmp")), "{:?}", names(&dir));
}

/// Directories an earlier agent made 0755 (or a Kubernetes `DirectoryOrCreate` hostPath),
/// owned by the agent's own user, are repaired to 1777 / 0700, not refused; the traced
/// program then records there.
#[test]
fn agent_repairs_its_own_dirs_left_0755_by_an_earlier_version() {
    if !ready("agent_repairs_its_own_dirs_left_0755_by_an_earlier_version") {
        return;
    }
    let shm = fake_shm();
    dir_as(&shm.path().join("vramhook"), 0o755, 0);
    dir_as(&shm.path().join("vramhook/0"), 0o755, 0);
    let mut child = agent_on(shm.path(), Stdio::piped());
    let modes = || {
        let m = |p: PathBuf| std::fs::symlink_metadata(p).map(|m| m.mode() & 0o7777).unwrap_or(0);
        (m(shm.path().join("vramhook")), m(shm.path().join("vramhook/0")))
    };
    exited_or(&mut child, || modes() == (0o1777, 0o700));
    let _ = child.kill();
    let out = child.wait_with_output().expect("agent output");
    assert_eq!(modes(), (0o1777, 0o700), "repaired; agent said: {}", String::from_utf8_lossy(&out.stderr));
}
