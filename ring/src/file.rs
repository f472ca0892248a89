//! A ring file opened, locked and mapped by a reader (the OS side of reading a ring).

use super::*;
use vramhook_protocol::clock::TscClock;

/// Largest ring file a reader maps by default: 64 MiB of slots (1 Mi events) plus the
/// header page (the interposer's default ring is 4 MiB of slots). Anything bigger is
/// refused before it is mapped.
pub const DEFAULT_MAX_RING_BYTES: u64 = (64 << 20) + HEADER_SIZE as u64;

/// A ring file mapped by a reader, locked so that no second reader drains it.
///
/// The map is guarded against the file's truncation (see [`crate::mapped`]): a writer that
/// cuts its own ring while it is mapped does not kill the reader with `SIGBUS`; the rest of
/// the map then reads as zeros (an empty ring) and [`MappedRing::shrank`] says where.
pub struct MappedRing {
    pub reader: RingReader,
    file: std::fs::File,
    map: *mut libc::c_void,
    len: usize,
    guard: usize,
}

// SAFETY: owned mapping.
unsafe impl Send for MappedRing {}

impl MappedRing {
    /// Opens (never blocking: a FIFO or device named like a ring is refused), locks
    /// (non-blocking) and validates a ring file. Returns `Ok(None)` when another reader
    /// holds it.
    pub fn open(path: &std::path::Path, tsc: Option<TscClock>) -> Result<Option<MappedRing>, RingError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)?;
        Self::from_file(file, tsc, u64::MAX)
    }

    /// Locks, checks and maps a ring file opened read-write by the caller. Refuses what is
    /// not a regular file and files larger than `max_len` bytes, before mapping anything.
    /// Returns `Ok(None)` when another reader holds it.
    pub fn from_file(
        file: std::fs::File,
        tsc: Option<TscClock>,
        max_len: u64,
    ) -> Result<Option<MappedRing>, RingError> {
        use std::os::unix::io::AsRawFd;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(RingError::NotRegular);
        }
        if meta.len() > max_len {
            return Err(RingError::TooLarge { len: meta.len(), max: max_len });
        }
        // SAFETY: valid fd.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(None);
            }
            return Err(err.into());
        }
        // The size again, now that no other reader can be busy with it.
        let len = file.metadata()?.len();
        if len > max_len {
            return Err(RingError::TooLarge { len, max: max_len });
        }
        let len = len as usize;
        if len < HEADER_SIZE {
            return Err(RingError::TooSmall(len));
        }
        let map = vramhook_protocol::mapped::map_shared_rw(&file, len)?.cast::<libc::c_void>();
        let Some(guard) = vramhook_protocol::mapped::guard(map as usize, len, true) else {
            // SAFETY: unmapping what we mapped above.
            unsafe { libc::munmap(map, len) };
            return Err(RingError::Unguarded);
        };
        // SAFETY: the mapping lives as long as MappedRing; a truncation under it reads
        // as zeros (guarded above).
        let reader = unsafe { RingReader::new(map as *mut u8, len, tsc) };
        let cut = vramhook_protocol::mapped::region_cut(guard);
        match (reader, cut) {
            (Ok(reader), None) => Ok(Some(MappedRing { reader, file, map, len, guard })),
            (result, cut) => {
                vramhook_protocol::mapped::unguard(guard);
                // SAFETY: unmapping what we mapped above; nothing borrows it any more.
                unsafe { libc::munmap(map, len) };
                match (result, cut) {
                    (_, Some(at)) => Err(RingError::Shrank { len, at }),
                    (Err(e), None) => Err(e),
                    (Ok(_), None) => Err(RingError::NotReady), // unreachable: matched above
                }
            }
        }
    }

    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Where the file was cut, if it shrank while mapped (the map reads zeros from there
    /// on). A ring that shrank is finished: its reader must close it.
    pub fn shrank(&self) -> Option<u64> {
        vramhook_protocol::mapped::region_cut(self.guard)
    }

    /// Bytes mapped (the file's size when it was opened).
    pub fn mapped_len(&self) -> usize {
        self.len
    }
}

impl Drop for MappedRing {
    fn drop(&mut self) {
        vramhook_protocol::mapped::unguard(self.guard);
        // SAFETY: unmapping our own mapping; the reader inside is dropped with it.
        unsafe { libc::munmap(self.map, self.len) };
    }
}
