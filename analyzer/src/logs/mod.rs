//! OOM post-mortems from the logs people already have: PyTorch's `OutOfMemoryError`, XLA's
//! BFC allocator dump (JAX, TensorFlow), ggml's CUDA backend (llama.cpp, ollama), vLLM's
//! KV-cache sizing failures and the NVIDIA driver's Xid lines.
//!
//! A log is read line by line in bounded memory (lines longer than [`MAX_LINE`] are cut
//! and counted), plain or gzip, with or without `journalctl`'s prefix. Each parser sees
//! every line and says whether it understood it; text no parser understands is skipped and
//! counted, never an error. Each OOM found becomes a [`LogIncident`] judged by the model's
//! [`judge_framework_oom`], the same rule a lens or snapshot feeds.

mod bfc;
mod ggml;
mod nvrm;
pub mod time;
mod torch;
mod vllm;

use serde::Serialize;
use std::collections::VecDeque;
use std::io::{BufRead, Read};
use vramhook_model::fmt_bytes;
use vramhook_model::framework::{judge_framework_oom, Framework, FrameworkOom};

/// Longest line kept whole; the rest of a longer line is skipped (and counted).
pub const MAX_LINE: usize = 64 * 1024;
/// At most this many incidents are kept per log; the rest are counted.
pub const MAX_INCIDENTS: usize = 10_000;
/// At most this many notes are kept per log.
pub const MAX_NOTES: usize = 100;

/// One line as the parsers see it: the message with any journal prefix removed.
pub struct LogLine<'a> {
    pub number: u64,
    pub text: &'a str,
    /// From the journal prefix (`ident[pid]:`) or the message itself (glog's thread id is not a pid).
    pub pid: Option<u32>,
    /// The time as the log wrote it, where it did (the journal's prefix, else the
    /// message's own: see [`time`]).
    pub time: Option<&'a str>,
}

/// What a parser made of a line.
pub enum Parsed {
    /// Not this parser's.
    No,
    /// Understood: part of a message whose incident is not complete yet.
    Part,
    /// Understood, and an incident is complete.
    Incident(Box<LogIncident>),
    /// Not this parser's line, but it ends an incident the parser was assembling.
    Ended(Box<LogIncident>),
    /// Understood, and worth a note in the report (a fallback to the CPU, say).
    Note(String),
}

trait Parser {
    fn feed(&mut self, line: &LogLine<'_>) -> Parsed;
    /// Whether the parser is inside a multi-line message and must see every line.
    fn pending(&self) -> bool {
        false
    }
    /// End of input: an incident still being assembled.
    fn finish(&mut self) -> Option<Box<LogIncident>> {
        None
    }
}

/// An OOM (or a driver fault) read from a log, judged.
#[derive(Clone, Debug, Serialize)]
pub struct LogIncident {
    pub source: String,
    pub file: String,
    /// First line of the message (1-based).
    pub line: u64,
    pub pid: Option<u32>,
    /// The time its first line was written at, as the log wrote it (see [`time`]).
    pub time: Option<String>,
    /// When the message was written, in Unix ns: earliest and latest. Its own time where its
    /// line has one (both equal); else the nearest timed lines before and after it (either
    /// may be missing). Set where the time can be read whole: a time without a year needs a
    /// capture to take the year from.
    pub time_earliest_unix_ns: Option<u64>,
    pub time_latest_unix_ns: Option<u64>,
    pub device: Option<i32>,
    /// The message's key line, verbatim (cut at 2,000 characters).
    pub message: String,
    /// Each number as the log wrote it, by field name: an explanation quotes these.
    pub quoted: Vec<(String, String)>,
    pub numbers: FrameworkOom,
    /// `capacity`, `framework_fragmentation`, `other_process`, `unknown`, or `not_an_oom`
    /// (`verdict` in JSON, as a capture incident's).
    #[serde(rename = "verdict")]
    pub verdict_name: String,
    pub missing: Vec<String>,
    pub unknown_reason: Option<String>,
    pub explanation: String,
    /// What to change, when the verdict has a known fix.
    pub fix: Option<String>,
    /// The capture incident this one was matched with (same pid and size within 5 s, or
    /// the same size within 5 s when the log names no pid).
    pub capture_incident: Option<u64>,
    /// How it was matched, or why it was not (ambiguous, outside the window).
    pub join: Option<String>,
    /// The nearest timed lines before and after the message (line number, time as
    /// written), for a message whose own line has no time.
    #[serde(skip)]
    pub time_before: Option<(u64, String)>,
    #[serde(skip)]
    pub time_after: Option<(u64, String)>,
}

impl LogIncident {
    fn new(source: Framework, line: &LogLine<'_>, message: &str) -> LogIncident {
        LogIncident {
            source: source.name().to_string(),
            file: String::new(),
            line: line.number,
            pid: line.pid,
            time: line.time.map(str::to_string),
            time_earliest_unix_ns: None,
            time_latest_unix_ns: None,
            device: None,
            message: message.chars().take(2000).collect(),
            quoted: Vec::new(),
            numbers: FrameworkOom::default(),
            verdict_name: String::new(),
            missing: Vec::new(),
            unknown_reason: None,
            explanation: String::new(),
            fix: None,
            capture_incident: None,
            join: None,
            time_before: None,
            time_after: None,
        }
    }

