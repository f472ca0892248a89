//! vramhook's offline analyzer: replays capture files and PyTorch memory snapshots through
//! the same [`vramhook_model::Model`] the live agent uses, and reports the post-mortem as
//! text, JSON (see `schema/report.schema.json`), one self-contained HTML page, or a Perfetto
//! (Chrome trace JSON) file.
//!
//! Memory stays bounded whatever the input size: captures are streamed frame by frame,
//! timelines are downsampled to at most `max_points` buckets (keeping minimum and maximum),
//! and lists (layout entries, corrupt frames, lead-up events) are capped.

mod build;
pub mod fleet;
pub mod fuzzing;
pub mod input;
pub mod logs;
pub mod render;
mod replay;
pub mod report;
pub mod series;

pub use build::{finish, verdict_name};
pub use replay::Replayer;
pub use report::*;

use input::torch;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use vramhook_model::ModelConfig;
use vramhook_protocol::capture::{Bytes, Piped, Streamed};
use vramhook_protocol::mapped::Mapped;

/// What to analyse and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// Stop at the first corrupt frame or cut (the caller exits with code 2).
    pub strict: bool,
    /// Report window, ns after the first event (events before `from` still build the state).
    pub from_ns: Option<u64>,
    /// Replay stops after this many ns past the first event.
    pub to_ns: Option<u64>,
    /// Layout at this many ns after the first event (default: the first OOM, else the peak).
    pub at_ns: Option<u64>,
    /// Report only these pids (the model still sees every process: verdicts need them).
    pub pids: Vec<u32>,
    /// Points per timeline.
    pub max_points: usize,
    /// Items kept per category (processes, OOM incidents, devices, PyTorch segments): the
    /// rest are folded into counts (see [`Folded`]), so that a small hostile file cannot
    /// cost memory or time out of proportion to its size.
    pub max_items: usize,
    /// Resident memory (MiB) past which the analysis stops with [`AnalyzeError::Budget`]
    /// and a partial report (0: no limit). Checked every few thousand events or entries.
    pub max_memory_mib: u64,
    /// Time past which the analysis stops likewise (`None`: no limit).
    pub time_limit: Option<std::time::Duration>,
    pub model: ModelConfig,
    /// The fit's forecast (`fit_trend_warnings`), where asked for.
    pub fit_trend: Option<vramhook_model::trend::TrendRule>,
}

/// Items kept per category by default.
pub const DEFAULT_MAX_ITEMS: usize = 10_000;
/// The default memory budget: far above what a streamed capture needs (under 100 MiB for
/// 1.28 GB), far below what makes a shared machine swap.
pub const DEFAULT_MAX_MEMORY_MIB: u64 = 2048;
/// The default time budget.
pub const DEFAULT_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Work counted while analysing, for tests and fuzzing to hold against the input's size
/// (the bounds: [`input::torch`]'s budgets).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Bytes of input read.
    pub bytes: u64,
    /// Elements of pickled lists expanded (a list referenced n times counts n times).
    pub items_expanded: u64,
    /// Live segments and blocks looked at on behalf of snapshot `oom` entries.
    pub segment_visits: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            strict: false,
            from_ns: None,
            to_ns: None,
            at_ns: None,
            pids: Vec::new(),
            max_points: series::DEFAULT_POINTS,
            max_items: DEFAULT_MAX_ITEMS,
            max_memory_mib: DEFAULT_MAX_MEMORY_MIB,
            time_limit: Some(DEFAULT_TIME_LIMIT),
            model: ModelConfig::default(),
            fit_trend: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("cannot open {path}: {message}")]
    Open { path: String, message: String },
    #[error("{path}: corrupt frame at byte {offset}: {reason}")]
    Corrupt { path: String, offset: u64, reason: String },
    /// A cut (strict mode only; otherwise what comes before it is read and the cut noted).
    #[error("{path}: truncated at byte {offset}")]
    Truncated { path: String, offset: u64 },
    #[error("{path}: {message}")]
    Snapshot { path: String, message: String },
    /// Not one byte: no capture header, nothing to report on (a report of it would say
    /// nothing happened, which the input does not say).
    #[error("{path}: empty file: no capture header, nothing to analyse")]
    Empty { path: String },
    /// The memory or time budget ran out: what was read before is in `partial`.
    #[error("{message}")]
    Budget { message: String, partial: Box<Report> },
}

/// The report, or the budget's error with the partial report in it.
fn finished(mut r: Replayer, logs: logs::LogInputs) -> Result<Report, AnalyzeError> {
    let over = r.over_budget.clone();
    if r.budget_stopped {
        // Said by the budget's own note, not as a stop at `--to`.
        r.stopped = false;
    }
    let mut report = finish(r);
    logs.attach(&mut report);
    match over {
        Some(message) => Err(AnalyzeError::Budget { message, partial: Box::new(report) }),
        None => Ok(report),
    }
}

/// Input detection: a capture starts with "VRHKCAPT", a pickle with PROTO (0x80).
fn is_pickle(head: &[u8]) -> bool {
    head.first() == Some(&0x80)
}

