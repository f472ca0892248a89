//! The ingest loop: one thread owns the ring source and the host's live model, applies
//! every drained event, and publishes a snapshot for the sinks every `snapshot_interval`.
//! Sinks never block it: the capture gets a bounded queue, OTLP incidents a bounded
//! channel, everyone else reads the published snapshot.

use crate::capture::{CaptureHandle, CaptureMsg, Recovered, RingKey};
use crate::rings::{process_alive, RingFilter, RingSource, SourceItem};
use crate::stats::{add, AgentStats};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vramhook_model::{Model, ModelSnapshot};
use vramhook_protocol::clock::TscClock;
use vramhook_protocol::record::{Api, Event, EventKind};

#[derive(Clone, Debug)]
pub struct IngestConfig {
    pub ring_dir: PathBuf,
    pub snapshot_interval: Duration,
    /// Longest sleep when no ring has anything (also the discovery period without inotify).
    pub idle_poll: Duration,
    /// Directory rescan period while inotify works (a safety net).
    pub rescan: Duration,
    pub checkpoint_interval: Duration,
    /// Events drained per ring per poll.
    pub batch_limit: usize,
    /// Also drain rings that belong to a `vramhook run` session (stamped with a run id).
    pub include_run_rings: bool,
    /// Processes that exited longer ago than this are forgotten (with their incidents), so
    /// that memory does not grow with every process that ever ran on the host.
    pub forget_exited_after: Duration,
    /// OOM incidents the live model keeps (the oldest are forgotten past it; each was
    /// counted and exported when it happened): a process that fails on request after request
    /// for days would otherwise grow the model and every snapshot's copy of it.
    pub incidents_kept: usize,
    /// Largest ring file accepted (bigger ones are refused before they are mapped).
    pub max_ring_bytes: u64,
    /// eBPF mode: also trace through uprobes on libcuda (see `crate::ebpf`).
    pub ebpf: Option<crate::ebpf::EbpfConfig>,
    /// NVML's per-process usage is read this often, and right after a poll that opened an
    /// OOM incident (see `crate::nvml`); zero: never.
    pub nvml_interval: Duration,
}

impl IngestConfig {
    pub fn new(ring_dir: impl Into<PathBuf>) -> IngestConfig {
        IngestConfig {
            ring_dir: ring_dir.into(),
            snapshot_interval: Duration::from_millis(250),
            idle_poll: Duration::from_millis(10),
            rescan: Duration::from_secs(1),
            checkpoint_interval: Duration::from_secs(10),
            batch_limit: 4096,
            include_run_rings: false,
            forget_exited_after: Duration::from_secs(600),
            incidents_kept: 1000,
            max_ring_bytes: vramhook_protocol::ring::DEFAULT_MAX_RING_BYTES,
            ebpf: None,
            nvml_interval: Duration::from_secs(5),
        }
    }
}

/// Everything the ingest thread talks to.
pub struct IngestLinks {
    pub stats: Arc<AgentStats>,
    pub snapshots: tokio::sync::watch::Sender<Arc<ModelSnapshot>>,
    pub incidents: Option<tokio::sync::mpsc::Sender<crate::otlp::Notice>>,
    pub capture: Option<CaptureHandle>,
    pub stop: Arc<AtomicBool>,
    /// eBPF mode: the probes, loaded and attached by the caller (errors reported there).
    pub ebpf: Option<vramhook_ebpf::source::EbpfSource>,
}

struct Watcher {
    inotify: inotify::Inotify,
    buf: Vec<u8>,
}

impl Watcher {
    fn new(dir: &std::path::Path) -> Option<Watcher> {
        use inotify::WatchMask;
        let inotify = inotify::Inotify::init().ok()?;
        // MOVED_TO: a writer that makes its ring under a temporary name and renames it
        // once complete; CREATE and CLOSE_WRITE: one that makes it in place.
        inotify
            .watches()
            .add(
                dir,
                WatchMask::CREATE
                    | WatchMask::MOVED_TO
                    | WatchMask::CLOSE_WRITE
                    | WatchMask::ATTRIB
                    | WatchMask::DONT_FOLLOW
                    | WatchMask::ONLYDIR,
            )
            .ok()?;
        Some(Watcher { inotify, buf: vec![0; 4096] })
    }