    fn quote(&mut self, field: &str, text: &str) {
        self.quoted.push((field.to_string(), text.trim().to_string()));
    }

    fn quoted(&self, field: &str) -> Option<&str> {
        self.quoted.iter().find(|(f, _)| f == field).map(|(_, t)| t.as_str())
    }

    /// Judges the numbers and writes the explanation.
    fn judge(mut self: Box<Self>, framework: Framework) -> Box<Self> {
        let j = judge_framework_oom(&self.numbers);
        self.verdict_name = crate::verdict_name(j.verdict).to_string();
        self.missing = j.missing;
        self.unknown_reason = j.unknown_reason;
        self.explanation = explain(&self, framework);
        self.fix = fix(&self, framework);
        self
    }
}

fn q(i: &LogIncident, field: &str, value: Option<u64>) -> String {
    match (i.quoted(field), value) {
        (Some(t), _) => t.to_string(),
        (None, Some(v)) => fmt_bytes(v),
        (None, None) => "an unknown amount".to_string(),
    }
}

fn explain(i: &LogIncident, framework: Framework) -> String {
    let n = &i.numbers;
    let who = match i.pid {
        Some(pid) => format!("Process {pid}"),
        None => "The process".to_string(),
    };
    // 0: the message gave no size (llama.cpp's `failed to allocate compute buffers` alone).
    let requested = q(i, "requested", (n.requested > 0).then_some(n.requested));
    let mut s = format!("{who} asked {} for {requested}", framework_label(framework));
    if let Some(d) = i.device {
        s += &format!(" on GPU {d}");
    }
    s += ". ";
    if n.device_free.is_some() {
        s += &format!(
            "The device had {} free of {}. ",
            q(i, "device_free", n.device_free),
            q(i, "device_total", n.device_total)
        );
    }
    match framework {
        Framework::Vllm => {
            s += &format!("vLLM's KV cache had {} available for it", q(i, "pool_limit", n.pool_limit));
            if let Some(len) = i.quoted("max_model_len") {
                s += &format!(", for a max seq len of {len}");
            }
            s += " (its gpu_memory_utilization share of the GPU, less the weights and activations). ";
        }
        Framework::PyTorch if n.allocated.is_some() || n.cached_free.is_some() => {
            s += &format!(
                "Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated",
                q(i, "allocated", n.allocated),
                q(i, "cached_free", n.cached_free)
            );
            if let Some(p) = n.process_in_use {
                s += &format!("; the process had {} in use in all", q(i, "process_in_use", Some(p)));
            }
            s += ". ";
        }
        Framework::XlaBfc => {
            s += &format!(
                "The BFC pool's limit was {}, {} in use; its largest free block was {}. ",
                q(i, "pool_limit", n.pool_limit),
                q(i, "in_use", n.pool_limit.zip(n.cached_free).map(|(l, c)| l.saturating_sub(c))),
                q(i, "largest_free_block", n.largest_free_block)
            );
        }
        Framework::Ggml => {
            if let Some(free) = i.quoted("device free at model load") {
                let bytes = |t: &str| t.parse::<u64>().map(|b| format!("{t} bytes ({})", fmt_bytes(b)));
                s += &format!(
                    "When the model was loaded the device had {} free of {} (NVML, before the runner's own CUDA \
                     context and buffers). ",
                    bytes(free).unwrap_or_else(|_| free.to_string()),
                    i.quoted("device_total").map(|t| bytes(t).unwrap_or_else(|_| t.to_string())).unwrap_or_default()
                );
            }
            if let Some(o) = i.quoted("offloaded layers") {
                s += &format!("{o} layers were planned on the GPU. ");
            }
        }
        _ => {}
    }
    for (pid, bytes) in &n.other_processes {
        s += &format!("Process {pid} had {} in use. ", fmt_bytes(*bytes));
    }
    s += &match i.verdict_name.as_str() {
        "framework_fragmentation" => format!(
            "Verdict: framework fragmentation. The cache held {} it had not handed out, {}, but no free block of {} \
             was there: the memory existed, stranded in the cache's pieces, not missing.",
            q(i, "cached_free", n.cached_free),
            match n.largest_free_block {
                Some(b) => format!("the largest free block being {}", q(i, "largest_free_block", Some(b))),
                None => "enough for the request".to_string(),
            },
            q(i, "requested", Some(n.requested))
        ),
        "capacity"
            if n.framework_limit.is_some_and(|l| n.allocated.is_some_and(|a| a.saturating_add(n.requested) > l)) =>
        {
            format!(
                "Verdict: capacity (of the framework's limit). It allowed the process {}, of which {} was allocated: the \
                 {} request could not fit under the limit even with its whole free cache given back.",
                q(i, "framework_limit", n.framework_limit),
                q(i, "allocated", n.allocated),
                q(i, "requested", Some(n.requested))
            )
        }
        "capacity" if n.pool_limit.is_some() => format!(
            "Verdict: capacity (of the pool). The pool had less than {} free in all: its fixed limit of {} was too \
             small for this workload.",
            q(i, "requested", Some(n.requested)),
            q(i, "pool_limit", n.pool_limit)
        ),
        "capacity" => "Verdict: capacity. Even the framework's unused cache and the device's free bytes together were \
                       less than the request: the workload needs more memory than the GPU had."
            .to_string(),
        "other_process" => "Verdict: other process. Other processes held what was missing; with them gone the request \
                            would have fitted."
            .to_string(),
        _ => format!("Verdict: unknown: {}.", i.unknown_reason.as_deref().unwrap_or("no reason recorded")),
    };
    if !i.missing.is_empty() {
        s += &format!(" The log did not say: {}.", i.missing.join(", "));
    }
    s
}

fn framework_label(f: Framework) -> &'static str {
    match f {
        Framework::PyTorch => "PyTorch's caching allocator",
        Framework::XlaBfc => "XLA's BFC allocator",
        Framework::Ggml => "ggml's CUDA backend",
        Framework::Vllm => "vLLM",
    }
}

