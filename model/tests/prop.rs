//! Property tests: random event streams against the brute-force reference model.

use proptest::prelude::*;
use std::collections::BTreeMap;
use vramhook_model::*;
use vramhook_protocol::{Api, Event, EventKind, ProcessInfo};
use vramhook_testkit::reference::Reference;

#[derive(Clone, Debug)]
enum Op {
    Ev(Event),
    Info(u32, u64),
    Exit(u32, u64, Option<i32>),
    Segment(u32, i16, u64, u64, Vec<Block>),
}

const ALLOC_APIS: &[Api] = &[
    Api::cuMemAlloc_v2,
    Api::cuMemAllocPitch_v2,
    Api::cuMemAllocManaged,
    Api::cuMemAllocAsync,
    Api::cuMemAllocAsync_ptsz,
    Api::cuMemAllocFromPoolAsync,
    Api::cuArrayCreate_v2,
    Api::cuIpcOpenMemHandle_v2,
    Api::cuMemCreate,
];

fn sensible_api(kind: u8, sel: usize) -> u16 {
    let k = EventKind::from_code(kind);
    let list: &[Api] = match k {
        Some(EventKind::Alloc) => ALLOC_APIS,
        Some(EventKind::Free) => {
            &[Api::cuMemFree_v2, Api::cuMemFreeAsync, Api::cuArrayDestroy, Api::cuIpcCloseMemHandle]
        }
        Some(EventKind::VmmCreate) => &[Api::cuMemCreate, Api::cuMemCreate, Api::cuMemImportFromShareableHandle],
        Some(EventKind::VmmRelease) => &[Api::cuMemRelease],
        Some(EventKind::VmmReserve) => &[Api::cuMemAddressReserve],
        Some(EventKind::VmmAddressFree) => &[Api::cuMemAddressFree],
        Some(EventKind::VmmMap) => &[Api::cuMemMap],
        Some(EventKind::VmmUnmap) => &[Api::cuMemUnmap],
        Some(EventKind::PoolTrim) => &[Api::cuMemPoolTrimTo],
        Some(EventKind::PoolCreate) => &[Api::cuMemPoolCreate],
        Some(EventKind::PoolDestroy) => &[Api::cuMemPoolDestroy],
        Some(EventKind::MemInfo) => &[Api::cuMemGetInfo_v2],
        Some(EventKind::PoolSample) => &[Api::cuMemPoolGetAttribute],
        Some(EventKind::StreamCreate) => &[Api::cuStreamCreate, Api::cuStreamCreateWithPriority],
        Some(EventKind::StreamDestroy) => &[Api::cuStreamDestroy_v2, Api::cuStreamDestroy],
        _ => &[Api::Interposer],
    };
    list[sel % list.len()].code()
}

const SIZES: &[u64] = &[0x1000, 0x2000, 0x3000, 0x4000, 0x8000, 0x10000, 3 << 20, 0];

fn event_strategy() -> impl Strategy<Value = Event> {
    (
        (
            1u32..=2,
            1u32..=2,
            0u8..=80,
            0usize..100,
            0usize..16,
            prop::sample::select(vec![0u32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 1]),
        ),
        (0u64..14, 0usize..SIZES.len(), 0u64..6, 0u64..4, -1i16..=1, (-3i64..1000)),
    )
        .prop_map(|((pid, tid, kind_sel, api_sel, k2, result), (slot, size_i, handle, pool, device, dt))| {
            // Kinds weighted toward the interesting ones; a few unknown codes.
            use EventKind as K;
            const KINDS: [EventKind; 27] = [
                K::Alloc,
                K::Alloc,
                K::Alloc,
                K::Free,
                K::Free,
                K::VmmCreate,
                K::VmmCreate,
                K::VmmRelease,
                K::VmmReserve,
                K::VmmReserve,
                K::VmmAddressFree,
                K::VmmMap,
                K::VmmMap,
                K::VmmMap,
                K::VmmUnmap,
                K::VmmUnmap,
                K::PoolTrim,
                K::PoolCreate,
                K::PoolDestroy,
                K::MemInfo,
                K::ProcessStart,
                K::Frameworks,
                K::Dropped,
                K::Alloc,
                K::PoolSample,
                K::StreamCreate,
                K::StreamDestroy,
            ];
            let kind = match kind_sel {
                0 => 0,
                1 => 99,
                2 => EventKind::ProcessExit.code(),
                k => KINDS[(k as usize * 7 + api_sel) % KINDS.len()].code(),
            };
            let api = if api_sel < 93 {
                sensible_api(kind, k2)
            } else if api_sel < 97 {
                (api_sel as u16) % 30
            } else {
                777
            };
            let size = SIZES[size_i];
            let addr = if slot == 13 { u64::MAX - 0x1000 } else { 0x100000 + slot * 0x1000 };
            let addr = if kind == EventKind::MemInfo.code() { 6 << 20 } else { addr };
            Event {
                seq: 0,
                ts_ns: dt as u64, // replaced by a running clock below
                pid,
                tid,
                kind,
                api,
                caller: 0,
                result,
                device,
                size: if kind == EventKind::MemInfo.code() { 64 << 20 } else { size },
                aux: if kind == EventKind::ProcessStart.code() { handle } else { handle % 3 },
                // A `frameworks` record's mask: none, PyTorch, CuPy, both, JAX, ggml.
                addr: if kind == EventKind::Frameworks.code() { [0, 2, 4, 6, 8, 32][handle as usize] } else { addr },
                stream: pool,
            }
        })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => event_strategy().prop_map(Op::Ev),
        1 => (1u32..=3, 0u64..3).prop_map(|(p, s)| Op::Info(p, s)),
        1 => (1u32..=3, 0u64..3, prop::option::of(-2i32..2)).prop_map(|(p, s, x)| Op::Exit(p, s, x)),
        2 => (1u32..=3, 0i16..=1, 0u64..20, prop::collection::vec((0u64..16, 1u64..4, any::<bool>()), 0..5)).prop_map(
            |(p, d, slot, bl)| {
                let base = 0x100000 + slot * 0x1000;
                let blocks = bl.into_iter().map(|(o, s, a)| Block { addr: base + o * 0x400, size: s * 0x400, allocated: a }).collect();
                Op::Segment(p, d, base, 0x4000, blocks)
            }
        ),
    ]
}

