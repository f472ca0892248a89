//! `vramhook top` in a real terminal (tmux): from the agent's state endpoint, and with no
//! agent, from the rings directly.

mod agent_support;

use agent_support::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().unwrap_or_else(|e| {
        panic!("MISSING tmux ({e}): these tests drive `vramhook top` in a terminal; install it with `apt-get install -y tmux`")
    });
    String::from_utf8_lossy(&out.stdout).to_string()
}

struct Session(String);

impl Session {
    fn start(command: &str) -> Session {
        let name = format!("vhtop-{}-{}", std::process::id(), free_port());
        tmux(&["new-session", "-d", "-s", &name, "-x", "140", "-y", "34", command]);
        Session(name)
    }

    fn wait_screen(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = tmux(&["capture-pane", "-p", "-t", &self.0]);
            if pred(&screen) {
                return screen;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "top never showed {what}; screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn keys(&self, k: &str) {
        tmux(&["send-keys", "-t", &self.0, k]);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        tmux(&["kill-session", "-t", &self.0]);
    }
}

#[test]
fn top_shows_processes_peaks_and_ooms_from_the_agent() {
    let (rings, agent) = Agent::on_new_rings("top", &[]);
    let mut leak = spawn_traced(&workload("leak"), &["--n", "4", "--hold", "10"], rings.path(), &[]);
    let mut oom = spawn_traced(&workload("torch_caching"), &[], rings.path(), &[("SIM_OOM_GIB", "200")]);
    let _ = oom.wait();
    let pid = leak.id();
    let state = agent.wait_state(Duration::from_secs(20), "the leak and the OOM", |s| {
        s["snapshot"]["incidents"].as_array().is_some_and(|i| !i.is_empty())
            && s["snapshot"]["processes"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["pid"] == pid && p["live_bytes"] == 6_295_456u64))
    });
    let session = Session::start(&format!("{} top --agent {} --interval 200", vramhook_bin().display(), agent.addr));
    let screen = session.wait_screen("the leak's pid, live bytes and the OOM", |s| {
        s.contains(&pid.to_string())
            && s.contains("6.00 MiB")
            && s.contains("recent OOMs (1 total)")
            && s.contains("capacity: asked")
    });
    assert!(screen.contains("10.01 MiB"), "peak shown:\n{screen}");
    // The OOM whole: its time on this host's clock, and every word of its explanation.
    let pane: Vec<String> = screen
        .lines()
        .skip_while(|l| !l.contains("recent OOMs"))
        .skip(1)
        .map(|l| {
            l.trim_matches(|c: char| c == '│' || c == '└' || c == '─' || c == '┘' || c.is_whitespace()).to_string()
        })
        .collect();
    let words: Vec<&str> = pane.iter().flat_map(|l| l.split_whitespace()).collect();
    let explanation = state["snapshot"]["incidents"][0]["explanation"].as_str().expect("explanation");
    let want: Vec<&str> = explanation.split_whitespace().collect();
    assert!(
        words.windows(want.len()).any(|w| w == want.as_slice()),
        "the whole explanation {explanation:?} in:\n{screen}"
    );
    let head = pane.first().expect("the OOM's first line");
    let (time, rest) = head.split_once(" UTC (").unwrap_or_else(|| panic!("a wall-clock time first: {head:?}"));
    assert!(rest.contains(" ago) · pid "), "{head:?}");
    let secs: Vec<u64> = time.split(':').filter_map(|p| p.parse().ok()).collect();
    assert_eq!(secs.len(), 3, "HH:MM:SS: {head:?}");
    let shown = secs[0] * 3600 + secs[1] * 60 + secs[2];
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() % 86_400;
    let apart = now.abs_diff(shown).min(86_400 - now.abs_diff(shown));
    assert!(apart < 120, "the OOM happened in the last minute or so, not at {time}: now {now} s of the day");
    assert!(screen.contains(&format!("agent {}", agent.addr)), "source shown:\n{screen}");
    session.keys("p");
    session.wait_screen("sorting by peak", |s| s.contains("by peak"));
    session.keys("q");
    let _ = leak.kill();
    let _ = leak.wait();
}

#[test]
fn top_reads_the_rings_directly_without_an_agent() {
    let rings = ring_dir("topdirect");
    let bin = vramhook_bin();
    let mut leak = spawn_traced(&workload("leak"), &["--n", "4", "--hold", "10"], rings.path(), &[]);
    let pid = leak.id();
    let (_down, port) = DownPort::bind(); // nothing listens there, nor will while the test runs
    let session = Session::start(&format!(
        "{} top --agent 127.0.0.1:{port} --ring-dir {} --interval 200",
        bin.display(),
        rings.path().display()
    ));
    let screen =
        session.wait_screen("the leak read from its ring", |s| s.contains(&pid.to_string()) && s.contains("6.00 MiB"));
    assert!(screen.contains("(direct)"), "direct mode shown:\n{screen}");
    session.keys("q");
    let _ = leak.kill();
    let _ = leak.wait();
}
