//! The ingest loop: one thread owns the ring source and the host's live model, applies
//! every drained event, and publishes a snapshot for the sinks every `snapshot_interval`.
//! Sinks never block it: the capture gets a bounded queue, OTLP incidents a bounded
//! channel, everyone else reads the published snapshot.

use crate::capture::{CaptureHandle, CaptureMsg, Recovered, RingKey};
use crate::rings::{remove_when_recorded, report_refusals, report_run_rings};
use crate::stats::{add, AgentStats};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vramhook_model::{Model, ModelSnapshot};
use vramhook_protocol::clock::TscClock;
use vramhook_protocol::record::{Api, Event, EventKind};
use vramhook_ring::dir::process_alive;
use vramhook_ring::source::{PollSummary, RingCursor, RingFilter, RingSource, SourceItem};

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
            max_ring_bytes: vramhook_ring::DEFAULT_MAX_RING_BYTES,
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
pub fn run(cfg: IngestConfig, recovered: Option<Recovered>, links: IngestLinks) -> RingSource {
    let mut ingest = Ingest::start(cfg, recovered, links);
    while !ingest.links.stop.load(Ordering::Relaxed) {
        ingest.tick();
    }
    ingest.finish()
}

/// The ingest thread's state: the sources (rings, eBPF probes, NVML), the live model, and
/// the sinks it feeds (the capture, and through [`publish`] the snapshot's readers).
struct Ingest {
    cfg: IngestConfig,
    links: IngestLinks,
    stats: Arc<AgentStats>,
    capture: Option<CaptureHandle>,
    source: RingSource,
    watcher: Option<Watcher>,
    ebpf: Option<vramhook_ebpf::source::EbpfSource>,
    nvml: Option<crate::nvml::Feed>,
    model: Model,
    rings: RingBook,
    /// Incidents already counted and exported (those of a recovered model included).
    incidents: crate::oom_counts::IncidentTracker,
    /// Likewise the fit's crossings of 1 (one log record each).
    fits: crate::fit_crossings::FitTracker,
    /// The last poll generation the capture has flushed (see `RingSource::commit`).
    flushed: Arc<AtomicU64>,
    last_snapshot: Instant,
    last_checkpoint: Instant,
    last_forget: Instant,
    last_scan: Instant,
    /// A change seen but not yet scanned for (scans are at least `MIN_SCAN_GAP` apart, so
    /// that a user churning files in the directory cannot keep the agent scanning).
    scan_due: bool,
    first_scan: bool,
    idle: Duration,
}

/// What the agent knows of each ring between its discovery, its announcement to the
/// capture and its end.
struct RingBook {
    /// What a previous agent recorded of each ring (until the ring is found again).
    recorded: BTreeMap<RingKey, RingCursor>,
    /// The rings of the recovered checkpoint.
    recovered: BTreeSet<RingKey>,
    /// Writer drops recorded per ring (compared with what the ring says was reported).
    drops: BTreeMap<RingKey, u64>,
    /// Rings opened but not yet announced, with their cursor at open.
    pending: BTreeMap<RingKey, u64>,
    /// Per pid, the ring last announced to the capture.
    announced: BTreeMap<u32, RingKey>,
    /// Rings recorded to their end.
    ended: BTreeSet<RingKey>,
}

impl RingBook {
    /// Whether `pid` has a ring, announced or pending (its events are the ring's, not eBPF's).
    fn has_ring(&self, pid: u32) -> bool {
        self.announced.contains_key(&pid)
            || self.pending.range((pid, 0, 0)..=(pid, u64::MAX, u64::MAX)).next().is_some()
    }
}

