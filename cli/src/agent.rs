//! `vramhook agent`: the daemon that drains every traced process's ring on this host into
//! the live model and exports it (Prometheus `/metrics`, JSON `/api/v1/state`, OTLP,
//! rotating capture files).

use anyhow::Result;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use vramhook_agent::capture::CaptureConfig;
use vramhook_agent::ingest::IngestConfig;
use vramhook_agent::AgentConfig;
use vramhook_ring::dir::default_ring_dir;

#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// Ring directory to drain [default: /dev/shm/vramhook/<uid>].
    #[arg(long, value_name = "DIR")]
    pub ring_dir: Option<PathBuf>,
    /// Address of the HTTP endpoints (/metrics, /api/v1/state); loopback by default.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,
    /// Serve no HTTP endpoint.
    #[arg(long)]
    pub no_http: bool,
    /// Write rotating capture files (with periodic model checkpoints) to this directory.
    /// A restarted agent recovers its model from them.
    #[arg(long, value_name = "DIR")]
    pub capture_dir: Option<PathBuf>,
    /// Start a new capture file past this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub capture_max_mib: u64,
    /// Start a new capture file after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    pub capture_max_age: u64,
    /// Keep at most this many capture files.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub capture_keep: usize,
    /// Seconds between model checkpoints in the capture.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub checkpoint_interval: f64,
    /// Do not restore the model from the capture directory at start.
    #[arg(long)]
    pub no_recover: bool,
    /// Export over OTLP even without OTEL_EXPORTER_OTLP_ENDPOINT (default endpoints).
    /// OTLP is on whenever an OTEL_EXPORTER_OTLP_*ENDPOINT variable is set.
    #[arg(long)]
    pub otlp: bool,
    /// Also drain the rings of processes started by `vramhook run` (by default they are
    /// left to that session).
    #[arg(long)]
    pub include_run_rings: bool,
    /// Milliseconds between published snapshots (what /metrics and OTLP read).
    #[arg(long, value_name = "MS", default_value_t = 250)]
    pub snapshot_ms: u64,
    /// Forget processes (and their OOM incidents) this many seconds after they exited, so
    /// that the agent's memory stays bounded on a host where processes come and go.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub forget_exited_after: u64,
    /// OOM incidents kept in the live model (each is counted and exported when it happens;
    /// past this many the oldest are forgotten), so that a process failing request after
    /// request for days does not grow the agent's memory and its every snapshot.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub incidents_kept: usize,
    /// Largest ring to drain, in MiB of slots (plus its 4 KiB header); bigger ones are
    /// refused before they are mapped (the interposer's default ring is 4 MiB).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub max_ring_mib: u64,
    /// eBPF mode: also trace processes that are already running, through uprobes on
    /// libcuda, with no restart (root, or CAP_BPF and CAP_PERFMON). Without --pid: every
    /// process that maps libcuda, now or later. A process with a ring is left to its ring.
    #[arg(long)]
    pub ebpf: bool,
    /// eBPF mode for these processes only (repeat, or separate with commas); implies --ebpf.
    #[arg(long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// eBPF mode: also probe this libcuda file from the start (beyond the ones processes
    /// map and the usual install paths).
    #[arg(long, value_name = "PATH")]
    pub ebpf_libcuda: Vec<PathBuf>,
    /// eBPF mode: the device ordinal of plain allocations and device samples, which a probe
    /// cannot see (the interposer asks the driver). Default: 0 when the host lists exactly
    /// one NVIDIA GPU in /proc/driver/nvidia/gpus, else unknown (-1).
    #[arg(long, value_name = "N")]
    pub ebpf_device: Option<i16>,
    /// Seconds between two reads of NVML's per-process usage (libnvidia-ml.so.1, loaded when
    /// present), which names the processes vramhook does not trace at an out-of-memory
    /// failure; it is also read right after each failure. 0: never.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub nvml_interval: f64,
    /// Seconds over which each process's demand (its largest request) is taken for the fit
    /// of its next large request (vramhook_process_memory_fit_ratio) [default: 600]. Sets
    /// VRAMHOOK_FIT_WINDOW for the agent's model.
    #[arg(long, value_name = "SECS")]
    pub fit_window: Option<f64>,
}

