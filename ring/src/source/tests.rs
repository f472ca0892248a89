use super::discover::parse_ring_name;
use super::*;
use crate::{RingInit, RingWriter};

/// A ring file `dir/name` made as the interposer makes it (created under a temporary name,
/// sized, mapped, its header written, renamed into place); returns the writer and the
/// mapping, which stays mapped until the caller unmaps it.
fn make_ring_file(dir: &Path, name: &str, init: &RingInit, meta: &[u8]) -> (RingWriter, *mut u8, usize) {
    let tmp = dir.join(format!(".{name}.tmp"));
    let len = crate::ring_file_size_lanes(init.capacity, 1);
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&tmp).expect("create ring");
    file.set_len(len as u64).expect("size the ring");
    let base = vramhook_protocol::mapped::map_shared_rw(&file, len).expect("mmap the ring");
    // SAFETY: a fresh (zero-filled) shared mapping of the size the header asks for.
    let writer = unsafe { RingWriter::init_lanes(base, init, 1, meta) };
    std::fs::rename(&tmp, dir.join(name)).expect("rename the ring into place");
    (writer, base, len)
}

#[test]
fn ring_names() {
    assert_eq!(parse_ring_name("12-34-0.ring"), Some((12, 34, 0)));
    assert_eq!(parse_ring_name("12-34.ring"), None);
    assert_eq!(parse_ring_name("12-34-0-1.ring"), None);
    assert_eq!(parse_ring_name("x-34-0.ring"), None);
    assert_eq!(parse_ring_name("12-34-0.ring.tmp"), None);
}

fn own_start_time() -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", std::process::id())).expect("stat");
    let after = &stat[stat.rfind(')').expect(")") + 2..];
    after.split(' ').nth(19).expect("field").parse().expect("number")
}

/// A ring file seen between its creation and its sizing is not refused while its
/// process lives (it was, and the whole process went missing from the capture).
#[test]
fn an_empty_ring_of_a_live_process_is_waited_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let live = dir.path().join(format!("{}-{}-0.ring", std::process::id(), own_start_time()));
    let gone = dir.path().join(format!("{}-1-0.ring", u32::MAX - 1));
    std::fs::write(&live, b"").expect("create");
    std::fs::write(&gone, b"").expect("create");
    let mut source = RingSource::new(dir.path(), RingFilter::default(), None);
    for _ in 0..3 {
        source.poll(&mut |_| {});
    }
    let refused: Vec<PathBuf> = source.take_refusals().into_iter().map(|r| r.path).collect();
    assert_eq!(refused, vec![gone], "only the ring of a process that is gone is refused");
    assert_eq!(source.open_rings(), 0);
}

/// A ring made with the protocol's writer, holding `events`, for a process that is gone.
fn write_ring(dir: &Path, pid: u32, start: u64, events: &[Event]) {
    // SAFETY: geteuid has no preconditions.
    let init =
        RingInit { capacity: 16, pid, start_time: start, uid: unsafe { libc::geteuid() }, ..RingInit::default() };
    let name = format!("{pid}-{start}-0.ring");
    let (w, map, len) = make_ring_file(dir, &name, &init, b"");
    for e in events {
        assert!(w.push(&e.to_raw()));
    }
    // SAFETY: the mapping made above; the writer is not used after this.
    unsafe { libc::munmap(map.cast(), len) };
}

/// A ring larger than the reader takes is refused before it is mapped, with its owner, its
/// size and the limit in the refusal (the reader counts them per owner), and the setting
/// that takes it in the reason.
#[test]
fn a_ring_too_large_is_refused_with_its_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid = u32::MAX - 9;
    write_ring(dir.path(), pid, 1, &[]);
    let len = crate::ring_file_size(16) as u64;
    let mut source = RingSource::new(dir.path(), RingFilter::default(), None);
    source.max_ring_bytes = len - 1;
    source.poll(&mut |_| {});
    let refusals = source.take_refusals();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(refusals[0].too_large, Some(TooLarge { uid, len, max: len - 1 }));
    assert!(!refusals[0].hostile);
    assert!(refusals[0].reason.ends_with("(--max-ring-mib 1 takes it)"), "{}", refusals[0].reason);
    assert_eq!(max_ring_mib_for(crate::HEADER_SIZE as u64 + (1 << 20) + 1), 2);
    source.poll(&mut |_| {});
    assert!(source.take_refusals().is_empty(), "refused once");
}