impl Ingest {
    fn start(cfg: IngestConfig, recovered: Option<Recovered>, mut links: IngestLinks) -> Ingest {
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
        let _ = vramhook_ring::dir::make_ring_dir(&cfg.ring_dir, unsafe { libc::geteuid() });
        let watcher = Watcher::new(&cfg.ring_dir);
        if watcher.is_none() {
            eprintln!(
                "vramhook agent: inotify unavailable on {}; polling every {:?}",
                cfg.ring_dir.display(),
                cfg.idle_poll
            );
        }

        let (mut model, recorded, ended) = match recovered {
            Some(r) => {
                add(&stats.events_recovered, r.events);
                add(&stats.dropped_recovered, r.model.snapshot().processes.iter().map(|p| p.dropped_events).sum());
                (r.model, r.rings, r.ended)
            }
            None => (Model::new(crate::model_config()), BTreeMap::new(), BTreeSet::new()),
        };
        model.set_incident_cap(cfg.incidents_kept);
        let rings = RingBook {
            recovered: recorded.keys().copied().collect(),
            drops: recorded.iter().map(|(k, c)| (*k, c.drops_reported)).collect(),
            recorded,
            pending: BTreeMap::new(),
            announced: BTreeMap::new(),
            ended,
        };
        // Incidents of a recovered model were counted and exported by the agent before.
        let incidents = crate::oom_counts::IncidentTracker::seeded(&model.snapshot());
        let fits = crate::fit_crossings::FitTracker::seeded(&model.snapshot());
        let capture = links.capture.clone();
        // Commits: a poll's events leave the rings only once the capture has flushed them
        // (the capture thread acknowledges each poll's generation after its flush), so that
        // an agent killed meanwhile loses nothing; the next one skips what was recorded.
        source.deferred_commit = capture.is_some();
        if let Some(c) = &capture {
            c.send(CaptureMsg::Checkpoint {
                model: model.checkpoint(),
                rings: rings.recorded.values().cloned().collect(),
                ended: rings.ended.iter().copied().collect(),
                rotate: true,
            });
        }
        crate::pause_point("first-checkpoint");

        let now = Instant::now();
        let ebpf = links.ebpf.take();
        let nvml = crate::nvml::Feed::spawn(cfg.nvml_interval, "vramhook agent", true);
        Ingest {
            last_snapshot: now - cfg.snapshot_interval,
            last_checkpoint: now,
            last_forget: now,
            last_scan: now - cfg.rescan,
            scan_due: false,
            first_scan: true,
            idle: Duration::from_millis(1),
            flushed: Arc::new(AtomicU64::new(0)),
            cfg,
            links,
            stats,
            capture,
            source,
            watcher,
            ebpf,
            nvml,
            model,
            rings,
            incidents,
            fits,
        }
    }

    /// One turn of the loop: the sources into the model and the capture, then the sinks
    /// (checkpoint, published snapshot), then a sleep sized by what came.
    fn tick(&mut self) {
        self.discover_if_due();
        if self.source.deferred_commit {
            self.source.commit(self.flushed.load(Ordering::Acquire));
        }
        let opened = self.incidents_opened();
        let (summary, marked) = self.poll_rings();
        let ebpf_delivered = self.poll_ebpf();
        self.poll_nvml(opened);
        self.ack_when_flushed(&summary);
        self.count(&summary, marked);
        remove_when_recorded(&mut self.source, &self.capture);
        self.checkpoint_if_due();
        self.publish_if_due(&summary);
        self.sleep(&summary, ebpf_delivered);
    }

    fn incidents_opened(&self) -> u64 {
        self.model.incident_count() as u64 + self.model.incidents_forgotten()
    }

    /// Scans the directory for new rings when inotify (or a ring not yet ready) asks for it,
    /// or every period.
    fn discover_if_due(&mut self) {
        self.scan_due |= self.watcher.as_mut().is_some_and(Watcher::changed);
        let period = if self.watcher.is_some() { self.cfg.rescan } else { self.cfg.idle_poll };
        // A ring found before its writer finished it is looked at again at the next tick.
        let retry = self.source.waiting() > 0;
        let since = self.last_scan.elapsed();
        if ((self.scan_due || retry) && since >= MIN_SCAN_GAP) || since >= period {
            self.last_scan = Instant::now();
            self.scan_due = false;
            self.discover();
        }
    }