fn fix(i: &LogIncident, framework: Framework) -> Option<String> {
    match (i.verdict_name.as_str(), framework) {
        ("framework_fragmentation", Framework::PyTorch) => Some(format!(
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments then grow and shrink by pages, so the {} \
             of free cache can serve the request. Otherwise max_split_size_mb (keep large blocks whole) or \
             garbage_collection_threshold (give cached blocks back earlier).",
            q(i, "cached_free", i.numbers.cached_free)
        )),
        ("framework_fragmentation", Framework::XlaBfc) => Some(
            "Set TF_GPU_ALLOCATOR=cuda_malloc_async (XLA's own advice), or XLA_PYTHON_CLIENT_PREALLOCATE=false so the \
             pool grows instead of splitting one fixed region."
                .into(),
        ),
        ("capacity", Framework::Vllm) => Some(match i.quoted("estimated_max_model_len") {
            Some(est) => format!(
                "Raise gpu_memory_utilization, or lower max_model_len to at most {est} (vLLM's own estimate for the \
                 memory it had)."
            ),
            None => "Raise gpu_memory_utilization, lower max_model_len, or free the GPU of other processes: vLLM's KV \
                     cache gets what is left of its share after the weights."
                .to_string(),
        }),
        ("capacity", Framework::PyTorch) if i.numbers.framework_limit.is_some() => {
            Some("Raise the limit (torch.cuda.set_per_process_memory_fraction), or need less memory.".into())
        }
        ("capacity", Framework::XlaBfc) => Some(
            "Raise XLA_PYTHON_CLIENT_MEM_FRACTION (the pool's share of the GPU), or make the workload smaller.".into(),
        ),
        ("other_process", _) => {
            Some("Stop or limit the other processes named above, or move them to another GPU.".into())
        }
        _ => None,
    }
}

/// What one log file held.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LogFileReport {
    pub path: String,
    pub gzip: bool,
    pub lines: u64,
    pub understood: u64,
    pub skipped: u64,
    /// Lines longer than `MAX_LINE`, cut there.
    pub long_lines: u64,
    /// Lines that were not UTF-8 (read lossily).
    pub binary_lines: u64,
    pub incidents: u64,
    /// Incidents beyond `MAX_INCIDENTS`, counted only.
    pub incidents_unlisted: u64,
    /// Lines understood, by source.
    pub by_source: std::collections::BTreeMap<String, u64>,
    /// What else the log said that bears on memory (at most `MAX_NOTES`).
    pub notes: Vec<String>,
}

/// Whether an input that starts with `head` is read as a log: gzip, or text that is not a
/// capture.
pub fn is_log(head: &[u8]) -> bool {
    let magic = &vramhook_protocol::capture::CAPTURE_MAGIC;
    // A capture, or one cut inside its magic (that reads as "truncated"), and a pickle
    // (PROTO, 0x80, which no UTF-8 text starts with) are not logs.
    let capture = head.starts_with(magic) || (head.len() < magic.len() && magic.starts_with(head));
    !capture && head.first() != Some(&0x80) && (is_gzip(head) || looks_like_text(head))
}

