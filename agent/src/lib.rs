//! vramhook's live side: [`sources`] feed the model, [`ingest`] owns it, [`sinks`] export it.
//!
//! - [`sources`]: the per-process shared-memory rings ([`rings`]: the ring crate's source,
//!   [`vramhook_ring::source`], wired into the agent), eBPF probes ([`ebpf`]),
//!   NVML's per-process usage ([`nvml`]: the processes vramhook does not trace).
//! - [`ingest`]: the one thread that owns the host's live model.
//! - [`sinks`]: captures ([`capture`]), `/metrics` and the JSON state ([`http`]), OTLP
//!   ([`otlp`]), each behind a bounded queue or reading the last published snapshot, so
//!   none can stall ingestion; [`metrics`] is the catalogue Prometheus and OTLP share.
//! - [`stats`]: the agent's own counters.

pub mod ingest;
pub mod sinks;
pub mod sources;
pub mod stats;

// The modules by their own names too (`vramhook_agent::rings`, …), as the CLI uses them.
pub use sinks::{capture, fit_crossings, http, metrics, oom_counts, otlp};
pub use sources::{ebpf, nvml, rings};
/// How `vramhook agent` says a [`run`] error: the error and its causes, each said once.
pub use vramhook_ebpf::probe::error_chain;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vramhook_model::{Model, ModelConfig, DEFAULT_STREAM_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot start the capture in {dir}: {source}")]
    Capture { dir: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Otlp(#[from] otlp::OtlpError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Ebpf(#[from] ebpf::ProbeError),
    #[error("refusing ring directory {dir}")]
    RingDir { dir: PathBuf, source: vramhook_ring::dir::RingDirError },
}

/// Test hook: `VRAMHOOK_AGENT_PAUSE_AT=<step>` makes the first thread that reaches the named
/// step of the agent's restart and checkpoint sequence write the file named by
/// `VRAMHOOK_AGENT_PAUSE_FILE` and block for good, so that a test can SIGKILL the agent at
/// exactly that step. The steps: `recovered`, `first-checkpoint`, `discovered`, `announced`,
/// `polled`, `capture-dropped`, `ring-ended`, `marked`, `checkpoint-sent`, `rotated`,
/// `checkpoint-written`, `flushed`, `ring-removed`. Unset (always, outside tests), a step
/// costs one look at a cell.
pub const PAUSE_AT_ENV: &str = "VRAMHOOK_AGENT_PAUSE_AT";
pub const PAUSE_FILE_ENV: &str = "VRAMHOOK_AGENT_PAUSE_FILE";

pub(crate) fn pause_point(step: &str) {
    static AT: std::sync::OnceLock<Option<(String, PathBuf)>> = std::sync::OnceLock::new();
    static TAKEN: AtomicBool = AtomicBool::new(false);
    let at = AT.get_or_init(|| {
        let step = std::env::var(PAUSE_AT_ENV).ok()?;
        let file = std::env::var_os(PAUSE_FILE_ENV)?;
        Some((step, PathBuf::from(file)))
    });
    let Some((at, file)) = at else { return };
    if at != step || TAKEN.swap(true, Ordering::SeqCst) {
        return;
    }
    if let Err(e) = std::fs::write(file, step) {
        eprintln!("vramhook agent: cannot write the pause file {}: {e}", file.display());
    }
    loop {
        std::thread::park();
    }
}

/// How often the agent applies the gc rules to its ring directory.
const GC_INTERVAL: Duration = Duration::from_secs(30);

/// Applies the gc rules to the ring directory once and publishes the recorded removals.
fn collect_garbage(dir: &std::os::fd::OwnedFd, stats: &stats::AgentStats) {
    use std::os::fd::AsRawFd;
    use vramhook_ring::dir as ringdir;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    ringdir::gc_dir(dir.as_raw_fd(), uid, &ringdir::GcPolicy::from_env(), ringdir::now_secs(), false, &mut |e| {
        if e.reason.removes() && e.pending > 0 {
            eprintln!(
                "vramhook agent: removed ring {} ({} bytes, {} events never drained): {}",
                String::from_utf8_lossy(e.name),
                e.bytes,
                e.pending,
                e.reason.text()
            );
        }
    });
    let (rings, bytes) = ringdir::read_gc_record(dir.as_raw_fd());
    stats.rings_gc_removed.store(rings, Ordering::Relaxed);
    stats.rings_gc_removed_bytes.store(bytes, Ordering::Relaxed);
}

/// Everything `vramhook agent` can be told.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub ingest: ingest::IngestConfig,
    /// HTTP endpoints (`/metrics`, `/api/v1/state`); `None` turns them off.
    pub listen: Option<SocketAddr>,
    pub capture: Option<capture::CaptureConfig>,
    /// Export over OTLP (as the `OTEL_*` variables say).
    pub otlp: bool,
    /// Restore the model from the newest capture checkpoint at start.
    pub recover: bool,
}

/// Runs the agent until SIGINT/SIGTERM or until `stop` is set. Prints the address it
/// listens on (`vramhook agent: listening on ADDR`) once ready.
pub fn run(cfg: AgentConfig, stop: Arc<AtomicBool>) -> Result<(), AgentError> {
    let ring_dir_fd = open_ring_dir(&cfg)?;
    // eBPF mode: probes loaded and attached before anything else starts, so that a missing
    // capability or kernel feature is one clear line and a non-zero exit.
    let ebpf = cfg.ingest.ebpf.clone().map(ebpf::start).transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("vramhook-agent")
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    let stats = Arc::new(stats::AgentStats::default());
    let (snap_tx, snap_rx) = tokio::sync::watch::channel(Arc::new(Model::new(model_config()).snapshot()));
    let ring_dir = cfg.ingest.ring_dir.display().to_string();

    let recovered = recover(&cfg);
    pause_point("recovered");
    let (capture, capture_join) = match &cfg.capture {
        Some(c) => {
            let (h, j) = capture::spawn(c.clone(), stats.clone())
                .map_err(|source| AgentError::Capture { dir: c.dir.clone(), source })?;
            (Some(h), Some(j))
        }
        None => (None, None),
    };

    let (inc_tx, inc_rx) = tokio::sync::mpsc::channel(1024);
    let otlp = if cfg.otlp {
        let _guard = rt.enter();
        Some(otlp::start(stats.clone(), snap_rx.clone(), inc_rx, &ring_dir)?)
    } else {
        drop(inc_rx);
        None
    };

    if let Some(addr) = cfg.listen {
        let state = http::HttpState { stats: stats.clone(), snapshots: snap_rx.clone(), ring_dir: ring_dir.clone() };
        serve_http(&rt, addr, state)?;
    }
    watch_signals(&rt, &stop);
    start_gc(&rt, ring_dir_fd, &stats, &stop);
    eprintln!("vramhook agent: draining rings in {ring_dir}");
    let links = ingest::IngestLinks {
        stats: stats.clone(),
        snapshots: snap_tx,
        incidents: if cfg.otlp { Some(inc_tx) } else { None },
        capture: capture.clone(),
        stop: stop.clone(),
        ebpf,
    };
    let ingest_cfg = cfg.ingest.clone();
    let ingest = std::thread::Builder::new()
        .name("vramhook-ingest".into())
        .spawn(move || ingest::run(ingest_cfg, recovered, links))
        .map_err(AgentError::Runtime)?;
    let source = ingest.join().ok();
    if let Some(c) = capture {
        c.stop();
    }
    if let Some(j) = capture_join {
        let _ = j.join();
    }
    // Only now is everything read in the capture: a ring left behind (its process still
    // running) may then be removed by a gc once it is gone, with nothing lost.
    if let Some(mut source) = source {
        source.commit(u64::MAX);
        source.mark_recorded();
    }
    if let Some(o) = otlp {
        // Give the incident task a moment to hand over the last incidents. (The sleep is
        // made inside the runtime, as is the blocking task: `tokio::time::sleep` and
        // `spawn_blocking` need the runtime when they are called, and called outside, on
        // this thread, they panicked and skipped the final flush.)
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
        let _ = rt.block_on(async move { tokio::task::spawn_blocking(move || o.shutdown()).await });
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// The ring directory as the rules say (parent 1777 sticky, ours 0700, no symlink),
/// or a clear refusal.
fn open_ring_dir(cfg: &AgentConfig) -> Result<std::os::fd::OwnedFd, AgentError> {
    // A root agent may drain another user's directory, `<parent>/<uid>` as under
    // /dev/shm/vramhook, under that user's rules; its own it makes or repairs.
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let owner = vramhook_ring::dir::expected_owner(&cfg.ingest.ring_dir, euid);
    if owner == euid {
        vramhook_ring::dir::make_ring_dir(&cfg.ingest.ring_dir, euid)
    } else {
        vramhook_ring::dir::open_ring_dir(&cfg.ingest.ring_dir, owner)
    }
    .map_err(|source| AgentError::RingDir { dir: cfg.ingest.ring_dir.clone(), source })
}

/// The model from the newest capture checkpoint, where asked for.
fn recover(cfg: &AgentConfig) -> Option<capture::Recovered> {
    let recovered = match (&cfg.capture, cfg.recover) {
        (Some(c), true) => capture::recover(&c.dir),
        _ => None,
    };
    if let Some(r) = &recovered {
        eprintln!(
            "vramhook agent: recovered the model from {} ({} events after its last checkpoint)",
            r.file.display(),
            r.events
        );
    }
    recovered
}

/// Serves `/metrics` and the state API on `addr`.
fn serve_http(rt: &tokio::runtime::Runtime, addr: SocketAddr, state: http::HttpState) -> Result<(), AgentError> {
    let listener =
        rt.block_on(tokio::net::TcpListener::bind(addr)).map_err(|source| AgentError::Listen { addr, source })?;
    let local = listener.local_addr().unwrap_or(addr);
    eprintln!("vramhook agent: listening on {local}");
    rt.spawn(http::serve(listener, state));
    Ok(())
}

/// Sets `stop` on SIGTERM or SIGINT.
fn watch_signals(rt: &tokio::runtime::Runtime, stop: &Arc<AtomicBool>) {
    use tokio::signal::unix::{signal, SignalKind};
    // The handlers are installed here, not in the task: a task not yet polled left
    // SIGTERM's default action in place, and a SIGTERM soon after start killed the agent
    // with its capture unflushed (seen under load in the restart test).
    let handlers = {
        let _runtime = rt.enter();
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    };
    let stop = stop.clone();
    rt.spawn(async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        stop.store(true, Ordering::Relaxed);
    });
}

/// The ring gc, every `GC_INTERVAL` until `stop`, its earlier removals counted first.
fn start_gc(
    rt: &tokio::runtime::Runtime,
    ring_dir_fd: std::os::fd::OwnedFd,
    stats: &Arc<stats::AgentStats>,
    stop: &Arc<AtomicBool>,
) {
    // The first gc waits one interval: ingestion looks at what is there first (a ring it
    // refuses is counted as refused before gc may remove it).
    {
        use std::os::fd::AsRawFd;
        let (rings, bytes) = vramhook_ring::dir::read_gc_record(ring_dir_fd.as_raw_fd());
        stats.rings_gc_removed.store(rings, Ordering::Relaxed);
        stats.rings_gc_removed_bytes.store(bytes, Ordering::Relaxed);
    }
    let (stats, stop) = (stats.clone(), stop.clone());
    rt.spawn(async move {
        let dir = Arc::new(ring_dir_fd);
        let mut tick = tokio::time::interval(GC_INTERVAL);
        tick.tick().await;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let (dir, stats) = (dir.clone(), stats.clone());
            let _ = tokio::task::spawn_blocking(move || collect_garbage(&dir, &stats)).await;
        }
    });
}

/// `VRAMHOOK_STREAM_BYTES`: the device bytes the driver keeps per stream, which the model
/// counts for each process's streams (default [`DEFAULT_STREAM_BYTES`], measured on an H200
/// with driver 580; another GPU or driver may keep another amount).
pub const STREAM_BYTES_ENV: &str = "VRAMHOOK_STREAM_BYTES";

/// The model's configuration for this run: the defaults, with the per-stream bytes from
/// [`STREAM_BYTES_ENV`] where it is set (a value that is not a number of bytes is reported
/// once and the default kept). The agent, `run`, `top` and `analyze` all take it from here.
pub fn model_config() -> ModelConfig {
    let mut config = ModelConfig::default();
    if let Ok(v) = std::env::var(STREAM_BYTES_ENV) {
        match v.trim().parse::<u64>() {
            Ok(bytes) => config.stream_bytes = bytes,
            Err(_) => eprintln!(
                "vramhook: {STREAM_BYTES_ENV}={v:?} is not a number of bytes; using {DEFAULT_STREAM_BYTES} per stream"
            ),
        }
    }
    if let Ok(v) = std::env::var(FIT_WINDOW_ENV) {
        match v.trim().parse::<f64>() {
            Ok(secs) if secs.is_finite() && secs > 0.0 => config.fit_window_ns = (secs * 1e9) as u64,
            _ => eprintln!("vramhook: {FIT_WINDOW_ENV}={v:?} is not a number of seconds; using 600"),
        }
    }
    config
}

/// `VRAMHOOK_FIT_WINDOW`: seconds over which a process's demand (its largest request) is
/// taken for the fit of its next large request (default 600; `agent --fit-window` sets it).
pub const FIT_WINDOW_ENV: &str = "VRAMHOOK_FIT_WINDOW";
