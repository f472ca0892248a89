//! The analyzer (being written).
