//! `vramhook demo`: a workload on the simulated CUDA driver, traced like a real one.

use crate::run::{trace, TracedRun};
use crate::summary::render_text;
use anyhow::{bail, Result};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Workload to run (see tests/simcuda/README.md): torch_caching, torch_expandable,
    /// ggml_vmm, async_pool, leak, fork_exec, threads16, misc_api.
    #[arg(long, default_value = "torch_caching")]
    pub workload: String,
    /// Capture file to write.
    #[arg(long, default_value = "vramhook-demo.vhc")]
    pub record: PathBuf,
    /// Simulated device size in bytes.
    #[arg(long, default_value_t = 16 << 30)]
    pub vram_bytes: u64,
}

/// Where the simulated driver was built: $VRAMHOOK_SIM_DIR, `simcuda/` beside this
/// binary, or the source tree's `tests/simcuda/build` (for `target/<profile>/vramhook`).
pub fn find_sim_dir() -> Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("VRAMHOOK_SIM_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    if let Some(dir) = crate::beside_exe("simcuda") {
        candidates.push(dir);
    }
    if let Some(dir) = crate::beside_exe("../../tests/simcuda/build") {
        candidates.push(dir);
    }
    for dir in &candidates {
        if dir.join("libcuda.so.1").is_file() {
            return Ok(dir.clone());
        }
    }
    bail!(
        "the simulated CUDA driver is not built (looked in {}); run `make -C tests/simcuda` or scripts/setup.sh",
        candidates.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

pub fn demo(args: DemoArgs) -> Result<ExitCode> {
    let sim = find_sim_dir()?;
    let workload = sim.join("workloads").join(&args.workload);
    if !workload.is_file() {
        bail!("no workload {} in {}", args.workload, sim.join("workloads").display());
    }
    eprintln!(
        "vramhook demo: tracing {} on the simulated CUDA driver ({} GiB device)",
        args.workload,
        args.vram_bytes >> 30
    );
    let program = vec![OsString::from(&workload)];
    let outcome = trace(TracedRun {
        program: &program,
        envs: vec![
            ("LD_LIBRARY_PATH".into(), sim.clone().into_os_string()),
            ("VRAMHOOK_SIM_VRAM_BYTES".into(), args.vram_bytes.to_string().into()),
        ],
        record: Some(&args.record),
        ring_dir: None,
        ring_slots: None,
    })?;
    eprint!("{}", render_text(&outcome.recorder.report()));
    eprintln!("\nNext: `vramhook dump {}` prints every event as a JSON line.", args.record.display());
    Ok(ExitCode::from(outcome.exit_code.clamp(0, 255) as u8))
}
