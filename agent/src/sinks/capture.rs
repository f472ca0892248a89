//! The capture sink: rotating capture files with periodic model checkpoints, and the
//! recovery that lets a restarted agent continue from them.
//!
//! Each file starts with a `Checkpoint` frame (the model's `checkpoint()` bytes) followed
//! by a `Note` frame holding the ring cursors at that moment; every ring announced later
//! gets a `Note` naming it before its `Process` frame. Frames are written whole and
//! flushed whenever the queue runs empty, so `vramhook dump` reads a file while it grows
//! (it reports it "truncated" until the end frame is written at rotation).
//!
//! The ingest loop commits what it read from the rings only once this thread has flushed
//! it (a `Then` acknowledgement after each poll's events); the checkpoint notes name what
//! was read but perhaps not committed, so that a restarted agent skips it in the rings.

use crate::stats::{add, AgentStats};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vramhook_model::Model;
use vramhook_protocol::capture::{
    CaptureHeader, CaptureReader, CaptureWriter, Frame, FrameType, ProcessEnd, ProcessInfo,
};
use vramhook_protocol::record::{Event, EventKind};
use vramhook_protocol::seqset::SeqSet;

pub use vramhook_ring::source::RingCursor;

/// `[start, end)` ranges of event `seq`s.
type SeqRanges = Vec<(u64, u64)>;

/// (pid, start time, image) of a ring.
pub type RingKey = (u32, u64, u64);

#[derive(Clone, Debug)]
pub struct CaptureConfig {
    pub dir: PathBuf,
    /// Start a new file past this many bytes.
    pub max_bytes: u64,
    /// Start a new file after this long.
    pub max_age: Duration,
    /// Keep at most this many files (the oldest are deleted).
    pub max_files: usize,
    /// Write a model checkpoint this often.
    pub checkpoint_interval: Duration,
    /// Bytes of events that may wait in the queue before batches are dropped.
    pub queue_bytes: u64,
}

/// Test hook: the capture queue's size in bytes (default 64 MiB), so that a test can make
/// it overflow at will. Read only when set.
pub const QUEUE_BYTES_ENV: &str = "VRAMHOOK_AGENT_CAPTURE_QUEUE_BYTES";

impl CaptureConfig {
    pub fn new(dir: impl Into<PathBuf>) -> CaptureConfig {
        let queue_bytes = std::env::var(QUEUE_BYTES_ENV).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(64 << 20);
        CaptureConfig {
            dir: dir.into(),
            max_bytes: 256 << 20,
            max_age: Duration::from_secs(3600),
            max_files: 16,
            checkpoint_interval: Duration::from_secs(10),
            queue_bytes,
        }
    }
}

/// What the agent hands the capture thread.
pub enum CaptureMsg {
    Ring(RingKey),
    Process(ProcessInfo),
    Events(Vec<Event>),
    End(ProcessEnd),
    /// The `Dropped` marker of events the queue dropped, with their `seq`s: written after a
    /// note naming those `seq`s, so that an agent restarted from the file skips the events
    /// it still finds in the ring (uncommitted) instead of counting them twice. Made by
    /// [`CaptureHandle::mark_missing`].
    Loss {
        marker: Event,
        seqs: SeqSet,
    },
    /// A process's end preceded by the loss of its events the queue dropped: made by
    /// [`CaptureHandle::send`] from an `End`, so that the marker is written before the end
    /// (a replay discards what comes after a process's end) and with it (the ring file goes
    /// once the end is in the file).
    EndAfterLoss {
        marker: Event,
        seqs: SeqSet,
        end: ProcessEnd,
    },
    /// A model checkpoint with the ring cursors it corresponds to (everything their
    /// readers handed on was sent before it); `rotate` starts a new file with it.
    /// `ended`: rings recorded to their end whose files may still be there (their removal
    /// had not run), so that a restart from this file does not read them again.
    Checkpoint {
        model: Vec<u8>,
        rings: Vec<RingCursor>,
        ended: Vec<RingKey>,
        rotate: bool,
    },
    /// Runs once everything queued before it is written and flushed to the file (so that
    /// it survives this process being killed): removing the ring files of closed rings.
    Then(Box<dyn FnOnce() + Send>),
    Stop,
}

