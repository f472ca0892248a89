//! vramhook's live side. Sources feed the model; sinks export it.
//!
//! - [`rings`]: discovers and drains the per-process shared-memory rings.

pub mod rings;
