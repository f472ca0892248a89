//! Chrome trace JSON (`{"traceEvents":[...]}`) that Perfetto's viewer (ui.perfetto.dev) and
//! chrome://tracing open: counter tracks (`"ph":"C"`) of live bytes per process and per
//! device and of device free bytes, and instant events (`"ph":"i"`) for OOM incidents.
//! Built from the report's bounded timelines, so its size is bounded too.

use crate::report::Report;
use crate::series::{Num, Point};
use serde_json::{json, Value};

/// Pseudo-pids for device tracks (real pids are below 2^22 on Linux).
const DEVICE_PID_BASE: i64 = 1 << 30;

fn us(ts: u64, t0: u64) -> f64 {
    ts.saturating_sub(t0) as f64 / 1000.0
}

fn counters(out: &mut Vec<Value>, pid: i64, name: &str, key: &str, pts: &[Point], t0: u64) {
    for p in pts {
        // The bucket's maximum first, then where it settled: peaks survive downsampling.
        out.push(json!({"name": name, "ph": "C", "ts": us(p.t_ns, t0), "pid": pid, "args": {key: Num(p.max)}}));
        if p.last != p.max {
            out.push(
                json!({"name": name, "ph": "C", "ts": us(p.t_ns, t0) + 0.001, "pid": pid, "args": {key: Num(p.last)}}),
            );
        }
    }
}

pub fn render(r: &Report) -> String {
    let t0 = r.time.first_ts_ns;
    let mut ev: Vec<Value> = Vec::new();
    for p in &r.processes {
        ev.push(json!({"name": "process_name", "ph": "M", "pid": p.pid, "args": {"name": format!("{} {}", p.pid, p.command)}}));
    }
    for t in &r.timelines.processes {
        counters(&mut ev, i64::from(t.pid), "live bytes", "bytes", &t.live_bytes, t0);
    }
    for d in &r.timelines.devices {
        let pid = DEVICE_PID_BASE + i64::from(d.device);
        ev.push(json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": format!("GPU {}", d.device)}}));
        counters(&mut ev, pid, "traced live bytes", "bytes", &d.live_bytes, t0);
        counters(&mut ev, pid, "device free bytes", "bytes", &d.free_bytes, t0);
    }
    for o in r.ooms.iter().map(|o| &o.incident) {
        ev.push(json!({
            "name": format!("OOM: {} requested {} ({})", o.api, vramhook_model::fmt_bytes(o.requested_bytes), o.verdict.name()),
            "ph": "i", "s": "g", "ts": us(o.ts_ns, t0), "pid": o.pid, "tid": o.pid,
            "args": {"requested_bytes": o.requested_bytes, "device_free_bytes": o.device_free_bytes,
                     "verdict": o.verdict.name(), "explanation": o.explanation}
        }));
    }
    let doc = json!({"traceEvents": ev, "displayTimeUnit": "ms",
        "otherData": {"generator": r.generator, "schema_version": r.schema_version}});
    serde_json::to_string(&doc).unwrap_or_else(|_| "{\"traceEvents\":[]}".into())
}