#[derive(Serialize, Deserialize, Debug, Default)]
struct NoteJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ring: Option<RingKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rings: Option<Vec<(RingKey, u64)>>,
    /// Writer drops each ring's reader had reported (and the capture recorded) by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    drops: Option<Vec<(RingKey, u64)>>,
    /// Per ring, the `seq` ranges of the events recorded but perhaps still in the ring
    /// (not yet committed): a restarted agent skips them there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unconfirmed: Option<Vec<(RingKey, SeqRanges)>>,
    /// Rings recorded to their end (in this file or an earlier one) whose files may remain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ended: Option<Vec<RingKey>>,
    /// The pid and `seq` ranges of the events the `Dropped` marker after this note counts:
    /// they may still be in the ring (not yet committed), and a restarted agent skips them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lost: Option<(u32, SeqRanges)>,
}

/// The ingest side of the queue: never blocks.
#[derive(Clone)]
pub struct CaptureHandle {
    tx: SyncSender<CaptureMsg>,
    queued: Arc<AtomicU64>,
    /// Messages in the queue: event batches may only fill part of it, so that the small
    /// messages that give the capture its structure (rings, processes, ends) find room.
    msgs: Arc<AtomicU64>,
    limit: u64,
    stats: Arc<AgentStats>,
    /// Per pid, what was dropped from the capture and not yet marked.
    missing: Arc<std::sync::Mutex<BTreeMap<u32, Missing>>>,
    /// Set by the writer when the current file is past its size or age.
    pub rotate_wanted: Arc<AtomicBool>,
}

const QUEUE_MSGS: usize = 16_384;
/// Longest a poll's acknowledgement waits for a flush while the queue stays busy.
const ACK_FLUSH_EVERY: Duration = Duration::from_millis(5);
const QUEUE_MSGS_FOR_BATCHES: u64 = 12_288;

/// Events of one pid dropped from the capture and not yet marked.
#[derive(Default)]
struct Missing {
    events: u64,
    /// Ring slots they took (writer drops took none).
    slots: u64,
    /// The `seq`s of those read from the ring.
    seqs: SeqSet,
}

/// What a batch stands for, per pid. A `Dropped` marker stands for the events it counts
/// (size) and the slots they took (aux): a batch dropped with a writer's drop marker in it
/// loses those drops too, and the reader has already told the ring they were reported, so
/// only this marker can still count them.
fn losses_by_pid(events: &[Event], into: &mut BTreeMap<u32, Missing>) {
    for e in events {
        let m = into.entry(e.pid).or_default();
        if e.kind() == Some(EventKind::Dropped) {
            m.events = m.events.saturating_add(e.size);
            m.slots = m.slots.saturating_add(e.aux);
        } else {
            m.events = m.events.saturating_add(1);
            m.slots = m.slots.saturating_add(1);
            m.seqs.insert(e.seq);
        }
    }
}

/// Puts a loss that could not be queued back.
fn put_back(into: &mut BTreeMap<u32, Missing>, marker: &Event, seqs: &SeqSet) {
    let m = into.entry(marker.pid).or_default();
    m.events = m.events.saturating_add(marker.size);
    m.slots = m.slots.saturating_add(marker.aux);
    m.seqs.union_with(seqs);
}

/// The `Dropped` marker for `events` events of `pid` dropped from the capture, of which
/// `slots` had taken ring slots (the rest were writer drops already counted in the ring).
fn capture_loss_marker(pid: u32, events: u64, slots: u64) -> Event {
    Event {
        pid,
        ts_ns: vramhook_protocol::clock::monotonic_ns(),
        kind: EventKind::Dropped.code(),
        api: vramhook_protocol::record::Api::Interposer.code(),
        device: -1,
        size: events,
        aux: slots,
        ..Event::default()
    }
}