    /// Sleeps up to `timeout`, waking at once when something happens in the directory.
    fn wait(&self, timeout: Duration) {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd { fd: self.inotify.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one pollfd on our own inotify descriptor.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }

    /// Whether anything happened in the directory since the last call (non-blocking).
    fn changed(&mut self) -> bool {
        let mut any = false;
        while let Ok(mut events) = self.inotify.read_events(&mut self.buf) {
            if events.next().is_none() {
                break;
            }
            any = true;
        }
        any
    }
}

/// Runs the ingest loop on the calling thread until `links.stop` is set. Returns the ring
/// source, still holding its rings, so that the caller marks them recorded once the
/// capture has written what was sent ([`RingSource::mark_recorded`]).
pub fn run(cfg: IngestConfig, recovered: Option<Recovered>, mut links: IngestLinks) -> RingSource {
    let tsc = TscClock::calibrate(Duration::from_millis(10));
    let stats = links.stats.clone();
    let mut source = RingSource::new(&cfg.ring_dir, RingFilter::default(), tsc);
    source.batch_limit = cfg.batch_limit;
    source.auto_discover = false;
    source.liveness_interval = Duration::from_millis(100);
    source.skip_run_rings = !cfg.include_run_rings;
    // Close a ring when its process is gone, not when it says it is exiting: threads and
    // destructors may still write after the exit mark.
    source.trust_exit_mark = false;
    source.max_ring_bytes = cfg.max_ring_bytes;
    // A closed ring's file goes only once the capture holds its events (see below).
    source.defer_removals = links.capture.is_some();
    // Parent 1777 (sticky), ours 0700; `crate::run` has already refused a bad directory.
    // SAFETY: geteuid has no preconditions.
    let _ = vramhook_protocol::ringdir::make_ring_dir(&cfg.ring_dir, unsafe { libc::geteuid() });
    let mut watcher = Watcher::new(&cfg.ring_dir);
    if watcher.is_none() {
        eprintln!(
            "vramhook agent: inotify unavailable on {}; polling every {:?}",
            cfg.ring_dir.display(),
            cfg.idle_poll
        );
    }

    let (mut model, mut recorded, mut ended) = match recovered {
        Some(r) => {
            add(&stats.events_recovered, r.events);
            add(&stats.dropped_recovered, r.model.snapshot().processes.iter().map(|p| p.dropped_events).sum());
            (r.model, r.rings, r.ended)
        }
        None => (Model::new(crate::model_config()), BTreeMap::new(), BTreeSet::new()),
    };
    model.set_incident_cap(cfg.incidents_kept);
    let recovered_rings: BTreeSet<RingKey> = recorded.keys().copied().collect();
    // Writer drops recorded per ring (compared with what the ring says was reported).
    let mut drops: BTreeMap<RingKey, u64> = recorded.iter().map(|(k, c)| (*k, c.drops_reported)).collect();
    // Incidents of a recovered model were counted and exported by the agent before.
    let mut incidents = crate::oom_counts::IncidentTracker::seeded(&model.snapshot());
    // Likewise the fit's crossings of 1 (one log record each).
    let mut fits = crate::fit_crossings::FitTracker::seeded(&model.snapshot());
    let capture = links.capture.clone();
    // Commits: a poll's events leave the rings only once the capture has flushed them
    // (the capture thread acknowledges each poll's generation after its flush), so that
    // an agent killed meanwhile loses nothing; the next one skips what was recorded.
    source.deferred_commit = capture.is_some();
    let flushed = Arc::new(AtomicU64::new(0));
    if let Some(c) = &capture {
        c.send(CaptureMsg::Checkpoint {
            model: model.checkpoint(),
            rings: recorded.values().cloned().collect(),
            ended: ended.iter().copied().collect(),
            rotate: true,
        });
    }
    crate::pause_point("first-checkpoint");

    let mut last_snapshot = Instant::now() - cfg.snapshot_interval;
    let mut last_checkpoint = Instant::now();
    let mut last_forget = Instant::now();
    let mut last_scan = Instant::now() - cfg.rescan;
    // A change seen but not yet scanned for (scans are at least `MIN_SCAN_GAP` apart, so
    // that a user churning files in the directory cannot keep the agent scanning).
    let mut scan_due = false;
    let mut first = true;
    // Rings opened but not yet announced, with their cursor at open.
    let mut pending: BTreeMap<RingKey, u64> = BTreeMap::new();
    // Per pid, the ring last announced to the capture.
    let mut announced: BTreeMap<u32, RingKey> = BTreeMap::new();
    let mut idle = Duration::from_millis(1);
    let mut ebpf = links.ebpf.take();
    let mut nvml = crate::nvml::Feed::spawn(cfg.nvml_interval, "vramhook agent", true);
    while !links.stop.load(Ordering::Relaxed) {
        scan_due |= watcher.as_mut().is_some_and(Watcher::changed);
        let period = if watcher.is_some() { cfg.rescan } else { cfg.idle_poll };
        // A ring found before its writer finished it is looked at again at the next tick.
        let retry = source.waiting() > 0;
        let since = last_scan.elapsed();
        if ((scan_due || retry) && since >= MIN_SCAN_GAP) || since >= period {
            last_scan = Instant::now();
            scan_due = false;
            for opened in source.discover_now() {
                let key = (opened.pid, opened.start_time, opened.image);
                if ended.contains(&key) {
                    // Recorded to its end by the previous agent, which died before removing it.
                    source.discard(key);
                    continue;
                }
                add(&stats.rings_opened, 1);
                pending.insert(key, opened.drops_reported);
                if let Some(r) = recorded.remove(&key) {
                    source.set_recorded(key, r.slots, r.unconfirmed);
                }
            }
            report_refusals(&mut source, &stats);
            report_run_rings(&mut source, &stats);
            if !pending.is_empty() {
                crate::pause_point("discovered");
            }
            if first {
                first = false;
                // Processes the recovered model thinks alive whose ring is gone: their end
                // was drained by the previous agent but never recorded.
                let open: BTreeSet<RingKey> = source.ring_positions().into_iter().map(|(k, _)| k).collect();
                for key in recovered_rings.iter().filter(|k| !open.contains(k)) {
                    if !process_alive(key.0, key.1) {
                        model.process_exit(key.0, key.1, None, vramhook_protocol::clock::monotonic_ns());
                    }
                }
            }
        }
        if source.deferred_commit {
            source.commit(flushed.load(Ordering::Acquire));
        }
        let mut marked = 0;
        let opened = model.incident_count() as u64 + model.incidents_forgotten();
        let summary = {
            let marked = &mut marked;
            let model = &mut model;
            let capture = &capture;
            let stats = &stats;
            let pending = &mut pending;
            let drops = &mut drops;
            let (ended, announced) = (&mut ended, &mut announced);
            source.poll(&mut |item| match item {
                SourceItem::Process(info) => {
                    // The ring announced now is the lowest pending image of this process;
                    // its note goes right before its process frame, after any events of
                    // an older image, so a replay attributes every event to its ring.
                    let key = pending
                        .range((info.pid, info.start_time, 0)..=(info.pid, info.start_time, u64::MAX))
                        .next()
                        .map(|(k, _)| *k);
                    // Writer drops an earlier reader reported but never recorded (its
                    // `Dropped` marker died with it).
                    let mut unrecorded = 0;
                    if let Some(key) = key {
                        let drops_reported = pending.remove(&key).unwrap_or(0);
                        if let Some(c) = capture {
                            c.send(CaptureMsg::Ring(key));
                        }
                        announced.insert(key.0, key);
                        unrecorded = drops_reported.saturating_sub(drops.remove(&key).unwrap_or(0));
                    }
                    model.process_info(info);
                    if let Some(c) = capture {
                        c.send(CaptureMsg::Process(info.clone()));
                    }
                    // Their marker follows the process frame: before it, it counted on the
                    // pid's previous process (pid reuse), or on none where that one had ended.
                    // They took no slot (aux 0).
                    if unrecorded > 0 {
                        let mut marker = lost_marker(info.pid, 0, unrecorded);
                        marker.aux = 0;
                        model.apply(&marker);
                        add(&stats.restart_lost, unrecorded);
                        if let Some(c) = capture {
                            c.send(CaptureMsg::Events(vec![marker]));
                        }
                    }
                    crate::pause_point("announced");
                }
                SourceItem::Events(events) => {
                    for e in events {
                        model.apply(e);
                    }
                    *marked += crate::stats::dropped_marked(events);
                    add(&stats.events_ingested, events.len() as u64);
                    if let Some(c) = capture {
                        c.send(CaptureMsg::Events(events.to_vec()));
                    }
                }
                SourceItem::End(end) => {
                    // The ring a process's end closes is its last one announced (as a
                    // replay of the capture reads it).
                    if let Some(key) = announced.remove(&end.pid) {
                        ended.insert(key);
                    }
                    add(&stats.records_malformed, end.malformed);
                    model.process_exit(end.pid, end.start_time, end.exit_status, end.ts_ns);
                    add(&stats.rings_closed, 1);
                    if let Some(c) = capture {
                        c.send(CaptureMsg::End(end));
                    }
                    crate::pause_point("ring-ended");
                }
            })
        };
        report_refusals(&mut source, &stats);
        if summary.delivered > 0 {
            crate::pause_point("polled");
        }
        // eBPF mode: the probes' events, after the rings' (a pid with a ring is the ring's).
        let ebpf_delivered = match ebpf.as_mut() {
            Some(src) => {
                let ring_pid = |pid: u32| {
                    announced.contains_key(&pid)
                        || pending.range((pid, 0, 0)..=(pid, u64::MAX, u64::MAX)).next().is_some()
                };
                crate::ebpf::drain(src, &mut model, &capture, &stats, &ring_pid)
            }
            None => 0,
        };
        // NVML, read on its own thread: asked again when this poll opened an OOM incident,
        // whose snapshot then waits for that read (`Feed::owed`).
        if let Some(n) = &mut nvml {
            let failure = model.incident_count() as u64 + model.incidents_forgotten() > opened;
            apply_synthetic(n.poll(failure), &mut model, &capture);
        }
        if let (Some(c), true) = (&capture, summary.delivered > 0) {
            let (flushed, generation) = (flushed.clone(), source.generation());
            let ack: Box<dyn FnOnce() + Send> = Box::new(move || {
                flushed.fetch_max(generation, Ordering::Release);
            });
            if let Err(now) = c.then(ack) {
                now(); // the queue is full: what did not fit is counted as capture loss
            }
        }
        add(&stats.events_refused, summary.foreign);
        add(&stats.duplicates_skipped, summary.duplicates);
        add(&stats.restart_lost, summary.skipped);
        add(&stats.writer_dropped, summary.dropped);
        add(&stats.dropped_in_ring, crate::stats::dropped_in_ring(marked, &summary));
        stats.rings_open.store(source.open_rings() as u64, Ordering::Relaxed);
        remove_when_recorded(&mut source, &capture);
        if let Some(c) = &capture {
            // No checkpoint while a loss is not marked yet (see `mark_missing`).
            let marked = c.mark_missing();
            let rotate = c.rotate_wanted.load(Ordering::Relaxed);
            if marked && (rotate || last_checkpoint.elapsed() >= cfg.checkpoint_interval) {
                last_checkpoint = Instant::now();
                // Rings recorded to their end are named until their files are gone.
                ended.retain(|key| source.ring_file_exists(*key));
                c.send(CaptureMsg::Checkpoint {
                    model: model.checkpoint(),
                    rings: source.ring_cursors(),
                    ended: ended.iter().copied().collect(),
                    rotate,
                });
                crate::pause_point("checkpoint-sent");
            }
        }
        // A process that ended is published at once (its series end with it).
        let owed = nvml.as_mut().is_some_and(crate::nvml::Feed::owed);
        if !owed && (summary.closed > 0 || last_snapshot.elapsed() >= cfg.snapshot_interval) {
            last_snapshot = Instant::now();
            publish(&model, &links, &mut incidents, &mut fits);
            // Only right after a publish: whatever is forgotten (an exited process with its
            // incidents) has been published, its incidents counted and exported, first.
            let every = cfg.forget_exited_after.clamp(Duration::from_millis(100), Duration::from_secs(10));
            if last_forget.elapsed() >= every {
                last_forget = Instant::now();
                let retention = u64::try_from(cfg.forget_exited_after.as_nanos()).unwrap_or(u64::MAX);
                model.forget_exited(model.now_ns().saturating_sub(retention));
            }
        }
        if summary.delivered as usize >= cfg.batch_limit {
            idle = Duration::ZERO; // more is waiting
        } else if summary.delivered > 0 || ebpf_delivered > 0 {
            idle = Duration::from_millis(1);
        } else if source.waiting() > 0 || scan_due {
            idle = Duration::from_millis(1); // a ring is being made: look again soon
        } else {
            idle = (idle * 2).clamp(Duration::from_millis(1), cfg.idle_poll);
        }
        if !idle.is_zero() {
            match &watcher {
                Some(w) => w.wait(idle),
                None => std::thread::sleep(idle),
            }
        }
    }
    // Detach every probe before the last snapshot (nothing stays in the kernel).
    if let Some(src) = ebpf.take() {
        drop(src);
        stats.ebpf_links.store(0, Ordering::Relaxed);
        eprintln!("vramhook agent: eBPF probes detached");
    }
    // Drain what is left, publish a last snapshot and checkpoint.
    publish(&model, &links, &mut incidents, &mut fits);
    if let Some(c) = &capture {
        // The losses not marked yet go in before the last checkpoint (its cursors count
        // their slots). While the queue stays full there is no last checkpoint: the next
        // agent then finds those slots unaccounted for and reports them lost.
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut marked = c.mark_missing();
        while !marked && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            marked = c.mark_missing();
        }
        ended.retain(|key| source.ring_file_exists(*key));
        if marked {
            c.send(CaptureMsg::Checkpoint {
                model: model.checkpoint(),
                rings: source.ring_cursors(),
                ended: ended.iter().copied().collect(),
                rotate: false,
            });
        }
    }
    remove_when_recorded(&mut source, &capture);
    source
}

