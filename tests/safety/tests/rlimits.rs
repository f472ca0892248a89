//! rlimits and settings that used to kill or mislead the traced program: `ulimit -f`
//! (SIGXFSZ when the ring was sized), and a `VRAMHOOK_DIR` too long for the interposer.

use vramhook_safety_tests::shm_kit::*;
use vramhook_safety_tests::{not_run, require_root, traced_workload};

const WORKLOAD: &str = "torch_caching";

/// The workload traced into a private ring directory under a file-size limit of `bytes`;
/// it must end as the untraced run does. Returns the directory (and what keeps it).
fn run_with_file_size_limit(bytes: u64, what: &str) -> (tempfile::TempDir, std::path::PathBuf, std::process::Output) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = private_dir(tmp.path(), "rings", 0o700);
    let expected = untraced(WORKLOAD);
    let mut cmd = traced_workload(WORKLOAD, &dir);
    limit_file_size(&mut cmd, bytes);
    let out = cmd.output().expect("run");
    assert_same_as_untraced(&out, &expected, what);
    (tmp, dir, out)
}

/// `ulimit -f 1024` (1 MiB): the ring shrinks to fit instead of SIGXFSZ killing the
/// program when the 4 MiB ring file was sized.
#[test]
fn ulimit_f_shrinks_the_ring_instead_of_killing_the_program() {
    let (_tmp, dir, _out) = run_with_file_size_limit(1 << 20, "ulimit -f 1024");
    let rings = rings(&dir);
    assert_eq!(rings.len(), 1, "{:?}", names(&dir));
    let size = std::fs::metadata(&rings[0]).expect("ring").len();
    assert!(size <= 1 << 20, "ring of {size} bytes under a 1 MiB file size limit");
    assert!(pending(&rings[0]) > 0, "still recorded");
}

/// `ulimit -f 16` (16 KiB): not even the smallest ring fits; the program runs untraced
/// with one line instead of dying of SIGXFSZ.
#[test]
fn ulimit_f_below_the_smallest_ring_runs_untraced_with_one_line() {
    let (_tmp, dir, out) = run_with_file_size_limit(16 << 10, "ulimit -f 16");
    let lines = vramhook_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("ulimit -f"), "the line names the limit: {lines:?}");
    assert_eq!(names(&dir), Vec::<String>::new());
}

/// A `VRAMHOOK_DIR` of 512 bytes or more was silently ignored (rings went to the default
/// directory): it is refused with one line, and nothing is written anywhere. The default
/// `/dev/shm` is a private one, in a mount namespace of the traced program.
#[test]
fn a_vramhook_dir_of_512_bytes_or_more_is_refused_not_ignored() {
    let name = "a_vramhook_dir_of_512_bytes_or_more_is_refused_not_ignored";
    if !require_root(name) {
        return;
    }
    if !can_unshare_mounts() {
        not_run(name, "cannot make a mount namespace here");
        return;
    }
    let shm = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(shm.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).expect("chmod");
    let long = std::path::PathBuf::from(format!("/tmp/{}", "d".repeat(600)));
    let expected = untraced(WORKLOAD);
    let mut cmd = traced_workload(WORKLOAD, &long);
    private_dev_shm(&mut cmd, shm.path());
    let out = cmd.output().expect("run");
    assert_same_as_untraced(&out, &expected, "long VRAMHOOK_DIR");
    let lines = vramhook_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("VRAMHOOK_DIR"), "{lines:?}");
    assert_eq!(rings_below(shm.path()), Vec::<std::path::PathBuf>::new(), "no ring in the default directory");
}
