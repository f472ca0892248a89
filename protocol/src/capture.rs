//! The capture file: a header, then frames, then an end frame.
//!
//! ```text
//! header  : "VRHKCAPT" | version u16 | 0xFEFF u16 | header_len u32 | mono_anchor_ns u64
//!           | wall_anchor_ns u64 | flags u64 | header_crc u32 | reserved[18] | host_len u16
//!           | host, padded to 8
//! frame   : "VRFM" | type u16 | flags u16 | payload_len u32 | crc u32 | payload, padded to 8
//! ```
//! The header's reserved area starts with a CRC-32 of the header's other bytes; a
//! frame's crc covers its type, flags, length and payload. Frame types and payloads:
//!
//! ```text
//! 1  events      : 64-byte records (`RawRecord`), at most FRAME_EVENTS per frame
//! 2  process     : `ProcessInfo::encode` (pid, ppid, uid, start time, run id, exe, argv)
//! 3  process end : `ProcessEnd::encode` (exit status, delivered, dropped, lost in flight, …)
//! 4  checkpoint  : a model checkpoint (the model's own versioned bytes)
//! 5  note        : UTF-8 text
//! 0xFFFF end     : events u64 | frames u64 (counting the end frame itself)
//! ```
//!
//! All integers are little-endian. Event frames carry whole 64-byte records, the same
//! bytes as in the ring. A file without an end frame was cut short (a crash, a full
//! disk, or a writer still running): readers report "truncated at byte N" and keep
//! everything before the cut.

use crate::record::{Event, RawRecord, RECORD_SIZE};
use std::io::{self, Read, Write};
use zerocopy::{FromBytes, IntoBytes};

pub const CAPTURE_MAGIC: [u8; 8] = *b"VRHKCAPT";
/// 2: `gpu_process` and `framework_stats` records (a version-1 reader would count them as
/// unknown kinds).
pub const CAPTURE_VERSION: u16 = 2;
pub const ENDIAN_MARK: u16 = 0xFEFF;
pub const FRAME_MAGIC: [u8; 4] = *b"VRFM";
pub const FRAME_HEADER_SIZE: usize = 16;
const FIXED_HEADER_SIZE: usize = 64;
/// No frame may claim more than this: bounds a reader's memory on a hostile file.
pub const MAX_FRAME_PAYLOAD: usize = 64 << 20;
/// Events per frame a writer makes at most (256 KiB): a reader checks a frame's checksum,
/// then replays it, and a frame this size is still in the core's cache for the second pass
/// (with 4 MiB frames both passes read memory: the replay benchmark ran 15% slower).
pub const FRAME_EVENTS: usize = 4096;

code_enum! {
    /// What a frame holds (its type field).
    FrameType: u16 {
        Events = 1 => "events",
        Process = 2 => "process",
        ProcessEnd = 3 => "process_end",
        Checkpoint = 4 => "checkpoint",
        Note = 5 => "note",
        End = 0xFFFF => "end",
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureHeader {
    pub version: u16,
    pub mono_anchor_ns: u64,
    pub wall_anchor_ns: u64,
    pub flags: u64,
    pub host: String,
}

impl CaptureHeader {
    /// Wall-clock ns for a monotonic timestamp of this capture.
    pub fn wall_time_ns(&self, mono_ns: u64) -> u64 {
        (self.wall_anchor_ns as i128 + mono_ns as i128 - self.mono_anchor_ns as i128).max(0) as u64
    }
}

/// A traced process, as far as the interposer could tell at its first CUDA call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    pub start_time: u64,
    pub run_id: u64,
    pub exe: String,
    pub cmdline: Vec<String>,
}

impl ProcessInfo {
    pub fn encode(&self) -> Vec<u8> {
        let cmdline = self.cmdline.join("\0");
        let mut out = Vec::with_capacity(40 + self.exe.len() + cmdline.len());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.ppid.to_le_bytes());
        out.extend_from_slice(&self.uid.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.start_time.to_le_bytes());
        out.extend_from_slice(&self.run_id.to_le_bytes());
        out.extend_from_slice(&(self.exe.len() as u32).to_le_bytes());
        out.extend_from_slice(&(cmdline.len() as u32).to_le_bytes());
        out.extend_from_slice(self.exe.as_bytes());
        out.extend_from_slice(cmdline.as_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ProcessInfo, &'static str> {
        let mut r = Cursor::new(bytes);
        let pid = r.u32()?;
        let ppid = r.u32()?;
        let uid = r.u32()?;
        let _reserved = r.u32()?;
        let start_time = r.u64()?;
        let run_id = r.u64()?;
        let exe_len = r.u32()? as usize;
        let cmd_len = r.u32()? as usize;
        let exe = String::from_utf8_lossy(r.bytes(exe_len)?).into_owned();
        let cmd = r.bytes(cmd_len)?;
        let cmdline = if cmd.is_empty() {
            Vec::new()
        } else {
            cmd.split(|b| *b == 0).map(|p| String::from_utf8_lossy(p).into_owned()).collect()
        };
        Ok(ProcessInfo { pid, ppid, uid, start_time, run_id, exe, cmdline })
    }
}

/// How a traced process's stream ended, written when its ring is closed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessEnd {
    pub pid: u32,
    /// Exit status as `wait` reported it, or `None` when the reader could not know.
    pub exit_status: Option<i32>,
    pub start_time: u64,
    /// Monotonic ns at which the reader closed the stream (the process was gone by then).
    pub ts_ns: u64,
    pub delivered: u64,
    /// Events the writer dropped because the ring was full.
    pub dropped: u64,
    /// Slots reserved by a writer that died before publishing them.
    pub lost_in_flight: u64,
    pub malformed: u64,
    pub hook_misses: u64,
}

