//! `vramhook top`: a live terminal view of devices, processes and recent OOMs, from the
//! agent's state endpoint or, with no agent, from the rings directly.

use anyhow::{Context, Result};
use ratatui::crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};
use ratatui::Frame;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};
use vramhook_agent::http::{State, StateClient};
use vramhook_agent::stats::{StatsView, INCLUDE_RUN_RINGS};
use vramhook_model::fmt_bytes;
use vramhook_model::Model;
use vramhook_ring::dir::default_ring_dir;
use vramhook_ring::source::{RingFilter, RingSource, SourceItem};

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
    /// Direct mode: largest ring to read, in MiB of slots (as `vramhook agent --max-ring-mib`).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub max_ring_mib: u64,
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
    fn direct(dir: PathBuf, max_ring_mib: u64) -> Source {
        let ring_dir = dir.display().to_string();
        let mut source = RingSource::new(dir, RingFilter::default(), None);
        source.skip_run_rings = true;
        source.max_ring_bytes = max_ring_mib.max(1).saturating_mul(1 << 20).saturating_add(4096);
        Source::Direct {
            source: Box::new(source),
            model: Box::new(Model::new(vramhook_agent::model_config())),
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
                let refusals = source.take_refusals();
                for t in refusals.iter().filter_map(|r| r.too_large) {
                    vramhook_agent::stats::note_too_large(t.uid, t.len, t.max);
                }
                stats.rings_refused += refusals.len() as u64;
                stats.rings_too_large = vramhook_agent::stats::rings_too_large();
                stats.recorded_by_run = source.run_rings().into_iter().map(Into::into).collect();
                stats.rings_open = source.open_rings() as u64;
                Ok(State { agent: (**stats).clone(), ring_dir: ring_dir.clone(), snapshot: model.snapshot() })
            }
        }
    }

    /// Whether the events' clock is this host's: `top` then puts OOMs on its wall clock.
    fn local(&self) -> bool {
        match self {
            Source::Agent(client) => {
                let host = client.addr().rsplit_once(':').map_or(client.addr(), |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
            }
            Source::Direct { .. } => true,
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
        Source::direct(ring_dir, args.max_ring_mib)
    } else {
        let client = StateClient::new(&args.agent).map_err(anyhow::Error::msg)?;
        match client.fetch(Duration::from_secs(2)) {
            Ok(_) => Source::Agent(client),
            Err(e) => {
                eprintln!("vramhook top: no agent at {} ({e}); reading the rings directly", args.agent);
                Source::direct(ring_dir, args.max_ring_mib)
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
        let clock = Clock::now(source.local());
        let mut terminal = ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h))?;
        terminal.draw(|f| draw(f, &label, state.as_ref(), error.as_deref(), Sort::Live, clock))?;
        let buffer = terminal.backend().buffer();
        for y in 0..h {
            let line: String = (0..w).map(|x| buffer[(x, y)].symbol()).collect();
            println!("{}", line.trim_end());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let foreground = Foreground::take()?;
    install_stop_handlers();
    let mut terminal = ratatui::try_init().context("cannot start the terminal UI")?;
    let result = run_ui(&mut terminal, &mut source, Duration::from_millis(args.interval.max(50)));
    ratatui::restore();
    drop(foreground);
    result?;
    match STOP_SIGNAL.load(Ordering::Relaxed) {
        0 => Ok(ExitCode::SUCCESS),
        sig => Ok(die_by(sig)),
    }
}

/// The signal that asked `top` to stop (`timeout`'s SIGTERM, a hangup, `kill -INT`): it
/// then restores the terminal, gives the foreground back and dies by that signal.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::Relaxed);
}

fn install_stop_handlers() {
    // The UI loop looks at the flag between its waits. On a terminal that hung up (its tmux
    // or ssh session gone) crossterm's poll reads end-of-file forever and never returns, so a
    // hangup or a SIGTERM would leave `top` spinning: past a second's grace, this thread ends
    // it by the same signal.
    std::thread::spawn(|| loop {
        std::thread::sleep(Duration::from_millis(100));
        let sig = STOP_SIGNAL.load(Ordering::Relaxed);
        if sig != 0 {
            std::thread::sleep(Duration::from_secs(1));
            ratatui::restore();
            let _ = die_by(sig);
            std::process::exit(128 + sig);
        }
    });
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        // SAFETY: a handler that only stores an atomic; sigaction with a zeroed, filled struct.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Dies by `sig` (its default action), as a shell expects of a program it stopped so;
/// exit status 128 + `sig` if that does not end the process.
fn die_by(sig: libc::c_int) -> ExitCode {
    // SAFETY: resetting a disposition and raising a signal on ourselves.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    ExitCode::from((128 + sig).clamp(0, 255) as u8)
}

/// The terminal's foreground, taken for as long as `top` runs when it starts in a
/// background process group: under `timeout` (which puts its command in a group of its
/// own) or a script's job. There, setting up the terminal stopped it (SIGTTOU) before it
/// drew anything, and it could not read a key. Given back when dropped.
struct Foreground {
    previous: libc::pid_t,
}

impl Foreground {
    fn take() -> Result<Option<Foreground>> {
        // SAFETY: isatty, tcgetpgrp and getpgrp on our own descriptors.
        let (tty, fg, own) = unsafe { (libc::isatty(1) == 1, libc::tcgetpgrp(1), libc::getpgrp()) };
        if !tty {
            anyhow::bail!(
                "vramhook top needs a terminal, and its output is not one: `vramhook top --once` prints one frame as text"
            );
        }
        if fg < 0 || fg == own {
            return Ok(None);
        }
        set_foreground(own).with_context(|| {
            format!(
                "vramhook top runs in a background process group ({own}) and cannot take the terminal from \
                 group {fg}: run it in the foreground (`timeout --foreground`), or use `--once`"
            )
        })?;
        Ok(Some(Foreground { previous: fg }))
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let _ = set_foreground(self.previous);
    }
}

/// Makes `pgrp` the terminal's foreground group, with SIGTTOU blocked (a process of a
/// background group that does this is otherwise stopped).
fn set_foreground(pgrp: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: signal masks of our own thread; tcsetpgrp on our own descriptor.
    unsafe {
        let (mut block, mut old): (libc::sigset_t, libc::sigset_t) = (std::mem::zeroed(), std::mem::zeroed());
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        let r = libc::tcsetpgrp(1, pgrp);
        let err = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if r == 0 {
            Ok(())
        } else {
            Err(err)
        }
    }
}

fn run_ui(terminal: &mut ratatui::DefaultTerminal, source: &mut Source, interval: Duration) -> Result<()> {
    let mut sort = Sort::Live;
    let mut state: Option<State> = None;
    let mut error: Option<String> = None;
    let mut last = Instant::now() - interval;
    loop {
        if STOP_SIGNAL.load(Ordering::Relaxed) != 0 {
            return Ok(());
        }
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
        let clock = Clock::now(source.local());
        terminal.draw(|f| draw(f, &label, state.as_ref(), error.as_deref(), sort, clock))?;
        // A signal that interrupts the wait ends `top` (above), not as an error.
        let ready = match event::poll(Duration::from_millis(100)) {
            Err(_) if STOP_SIGNAL.load(Ordering::Relaxed) != 0 => continue,
            r => r?,
        };
        if ready {
            if let TermEvent::Key(k) = event::read()? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    // Raw mode: ^C is a key here, not SIGINT.
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
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

/// This host's clocks at one moment, when the events' monotonic clock is this host's (a
/// local agent, or the rings read directly); `None` for an agent elsewhere.
#[derive(Clone, Copy)]
struct Clock(Option<(u64, u64)>);

impl Clock {
    fn now(local: bool) -> Clock {
        Clock(local.then(|| (vramhook_protocol::clock::monotonic_ns(), vramhook_protocol::clock::wall_ns())))
    }

    /// When an event at `ts_ns` (monotonic) happened: "04:20:31 UTC (12 s ago)" on this
    /// host's clock, else relative to the newest event the agent has seen.
    fn when(&self, ts_ns: u64, newest_ns: u64) -> String {
        match self.0 {
            Some((mono, wall)) => {
                let ago = mono.saturating_sub(ts_ns);
                let at = vramhook_analyzer::render::text::utc(wall.saturating_sub(ago));
                format!("{} ({} ago)", at.get(11..).unwrap_or(&at), vramhook_analyzer::render::text::dur(ago))
            }
            None => format!(
                "{} before the agent's newest event",
                vramhook_analyzer::render::text::dur(newest_ns.saturating_sub(ts_ns))
            ),
        }
    }
}

/// Greedy word wrap to `width` columns; a word longer than a line is cut.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        while word.len() > width {
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
            }
            lines.push(word.drain(..width).collect());
        }
        let n = line.chars().count();
        if n > 0 && n + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.extend(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// The recent OOMs, newest first, each whole: its time, process, verdict and request, then
/// its explanation wrapped to `width`. Only incidents that fit in `height` lines whole are
/// shown; the last line then says how many older ones are not.
fn oom_lines(s: &State, width: usize, height: usize, clock: Clock) -> Vec<Line<'static>> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut out: Vec<Line<'static>> = Vec::new();
    let incidents = &s.snapshot.incidents;
    for (shown, i) in incidents.iter().rev().enumerate() {
        let head = format!(
            "{} · pid {} dev {} · {}: asked {} ({})",
            clock.when(i.ts_ns, s.snapshot.now_ns),
            i.pid,
            i.device,
            i.verdict.name(),
            fmt_bytes(i.requested_bytes),
            i.api.name()
        );
        let mut block: Vec<Line<'static>> = wrap(&head, width).into_iter().map(|l| Line::styled(l, bold)).collect();
        block.extend(wrap(&i.explanation, width.saturating_sub(2)).into_iter().map(|l| Line::from(format!("  {l}"))));
        let older = incidents.len() - shown - 1;
        // Room for this block, and for the "older" line if any incident is left after it.
        let needed = block.len() + usize::from(older > 0);
        if out.len() + needed > height {
            out.push(Line::from(format!(
                "… {} more OOM(s), older, not shown: they do not fit whole (the agent's /state has them)",
                incidents.len() - shown
            )));
            break;
        }
        out.extend(block);
    }
    out.truncate(height);
    out
}

/// One line per owner whose rings were refused for their size: processes not traced at
/// all, with the setting that reads them.
fn too_large_lines(a: &StatsView) -> Vec<String> {
    a.rings_too_large
        .iter()
        .map(|t| {
            format!(
                "NOT TRACED: {} ring(s) of uid {} larger than the reader takes ({} > {}): restart it with --max-ring-mib {}",
                t.rings,
                t.uid,
                fmt_bytes(t.largest_bytes),
                fmt_bytes(t.limit_bytes),
                t.max_ring_mib
            )
        })
        .collect()
}

/// Processes recorded by a `vramhook run` session, which drains their rings (so they are
/// not in this view), with the flag that shows them: one line each, at most three lines.
fn run_lines(a: &StatsView) -> Vec<String> {
    let line = |r: &vramhook_agent::stats::RecordedByRun| {
        format!("{}: not shown; start the agent with {} to watch it here", r.describe(), INCLUDE_RUN_RINGS)
    };
    let runs = &a.recorded_by_run;
    if runs.len() <= 3 {
        return runs.iter().map(line).collect();
    }
    let mut lines: Vec<String> = runs.iter().take(2).map(line).collect();
    let pids: Vec<String> = runs.iter().skip(2).take(8).map(|r| r.pid.to_string()).collect();
    let more = if runs.len() > 10 { ", …" } else { "" };
    lines.push(format!(
        "{} more processes recorded by vramhook run (pids {}{more}): {} shows them",
        runs.len() - 2,
        pids.join(", "),
        INCLUDE_RUN_RINGS
    ));
    lines
}

fn draw(f: &mut Frame<'_>, label: &str, state: Option<&State>, error: Option<&str>, sort: Sort, clock: Clock) {
    let red = Style::default().fg(Color::Red).add_modifier(Modifier::BOLD);
    let mut warnings: Vec<(String, Style)> =
        state.map(|s| too_large_lines(&s.agent)).unwrap_or_default().into_iter().map(|w| (w, red)).collect();
    // Never silently missing: a `vramhook run` session's processes are named, in yellow.
    let yellow = Style::default().fg(Color::Yellow);
    warnings.extend(state.map(|s| run_lines(&s.agent)).unwrap_or_default().into_iter().map(|w| (w, yellow)));
    let [head, devs, procs, ooms, help] = Layout::vertical([
        Constraint::Length(3 + warnings.len().min(5) as u16),
        Constraint::Length(5),
        Constraint::Min(6),
        Constraint::Percentage(40),
        Constraint::Length(1),
    ])
    .areas(f.area());
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
    let mut head_lines = vec![Line::from(status)];
    head_lines.extend(warnings.into_iter().map(|(w, style)| Line::styled(w, style)));
    f.render_widget(
        Paragraph::new(head_lines).block(Block::bordered().title(format!(" vramhook top — {label} "))),
        head,
    );

    draw_devices(f, s, devs);
    draw_processes(f, s, sort, procs);

    let inner = (ooms.width.saturating_sub(2) as usize, ooms.height.saturating_sub(2) as usize);
    let lines = oom_lines(s, inner.0, inner.1, clock);
    f.render_widget(
        Paragraph::new(lines)
            .block(Block::bordered().title(format!(" recent OOMs ({} total) ", s.snapshot.incidents.len()))),
        ooms,
    );
    f.render_widget(Paragraph::new("q quit · l sort by live · p by peak · n by pid · r refresh"), help);
}

/// The devices table.
fn draw_devices(f: &mut Frame<'_>, s: &State, area: Rect) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
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
        area,
    );
}

/// The live processes, sorted as asked.
fn draw_processes(f: &mut Frame<'_>, s: &State, sort: Sort, area: Rect) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut live: Vec<_> = s.snapshot.processes.iter().filter(|p| p.alive).collect();
    match sort {
        Sort::Live => live.sort_by_key(|p| std::cmp::Reverse(p.live_bytes)),
        Sort::Peak => live.sort_by_key(|p| std::cmp::Reverse(p.peak_bytes)),
        Sort::Pid => live.sort_by_key(|p| p.pid),
    }
    let rows = live.iter().map(|p| process_row(p));
    // Byte columns of 10: "138.04 GiB" (fmt_bytes stays below 1,000 of a unit but for
    // 1000..1023.99, which is cut to its first 10 characters). A lens's free cache is in
    // releasable + stranded (the cache's whole free segments, and its split blocks).
    // pid, command, live, held, releasable, stranded, streams, peak, allocs, free span, frag,
    // c.frag, fit, OOMs, dropped: 136 columns with their gaps, for a 140-column terminal.
    let widths = [
        Constraint::Length(8),
        Constraint::Min(14),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(7),
        Constraint::Length(10),
        Constraint::Length(6),
        Constraint::Length(10),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(5),
        Constraint::Length(4),
        Constraint::Length(7),
    ];
    let sort_name = match sort {
        Sort::Live => "live",
        Sort::Peak => "peak",
        Sort::Pid => "pid",
    };
    f.render_widget(
        Table::new(rows, widths)
            .header(
                Row::new([
                    "pid",
                    "command",
                    "live",
                    "held",
                    "releasable",
                    "stranded",
                    "streams",
                    "peak",
                    "allocs",
                    "free span",
                    "frag",
                    "c.frag",
                    "fit",
                    "OOMs",
                    "dropped",
                ])
                .style(bold),
            )
            .block(Block::bordered().title(format!(" processes ({} live, by {sort_name}) ", live.len()))),
        area,
    );
}

/// One live process's row: yellow where it dropped events or had an OOM.
fn process_row(p: &vramhook_model::ProcessView) -> Row<'static> {
    let style =
        if p.dropped_events > 0 || p.oom_count > 0 { Style::default().fg(Color::Yellow) } else { Style::default() };
    let mut cells: Vec<Cell<'_>> = [
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
        fmt_bytes(p.held_bytes),
        fmt_bytes(p.device_memory.iter().map(|m| m.releasable_bytes).sum()),
        fmt_bytes(p.device_memory.iter().map(|m| m.stranded_bytes).sum()),
        p.streams.to_string(),
        fmt_bytes(p.peak_bytes),
        p.live_allocations.to_string(),
        fmt_bytes(p.largest_free_span),
        format!("{:.2}", p.fragmentation),
        framework_fragmentation(p),
    ]
    .into_iter()
    .map(Cell::from)
    .collect();
    cells.push(fit_cell(p));
    cells.push(Cell::from(p.oom_count.to_string()));
    cells.push(Cell::from(p.dropped_events.to_string()));
    Row::new(cells).style(style)
}

/// The lowest fit of its next large request over its devices ("-": no request in the window,
/// or no device sample), red below 1: that request would fail now. Four characters: "0.73",
/// "2.50", "41", "99+".
fn fit_cell(p: &vramhook_model::ProcessView) -> Cell<'static> {
    let Some(r) = p.fit.iter().map(|f| f.fit_ratio).min_by(f64::total_cmp) else { return Cell::from("-") };
    let text = match r {
        r if r >= 99.5 => "99+".to_string(),
        r if r >= 9.995 => format!("{r:.0}"),
        r => format!("{r:.2}"),
    };
    if r < 1.0 {
        Cell::from(text).style(Style::default().fg(Color::Red).add_modifier(Modifier::BOLD))
    } else {
        Cell::from(text)
    }
}

