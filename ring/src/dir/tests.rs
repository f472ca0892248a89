use super::*;
use crate::{RingInit, RingWriter};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// A private scratch directory (0700), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "vramhook-ringdir-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).expect("mkdir");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn uid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

/// Writes a ring file of `lanes` lanes with `written` events pushed and `read` of them
/// marked read in lane 0.
fn make_ring(path: &Path, lanes: u32, written: u64, read: u64) {
    let capacity = 64u64;
    let len = ring_file_size_lanes(capacity, lanes);
    let mut mem = vec![0u64; len / 8];
    let base = mem.as_mut_ptr() as *mut u8;
    let init = RingInit {
        capacity,
        pid: 1,
        ppid: 0,
        uid: uid(),
        start_time: 1,
        run_id: 0,
        clock_source: 0,
        tsc_anchor: 0,
        mono_anchor_ns: 0,
        wall_anchor_ns: 0,
    };
    // SAFETY: a zeroed, aligned buffer of the ring's size.
    let w = unsafe { RingWriter::init_lanes(base, &init, lanes, &[]) };
    let rec = vramhook_protocol::record::RawRecord::default();
    for _ in 0..written {
        assert!(w.push(&rec));
    }
    let bytes = unsafe { std::slice::from_raw_parts_mut(base, len) };
    bytes[320..328].copy_from_slice(&read.to_le_bytes());
    // A reader that read them and recorded them (see `drain_state_counts_what_a_dead_reader_took`).
    let recorded = core::mem::offset_of!(RingHeader, recorded);
    bytes[recorded..recorded + 8].copy_from_slice(&read.to_le_bytes());
    std::fs::write(path, &*bytes).expect("write ring");
}

const DEAD_PID: u32 = u32::MAX - 7;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    v.sort();
    v
}

fn open(dir: &Path) -> OwnedFd {
    open_ring_dir(dir, uid()).expect("open ring dir")
}

#[test]
fn ring_and_tmp_names() {
    assert_eq!(parse_ring_name(b"12-34-0.ring"), Some((12, 34, 0)));
    assert_eq!(parse_ring_name(b"12-34.ring"), None);
    assert_eq!(parse_ring_name(b"12-34-0.ring.tmp"), None);
    assert_eq!(parse_ring_name(b".12-34-0.ring.tmp"), None);
    assert_eq!(parse_ring_name(b"99999999999-1-0.ring"), None);
    assert_eq!(parse_tmp_name(b".12-34-5.ring.tmp"), Some((12, 34, 5)));
    assert_eq!(parse_tmp_name(b"12-34-5.ring.tmp"), None);
    let mut buf = [0u8; 64];
    let n = format_ring_name(&mut buf, 12, 34, 5, true).expect("fits");
    assert_eq!(&buf[..=n], b".12-34-5.ring.tmp\0");
    let n = format_ring_name(&mut buf, 12, 34, 5, false).expect("fits");
    assert_eq!(&buf[..n], b"12-34-5.ring");
    assert_eq!(format_ring_name(&mut [0u8; 8], 12, 34, 5, false), None);
}

#[test]
fn stat_parsing_and_liveness() {
    let line = b"42 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19 20";
    assert_eq!(parse_stat_start(line), Some((b'S', 777)));
    assert_eq!(parse_stat_start(b"garbage"), None);
    let stat = std::fs::read(format!("/proc/{}/stat", std::process::id())).expect("stat");
    let (_, start) = parse_stat_start(&stat).expect("own stat");
    assert!(process_alive(std::process::id(), start));
    assert!(!process_alive(std::process::id(), start + 1));
    assert!(!process_alive(DEAD_PID, start));
}

#[test]
fn fitting_a_ring_into_a_limit() {
    let full = ring_bytes(1 << 16, 16);
    assert_eq!(fit_ring(1 << 16, 16, u64::MAX), Some((1 << 16, 16)));
    assert_eq!(fit_ring(1 << 16, 16, full), Some((1 << 16, 16)));
    let (c, l) = fit_ring(1 << 16, 16, full / 3).expect("fits smaller");
    assert!(ring_bytes(c, l) <= full / 3 && c * u64::from(l) >= MIN_RING_SLOTS);
    // The floor: 1,024 slots (64 KiB) plus the header.
    let floor = HEADER_SIZE as u64 + MIN_RING_SLOTS * 64;
    let (c, l) = fit_ring(1 << 16, 16, floor).expect("floor fits");
    assert_eq!(c * u64::from(l), MIN_RING_SLOTS);
    assert_eq!(fit_ring(1 << 16, 16, floor - 1), None);
    assert_eq!(fit_ring(1 << 16, 1, floor - 1), None);
    assert_eq!(fit_ring(1 << 16, 1, 0), None);
}

