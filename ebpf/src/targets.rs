//! Finding what to probe: the processes that map libcuda, and the library file each maps,
//! read through `/proc/<pid>/root` so that a process in a container (another mount
//! namespace) is reached through its own view of the file system.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// One libcuda file, as the kernel knows it (uprobes are set on an inode, so every
/// process that maps the same file is covered by one set of probes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// A libcuda mapped by a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// A path that reaches the file from here: `/proc/<pid>/root/<path in its namespace>`.
    pub path: PathBuf,
    pub file: FileId,
}

/// Whether a mapped path's file name is libcuda's (`libcuda.so`, `libcuda.so.1`,
/// `libcuda.so.580.159.04`), not `libcudart` or `libcudadebugger`.
pub fn is_libcuda(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "libcuda.so" || name.starts_with("libcuda.so.")
}

/// The libcuda paths in the text of a `/proc/<pid>/maps` (deleted files skipped).
pub fn libcuda_in_maps(maps: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode path (the path may contain spaces)
        let mut rest = line;
        for _ in 0..5 {
            rest = match rest.trim_start().split_once(' ') {
                Some((_, r)) => r,
                None => "",
            };
        }
        let path = rest.trim_start();
        if path.starts_with('/') && !path.ends_with(" (deleted)") && is_libcuda(path) && !out.iter().any(|p| p == path)
        {
            out.push(path.to_string());
        }
    }
    out
}

/// Whether the text of a `/proc/<pid>/maps` shows vramhook's interposer loaded.
pub fn maps_interposer(maps: &str) -> bool {
    maps.lines().any(|l| l.ends_with("/libvramhook.so") || l.contains("/libvramhook.so."))
}

/// The libcuda of process `pid`, reachable from here, if it maps one.
pub fn libcuda_of(pid: u32) -> Option<Library> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    for p in libcuda_in_maps(&maps) {
        let path = PathBuf::from(format!("/proc/{pid}/root{p}"));
        if let Ok(meta) = std::fs::metadata(&path) {
            return Some(Library { path, file: FileId { dev: meta.dev(), ino: meta.ino() } });
        }
    }
    None
}

/// Every process (by tgid) that maps libcuda now, with its library. Threads and kernel
/// threads are not listed (`/proc` holds only thread-group leaders at the top).
pub fn scan() -> BTreeMap<u32, Library> {
    let mut found = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    let me = std::process::id();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Some(lib) = libcuda_of(pid) {
            found.insert(pid, lib);
        }
    }
    found
}

/// Whether `pid` has vramhook's interposer loaded now.
pub fn has_interposer(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| maps_interposer(&m))
}

/// What `/proc/<pid>` says of a process: start time (clock ticks since boot), parent, uid,
/// executable and command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcFacts {
    pub start_time: u64,
    pub ppid: u32,
    pub uid: u32,
    pub exe: String,
    pub cmdline: Vec<String>,
}

/// Reads a process's facts; `None` when it is gone (or its stat cannot be parsed).
pub fn proc_facts(pid: u32) -> Option<ProcFacts> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|b| *b == b')')?;
    let fields: Vec<&[u8]> = stat[close + 1..].split(|b| *b == b' ').filter(|f| !f.is_empty()).collect();
    let num = |i: usize| fields.get(i).and_then(|f| std::str::from_utf8(f).ok()).and_then(|s| s.parse::<u64>().ok());
    let start_time = num(19)?;
    let ppid = num(1).and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
    let uid = std::fs::metadata(format!("/proc/{pid}")).map(|m| m.uid()).unwrap_or(0);
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .take(256)
                .map(|s| String::from_utf8_lossy(&s[..s.len().min(4096)]).into_owned())
                .collect()
        })
        .unwrap_or_default();
    Some(ProcFacts { start_time, ppid, uid, exe, cmdline })
}

/// Clock ticks per second (`/proc/<pid>/stat` start times are in these).
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Nanoseconds of `clock` now.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and our timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// NVIDIA GPUs the kernel driver lists (`/proc/driver/nvidia/gpus/*`); 0 without the driver.
pub fn nvidia_gpu_count() -> usize {
    std::fs::read_dir("/proc/driver/nvidia/gpus").map(|d| d.flatten().count()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libcuda_not_its_neighbours() {
        let maps = "\
7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
7f0000002000-7f0000003000 r--p 00001000 08:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
7f0000004000-7f0000005000 r-xp 00000000 08:01 99 /opt/cuda/lib64/libcudart.so.13
7f0000006000-7f0000007000 r-xp 00000000 08:01 98 /opt/x/libcudadebugger.so.1
7f0000008000-7f0000009000 r-xp 00000000 08:01 97 /tmp/with space/libcuda.so.1
7f000000a000-7f000000b000 r-xp 00000000 08:01 96 /gone/libcuda.so.1 (deleted)
7f000000c000-7f000000d000 rw-p 00000000 00:00 0 
7f000000e000-7f000000f000 r-xp 00000000 08:01 95 /work/target/libvramhook.so
";
        assert_eq!(
            libcuda_in_maps(maps),
            vec!["/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04".to_string(), "/tmp/with space/libcuda.so.1".into()]
        );
        assert!(maps_interposer(maps));
        assert!(!maps_interposer("7f-7f r-xp 0 0:0 1 /usr/lib/libc.so.6\n"));
    }

    #[test]
    fn own_facts() {
        let f = proc_facts(std::process::id()).unwrap();
        assert!(f.start_time > 0);
        assert!(!f.exe.is_empty());
        assert!(proc_facts(u32::MAX).is_none());
    }
}
