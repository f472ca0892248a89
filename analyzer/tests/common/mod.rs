//! Synthetic captures for the analyzer's tests: written with the protocol's own writer.
#![allow(dead_code)]

use vramhook_protocol::capture::{CaptureHeader, CaptureWriter, ProcessEnd, ProcessInfo};
use vramhook_protocol::kinds::UNKNOWN_BYTES;
use vramhook_protocol::record::{Api, Event, FrameworkId};

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// `bytes` written as the file `name` in `dir`: its path.
pub fn write_file(dir: &std::path::Path, name: &str, bytes: impl AsRef<[u8]>) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

/// `e` (built by one of `Event`'s per-kind constructors) made by `pid`'s main thread at
/// `ts`, on device 0.
pub fn ev(pid: u32, ts: u64, e: Event) -> Event {
    vramhook_testkit::events::made(e, pid, ts, 0)
}

pub fn header() -> CaptureHeader {
    CaptureHeader {
        version: 1,
        mono_anchor_ns: 1_000_000_000,
        wall_anchor_ns: 1_764_000_000_000_000_000,
        flags: 0,
        host: "testhost".into(),
    }
}

/// Two processes on a 16 GiB device: pid 100 ("python train.py") grows plain allocations,
/// hits an OOM (PyTorch style: fail, free cache, retry, fail), and exits holding memory;
/// pid 200 ("llama-server") maps VMM chunks into a reservation and unmaps every other one,
/// leaving a fragmented arena. Returns the capture bytes and the byte offset of every frame.
pub fn scenario() -> (Vec<u8>, Vec<u64>) {
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("writer");
    let mut offsets = vec![w.bytes_written()];
    let frame = |w: &mut CaptureWriter<Vec<u8>>, events: &[Event]| {
        w.write_events(events).expect("write");
    };
    w.write_process(&ProcessInfo {
        pid: 100,
        ppid: 1,
        uid: 0,
        start_time: 11,
        run_id: 0,
        exe: "/usr/bin/python3".into(),
        cmdline: vec!["python".into(), "train.py".into()],
    })
    .expect("w");
    offsets.push(w.bytes_written());
    w.write_process(&ProcessInfo {
        pid: 200,
        ppid: 1,
        uid: 0,
        start_time: 22,
        run_id: 0,
        exe: "/opt/llama-server".into(),
        cmdline: vec!["llama-server".into(), "-m".into(), "model.gguf".into()],
    })
    .expect("w");
    offsets.push(w.bytes_written());
    let t0 = 2_000_000_000u64;
    let ms = 1_000_000u64;
    let mut t = t0;
    let mut evs = vec![ev(100, t, Event::mem_info(16 * GIB, 16 * GIB))];
    // pid 200: a 4 GiB reservation with 8 × 512 MiB chunks, every other one unmapped later.
    t += ms;
    evs.push(ev(200, t, Event::vmm_reserve(0x7000_0000_0000, 4 * GIB, 0, 0)));
    for i in 0..8u64 {
        t += ms;
        evs.push(ev(200, t, Event::vmm_create(Api::cuMemCreate, 0x900 + i, 512 * MIB)));
        evs.push(ev(200, t, Event::vmm_map(0x7000_0000_0000 + i * 512 * MIB, 512 * MIB, 0x900 + i, 0)));
    }
    frame(&mut w, &evs);
    offsets.push(w.bytes_written());
    evs.clear();
    // pid 100 grows: 40 allocations of 100 MiB, freeing every third one.
    let mut addrs = Vec::new();
    for i in 0..40u64 {
        t += 10 * ms;
        let a = 0x2000_0000_0000 + i * 128 * MIB;
        evs.push(ev(100, t, Event::alloc(Api::cuMemAlloc_v2, a, 100 * MIB)));
        addrs.push(a);
        if i % 3 == 2 {
            t += ms;
            evs.push(ev(100, t, Event::free(Api::cuMemFree_v2, addrs[(i - 1) as usize])));
        }
        if i % 8 == 7 {
            let j = i / 8;
            t += ms;
            evs.push(ev(200, t, Event::vmm_unmap(0x7000_0000_0000 + (j * 2 + 1) * 512 * MIB, 512 * MIB)));
            evs.push(ev(200, t, Event::vmm_release(0x900 + j * 2 + 1)));
        }
        if i % 10 == 9 {
            frame(&mut w, &evs);
            offsets.push(w.bytes_written());
            evs.clear();
        }
    }
    // The OOM: 200 GiB fails, the driver sample follows, two frees, the retry fails.
    t += 10 * ms;
    evs.push(ev(100, t, Event::alloc(Api::cuMemAlloc_v2, 0, 200 * GIB).with_result(2)));
    evs.push(ev(100, t + 1000, Event::mem_info(9 * GIB, 16 * GIB)));
    evs.push(ev(100, t + 2000, Event::free(Api::cuMemFree_v2, addrs[0])));
    evs.push(ev(100, t + 3000, Event::free(Api::cuMemFree_v2, addrs[3])));
    evs.push(ev(100, t + 4000, Event::alloc(Api::cuMemAlloc_v2, 0, 200 * GIB).with_result(2)));
    frame(&mut w, &evs);
    offsets.push(w.bytes_written());
    t += 50 * ms;
    w.write_process_end(&ProcessEnd {
        pid: 100,
        exit_status: Some(1),
        start_time: 11,
        ts_ns: t,
        delivered: 0,
        dropped: 0,
        lost_in_flight: 0,
        malformed: 0,
        hook_misses: 0,
    })
    .expect("w");
    offsets.push(w.bytes_written());
    w.write_process_end(&ProcessEnd {
        pid: 200,
        exit_status: Some(0),
        start_time: 22,
        ts_ns: t + ms,
        delivered: 0,
        dropped: 3,
        lost_in_flight: 0,
        malformed: 0,
        hook_misses: 0,
    })
    .expect("w");
    offsets.push(w.bytes_written());
    let bytes = w.finish().expect("finish");
    (bytes, offsets)
}

