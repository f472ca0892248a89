//! The VRAM model (being written).