/// The report of an input that is neither a capture, a snapshot, nor a log with a line any
/// parser understood.
pub fn unrecognised(path: &str, bytes: u64) -> crate::InputReport {
    crate::InputReport {
        bytes_read: bytes,
        error: Some(
            "not a capture (bad magic: a vramhook capture starts with VRHKCAPT), nor a PyTorch snapshot, nor a log \
             with a line vramhook reads (OOM messages of PyTorch, XLA, ggml, vLLM or the NVIDIA driver)"
                .into(),
        ),
        ..crate::InputReport::new(path, crate::InputKind::Log, crate::InputStatus::Unreadable)
    }
}

/// Gzip's magic.
pub fn is_gzip(head: &[u8]) -> bool {
    head.starts_with(&[0x1f, 0x8b])
}

/// Whether the first bytes of a file look like text (a log) rather than binary data: no
/// NUL byte, and at least 90% printable or white space.
pub fn looks_like_text(head: &[u8]) -> bool {
    let probe = &head[..head.len().min(4096)];
    let printable = probe.iter().filter(|b| b.is_ascii_graphic() || b.is_ascii_whitespace() || **b >= 0x80).count();
    !probe.is_empty() && !probe.contains(&0) && printable * 10 >= probe.len() * 9
}

/// Reads a log (plain or gzip: `gzip` says which) and returns its report and incidents.
pub fn read_log(path: &str, input: impl Read, gzip: bool) -> std::io::Result<(LogFileReport, Vec<LogIncident>)> {
    let mut report = LogFileReport { path: path.to_string(), gzip, ..LogFileReport::default() };
    let mut incidents = Vec::new();
    if gzip {
        let reader = std::io::BufReader::with_capacity(1 << 16, flate2::read::MultiGzDecoder::new(input));
        read_lines(reader, &mut report, &mut incidents)?;
    } else {
        read_lines(std::io::BufReader::with_capacity(1 << 16, input), &mut report, &mut incidents)?;
    }
    for i in &mut incidents {
        i.file = path.to_string();
    }
    Ok((report, incidents))
}

fn parsers() -> Vec<(Framework, Box<dyn Parser>)> {
    vec![
        (Framework::PyTorch, Box::new(torch::TorchParser::default())),
        (Framework::XlaBfc, Box::new(bfc::BfcParser::default())),
        (Framework::Ggml, Box::new(ggml::GgmlParser::default())),
        (Framework::Vllm, Box::new(vllm::VllmParser)),
    ]
}

fn read_lines(
    reader: impl BufRead,
    report: &mut LogFileReport,
    incidents: &mut Vec<LogIncident>,
) -> std::io::Result<()> {
    read_lines_with(reader, report, incidents, parsers())
}

fn read_lines_with(
    mut reader: impl BufRead,
    report: &mut LogFileReport,
    incidents: &mut Vec<LogIncident>,
    mut parsers: Vec<(Framework, Box<dyn Parser>)>,
) -> std::io::Result<()> {
    let mut driver = nvrm::NvrmParser;
    let mut timing = Timing::default();
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    // Every message any parser starts on has one of these words: most lines of a busy log
    // have none and are skipped after a few vectorised scans.
    let needles: Vec<memchr::memmem::Finder<'static>> =
        ["memory", "failed", "msg=", "Xid"].iter().map(|n| memchr::memmem::Finder::new(n.as_bytes())).collect();
    loop {
        buf.clear();
        let (ended, long) = read_bounded_line(&mut reader, &mut buf)?;
        if ended && buf.is_empty() {
            break;
        }
        report.lines += 1;
        report.long_lines += u64::from(long);
        if !parsers.iter().any(|(_, p)| p.pending()) && !needles.iter().any(|n| n.find(&buf).is_some()) {
            if std::str::from_utf8(&buf).is_err() {
                report.binary_lines += 1;
            }
            report.skipped += 1;
            if ended {
                break;
            }
            continue;
        }
        let text = match std::str::from_utf8(&buf) {
            Ok(t) => std::borrow::Cow::Borrowed(t),
            Err(_) => {
                report.binary_lines += 1;
                String::from_utf8_lossy(&buf)
            }
        };
        let (time, pid, message) = strip_prefix(text.trim_end_matches(['\n', '\r']));
        let time = time.or_else(|| time::find(message));
        if let Some(t) = time {
            timing.saw(report.lines, t, incidents);
        }
        let line = LogLine { number: report.lines, text: message, pid, time };
        let mut understood = false;
        for (framework, parser) in parsers.iter_mut() {
            match parser.feed(&line) {
                Parsed::No => continue,
                Parsed::Ended(i) => {
                    push(incidents, report, &mut timing, i.judge(*framework));
                    continue;
                }
                Parsed::Part => {}
                Parsed::Note(note) => {
                    if report.notes.len() < MAX_NOTES {
                        report.notes.push(note);
                    }
                }
                Parsed::Incident(i) => push(incidents, report, &mut timing, i.judge(*framework)),
            }
            understood = true;
            *report.by_source.entry(framework.name().to_string()).or_default() += 1;
            break;
        }
        if !understood {
            if let Parsed::Incident(i) = driver.feed(&line) {
                understood = true;
                *report.by_source.entry("nvrm".to_string()).or_default() += 1;
                push(incidents, report, &mut timing, i);
            }
        }
        if understood {
            report.understood += 1;
        } else {
            report.skipped += 1;
        }
        if ended {
            break;
        }
    }
    for (framework, parser) in parsers.iter_mut() {
        if let Some(i) = parser.finish() {
            push(incidents, report, &mut timing, i.judge(*framework));
        }
    }
    Ok(())
}