/// A focused JSON Schema check (the subset `analyzer/schema/report.schema.json` uses:
/// `$ref` to `#/$defs/…`, `type`, `const`, `enum`, `required`, `properties`,
/// `additionalProperties`, `items`, `minItems`, `maxItems`, `minimum`, `maximum`,
/// `minLength`). Unknown keywords fail, so the schema cannot silently use more.
pub fn validate(
    root: &serde_json::Value,
    schema: &serde_json::Value,
    v: &serde_json::Value,
    path: &str,
    errs: &mut Vec<String>,
) {
    use serde_json::Value;
    let Some(obj) = schema.as_object() else {
        errs.push(format!("{path}: schema is not an object"));
        return;
    };
    for (k, s) in obj {
        match k.as_str() {
            "$ref" => {
                let name = s.as_str().and_then(|r| r.strip_prefix("#/$defs/")).unwrap_or("");
                match root["$defs"].get(name) {
                    Some(def) => validate(root, def, v, path, errs),
                    None => errs.push(format!("{path}: unknown $ref {s}")),
                }
            }
            "type" => {
                let types: Vec<&str> = match s {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(a) => a.iter().filter_map(|t| t.as_str()).collect(),
                    _ => vec![],
                };
                let ok = types.iter().any(|t| match *t {
                    "object" => v.is_object(),
                    "array" => v.is_array(),
                    "string" => v.is_string(),
                    "integer" => v.is_i64() || v.is_u64(),
                    "number" => v.is_number(),
                    "boolean" => v.is_boolean(),
                    "null" => v.is_null(),
                    _ => false,
                });
                if !ok {
                    errs.push(format!("{path}: expected {types:?}, got {v}"));
                    return;
                }
            }
            "const" => {
                if v != s {
                    errs.push(format!("{path}: expected {s}, got {v}"));
                }
            }
            "enum" => {
                if !s.as_array().is_some_and(|a| a.contains(v)) {
                    errs.push(format!("{path}: {v} not in {s}"));
                }
            }
            "required" => {
                if let (Some(o), Some(req)) = (v.as_object(), s.as_array()) {
                    for r in req.iter().filter_map(|r| r.as_str()) {
                        if !o.contains_key(r) {
                            errs.push(format!("{path}: missing required field {r}"));
                        }
                    }
                }
            }
            "properties" => {
                if let (Some(o), Some(props)) = (v.as_object(), s.as_object()) {
                    for (name, sub) in props {
                        if let Some(x) = o.get(name) {
                            validate(root, sub, x, &format!("{path}.{name}"), errs);
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Some(o) = v.as_object() {
                    let props = obj.get("properties").and_then(|p| p.as_object());
                    for (name, x) in o {
                        if props.is_some_and(|p| p.contains_key(name)) {
                            continue;
                        }
                        match s {
                            Value::Bool(false) => errs.push(format!("{path}: field {name} is not in the schema")),
                            Value::Bool(true) => {}
                            sub => validate(root, sub, x, &format!("{path}.{name}"), errs),
                        }
                    }
                }
            }
            "items" => {
                if let Some(a) = v.as_array() {
                    for (i, x) in a.iter().enumerate() {
                        validate(root, s, x, &format!("{path}[{i}]"), errs);
                    }
                }
            }
            "minItems" | "maxItems" => {
                if let (Some(a), Some(n)) = (v.as_array(), s.as_u64()) {
                    let bad = if k == "minItems" { (a.len() as u64) < n } else { (a.len() as u64) > n };
                    if bad {
                        errs.push(format!("{path}: {} items violates {k} {n}", a.len()));
                    }
                }
            }
            "minimum" | "maximum" => {
                if let (Some(x), Some(n)) = (v.as_f64(), s.as_f64()) {
                    if (k == "minimum" && x < n) || (k == "maximum" && x > n) {
                        errs.push(format!("{path}: {x} violates {k} {n}"));
                    }
                }
            }
            "minLength" => {
                if let (Some(x), Some(n)) = (v.as_str(), s.as_u64()) {
                    if (x.chars().count() as u64) < n {
                        errs.push(format!("{path}: string shorter than {n}"));
                    }
                }
            }
            "$schema" | "$id" | "title" | "description" | "$defs" => {}
            other => errs.push(format!("{path}: schema keyword {other} is not supported by this check")),
        }
    }
}

pub fn schema() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/schema/report.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("schema file")).expect("schema is JSON")
}

/// Panics with every violation when `report` does not match the schema.
pub fn assert_valid(report: &vramhook_analyzer::Report) {
    let v = serde_json::to_value(report).expect("report serialises");
    let s = schema();
    let mut errs = Vec::new();
    validate(&s, &s, &v, "$", &mut errs);
    assert!(errs.is_empty(), "report does not match the schema:\n{}", errs.join("\n"));
}

pub fn info(pid: u32, cmd: &str) -> ProcessInfo {
    ProcessInfo {
        pid,
        ppid: 1,
        uid: 1000,
        start_time: 1,
        run_id: 0,
        exe: "/usr/bin/python3".into(),
        cmdline: cmd.split(' ').map(String::from).collect(),
    }
}

/// One lens sample: time, reserved, allocated, largest free block (or `UNKNOWN_BYTES`).
pub type LensReading = (u64, u64, u64, u64);

/// pid 100 on device 1: a 4 GiB segment, then lens samples every 10 ms, the largest free
/// block measured every `every`th sample only (never when 0), and one framework OOM (its
/// largest free block 512 MiB, measured when `every` > 0); pid 200 has no lens.
/// Returns the capture and, per sample, its reading.
pub fn lens_capture(samples: u64, every: u64) -> (Vec<u8>, Vec<LensReading>) {
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("writer");
    w.write_process(&info(100, "python3 train.py")).expect("process");
    w.write_process(&info(200, "plain-cuda-app")).expect("process");
    let dev1 = |e: Event| e.on_device(1);
    let mut events = vec![
        dev1(ev(100, 1_000_000, Event::alloc(Api::cuMemAlloc_v2, 0x7f00_0000_0000, 4 * GIB))),
        ev(200, 1_500_000, Event::alloc(Api::cuMemAlloc_v2, 0x7e00_0000_0000, GIB)),
    ];
    let mut truth = Vec::new();
    for i in 0..samples {
        let ts = 2_000_000 + i * 10_000_000;
        let reserved = 4 * GIB;
        // Allocated climbs and falls in a saw; one sample in the middle reaches the whole cache.
        let allocated = if i == samples / 2 { reserved } else { (i % 7) * 256 * MIB };
        let largest = if every > 0 && i % every == 0 { (reserved - allocated) / 2 } else { UNKNOWN_BYTES };
        events.push(dev1(ev(100, ts, Event::framework_sample(FrameworkId::PyTorch, reserved, allocated, largest, 4))));
        truth.push((ts, reserved, allocated, largest));
    }
    let t_oom = 2_000_000 + samples * 10_000_000;
    events.push(dev1(ev(
        100,
        t_oom,
        Event::framework_oom(
            FrameworkId::PyTorch,
            2 * GIB,
            4 * GIB,
            3 * GIB,
            if every > 0 { 512 * MIB } else { UNKNOWN_BYTES },
        ),
    )));
    w.write_events(&events).expect("events");
    (w.finish().expect("finish"), truth)
}
