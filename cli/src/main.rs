#![doc = include_str!("../README.md")]
//!
//! `vramhook`: the one command users type.

mod agent;
mod analyze;
mod demo;
mod dump;
mod gc;
mod run;
mod summary;
mod top;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "vramhook", version, about = "Where GPU memory goes, live and after a crash", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command with every device-memory call of it and its children recorded.
    ///
    /// Sets LD_PRELOAD to libvramhook.so (found beside this binary, or $VRAMHOOK_LIB),
    /// drains the rings of the command and all its descendants while they run, writes
    /// them to a capture with --record, and prints a summary per process at the end.
    /// Exits with the command's exit status.
    Run(run::RunArgs),
    /// Print a capture as JSON lines, one event a line.
    Dump(dump::DumpArgs),
    /// Trace a demo workload on the simulated CUDA driver (no GPU needed).
    Demo(demo::DemoArgs),
    /// The host daemon: drain every traced process's ring into the live model and export
    /// it (Prometheus /metrics, JSON /api/v1/state, OTLP, rotating captures).
    Agent(agent::AgentArgs),
    /// A live terminal view of devices, processes, recent OOMs and drops, from the agent's
    /// state endpoint or, with no agent, from the rings directly.
    Top(top::TopArgs),
    /// Post-mortem of captures and PyTorch memory snapshots: every OOM with its verdict,
    /// leaks, fragmentation, timelines; as text, --json, --html (plots) or --perfetto.
    ///
    /// Exit code 2 when nothing could be read (an empty file), or with --strict at the first
    /// corrupt frame or cut; 3 when --max-memory or --time-limit stopped it (the report
    /// printed is partial).
    Analyze(analyze::AnalyzeArgs),
    /// Remove the rings of processes that are gone: drained ones at once, undrained ones
    /// past the keep budget (VRAMHOOK_KEEP_PERCENT of the file system, VRAMHOOK_KEEP_HOURS),
    /// oldest first. Prints what it removed and kept; --dry-run removes nothing.
    Gc(gc::GcArgs),
    /// Print the framework lenses' directory, to put first on PYTHONPATH beside LD_PRELOAD
    /// (`vramhook run` does it by itself): `PYTHONPATH=$(vramhook lens-dir):$PYTHONPATH`.
    LensDir,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Dump(args) => dump::dump(args),
        Command::Demo(args) => demo::demo(args),
        Command::Agent(args) => agent::agent(args),
        Command::Top(args) => top::top(args),
        Command::Analyze(args) => analyze::analyze(args),
        Command::Gc(args) => gc::gc(args),
        Command::LensDir => match run::find_lens_dir() {
            Some(dir) => {
                println!("{}", dir.display());
                Ok(ExitCode::SUCCESS)
            }
            None => Err(anyhow::anyhow!(
                "the lens directory was not found (set VRAMHOOK_LENS_DIR, or install it as lens/ beside this binary)"
            )),
        },
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vramhook: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// A directory next to the running binary.
pub fn beside_exe(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join(name))
}

/// The data directory of an installed wheel: `<prefix>/share/vramhook` for the binary in
/// `<prefix>/bin` (a virtual environment's, or `~/.local`'s). It holds `libvramhook.so`
/// and the PyTorch lens (`lens/`, with `sitecustomize.py` and `vramhook_lens/`).
pub fn share_dir() -> Option<PathBuf> {
    let dir = beside_exe("../share/vramhook")?;
    dir.is_dir().then_some(dir)
}
