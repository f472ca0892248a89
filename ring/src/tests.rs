use super::*;
use std::sync::atomic::Ordering;
use vramhook_protocol::record::{Api, Event, EventKind, RawRecord};

struct TestRing {
    mem: Vec<u64>,
}

impl TestRing {
    fn new(capacity: u64) -> Self {
        TestRing { mem: vec![0u64; ring_file_size(capacity) / 8] }
    }
    fn base(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr() as *mut u8
    }
}

fn ev(i: u64) -> RawRecord {
    Event {
        kind: EventKind::Alloc.code(),
        api: Api::cuMemAlloc_v2.code(),
        addr: 0x1000 + i,
        size: i,
        pid: 7,
        ..Event::default()
    }
    .to_raw()
}

fn setup(capacity: u64) -> (TestRing, RingWriter, RingReader) {
    let mut ring = TestRing::new(capacity);
    let base = ring.base();
    let init = RingInit { capacity, pid: 7, ..RingInit::default() };
    let meta_bytes = {
        let mut buf = [0u8; 64];
        let n = encode_meta(b"/bin/prog", b"prog\0--x\0", &mut buf);
        buf[..n].to_vec()
    };
    let writer = unsafe { RingWriter::init(base, &init, &meta_bytes) };
    let len = ring_file_size(capacity);
    let reader = unsafe { RingReader::new(base, len, None) }.expect("valid ring");
    (ring, writer, reader)
}

/// A ring with `lanes` lanes and timestamps from `clock_source`.
fn setup_lanes(capacity: u64, lanes: u32, clock_source: u32) -> (TestRing, RingWriter, RingReader) {
    let mut ring = TestRing { mem: vec![0u64; ring_file_size_lanes(capacity, lanes) / 8] };
    let base = ring.base();
    let init = RingInit { capacity, pid: 7, clock_source, ..RingInit::default() };
    let writer = unsafe { RingWriter::init_lanes(base, &init, lanes, b"") };
    let reader = unsafe { RingReader::new(base, ring_file_size_lanes(capacity, lanes), None) }.expect("valid");
    (ring, writer, reader)
}

fn stamped(kind: EventKind, tid: u32, addr: u64) -> RawRecord {
    Event {
        ts_ns: vramhook_protocol::clock::monotonic_ns(),
        kind: kind.code(),
        api: Api::cuMemAlloc_v2.code(),
        pid: 7,
        tid,
        addr,
        size: 1,
        ..Event::default()
    }
    .to_raw()
}

#[test]
fn lanes_deliver_everything_once_with_unique_seqs_in_thread_order() {
    let (_ring, writer, mut reader) = setup_lanes(64, 4, 0);
    assert_eq!(reader.lanes(), 4);
    let mut got = Vec::new();
    for round in 0..20u64 {
        for tid in 0..8u32 {
            assert!(writer.push(&stamped(EventKind::Alloc, tid, round)));
        }
        reader.poll(usize::MAX, round % 3 == 0, |e| got.push(e));
    }
    reader.poll(usize::MAX, true, |e| got.push(e));
    assert_eq!(got.len(), 160);
    let seqs: std::collections::BTreeSet<u64> = got.iter().map(|e| e.seq).collect();
    assert_eq!(seqs.len(), 160, "seq is unique across lanes");
    for tid in 0..8u32 {
        let rounds: Vec<u64> = got.iter().filter(|e| e.tid == tid).map(|e| e.addr).collect();
        assert_eq!(rounds, (0..20).collect::<Vec<_>>(), "thread {tid}'s events stay in order");
    }
}

/// One busy lane of sixteen gets the whole of a poll's `max`, not a sixteenth of it.
#[test]
fn a_poll_shares_its_max_among_the_lanes_that_have_events() {
    let (_ring, writer, mut reader) = setup_lanes(256, 16, 0);
    let busy = writer.own_lane(5);
    let mut lane = busy;
    for i in 0..200u64 {
        // SAFETY: this test's only writer of lane 5.
        assert!(unsafe { writer.push_exclusive(&mut lane, &stamped(EventKind::Alloc, 5, i)) });
    }
    let mut got = Vec::new();
    reader.poll(160, false, |e| got.push(e.addr));
    assert_eq!(got, (0..160).collect::<Vec<_>>(), "one busy lane: the whole max");
    // Two busy lanes: half each.
    let mut other = writer.own_lane(9);
    for i in 0..100u64 {
        // SAFETY: this test's only writer of lane 9.
        assert!(unsafe { writer.push_exclusive(&mut other, &stamped(EventKind::Alloc, 9, 1000 + i)) });
    }
    got.clear();
    reader.poll(80, false, |e| got.push(e.addr));
    assert_eq!(got.iter().filter(|a| **a < 1000).count(), 40, "{got:?}");
    assert_eq!(got.iter().filter(|a| **a >= 1000).count(), 40, "{got:?}");
}

