//! The README's recipes, and those of the documents under docs/, run as written.
//!
//! Every fenced block of README.md and of every `docs/**/*.md` carries a marker on the
//! line before it:
//! - `<!-- runnable -->`: a command block this test runs, in bash (`-euo pipefail`), on a
//!   fresh state: a new working directory with `target/release` (the build under test),
//!   `tests/`, `scripts/` and `lens/` of this repository, a new `HOME`, `vramhook` on the
//!   `PATH`, and the simulated CUDA driver's workloads where a GPU program would be; in a
//!   network namespace of its own where one can be made (its own loopback: the agent's
//!   default port is free);
//! - `<!-- needs: WHAT -->`: a command block that needs a GPU, root, a cluster or a whole
//!   machine; not run, listed with its reason;
//! - `<!-- output -->` (or `<!-- output: usage -->`): what a command prints, or its synopsis.
//!
//! A block without a marker fails the test: a new recipe must say whether it runs here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vramhook_testkit::{profile_dir, repo_root, sim_dir, vramhook_bin};

#[derive(Debug, PartialEq)]
enum Marker {
    Runnable,
    Needs(String),
    Output,
}

struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    marker: Option<Marker>,
    body: String,
}

fn parse_marker(line: &str) -> Option<Marker> {
    let inner = line.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    if inner == "runnable" {
        Some(Marker::Runnable)
    } else if let Some(why) = inner.strip_prefix("needs:") {
        Some(Marker::Needs(why.trim().to_string()))
    } else if inner == "output" || inner.starts_with("output:") {
        Some(Marker::Output)
    } else {
        None
    }
}

/// README.md, then every Markdown file under docs/ (sorted), each with its path from the
/// repository's root.
fn documents() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let root = repo_root();
    let mut paths = Vec::new();
    walk(&root.join("docs"), &mut paths);
    paths.sort();
    paths.insert(0, root.join("README.md"));
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(&root).unwrap().display().to_string(), text)
        })
        .collect()
}

fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("```") {
            let marker = i.checked_sub(1).and_then(|p| parse_marker(lines[p]));
            let start = i;
            i += 1;
            let mut body = String::new();
            while i < lines.len() && !lines[i].starts_with("```") {
                body.push_str(lines[i]);
                body.push('\n');
                i += 1;
            }
            out.push(Block { line: start + 1, marker, body });
        }
        i += 1;
    }
    out
}

/// A fresh state for one block: its working directory, with the repository's pieces the
/// recipes name, a new HOME and a `bin/` with `vramhook`.
fn fresh_state(root: &Path) -> PathBuf {
    let dir = tempfile::Builder::new().prefix("vh-readme-").tempdir().expect("tempdir").keep();
    let repo = repo_root();
    std::fs::create_dir_all(dir.join("target")).unwrap();
    std::os::unix::fs::symlink(profile_dir(), dir.join("target/release")).unwrap();
    for name in ["tests", "scripts", "lens", "deploy"] {
        std::os::unix::fs::symlink(repo.join(name), dir.join(name)).unwrap();
    }
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::os::unix::fs::symlink(vramhook_bin(), dir.join("bin/vramhook")).unwrap();
    let _ = root;
    dir
}

/// What `unshare` gives a block here: with a network namespace of its own, the agent's
/// default port is its own; with a mount namespace and a private `/dev/shm` too, so are the
/// default ring directory's rings (another run of this suite at the same time, or an agent
/// on the host, would otherwise drain them).
#[derive(Clone, Copy, PartialEq)]
enum Isolation {
    None,
    Net,
    NetAndShm,
}