fn apply_both(m: &mut Model, r: &mut Reference, op: &Op, clock: &mut u64) {
    match op {
        Op::Ev(e) => {
            let mut e = *e;
            // Mostly forward time; a small negative step sometimes (time going backwards).
            let dt = e.ts_ns as i64;
            *clock = (*clock as i64 + dt * 1_000_000).max(0) as u64;
            e.ts_ns = *clock;
            m.apply(&e);
            r.apply(&e);
        }
        Op::Info(pid, st) => {
            let info = ProcessInfo {
                pid: *pid,
                ppid: 1,
                uid: 0,
                start_time: *st,
                run_id: 0,
                exe: "/usr/bin/python3".into(),
                cmdline: vec!["python3".into(), format!("job{pid}.py")],
            };
            m.process_info(&info);
            r.process_info(&info);
        }
        Op::Exit(pid, st, status) => {
            m.process_exit(*pid, *st, *status, *clock);
            r.process_exit(*pid, *st, *status, *clock);
        }
        Op::Segment(pid, d, base, size, blocks) => {
            m.framework_segment(*pid, *d, *base, *size, blocks, *clock);
            r.framework_segment(*pid, *d, *base, *size, blocks, *clock);
        }
    }
}

fn blank(mut s: ModelSnapshot) -> ModelSnapshot {
    for i in &mut s.incidents {
        // Text, checked by the scenario tests; the numbers behind it are compared here.
        i.explanation.clear();
        i.fix.clear();
    }
    // The fit (issue 30) is not mirrored in the reference: it is a derived figure over
    // demand windows and device samples, tested on its own in model/tests/fit.rs.
    for p in &mut s.processes {
        p.fit.clear();
    }
    s
}

/// The lowest and highest value of each total since its last take, as the test sees them
/// (after each operation): a taken window must span at least that.
struct Seen<K> {
    last: BTreeMap<K, u64>,
    range: BTreeMap<K, (u64, u64)>,
}

impl<K: Ord + Copy + std::fmt::Debug> Seen<K> {
    fn new() -> Seen<K> {
        Seen { last: BTreeMap::new(), range: BTreeMap::new() }
    }

    fn observe(&mut self, now: BTreeMap<K, u64>) {
        for (k, v) in &now {
            if self.last.get(k).copied().unwrap_or(0) != *v {
                let r = self.range.entry(*k).or_insert((u64::MAX, 0));
                *r = (r.0.min(*v), r.1.max(*v));
            }
        }
        self.last = now;
    }

    fn check(&mut self, key: K, live: u64, window: Option<Window>) -> Result<(), TestCaseError> {
        prop_assert_eq!(live, self.last.get(&key).copied().unwrap_or(0), "{:?}: total", key);
        if let Some((lo, hi)) = self.range.remove(&key) {
            let w = window.ok_or_else(|| TestCaseError::fail(format!("{key:?} changed, yet no window")))?;
            prop_assert!(w.min <= lo && w.max >= hi, "{:?}: window {}..{} misses {}..{}", key, w.min, w.max, lo, hi);
        }
        Ok(())
    }
}