impl ProcessEnd {
    const SIZE: usize = 64;

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.exit_status.unwrap_or(i32::MIN).to_le_bytes());
        for v in [
            self.start_time,
            self.ts_ns,
            self.delivered,
            self.dropped,
            self.lost_in_flight,
            self.malformed,
            self.hook_misses,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ProcessEnd, &'static str> {
        let mut r = Cursor::new(bytes);
        let pid = r.u32()?;
        let status = r.u32()? as i32;
        Ok(ProcessEnd {
            pid,
            exit_status: (status != i32::MIN).then_some(status),
            start_time: r.u64()?,
            ts_ns: r.u64()?,
            delivered: r.u64()?,
            dropped: r.u64()?,
            lost_in_flight: r.u64()?,
            malformed: r.u64()?,
            hook_misses: r.u64()?,
        })
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        let end = self.pos.checked_add(n).ok_or("length overflow")?;
        let out = self.bytes.get(self.pos..end).ok_or("short payload")?;
        self.pos = end;
        Ok(out)
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().map_err(|_| "short payload")?))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().map_err(|_| "short payload")?))
    }
}

fn pad8(n: usize) -> usize {
    (8 - n % 8) % 8
}

/// Writes a capture. Every frame is written whole with one `write_all`; call `flush`
/// to make frames visible to a concurrent reader and `finish` to seal the file.
pub struct CaptureWriter<W: Write> {
    out: W,
    frames: u64,
    events: u64,
    bytes: u64,
    buf: Vec<u8>,
}

impl<W: Write> CaptureWriter<W> {
    pub fn new(mut out: W, header: &CaptureHeader) -> io::Result<CaptureWriter<W>> {
        let host = header.host.as_bytes();
        let host = &host[..host.len().min(255)];
        let header_len = FIXED_HEADER_SIZE + host.len() + pad8(host.len());
        let mut buf = Vec::with_capacity(header_len);
        buf.extend_from_slice(&CAPTURE_MAGIC);
        buf.extend_from_slice(&CAPTURE_VERSION.to_le_bytes());
        buf.extend_from_slice(&ENDIAN_MARK.to_le_bytes());
        buf.extend_from_slice(&(header_len as u32).to_le_bytes());
        buf.extend_from_slice(&header.mono_anchor_ns.to_le_bytes());
        buf.extend_from_slice(&header.wall_anchor_ns.to_le_bytes());
        buf.extend_from_slice(&header.flags.to_le_bytes());
        buf.extend_from_slice(&[0u8; 22]);
        buf.extend_from_slice(&(host.len() as u16).to_le_bytes());
        buf.extend_from_slice(host);
        buf.resize(header_len, 0);
        let crc = header_crc(&buf);
        buf[40..44].copy_from_slice(&crc.to_le_bytes());
        out.write_all(&buf)?;
        Ok(CaptureWriter { out, frames: 0, events: 0, bytes: header_len as u64, buf: Vec::new() })
    }

