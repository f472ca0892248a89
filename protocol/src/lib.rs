//! vramhook's bytes on the wire and on disk, versioned:
//! - [`record`]: the fixed 64-byte little-endian event record;
//! - [`kinds`]: what each event kind keeps in the record's words (typed constructors and accessors);
//! - [`ring`]: the per-process shared-memory ring (bounded multi-producer queue);
//! - [`capture`]: the capture-file format (header, checksummed frames, end marker);
//! - [`mapped`]: a capture file read through a memory map;
//! - [`clock`]: timestamps and their conversion.

pub mod capture;
pub mod clock;
pub mod kinds;
pub mod mapped;
pub mod record;
pub mod ring;
pub mod ringdir;

pub use capture::{CaptureHeader, CaptureReader, CaptureWriter, Frame, ProcessEnd, ProcessInfo};
pub use record::{Api, Caller, Event, EventKind, MemClass, RawRecord, RECORD_SIZE};

#[cfg(test)]
mod capture_tests;
