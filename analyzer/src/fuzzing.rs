//! Bodies of the fuzz targets in `fuzz/` (cargo-fuzz), here so that ordinary tests run
//! them over a seed corpus. Each must return normally on any input: a panic is a bug.

use crate::{analyze_bytes, Options};
use std::io::Cursor;
use vramhook_protocol::capture::{CaptureError, CaptureReader, Frame};

/// The capture reader alone: read every frame, resync after corruption, never loop forever.
pub fn capture_reader(data: &[u8]) {
    let Ok(mut r) = CaptureReader::new(Cursor::new(data)) else { return };
    let mut guard = 0usize;
    loop {
        guard += 1;
        if guard > data.len() + 16 {
            panic!("capture reader does not advance");
        }
        match r.next_frame() {
            Ok(None) => break,
            Ok(Some(Frame::Events(recs))) => {
                for raw in recs {
                    let _ = vramhook_protocol::Event::from_raw(raw);
                }
            }
            Ok(Some(_)) => {}
            Err(CaptureError::Corrupt { .. }) => match r.resync() {
                Ok(Some(_)) => {}
                _ => break,
            },
            Err(_) => break,
        }
    }
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