    pub fn write_frame(&mut self, kind: FrameType, payload: &[u8]) -> io::Result<()> {
        if payload.len() > MAX_FRAME_PAYLOAD {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "capture frame payload too large"));
        }
        self.buf.clear();
        self.buf.extend_from_slice(&FRAME_MAGIC);
        self.buf.extend_from_slice(&(kind as u16).to_le_bytes());
        self.buf.extend_from_slice(&0u16.to_le_bytes());
        self.buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = frame_crc(&self.buf[4..12], payload);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(self.buf.len() + pad8(payload.len()), 0);
        self.out.write_all(&self.buf)?;
        self.frames += 1;
        self.bytes += self.buf.len() as u64;
        Ok(())
    }

    /// Writes events, split into frames of at most 65,536 records.
    /// Writes events as frames of at most [`FRAME_EVENTS`] records.
    pub fn write_events(&mut self, events: &[Event]) -> io::Result<()> {
        let mut payload = Vec::with_capacity(events.len().min(FRAME_EVENTS) * RECORD_SIZE);
        for chunk in events.chunks(FRAME_EVENTS) {
            payload.clear();
            for e in chunk {
                payload.extend_from_slice(e.to_raw().as_bytes());
            }
            self.write_frame(FrameType::Events, &payload)?;
            self.events += chunk.len() as u64;
        }
        Ok(())
    }

    pub fn write_process(&mut self, info: &ProcessInfo) -> io::Result<()> {
        self.write_frame(FrameType::Process, &info.encode())
    }

    pub fn write_process_end(&mut self, end: &ProcessEnd) -> io::Result<()> {
        self.write_frame(FrameType::ProcessEnd, &end.encode())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    pub fn events_written(&self) -> u64 {
        self.events
    }

    /// Writes the end frame and flushes; returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        let mut payload = Vec::with_capacity(16);
        payload.extend_from_slice(&self.events.to_le_bytes());
        payload.extend_from_slice(&(self.frames + 1).to_le_bytes());
        self.write_frame(FrameType::End, &payload)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Why reading stopped or what was skipped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CaptureError {
    #[error("not a capture (bad magic: a vramhook capture starts with VRHKCAPT)")]
    BadMagic,
    #[error("capture format version {0} is newer than this reader understands ({CAPTURE_VERSION}); upgrade vramhook")]
    NewerVersion(u16),
    #[error("capture was written big-endian or is corrupt (endianness mark {0:#06x})")]
    BadEndianness(u16),
    #[error("capture header is corrupt: {0}")]
    BadHeader(&'static str),
    #[error("truncated at byte {0}")]
    Truncated(u64),
    #[error("corrupt frame at byte {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    #[error("i/o error at byte {offset}: {message}")]
    Io { offset: u64, message: String },
}

/// One frame, borrowed from the reader's buffer.
#[derive(Debug)]
pub enum Frame<'a> {
    Events(&'a [RawRecord]),
    Process(ProcessInfo),
    ProcessEnd(ProcessEnd),
    Checkpoint(&'a [u8]),
    Note(&'a [u8]),
    /// A frame type from a newer writer: skipped, counted by the caller.
    Unknown(u16),
    End {
        events: u64,
        frames: u64,
    },
}

/// Where a reader's bytes come from: a stream read into one reusable buffer
/// ([`Streamed`]), or bytes already in memory lent out without a copy ([`Bytes`], and
/// [`crate::mapped::Mapped`] for a memory-mapped file).
pub trait Source {
    /// The next `n` bytes; fewer only where the input ends.
    fn take(&mut self, n: usize) -> io::Result<&[u8]>;
    /// Where the input was cut if it shrank while being read (a mapped file truncated
    /// underneath reads as zeros from there).
    fn shrank(&self) -> Option<u64> {
        None
    }
}

/// A [`Source`] that can move to any byte (for resynchronising after a corrupt frame).
pub trait SeekSource: Source {
    fn seek_to(&mut self, pos: u64) -> io::Result<()>;
}

/// Any reader, through one reusable buffer: memory stays bounded by the largest frame
/// whatever the input's size.
pub struct Streamed<R> {
    input: R,
    buf: Vec<u8>,
}

impl<R: Read> Streamed<R> {
    pub fn new(input: R) -> Streamed<R> {
        Streamed { input, buf: Vec::new() }
    }
}

impl<R: Read> Source for Streamed<R> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        self.buf.resize(n, 0);
        let got = read_full(&mut self.input, &mut self.buf)?;
        Ok(&self.buf[..got])
    }
}

impl<R: Read + io::Seek> SeekSource for Streamed<R> {
    fn seek_to(&mut self, pos: u64) -> io::Result<()> {
        self.input.seek(io::SeekFrom::Start(pos)).map(|_| ())
    }
}

/// A stream that cannot seek (a pipe, a FIFO, a socket), read through one buffer that keeps
/// the bytes of the last two `take`s: enough to resynchronise after a corrupt frame (the
/// reader seeks back into the frame it just read, then forward), so a pipe reads exactly
/// as the same bytes in a file. Memory stays bounded by the two largest frames.
pub struct Piped<R> {
    input: R,
    buf: Vec<u8>,
    /// Offset in the stream of `buf[0]`.
    base: u64,
    pos: u64,
    /// Where the last two `take`s started (the older first).
    marks: [u64; 2],
    eof: bool,
}

impl<R: Read> Piped<R> {
    pub fn new(input: R) -> Piped<R> {
        Piped { input, buf: Vec::new(), base: 0, pos: 0, marks: [0, 0], eof: false }
    }

    /// Reads until the buffer reaches stream offset `end` or the input ends.
    fn fill_to(&mut self, end: u64) -> io::Result<()> {
        let have = self.base + self.buf.len() as u64;
        if end <= have || self.eof {
            return Ok(());
        }
        let old = self.buf.len();
        let want = usize::try_from(end - have).map_err(|_| io::Error::other("offset too large"))?;
        self.buf.resize(old + want, 0);
        let got = read_full(&mut self.input, &mut self.buf[old..])?;
        self.buf.truncate(old + got);
        if got < want {
            self.eof = true;
        }
        Ok(())
    }
}

impl<R: Read> Source for Piped<R> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        self.marks = [self.marks[1], self.pos];
        let keep_from = self.marks[0].min(self.pos);
        if keep_from > self.base {
            let drop = usize::try_from(keep_from - self.base).unwrap_or(usize::MAX).min(self.buf.len());
            self.buf.drain(..drop);
            self.base += drop as u64;
        }
        // A seek forward past what was read: read and forget up to it.
        while self.base + (self.buf.len() as u64) < self.pos && !self.eof {
            let have = self.base + self.buf.len() as u64;
            let step = (self.pos - have).min(1 << 20);
            self.buf.clear();
            self.base = have;
            self.fill_to(have + step)?;
            self.base += self.buf.len() as u64;
            self.buf.clear();
        }
        self.fill_to(self.pos.saturating_add(n as u64))?;
        let start = usize::try_from(self.pos.saturating_sub(self.base)).unwrap_or(usize::MAX).min(self.buf.len());
        let end = start.saturating_add(n).min(self.buf.len());
        self.pos = self.base + end as u64;
        Ok(&self.buf[start..end])
    }
}