fn push(incidents: &mut Vec<LogIncident>, report: &mut LogFileReport, timing: &mut Timing, mut i: Box<LogIncident>) {
    report.incidents += 1;
    if incidents.len() < MAX_INCIDENTS {
        timing.place(incidents.len(), &mut i);
        incidents.push(*i);
    } else {
        report.incidents_unlisted += 1;
    }
}

/// Timed lines kept to bound a message whose own line has no time.
const RECENT_TIMES: usize = 8;

/// The times of the lines the parsers saw, for messages whose own lines have none (ggml's
/// lines in ollama's log, a traceback on stderr): such a message was written after the
/// timed line before it and before the timed line after it.
#[derive(Default)]
struct Timing {
    /// The last timed lines (line number, time as written), oldest first.
    recent: VecDeque<(u64, String)>,
    /// Incidents (by index) that wait for a timed line after them.
    awaiting: Vec<usize>,
}

impl Timing {
    fn saw(&mut self, line: u64, time: &str, incidents: &mut [LogIncident]) {
        for k in self.awaiting.drain(..) {
            if let Some(i) = incidents.get_mut(k) {
                i.time_after.get_or_insert_with(|| (line, time.to_string()));
            }
        }
        if self.recent.len() == RECENT_TIMES {
            self.recent.pop_front();
        }
        self.recent.push_back((line, time.chars().take(64).collect()));
    }

    fn place(&mut self, index: usize, i: &mut LogIncident) {
        if i.time.is_some() {
            return;
        }
        i.time_before = self.recent.iter().rev().find(|(l, _)| *l < i.line).cloned();
        i.time_after = self.recent.iter().find(|(l, _)| *l > i.line).cloned();
        if i.time_after.is_none() {
            self.awaiting.push(index);
        }
    }
}

/// Reads one line into `buf`, keeping at most `MAX_LINE` bytes of it. Returns (end of input
/// reached, line was cut).
fn read_bounded_line(reader: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<(bool, bool)> {
    let mut cut = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((true, cut));
        }
        let (take, found) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = MAX_LINE.saturating_sub(buf.len());
        if take > room {
            cut = true;
        }
        buf.extend_from_slice(&chunk[..take.min(room)]);
        reader.consume(take);
        if found {
            return Ok((false, cut));
        }
    }
}

const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// Removes a `journalctl` prefix: `Dec 01 05:06:42 host ident[pid]: ` (short) or
/// `2026-12-01T05:06:42+0000 host ident[pid]: ` (short-iso). Returns (time, pid, message).
fn strip_prefix(line: &str) -> (Option<&str>, Option<u32>, &str) {
    let time_len = if line.len() > 15 && MONTHS.contains(&line.get(..3).unwrap_or("")) && line.as_bytes()[3] == b' ' {
        // "Dec 01 05:06:42", "Dec  1 05:06:42" or (short-precise) "Dec 01 05:06:42.123456"
        time::find(line).map(str::len)
    } else if line.len() > 19 && line.as_bytes().get(4) == Some(&b'-') && line.as_bytes().get(10) == Some(&b'T') {
        line.find(' ')
    } else {
        None
    };
    let Some(time_len) = time_len else { return (None, None, line) };
    let Some(time) = line.get(..time_len) else { return (None, None, line) };
    let rest = line[time_len..].trim_start();
    // host, then ident[pid]: message
    let Some((_, after_host)) = rest.split_once(' ') else { return (None, None, line) };
    let Some((ident, message)) = after_host.split_once(": ") else { return (None, None, line) };
    if ident.contains(' ') {
        return (None, None, line);
    }
    let pid = ident.split_once('[').and_then(|(_, p)| p.strip_suffix(']')).and_then(|p| p.parse().ok());
    (Some(time), pid, message)
}