#[test]
fn mode_and_owner_rules() {
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    st.st_mode = libc::S_IFDIR | 0o1777;
    st.st_uid = 0;
    assert_eq!(check_parent(&st, 1000), Ok(()));
    st.st_uid = 1000;
    assert_eq!(check_parent(&st, 1000), Ok(()));
    st.st_uid = 1001;
    assert!(matches!(check_parent(&st, 1000), Err(RingDirError::Owner { .. })));
    st.st_uid = 0;
    st.st_mode = libc::S_IFDIR | 0o777;
    assert!(matches!(check_parent(&st, 1000), Err(RingDirError::Mode { .. })));
    st.st_mode = libc::S_IFLNK | 0o777;
    assert_eq!(check_parent(&st, 1000), Err(RingDirError::Symlink(DirRole::Parent)));

    st.st_mode = libc::S_IFDIR | 0o700;
    st.st_uid = 1000;
    assert_eq!(check_user_dir(&st, 1000, true), Ok(()));
    assert!(matches!(check_user_dir(&st, 1001, true), Err(RingDirError::Owner { .. })));
    st.st_mode = libc::S_IFDIR | 0o755;
    assert!(matches!(check_user_dir(&st, 1000, true), Err(RingDirError::Mode { .. })));
    assert_eq!(check_user_dir(&st, 1000, false), Ok(()));
    st.st_mode = libc::S_IFDIR | 0o777;
    assert!(matches!(check_user_dir(&st, 1000, false), Err(RingDirError::Mode { .. })));
    st.st_mode = libc::S_IFDIR | 0o1777;
    assert_eq!(check_user_dir(&st, 1000, false), Ok(()), "an explicit sticky directory, as /tmp");
    assert!(matches!(check_user_dir(&st, 1000, true), Err(RingDirError::Mode { .. })));
    st.st_mode = libc::S_IFREG | 0o700;
    assert_eq!(check_user_dir(&st, 1000, false), Err(RingDirError::NotADirectory(DirRole::UserDir)));

    assert!(is_under_default(b"/dev/shm/vramhook/1000"));
    assert!(!is_under_default(b"/dev/shm/vramhook"));
    assert!(!is_under_default(b"/dev/shm/vramhook/1000/x"));
    assert!(!is_under_default(b"/dev/shm/vramhookx/1000"));
}

#[test]
fn a_symlinked_or_shared_ring_dir_is_refused() {
    let s = Scratch::new("sym");
    let real = s.0.join("real");
    std::fs::create_dir(&real).expect("mkdir");
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let link = s.0.join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    assert!(open_ring_dir(&real, uid()).is_ok());
    assert_eq!(open_ring_dir(&link, uid()).err(), Some(RingDirError::Symlink(DirRole::UserDir)));
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    assert!(matches!(open_ring_dir(&real, uid()), Err(RingDirError::Mode { .. })));
    assert!(matches!(open_ring_dir(&real, uid() + 1), Err(RingDirError::Owner { .. })));
    let file = s.0.join("file");
    std::fs::write(&file, b"").expect("file");
    assert_eq!(open_ring_dir(&file, uid()).err(), Some(RingDirError::NotADirectory(DirRole::UserDir)));
    // make_ring_dir makes a missing directory 0700, whatever the umask.
    let made = s.0.join("a/b");
    // SAFETY: umask has no preconditions.
    let old = unsafe { libc::umask(0o077) };
    let r = make_ring_dir(&made, uid());
    unsafe { libc::umask(old) };
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(std::fs::metadata(&made).expect("meta").permissions().mode() & 0o7777, 0o700);
    // An explicit directory of ours with loose modes is refused, not repaired.
    std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    assert!(matches!(make_ring_dir(&made, uid()), Err(RingDirError::Mode { .. })));
}

