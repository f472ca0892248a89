//! eBPF mode in the agent: the probes' source (crate `vramhook-ebpf`) feeds the same
//! model and the same capture as the rings. A process that has a ring is the ring's: its
//! probe events are dropped and counted (`ebpf_ring_won`).

use crate::capture::{CaptureHandle, CaptureMsg};
use crate::stats::AgentStats;
use std::sync::atomic::Ordering;
use vramhook_ebpf::source::{EbpfSource, Item};
use vramhook_model::Model;

pub use vramhook_ebpf::probe::ProbeError;
pub use vramhook_ebpf::source::{SourceConfig as EbpfConfig, Targets as EbpfTargets};

/// Loads and attaches the probes (one clear line when they cannot be).
pub fn start(cfg: EbpfConfig) -> Result<EbpfSource, ProbeError> {
    let src = EbpfSource::start(cfg)?;
    eprintln!("vramhook agent: eBPF probes attached ({} uprobe links)", src.links());
    Ok(src)
}

/// Applies what the probes saw since the last call. `ring_pid` says whether the agent
/// drains a ring of that pid. Returns the events delivered.
pub fn drain(
    src: &mut EbpfSource,
    model: &mut Model,
    capture: &Option<CaptureHandle>,
    stats: &AgentStats,
    ring_pid: &dyn Fn(u32) -> bool,
) -> u64 {
    let before = src.stats;
    let delivered = src.poll(ring_pid, &mut |item| match item {
        Item::Process(info) => {
            model.process_info(info);
            if let Some(c) = capture {
                c.send(CaptureMsg::Process(info.clone()));
            }
        }
        Item::Attached { pid, start_time, since_ns } => {
            model.process_traced_since(pid, start_time, since_ns);
            eprintln!(
                "vramhook agent: eBPF: process {pid} attached at {:.3} s (monotonic); earlier allocations unknown",
                since_ns as f64 / 1e9
            );
        }
        Item::Events(events) => {
            for e in events {
                model.apply(e);
            }
            if let Some(c) = capture {
                c.send(CaptureMsg::Events(events.to_vec()));
            }
        }
        Item::End(end) => {
            model.process_exit(end.pid, end.start_time, end.exit_status, end.ts_ns);
            if let Some(c) = capture {
                c.send(CaptureMsg::End(end));
            }
        }
    });
    let now = src.stats;
    crate::stats::add(&stats.events_ingested, delivered);
    crate::stats::add(&stats.ebpf_events, now.events.saturating_sub(before.events));
    crate::stats::add(&stats.ebpf_ring_won, now.ring_won.saturating_sub(before.ring_won));
    crate::stats::add(&stats.ebpf_lost, now.lost.saturating_sub(before.lost));
    crate::stats::add(&stats.ebpf_malformed, now.malformed.saturating_sub(before.malformed));
    stats.ebpf_links.store(src.links() as u64, Ordering::Relaxed);
    stats.ebpf_processes.store(src.tracked() as u64, Ordering::Relaxed);
    for note in src.take_notes() {
        eprintln!("vramhook agent: {note}");
    }
    delivered
}