impl<R: Read> SeekSource for Piped<R> {
    fn seek_to(&mut self, pos: u64) -> io::Result<()> {
        if pos < self.base {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "cannot seek back this far in a pipe"));
        }
        self.pos = pos;
        Ok(())
    }
}

/// Bytes in memory, lent out frame by frame without a copy.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data, pos: 0 }
    }
}

/// The next `n` bytes of `data` from `*pos` (fewer at its end), advancing `*pos`.
#[inline]
pub(crate) fn take_from<'a>(data: &'a [u8], pos: &mut usize, n: usize) -> &'a [u8] {
    let start = (*pos).min(data.len());
    let end = start.saturating_add(n).min(data.len());
    *pos = end;
    &data[start..end]
}

impl Source for Bytes<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        Ok(take_from(self.data, &mut self.pos, n))
    }
}

impl SeekSource for Bytes<'_> {
    fn seek_to(&mut self, pos: u64) -> io::Result<()> {
        self.pos = usize::try_from(pos).unwrap_or(usize::MAX);
        Ok(())
    }
}

/// Reads a capture frame by frame from a [`Source`].
pub struct CaptureReader<S> {
    source: S,
    header: CaptureHeader,
    offset: u64,
    frame_offset: u64,
    ended: bool,
}

impl<R: Read> CaptureReader<Streamed<R>> {
    /// Streams from any reader (give it a `BufReader` for files; [`crate::mapped::Mapped`]
    /// is faster for a file on disk).
    pub fn new(input: R) -> Result<CaptureReader<Streamed<R>>, CaptureError> {
        CaptureReader::from_source(Streamed::new(input))
    }
}

