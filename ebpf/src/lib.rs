//! vramhook's eBPF mode: uprobes and uretprobes on libcuda's memory functions trace
//! processes that are already running, with no restart and no LD_PRELOAD.
//!
//! - [`decode`]: the BPF programs' 128-byte wire record into vramhook's event (untrusted
//!   input, validated).
//! - [`targets`]: which processes map libcuda (`/proc/*/maps`, containers through
//!   `/proc/<pid>/root`).
//! - [`probe`]: loading the programs (bpf/vramhook.bpf.c, built by clang) and attaching
//!   them, with one clear line when a capability or kernel feature is missing.
//! - [`source`]: the event source the agent polls: processes, their events, their end.

pub mod decode;
pub mod probe;
pub mod source;
pub mod targets;
