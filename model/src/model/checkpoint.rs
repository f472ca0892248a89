//! Checkpoints: the whole model as bytes (postcard), and back.

use super::*;

impl Model {
    /// The full state as bytes: a version byte, then postcard.
    pub fn checkpoint(&self) -> Vec<u8> {
        let out = vec![CHECKPOINT_VERSION];
        match postcard::to_extend(self, out) {
            Ok(v) => v,
            Err(_) => vec![CHECKPOINT_VERSION],
        }
    }

    pub fn restore(bytes: &[u8]) -> Result<Model, ModelError> {
        let (&v, rest) = bytes.split_first().ok_or(ModelError::Empty)?;
        if v != CHECKPOINT_VERSION {
            return Err(ModelError::Version(v));
        }
        let m: Model = postcard::from_bytes(rest).map_err(|e| ModelError::Corrupt(e.to_string()))?;
        if m.anomalies.len() != Anomaly::COUNT
            || !m.device_totals_consistent()
            || m.by_pid.values().any(|s| *s >= m.procs.len())
            || m.incidents.iter().any(|i| i.slot >= m.procs.len())
            || m.procs.iter().any(|p| {
                p.open_incident.is_some_and(|i| i >= m.incidents.len())
                    || p.awaiting_sample.is_some_and(|(i, _)| i >= m.incidents.len())
            })
        {
            return Err(ModelError::Corrupt("inconsistent indices".into()));
        }
        Ok(m)
    }
}