impl<S: Source> CaptureReader<S> {
    pub fn from_source(mut source: S) -> Result<CaptureReader<S>, CaptureError> {
        let mut fixed = [0u8; FIXED_HEADER_SIZE];
        let head = source.take(FIXED_HEADER_SIZE).map_err(|e| io_err(0, e))?;
        let got = head.len();
        fixed[..got].copy_from_slice(head);
        // Decided by the magic bytes there are: a real capture cut inside its header
        // starts with (part of) the magic and is "truncated"; six bytes of anything else
        // are not a capture at all.
        let magic = got.min(CAPTURE_MAGIC.len());
        if fixed[..magic] != CAPTURE_MAGIC[..magic] {
            return Err(CaptureError::BadMagic);
        }
        if got < FIXED_HEADER_SIZE {
            return Err(CaptureError::Truncated(got as u64));
        }
        let version = u16::from_le_bytes([fixed[8], fixed[9]]);
        let endian = u16::from_le_bytes([fixed[10], fixed[11]]);
        if endian != ENDIAN_MARK {
            return Err(CaptureError::BadEndianness(endian));
        }
        if version > CAPTURE_VERSION {
            return Err(CaptureError::NewerVersion(version));
        }
        if version == 0 {
            return Err(CaptureError::BadHeader("version 0"));
        }
        let header_len = u32::from_le_bytes(fixed[12..16].try_into().unwrap_or_default()) as usize;
        let host_len = u16::from_le_bytes([fixed[62], fixed[63]]) as usize;
        if host_len > 255 || header_len != FIXED_HEADER_SIZE + host_len + pad8(host_len) {
            return Err(CaptureError::BadHeader("header length does not match host name length"));
        }
        let rest = source.take(header_len - FIXED_HEADER_SIZE).map_err(|e| io_err(64, e))?.to_vec();
        if rest.len() < header_len - FIXED_HEADER_SIZE {
            return Err(CaptureError::Truncated((FIXED_HEADER_SIZE + rest.len()) as u64));
        }
        let mut whole = fixed.to_vec();
        whole.extend_from_slice(&rest);
        let stored_crc = u32::from_le_bytes(fixed[40..44].try_into().unwrap_or_default());
        if header_crc(&whole) != stored_crc {
            return Err(CaptureError::BadHeader("header checksum mismatch"));
        }
        let u64_at = |o: usize| u64::from_le_bytes(fixed[o..o + 8].try_into().unwrap_or_default());
        let header = CaptureHeader {
            version,
            mono_anchor_ns: u64_at(16),
            wall_anchor_ns: u64_at(24),
            flags: u64_at(32),
            host: String::from_utf8_lossy(&rest[..host_len]).into_owned(),
        };
        Ok(CaptureReader { source, header, offset: header_len as u64, frame_offset: header_len as u64, ended: false })
    }

    pub fn header(&self) -> &CaptureHeader {
        &self.header
    }

