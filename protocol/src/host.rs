//! What the formats take from the host they are written on: its name, and a capture
//! header anchored at this moment (the clocks themselves are in [`crate::clock`]). Kept
//! apart so that `record`, `kinds` and `capture` stay pure formats, with no system calls.

use crate::capture::{CaptureHeader, CAPTURE_VERSION};

impl CaptureHeader {
    /// A header anchored at this moment on this host.
    pub fn now() -> CaptureHeader {
        CaptureHeader {
            version: CAPTURE_VERSION,
            mono_anchor_ns: crate::clock::monotonic_ns(),
            wall_anchor_ns: crate::clock::wall_ns(),
            flags: 0,
            host: hostname(),
        }
    }
}

/// This host's name (empty when it cannot be read).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buffer and its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