/// Removes the files of the rings closed in the last poll once the capture has written
/// their events (the capture thread runs the removal after its next flush), so that an
/// agent killed in between leaves the ring for the next one to count what it lost.
fn remove_when_recorded(source: &mut RingSource, capture: &Option<CaptureHandle>) {
    for removal in source.take_removals() {
        match capture {
            Some(c) => {
                let remove: Box<dyn FnOnce() + Send> = Box::new(move || {
                    removal.run();
                    crate::pause_point("ring-removed");
                });
                if let Err(now) = c.then(remove) {
                    now();
                }
            }
            None => removal.run(),
        }
    }
}

/// Least time between two directory scans triggered by inotify or by a ring not yet ready.
const MIN_SCAN_GAP: Duration = Duration::from_millis(2);

/// Counts and reports the rings refused (at the door) or closed as hostile since the last
/// call, one line each.
fn report_refusals(source: &mut RingSource, stats: &AgentStats) {
    for refusal in source.take_refusals() {
        if refusal.hostile {
            add(&stats.rings_hostile, 1);
            eprintln!("vramhook agent: closing hostile ring {}: {}", refusal.path.display(), refusal.reason);
        } else {
            add(&stats.rings_refused, 1);
            eprintln!("vramhook agent: refusing ring {}: {}", refusal.path.display(), refusal.reason);
        }
    }
}

