//! A reader killed after its capture recorded events but before it committed them: the
//! events are still in the ring, and the next reader, told by the capture what was
//! recorded, skips them (no duplicate) and delivers the rest (no loss). This drives the
//! agent's own pieces (ring source, capture thread, recovery) the way its ingest loop
//! does, with the kill placed exactly in that window, which a real SIGKILL hits only by
//! chance.

use std::path::Path;
use std::sync::Arc;
use vramhook_agent::capture::{self, CaptureConfig, CaptureMsg};
use vramhook_agent::rings::{RingFilter, RingSource, SourceItem};
use vramhook_agent::stats::AgentStats;
use vramhook_model::{Model, ModelConfig};
use vramhook_protocol::record::{Api, Event, EventKind};
use vramhook_ring::{RingInit, RingWriter};
use vramhook_testkit::{make_ring_file, start_time};

const CAPACITY: u64 = 1024;

/// A ring of this (live) process, its writer kept mapped so that it can write more.
struct LiveRing {
    writer: RingWriter,
    map: *mut libc::c_void,
    len: usize,
    next: u64,
}

impl LiveRing {
    fn create(dir: &Path) -> LiveRing {
        let pid = std::process::id();
        let start = start_time(pid);
        // SAFETY: geteuid has no preconditions.
        let init = RingInit {
            capacity: CAPACITY,
            pid,
            start_time: start,
            uid: unsafe { libc::geteuid() },
            ..RingInit::default()
        };
        // Unmapped on drop.
        let (writer, map, len) = make_ring_file(dir, &format!("{pid}-{start}-0.ring"), &init, 1, b"", |_, _| {});
        LiveRing { writer, map: map.cast(), len, next: 0 }
    }

    fn write(&mut self, n: u64) {
        for _ in 0..n {
            self.next += 1;
            let e = Event {
                pid: std::process::id(),
                kind: EventKind::Alloc.code(),
                api: Api::cuMemAlloc_v2.code(),
                addr: 0x10_0000 * self.next,
                size: 4096,
                ..Event::default()
            };
            assert!(self.writer.push(&e.to_raw()), "ring full");
        }
    }
}

impl Drop for LiveRing {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.map, self.len) };
    }
}

/// Polls once as the agent's ingest loop does (announce, apply, send to the capture);
/// returns the events delivered.
fn poll_into(source: &mut RingSource, model: &mut Model, capture: &capture::CaptureHandle) -> (u64, u64) {
    let summary = source.poll(&mut |item| match item {
        SourceItem::Process(info) => {
            let key = (info.pid, info.start_time, 0);
            capture.send(CaptureMsg::Ring(key));
            capture.send(CaptureMsg::Process(info.clone()));
            model.process_info(info);
        }
        SourceItem::Events(events) => {
            for e in events {
                model.apply(e);
            }
            capture.send(CaptureMsg::Events(events.to_vec()));
        }
        SourceItem::End(end) => {
            capture.send(CaptureMsg::End(end));
        }
    });
    (summary.delivered, summary.duplicates)
}

#[test]
fn a_reader_killed_between_record_and_commit_loses_nothing_and_delivers_nothing_twice() {
    let rings = tempfile::tempdir().expect("ring dir");
    let captures = tempfile::tempdir().expect("capture dir");
    let mut ring = LiveRing::create(rings.path());
    ring.write(600);

    // First reader: two polls, a checkpoint between them; nothing is ever committed.
    let stats = Arc::new(AgentStats::default());
    let (handle, join) = capture::spawn(CaptureConfig::new(captures.path()), stats.clone()).expect("capture");
    let mut model = Model::new(ModelConfig::default());
    let mut source = RingSource::new(rings.path(), RingFilter::default(), None);
    source.deferred_commit = true;
    source.batch_limit = 400;
    handle.send(CaptureMsg::Checkpoint {
        model: model.checkpoint(),
        rings: Vec::new(),
        ended: Vec::new(),
        rotate: true,
    });
    assert_eq!(poll_into(&mut source, &mut model, &handle), (400, 0));
    // The checkpoint names the 400 events as recorded but not committed...
    handle.send(CaptureMsg::Checkpoint {
        model: model.checkpoint(),
        rings: source.ring_cursors(),
        ended: Vec::new(),
        rotate: false,
    });
    // ... and the next 200 are in frames after it.
    assert_eq!(poll_into(&mut source, &mut model, &handle), (200, 0));
    handle.stop();
    join.join().expect("capture thread");
    drop(source); // killed: no commit; its lock goes with it

    // Meanwhile the process writes on, into the slots that were never freed... and more
    // than the ring could hold if they had been lost (600 + 500 > 1024 would not fit).
    ring.write(400);

    // Second reader, recovered from the capture.
    let recovered = capture::recover(captures.path()).expect("a capture to recover from");
    let key = (std::process::id(), start_time(std::process::id()), 0);
    let recorded = recovered.rings.get(&key).expect("the ring's record").clone();
    assert_eq!(recorded.slots, 600);
    assert_eq!(recorded.unconfirmed.len(), 600, "all 600 may still be in the ring");
    let mut model = recovered.model;
    let (handle, join) = capture::spawn(CaptureConfig::new(captures.path()), stats).expect("capture");
    let mut source = RingSource::new(rings.path(), RingFilter::default(), None);
    source.deferred_commit = true;
    let opened = source.discover_now();
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].position, 0, "the first reader committed nothing");
    source.set_recorded(key, recorded.slots, recorded.unconfirmed);
    let mut delivered = 0;
    let mut duplicates = 0;
    for _ in 0..4 {
        let (d, dup) = poll_into(&mut source, &mut model, &handle);
        delivered += d;
        duplicates += dup;
    }
    assert_eq!((delivered, duplicates), (400, 600), "the 400 new events once, the 600 recorded skipped");
    source.commit(source.generation());
    ring.write(500); // the ring has room again once committed
    let process = model.snapshot().processes.into_iter().find(|p| p.pid == key.0).expect("process");
    assert_eq!(process.dropped_events, 0);
    handle.stop();
    join.join().expect("capture thread");
}
