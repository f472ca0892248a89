//! Bodies of the fuzz targets in `fuzz/` (cargo-fuzz), here so that ordinary tests run
//! them over a seed corpus. Each must return normally on any input: a panic is a bug.

use crate::{analyze_bytes, Options};
use std::io::Cursor;
use vramhook_protocol::capture::{Bytes, CaptureError, CaptureReader, Frame, SeekSource};

/// The capture reader alone: read every frame, resync after corruption, never loop forever;
/// and the two ways of reading (a stream through a buffer, bytes lent in place as from a
/// mapped file) see the same frames and errors at the same offsets.
pub fn capture_reader(data: &[u8]) {
    let streamed = CaptureReader::new(Cursor::new(data)).map(|r| read_all(r, data.len()));
    let in_place = CaptureReader::from_source(Bytes::new(data)).map(|r| read_all(r, data.len()));
    assert_eq!(streamed, in_place, "streamed and in-place reading disagree");
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
    if let Ok(report) = analyze_bytes("fuzz.pickle", &bytes, &Options::default()) {
        let _ = crate::text::render(&report);
    }
}

/// Whole analysis of arbitrary bytes, with every renderer.
pub fn analyze_bytes_target(data: &[u8]) {
    for strict in [false, true] {
        let opts = Options { strict, max_points: 64, ..Options::default() };
        if let Ok(report) = analyze_bytes("fuzz.vhc", data, &opts) {
            let _ = crate::text::render(&report);
            let _ = crate::html::render(&report);
            let _ = crate::perfetto::render(&report);
            let _ = serde_json::to_string(&report);
        }
    }
}
