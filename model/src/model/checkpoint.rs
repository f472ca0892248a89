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
            || !m.by_pid_consistent()
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

    /// Each pid maps to the last process of that pid, and only pids of processes are mapped
    /// (the map is derived; a checkpoint from elsewhere may disagree with its own list).
    fn by_pid_consistent(&self) -> bool {
        let mut last: FastMap<u32, usize> = FastMap::default();
        for (slot, p) in self.procs.iter().enumerate() {
            last.insert(p.pid, slot);
        }
        last == self.by_pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramhook_protocol::record::{Api, Event};

    /// The pid map is derived from the process list; a checkpoint whose map disagrees
    /// (found by cargo fuzz: a pid missing from it made its next event open a second process
    /// past the analyzer's limit) is refused.
    #[test]
    fn a_checkpoint_whose_pid_map_disagrees_is_refused() {
        let mut m = Model::new(ModelConfig::default());
        for pid in [7, 8] {
            m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x1000 * u64::from(pid), 4096).by(pid, pid).at(10));
        }
        assert!(Model::restore(&m.checkpoint()).is_ok());
        let broken: [fn(&mut Model); 3] = [
            |m| {
                m.by_pid.remove(&7);
            },
            |m| {
                m.by_pid.insert(9, 0);
            },
            |m| {
                m.by_pid.insert(7, 1);
            },
        ];
        for (n, breaks) in broken.iter().enumerate() {
            let mut b = Model::restore(&m.checkpoint()).expect("restore");
            breaks(&mut b);
            assert!(matches!(Model::restore(&b.checkpoint()), Err(ModelError::Corrupt(_))), "case {n}");
        }
    }
}