    fn discover(&mut self) {
        let rings = &mut self.rings;
        for opened in self.source.discover_now() {
            let key = (opened.pid, opened.start_time, opened.image);
            if rings.ended.contains(&key) {
                // Recorded to its end by the previous agent, which died before removing it.
                self.source.discard(key);
                continue;
            }
            add(&self.stats.rings_opened, 1);
            rings.pending.insert(key, opened.drops_reported);
            if let Some(r) = rings.recorded.remove(&key) {
                self.source.set_recorded(key, r.slots, r.unconfirmed);
            }
        }
        report_refusals(&mut self.source, &self.stats);
        report_run_rings(&mut self.source, &self.stats);
        if !rings.pending.is_empty() {
            crate::pause_point("discovered");
        }
        if self.first_scan {
            self.first_scan = false;
            // Processes the recovered model thinks alive whose ring is gone: their end
            // was drained by the previous agent but never recorded.
            let open: BTreeSet<RingKey> = self.source.ring_positions().into_iter().map(|(k, _)| k).collect();
            for key in rings.recovered.iter().filter(|k| !open.contains(k)) {
                if !process_alive(key.0, key.1) {
                    self.model.process_exit(key.0, key.1, None, vramhook_protocol::clock::monotonic_ns());
                }
            }
        }
    }

    /// Drains the rings into the model and the capture; returns the poll's summary and the
    /// events the rings' own `Dropped` markers account for.
    fn poll_rings(&mut self) -> (PollSummary, u64) {
        let mut feed = RingFeed {
            model: &mut self.model,
            rings: &mut self.rings,
            capture: &self.capture,
            stats: &self.stats,
            marked: 0,
        };
        let summary = self.source.poll(&mut |item| feed.take(item));
        let marked = feed.marked;
        report_refusals(&mut self.source, &self.stats);
        if summary.delivered > 0 {
            crate::pause_point("polled");
        }
        (summary, marked)
    }

    /// eBPF mode: the probes' events, after the rings' (a pid with a ring is the ring's).
    fn poll_ebpf(&mut self) -> u64 {
        match self.ebpf.as_mut() {
            Some(src) => {
                let rings = &self.rings;
                let ring_pid = |pid: u32| rings.has_ring(pid);
                crate::ebpf::drain(src, &mut self.model, &self.capture, &self.stats, &ring_pid)
            }
            None => 0,
        }
    }

    /// NVML, read on its own thread: asked again when this poll opened an OOM incident,
    /// whose snapshot then waits for that read (`Feed::owed`).
    fn poll_nvml(&mut self, opened_before: u64) {
        if let Some(n) = &mut self.nvml {
            let failure = self.model.incident_count() as u64 + self.model.incidents_forgotten() > opened_before;
            apply_synthetic(n.poll(failure), &mut self.model, &self.capture);
        }
    }

    /// Asks the capture to acknowledge this poll's generation once it has flushed it.
    fn ack_when_flushed(&self, summary: &PollSummary) {
        if let (Some(c), true) = (&self.capture, summary.delivered > 0) {
            let (flushed, generation) = (self.flushed.clone(), self.source.generation());
            let ack: Box<dyn FnOnce() + Send> = Box::new(move || {
                flushed.fetch_max(generation, Ordering::Release);
            });
            if let Err(now) = c.then(ack) {
                now(); // the queue is full: what did not fit is counted as capture loss
            }
        }
    }

    fn count(&self, summary: &PollSummary, marked: u64) {
        let stats = &self.stats;
        add(&stats.events_refused, summary.foreign);
        add(&stats.duplicates_skipped, summary.duplicates);
        add(&stats.restart_lost, summary.skipped);
        add(&stats.writer_dropped, summary.dropped);
        add(&stats.dropped_in_ring, crate::stats::dropped_in_ring(marked, summary));
        stats.rings_open.store(self.source.open_rings() as u64, Ordering::Relaxed);
    }