/// Whether a batch holds only `Dropped` markers (small, and what says a loss: never refused
/// for the room that event batches may take).
fn markers_only(events: &[Event]) -> bool {
    events.iter().all(|e| e.kind() == Some(EventKind::Dropped))
}

/// The note that names the `seq`s of a loss (see [`CaptureMsg::Loss`]).
fn loss_note(pid: u32, seqs: &SeqSet) -> Vec<u8> {
    serde_json::to_vec(&NoteJson { lost: Some((pid, seqs.ranges().collect())), ..NoteJson::default() })
        .unwrap_or_default()
}

impl CaptureHandle {
    /// Queues a message; drops it (counted) when the queue is full. Dropped event batches
    /// are later marked in the capture with `Dropped` markers ([`Self::mark_missing`]),
    /// so a replay knows what it lacks.
    pub fn send(&self, msg: CaptureMsg) -> bool {
        // A process's end takes the marker of what the queue dropped of it along.
        let msg = match msg {
            CaptureMsg::End(end) => match self.missing.lock().ok().and_then(|mut m| m.remove(&end.pid)) {
                Some(m) => CaptureMsg::EndAfterLoss {
                    marker: capture_loss_marker(end.pid, m.events, m.slots),
                    seqs: m.seqs,
                    end,
                },
                None => CaptureMsg::End(end),
            },
            other => other,
        };
        let (bytes, events) = match &msg {
            CaptureMsg::Events(v) => ((v.len() * 64) as u64, v.len() as u64),
            CaptureMsg::Checkpoint { model, .. } => (model.len() as u64, 0),
            _ => (0, 0),
        };
        let bulk = bytes > 0 && !matches!(&msg, CaptureMsg::Events(v) if markers_only(v));
        let full = bulk
            && (self.queued.load(Ordering::Relaxed) + bytes > self.limit
                || self.msgs.load(Ordering::Relaxed) >= QUEUE_MSGS_FOR_BATCHES);
        let msg: Result<(), CaptureMsg> = if full {
            Err(msg)
        } else {
            self.queued.fetch_add(bytes, Ordering::Relaxed);
            self.msgs.fetch_add(1, Ordering::Relaxed);
            match self.tx.try_send(msg) {
                Ok(()) => return true,
                Err(TrySendError::Full(m)) | Err(TrySendError::Disconnected(m)) => {
                    self.queued.fetch_sub(bytes, Ordering::Relaxed);
                    self.msgs.fetch_sub(1, Ordering::Relaxed);
                    Err(m)
                }
            }
        };
        match &msg {
            Err(CaptureMsg::Events(v)) => {
                if let Ok(mut m) = self.missing.lock() {
                    losses_by_pid(v, &mut m);
                }
                crate::pause_point("capture-dropped");
            }
            Err(CaptureMsg::Loss { marker, seqs } | CaptureMsg::EndAfterLoss { marker, seqs, .. }) => {
                if let Ok(mut m) = self.missing.lock() {
                    put_back(&mut m, marker, seqs);
                }
            }
            _ => {}
        }
        add(&self.stats.capture_dropped_batches, 1);
        add(&self.stats.capture_dropped_events, events);
        false
    }

    /// Writes a `Dropped` marker into the capture for every pid whose events the queue
    /// dropped. Returns whether every loss is marked now: a checkpoint must wait until then,
    /// for its ring cursors count the dropped events' slots as handed on, and an agent
    /// killed after it would not find their loss anywhere.
    pub fn mark_missing(&self) -> bool {
        let pending: Vec<(u32, Missing)> = match self.missing.lock() {
            Ok(mut m) if !m.is_empty() => std::mem::take(&mut *m).into_iter().collect(),
            _ => return true,
        };
        let mut all = true;
        for (pid, m) in pending {
            // A failed send puts the loss back into `missing` (and counts the marker).
            let marker = capture_loss_marker(pid, m.events, m.slots);
            all &= self.send(CaptureMsg::Loss { marker, seqs: m.seqs });
        }
        crate::pause_point("marked");
        all
    }

