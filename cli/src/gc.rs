//! `vramhook gc`: removes what the ring-directory rules say is garbage (rings of processes
//! that are gone: drained ones, unfinished ones, and undrained ones past the keep budget,
//! oldest first), and prints what it removed and what it kept.

use anyhow::{bail, Result};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use vramhook_ring::dir::{self as ringdir, DirRole, Errno, GcPolicy, RingDirError};

#[derive(clap::Args, Debug, Clone)]
pub struct GcArgs {
    /// Ring directory [default: /dev/shm/vramhook/<uid>].
    #[arg(long, value_name = "DIR")]
    pub ring_dir: Option<PathBuf>,
    /// Print what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Undrained rings of gone processes may take this share of the file system
    /// [default: $VRAMHOOK_KEEP_PERCENT or 10].
    #[arg(long, value_name = "PERCENT")]
    pub keep_percent: Option<u64>,
    /// Undrained rings of gone processes are kept this long [default: $VRAMHOOK_KEEP_HOURS
    /// or 24].
    #[arg(long, value_name = "HOURS")]
    pub keep_hours: Option<u64>,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

pub fn gc(args: GcArgs) -> Result<ExitCode> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = args.ring_dir.clone().unwrap_or_else(|| ringdir::default_ring_dir_for(uid));
    let fd = match ringdir::open_ring_dir(&dir, uid) {
        Ok(fd) => fd,
        Err(RingDirError::Io { role: DirRole::UserDir, err: Errno(libc::ENOENT) }) => {
            println!("{}: no ring directory, nothing to do", dir.display());
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => bail!("refusing ring directory {}: {e}", dir.display()),
    };
    let mut policy = GcPolicy::from_env();
    if let Some(p) = args.keep_percent {
        policy.keep_percent = p.min(100);
    }
    if let Some(h) = args.keep_hours {
        policy.keep_secs = h.saturating_mul(3600);
    }
    policy.dry_run = args.dry_run;
    let verb = if args.dry_run { "would remove" } else { "removed" };
    let sum = ringdir::gc_dir(fd.as_raw_fd(), uid, &policy, ringdir::now_secs(), true, &mut |e| {
        let name = String::from_utf8_lossy(e.name);
        let what = if e.reason.removes() { verb } else { "kept" };
        let pending = if e.pending > 0 { format!(", {} events not drained", e.pending) } else { String::new() };
        println!("{what} {name} ({}, {}{pending})", mib(e.bytes), e.reason.text());
    });
    println!(
        "{}: {verb} {} ring(s), {}; kept {} ring(s), {} ({} undrained of gone processes, {}, within {}% of the file system = {} and {} hours)",
        dir.display(),
        sum.removed,
        mib(sum.removed_bytes),
        sum.kept,
        mib(sum.kept_bytes),
        sum.kept_undrained,
        mib(sum.kept_undrained_bytes),
        policy.keep_percent,
        mib(sum.budget_bytes),
        policy.keep_secs / 3600,
    );
    let (rings, bytes) = ringdir::read_gc_record(fd.as_raw_fd());
    println!(
        "{rings} undrained ring(s) ({}) removed so far past the keep budget (age or share), their events never drained (recorded in {})",
        mib(bytes),
        dir.join(ringdir::GC_RECORD_NAME).display()
    );
    Ok(ExitCode::SUCCESS)
}
