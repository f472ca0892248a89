//! Model vs brute-force reference, side by side:
//! `cargo bench -p vramhook-model --bench model` (or `scripts/bench/run.sh model`)
//!
//! 1. events/s for an alloc/free stream holding 100,000 live allocations;
//! 2. heap bytes per live allocation (counting global allocator);
//! 3. `largest_free_span` query time at 10, 1,000 and 100,000 gaps;
//! 4. a snapshot's CPU per process (fit of the next large request included, as the agent
//!    takes it four times a second) at 10 and at 1,000 processes, and their ratio.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;
use vramhook_model::*;
use vramhook_protocol::{Api, Event};
use vramhook_testkit::reference::Reference;

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n, Relaxed);
        LIVE.fetch_sub(l.size(), Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

const LIVE_ALLOCS: usize = 100_000;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `e` made by process 1 at `ts` (also its sequence number), on device 0.
fn ev(e: Event, ts: u64) -> Event {
    e.by(1, 1).at(ts).with_seq(ts).on_device(0)
}

/// Populate events, then a stream that frees a random live allocation and allocates a new one.
fn workload(stream_len: usize) -> (Vec<Event>, Vec<Event>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut next_addr = 0x7f00_0000_0000u64;
    let mut slots = Vec::with_capacity(LIVE_ALLOCS);
    let mut populate = Vec::with_capacity(LIVE_ALLOCS);
    let mut ts = 1;
    for _ in 0..LIVE_ALLOCS {
        let size = 512 << (rng.next() % 16);
        populate.push(ev(Event::alloc(Api::cuMemAlloc_v2, next_addr, size), ts));
        slots.push(next_addr);
        next_addr += 1 << 24;
        ts += 1;
    }
    let mut stream = Vec::with_capacity(stream_len);
    while stream.len() < stream_len {
        let i = (rng.next() % LIVE_ALLOCS as u64) as usize;
        stream.push(ev(Event::free(Api::cuMemFree_v2, slots[i]), ts));
        let size = 512 << (rng.next() % 16);
        stream.push(ev(Event::alloc(Api::cuMemAlloc_v2, next_addr, size), ts + 1));
        slots[i] = next_addr;
        next_addr += 1 << 24;
        ts += 2;
    }
    (populate, stream)
}

fn segment_with_gaps(gaps: usize) -> (u64, u64, Vec<Block>) {
    // `gaps` allocated blocks of 4 KiB, each followed by a free 4 KiB (the last gap 8 KiB).
    let base = 0x1_0000_0000u64;
    let blocks: Vec<Block> =
        (0..gaps as u64).map(|i| Block { addr: base + i * 8192, size: 4096, allocated: true }).collect();
    (base, gaps as u64 * 8192 + 4096, blocks)
}

fn time_per_query(iters: u32, mut f: impl FnMut() -> u64) -> f64 {
    let t = Instant::now();
    let mut acc = 0u64;
    for _ in 0..iters {
        acc = acc.wrapping_add(black_box(f()));
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// A model of `n` processes on device 0, each with 32 live allocations of varied sizes (its
/// demand in the fit window) and a device sample: a snapshot's CPU per process, best of 5.
fn snapshot_ns_per_process(n: usize) -> f64 {
    let mut m = Model::default();
    let mut ts = 1u64;
    let mut addr = 0x7f00_0000_0000u64;
    for pid in 1..=n as u32 {
        m.apply(&Event::process_start(0, 0).by(pid, 1).at(ts).on_device(0));
        for k in 0..32u64 {
            ts += 1;
            let size = (1 << 20) << (k % 8);
            m.apply(&Event::alloc(Api::cuMemAlloc_v2, addr, size).by(pid, 1).at(ts).on_device(0));
            addr += 1 << 30;
        }
        ts += 1;
        m.apply(&Event::mem_info(40 << 30, 141 << 30).by(pid, 1).at(ts).on_device(0));
    }
    let snap = m.snapshot();
    assert_eq!(snap.processes.len(), n);
    assert!(snap.processes.iter().all(|p| !p.fit.is_empty()), "every process has a fit");
    let rounds = (20_000 / n).max(5) as u32;
    (0..5)
        .map(|_| time_per_query(rounds, || m.snapshot().processes.len() as u64) / n as f64)
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let (populate, stream) = workload(4_000_000);

    // --- model: memory per live allocation, then throughput (best of 3) ---
    let mut model_eps: f64 = 0.0;
    let mut model_bytes = 0.0;
    for round in 0..3 {
        let before = LIVE.load(Relaxed);
        let mut m = Model::default();
        m.apply(&ev(Event::process_start(0, 0), 0));
        for e in &populate {
            m.apply(e);
        }
        if round == 0 {
            model_bytes = (LIVE.load(Relaxed) - before) as f64 / m.live_allocation_count() as f64;
        }
        let t = Instant::now();
        for e in &stream {
            m.apply(e);
        }
        let eps = stream.len() as f64 / t.elapsed().as_secs_f64();
        assert_eq!(m.live_allocation_count(), LIVE_ALLOCS);
        model_eps = model_eps.max(eps);
        black_box(&m);
    }

    // --- reference: same populate, short stream (it is O(n) per event) ---
    let before = LIVE.load(Relaxed);
    let mut r = Reference::new(ModelConfig::default());
    let t_pop = Instant::now();
    for e in &populate {
        r.apply(e);
    }
    let ref_populate_s = t_pop.elapsed().as_secs_f64();
    let ref_bytes = (LIVE.load(Relaxed) - before) as f64 / LIVE_ALLOCS as f64;
    let ref_stream = &stream[..2_000];
    let t = Instant::now();
    for e in ref_stream {
        r.apply(e);
    }
    let ref_eps = ref_stream.len() as f64 / t.elapsed().as_secs_f64();

    // --- largest_free_span query cost ---
    let mut span = vec![];
    for gaps in [10usize, 1_000, 100_000] {
        let (base, size, blocks) = segment_with_gaps(gaps);
        let mut m = Model::default();
        m.framework_segment(1, 0, base, size, &blocks, 0);
        let mut r = Reference::new(ModelConfig::default());
        r.framework_segment(1, 0, base, size, &blocks, 0);
        assert_eq!(m.largest_free_span(1), r.largest_free_span(1));
        let mq = time_per_query(1_000_000, || m.largest_free_span(black_box(1)));
        let rq = time_per_query(if gaps > 10_000 { 20 } else { 2_000 }, || r.largest_free_span(black_box(1)));
        span.push((gaps, mq, rq));
    }

    // --- snapshot cost per process, 10 vs 1,000 processes ---
    let per_process: Vec<(usize, f64)> =
        [10usize, 1_000].into_iter().map(|n| (n, snapshot_ns_per_process(n))).collect();
    let snapshot_ratio = per_process[1].1 / per_process[0].1;

    println!("vramhook-model benchmark (one core, release)");
    println!("{:<52} {:>16} {:>16}", "", "model", "reference");
    println!(
        "{:<52} {:>16.0} {:>16.0}",
        format!("alloc/free events/s, {LIVE_ALLOCS} live allocations"),
        model_eps,
        ref_eps
    );
    println!("{:<52} {:>16.1} {:>16.1}", "heap bytes per live allocation", model_bytes, ref_bytes);
    for (g, mq, rq) in &span {
        println!("{:<52} {:>16.1} {:>16.1}", format!("largest_free_span ns/query, {g} gaps"), mq, rq);
    }
    for (n, ns) in &per_process {
        println!("{:<52} {:>16.0}", format!("snapshot ns per process, {n} processes (fit included)"), ns);
    }
    println!("snapshot cost per process, 1,000 vs 10 processes: {snapshot_ratio:.2}x (target <= 2)");
    println!(
        "(reference: populate of {LIVE_ALLOCS} took {ref_populate_s:.1} s; stream timed over {} events)",
        ref_stream.len()
    );
    println!(
        "{{\"live_allocations\":{LIVE_ALLOCS},\"model_events_per_s\":{model_eps:.0},\"reference_events_per_s\":{ref_eps:.0},\
\"model_bytes_per_live_alloc\":{model_bytes:.1},\"reference_bytes_per_live_alloc\":{ref_bytes:.1},\
\"model_span_ns\":{{\"10\":{:.1},\"1000\":{:.1},\"100000\":{:.1}}},\"reference_span_ns\":{{\"10\":{:.1},\"1000\":{:.1},\"100000\":{:.1}}},\
\"snapshot_ns_per_process\":{{\"10\":{:.0},\"1000\":{:.0}}},\"snapshot_ratio\":{snapshot_ratio:.2},\
\"targets\":{{\"events_per_s\":10000000,\"bytes_per_live_alloc\":96,\"snapshot_ratio\":2}}}}",
        span[0].1, span[1].1, span[2].1, span[0].2, span[1].2, span[2].2, per_process[0].1, per_process[1].1
    );
}