/// An owned lane's push split in two (the interposer looks at the slot before it reads the
/// clock): what is published is what one push publishes, and a full lane refuses the
/// reservation, counting the drop, until the reader frees a slot.
#[test]
fn an_owned_lanes_reservation_publishes_like_a_push_and_refuses_when_full() {
    let (_ring, writer, mut reader) = setup_lanes(16, 2, 0);
    let mut lane = writer.own_lane(1);
    for i in 0..16u64 {
        // SAFETY: this test's only writer of lane 1; each slot is published at once.
        let slot = unsafe { writer.reserve_exclusive(&mut lane) }.expect("room");
        unsafe { writer.publish_exclusive(&mut lane, slot, &stamped(EventKind::Alloc, 1, i)) };
    }
    // SAFETY: as above.
    assert!(unsafe { writer.reserve_exclusive(&mut lane) }.is_none(), "sixteen slots, all unread");
    assert_eq!(reader.counters().dropped, 1);
    let mut got = Vec::new();
    let mut dropped = 0;
    reader.poll(usize::MAX, true, |e| match e.kind() {
        Some(EventKind::Dropped) => dropped += e.dropped_count(),
        _ => got.push((e.tid, e.addr)),
    });
    assert_eq!(got, (0..16).map(|i| (1, i)).collect::<Vec<_>>());
    assert_eq!(dropped, 1, "the reader reports the drop");
    // SAFETY: as above.
    assert!(unsafe { writer.push_exclusive(&mut lane, &stamped(EventKind::Free, 1, 9)) }, "room again");
    got.clear();
    reader.poll(usize::MAX, true, |e| got.push((e.tid, e.addr)));
    assert_eq!(got, [(1, 9)]);
}

#[test]
fn lanes_keep_causal_order_across_threads() {
    // Thread A allocates and hands the address to thread B, which frees it: the free
    // must never come out of the reader before the alloc, although they travel in
    // different lanes and the reader runs concurrently.
    let (_ring, writer, mut reader) = setup_lanes(1 << 12, 4, 0);
    let writer = std::sync::Arc::new(writer);
    let n = 20_000u64;
    let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(64);
    let wa = writer.clone();
    let a = std::thread::spawn(move || {
        for x in 1..=n {
            while !wa.push(&stamped(EventKind::Alloc, 1, x)) {
                std::thread::yield_now();
            }
            if tx.send(x).is_err() {
                return;
            }
        }
    });
    let wb = writer.clone();
    let b = std::thread::spawn(move || {
        for x in rx {
            while !wb.push(&stamped(EventKind::Free, 2, x)) {
                std::thread::yield_now();
            }
        }
    });
    let mut seen_alloc = std::collections::HashSet::new();
    let mut violations = 0u64;
    let mut frees = 0u64;
    let mut check = |e: Event| {
        if e.kind == EventKind::Alloc.code() {
            seen_alloc.insert(e.addr);
        } else if e.kind == EventKind::Free.code() {
            frees += 1;
            if !seen_alloc.contains(&e.addr) {
                violations += 1;
            }
        }
    };
    while !(a.is_finished() && b.is_finished()) {
        reader.poll(usize::MAX, false, &mut check);
    }
    a.join().expect("a");
    b.join().expect("b");
    reader.poll(usize::MAX, true, &mut check);
    assert_eq!(frees, n);
    assert_eq!(violations, 0, "a free came out before its alloc");
}

#[test]
fn round_trip_and_wrap() {
    let (_ring, writer, mut reader) = setup(16);
    assert_eq!(reader.info().exe, "/bin/prog");
    assert_eq!(reader.info().cmdline, vec!["prog", "--x"]);
    let mut got = Vec::new();
    for round in 0..5u64 {
        for i in 0..10 {
            assert!(writer.push(&ev(round * 10 + i)));
        }
        reader.poll(usize::MAX, false, |e| got.push(e));
    }
    assert_eq!(got.len(), 50);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.seq, i as u64);
        assert_eq!(e.size, i as u64);
    }
}

