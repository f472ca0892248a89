//! `vramhook top`: a live terminal view of devices, processes and recent OOMs, from the
//! agent's state endpoint or, with no agent, from the rings directly.

use anyhow::{Context, Result};
use ratatui::crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use vramhook_agent::http::{State, StateClient};
use vramhook_agent::rings::{default_ring_dir, RingFilter, RingSource, SourceItem};
use vramhook_agent::stats::StatsView;
use vramhook_model::fmt_bytes;
use vramhook_model::{Model, ModelConfig};

#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    /// The agent's HTTP address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub agent: String,
    /// Read the rings directly instead of asking an agent (also used when none answers).
    /// This drains the rings: an agent started later does not see what `top` read.
    #[arg(long)]
    pub direct: bool,
    /// Ring directory for direct mode [default: /dev/shm/vramhook/<uid>].
    #[arg(long, value_name = "DIR")]
    pub ring_dir: Option<PathBuf>,
    /// Refresh interval in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub interval: u64,
    /// Print one frame as plain text (WIDTHxHEIGHT characters, default 120x40) and exit:
    /// for scripts, logs and terminals without a UI.
    #[arg(long, value_name = "WxH", num_args = 0..=1, default_missing_value = "120x40")]
    pub once: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sort {
    Live,
    Peak,
    Pid,
}

enum Source {
    Agent(StateClient),
    Direct { source: Box<RingSource>, model: Box<Model>, stats: Box<StatsView>, ring_dir: String },
}

impl Source {
    fn direct(dir: PathBuf) -> Source {
        let ring_dir = dir.display().to_string();
        let mut source = RingSource::new(dir, RingFilter::default(), None);
        source.skip_run_rings = true;
        Source::Direct {
            source: Box::new(source),
            model: Box::new(Model::new(ModelConfig::default())),
            stats: Box::default(),
            ring_dir,
        }
    }

    fn refresh(&mut self) -> Result<State, String> {
        match self {
            Source::Agent(client) => client.fetch(Duration::from_secs(2)),
            Source::Direct { source, model, stats, ring_dir } => {
                let mut marked = 0;
                let summary = source.poll(&mut |item| match item {
                    SourceItem::Process(info) => model.process_info(info),
                    SourceItem::Events(events) => {
                        for e in events {
                            model.apply(e);
                        }
                        marked += vramhook_agent::stats::dropped_marked(events);
                    }
                    SourceItem::End(end) => model.process_exit(end.pid, end.start_time, end.exit_status, end.ts_ns),
                });
                stats.events_ingested += summary.delivered;
                stats.writer_dropped += summary.dropped;
                // Slots an earlier reader (an agent, another `top`) took before this one
                // opened the ring: this view never saw them.
                stats.restart_lost += summary.skipped;
                stats.dropped_in_ring += vramhook_agent::stats::dropped_in_ring(marked, &summary);
                stats.records_malformed += summary.malformed;
                stats.rings_refused += source.take_refusals().len() as u64;
                stats.rings_open = source.open_rings() as u64;
                Ok(State { agent: (**stats).clone(), ring_dir: ring_dir.clone(), snapshot: model.snapshot() })
            }
        }
    }

    fn label(&self) -> String {
        match self {
            Source::Agent(client) => format!("agent {}", client.addr()),
            Source::Direct { ring_dir, .. } => format!("rings {ring_dir} (direct)"),
        }
    }
}