#[test]
fn drain_state_reads_every_lane() {
    let s = Scratch::new("drain");
    for (lanes, written, read, expect) in [
        (1, 0, 0, Drain::Drained),
        (1, 5, 5, Drain::Drained),
        (1, 5, 3, Drain::Pending(2)),
        (4, 5, 5, Drain::Drained), // tid 0: every event in lane 0
    ] {
        let p = s.0.join("r");
        make_ring(&p, lanes, written, read);
        let f = std::fs::File::open(&p).expect("open");
        assert_eq!(drain_state_fd(f.as_raw_fd()), expect, "lanes {lanes} written {written} read {read}");
    }
    // Lane 2 written, never read.
    let mut h = vec![0u8; HEADER_SIZE];
    h[8] = 1;
    let lanes_off = core::mem::offset_of!(RingHeader, lanes);
    h[lanes_off] = 4;
    h[LANE_CURSORS_OFFSET + 64..LANE_CURSORS_OFFSET + 72].copy_from_slice(&3u64.to_le_bytes());
    assert_eq!(drain_state(&h), Drain::Pending(3));
    h[LANE_READ_OFFSET + 16..LANE_READ_OFFSET + 24].copy_from_slice(&3u64.to_le_bytes());
    let recorded = core::mem::offset_of!(RingHeader, recorded);
    h[recorded..recorded + 8].copy_from_slice(&3u64.to_le_bytes());
    assert_eq!(drain_state(&h), Drain::Drained);
    assert_eq!(drain_state(&h[..10]), Drain::Drained);
}

/// Stamps a ring as found gone `secs_ago` seconds ago (what an earlier gc writes).
fn set_gone_since(path: &Path, secs_ago: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).expect("open");
    f.write_all_at(&now_secs().saturating_sub(secs_ago).to_le_bytes(), 408).expect("stamp");
}

fn gone_since(path: &Path) -> u64 {
    let b = std::fs::read(path).expect("read");
    u64::from_le_bytes(b[408..416].try_into().expect("8 bytes"))
}

fn set_age(path: &Path, secs_ago: u64) {
    let t = now_secs().saturating_sub(secs_ago) as i64;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let times = [libc::timespec { tv_sec: t, tv_nsec: 0 }, libc::timespec { tv_sec: t, tv_nsec: 0 }];
    // SAFETY: valid path and times.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) }, 0);
}

#[test]
fn gc_removes_drained_and_stale_tmp_keeps_live_and_undrained() {
    let s = Scratch::new("gc");
    let stat = std::fs::read(format!("/proc/{}/stat", std::process::id())).expect("stat");
    let (_, start) = parse_stat_start(&stat).expect("own stat");
    let me = std::process::id();
    make_ring(&s.0.join(format!("{me}-{start}-0.ring")), 1, 3, 3); // live, drained
    make_ring(&s.0.join(format!("{DEAD_PID}-1-0.ring")), 1, 3, 3); // gone, drained
    make_ring(&s.0.join(format!("{DEAD_PID}-1-1.ring")), 1, 3, 1); // gone, undrained
    std::fs::write(s.0.join(format!(".{DEAD_PID}-1-2.ring.tmp")), b"x").expect("tmp");
    std::fs::write(s.0.join(format!(".{me}-{start}-1.ring.tmp")), b"x").expect("tmp");
    std::fs::write(s.0.join("notes.txt"), b"x").expect("other");
    let dir = open(&s.0);
    let mut seen = Vec::new();
    let policy = GcPolicy { keep_percent: 100, ..GcPolicy::default() };
    let sum = gc_dir(dir.as_raw_fd(), uid(), &policy, now_secs(), true, &mut |e| {
        seen.push((String::from_utf8_lossy(e.name).into_owned(), e.reason))
    });
    assert_eq!(sum.removed, 2, "{seen:?}");
    assert_eq!(sum.removed_undrained, 0);
    assert_eq!(sum.kept_undrained, 1);
    let mut expect = vec![
        format!(".{me}-{start}-1.ring.tmp"),
        format!("{DEAD_PID}-1-1.ring"),
        format!("{me}-{start}-0.ring"),
        "notes.txt".to_string(),
    ];
    expect.sort();
    assert_eq!(names(&s.0), expect);
    assert!(seen.contains(&(format!("{DEAD_PID}-1-1.ring"), GcReason::Undrained)));
    assert!(seen.contains(&(format!("{me}-{start}-0.ring"), GcReason::Live)));
    assert_eq!(read_gc_record(dir.as_raw_fd()), (0, 0));
}