#[test]
fn full_ring_drops_and_counts_exactly() {
    let (_ring, writer, mut reader) = setup(16);
    let mut accepted = 0;
    for i in 0..100 {
        if writer.push(&ev(i)) {
            accepted += 1;
        }
    }
    assert_eq!(accepted, 16);
    let mut got = Vec::new();
    let stats = reader.poll(usize::MAX, false, |e| got.push(e));
    assert_eq!(stats.delivered, 16);
    assert_eq!(stats.dropped, 84);
    let dropped_event = got.last().expect("a drop marker");
    assert_eq!(dropped_event.kind, EventKind::Dropped.code());
    assert_eq!(dropped_event.size, 84);
    // Reported once only.
    let stats = reader.poll(usize::MAX, false, |_| {});
    assert_eq!(stats.dropped, 0);
}

#[test]
fn dead_writer_mid_write_is_skipped_and_counted() {
    let (_ring, writer, mut reader) = setup(16);
    assert!(writer.push(&ev(0)));
    // Reserve a slot without publishing it, as a writer killed mid-write would.
    let header = writer.header();
    header.write_pos.fetch_add(1, Ordering::Relaxed);
    assert!(writer.push(&ev(2)));
    let mut got = Vec::new();
    let stats = reader.poll(usize::MAX, false, |e| got.push(e));
    assert_eq!(stats.delivered, 2, "reads around the slot still being written");
    assert_eq!(reader.position(), 1, "the saved cursor stays at the unpublished slot");
    // A reader restarted now must not deliver event 2 again.
    let len = ring_file_size(16);
    let mut restarted = unsafe { RingReader::new(writer.base, len, None) }.expect("valid");
    let stats = restarted.poll(usize::MAX, false, |e| got.push(e));
    assert_eq!(stats.delivered, 0);
    let stats = restarted.poll(usize::MAX, true, |e| got.push(e));
    assert_eq!(stats.delivered, 0);
    assert_eq!(stats.lost_in_flight, 1);
    assert_eq!(got.iter().filter(|e| e.kind == EventKind::Alloc.code()).count(), 2);
    assert_eq!(restarted.position(), 3);
}

/// A ring of 16 slots with `n` events pushed, of which a reader, gone since, polled `max`:
/// the ring, its writer, what that reader got.
fn pushed_then_polled_by_a_reader_gone(n: u64, max: usize) -> (TestRing, RingWriter, Vec<Event>) {
    let (ring, writer, mut reader) = setup(16);
    for i in 0..n {
        writer.push(&ev(i));
    }
    let mut got = Vec::new();
    reader.poll(max, false, |e| got.push(e));
    (ring, writer, got)
}

/// A new reader of the 16-slot ring.
fn reader_again(ring: &mut TestRing) -> RingReader {
    unsafe { RingReader::new(ring.base(), ring_file_size(16), None) }.expect("valid")
}

#[test]
fn restarted_reader_resumes_from_cursor() {
    let (mut ring, _writer, first) = pushed_then_polled_by_a_reader_gone(5, 3);
    let mut reader = reader_again(&mut ring);
    let mut rest = Vec::new();
    reader.poll(usize::MAX, false, |e| rest.push(e));
    assert_eq!(first.len(), 3);
    assert_eq!(rest.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4]);
}

#[test]
fn hostile_headers_are_refused() {
    let mut ring = TestRing::new(16);
    let base = ring.base();
    let len = ring_file_size(16);
    assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::NotReady)));
    let init = RingInit { capacity: 16, ..RingInit::default() };
    unsafe { RingWriter::init(base, &init, b"") };
    let header = unsafe { &mut *(base as *mut RingHeader) };
    header.capacity = 1 << 40;
    assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::BadCapacity(_))));
    header.capacity = 32;
    assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::SizeMismatch { .. })));
    header.capacity = 16;
    header.version.store(99, Ordering::Relaxed);
    assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::NewerVersion(99))));
    header.version.store(1, Ordering::Relaxed);
    header.magic = *b"garbage!";
    assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::BadMagic)));
}

#[test]
fn garbage_slots_never_panic_or_overrun() {
    let (mut ring, _writer, mut reader) = setup(16);
    let base = ring.base();
    // Scribble over every slot and claim an absurd write cursor.
    unsafe {
        for i in 0..(16 * RECORD_SIZE) {
            *base.add(HEADER_SIZE + i) = (i as u8).wrapping_mul(37);
        }
        (*(base as *const RingHeader)).write_pos.store(u64::MAX, Ordering::Relaxed);
    }
    let mut n = 0;
    let stats = reader.poll(usize::MAX, true, |_| n += 1);
    assert!(stats.delivered + stats.lost_in_flight + stats.malformed <= 16);
}