fn isolation() -> Isolation {
    let works = |args: &[&str]| {
        Command::new("unshare")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let shm = "ip link set lo up && mount -t tmpfs -o mode=1777 tmpfs /dev/shm";
    if works(&["-n", "-m", "--propagation", "private", "sh", "-c", shm]) {
        Isolation::NetAndShm
    } else if works(&["-n", "ip", "link", "set", "lo", "up"]) {
        Isolation::Net
    } else {
        Isolation::None
    }
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn run_block(block: &Block, isolation: Isolation) -> Result<String, String> {
    let root = repo_root();
    let dir = fresh_state(&root);
    let home = dir.join("home");
    let path = format!(
        "{}:{}:{}",
        home.join(".local/bin").display(),
        dir.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = format!("set -euo pipefail\n{}", block.body);
    let mut cmd = if isolation == Isolation::NetAndShm {
        let mut c = Command::new("unshare");
        c.args(["-n", "-m", "--propagation", "private", "bash", "-c"]);
        c.arg("ip link set lo up && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec bash -c \"$0\"").arg(&script);
        c
    } else if isolation == Isolation::Net {
        let mut c = Command::new("unshare");
        c.args(["-n", "bash", "-c", "ip link set lo up && exec bash -c \"$0\""]).arg(&script);
        c
    } else {
        let mut c = Command::new("bash");
        c.arg("-c").arg(&script);
        c
    };
    cmd.current_dir(&dir)
        .env("HOME", &home)
        .env("PATH", path)
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMHOOK_DIR")
        .env_remove("VRAMHOOK_RUN_ID")
        .env_remove("VRAMHOOK_LIB")
        .env_remove("PYTHONPATH")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
    // Its own process group, so that a timeout takes its background jobs too.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().map_err(|e| format!("cannot start bash: {e}"))?;
    let pid = child.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            // SAFETY: kill of the process group this test made.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever the block left in the background goes with it.
    // SAFETY: as above.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let text = format!("$ cd {} (fresh)\n--- stdout\n{}--- stderr\n{}", dir.display(), read("stdout"), read("stderr"));
    let _ = std::fs::remove_dir_all(&dir);
    if status.success() {
        Ok(text)
    } else {
        Err(format!("{text}--- exit: {status}"))
    }
}

#[test]
fn every_block_is_marked() {
    let mut unmarked: Vec<String> = Vec::new();
    for (path, text) in documents() {
        unmarked.extend(
            blocks(&text)
                .iter()
                .filter(|b| b.marker.is_none())
                .map(|b| format!("{path}:{}: {}", b.line, b.body.lines().next().unwrap_or(""))),
        );
    }
    assert!(
        unmarked.is_empty(),
        "README and docs/ blocks without <!-- runnable -->, <!-- needs: … --> or <!-- output -->:\n{}",
        unmarked.join("\n")
    );
}

#[test]
fn runnable_blocks_run_as_written() {
    sim_dir();
    let isolation = isolation();
    let mut ran = 0;
    let mut failures = Vec::new();
    let mut skipped = Vec::new();
    for (path, text) in documents() {
        let all = blocks(&text);
        for b in all.iter().filter(|b| b.marker == Some(Marker::Runnable)) {
            let first = b.body.lines().next().unwrap_or("");
            if isolation == Isolation::None && b.body.contains("vramhook agent") && !port_free(9464) {
                println!(
                    "SKIPPED {path}:{}: {first}\n    reason: port 9464 is taken and no network namespace can be made",
                    b.line
                );
                continue;
            }
            println!("RUN {path}:{}: {first}", b.line);
            match run_block(b, isolation) {
                Ok(out) => {
                    ran += 1;
                    println!("{out}");
                }
                Err(out) => failures.push(format!("{path}:{}:\n{}\n{out}", b.line, b.body)),
            }
        }
        for b in &all {
            if let Some(Marker::Needs(why)) = &b.marker {
                skipped.push(format!(
                    "SKIPPED {path}:{}: {}\n    reason: needs {why}",
                    b.line,
                    b.body.lines().next().unwrap_or("")
                ));
            }
        }
    }
    for line in &skipped {
        println!("{line}");
    }
    assert!(failures.is_empty(), "README and docs/ recipes failed:\n{}", failures.join("\n\n"));
    assert!(ran >= 4, "only {ran} runnable blocks ran");
}

#[test]
fn the_recipes_the_readme_must_have() {
    let text = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let runnable: String =
        blocks(&text).into_iter().filter(|b| b.marker == Some(Marker::Runnable)).map(|b| b.body).collect();
    for needle in [
        "target/release/vramhook",
        "target/release/libvramhook.so",
        "vramhook run --record",
        "tests/simcuda/build/workloads/",
        "vramhook agent",
        "/metrics",
    ] {
        assert!(runnable.contains(needle), "no runnable README recipe uses {needle}");
    }
    // The Live section now lives in docs/live.md.
    let live = std::fs::read_to_string(repo_root().join("docs/live.md")).unwrap();
    assert!(
        live.contains("--include-run-rings"),
        "the Live section must say how `vramhook run` processes reach the agent"
    );
}
