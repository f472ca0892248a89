//! `vramhook dump`: a capture as JSON lines.

use anyhow::{Context, Result};
use serde_json::json;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use vramhook_protocol::capture::{CaptureError, CaptureReader, Frame};
use vramhook_protocol::record::{result_name, Api, Caller, Event, EventKind};

#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    /// The capture file.
    pub file: PathBuf,
    /// Skip corrupt frames (reporting each) instead of stopping at the first.
    #[arg(long)]
    pub skip_corrupt: bool,
    /// Also print process and process-end frames (as lines with "frame" set).
    #[arg(long)]
    pub frames: bool,
}

/// One event as a JSON object; the field names are part of the documented output.
pub fn event_json(e: &Event) -> serde_json::Value {
    if e.kind() == Some(EventKind::HookMiss) {
        return json!({"seq": e.seq, "ts_ns": e.ts_ns, "pid": e.pid, "tid": e.tid, "kind": "hook_miss",
            "api": "vramhook", "symbol": e.hook_miss_symbol(), "version": e.hook_miss_version(), "flags": e.hook_miss_flags(),
            "device": -1, "addr": 0, "size": 0, "result": 0});
    }
    if e.api == Api::Lens as u16 {
        // A lens's record: its framework where a call has its caller (named by the kind's
        // own accessors rather than the raw words, which mean something else per kind).
        let mut v = json!({"seq": e.seq, "ts_ns": e.ts_ns, "pid": e.pid, "tid": e.tid,
            "kind": e.kind().map(EventKind::name).unwrap_or("unknown"), "api": "lens", "device": e.device,
            "addr": e.addr, "size": e.size, "aux": e.aux, "stream": e.stream, "result": e.result});
        let o = v.as_object_mut().expect("an object");
        match e.kind() {
            Some(EventKind::FrameworkSegment) => {
                o.insert("free_pieces".into(), json!(e.free_pieces()));
            }
            _ => {
                o.insert("framework".into(), json!(e.framework().name()));
            }
        }
        return v;
    }
    let mut v = json!({
        "seq": e.seq,
        "ts_ns": e.ts_ns,
        "pid": e.pid,
        "tid": e.tid,
        "kind": e.kind().map(EventKind::name).unwrap_or("unknown"),
        "api": e.api().map(Api::name).unwrap_or("unknown"),
        "caller": e.caller().map(Caller::name).unwrap_or(""),
        "device": e.device,
        "addr": e.addr,
        "size": e.size,
        "aux": e.aux,
        "stream": e.stream,
        "result": e.result,
        "result_name": result_name(e.result),
    });
    if e.kind() == Some(EventKind::PoolSample) {
        // The raw words stay; these name them.
        let o = v.as_object_mut().expect("an object");
        o.insert("pool".into(), json!(e.pool()));
        o.insert("reserved".into(), json!(e.pool_reserved()));
        o.insert("used".into(), json!(e.pool_used()));
        o.insert("current".into(), json!(e.pool_is_current()));
    }
    if e.kind() == Some(EventKind::StreamCreate) {
        let o = v.as_object_mut().expect("an object");
        o.insert("flags".into(), json!(e.stream_flags()));
        o.insert("priority".into(), json!(e.stream_priority()));
    }
    v
}

pub fn dump(args: DumpArgs) -> Result<ExitCode> {
    let file = File::open(&args.file).with_context(|| format!("cannot open {}", args.file.display()))?;
    let mut reader = CaptureReader::new(BufReader::with_capacity(1 << 20, file))
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut code = ExitCode::SUCCESS;
    loop {
        match reader.next_frame() {
            Ok(Some(Frame::Events(records))) => {
                for raw in records {
                    writeln!(out, "{}", event_json(&Event::from_raw(raw)))?;
                }
            }
            Ok(Some(Frame::Process(p))) if args.frames => {
                let line = json!({"frame": "process", "pid": p.pid, "ppid": p.ppid, "uid": p.uid,
                    "start_time": p.start_time, "exe": p.exe, "cmdline": p.cmdline});
                writeln!(out, "{line}")?;
            }
            Ok(Some(Frame::ProcessEnd(e))) if args.frames => {
                let line = json!({"frame": "process_end", "pid": e.pid, "start_time": e.start_time,
                    "exit_status": e.exit_status, "delivered": e.delivered, "dropped": e.dropped,
                    "lost_in_flight": e.lost_in_flight, "malformed": e.malformed, "hook_misses": e.hook_misses});
                writeln!(out, "{line}")?;
            }
            Ok(Some(Frame::Unknown(kind))) => {
                eprintln!(
                    "vramhook: skipping frame of unknown type {kind} at byte {} (newer writer?)",
                    reader.frame_offset()
                );
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(CaptureError::Truncated(at)) => {
                eprintln!("vramhook: {}: truncated at byte {at} (no end marker: the writer stopped early); everything before it was printed", args.file.display());
                break;
            }
            Err(e @ CaptureError::Corrupt { .. }) if args.skip_corrupt => {
                eprintln!("vramhook: {}: {e}; skipping", args.file.display());
                code = ExitCode::from(2);
                if reader.resync().map_err(|e| anyhow::anyhow!("{e}"))?.is_none() {
                    break;
                }
            }
            Err(e) => {
                out.flush()?;
                eprintln!("vramhook: {}: {e}", args.file.display());
                return Ok(ExitCode::from(2));
            }
        }
    }
    out.flush()?;
    Ok(code)
}