#[test]
fn concurrent_writers_lose_nothing_without_drops() {
    let capacity = 1 << 12;
    let (_ring, writer, mut reader) = setup(capacity);
    let writer = std::sync::Arc::new(writer);
    let threads = 8;
    let per = 5000u64;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let w = writer.clone();
            std::thread::spawn(move || {
                let mut dropped = 0u64;
                for i in 0..per {
                    let mut r = ev(i);
                    r.tid = zerocopy::little_endian::U32::new(t);
                    if !w.push(&r) {
                        dropped += 1;
                    }
                }
                dropped
            })
        })
        .collect();
    let mut got = 0u64;
    let mut reported_drops = 0u64;
    let mut per_thread_last = vec![None::<u64>; threads as usize];
    let reader_done = done.clone();
    let mut check = |e: Event| {
        if e.kind == EventKind::Dropped.code() {
            reported_drops += e.size;
            return;
        }
        got += 1;
        let last = &mut per_thread_last[e.tid as usize];
        if let Some(prev) = *last {
            assert!(e.size > prev, "per-thread order kept");
        }
        *last = Some(e.size);
    };
    let mut writer_drops = 0;
    for h in handles {
        while !h.is_finished() {
            reader.poll(usize::MAX, false, &mut check);
        }
        writer_drops += h.join().expect("writer thread");
    }
    reader_done.store(true, Ordering::Relaxed);
    reader.poll(usize::MAX, false, &mut check);
    assert_eq!(reported_drops, writer_drops);
    assert_eq!(got + writer_drops, threads as u64 * per);
}

fn at(tid: u32, ts: u64) -> RawRecord {
    Event { ts_ns: ts, kind: EventKind::Alloc.code(), pid: 7, tid, addr: ts, size: 1, ..Event::default() }.to_raw()
}

#[test]
fn a_lane_cut_short_holds_back_later_events_of_other_lanes() {
    // Lane 0 is busy (100 events, t = 0..99), lane 1 has five late ones (t = 50..54). A poll
    // of 10 takes 5 from each lane: lane 1's must wait until lane 0 has caught up to t = 50.
    let (_ring, writer, mut reader) = setup_lanes(128, 2, 0);
    for t in 0..100 {
        assert!(writer.push(&at(0, t)));
    }
    for t in 50..55 {
        assert!(writer.push(&at(1, t)));
    }
    let mut got = Vec::new();
    let mut held = 0;
    for _ in 0..40 {
        held += reader.poll(10, false, |e| got.push(e.ts_ns)).held;
    }
    assert_eq!(got.len(), 105, "everything comes out");
    assert!(held > 0, "lane 1 was held back at least once");
    assert!(got.windows(2).all(|w| w[0] <= w[1]), "in time order across polls: {got:?}");
    assert_eq!(reader.pending(), 0);
}

#[test]
fn uncommitted_events_stay_in_the_ring_and_a_restarted_reader_skips_what_was_recorded() {
    let (_ring, writer, mut reader) = setup(16);
    reader.auto_commit = false;
    for i in 0..10 {
        assert!(writer.push(&ev(i)));
    }
    let mut first = Vec::new();
    reader.set_generation(1);
    assert_eq!(reader.poll(usize::MAX, false, |e| first.push(e)).delivered, 10);
    assert_eq!(reader.uncommitted(), 10);
    assert_eq!(reader.pending(), 0, "delivered is not pending");
    // The delivered slots are not free yet: six more fit, the seventh is dropped.
    for i in 10..16 {
        assert!(writer.push(&ev(i)));
    }
    assert!(!writer.push(&ev(16)), "uncommitted slots are not reused");
    let recorded = vramhook_protocol::seqset::SeqSet::from_ranges(first.iter().map(|e| (e.seq, e.seq + 1)));
    assert_eq!(reader.unconfirmed_seqs(), recorded);

    // The reader dies before committing: the next one finds all 16 still there.
    let len = reader.len();
    let mut again = unsafe { RingReader::new(writer.base, len, None) }.expect("valid");
    let mut seen = Vec::new();
    again.auto_commit = false;
    again.poll(usize::MAX, false, |e| seen.push(e.addr));
    assert_eq!(seen.len(), 16 + 1, "16 events and the drop marker: nothing lost");

    // Told what was recorded, a restarted reader delivers only the rest, once each.
    let mut restarted = unsafe { RingReader::new(writer.base, len, None) }.expect("valid");
    restarted.skip_recorded(recorded);
    let mut rest = Vec::new();
    let stats = restarted.poll(usize::MAX, false, |e| rest.push(e));
    assert_eq!(stats.duplicates, 10);
    let addrs: Vec<u64> = rest.iter().filter(|e| e.kind == EventKind::Alloc.code()).map(|e| e.addr).collect();
    assert_eq!(addrs, (0x1000 + 10..0x1000 + 16).collect::<Vec<_>>());
    // Committed (auto): the slots are free again.
    assert!(writer.push(&ev(17)));
}

