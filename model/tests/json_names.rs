//! An event's kind and driver function, and a layout entry's memory class, are named in
//! JSON (reports, the agent's state), while checkpoints (postcard) keep the codes and the
//! variant index: the bytes below were taken from a build before the names, so an agent's
//! checkpoints from before still read back.

use serde_json::json;
use vramhook_model::{Class, EventRecord, LayoutEntry};
use vramhook_protocol::record::{Api, EventKind};

fn records() -> [EventRecord; 3] {
    let alloc = EventRecord {
        seq: 7,
        ts_ns: 1_000_000_123,
        pid: 4242,
        tid: 4243,
        kind: EventKind::Alloc.code(),
        api: Api::cuMemAlloc_v2.code(),
        caller: 1,
        result: 2,
        device: 0,
        addr: 0x7f00_0000_0000,
        size: 1 << 30,
        aux: 5,
        stream: 0,
    };
    let sample = EventRecord {
        seq: 8,
        ts_ns: 1_000_000_456,
        kind: EventKind::MemInfo.code(),
        api: Api::None.code(),
        caller: 0,
        result: 0,
        device: 1,
        addr: 3 << 30,
        size: 80 << 30,
        aux: 0,
        ..alloc
    };
    // Codes this build does not know (a newer interposer's).
    let unknown = EventRecord {
        seq: 9,
        ts_ns: 1_000_000_789,
        tid: 4244,
        kind: 200,
        api: 513,
        caller: 3,
        result: 0,
        device: -1,
        addr: 0x1000,
        size: 4096,
        aux: 0,
        stream: 0xdead_beef,
        ..alloc
    };
    [alloc, sample, unknown]
}

/// `postcard::to_allocvec` of `records()` before `kind` and `api` had names.
const POSTCARD: [&[u8]; 3] = [
    &[
        7, 251, 148, 235, 220, 3, 146, 33, 147, 33, 1, 1, 1, 2, 0, 128, 128, 128, 128, 128, 224, 31, 128, 128, 128,
        128, 4, 5, 0,
    ],
    &[
        8, 200, 151, 235, 220, 3, 146, 33, 147, 33, 12, 0, 0, 0, 2, 128, 128, 128, 128, 12, 128, 128, 128, 128, 192, 2,
        0, 0,
    ],
    &[9, 149, 154, 235, 220, 3, 146, 33, 148, 33, 200, 129, 4, 3, 0, 1, 128, 32, 128, 32, 0, 239, 253, 182, 245, 13],
];

#[test]
fn postcard_keeps_the_codes() {
    for (r, bytes) in records().iter().zip(POSTCARD) {
        assert_eq!(postcard::to_allocvec(r).unwrap(), bytes, "{r:?}");
        assert_eq!(postcard::from_bytes::<EventRecord>(bytes).unwrap(), *r);
    }
}

#[test]
fn json_names_the_kind_and_the_api() {
    let [alloc, sample, unknown] = records();
    let names = |r: &EventRecord| {
        let v = serde_json::to_value(r).unwrap();
        (v["kind"].clone(), v["api"].clone())
    };
    assert_eq!(names(&alloc), (json!("alloc"), json!("cuMemAlloc_v2")));
    assert_eq!(names(&sample), (json!("mem_info"), json!("none")));
    assert_eq!(names(&unknown), (json!("kind200"), json!("api513")));
    assert_eq!((alloc.kind_name(), alloc.api_name()), ("alloc".into(), "cuMemAlloc_v2".into()));
    assert_eq!((unknown.kind_name(), unknown.api_name()), ("kind200".into(), "api513".into()));
    for r in records() {
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<EventRecord>(&text).unwrap(), r, "{text}");
    }
    for k in EventKind::ALL {
        let r = EventRecord { kind: k.code(), ..alloc };
        assert_eq!(serde_json::to_value(r).unwrap()["kind"], k.name());
        assert_eq!(serde_json::from_value::<EventRecord>(serde_json::to_value(r).unwrap()).unwrap(), r);
    }
    for a in Api::ALL {
        let r = EventRecord { api: a.code(), ..alloc };
        assert_eq!(serde_json::to_value(r).unwrap()["api"], a.name());
        assert_eq!(serde_json::from_value::<EventRecord>(serde_json::to_value(r).unwrap()).unwrap(), r);
    }
}

#[test]
fn json_reads_codes_too_and_refuses_what_is_neither() {
    let [alloc, ..] = records();
    // The agent's state JSON before the names carried the numbers.
    let mut v = serde_json::to_value(alloc).unwrap();
    v["kind"] = json!(1);
    v["api"] = json!(1);
    assert_eq!(serde_json::from_value::<EventRecord>(v.clone()).unwrap(), alloc);
    for (key, bad) in
        [("kind", json!("allocate")), ("kind", json!(256)), ("kind", json!(-1)), ("api", json!("cuMalloc"))]
    {
        let mut w = v.clone();
        w[key] = bad.clone();
        assert!(serde_json::from_value::<EventRecord>(w).is_err(), "{key}: {bad}");
    }
}

#[test]
fn a_layout_entry_names_its_class_in_lower_case_and_postcard_keeps_the_index() {
    let entry = |class| LayoutEntry {
        addr: 0x7f00_0000_0000,
        size: 2 << 20,
        class,
        pid: 4242,
        device: 0,
        ts_ns: 1_000,
        reservation: Some(0x7e00_0000_0000),
        handle: None,
    };
    for (i, c) in Class::ALL.into_iter().enumerate() {
        let e = entry(c);
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["class"], c.name());
        assert_eq!(v["class"], format!("{c:?}").to_lowercase(), "the report's name before schema 7");
        assert_eq!(serde_json::from_value::<LayoutEntry>(v).unwrap(), e);
        // Taken before the rename: only the class's index (byte 11) differs between classes.
        let mut bytes = vec![
            128, 128, 128, 128, 128, 224, 31, 128, 128, 128, 1, 0, 146, 33, 0, 232, 7, 1, 128, 128, 128, 128, 128, 192,
            31, 0,
        ];
        bytes[11] = i as u8;
        assert_eq!(postcard::to_allocvec(&e).unwrap(), bytes, "{c:?}");
        assert_eq!(postcard::from_bytes::<LayoutEntry>(&bytes).unwrap(), e);
    }
}
