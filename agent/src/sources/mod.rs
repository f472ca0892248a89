//! Where events come from: the per-process shared-memory rings ([`rings`]: the ring crate's
//! source, which discovers and drains them, wired into the agent's counters and capture), eBPF probes on libcuda ([`ebpf`]) and NVML's
//! per-process usage ([`nvml`]: the processes vramhook does not trace). Each hands the
//! ingest thread records; none blocks it.

pub mod ebpf;
pub mod nvml;
pub mod rings;