    /// Byte offset where the last frame returned (or failed) started.
    pub fn frame_offset(&self) -> u64 {
        self.frame_offset
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Where the input was cut if it shrank while being read (see [`Source::shrank`]).
    pub fn shrank(&self) -> Option<u64> {
        self.source.shrank()
    }

    /// Next frame; `Ok(None)` after the end frame. A file that stops without an end
    /// frame yields `Err(Truncated(offset))` where the incomplete data starts. A frame
    /// with a bad checksum yields `Err(Corrupt)` and the reader is left just past it
    /// (when its length was plausible), so a caller may continue.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, CaptureError> {
        if self.ended {
            return Ok(None);
        }
        self.frame_offset = self.offset;
        let start = self.offset;
        let got = self.source.take(FRAME_HEADER_SIZE).map_err(|e| io_err(start, e))?;
        if got.len() < FRAME_HEADER_SIZE {
            return Err(CaptureError::Truncated(start));
        }
        let mut fh = [0u8; FRAME_HEADER_SIZE];
        fh.copy_from_slice(got);
        if fh[..4] != FRAME_MAGIC {
            return Err(CaptureError::Corrupt { offset: start, reason: "bad frame magic".into() });
        }
        let kind = u16::from_le_bytes([fh[4], fh[5]]);
        let len = u32::from_le_bytes(fh[8..12].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(fh[12..16].try_into().unwrap_or_default());
        if len > MAX_FRAME_PAYLOAD {
            return Err(CaptureError::Corrupt { offset: start, reason: format!("frame claims {len} bytes") });
        }
        let padded = len + pad8(len);
        let body = self.source.take(padded).map_err(|e| io_err(start, e))?;
        if body.len() < padded {
            return Err(CaptureError::Truncated(start));
        }
        self.offset = start + (FRAME_HEADER_SIZE + padded) as u64;
        let payload = &body[..len];
        if frame_crc(&fh[4..12], payload) != crc {
            return Err(CaptureError::Corrupt { offset: start, reason: "checksum mismatch".into() });
        }
        let corrupt = |reason: &str| CaptureError::Corrupt { offset: start, reason: reason.to_string() };
        let frame = match FrameType::from_code(kind) {
            Some(FrameType::Events) => {
                if !len.is_multiple_of(RECORD_SIZE) {
                    return Err(corrupt("event frame length is not a multiple of 64"));
                }
                let records = <[RawRecord]>::ref_from_bytes(payload).map_err(|_| corrupt("misaligned records"))?;
                Frame::Events(records)
            }
            Some(FrameType::Process) => Frame::Process(ProcessInfo::decode(payload).map_err(corrupt)?),
            Some(FrameType::ProcessEnd) => Frame::ProcessEnd(ProcessEnd::decode(payload).map_err(corrupt)?),
            Some(FrameType::Checkpoint) => Frame::Checkpoint(payload),
            Some(FrameType::Note) => Frame::Note(payload),
            Some(FrameType::End) => {
                let mut r = Cursor::new(payload);
                let events = r.u64().map_err(corrupt)?;
                let frames = r.u64().map_err(corrupt)?;
                self.ended = true;
                Frame::End { events, frames }
            }
            None => Frame::Unknown(kind),
        };
        Ok(Some(frame))
    }
}

impl<S: SeekSource> CaptureReader<S> {
    /// After a `Corrupt` error: scans forward from one byte past the bad frame's start
    /// for the next frame magic and positions the reader there. Returns the bytes
    /// skipped, or `None` when no further frame exists.
    pub fn resync(&mut self) -> Result<Option<u64>, CaptureError> {
        let from = self.frame_offset + 1;
        self.source.seek_to(from).map_err(|e| io_err(from, e))?;
        let mut pos = from;
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let chunk = self.source.take(64 * 1024).map_err(|e| io_err(pos, e))?;
            let got = chunk.len();
            if got == 0 {
                self.offset = pos;
                return Ok(None);
            }
            let base = pos - carry.len() as u64;
            carry.extend_from_slice(chunk);
            if let Some(i) = carry.windows(4).position(|w| w == FRAME_MAGIC) {
                let at = base + i as u64;
                self.source.seek_to(at).map_err(|e| io_err(at, e))?;
                self.offset = at;
                return Ok(Some(at - self.frame_offset));
            }
            pos += got as u64;
            let keep = carry.len().min(3);
            carry.drain(..carry.len() - keep);
        }
    }
}

fn frame_crc(type_flags_len: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(type_flags_len);
    h.update(payload);
    h.finalize()
}

/// CRC of a header with its crc field (bytes 40..44) taken as zero.
fn header_crc(header: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&header[..40]);
    h.update(&[0u8; 4]);
    h.update(&header[44..]);
    h.finalize()
}

fn io_err(offset: u64, e: io::Error) -> CaptureError {
    CaptureError::Io { offset, message: e.to_string() }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