/// A size as logs write it: `2.00 GiB`, `293.12 MiB`, `0 bytes`, `256B`, `6.99GiB`, `1.2 GB`.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let scale: f64 = match unit.trim().trim_end_matches(['.', ',', ';', ')']) {
        "" | "B" | "bytes" | "byte" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    let bytes = value * scale;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes.round() as u64)
}

/// The text between `before` and the next occurrence of `after` in `s`.
fn between<'a>(s: &'a str, before: &str, after: &str) -> Option<&'a str> {
    let start = s.find(before)? + before.len();
    let rest = &s[start..];
    Some(&rest[..rest.find(after)?])
}

/// Whether two sizes are the same request: logs print sizes rounded (`81.45 GiB`), the
/// driver sees the exact bytes.
fn same_size(log: u64, exact: u64) -> bool {
    log.abs_diff(exact) <= (exact / 200).max(1 << 20)
}

/// How far apart a log's incident and a capture's may be and still be one incident.
pub const JOIN_WINDOW_NS: u64 = 5_000_000_000;

/// A capture incident as the join sees it.
#[derive(Clone, Copy, Debug)]
pub struct Captured {
    pub id: u64,
    pub pid: u32,
    pub requested: u64,
    /// Its first failure on the wall clock (Unix ns), when the capture has one.
    pub wall_ns: Option<u64>,
}

fn secs(ns: u64) -> String {
    format!("{}.{:03} s", ns / 1_000_000_000, ns % 1_000_000_000 / 1_000_000)
}

/// Joins log incidents to capture incidents: same pid and size within 5 seconds, or, when
/// the log names no pid, the same size within 5 seconds. The 5 seconds apply where both
/// sides have a time (the log's own, or the timed lines around it, and the capture's wall
/// clock); without one the match is by pid and size. A match must be the only one: an
/// ambiguous incident stays unjoined, and `join` says why.
pub fn join(log: &mut [LogIncident], captured: &[Captured]) {
    for i in log.iter_mut().filter(|i| i.verdict_name != "not_an_oom") {
        let by = if i.pid.is_some() { "pid and size" } else { "size alone (the log names no pid)" };
        let same: Vec<&Captured> = captured
            .iter()
            .filter(|c| same_size(i.numbers.requested, c.requested) && i.pid.is_none_or(|p| p == c.pid))
            .collect();
        if same.is_empty() {
            continue;
        }
        let (lo, hi) = (i.time_earliest_unix_ns, i.time_latest_unix_ns);
        // How far a capture incident is from the log's time (0 inside its bounds).
        let distance = |wall: u64| match (lo, hi) {
            (Some(lo), _) if wall < lo => lo - wall,
            (_, Some(hi)) if wall > hi => wall - hi,
            _ => 0,
        };
        let timed = (lo.is_some() || hi.is_some()) && same.iter().all(|c| c.wall_ns.is_some());
        if !timed {
            let why =
                if lo.is_none() && hi.is_none() { "the log gives no time" } else { "the capture has no wall clock" };
            match same.as_slice() {
                [one] => {
                    i.capture_incident = Some(one.id);
                    i.join = Some(format!("matched by {by}; {why}, so the 5-second window could not be checked"));
                }
                many => {
                    i.join = Some(format!(
                        "not joined: {} capture incidents match by {by} and {why} to tell them apart",
                        many.len()
                    ))
                }
            }
            continue;
        }
        let near: Vec<(&Captured, u64)> =
            same.iter().map(|c| (*c, distance(c.wall_ns.unwrap_or(0)))).filter(|(_, d)| *d <= JOIN_WINDOW_NS).collect();
        let when = match (&i.time, &i.time_before, &i.time_after) {
            (Some(t), _, _) => format!("the log's time {t}"),
            (None, Some((lb, tb)), Some((la, ta))) => {
                format!("the log's timed lines around it ({tb} at line {lb}, {ta} at line {la})")
            }
            (None, Some((lb, tb)), None) => format!("the log's last timed line before it ({tb} at line {lb})"),
            (None, None, Some((la, ta))) => format!("the log's next timed line after it ({ta} at line {la})"),
            (None, None, None) => "the log's time".to_string(),
        };
        i.join = Some(match near.as_slice() {
            [(one, d)] => {
                i.capture_incident = Some(one.id);
                if *d == 0 {
                    format!("matched by {by}, within {when}")
                } else {
                    format!("matched by {by}, {} from {when} (within 5 s)", secs(*d))
                }
            }
            [] => {
                let nearest = same.iter().map(|c| distance(c.wall_ns.unwrap_or(0))).min().unwrap_or(0);
                format!(
                    "not joined: the nearest capture incident of the same {by} is {} from {when}, outside the 5-second window",
                    secs(nearest)
                )
            }
            many => format!("not joined: {} capture incidents match by {by} within 5 s of {when}", many.len()),
        });
        if let Some(t) = i.time.as_deref().or(i.time_before.as_ref().map(|t| t.1.as_str())).and_then(time::parse) {
            let assumed = t.assumed();
            if !assumed.is_empty() {
                if let Some(j) = &mut i.join {
                    *j += &format!(" (the log's time has {})", assumed.join(", "));
                }
            }
        }
    }
}