/// Lists the processes left to `vramhook run` sessions in the agent's counters (state,
/// `/metrics`, `top`), and says once per ring in the log how to watch them here instead.
fn report_run_rings(source: &mut RingSource, stats: &AgentStats) {
    for run in source.take_new_run_rings() {
        eprintln!(
            "vramhook agent: {}; start the agent with {} to watch it here",
            run.describe(),
            crate::stats::INCLUDE_RUN_RINGS
        );
    }
    if let Ok(mut listed) = stats.recorded_by_run.lock() {
        *listed = source.run_rings();
    }
}

/// Events the agent makes itself (NVML samples): applied and recorded like a ring's.
fn apply_synthetic(events: Vec<Event>, model: &mut Model, capture: &Option<CaptureHandle>) {
    if events.is_empty() {
        return;
    }
    for e in &events {
        model.apply(e);
    }
    if let Some(c) = capture {
        c.send(CaptureMsg::Events(events));
    }
}

/// A `Dropped` marker for `n` events of `pid` that had taken ring slots (aux = slots).
fn lost_marker(pid: u32, seq: u64, n: u64) -> Event {
    Event {
        seq,
        ts_ns: vramhook_protocol::clock::monotonic_ns(),
        pid,
        kind: EventKind::Dropped.code(),
        api: Api::Interposer.code(),
        device: -1,
        size: n,
        aux: n,
        ..Event::default()
    }
}

/// The snapshot goes out before the counters that describe it move, and readers take the
/// counters first: a reader that sees a count sees at least the snapshot it counts.
fn publish(
    model: &Model,
    links: &IngestLinks,
    incidents: &mut crate::oom_counts::IncidentTracker,
    fits: &mut crate::fit_crossings::FitTracker,
) {
    let snapshot = Arc::new(model.snapshot());
    links.snapshots.send_replace(snapshot.clone());
    let fresh = incidents.new_incidents(&snapshot);
    if !fresh.is_empty() {
        if let Ok(mut totals) = links.stats.ooms.lock() {
            crate::oom_counts::add_to(&mut totals, &fresh);
        }
    }
    if let Some(tx) = &links.incidents {
        // Only where OTLP is on: the records are all the crossings are for.
        let crossings = fits.crossings(&snapshot, model.now_ns());
        let notices = fresh
            .into_iter()
            .map(|i| crate::otlp::Notice::Oom(Box::new(i.clone())))
            .chain(crossings.into_iter().map(crate::otlp::Notice::Fit));
        for notice in notices {
            if tx.try_send(notice).is_err() {
                add(&links.stats.otlp_incidents_dropped, 1);
            }
        }
    }
    add(&links.stats.snapshots, 1);
}