/// A snapshot in a regular file, read before the captures and imported after them.
struct Deferred {
    index: usize,
    name: String,
    bytes: Vec<u8>,
}

/// The PyTorch snapshots among `paths` that are regular files: read, and their segments
/// expected by the replay, so that the captures' allocations can be matched with them.
fn read_snapshots<P: AsRef<Path>>(r: &mut Replayer, paths: &[P]) -> Result<Vec<Deferred>, AnalyzeError> {
    let mut out = Vec::new();
    for (index, path) in paths.iter().enumerate() {
        let path = path.as_ref();
        // Only what is a regular file by its path is opened here: a FIFO is opened once, in turn.
        if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let name = path.display().to_string();
        let open_err = |e: std::io::Error| AnalyzeError::Open { path: name.clone(), message: e.to_string() };
        let file = File::open(path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        // Told apart as the main loop does: a log first, then a pickle.
        let mut head = [0u8; 4096];
        let n = file.read_at(&mut head, 0).map_err(open_err)?;
        if !meta.is_file() || logs::is_log(&head[..n]) || !is_pickle(&head[..n]) {
            continue;
        }
        let bytes = read_bounded(&file, meta.len(), torch::MAX_SNAPSHOT_BYTES)
            .map_err(|message| AnalyzeError::Open { path: name.clone(), message })?;
        if paths.len() > 1 {
            // Something to match it with.
            let keys = torch::segment_keys(&mut r.work, &name, &bytes)?;
            r.expect_snapshot(&name, &keys);
        }
        out.push(Deferred { index, name, bytes });
    }
    Ok(out)
}

/// Analyses files in order, as one stream (rotated captures continue each other; a PyTorch
/// snapshot is imported into the same model, after the captures: one whose segments are a
/// capture process's allocations joins that process).
pub fn analyze<P: AsRef<Path>>(paths: &[P], opts: &Options) -> Result<Report, AnalyzeError> {
    let mut r = Replayer::new(opts.clone());
    let mut logs = logs::LogInputs::default();
    let snapshots = read_snapshots(&mut r, paths)?;
    let mut merged = side_by_side(paths);
    for (index, path) in paths.iter().enumerate() {
        if snapshots.iter().any(|s| s.index == index) {
            continue;
        }
        if let Some(group) = merged.iter_mut().find(|g| g.members.contains(&index)) {
            // Captures of one host: replayed together, in time order, where the first is.
            if let Some(inputs) = group.inputs.take() {
                r.captures_merged(inputs)?;
            }
            continue;
        }
        let path = path.as_ref();
        let name = path.display().to_string();
        let open_err = |e: std::io::Error| AnalyzeError::Open { path: name.clone(), message: e.to_string() };
        // Opened once: a pipe or FIFO cannot be opened again (`<(cat x.vhc)` would lose what
        // was read; a FIFO whose writer has gone would wait for a new writer forever).
        let file = File::open(path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if meta.is_file() {
            let mut head = [0u8; 4096];
            let n = file.read_at(&mut head, 0).map_err(open_err)?;
            let head = &head[..n];
            if logs::is_log(head) {
                if !logs.read(&name, &file, logs::is_gzip(head)).map_err(open_err)? {
                    r.inputs.push(logs::unrecognised(&name, meta.len()));
                }
                continue;
            }
            if is_pickle(head) {
                let bytes = read_bounded(&file, meta.len(), torch::MAX_SNAPSHOT_BYTES)
                    .map_err(|message| AnalyzeError::Open { path: name.clone(), message })?;
                torch::import(&mut r, &name, &bytes)?;
                continue;
            }
            if head.is_empty() {
                return Err(AnalyzeError::Empty { path: name });
            }
            // Mapped: frames come straight from the page cache. What cannot be mapped is
            // streamed.
            match Mapped::new(&file) {
                Ok(mapped) => r.capture(&name, mapped)?,
                Err(_) => r.capture(&name, Streamed::new(BufReader::with_capacity(1 << 20, file)))?,
            }
        } else {
            // A pipe, FIFO, character device or socket: streamed, and it ends at EOF.
            let mut input = BufReader::with_capacity(1 << 20, file);
            let head = input.fill_buf().map_err(open_err)?;
            if head.is_empty() {
                return Err(AnalyzeError::Empty { path: name });
            }
            if logs::is_log(head) {
                let gzip = logs::is_gzip(head);
                if !logs.read(&name, input, gzip).map_err(open_err)? {
                    r.inputs.push(logs::unrecognised(&name, 0));
                }
                continue;
            }
            let first = head.first().copied();
            if first.is_some_and(|b| is_pickle(&[b])) {
                let mut bytes = Vec::new();
                input.take(torch::MAX_SNAPSHOT_BYTES + 1).read_to_end(&mut bytes).map_err(open_err)?;
                if bytes.len() as u64 > torch::MAX_SNAPSHOT_BYTES {
                    return Err(AnalyzeError::Open {
                        path: name.clone(),
                        message: format!("more than the {} bytes a snapshot may have", torch::MAX_SNAPSHOT_BYTES),
                    });
                }
                torch::import(&mut r, &name, &bytes)?;
            } else {
                r.capture(&name, Piped::new(input))?;
            }
        }
    }
    for s in snapshots {
        torch::import(&mut r, &s.name, &s.bytes)?;
    }
    finished(r, logs)
}

/// Captures of one host given together, mapped, to be replayed side by side.
struct SideBySide {
    members: Vec<usize>,
    inputs: Option<Vec<(String, Mapped)>>,
}

/// The regular-file captures among `paths`, grouped by the host their headers name: each
/// group of two or more is replayed in time order (see `Replayer::captures_merged`). A
/// capture that cannot be mapped is read alone, in turn.
fn side_by_side<P: AsRef<Path>>(paths: &[P]) -> Vec<SideBySide> {
    let mut by_host: Vec<(String, SideBySide)> = Vec::new();
    for (index, path) in paths.iter().enumerate() {
        let path = path.as_ref();
        // Only what is a regular file by its path is opened here: a FIFO or a pipe is opened
        // once, in turn (opened here and closed, its writer's bytes would be gone).
        if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let Ok(file) = File::open(path) else { continue };
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            continue;
        }
        let mut head = [0u8; 4096];
        let Ok(n) = file.read_at(&mut head, 0) else { continue };
        let Ok(reader) = vramhook_protocol::capture::CaptureReader::from_source(Bytes::new(&head[..n])) else {
            continue;
        };
        let host = reader.header().host.clone();
        let Ok(mapped) = Mapped::new(&file) else { continue };
        let name = path.display().to_string();
        match by_host.iter_mut().find(|g| g.0 == host) {
            Some((_, g)) => {
                g.members.push(index);
                g.inputs.get_or_insert_with(Vec::new).push((name, mapped));
            }
            None => by_host.push((host, SideBySide { members: vec![index], inputs: Some(vec![(name, mapped)]) })),
        }
    }
    by_host.into_iter().map(|(_, g)| g).filter(|g| g.members.len() > 1).collect()
}

fn read_bounded(file: &File, len: u64, max: u64) -> Result<Vec<u8>, String> {
    if len > max {
        return Err(format!("{} bytes is more than the {} a snapshot may have", len, max));
    }
    let mut out = Vec::with_capacity(len as usize);
    file.take(max).read_to_end(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Analyses one in-memory input (a capture, a snapshot pickle or a log). For tests and fuzzing.
pub fn analyze_bytes(name: &str, bytes: &[u8], opts: &Options) -> Result<Report, AnalyzeError> {
    analyze_bytes_many(&[(name, bytes)], opts)
}

/// Analyses in-memory inputs as [`analyze`] does files: logs and captures in order, then the
/// snapshots, which the replay expects first when there is something to join them with.
/// For tests and fuzzing.
pub fn analyze_bytes_many(inputs: &[(&str, &[u8])], opts: &Options) -> Result<Report, AnalyzeError> {
    analyze_inputs(inputs, opts, |_| {})
}

/// [`analyze_bytes_many`], telling `work` what it counted (also when it fails).
fn analyze_inputs(inputs: &[(&str, &[u8])], opts: &Options, work: impl FnOnce(Work)) -> Result<Report, AnalyzeError> {
    let mut r = Replayer::new(opts.clone());
    let result = read_inputs(&mut r, inputs);
    let mut counted = r.work;
    counted.bytes = inputs.iter().map(|(_, b)| b.len() as u64).sum();
    work(counted);
    let logs = result?;
    finished(r, logs)
}

fn read_inputs(r: &mut Replayer, inputs: &[(&str, &[u8])]) -> Result<logs::LogInputs, AnalyzeError> {
    let mut logs = logs::LogInputs::default();
    let is_log = |bytes: &[u8]| logs::is_log(&bytes[..bytes.len().min(4096)]);
    let snapshots: Vec<_> = inputs.iter().filter(|(_, b)| !is_log(b) && is_pickle(b)).collect();
    if inputs.len() > 1 {
        for (name, bytes) in &snapshots {
            let keys = torch::segment_keys(&mut r.work, name, bytes)?;
            r.expect_snapshot(name, &keys);
        }
    }
    for (name, bytes) in inputs {
        if is_log(bytes) {
            let read = logs.read(name, *bytes, logs::is_gzip(bytes));
            if !read.map_err(|e| AnalyzeError::Open { path: name.to_string(), message: e.to_string() })? {
                r.inputs.push(logs::unrecognised(name, bytes.len() as u64));
            }
        } else if bytes.is_empty() {
            return Err(AnalyzeError::Empty { path: name.to_string() });
        } else if !is_pickle(bytes) {
            r.capture(name, Bytes::new(bytes))?;
        }
    }
    for (name, bytes) in snapshots {
        torch::import(r, name, bytes)?;
    }
    Ok(logs)
}

/// [`analyze_bytes`], with the work it counted. For tests and fuzzing.
pub fn analyze_bytes_work(name: &str, bytes: &[u8], opts: &Options) -> (Result<Report, AnalyzeError>, Work) {
    let work = std::cell::Cell::new(Work::default());
    let result = analyze_inputs(&[(name, bytes)], opts, |w| work.set(w));
    (result, work.get())
}