impl LogIncident {
    /// Puts the message on the wall clock: its own time, else the bounds of the timed lines
    /// around it. `reference` (Unix ns, the capture's clock) gives a year to a time without one.
    fn resolve_time(&mut self, reference: Option<u64>) {
        let unix = |t: &str| time::parse(t).and_then(|t| t.unix_ns(reference));
        match self.time.as_deref() {
            Some(t) => {
                self.time_earliest_unix_ns = unix(t);
                self.time_latest_unix_ns = self.time_earliest_unix_ns;
            }
            None => {
                self.time_earliest_unix_ns = self.time_before.as_ref().and_then(|(_, t)| unix(t));
                self.time_latest_unix_ns = self.time_after.as_ref().and_then(|(_, t)| unix(t));
            }
        }
    }
}

/// The logs among `vramhook analyze`'s inputs.
#[derive(Default)]
pub struct LogInputs {
    files: Vec<LogFileReport>,
    incidents: Vec<LogIncident>,
}

impl LogInputs {
    /// Reads one log. `false` when no line of it was understood: then it is no log of
    /// ours either, and the caller reports it as an unreadable input.
    pub fn read(&mut self, path: &str, input: impl Read, gzip: bool) -> std::io::Result<bool> {
        let (report, incidents) = read_log(path, input, gzip)?;
        if report.understood == 0 {
            return Ok(false);
        }
        let room = MAX_INCIDENTS.saturating_sub(self.incidents.len());
        self.incidents.extend(incidents.into_iter().take(room));
        self.files.push(report);
        Ok(true)
    }

    /// Puts the logs into the report and joins their incidents to the capture's.
    pub fn attach(self, report: &mut crate::Report) {
        let anchor = report.time.wall_anchor;
        let wall =
            |ts: u64| anchor.map(|a| (i128::from(a.wall_ns) + i128::from(ts) - i128::from(a.mono_ns)).max(0) as u64);
        let captured: Vec<Captured> = report
            .ooms
            .iter()
            .map(|o| &o.incident)
            .map(|o| Captured { id: o.id, pid: o.pid, requested: o.requested_bytes, wall_ns: wall(o.ts_ns) })
            .collect();
        let mut incidents = self.incidents;
        for i in &mut incidents {
            i.resolve_time(anchor.map(|a| a.wall_ns));
        }
        join(&mut incidents, &captured);
        report.logs = self.files;
        report.log_incidents = incidents;
    }
}

/// The logs' part of the text report: what each log held, then each incident with its
/// verdict, the numbers as the log wrote them, and the fix.
pub fn render_text(o: &mut String, r: &crate::Report) {
    use std::fmt::Write;
    if r.logs.is_empty() {
        return;
    }
    let _ = writeln!(o, "\nFROM LOGS ({} incident(s) in {} file(s))", r.log_incidents.len(), r.logs.len());
    for f in &r.logs {
        let sources: Vec<String> = f.by_source.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let _ = writeln!(
            o,
            "  {}{}: {} lines, {} understood ({}), {} skipped{}{}",
            f.path,
            if f.gzip { " (gzip)" } else { "" },
            f.lines,
            f.understood,
            if sources.is_empty() { "none".to_string() } else { sources.join(", ") },
            f.skipped,
            if f.long_lines > 0 { format!(", {} over-long lines cut", f.long_lines) } else { String::new() },
            if f.incidents_unlisted > 0 {
                format!(", {} more incidents not listed", f.incidents_unlisted)
            } else {
                String::new()
            }
        );
        for n in &f.notes {
            let _ = writeln!(o, "    note: {n}");
        }
    }
    for (n, i) in r.log_incidents.iter().enumerate() {
        let mut pid = i.pid.map(|p| format!("pid {p}")).unwrap_or_else(|| "no pid".into());
        if let Some(t) = &i.time {
            pid += &format!(", logged {t}");
        }
        let _ = writeln!(o, "  L{} {}:{} ({}, {}): {}", n + 1, i.file, i.line, i.source, pid, i.verdict_name);
        let _ = writeln!(o, "     {}", i.explanation);
        if let Some(fix) = &i.fix {
            let _ = writeln!(o, "     fix: {fix}");
        }
        if let Some(id) = i.capture_incident {
            let driver = r.oom_position(id).map_or("?", |k| r.ooms[k].incident.verdict.name());
            let _ = writeln!(o, "     joins capture incident {id} (judged from the driver alone: {driver})");
        }
        if let Some(j) = &i.join {
            let _ = writeln!(o, "     join: {j}");
        }
    }
}

