//! Bodies of the fuzz targets in `fuzz/` (cargo-fuzz), here so that ordinary tests run
//! them over a seed corpus. Each must return normally on any input: a panic is a bug.

use crate::{analyze_bytes_many, analyze_bytes_work, InputStatus, Options};
use std::io::Cursor;
use vramhook_model::{Model, ModelConfig};
use vramhook_protocol::capture::{
    Bytes, CaptureError, CaptureHeader, CaptureReader, CaptureWriter, Frame, FrameType, Piped, SeekSource,
};
use vramhook_protocol::record::{Event, RawRecord, RECORD_SIZE};
use zerocopy::{FromBytes, IntoBytes};

/// The capture reader alone: read every frame, resync after corruption, never loop forever;
/// and the two ways of reading (a stream through a buffer, bytes lent in place as from a
/// mapped file) see the same frames and errors at the same offsets.
pub fn capture_reader(data: &[u8]) {
    let streamed = CaptureReader::new(Cursor::new(data)).map(|r| read_all(r, data.len()));
    let in_place = CaptureReader::from_source(Bytes::new(data)).map(|r| read_all(r, data.len()));
    assert_eq!(streamed, in_place, "streamed and in-place reading disagree");
    // A pipe (no seeking: resync seeks back only into the frame just read).
    let piped = CaptureReader::from_source(Piped::new(Cursor::new(data))).map(|r| read_all(r, data.len()));
    assert_eq!(streamed, piped, "streamed and piped reading disagree");
}

