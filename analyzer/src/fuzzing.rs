//! Bodies of the fuzz targets in `fuzz/` (cargo-fuzz), here so that ordinary tests run
//! them over a seed corpus. Each must return normally on any input: a panic is a bug.

use crate::{analyze_bytes, InputStatus, Options};
use std::io::Cursor;
use vramhook_protocol::capture::{Bytes, CaptureError, CaptureReader, Frame, Piped, SeekSource};

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

/// The PyTorch snapshot importer (pickle VM plus import into the model).
pub fn pytorch_snapshot(data: &[u8]) {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    if data.first() != Some(&0x80) {
        bytes.push(0x80);
    }
    bytes.extend_from_slice(data);
    for max_items in [crate::DEFAULT_MAX_ITEMS, 3] {
        if let Ok(report) = analyze_bytes("fuzz.pickle", &bytes, &Options { max_items, ..Options::default() }) {
            check_bounds(&report, max_items);
            let _ = crate::render::text::render(&report);
        }
    }
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
    for (strict, max_items) in [(false, crate::DEFAULT_MAX_ITEMS), (true, crate::DEFAULT_MAX_ITEMS), (false, 2)] {
        let opts = Options { strict, max_points: 64, max_items, ..Options::default() };
        if let Ok(report) = analyze_bytes("fuzz.vhc", data, &opts) {
            check_bounds(&report, max_items);
            let _ = crate::render::text::render(&report);
            let _ = crate::render::html::render(&report);
            let _ = crate::render::perfetto::render(&report);
            let _ = serde_json::to_string(&report);
        }
    }
}