    /// Queues `f` to run once everything sent before it is in the file. When it cannot be
    /// queued (the queue is full or the writer gone), it is handed back to run now.
    pub fn then(&self, f: Box<dyn FnOnce() + Send>) -> Result<(), Box<dyn FnOnce() + Send>> {
        self.msgs.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(CaptureMsg::Then(f)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(CaptureMsg::Then(f))) | Err(TrySendError::Disconnected(CaptureMsg::Then(f))) => {
                self.msgs.fetch_sub(1, Ordering::Relaxed);
                Err(f)
            }
            Err(_) => {
                self.msgs.fetch_sub(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    /// Blocks until the writer took the stop message (shutdown only).
    pub fn stop(&self) {
        let _ = self.tx.send(CaptureMsg::Stop);
    }
}

/// The suffix of a capture file not yet named (see `CaptureThread::open`).
const PART_SUFFIX: &str = ".part";

/// Removes what an agent killed while starting a capture file left (a hidden, unnamed file).
fn remove_parts(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".vramhook-") && name.ends_with(PART_SUFFIX) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Starts the capture writer thread.
pub fn spawn(
    cfg: CaptureConfig,
    stats: Arc<AgentStats>,
) -> std::io::Result<(CaptureHandle, std::thread::JoinHandle<()>)> {
    std::fs::create_dir_all(&cfg.dir)?;
    remove_parts(&cfg.dir);
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_MSGS);
    let queued = Arc::new(AtomicU64::new(0));
    let msgs = Arc::new(AtomicU64::new(0));
    let rotate_wanted = Arc::new(AtomicBool::new(false));
    let handle = CaptureHandle {
        tx,
        queued: queued.clone(),
        msgs: msgs.clone(),
        limit: cfg.queue_bytes,
        missing: Arc::default(),
        stats: stats.clone(),
        rotate_wanted: rotate_wanted.clone(),
    };
    let join = std::thread::Builder::new().name("vramhook-capture".into()).spawn(move || {
        CaptureThread { cfg, stats, queued, msgs, rotate_wanted, file: None, seq: 0, after_flush: Vec::new() }.run(rx)
    })?;
    Ok((handle, join))
}

struct OpenFile {
    writer: CaptureWriter<BufWriter<File>>,
    opened: Instant,
}

struct CaptureThread {
    cfg: CaptureConfig,
    stats: Arc<AgentStats>,
    queued: Arc<AtomicU64>,
    msgs: Arc<AtomicU64>,
    rotate_wanted: Arc<AtomicBool>,
    file: Option<OpenFile>,
    seq: u64,
    /// `Then` messages waiting for the next flush.
    after_flush: Vec<Box<dyn FnOnce() + Send>>,
}

impl CaptureThread {
    fn run(mut self, rx: Receiver<CaptureMsg>) {
        let mut last_flush = Instant::now();
        while let Ok(mut msg) = rx.recv() {
            loop {
                if matches!(msg, CaptureMsg::Stop) {
                    self.close();
                    self.run_after_flush();
                    return;
                }
                self.handle(msg);
                // Under a steady stream the queue may never run empty: flush anyway when
                // acknowledgements wait, or the rings' slots are not freed.
                if !self.after_flush.is_empty() && last_flush.elapsed() >= ACK_FLUSH_EVERY {
                    self.flush();
                    last_flush = Instant::now();
                }
                match rx.try_recv() {
                    Ok(next) => msg = next,
                    Err(_) => break,
                }
            }
            // The queue ran empty: make every whole frame visible to readers.
            self.flush();
            last_flush = Instant::now();
            if let Some(f) = &self.file {
                if f.writer.bytes_written() >= self.cfg.max_bytes || f.opened.elapsed() >= self.cfg.max_age {
                    self.rotate_wanted.store(true, Ordering::Relaxed);
                }
            }
        }
        self.close();
        self.run_after_flush();
    }

    /// Writes out what is buffered, then runs what waited for it.
    fn flush(&mut self) {
        if let Some(f) = self.file.as_mut() {
            if let Err(e) = f.writer.flush() {
                self.fail(e);
            }
        }
        let waited = !self.after_flush.is_empty();
        self.run_after_flush();
        if waited {
            crate::pause_point("flushed");
        }
    }

    fn run_after_flush(&mut self) {
        for f in self.after_flush.drain(..) {
            f();
        }
    }

    fn fail(&mut self, e: std::io::Error) {
        add(&self.stats.capture_errors, 1);
        eprintln!("vramhook agent: capture write failed ({e}); a new file is started at the next checkpoint");
        self.file = None;
        self.rotate_wanted.store(true, Ordering::Relaxed);
    }

    fn write(&mut self, f: impl FnOnce(&mut CaptureWriter<BufWriter<File>>) -> std::io::Result<()>) {
        let Some(file) = self.file.as_mut() else { return };
        let before = file.writer.bytes_written();
        let r = f(&mut file.writer);
        let after = file.writer.bytes_written();
        add(&self.stats.capture_bytes, after.saturating_sub(before));
        if let Err(e) = r {
            self.fail(e);
        }
    }

    fn handle(&mut self, msg: CaptureMsg) {
        self.msgs.fetch_sub(1, Ordering::Relaxed);
        match msg {
            CaptureMsg::Ring(key) => {
                let note = serde_json::to_vec(&NoteJson { ring: Some(key), ..NoteJson::default() }).unwrap_or_default();
                self.write(|w| w.write_frame(FrameType::Note, &note));
            }
            CaptureMsg::Process(info) => self.write(|w| w.write_process(&info)),
            CaptureMsg::Events(events) => {
                self.queued.fetch_sub((events.len() * 64) as u64, Ordering::Relaxed);
                self.write(|w| w.write_events(&events));
            }
            CaptureMsg::End(end) => self.write(|w| w.write_process_end(&end)),
            // The note first: a file cut after it only makes a restarted agent skip events
            // whose loss it then reports itself (their slots are not accounted for).
            CaptureMsg::Loss { marker, seqs } => self.write(|w| {
                w.write_frame(FrameType::Note, &loss_note(marker.pid, &seqs))?;
                w.write_events(std::slice::from_ref(&marker))
            }),
            CaptureMsg::EndAfterLoss { marker, seqs, end } => self.write(|w| {
                w.write_frame(FrameType::Note, &loss_note(marker.pid, &seqs))?;
                w.write_events(std::slice::from_ref(&marker))?;
                w.write_process_end(&end)
            }),
            CaptureMsg::Checkpoint { model, rings, ended, rotate } => {
                self.queued.fetch_sub(model.len() as u64, Ordering::Relaxed);
                if rotate || self.file.is_none() {
                    self.close();
                    if let Err(e) = self.open() {
                        add(&self.stats.capture_errors, 1);
                        eprintln!("vramhook agent: cannot start a capture file in {}: {e}", self.cfg.dir.display());
                        return;
                    }
                    crate::pause_point("rotated");
                }
                let note = serde_json::to_vec(&NoteJson {
                    ring: None,
                    rings: Some(rings.iter().map(|c| (c.key, c.slots)).collect()),
                    drops: Some(rings.iter().map(|c| (c.key, c.drops_reported)).collect()),
                    unconfirmed: Some(rings.iter().map(|c| (c.key, c.unconfirmed.ranges().collect())).collect()),
                    ended: Some(ended),
                    lost: None,
                })
                .unwrap_or_default();
                self.write(|w| {
                    w.write_frame(FrameType::Checkpoint, &model)?;
                    w.write_frame(FrameType::Note, &note)
                });
                add(&self.stats.checkpoints, 1);
                crate::pause_point("checkpoint-written");
            }
            CaptureMsg::Then(f) => self.after_flush.push(f),
            CaptureMsg::Stop => {}
        }
    }

    fn open(&mut self) -> std::io::Result<()> {
        self.seq += 1;
        let name = format!("vramhook-{:020}-{:04}.vrhk", vramhook_protocol::clock::wall_ns(), self.seq % 10_000);
        let path = self.cfg.dir.join(&name);
        // Made under a hidden name and renamed once its header is on disk: an agent killed
        // before its first flush left an empty capture file, which `analyze` cannot read.
        let part = self.cfg.dir.join(format!(".{name}{PART_SUFFIX}"));
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&part)?;
        let mut writer = CaptureWriter::new(BufWriter::with_capacity(1 << 20, file), &CaptureHeader::now())?;
        writer.flush()?;
        std::fs::rename(&part, &path)?;
        self.file = Some(OpenFile { writer, opened: Instant::now() });
        self.rotate_wanted.store(false, Ordering::Relaxed);
        // The oldest go after the new file is started (never zero files to show after a
        // crash here), and the file is counted after that: a count seen means its pruning
        // is done.
        self.prune();
        add(&self.stats.capture_files, 1);
        Ok(())
    }

    fn close(&mut self) {
        if let Some(f) = self.file.take() {
            if let Err(e) = f.writer.finish() {
                add(&self.stats.capture_errors, 1);
                eprintln!("vramhook agent: cannot seal capture file: {e}");
            }
        }
    }

    fn prune(&self) {
        let files = capture_files(&self.cfg.dir);
        if files.len() > self.cfg.max_files {
            for old in &files[..files.len() - self.cfg.max_files] {
                let _ = std::fs::remove_file(old);
            }
        }
    }
}

/// The agent's capture files in `dir`, oldest first.
pub fn capture_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("vramhook-") && n.ends_with(".vrhk"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// What a restarted agent recovers from its captures.
pub struct Recovered {
    pub model: Model,
    /// Per ring: what was recorded of it. `slots`: the ring slots accounted for (events,
    /// and slots that `Dropped` markers say were lost), compared with the ring's cursor on
    /// reopening; `drops_reported`: writer drops recorded (markers' dropped events that
    /// took no slot); `unconfirmed`: the events recorded that may still be in the ring.
    pub rings: BTreeMap<RingKey, RingCursor>,
    /// Rings whose process end is recorded: everything they held is in the capture. A
    /// restarted agent that still finds one (its reader died before removing it) removes it
    /// without reading it again.
    pub ended: std::collections::BTreeSet<RingKey>,
    pub events: u64,
    pub file: PathBuf,
}

/// Rebuilds the model from the newest capture file that holds a checkpoint: restores the
/// last checkpoint in it and replays the frames after it. `None` when there is nothing
/// usable (then the agent starts empty).
pub fn recover(dir: &Path) -> Option<Recovered> {
    for path in capture_files(dir).iter().rev() {
        match recover_file(path) {
            Ok(Some(r)) => return Some(r),
            Ok(None) => continue,
            Err(e) => {
                eprintln!("vramhook agent: cannot recover from {}: {e}", path.display());
                continue;
            }
        }
    }
    None
}

fn recover_file(path: &Path) -> Result<Option<Recovered>, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let mut reader = CaptureReader::new(BufReader::with_capacity(1 << 20, file)).map_err(|e| e.to_string())?;
    let mut model: Option<Model> = None;
    let mut rings: BTreeMap<RingKey, RingCursor> = BTreeMap::new();
    let mut ended = std::collections::BTreeSet::new();
    let mut current: BTreeMap<u32, RingKey> = BTreeMap::new();
    let mut events = 0u64;
    loop {
        let frame = match reader.next_frame() {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => break, // truncated or corrupt tail: the agent was killed mid-write
        };
        match frame {
            Frame::Checkpoint(bytes) => match Model::restore(bytes) {
                Ok(m) => {
                    model = Some(m);
                    events = 0;
                }
                Err(e) => eprintln!("vramhook agent: skipping a bad checkpoint in {}: {e}", path.display()),
            },
            Frame::Note(bytes) => {
                let Ok(note) = serde_json::from_slice::<NoteJson>(bytes) else { continue };
                if let Some(slots) = note.rings {
                    if model.is_some() {
                        rings = slots.iter().map(|(k, slots)| (*k, RingCursor::recorded(*k, *slots))).collect();
                        for (key, n) in note.drops.unwrap_or_default() {
                            rings.entry(key).or_insert_with(|| RingCursor::recorded(key, 0)).drops_reported = n;
                        }
                        for (key, ranges) in note.unconfirmed.unwrap_or_default() {
                            rings.entry(key).or_insert_with(|| RingCursor::recorded(key, 0)).unconfirmed =
                                SeqSet::from_ranges(ranges);
                        }
                        current = rings.keys().map(|k| (k.0, *k)).collect();
                    }
                }
                ended.extend(note.ended.unwrap_or_default());
                // Events dropped from the capture that may still be in the ring: skipped
                // there, as the marker that follows counts them.
                if let Some((pid, ranges)) = note.lost.filter(|_| model.is_some()) {
                    if let Some(key) = current.get(&pid) {
                        let ring = rings.entry(*key).or_insert_with(|| RingCursor::recorded(*key, 0));
                        for (start, end) in ranges {
                            ring.unconfirmed.insert_range(start, end);
                        }
                    }
                }
                if let Some(key) = note.ring {
                    current.insert(key.0, key);
                    rings.entry(key).or_insert_with(|| RingCursor::recorded(key, 0));
                }
            }
            Frame::Process(info) => {
                if let Some(m) = model.as_mut() {
                    m.process_info(&info);
                }
            }
            Frame::Events(records) => {
                let Some(m) = model.as_mut() else { continue };
                for raw in records {
                    let e = Event::from_raw(raw);
                    // (A marker after its process's end, as earlier agents wrote them.)
                    if !(e.kind() == Some(EventKind::Dropped) && m.dropped_after_exit(e.pid, e.dropped_count())) {
                        m.apply(&e);
                    }
                    events += 1;
                    // Ring slots this event stands for: one, or for a `Dropped` marker
                    // the slots it says were lost (aux). Lane-agnostic: a ring's cursor is
                    // the sum of its lanes' positions, i.e. the slots consumed.
                    if let Some(key) = current.get(&e.pid) {
                        let ring = rings.entry(*key).or_insert_with(|| RingCursor::recorded(*key, 0));
                        if e.kind() == Some(EventKind::Dropped) {
                            ring.slots += e.aux;
                            ring.drops_reported += e.size.saturating_sub(e.aux);
                        } else {
                            // Read from the ring: it may still be there, uncommitted.
                            ring.slots += 1;
                            ring.unconfirmed.insert(e.seq);
                        }
                    }
                }
            }
            Frame::ProcessEnd(end) => {
                if let Some(m) = model.as_mut() {
                    m.process_exit(end.pid, end.start_time, end.exit_status, end.ts_ns);
                }
                if let Some(key) = current.remove(&end.pid) {
                    rings.remove(&key);
                    ended.insert(key);
                }
            }
            Frame::Unknown(_) | Frame::End { .. } => {}
        }
    }
    Ok(model.map(|model| Recovered { model, rings, ended, events, file: path.to_path_buf() }))
}
