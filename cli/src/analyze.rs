//! `vramhook analyze`: the offline post-mortem of captures and PyTorch memory snapshots.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use vramhook_analyzer::render::{html, perfetto, text};
use vramhook_analyzer::{analyze as run_analysis, AnalyzeError, Options};

#[derive(clap::Args, Debug)]
pub struct AnalyzeArgs {
    /// Capture files (.vhc), PyTorch memory snapshots (pickles from
    /// torch.cuda.memory._dump_snapshot), replayed in order as one stream, and logs (plain
    /// text, journalctl output, gzip) with OOM messages from PyTorch, JAX/XLA, ggml/ollama,
    /// vLLM or the NVIDIA driver. Captures from several hosts (each names its host): one
    /// report per host and one for the fleet.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Print the report as JSON (schema: analyzer/schema/report.schema.json) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write one self-contained HTML page with plots to this file.
    #[arg(long, value_name = "OUT")]
    pub html: Option<PathBuf>,
    /// Also write a Chrome trace JSON (counter tracks) that Perfetto's viewer opens.
    #[arg(long, value_name = "OUT")]
    pub perfetto: Option<PathBuf>,
    /// Stop at the first corrupt frame or cut with exit code 2 (default: report it, skip a
    /// corrupt frame, and analyse what comes before a cut).
    #[arg(long)]
    pub strict: bool,
    /// Report from this time after the first event (e.g. 1.5s, 200ms, 30; plain numbers are seconds).
    #[arg(long, value_parser = parse_time)]
    pub from: Option<u64>,
    /// Stop the replay at this time after the first event.
    #[arg(long, value_parser = parse_time)]
    pub to: Option<u64>,
    /// Address layout at this time after the first event (default: the first OOM, else the peak).
    #[arg(long, value_parser = parse_time)]
    pub at: Option<u64>,
    /// Report only this process (repeatable). The model still replays every process.
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Points kept per timeline (min and max are preserved when downsampling).
    #[arg(long, default_value_t = 2000)]
    pub points: usize,
    /// Items kept per category (processes, OOM incidents, device numbers, PyTorch segments);
    /// the rest are counted and summarised, so a hostile file cannot cost memory or time
    /// out of proportion to its size.
    #[arg(long, value_name = "N", default_value_t = vramhook_analyzer::DEFAULT_MAX_ITEMS)]
    pub max_items: usize,
    /// Resident memory (MiB) past which the analysis stops: the report of what was read is
    /// printed and the exit code is 3. 0: no limit.
    #[arg(long, value_name = "MIB", default_value_t = vramhook_analyzer::DEFAULT_MAX_MEMORY_MIB)]
    pub max_memory: u64,
    /// Time past which the analysis stops likewise (e.g. 30s, 10min; 0: no limit).
    #[arg(long, value_name = "T", value_parser = parse_time, default_value = "600s")]
    pub time_limit: u64,
    /// Also forecast the fit (off by default: docs/live.md says why): WINDOW,HORIZON,HOLD
    /// (e.g. 10min,30min,5min): where the least-squares line through the supply of the last
    /// WINDOW, followed HORIZON ahead, stays below the demand for HOLD, a forecast warning.
    #[arg(long, value_name = "W,H,HOLD", value_parser = parse_trend)]
    pub fit_trend: Option<vramhook_model::trend::TrendRule>,
}

/// "60s,5min,10s" → the trend rule's window, horizon and hold.
fn parse_trend(s: &str) -> std::result::Result<vramhook_model::trend::TrendRule, String> {
    let parts: Vec<&str> = s.split(',').collect();
    let [w, h, hold] = parts[..] else {
        return Err(format!("{s:?}: give WINDOW,HORIZON,HOLD (e.g. 10min,30min,5min)"));
    };
    let (window_ns, horizon_ns, hold_ns) = (parse_time(w)?, parse_time(h)?, parse_time(hold)?);
    if window_ns == 0 {
        return Err(format!("{s:?}: the window must be longer than 0"));
    }
    Ok(vramhook_model::trend::TrendRule { window_ns, horizon_ns, hold_ns })
}

/// "1.5s", "200ms", "30us", "100ns", "2min", or a plain number of seconds → ns.
pub fn parse_time(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("not a time: {s:?} (try 1.5s, 200ms)"))?;
    let mul = match unit.trim() {
        "" | "s" => 1e9,
        "ms" => 1e6,
        "us" | "µs" => 1e3,
        "ns" => 1.0,
        "min" | "m" => 60e9,
        "h" => 3600e9,
        u => return Err(format!("unknown time unit {u:?} (use ns, us, ms, s, min, h)")),
    };
    let ns = v * mul;
    if !ns.is_finite() || !(0.0..=1.8e19).contains(&ns) {
        return Err(format!("time out of range: {s:?}"));
    }
    Ok(ns as u64)
}