#[test]
fn gc_dry_run_removes_nothing() {
    let s = Scratch::new("dry");
    make_ring(&s.0.join(format!("{DEAD_PID}-1-0.ring")), 1, 3, 3);
    make_ring(&s.0.join(format!("{DEAD_PID}-1-1.ring")), 1, 3, 0);
    set_gone_since(&s.0.join(format!("{DEAD_PID}-1-1.ring")), 48 * 3600);
    let dir = open(&s.0);
    let policy = GcPolicy { dry_run: true, ..GcPolicy::default() };
    let sum = gc_dir(dir.as_raw_fd(), uid(), &policy, now_secs(), true, &mut |_| {});
    assert_eq!((sum.removed, sum.removed_undrained), (2, 1));
    assert_eq!(names(&s.0).len(), 2);
    assert_eq!(read_gc_record(dir.as_raw_fd()), (0, 0));
}

#[test]
fn gc_age_and_space_budgets_remove_oldest_first_and_count() {
    let s = Scratch::new("budget");
    let ring_len = ring_file_size_lanes(64, 1) as u64;
    for (image, age_h) in [(0u64, 30u64), (1, 5), (2, 3), (3, 2), (4, 1)] {
        let p = s.0.join(format!("{DEAD_PID}-1-{image}.ring"));
        make_ring(&p, 1, 3, 0);
        set_age(&p, age_h * 3600);
        if image == 0 {
            set_gone_since(&p, age_h * 3600);
        }
    }
    let dir = open(&s.0);
    // Age: only the ring found gone 30 hours ago goes (the others, unstamped, are
    // stamped now and kept).
    let policy = GcPolicy { keep_percent: 100, ..GcPolicy::default() };
    let sum = gc_dir(dir.as_raw_fd(), uid(), &policy, now_secs(), false, &mut |_| {});
    assert_eq!((sum.removed, sum.removed_undrained), (1, 1));
    assert!(!names(&s.0).contains(&format!("{DEAD_PID}-1-0.ring")));
    let (rings, bytes) = read_gc_record(dir.as_raw_fd());
    assert_eq!(rings, 1);
    assert!(bytes >= ring_len);

    // Space: a budget of 0% removes every undrained ring of a gone process, oldest first.
    let mut order = Vec::new();
    let policy = GcPolicy { keep_percent: 0, max_budget_removals: 2, ..GcPolicy::default() };
    let sum = gc_dir(dir.as_raw_fd(), uid(), &policy, now_secs(), false, &mut |e| {
        assert_eq!(e.reason, GcReason::OverBudget);
        order.push(String::from_utf8_lossy(e.name).into_owned());
    });
    assert_eq!(order, vec![format!("{DEAD_PID}-1-1.ring"), format!("{DEAD_PID}-1-2.ring")], "bounded, oldest first");
    assert_eq!(sum.removed_undrained, 2);
    assert_eq!(read_gc_record(dir.as_raw_fd()).0, 3);
    assert_eq!(
        names(&s.0),
        vec![".gc-removed".to_string(), format!("{DEAD_PID}-1-3.ring"), format!("{DEAD_PID}-1-4.ring")]
    );
}

#[test]
fn gc_leaves_a_ring_a_reader_holds() {
    let s = Scratch::new("locked");
    let p = s.0.join(format!("{DEAD_PID}-1-0.ring"));
    make_ring(&p, 1, 3, 3);
    let held = std::fs::File::open(&p).expect("open");
    // SAFETY: flock on our fd.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let dir = open(&s.0);
    let sum = gc_dir(dir.as_raw_fd(), uid(), &GcPolicy::default(), now_secs(), false, &mut |_| {});
    assert_eq!(sum.removed, 0);
    assert!(p.exists());
    drop(held);
    let sum = gc_dir(dir.as_raw_fd(), uid(), &GcPolicy::default(), now_secs(), false, &mut |_| {});
    assert_eq!(sum.removed, 1);
}

#[test]
fn gc_record_parsing() {
    assert_eq!(parse_gc_record(b"3 4096\n"), (3, 4096));
    assert_eq!(parse_gc_record(b""), (0, 0));
    assert_eq!(parse_gc_record(b"x y"), (0, 0));
}