#[test]
fn commit_frees_only_the_generations_it_names() {
    let (_ring, writer, mut reader) = setup(16);
    reader.auto_commit = false;
    for generation in 1..=2u64 {
        for i in 0..8 {
            assert!(writer.push(&ev(generation * 8 + i)));
        }
        reader.set_generation(generation);
        reader.poll(usize::MAX, false, |_| {});
    }
    assert!(!writer.push(&ev(99)), "full");
    reader.commit(1);
    assert_eq!(reader.uncommitted(), 8);
    for i in 0..8 {
        assert!(writer.push(&ev(100 + i)), "generation 1's slots are free");
    }
    assert!(!writer.push(&ev(200)), "generation 2's are not");
    reader.commit_all();
    assert!(writer.push(&ev(201)));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
    /// The fuzz target's body over random rings (cursors, counters, slots all random).
    #[test]
    fn any_ring_bytes_never_panic_the_reader(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8192)) {
        super::fuzzing::ring_reader(&data);
    }

    /// Rings whose slots hold plausible stamps (small laps, published or not), where the
    /// interesting paths are: published, consumed, reserved, garbage.
    #[test]
    fn rings_with_plausible_stamps_never_panic_the_reader(
        shape in 0u8..5, lanes in 0u8..5,
        cursors in proptest::collection::vec(0u64..64, 0..8),
        stamps in proptest::collection::vec((0u64..6, proptest::prelude::any::<u64>()), 0..512),
    ) {
        let mut data = vec![shape, lanes];
        let cursor_area = super::META_OFFSET - std::mem::offset_of!(super::RingHeader, write_pos);
        let mut header = vec![0u8; cursor_area];
        for (i, c) in cursors.iter().enumerate() {
            // The write cursor (offset 0) and the read cursor (offset 64) of lane 0, then
            // lanes 1.. in their own areas: whatever lands where is fine.
            let at = (i * 64) % (cursor_area - 8);
            header[at..at + 8].copy_from_slice(&c.to_le_bytes());
        }
        data.extend_from_slice(&header);
        for (stamp, word) in stamps {
            data.extend_from_slice(&stamp.to_le_bytes());
            data.extend_from_slice(&word.to_le_bytes());
            data.extend_from_slice(&[0u8; 48]);
        }
        super::fuzzing::ring_reader(&data);
    }
}

/// The time now in a ring of `clock_source`'s clock.
fn clock_now(clock_source: u32) -> u64 {
    if clock_source == vramhook_protocol::clock::ClockSource::Tsc as u32 {
        vramhook_protocol::clock::read_tsc()
    } else {
        vramhook_protocol::clock::monotonic_ns()
    }
}

#[test]
fn a_release_in_flight_holds_back_what_other_lanes_stamped_after_it() {
    for clock_source in
        [vramhook_protocol::clock::ClockSource::Monotonic as u32, vramhook_protocol::clock::ClockSource::Tsc as u32]
    {
        let (_ring, writer, mut reader) = setup_lanes(64, 4, clock_source);
        let mut freer = writer.own_lane(1);
        let t = clock_now(clock_source) - 1_000_000;
        // Lane 1's thread is inside cuMemFree, stamped t + 10 before the call ...
        unsafe { freer.begin_release(t + 10) };
        // ... and the driver hands the address to lane 2's thread, which records its
        // allocation (stamped after its call: later). Lane 3 recorded something before.
        assert!(writer.push_to_lane(2, &at(2, t + 20)));
        assert!(writer.push_to_lane(3, &at(3, t + 5)));
        let mut got = Vec::new();
        let stats = reader.poll(100, false, |e| got.push(e.ts_ns));
        assert_eq!(got, [t + 5], "clock {clock_source}: only what was stamped before the release");
        assert_eq!((stats.release_holds, stats.held), (1, 1));
        // The free returns: its event (stamped when it began), then the marker is cleared.
        let free = Event { kind: EventKind::Free.code(), ..Event::from_raw(&at(1, t + 10)) }.to_raw();
        unsafe {
            assert!(writer.push_exclusive(&mut freer, &free));
            freer.end_release();
        }
        let stats = reader.poll(100, false, |e| got.push(e.ts_ns));
        assert_eq!(got, [t + 5, t + 10, t + 20], "clock {clock_source}: the free before the allocation");
        assert_eq!(stats.release_holds, 0);
    }
}

