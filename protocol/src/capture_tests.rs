use crate::capture::*;
use crate::record::{Api, Event};
use std::io::Cursor;

pub(crate) fn sample_events(n: u64) -> Vec<Event> {
    (0..n)
        .map(|i| {
            Event::alloc(Api::cuMemAlloc_v2, 0x7000_0000 + i * 512, 512)
                .by(42, 43)
                .at(1000 + i)
                .with_seq(i)
                .on_device(0)
        })
        .collect()
}

fn sample_capture(sealed: bool) -> Vec<u8> {
    let header = CaptureHeader {
        version: CAPTURE_VERSION,
        mono_anchor_ns: 5,
        wall_anchor_ns: 6,
        flags: 0,
        host: "gpu-host-1".into(),
    };
    let mut w = CaptureWriter::new(Vec::new(), &header).expect("header");
    w.write_process(&ProcessInfo {
        pid: 42,
        ppid: 1,
        uid: 1000,
        start_time: 77,
        run_id: 9,
        exe: "/usr/bin/python3".into(),
        cmdline: vec!["python3".into(), "train.py".into()],
    })
    .expect("process");
    w.write_events(&sample_events(100)).expect("events");
    w.write_process_end(&ProcessEnd {
        pid: 42,
        exit_status: Some(0),
        start_time: 77,
        delivered: 100,
        ..ProcessEnd::default()
    })
    .expect("end");
    if sealed {
        w.finish().expect("finish")
    } else {
        w.flush().expect("flush");
        w_into_inner(w)
    }
}

fn w_into_inner(w: CaptureWriter<Vec<u8>>) -> Vec<u8> {
    // An unsealed capture: everything but the end frame.
    let sealed = w.finish().expect("finish");
    sealed[..sealed.len() - (FRAME_HEADER_SIZE + 16)].to_vec()
}

fn read_all(bytes: &[u8]) -> (Vec<Event>, Option<CaptureError>, bool) {
    let mut r = match CaptureReader::new(Cursor::new(bytes)) {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(e), false),
    };
    let mut events = Vec::new();
    let mut saw_end = false;
    loop {
        match r.next_frame() {
            Ok(Some(Frame::Events(recs))) => events.extend(recs.iter().map(Event::from_raw)),
            Ok(Some(Frame::End { events: n, .. })) => {
                if n as usize != events.len() {
                    return (events, Some(CaptureError::Corrupt { offset: 0, reason: "count".into() }), true);
                }
                saw_end = true;
            }
            Ok(Some(_)) => {}
            Ok(None) => return (events, None, saw_end),
            Err(e) => return (events, Some(e), saw_end),
        }
    }
}

#[test]
fn round_trip() {
    let bytes = sample_capture(true);
    let mut r = CaptureReader::new(Cursor::new(&bytes)).expect("reader");
    assert_eq!(r.header().host, "gpu-host-1");
    let mut kinds = Vec::new();
    while let Some(frame) = r.next_frame().expect("frame") {
        kinds.push(match frame {
            Frame::Process(p) => {
                assert_eq!(p.cmdline, vec!["python3", "train.py"]);
                "process"
            }
            Frame::Events(e) => {
                assert_eq!(e.len(), 100);
                "events"
            }
            Frame::ProcessEnd(end) => {
                assert_eq!(end.exit_status, Some(0));
                "end-proc"
            }
            Frame::End { .. } => "end",
            _ => "other",
        });
    }
    assert_eq!(kinds, vec!["process", "events", "end-proc", "end"]);
    let (events, err, saw_end) = read_all(&bytes);
    assert_eq!(events, sample_events(100));
    assert!(err.is_none() && saw_end);
}

#[test]
fn every_truncation_keeps_what_came_before_and_says_where() {
    let bytes = sample_capture(true);
    for cut in 0..bytes.len() {
        let (events, err, saw_end) = read_all(&bytes[..cut]);
        assert!(!saw_end, "cut at {cut} still saw the end frame");
        match err {
            Some(CaptureError::Truncated(at)) => {
                assert!(at as usize <= cut, "cut {cut} reported {at}")
            }
            other => panic!("cut at {cut}: expected truncation, got {other:?}"),
        }
        assert!(events.len() <= 100);
    }
}

#[test]
fn unsealed_capture_reads_as_truncated_with_all_events() {
    let bytes = sample_capture(false);
    let (events, err, _) = read_all(&bytes);
    assert_eq!(events.len(), 100);
    assert_eq!(err, Some(CaptureError::Truncated(bytes.len() as u64)));
}

#[test]
fn bit_flips_never_panic_and_are_detected() {
    let bytes = sample_capture(true);
    let mut undetected = 0;
    for i in 0..bytes.len() {
        for bit in [0u8, 3, 7] {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            let (events, err, _) = read_all(&b);
            if err.is_none() && events != sample_events(100) {
                undetected += 1;
            }
        }
    }
    // Only padding is outside the checksums.
    assert!(undetected == 0, "{undetected} flips changed events without an error");
}

#[test]
fn resync_skips_a_corrupt_frame() {
    let header = CaptureHeader::now();
    let mut w = CaptureWriter::new(Vec::new(), &header).expect("header");
    w.write_events(&sample_events(10)).expect("a");
    let first_end = w.bytes_written() as usize;
    w.write_events(&sample_events(20)).expect("b");
    w.write_events(&sample_events(30)).expect("c");
    let mut bytes = w.finish().expect("finish");
    bytes[first_end + 8] ^= 0xFF; // the second frame's length
    let mut r = CaptureReader::new(Cursor::new(&bytes)).expect("reader");
    let mut counts = Vec::new();
    let mut errors = 0;
    loop {
        match r.next_frame() {
            Ok(Some(Frame::Events(e))) => counts.push(e.len()),
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(CaptureError::Corrupt { offset, .. }) => {
                assert_eq!(offset as usize, first_end);
                errors += 1;
                r.resync().expect("resync");
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(errors, 1);
    assert_eq!(counts, vec![10, 30]);
}

#[test]
fn newer_versions_and_foreign_files_are_named() {
    let mut bytes = sample_capture(true);
    assert!(matches!(
        CaptureReader::new(Cursor::new(b"PK\x03\x04 not a capture at all, really not".as_slice())),
        Err(CaptureError::BadMagic)
    ));
    bytes[8] = 9;
    assert!(matches!(CaptureReader::new(Cursor::new(&bytes)), Err(CaptureError::NewerVersion(9))));
}