    /// Sends a checkpoint every `checkpoint_interval`, or when the capture wants to rotate.
    fn checkpoint_if_due(&mut self) {
        if let Some(c) = &self.capture {
            // No checkpoint while a loss is not marked yet (see `mark_missing`).
            let marked = c.mark_missing();
            let rotate = c.rotate_wanted.load(Ordering::Relaxed);
            if marked && (rotate || self.last_checkpoint.elapsed() >= self.cfg.checkpoint_interval) {
                self.last_checkpoint = Instant::now();
                // Rings recorded to their end are named until their files are gone.
                let source = &mut self.source;
                self.rings.ended.retain(|key| source.ring_file_exists(*key));
                c.send(CaptureMsg::Checkpoint {
                    model: self.model.checkpoint(),
                    rings: self.source.ring_cursors(),
                    ended: self.rings.ended.iter().copied().collect(),
                    rotate,
                });
                crate::pause_point("checkpoint-sent");
            }
        }
    }

    /// Publishes a snapshot every `snapshot_interval`, and at once when a process ended (its
    /// series end with it); forgets long-exited processes right after.
    fn publish_if_due(&mut self, summary: &PollSummary) {
        let owed = self.nvml.as_mut().is_some_and(crate::nvml::Feed::owed);
        if !owed && (summary.closed > 0 || self.last_snapshot.elapsed() >= self.cfg.snapshot_interval) {
            self.last_snapshot = Instant::now();
            publish(&self.model, &self.links, &mut self.incidents, &mut self.fits);
            // Only right after a publish: whatever is forgotten (an exited process with its
            // incidents) has been published, its incidents counted and exported, first.
            let every = self.cfg.forget_exited_after.clamp(Duration::from_millis(100), Duration::from_secs(10));
            if self.last_forget.elapsed() >= every {
                self.last_forget = Instant::now();
                let retention = u64::try_from(self.cfg.forget_exited_after.as_nanos()).unwrap_or(u64::MAX);
                self.model.forget_exited(self.model.now_ns().saturating_sub(retention));
            }
        }
    }

    /// Sleeps: not at all while more is waiting, briefly after events, longer and longer
    /// (up to `idle_poll`) while nothing comes; inotify wakes it early.
    fn sleep(&mut self, summary: &PollSummary, ebpf_delivered: u64) {
        if summary.delivered as usize >= self.cfg.batch_limit {
            self.idle = Duration::ZERO; // more is waiting
        } else if summary.delivered > 0 || ebpf_delivered > 0 {
            self.idle = Duration::from_millis(1);
        } else if self.source.waiting() > 0 || self.scan_due {
            self.idle = Duration::from_millis(1); // a ring is being made: look again soon
        } else {
            self.idle = (self.idle * 2).clamp(Duration::from_millis(1), self.cfg.idle_poll);
        }
        if !self.idle.is_zero() {
            match &self.watcher {
                Some(w) => w.wait(self.idle),
                None => std::thread::sleep(self.idle),
            }
        }
    }

    /// After the stop: detaches the probes, publishes a last snapshot and sends a last
    /// checkpoint; returns the ring source.
    fn finish(mut self) -> RingSource {
        // Detach every probe before the last snapshot (nothing stays in the kernel).
        if let Some(src) = self.ebpf.take() {
            drop(src);
            self.stats.ebpf_links.store(0, Ordering::Relaxed);
            eprintln!("vramhook agent: eBPF probes detached");
        }
        // Drain what is left, publish a last snapshot and checkpoint.
        publish(&self.model, &self.links, &mut self.incidents, &mut self.fits);
        if let Some(c) = &self.capture {
            // The losses not marked yet go in before the last checkpoint (its cursors count
            // their slots). While the queue stays full there is no last checkpoint: the next
            // agent then finds those slots unaccounted for and reports them lost.
            let deadline = Instant::now() + Duration::from_secs(1);
            let mut marked = c.mark_missing();
            while !marked && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
                marked = c.mark_missing();
            }
            let source = &mut self.source;
            self.rings.ended.retain(|key| source.ring_file_exists(*key));
            if marked {
                c.send(CaptureMsg::Checkpoint {
                    model: self.model.checkpoint(),
                    rings: self.source.ring_cursors(),
                    ended: self.rings.ended.iter().copied().collect(),
                    rotate: false,
                });
            }
        }
        remove_when_recorded(&mut self.source, &self.capture);
        self.source
    }
}