pub fn agent(args: AgentArgs) -> Result<ExitCode> {
    if let Some(secs) = args.fit_window {
        anyhow::ensure!(secs.is_finite() && secs >= 1.0, "--fit-window: at least 1 second");
        // Read by the model's configuration (`vramhook_agent::model_config`), before any
        // thread starts.
        std::env::set_var(vramhook_agent::FIT_WINDOW_ENV, secs.to_string());
    }
    let ring_dir = args.ring_dir.clone().unwrap_or_else(default_ring_dir);
    let mut ingest = IngestConfig::new(ring_dir);
    ingest.include_run_rings = args.include_run_rings;
    ingest.snapshot_interval = Duration::from_millis(args.snapshot_ms.max(10));
    ingest.checkpoint_interval = Duration::from_secs_f64(args.checkpoint_interval.max(0.1));
    ingest.forget_exited_after = Duration::from_secs(args.forget_exited_after);
    ingest.incidents_kept = args.incidents_kept.max(1);
    ingest.max_ring_bytes = args.max_ring_mib.max(1).saturating_mul(1 << 20).saturating_add(4096);
    ingest.nvml_interval = crate::run::nvml_interval(args.nvml_interval);
    if args.ebpf || !args.pids.is_empty() {
        use vramhook_agent::ebpf::{EbpfConfig, EbpfTargets};
        let targets = if args.pids.is_empty() { EbpfTargets::All } else { EbpfTargets::Pids(args.pids.clone()) };
        let mut c = EbpfConfig::new(targets);
        c.libraries = args.ebpf_libcuda.clone();
        if let Some(d) = args.ebpf_device {
            c.single_device = Some(d);
        }
        ingest.ebpf = Some(c);
    }
    let capture = args.capture_dir.as_ref().map(|dir| {
        let mut c = CaptureConfig::new(dir);
        c.max_bytes = args.capture_max_mib.max(1) << 20;
        c.max_age = Duration::from_secs(args.capture_max_age.max(1));
        c.max_files = args.capture_keep.max(1);
        c.checkpoint_interval = ingest.checkpoint_interval;
        c
    });
    let cfg = AgentConfig {
        ingest,
        listen: (!args.no_http).then_some(args.listen),
        capture,
        otlp: args.otlp || vramhook_agent::otlp::configured_by_env(),
        recover: !args.no_recover,
    };
    // The address first, before anything is made: a busy port is one line and leaves no
    // directory behind. (The agent binds again; what it made by then is removed on error.)
    if let Some(addr) = cfg.listen {
        std::net::TcpListener::bind(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    }
    let made = Made::before(&cfg);
    if let Err(e) = vramhook_agent::run(cfg, Arc::new(AtomicBool::new(false))) {
        made.undo();
        return Err(anyhow::anyhow!("{}", vramhook_agent::error_chain(&e)));
    }
    Ok(ExitCode::SUCCESS)
}

/// The directories a failed start may have made (the ring directory and its parent, the
/// capture directory): those missing before the start, removed again if it fails.
struct Made {
    /// Removed only when empty (a traced process may have put its ring there meanwhile).
    ring_dirs: Vec<PathBuf>,
    /// Removed with what the failed start wrote in it.
    capture_dir: Option<PathBuf>,
}

impl Made {
    fn before(cfg: &AgentConfig) -> Made {
        let missing = |d: &Path| std::fs::symlink_metadata(d).is_err();
        let ring_dir = &cfg.ingest.ring_dir;
        let parent = ring_dir.parent().filter(|p| !p.as_os_str().is_empty());
        Made {
            ring_dirs: [Some(ring_dir.as_path()), parent]
                .into_iter()
                .flatten()
                .filter(|d| missing(d))
                .map(PathBuf::from)
                .collect(),
            capture_dir: cfg.capture.as_ref().map(|c| c.dir.clone()).filter(|d| missing(d)),
        }
    }

    fn undo(self) {
        // `vramhook_agent::run` fails only while it starts, before it records anything: at
        // most the first capture file, its header and first checkpoint. A directory holding
        // more than that is kept (recorded data is never removed).
        if let Some(dir) = self.capture_dir {
            let fresh = std::fs::read_dir(&dir).is_ok_and(|d| {
                let entries: Vec<_> = d.filter_map(|e| e.ok()).collect();
                entries.len() <= 1
                    && entries.iter().all(|e| e.metadata().is_ok_and(|m| m.is_file() && m.len() <= 1 << 20))
            });
            if fresh {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        for dir in self.ring_dirs {
            let _ = std::fs::remove_dir(dir); // the directory first, then its parent
        }
    }
}