/// What a reader saw: per frame, its offset and a digest of its content or error.
fn read_all<S: SeekSource>(mut r: CaptureReader<S>, len: usize) -> Vec<(u64, String)> {
    let mut seen = Vec::new();
    let mut guard = 0usize;
    loop {
        guard += 1;
        if guard > len + 16 {
            panic!("capture reader does not advance");
        }
        let at = r.offset(); // where the next frame starts
        let frame = r.next_frame();
        match frame {
            Ok(None) => break,
            Ok(Some(Frame::Events(recs))) => {
                let sum =
                    recs.iter().map(|raw| vramhook_protocol::Event::from_raw(raw).size).fold(0u64, u64::wrapping_add);
                seen.push((at, format!("events {} {sum}", recs.len())));
            }
            Ok(Some(f)) => seen.push((at, format!("{f:?}"))),
            Err(e @ CaptureError::Corrupt { .. }) => {
                seen.push((at, e.to_string()));
                match r.resync() {
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            Err(e) => {
                seen.push((at, e.to_string()));
                break;
            }
        }
    }
    seen
}

/// The PyTorch snapshot importer (pickle VM plus import into the model), and its work per
/// input byte ([`check_work`]).
pub fn pytorch_snapshot(data: &[u8]) {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    if data.first() != Some(&0x80) {
        bytes.push(0x80);
    }
    bytes.extend_from_slice(data);
    for max_items in [crate::DEFAULT_MAX_ITEMS, 3] {
        let (result, work) = analyze_bytes_work("fuzz.pickle", &bytes, &Options { max_items, ..Options::default() });
        check_work(&work);
        if let Ok(report) = result {
            check_bounds(&report, max_items);
            let _ = crate::render::text::render(&report);
        }
    }
}

/// Work allowed per byte of input (all counters), and a floor for tiny inputs: whatever
/// a pickle shares, expanding and analysing it stays linear in its size.
pub const WORK_PER_BYTE: u64 = 8;
pub const WORK_FLOOR: u64 = 100_000;

/// The work counted for an input is within [`WORK_PER_BYTE`] of its bytes (a crash is not
/// the only failure: a small input that costs out of proportion is one too).
pub fn check_work(w: &crate::Work) {
    let counted = w.items_expanded + w.segment_visits;
    assert!(counted <= WORK_PER_BYTE * w.bytes + WORK_FLOOR, "{w:?}: {counted} units of work for {} bytes", w.bytes);
}

/// What `max_items` promises: at most that many processes, incidents and devices (plus the
/// "unknown" device -1), and the count of the rest.
fn check_bounds(r: &crate::Report, max_items: usize) {
    assert!(r.processes.len() <= max_items, "{} processes kept", r.processes.len());
    assert!(r.ooms.len() <= max_items, "{} incidents kept", r.ooms.len());
    assert!(r.devices.iter().filter(|d| d.device != -1).count() <= max_items, "{} devices kept", r.devices.len());
    assert_eq!(r.folded.max_items, max_items as u64);
    for i in &r.inputs {
        // A gap is only ever reported with what is missing.
        if i.status == InputStatus::Gap {
            assert!(i.missing_frames.is_some() && i.missing_events.is_some(), "a gap without its size");
        }
    }
}

/// Whole analysis of arbitrary bytes, with every renderer.
pub fn analyze_bytes_target(data: &[u8]) {
    // The last round also follows the fit's forecast (`--fit-trend`), on whatever times the
    // bytes say.
    let trend = vramhook_model::trend::TrendRule { window_ns: 1_000_000, horizon_ns: 5_000_000, hold_ns: 100_000 };
    for (strict, max_items, fit_trend) in
        [(false, crate::DEFAULT_MAX_ITEMS, None), (true, crate::DEFAULT_MAX_ITEMS, None), (false, 2, Some(trend))]
    {
        let opts = Options { strict, max_points: 64, max_items, fit_trend, ..Options::default() };
        let (result, work) = analyze_bytes_work("fuzz.vhc", data, &opts);
        check_work(&work);
        if let Ok(report) = result {
            check_bounds(&report, max_items);
            let _ = crate::render::text::render(&report);
            let _ = crate::render::html::render(&report);
            let _ = crate::render::perfetto::render(&report);
            let _ = serde_json::to_string(&report);
        }
    }
}

/// A checkpoint frame: a rotated capture starts with one and the replay resumes from it, so
/// its bytes are whoever wrote the file's. Whatever restores must be safe to drive on with
/// events and to report. The input: a little-endian u32 length, that many checkpoint bytes,
/// then 64-byte records; framed here with valid checksums, so every mutation reaches the
/// restore instead of dying at a frame's checksum.
pub fn model_checkpoint(data: &[u8]) {
    if let Some((checkpoint, records)) = split_prefixed(data) {
        analyze_bytes_target(&checkpoint_capture(checkpoint, records));
    }
}

/// A part of a fuzz input given by its length (little-endian u32, cut to what is there),
/// and what follows it.
fn split_prefixed(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = data.split_first_chunk::<4>()?;
    Some(rest.split_at((u32::from_le_bytes(*len) as usize).min(rest.len())))
}

/// `part` with its length before it, as [`split_prefixed`] reads it.
fn push_prefixed(out: &mut Vec<u8>, part: &[u8]) {
    out.extend_from_slice(&(part.len() as u32).to_le_bytes());
    out.extend_from_slice(part);
}

/// A capture of a checkpoint frame and then events (whole records of `records`).
pub fn checkpoint_capture(checkpoint: &[u8], records: &[u8]) -> Vec<u8> {
    let events: Vec<Event> = records
        .chunks_exact(RECORD_SIZE)
        .filter_map(|r| RawRecord::ref_from_bytes(r).ok())
        .map(Event::from_raw)
        .collect();
    let framed = CaptureWriter::new(Vec::new(), &CaptureHeader::default()).and_then(|mut w| {
        w.write_frame(FrameType::Checkpoint, checkpoint)?;
        w.write_events(&events)?;
        w.finish()
    });
    framed.unwrap_or_default()
}

/// An input for [`model_checkpoint`] made from a capture: the model after the first half
/// of its events, then the other half. `None` for bytes that hold no events.
pub fn model_checkpoint_seed(capture: &[u8]) -> Option<Vec<u8>> {
    let mut reader = CaptureReader::from_source(Bytes::new(capture)).ok()?;
    let mut model = Model::new(ModelConfig::default());
    let mut events: Vec<Event> = Vec::new();
    let mut infos = Vec::new();
    while let Ok(Some(frame)) = reader.next_frame() {
        match frame {
            Frame::Events(recs) => events.extend(recs.iter().map(Event::from_raw)),
            Frame::Process(info) => infos.push(info),
            _ => {}
        }
    }
    if events.is_empty() {
        return None;
    }
    for info in &infos {
        model.process_info(info);
    }
    let (before, after) = events.split_at(events.len() / 2);
    before.iter().for_each(|e| model.apply(e));
    let mut out = Vec::new();
    push_prefixed(&mut out, &model.checkpoint());
    after.iter().for_each(|e| out.extend_from_slice(e.to_raw().as_bytes()));
    Some(out)
}

/// Inputs analysed together, as `vramhook analyze run.vhc snap.pickle server.log` does: a
/// snapshot's segments are looked up among the captures' allocations, a log's failures
/// among their incidents. The input: up to three parts, each but the last a little-endian
/// u32 length and that many bytes; each part is read as what it looks like (capture,
/// PyTorch snapshot or log), in both orders of the first two. An empty last part is none.
pub fn joined_inputs(data: &[u8]) {
    let mut parts: Vec<&[u8]> = Vec::new();
    let mut rest = data;
    while parts.len() < 2 {
        let Some((part, tail)) = split_prefixed(rest) else { break };
        parts.push(part);
        rest = tail;
    }
    if !rest.is_empty() || parts.is_empty() {
        parts.push(rest);
    }
    let names = ["fuzz-1", "fuzz-2", "fuzz-3"];
    let mut inputs: Vec<(&str, &[u8])> = names.iter().copied().zip(parts).collect();
    for round in 0..inputs.len().min(2) {
        if round == 1 {
            inputs.swap(0, 1);
        }
        for max_items in [crate::DEFAULT_MAX_ITEMS, 2] {
            let opts = Options { max_points: 64, max_items, ..Options::default() };
            if let Ok(report) = analyze_bytes_many(&inputs, &opts) {
                check_bounds(&report, max_items);
                let _ = crate::render::text::render(&report);
                let _ = crate::render::html::render(&report);
                let _ = serde_json::to_string(&report);
            }
        }
    }
}

/// An input for [`joined_inputs`] of two or three parts.
pub fn joined_inputs_seed(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if i < 2 {
            push_prefixed(&mut out, part);
        } else {
            out.extend_from_slice(part);
        }
    }
    out
}