/// Fuzz body (`fuzz/fuzz_targets/log_parsers.rs`): the first byte picks one parser alone
/// (0..4) or all of them (anything else, as `analyze` reads a log); the rest is the log.
/// Whatever the bytes, reading ends, every line is counted once, and nothing panics.
pub fn fuzz_target(data: &[u8]) {
    let Some((&pick, text)) = data.split_first() else { return };
    let mut report = LogFileReport::default();
    let mut incidents = Vec::new();
    let mut all = parsers();
    let chosen = if (pick as usize) < all.len() { vec![all.swap_remove(pick as usize)] } else { all };
    let result = read_lines_with(std::io::BufReader::new(text), &mut report, &mut incidents, chosen);
    assert!(result.is_ok(), "reading from memory cannot fail");
    assert_eq!(report.understood + report.skipped, report.lines, "every line counted once");
    assert!(incidents.len() as u64 <= report.lines + 4, "at most one incident per line, plus those ended at the end");
    // Times, as the join reads them: found in any line, read against any reference.
    for line in String::from_utf8_lossy(text).lines().take(256) {
        if let Some(t) = time::find(line).and_then(time::parse) {
            for reference in [None, Some(0), Some(u64::MAX)] {
                let _ = t.unix_ns(reference);
            }
        }
    }
    let captured = [Captured { id: 1, pid: 1, requested: 2 << 30, wall_ns: Some(u64::MAX) }];
    for i in &mut incidents {
        i.resolve_time(Some(u64::MAX));
    }
    join(&mut incidents, &captured);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("2.00 GiB"), Some(2 << 30));
        assert_eq!(parse_size("0 bytes"), Some(0));
        assert_eq!(parse_size("256B"), Some(256));
        assert_eq!(parse_size("256.00MiB"), Some(256 << 20));
        assert_eq!(parse_size("1.5 GB"), Some(1_500_000_000));
        // PyTorch prints its "no limit" as 2^64 bytes: more than a u64 holds.
        assert_eq!(parse_size("17179869184.00 GiB"), None);
        assert_eq!(parse_size("16777216.00 GiB"), Some(1 << 54));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("1e400 GiB"), None);
    }

    #[test]
    fn what_is_read_as_a_log() {
        assert!(is_log(b"torch.OutOfMemoryError: CUDA out of memory.\n"));
        assert!(is_log(&[0x1f, 0x8b, 8, 0]));
        assert!(!is_log(b"VRHKCAPT\x01\x00"), "a capture");
        assert!(!is_log(b"VRH"), "a capture cut inside its magic reads as truncated");
        assert!(!is_log(b"\x80\x04((((((((("), "a pickle");
        assert!(!is_log(&[0u8; 64]), "binary");
        assert!(!is_log(b""));
    }

    #[test]
    fn journal_prefixes() {
        let (t, p, m) = strip_prefix("Dec 01 05:06:42 gpu1 python3[1234]: torch.OutOfMemoryError: x");
        assert_eq!((t, p, m), (Some("Dec 01 05:06:42"), Some(1234), "torch.OutOfMemoryError: x"));
        let (t, p, m) = strip_prefix("2026-12-01T05:06:42+0000 gpu1 ollama[77]: msg");
        assert_eq!((t, p, m), (Some("2026-12-01T05:06:42+0000"), Some(77), "msg"));
        let (t, p, m) = strip_prefix("torch.OutOfMemoryError: CUDA out of memory.");
        assert_eq!((t, p, m), (None, None, "torch.OutOfMemoryError: CUDA out of memory."));
    }

    #[test]
    fn long_lines_are_cut_and_the_next_line_still_read() {
        let mut text = vec![b'x'; MAX_LINE * 3];
        text.extend_from_slice(b"\nsecond\n");
        let (report, _) = read_log("t", &text[..], false).expect("read");
        assert_eq!((report.lines, report.long_lines, report.skipped), (2, 1, 2));
    }

    #[test]
    fn binary_junk_is_skipped_and_counted() {
        let junk: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
        let (report, incidents) = read_log("junk", &junk[..], false).expect("read");
        assert!(incidents.is_empty());
        assert_eq!(report.understood, 0);
        assert!(report.binary_lines > 0);
    }
}