/// The most fragmented of its framework caches ("-": no lens, or not measured yet).
fn framework_fragmentation(p: &vramhook_model::ProcessView) -> String {
    p.framework_caches
        .iter()
        .filter_map(|c| c.fragmentation)
        .max_by(f64::total_cmp)
        .map_or_else(|| "-".into(), |f| format!("{f:.2}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramhook_protocol::record::{Api, Event};

    /// A state with `n` OOMs of pid 100 (sizes 1, 2, … GiB: one incident each), 1 s apart.
    fn state_with_ooms(n: u64) -> State {
        let mut m = Model::new(vramhook_model::ModelConfig::default());
        let mut ts = 1_000_000_000u64;
        for k in 1..=n {
            ts += 1_000_000_000;
            m.apply(&vramhook_testkit::events::made(
                Event::alloc(Api::cuMemAlloc_v2, 0, k << 30).with_result(2),
                100,
                ts,
                0,
            ));
            m.apply(&vramhook_testkit::events::made(Event::mem_info(1 << 20, 16 << 30), 100, ts + 1000, 0));
        }
        State { agent: StatsView::default(), ring_dir: String::new(), snapshot: m.snapshot() }
    }

    /// The fit column: the lowest fit over its devices, red below 1, "-" without one.
    #[test]
    fn the_fit_column_is_red_below_one() {
        let view = |free: u64| {
            let mut m = Model::new(vramhook_model::ModelConfig::default());
            let made = vramhook_testkit::events::made;
            m.apply(&made(Event::alloc(Api::cuMemAlloc_v2, 0x1000, 2 << 30), 100, 1_000, 0));
            m.apply(&made(Event::free(Api::cuMemFree_v2, 0x1000), 100, 1_500, 0)); // given back: demand
            if free > 0 {
                m.apply(&made(Event::mem_info(free, 16 << 30), 100, 2_000, 0));
            }
            m.snapshot().processes.remove(0)
        };
        let red = Style::default().fg(Color::Red).add_modifier(Modifier::BOLD);
        // 1 GiB free for a 2 GiB demand (less the driver's 8 MiB reserve: 0.496).
        assert_eq!(fit_cell(&view(1 << 30)), Cell::from("0.50").style(red));
        assert_eq!(fit_cell(&view(5 << 30)), Cell::from("2.50"));
        assert_eq!(fit_cell(&view(100 << 30)), Cell::from("50"));
        assert_eq!(fit_cell(&view(1000 << 30)), Cell::from("99+"));
        assert_eq!(fit_cell(&view(0)), Cell::from("-"));
    }

    fn text(lines: &[Line<'_>]) -> Vec<String> {
        lines.iter().map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect()).collect()
    }

    /// Each process of a `vramhook run` session is named with the flag that shows it; past
    /// three, the rest are folded into one line.
    #[test]
    fn run_sessions_processes_are_named_with_the_flag() {
        let run = |pid: u32| vramhook_agent::stats::RecordedByRun {
            pid,
            start_time: 1,
            exe: "/opt/leak".into(),
            command: "/opt/leak --n 4".into(),
            run_pid: (pid == 10).then_some(9),
        };
        let stats = |n: u32| StatsView { recorded_by_run: (10..10 + n).map(run).collect(), ..StatsView::default() };
        assert!(run_lines(&stats(0)).is_empty());
        assert_eq!(
            run_lines(&stats(2)),
            [
                "pid 10 (leak --n 4) is recorded by vramhook run (pid 9): not shown; start the agent with \
                 --include-run-rings to watch it here",
                "pid 11 (leak --n 4) is recorded by vramhook run: not shown; start the agent with \
                 --include-run-rings to watch it here",
            ]
        );
        let folded = run_lines(&stats(12));
        assert_eq!(folded.len(), 3, "{folded:#?}");
        assert_eq!(
            folded[2],
            "10 more processes recorded by vramhook run (pids 12, 13, 14, 15, 16, 17, 18, 19, …): \
             --include-run-rings shows them"
        );
    }

    #[test]
    fn wrapping_keeps_every_word_within_the_width() {
        let t = "one two three four five six seven eight nine ten averyveryverylongwordthatdoesnotfit";
        let lines = wrap(t, 12);
        assert!(lines.iter().all(|l| l.chars().count() <= 12), "{lines:?}");
        assert_eq!(lines.concat().replace(' ', ""), t.replace(' ', ""));
        assert_eq!(lines[0], "one two");
    }

    #[test]
    fn oom_lines_are_whole_newest_first_with_their_time() {
        let s = state_with_ooms(3);
        assert_eq!(s.snapshot.incidents.len(), 3);
        // This host's clock: monotonic 10 s is wall 2026-12-02 04:00:10 UTC.
        let clock = Clock(Some((10_000_000_000, 1_796_184_010_000_000_000)));
        let lines = text(&oom_lines(&s, 70, 100, clock));
        let joined = lines.join(" ");
        assert!(lines[0].starts_with("04:00:04 UTC (6s ago) · pid 100 dev 0 · capacity: asked 3.00 GiB"), "{lines:#?}");
        for i in &s.snapshot.incidents {
            let words: Vec<&str> = i.explanation.split_whitespace().collect();
            assert!(joined.split_whitespace().collect::<Vec<_>>().windows(words.len()).any(|w| w == words), "{joined}");
        }
        assert!(lines.iter().all(|l| l.chars().count() <= 70), "{lines:#?}");
        // Too little room for all three: whole incidents only, and a line saying so.
        let first = text(&oom_lines(&s, 60, 100, clock)).iter().take_while(|l| !l.starts_with("04:00:03")).count();
        let lines = text(&oom_lines(&s, 60, first + 1, clock));
        assert_eq!(lines.len(), first + 1, "{lines:#?}");
        assert!(lines[first].contains("2 more OOM(s), older, not shown"), "{lines:#?}");
        // An agent elsewhere: times relative to its newest event.
        let lines = text(&oom_lines(&s, 200, 100, Clock(None)));
        // The newest event is the sample 1 µs after the last failure.
        assert!(lines[0].starts_with("1µs before the agent's newest event"), "{lines:#?}");
        assert!(lines.iter().any(|l| l.starts_with("2s before the agent's newest event")), "{lines:#?}");
    }

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