pub fn analyze(args: AnalyzeArgs) -> Result<ExitCode> {
    let opts = Options {
        strict: args.strict,
        from_ns: args.from,
        to_ns: args.to,
        at_ns: args.at,
        pids: args.pids.clone(),
        max_points: args.points.clamp(16, 100_000),
        max_items: args.max_items.max(1),
        max_memory_mib: args.max_memory,
        time_limit: (args.time_limit > 0).then(|| std::time::Duration::from_nanos(args.time_limit)),
        model: vramhook_agent::model_config(),
        fit_trend: args.fit_trend,
    };
    // Captures from several hosts: each host through its own model, and the fleet.
    if vramhook_analyzer::fleet::host_count(&args.files) >= 2 {
        return analyze_fleet(&args, &opts);
    }
    // Past the memory or time budget: the partial report, then the error and exit code 3.
    let (report, over_budget) = match run_analysis(&args.files, &opts) {
        Ok(r) => (r, None),
        Err(e @ (AnalyzeError::Corrupt { .. } | AnalyzeError::Truncated { .. })) => {
            eprintln!("vramhook analyze: {e} (--strict)");
            return Ok(ExitCode::from(2));
        }
        Err(AnalyzeError::Budget { message, partial }) => (*partial, Some(message)),
        Err(e) => return Err(e.into()),
    };
    // Nothing at all could be read (bad magic, newer version, I/O): say so and fail.
    if report.logs.is_empty() && report.inputs.iter().all(|i| i.status == vramhook_analyzer::InputStatus::Unreadable) {
        let reasons: Vec<String> = report
            .inputs
            .iter()
            .map(|i| format!("{}: {}", i.path, i.error.as_deref().unwrap_or("unreadable")))
            .collect();
        bail!("{}", reasons.join("; "));
    }
    if let Some(out) = &args.html {
        std::fs::write(out, html::render(&report)).with_context(|| format!("cannot write {}", out.display()))?;
        eprintln!("vramhook analyze: wrote {}", out.display());
    }
    if let Some(out) = &args.perfetto {
        std::fs::write(out, perfetto::render(&report)).with_context(|| format!("cannot write {}", out.display()))?;
        eprintln!("vramhook analyze: wrote {} (open it at ui.perfetto.dev)", out.display());
    }
    let code = print_report(args.json, &report, || text::render(&report))?;
    match over_budget {
        Some(message) => {
            eprintln!("vramhook analyze: {message}; the report above is partial");
            Ok(ExitCode::from(3))
        }
        None => Ok(code),
    }
}

/// The report on stdout, as JSON or as `text()` says. Buffered: a report of 10,000
/// incidents is tens of MB of JSON, and stdout alone writes it a line (a system call) at a
/// time.
fn print_report(json: bool, report: &impl serde::Serialize, text: impl FnOnce() -> String) -> Result<ExitCode> {
    let mut stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    if json {
        serde_json::to_writer_pretty(&mut stdout, report).context("cannot write JSON")?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(text().as_bytes())?;
    }
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn analyze_fleet(args: &AnalyzeArgs, opts: &Options) -> Result<ExitCode> {
    use vramhook_analyzer::fleet;
    if args.html.is_some() || args.perfetto.is_some() {
        bail!(
            "--html and --perfetto take the captures of one host; these name several (analyze each host's files on their own for its page)"
        );
    }
    let report = match fleet::analyze_fleet(&args.files, opts) {
        Ok(r) => r,
        Err(e @ (AnalyzeError::Corrupt { .. } | AnalyzeError::Truncated { .. })) => {
            eprintln!("vramhook analyze: {e} (--strict)");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    print_report(args.json, &report, || fleet::render_text(&report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trend_rule_takes_three_times() {
        let r = parse_trend("60s,5min,10s").expect("three times");
        assert_eq!((r.window_ns, r.horizon_ns, r.hold_ns), (60_000_000_000, 300_000_000_000, 10_000_000_000));
        assert!(parse_trend("60s,5min").expect_err("two").contains("WINDOW,HORIZON,HOLD"));
        assert!(parse_trend("0,5min,10s").expect_err("no window").contains("longer than 0"));
        assert!(parse_trend("1s,2parsecs,3s").expect_err("unit").contains("unknown time unit"));
    }
}