pub fn top(args: TopArgs) -> Result<ExitCode> {
    let ring_dir = args.ring_dir.clone().unwrap_or_else(default_ring_dir);
    let mut source = if args.direct {
        Source::direct(ring_dir)
    } else {
        let client = StateClient::new(&args.agent).map_err(anyhow::Error::msg)?;
        match client.fetch(Duration::from_secs(2)) {
            Ok(_) => Source::Agent(client),
            Err(e) => {
                eprintln!("vramhook top: no agent at {} ({e}); reading the rings directly", args.agent);
                Source::direct(ring_dir)
            }
        }
    };
    if let Some(size) = &args.once {
        let (w, h) = size
            .split_once('x')
            .and_then(|(w, h)| Some((w.parse::<u16>().ok()?, h.parse::<u16>().ok()?)))
            .filter(|&(w, h)| (40..=1000).contains(&w) && (20..=1000).contains(&h))
            .with_context(|| format!("--once takes WIDTHxHEIGHT (at least 40x20), not {size:?}"))?;
        let (state, error) = match source.refresh() {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(e)),
        };
        let label = source.label();
        let mut terminal = ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h))?;
        terminal.draw(|f| draw(f, &label, state.as_ref(), error.as_deref(), Sort::Live))?;
        let buffer = terminal.backend().buffer();
        for y in 0..h {
            let line: String = (0..w).map(|x| buffer[(x, y)].symbol()).collect();
            println!("{}", line.trim_end());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut terminal = ratatui::try_init().context("cannot start the terminal UI")?;
    let result = run_ui(&mut terminal, &mut source, Duration::from_millis(args.interval.max(50)));
    ratatui::restore();
    result?;
    Ok(ExitCode::SUCCESS)
}

fn run_ui(terminal: &mut ratatui::DefaultTerminal, source: &mut Source, interval: Duration) -> Result<()> {
    let mut sort = Sort::Live;
    let mut state: Option<State> = None;
    let mut error: Option<String> = None;
    let mut last = Instant::now() - interval;
    loop {
        if last.elapsed() >= interval {
            last = Instant::now();
            match source.refresh() {
                Ok(s) => {
                    state = Some(s);
                    error = None;
                }
                Err(e) => error = Some(e),
            }
        }
        let label = source.label();
        terminal.draw(|f| draw(f, &label, state.as_ref(), error.as_deref(), sort))?;
        if event::poll(Duration::from_millis(100))? {
            if let TermEvent::Key(k) = event::read()? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('l') => sort = Sort::Live,
                    KeyCode::Char('p') => sort = Sort::Peak,
                    KeyCode::Char('n') => sort = Sort::Pid,
                    KeyCode::Char('r') => last = Instant::now() - interval,
                    _ => {}
                }
            }
        }
    }
}

fn opt_bytes(v: Option<u64>) -> String {
    v.map(fmt_bytes).unwrap_or_else(|| "-".into())
}

/// The header's counters. The dropped total is the sum of its parts, each named: lost by
/// the writer (ring full, writer died), taken by an agent killed before recording them
/// (or, in direct mode, by whichever reader had the ring before), counted by an earlier
/// agent instance (in the model it recovered), or claimed by `Dropped` records in the ring
/// itself. The capture queue's drops are apart: those events are in the model.
fn status_line(a: &StatsView) -> String {
    format!(
        "events {}  rings open {}  refused {}  malformed {}  dropped {} (writer {}, restart {}, earlier agent {}, in ring {})  capture queue dropped {}",
        a.events_ingested,
        a.rings_open,
        a.rings_refused,
        a.records_malformed,
        a.dropped_total(),
        a.writer_dropped,
        a.restart_lost,
        a.dropped_recovered,
        a.dropped_in_ring,
        a.capture_dropped_events
    )
}