/// A ring created long ago (a job that ran for days) whose process just died is not
/// expired at once: the keep-hours clock starts when a gc first finds it gone.
#[test]
fn the_age_budget_counts_from_when_the_process_was_found_gone() {
    let s = Scratch::new("gone");
    let p = s.0.join(format!("{DEAD_PID}-1-0.ring"));
    make_ring(&p, 1, 3, 0);
    set_age(&p, 72 * 3600);
    let dir = open(&s.0);
    let dry = GcPolicy { dry_run: true, ..GcPolicy::default() };
    gc_dir(dir.as_raw_fd(), uid(), &dry, now_secs(), false, &mut |_| {});
    assert_eq!(gone_since(&p), 0, "a dry run writes nothing");
    let sum = gc_dir(dir.as_raw_fd(), uid(), &GcPolicy::default(), now_secs(), false, &mut |_| {});
    assert_eq!(sum.removed, 0);
    assert!(p.exists());
    assert!(gone_since(&p) + 5 >= now_secs(), "stamped now");
    let mtime = std::fs::metadata(&p).expect("meta").modified().expect("mtime");
    let age = std::time::SystemTime::now().duration_since(mtime).expect("past").as_secs();
    assert!(age >= 71 * 3600, "the stamp keeps the modification time (oldest-first order): {age}");
    // 25 hours later, it goes.
    let sum = gc_dir(dir.as_raw_fd(), uid(), &GcPolicy::default(), now_secs() + 25 * 3600, false, &mut |_| {});
    assert_eq!((sum.removed, sum.removed_undrained), (1, 1));
    assert!(!p.exists());
}

/// A ring written from another pid namespace (a container sharing the directory) names a
/// pid this /proc cannot check: it is left alone until its writer marks it exited.
#[test]
fn a_ring_from_another_pid_namespace_is_kept_until_marked_exited() {
    use std::os::unix::fs::FileExt;
    let s = Scratch::new("pidns");
    let p = s.0.join(format!("{DEAD_PID}-1-0.ring"));
    make_ring(&p, 1, 3, 3);
    let f = std::fs::OpenOptions::new().write(true).open(&p).expect("open");
    f.write_all_at(&(own_pid_ns() + 12_345).to_le_bytes(), 416).expect("pid_ns");
    let dir = open(&s.0);
    let mut kept = Vec::new();
    let sum = gc_dir(
        dir.as_raw_fd(),
        uid(),
        &GcPolicy { keep_percent: 0, keep_secs: 0, ..GcPolicy::default() },
        now_secs(),
        true,
        &mut |e| kept.push(e.reason),
    );
    assert_eq!(sum.removed, 0);
    assert_eq!(kept, vec![GcReason::OtherPidNamespace]);
    assert!(p.exists());
    f.write_all_at(&crate::STATE_EXITED.to_le_bytes(), 400).expect("state");
    let sum = gc_dir(dir.as_raw_fd(), uid(), &GcPolicy::default(), now_secs(), false, &mut |_| {});
    assert_eq!(sum.removed, 1, "marked exited: gone, drained, removed");
}

/// A reader that took events and died before recording them left the cursors caught up:
/// the ring is not drained (gc keeps it within the budget, the next agent counts the loss).
#[test]
fn drain_state_counts_what_a_dead_reader_took() {
    let mut h = vec![0u8; HEADER_SIZE];
    h[8] = 1;
    let write = core::mem::offset_of!(RingHeader, write_pos);
    let read = core::mem::offset_of!(RingHeader, read_pos);
    let recorded = core::mem::offset_of!(RingHeader, recorded);
    h[write..write + 8].copy_from_slice(&7u64.to_le_bytes());
    h[read..read + 8].copy_from_slice(&7u64.to_le_bytes());
    assert_eq!(drain_state(&h), Drain::Pending(7), "read, never recorded");
    h[recorded..recorded + 8].copy_from_slice(&5u64.to_le_bytes());
    assert_eq!(drain_state(&h), Drain::Pending(2));
    h[recorded..recorded + 8].copy_from_slice(&7u64.to_le_bytes());
    assert_eq!(drain_state(&h), Drain::Drained);
}

#[test]
fn decimal_writes_every_digit_of_any_u64() {
    let mut digits = [0u8; 20];
    for v in [0u64, 7, 10, 4_294_967_295, u64::MAX] {
        assert_eq!(decimal(v, &mut digits), v.to_string().as_bytes());
    }
}
