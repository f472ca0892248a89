#![doc = include_str!("../README.md")]
//!
//! Pure formats (bytes in, bytes out; no system calls):
//! - [`record`]: the fixed 64-byte little-endian event record;
//! - [`kinds`]: what each event kind keeps in the record's words (typed constructors and accessors);
//! - [`capture`]: the capture-file format (header, checksummed frames, end marker);
//! - [`seqset`]: sets of event sequence numbers kept as ranges (what a capture holds).
//!
//! What touches the operating system:
//! - [`clock`]: the TSC and the monotonic and wall clocks, and conversion between them;
//! - [`host`]: the host name and a capture header stamped now;
//! - [`mapped`]: a capture file read through a memory map (SIGBUS-safe);

// First: its `code_enum!` macro also makes the capture's frame types.
#[macro_use]
pub mod record;
pub mod arrays;
pub mod capture;
pub mod clock;
pub mod host;
pub mod kinds;
pub mod mapped;
pub mod seqset;

pub use capture::{CaptureHeader, CaptureReader, CaptureWriter, Frame, ProcessEnd, ProcessInfo};
pub use record::{Api, Caller, Event, EventKind, FrameworkId, MemClass, RawRecord, RECORD_SIZE};

#[cfg(test)]
mod capture_tests;