#[test]
fn a_release_marker_too_old_or_of_a_gone_writer_holds_nothing() {
    for clock_source in
        [vramhook_protocol::clock::ClockSource::Monotonic as u32, vramhook_protocol::clock::ClockSource::Tsc as u32]
    {
        let (_ring, writer, mut reader) = setup_lanes(64, 2, clock_source);
        let stuck = writer.own_lane(1);
        let now = clock_now(clock_source);
        // A thread stuck in the driver (or killed there): a TSC ring's reader without a
        // calibrated clock counts 4 GHz at most, so 5e9 ticks are over the limit.
        let old = if clock_source == 0 { RELEASE_HOLD_MAX_NS + 1_000_000 } else { 5 * RELEASE_HOLD_MAX_NS };
        unsafe { stuck.begin_release(now - old) };
        assert!(writer.push_to_lane(0, &at(0, now - 1000)));
        let stats = reader.poll(100, false, |_| {});
        assert_eq!((stats.delivered, stats.release_holds), (1, 0), "clock {clock_source}: a stale marker");
        // A fresh marker of a writer that is gone: everything published comes out.
        unsafe { stuck.begin_release(now - 2000) };
        assert!(writer.push_to_lane(0, &at(0, now - 500)));
        let stats = reader.poll(100, true, |_| {});
        assert_eq!((stats.delivered, stats.release_holds), (1, 0), "clock {clock_source}: a gone writer");
    }
}

#[test]
fn a_reader_killed_before_saving_its_cursor_leaves_an_honest_ring() {
    let (mut ring, writer, first) = pushed_then_polled_by_a_reader_gone(16, usize::MAX);
    assert_eq!(first.len(), 16);
    // Killed after freeing the slots, before its cursor reached shared memory.
    unsafe { lane_read_pos(ring.base(), 0) }.store(0, Ordering::Release);
    for i in 16..21 {
        assert!(writer.push(&ev(i)), "the freed slots are reused");
    }
    let mut restarted = reader_again(&mut ring);
    restarted.check_claims(u64::MAX).expect("a write cursor 21 past a stale cursor 0 is honest here");
    let mut rest = Vec::new();
    restarted.poll(usize::MAX, false, |e| rest.push(e));
    assert_eq!(rest.iter().map(|e| e.seq).collect::<Vec<_>>(), (16..21).collect::<Vec<_>>());
}

#[test]
fn a_write_cursor_past_unread_slots_is_still_refused() {
    let (mut ring, writer, mut reader) = setup(16);
    for i in 0..16 {
        writer.push(&ev(i));
    }
    // The slots hold 16 unread events; a writer cannot be a lap and more past them.
    unsafe { lane_write_pos(ring.base(), 0) }.store(21, Ordering::Release);
    let err = reader.check_claims(u64::MAX).expect_err("unread slots passed");
    assert!(err.contains("more than a lap"), "{err}");
}

/// A metadata area is untrusted: a length beyond the area, or an area shorter than its
/// length word, is read within bounds, never past them.
#[test]
fn metadata_areas_are_read_within_their_bounds() {
    assert_eq!(parse_meta(&[]), (String::new(), Vec::new()));
    assert_eq!(parse_meta(&[1, 2, 3]), (String::new(), Vec::new()));
    let mut area = u64::MAX.to_le_bytes().to_vec();
    area.extend_from_slice(b"/bin/x\0x\0-v");
    assert_eq!(parse_meta(&area), ("/bin/x".to_string(), vec!["x".to_string(), "-v".to_string()]));
    let mut area = 6u64.to_le_bytes().to_vec();
    area.extend_from_slice(b"/bin/x\0x\0-v");
    assert_eq!(parse_meta(&area), ("/bin/x".to_string(), Vec::new()), "the stated length bounds it");
}