fn config() -> ModelConfig {
    ModelConfig { incident_window_events: 8, granularity: 0x2000, ..ModelConfig::default() }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Every metric equals the reference after every event.
    #[test]
    fn matches_reference(ops in prop::collection::vec(op_strategy(), 1..120)) {
        let mut m = Model::new(config());
        let mut r = Reference::new(config());
        let mut clock = 1_000_000_000u64;
        let mut seen_devices = Seen::new();
        let mut seen_processes = Seen::new();
        for (i, op) in ops.iter().enumerate() {
            apply_both(&mut m, &mut r, op, &mut clock);
            let (a, b) = (blank(m.snapshot()), r.snapshot());
            prop_assert_eq!(&a, &b, "after op {} {:?}", i, op);
            prop_assert_eq!(m.layout(None), r.layout(None));
            for pid in 1..=3 {
                prop_assert_eq!(m.layout(Some(pid)), r.layout(Some(pid)));
                prop_assert_eq!(m.largest_free_span(pid), r.largest_free_span(pid));
            }
            // Device totals are the processes' bytes summed; the windows of devices and
            // processes, taken every third operation, span what was seen since the last take.
            let mut sums: BTreeMap<i16, u64> = BTreeMap::new();
            for d in a.processes.iter().flat_map(|p| &p.devices) {
                *sums.entry(d.device).or_default() += d.live_bytes;
            }
            seen_devices.observe(sums);
            seen_processes.observe(a.processes.iter().enumerate().map(|(i, p)| (i, p.live_bytes)).collect());
            let mut probe = m.clone();
            let take = i % 3 == 0;
            let target = if take { &mut m } else { &mut probe };
            for w in target.take_device_windows() {
                prop_assert!(w.peak >= w.live);
                if take {
                    seen_devices.check(w.device, w.live, w.window)?;
                } else {
                    prop_assert_eq!(w.live, seen_devices.last.get(&w.device).copied().unwrap_or(0));
                }
            }
            for slot in 0..a.processes.len() {
                let (live, window) = target.take_process_window(slot).ok_or_else(|| TestCaseError::fail("slot"))?;
                if take {
                    seen_processes.check(slot, live, window)?;
                } else {
                    prop_assert_eq!(live, a.processes[slot].live_bytes);
                }
            }
            // The sampling snapshot is the full one without histograms and incidents.
            let mut numbers = m.snapshot_numbers();
            prop_assert!(numbers.incidents.is_empty());
            numbers.incidents = a.incidents.clone();
            for (p, q) in numbers.processes.iter_mut().zip(&a.processes) {
                p.size_histogram = q.size_histogram.clone();
                p.age_histogram = q.age_histogram.clone();
            }
            prop_assert_eq!(&blank(numbers), &a);
            for inc in &a.incidents {
                prop_assert!(!m.incidents()[inc.id as usize - 1].explanation.is_empty());
            }
        }
    }

    /// Restoring a checkpoint taken anywhere, then applying the rest, equals applying everything.
    #[test]
    fn checkpoint_round_trip(ops in prop::collection::vec(op_strategy(), 1..100), cut in 0usize..100) {
        let cut = cut.min(ops.len());
        let mut whole = Model::new(config());
        let mut r = Reference::new(config());
        let mut clock = 1_000_000_000u64;
        let mut clock2 = 0;
        let mut restored = None;
        for (i, op) in ops.iter().enumerate() {
            if i == cut {
                restored = Some(Model::restore(&whole.checkpoint()).expect("restore"));
                clock2 = clock;
            }
            apply_both(&mut whole, &mut r, op, &mut clock);
        }
        let mut restored = restored.unwrap_or_else(|| Model::restore(&whole.checkpoint()).expect("restore"));
        if cut < ops.len() {
            let mut dummy = Reference::new(config());
            for op in &ops[cut..] {
                apply_both(&mut restored, &mut dummy, op, &mut clock2);
            }
        }
        prop_assert_eq!(restored.snapshot(), whole.snapshot());
        prop_assert_eq!(restored.layout(None), whole.layout(None));
    }

    /// Pure garbage never panics.
    #[test]
    fn garbage_never_panics(raw in prop::collection::vec(any::<[u64; 8]>(), 1..200)) {
        let mut m = Model::default();
        for w in raw {
            let e = Event {
                seq: w[0], ts_ns: w[1], pid: (w[2] % 4) as u32, tid: (w[2] >> 32) as u32,
                kind: (w[3] % 20) as u8, api: (w[3] >> 8) as u16 % 32, caller: (w[3] >> 24) as u8,
                result: (w[3] >> 32) as u32 % 4, device: (w[3] >> 48) as i16,
                addr: w[4], size: w[5], aux: w[6] % 8, stream: w[7] % 4,
            };
            m.apply(&e);
        }
        m.process_exit(1, 0, Some(0), u64::MAX);
        let _ = m.snapshot();
        let _ = m.layout(None);
        let _ = Model::restore(&m.checkpoint()).expect("restore");
    }
}

#[test]
fn restore_rejects_bad_bytes() {
    assert!(matches!(Model::restore(&[]), Err(ModelError::Empty)));
    assert!(matches!(Model::restore(&[99, 1, 2]), Err(ModelError::Version(99))));
    assert!(Model::restore(&[CHECKPOINT_VERSION, 1, 2, 3]).is_err());
}