fn draw(f: &mut Frame<'_>, label: &str, state: Option<&State>, error: Option<&str>, sort: Sort) {
    let [head, devs, procs, ooms, help] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(5),
        Constraint::Min(6),
        Constraint::Length(7),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let Some(s) = state else {
        let msg = error.unwrap_or("waiting for data…");
        f.render_widget(Paragraph::new(msg).block(Block::bordered().title(format!(" vramhook top — {label} "))), head);
        return;
    };
    let a = &s.agent;
    let mut status = status_line(a);
    if let Some(e) = error {
        status = format!("{status}  STALE: {e}");
    }
    f.render_widget(Paragraph::new(status).block(Block::bordered().title(format!(" vramhook top — {label} "))), head);

    let rows = s.snapshot.devices.iter().map(|d| {
        Row::new(vec![
            d.ordinal.to_string(),
            opt_bytes(d.total),
            opt_bytes(d.free),
            fmt_bytes(d.traced_bytes),
            opt_bytes(d.untraced_bytes),
            fmt_bytes(d.pool_idle_bytes),
        ])
    });
    let widths = [6, 12, 12, 12, 12, 12].map(Constraint::Length);
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(["device", "total", "free", "traced", "untraced", "pool idle"]).style(bold))
            .block(Block::bordered().title(" devices ")),
        devs,
    );

    let mut live: Vec<_> = s.snapshot.processes.iter().filter(|p| p.alive).collect();
    match sort {
        Sort::Live => live.sort_by_key(|p| std::cmp::Reverse(p.live_bytes)),
        Sort::Peak => live.sort_by_key(|p| std::cmp::Reverse(p.peak_bytes)),
        Sort::Pid => live.sort_by_key(|p| p.pid),
    }
    let rows = live.iter().map(|p| {
        let style =
            if p.dropped_events > 0 || p.oom_count > 0 { Style::default().fg(Color::Yellow) } else { Style::default() };
        Row::new(vec![
            p.pid.to_string(),
            match p.traced_since_ns {
                // eBPF mode, attached while it ran: its numbers start at the attach.
                Some(_) => format!(
                    "{} (attached late; earlier allocations unknown)",
                    vramhook_agent::metrics::command_label(&p.command, &p.exe)
                ),
                None => vramhook_agent::metrics::command_label(&p.command, &p.exe),
            },
            fmt_bytes(p.live_bytes),
            fmt_bytes(p.peak_bytes),
            p.live_allocations.to_string(),
            fmt_bytes(p.largest_free_span),
            format!("{:.2}", p.fragmentation),
            p.oom_count.to_string(),
            p.dropped_events.to_string(),
        ])
        .style(style)
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Min(16),
        Constraint::Length(11),
        Constraint::Length(11),
        Constraint::Length(7),
        Constraint::Length(11),
        Constraint::Length(5),
        Constraint::Length(5),
        Constraint::Length(8),
    ];
    let sort_name = match sort {
        Sort::Live => "live",
        Sort::Peak => "peak",
        Sort::Pid => "pid",
    };
    f.render_widget(
        Table::new(rows, widths)
            .header(
                Row::new(["pid", "command", "live", "peak", "allocs", "free span", "frag", "OOMs", "dropped"])
                    .style(bold),
            )
            .block(Block::bordered().title(format!(" processes ({} live, by {sort_name}) ", live.len()))),
        procs,
    );

    let lines: Vec<Line<'_>> = s
        .snapshot
        .incidents
        .iter()
        .rev()
        .take(5)
        .map(|i| {
            Line::from(format!(
                "pid {} dev {} {:?}: {} (asked {})",
                i.pid,
                i.device,
                i.verdict,
                i.explanation,
                fmt_bytes(i.requested_bytes)
            ))
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines)
            .block(Block::bordered().title(format!(" recent OOMs ({} total) ", s.snapshot.incidents.len()))),
        ooms,
    );
    f.render_widget(Paragraph::new("q quit · l sort by live · p by peak · n by pid · r refresh"), help);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "dropped 20 (writer 0, restart 0, capture 0)" after a restart: the drops an earlier
    /// agent counted had no part. Every part is named now, and they add up.
    #[test]
    fn the_dropped_total_is_the_sum_of_its_named_parts() {
        let a = StatsView {
            writer_dropped: 3,
            restart_lost: 5,
            dropped_recovered: 20,
            dropped_in_ring: 7,
            capture_dropped_events: 11,
            ..StatsView::default()
        };
        let line = status_line(&a);
        assert!(
            line.contains("dropped 35 (writer 3, restart 5, earlier agent 20, in ring 7)"),
            "parts add up to the total: {line}"
        );
        assert!(line.contains("capture queue dropped 11"), "{line}");
        let a = StatsView { dropped_recovered: 20, ..StatsView::default() };
        assert!(status_line(&a).contains("dropped 20 (writer 0, restart 0, earlier agent 20, in ring 0)"));
    }
}
