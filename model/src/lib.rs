//! The VRAM model (see README.md for the operator's meaning of every number).
#![doc = include_str!("../README.md")]

mod addr_map;
pub mod framework;
mod model;
pub mod trend;
mod types;
mod verdict;

pub use model::{Model, ModelError, CHECKPOINT_VERSION};
pub use types::*;
pub use verdict::decide_verdict;
