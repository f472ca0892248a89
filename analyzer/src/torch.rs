//! todo
use crate::{AnalyzeError, Replayer};
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;
pub fn import(_r: &mut Replayer, path: &str, _bytes: &[u8]) -> Result<(), AnalyzeError> {
    Err(AnalyzeError::Snapshot { path: path.into(), message: "todo".into() })
}
