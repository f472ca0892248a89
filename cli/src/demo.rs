//! `vramhook demo`: a workload on the simulated CUDA driver, traced like a real one.

use crate::run::{trace, RunOutcome, TracedRun};
use crate::summary::render_text;
use anyhow::{bail, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use vramhook_model::fmt_bytes;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Workload to run (see tests/simcuda/README.md): torch_fragmented, torch_caching,
    /// torch_expandable, ggml_vmm, async_pool, leak, fork_exec, threads16, misc_api.
    /// torch_fragmented runs twice: as it is, then with expandable segments (the fix).
    #[arg(long, default_value = "torch_fragmented")]
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
    // Every path the demo prints (the workload's command line in the report, the verdicts,
    // this error) comes from here: `target/release/../../tests/…` read as `tests/…`.
    let candidates: Vec<PathBuf> = candidates.iter().map(|d| tidy(d)).collect();
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

/// `path` without `.` and `dir/..`: the real path where it exists (a symlinked `dir` may
/// lead elsewhere than its parent), else folded lexically.
fn tidy(path: &Path) -> PathBuf {
    match path.canonicalize() {
        Ok(real) => real,
        Err(_) => PathBuf::from(vramhook_analyzer::render::tidy_paths(&path.to_string_lossy())),
    }
}

/// Traces `workload` once on the simulated driver, `envs` added, into `record`.
fn trace_workload(
    sim: &Path,
    workload: &Path,
    vram_bytes: u64,
    record: &Path,
    envs: &[(&str, &str)],
) -> Result<RunOutcome> {
    let program = vec![OsString::from(workload)];
    let mut all: Vec<(OsString, OsString)> = vec![
        ("LD_LIBRARY_PATH".into(), sim.as_os_str().to_os_string()),
        ("VRAMHOOK_SIM_VRAM_BYTES".into(), vram_bytes.to_string().into()),
    ];
    all.extend(envs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
    trace(TracedRun {
        program: &program,
        envs: all,
        record: Some(record),
        ring_dir: None,
        ring_slots: None,
        lens: false,
    })
}

/// The capture's OOM incidents as `analyze` tells them: verdict, then why.
fn print_verdicts(record: &Path) -> Result<usize> {
    let report = vramhook_analyzer::analyze(&[record], &vramhook_analyzer::Options::default())?;
    for o in report.ooms.iter().map(|o| &o.incident) {
        eprintln!(
            "\nOOM #{}: {} requested through {} — verdict: {}",
            o.id,
            fmt_bytes(o.requested_bytes),
            o.api,
            o.verdict.name()
        );
        eprintln!("  {}", vramhook_analyzer::render::tidy_paths(&o.explanation));
    }
    Ok(report.ooms.len())
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
    let outcome = trace_workload(&sim, &workload, args.vram_bytes, &args.record, &[])?;
    eprint!("{}", render_text(&outcome.recorder.report()));
    if args.workload != "torch_fragmented" {
        eprintln!("\nNext: `vramhook dump {}` prints every event as a JSON line.", args.record.display());
        return Ok(ExitCode::from(outcome.exit_code.clamp(0, 255) as u8));
    }
    // The story: a fragmented cache, why it failed, and the same program with the fix.
    let ooms = print_verdicts(&args.record)?;
    let fixed_record = args.record.with_extension("expandable.vhc");
    eprintln!(
        "\n== the same program with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (simulated: SIM_EXPANDABLE=1)"
    );
    let fixed = trace_workload(&sim, &workload, args.vram_bytes, &fixed_record, &[("SIM_EXPANDABLE", "1")])?;
    eprint!("{}", render_text(&fixed.recorder.report()));
    let fixed_ooms = print_verdicts(&fixed_record)?;
    let held = outcome.exit_code != 0 && ooms > 0 && fixed.exit_code == 0 && fixed_ooms == 0;
    eprintln!(
        "\n{}: {} out-of-memory incident(s) without the fix (exit {}), {} with it (exit {}). Captures: {} and {}; \
         `vramhook analyze` either for the full post-mortem.",
        if held { "As expected" } else { "UNEXPECTED" },
        ooms,
        outcome.exit_code,
        fixed_ooms,
        fixed.exit_code,
        args.record.display(),
        fixed_record.display()
    );
    Ok(if held { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_paths_are_folded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir_all(real.join("a/b")).expect("dirs");
        assert_eq!(tidy(&real.join("a/b/../../a/./b")), real.join("a/b"), "an existing path: its real path");
        assert_eq!(tidy(&real.join("a/b/../../c/./d")), real.join("c/d"), "a missing one: folded lexically");
        assert_eq!(tidy(Path::new("/nonexistent/x/../y")), Path::new("/nonexistent/y"));
    }
}