/// Where a ring poll's items go: the model and the capture, with the ring bookkeeping.
struct RingFeed<'a> {
    model: &'a mut Model,
    rings: &'a mut RingBook,
    capture: &'a Option<CaptureHandle>,
    stats: &'a AgentStats,
    /// Events the rings' `Dropped` markers account for.
    marked: u64,
}

impl RingFeed<'_> {
    fn take(&mut self, item: SourceItem<'_>) {
        match item {
            SourceItem::Process(info) => self.process(info),
            SourceItem::Events(events) => self.events(events),
            SourceItem::End(end) => self.end(end),
        }
    }

    fn process(&mut self, info: &vramhook_protocol::capture::ProcessInfo) {
        let (rings, capture) = (&mut *self.rings, self.capture);
        // The ring announced now is the lowest pending image of this process;
        // its note goes right before its process frame, after any events of
        // an older image, so a replay attributes every event to its ring.
        let key = rings
            .pending
            .range((info.pid, info.start_time, 0)..=(info.pid, info.start_time, u64::MAX))
            .next()
            .map(|(k, _)| *k);
        // Writer drops an earlier reader reported but never recorded (its
        // `Dropped` marker died with it).
        let mut unrecorded = 0;
        if let Some(key) = key {
            let drops_reported = rings.pending.remove(&key).unwrap_or(0);
            if let Some(c) = capture {
                c.send(CaptureMsg::Ring(key));
            }
            rings.announced.insert(key.0, key);
            unrecorded = drops_reported.saturating_sub(rings.drops.remove(&key).unwrap_or(0));
        }
        self.model.process_info(info);
        if let Some(c) = capture {
            c.send(CaptureMsg::Process(info.clone()));
        }
        // Their marker follows the process frame: before it, it counted on the
        // pid's previous process (pid reuse), or on none where that one had ended.
        // They took no slot (aux 0).
        if unrecorded > 0 {
            let mut marker = lost_marker(info.pid, 0, unrecorded);
            marker.aux = 0;
            self.model.apply(&marker);
            add(&self.stats.restart_lost, unrecorded);
            if let Some(c) = capture {
                c.send(CaptureMsg::Events(vec![marker]));
            }
        }
        crate::pause_point("announced");
    }

    fn events(&mut self, events: &[Event]) {
        for e in events {
            self.model.apply(e);
        }
        self.marked += crate::stats::dropped_marked(events);
        add(&self.stats.events_ingested, events.len() as u64);
        if let Some(c) = self.capture {
            c.send(CaptureMsg::Events(events.to_vec()));
        }
    }

    fn end(&mut self, end: vramhook_protocol::capture::ProcessEnd) {
        // The ring a process's end closes is its last one announced (as a
        // replay of the capture reads it).
        if let Some(key) = self.rings.announced.remove(&end.pid) {
            self.rings.ended.insert(key);
        }
        add(&self.stats.records_malformed, end.malformed);
        self.model.process_exit(end.pid, end.start_time, end.exit_status, end.ts_ns);
        add(&self.stats.rings_closed, 1);
        if let Some(c) = self.capture {
            c.send(CaptureMsg::End(end));
        }
        crate::pause_point("ring-ended");
    }
}

/// Least time between two directory scans triggered by inotify or by a ring not yet ready.
const MIN_SCAN_GAP: Duration = Duration::from_millis(2);

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
