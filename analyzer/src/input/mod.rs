//! Readers that feed the replay: vramhook captures ([`capture`]), PyTorch memory snapshots
//! ([`torch`], through the bounded [`pickle`] reader). Logs have their own module
//! (`crate::logs`): they do not go through the model.

pub mod capture;
pub mod pickle;
pub mod torch;