/// Two rings of processes that are gone with the same pid (pid reuse) are never open
/// together: the model knows a process by its pid, so the first is drained and closed
/// before the second is announced, and each event lands on its own process. Events
/// naming another pid, or another start of this pid, and NVML samples (a reader's
/// records, never a traced process's) are refused and counted.
#[test]
fn rings_of_one_pid_are_drained_one_after_the_other_and_foreign_events_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid = u32::MAX - 7;
    let ev = |pid: u32, size: u64| Event {
        pid,
        kind: EventKind::Alloc.code(),
        api: Api::cuMemAlloc_v2.code(),
        addr: 0x1000,
        size,
        ..Event::default()
    };
    let start_of_other = Event { kind: EventKind::ProcessStart.code(), aux: 2, ..ev(pid, 0) };
    // An NVML sample naming a holder of 1 TiB, written by the traced process itself.
    let nvml = Event::gpu_process(1, 1, 4242, 1 << 40, b"holder").at(1).by(pid, 0).on_device(0);
    write_ring(dir.path(), pid, 1, &[ev(pid, 10), ev(1, 1 << 40), start_of_other, nvml]);
    write_ring(dir.path(), pid, 2, &[ev(pid, 20)]);
    let mut source = RingSource::new(dir.path(), RingFilter::default(), None);
    source.batch_limit = 1; // several polls per ring: time for the two to interleave
    let mut seen = Vec::new();
    let mut foreign = 0;
    for _ in 0..10 {
        let summary = source.poll(&mut |item| match item {
            SourceItem::Process(p) => seen.push(format!("process {}", p.start_time)),
            SourceItem::Events(es) => seen.extend(es.iter().map(|e| format!("event {} {}", e.pid, e.size))),
            SourceItem::End(e) => seen.push(format!("end {} malformed {}", e.start_time, e.malformed)),
        });
        foreign += summary.foreign;
    }
    let expected = [
        "process 1".to_string(),
        format!("event {pid} 10"),
        "end 1 malformed 3".into(),
        "process 2".into(),
        format!("event {pid} 20"),
        "end 2 malformed 0".into(),
    ];
    assert_eq!(seen, expected);
    assert_eq!(foreign, 3);
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "both rings removed");
}

/// A `vramhook run` session's ring (stamped with a run id) is left alone and listed:
/// its process as the header says (control characters replaced), the session as the
/// holder of its lock, announced once; gone from the list with its file.
#[test]
fn a_run_sessions_ring_is_listed_not_drained() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().expect("tempdir");
    let (pid, start) = (std::process::id(), own_start_time());
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let init = RingInit { capacity: 16, pid, start_time: start, uid, run_id: 7, ..RingInit::default() };
    let name = format!("{pid}-{start}-0.ring");
    let meta = b"/usr/bin/python3\0python3\0train.py\x1b[2J";
    let (w, map, len) = make_ring_file(dir.path(), &name, &init, meta);
    assert!(w.push(&Event { pid, kind: EventKind::Alloc.code(), size: 10, ..Event::default() }.to_raw()));
    // The session: another open file holding the ring's lock.
    let session = std::fs::File::open(dir.path().join(&name)).expect("open");
    // SAFETY: flock on a descriptor of ours.
    assert_eq!(unsafe { libc::flock(session.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);

    let mut source = RingSource::new(dir.path(), RingFilter::default(), None);
    source.skip_run_rings = true;
    let mut items = 0;
    source.poll(&mut |_| items += 1);
    assert_eq!((source.open_rings(), items), (0, 0), "not drained");
    let listed = RunRingProcess {
        pid,
        start_time: start,
        exe: "/usr/bin/python3".into(),
        command: "python3 train.py?[2J".into(),
        run_pid: Some(pid),
    };
    assert_eq!(source.run_rings(), vec![listed.clone()]);
    assert_eq!(source.take_new_run_rings(), vec![listed.clone()], "announced once its session is known");
    source.poll(&mut |_| items += 1);
    assert!(source.take_new_run_rings().is_empty(), "announced once");
    assert_eq!(source.run_rings(), vec![listed]);
    assert_eq!(items, 0);

    drop(session);
    std::fs::remove_file(dir.path().join(&name)).expect("remove");
    source.poll(&mut |_| {});
    assert!(source.run_rings().is_empty(), "gone with its file");
    // SAFETY: the mapping made above; the writer is not used after this.
    unsafe { libc::munmap(map.cast(), len) };
}

#[test]
fn this_process_is_alive_and_a_wrong_start_time_is_not() {
    let pid = std::process::id();
    let start = own_start_time();
    assert!(process_alive(pid, start));
    assert!(!process_alive(pid, start + 1));
    assert!(!process_alive(u32::MAX - 1, start));
}
