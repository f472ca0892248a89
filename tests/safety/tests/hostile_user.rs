//! The root agent against a local user who is not its owner (issue 9). A second uid,
//! made here, owns a ring directory that a root `vramhook agent` drains; that user forges
//! rings (events naming pid 1, a ring named after pid 1 with its start time off by one),
//! truncates its own ring while the agent maps it, puts a FIFO where a ring should be,
//! swaps its directory for a symlink to a root-only one, leaves a sparse 1 GiB ring with a
//! full lap claimed, and claims 2^64-1 dropped events. The agent must live, refuse, delete
//! nothing outside its directory and export nothing for pid 1.
//!
//! Every wait polls for a condition with a generous deadline; nothing is timed.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use vramhook_safety_tests::ring_kit::{
    alloc, cpu_ticks, oom, process, prom_value, start_time, stat, Agent, RingFile, Sleeper, UserDir,
};
use vramhook_safety_tests::{as_uid, require_root, HOSTILE_UID};

const WAIT: Duration = Duration::from_secs(60);

/// A pid no process can have (above any `pid_max`): the ring of a process that is gone.
fn gone_pid(n: u32) -> u32 {
    u32::MAX - 16 - n
}

/// Runs `sh -c script` as the hostile user in `dir`.
fn as_hostile(dir: &Path, script: &str) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).current_dir(dir);
    as_uid(&mut cmd, HOSTILE_UID);
    let out = cmd.output().expect("run as the hostile user");
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

/// As root: a ring directory of the hostile user (tagged `tag`) and a live process of
/// that user to name; otherwise `None` (the test is reported not run).
fn hostile_user(test: &str, tag: &str) -> Option<(UserDir, Sleeper)> {
    if !require_root(test) {
        return None;
    }
    Some((UserDir::new(tag), Sleeper::start()))
}

/// Events of a verified ring that name pid 1, and a ring named after pid 1 with its start
/// time off by one: neither makes pid 1 appear, hold memory or have an OOM.
#[test]
fn events_naming_another_pid_are_refused_and_pid_1_never_appears() {
    let Some((user, me)) = hostile_user("events_naming_another_pid_are_refused_and_pid_1_never_appears", "forge")
    else {
        return;
    };
    // The user's own, valid ring: its writer is verified (alive, /proc owned by the user),
    // but two of its events claim to be pid 1's: 1 TiB live and an OOM.
    let own = RingFile::create(&user.dir, me.pid, me.start, HOSTILE_UID, 64);
    own.push(alloc(1, 0x7000_0000_0000, 1 << 40));
    own.push(oom(1, 1 << 41));
    own.push(alloc(me.pid, 0x1000, 4096));
    // A ring named after pid 1 (root's, alive) with its start time off by one.
    let init_start = start_time(1);
    let forged_name = format!("1-{}-0.ring", init_start + 1);
    let forged = RingFile::create_named(&user.dir, &forged_name, 1, init_start + 1, HOSTILE_UID, 64);
    forged.push(alloc(1, 0x7100_0000_0000, 2 << 40));

    let mut agent = Agent::start(&user.dir, &[]);
    let s = agent.wait_state(WAIT, "both rings to be judged", |s| {
        process(s, me.pid).is_some_and(|p| p["peak_bytes"].as_u64().unwrap_or(0) >= 4096)
            && stat(s, "rings_refused") + stat(s, "rings_closed") >= 1
    });
    assert!(process(&s, 1).is_none(), "pid 1 exported from a user's ring: {}", process(&s, 1).unwrap_or(&s));
    let incidents = s["snapshot"]["incidents"].as_array().cloned().unwrap_or_default();
    assert!(incidents.iter().all(|i| i["pid"] != 1), "an OOM incident for pid 1: {incidents:?}");
    let me_view = process(&s, me.pid).expect("the user's own process");
    assert_eq!(me_view["peak_bytes"], 4096, "only the user's own event counts for the user's process");
    assert!(stat(&s, "events_refused") >= 2, "refused events counted: {}", s["agent"]);
    assert!(stat(&s, "rings_refused") >= 1, "the ring named after pid 1 is refused: {}", s["agent"]);
    let log = agent.log();
    assert!(log.contains(&forged_name), "the refusal is reported:\n{log}");
    let metrics = agent.metrics();
    assert!(!metrics.contains("pid=\"1\""), "a series for pid 1:\n{metrics}");
    assert!(prom_value(&metrics, "vramhook_agent_events_refused_total").unwrap_or(0.0) >= 2.0, "{metrics}");
}

/// The user truncates its own ring while the agent maps it: the agent closes the ring
/// with a line and lives on (it died of SIGBUS, exit 135).
#[test]
fn a_ring_cut_while_mapped_is_closed_and_the_agent_lives() {
    let Some((user, me)) = hostile_user("a_ring_cut_while_mapped_is_closed_and_the_agent_lives", "cut") else {
        return;
    };
    let ring = RingFile::create(&user.dir, me.pid, me.start, HOSTILE_UID, 1 << 12);
    ring.push(alloc(me.pid, 0x1000, 4096));
    let path = ring.path.clone();
    drop(ring); // the test's own map goes before the cut
    let mut agent = Agent::start(&user.dir, &[]);
    agent.wait_state(WAIT, "the ring to be drained", |s| process(s, me.pid).is_some());
    as_hostile(&user.dir, &format!("truncate -s 0 {}", path.display()));
    // The stat and the process's end land in the state one after the other: wait for both.
    agent.wait_state(WAIT, "the cut ring to be closed and its process ended", |s| {
        stat(s, "rings_hostile") >= 1
            && process(s, me.pid).is_some_and(|p| p["alive"] == serde_json::Value::Bool(false))
    });
    assert!(agent.exited().is_none(), "the agent died");
    // The test reads the agent's stderr through a pipe another thread drains, so the line
    // may arrive after the state shows the ring closed: wait for it, not for an order.
    let deadline = std::time::Instant::now() + WAIT;
    while !agent.log().contains("cut to 0 bytes while mapped") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let log = agent.log();
    assert!(log.contains("cut to 0 bytes while mapped"), "a clear line:\n{log}");
    // And it still drains a ring made afterwards.
    let later = RingFile::create(&user.dir, gone_pid(0), 1, HOSTILE_UID, 16);
    later.push(alloc(gone_pid(0), 0x1000, 512));
    agent.wait_state(WAIT, "a later ring", |s| process(s, gone_pid(0)).is_some());
}

/// A FIFO named like a ring: the agent neither blocks on it nor ignores SIGTERM.
#[test]
fn a_fifo_named_like_a_ring_neither_blocks_the_agent_nor_its_stop() {
    let Some((user, me)) = hostile_user("a_fifo_named_like_a_ring_neither_blocks_the_agent_nor_its_stop", "fifo")
    else {
        return;
    };
    let fifo = format!("{}-{}-0.ring", me.pid, me.start);
    as_hostile(&user.dir, &format!("mkfifo -m 600 {fifo}"));
    // A valid ring scanned after the FIFO (higher pid), of a process that is gone.
    let ring = RingFile::create(&user.dir, gone_pid(1), 1, HOSTILE_UID, 16);
    ring.push(alloc(gone_pid(1), 0x1000, 512));
    let mut agent = Agent::start(&user.dir, &[]);
    let s = agent.wait_state(WAIT, "the FIFO refused and the ring after it drained", |s| {
        stat(s, "rings_refused") >= 1 && stat(s, "rings_closed") >= 1
    });
    assert!(process(&s, gone_pid(1)).is_some());
    assert!(agent.log().contains(&fifo), "the FIFO's refusal is reported:\n{}", agent.log());
    let status = agent.terminate(WAIT);
    assert!(status.is_some_and(|s| s.success()), "the agent must stop on SIGTERM: {status:?}\n{}", agent.log());
}

/// The user swaps its ring directory for a symlink to a root-only directory holding a
/// root ring: the agent never drains nor deletes anything there.
#[test]
fn a_swapped_directory_never_makes_the_agent_touch_files_outside_it() {
    if !require_root("a_swapped_directory_never_makes_the_agent_touch_files_outside_it") {
        return;
    }
    let user = UserDir::new("swap");
    let root_only = tempfile::Builder::new().prefix("vramhook-rootonly-").tempdir_in("/dev/shm").expect("root dir");
    let root_ring = RingFile::create(root_only.path(), gone_pid(2), 1, 0, 16);
    root_ring.push(alloc(gone_pid(2), 0x1000, 1 << 30));
    root_ring.mark_exited();
    let root_ring_path = root_ring.path.clone();

    let first = RingFile::create(&user.dir, gone_pid(3), 1, HOSTILE_UID, 16);
    first.push(alloc(gone_pid(3), 0x1000, 512));
    let mut agent = Agent::start(&user.dir, &[]);
    agent.wait_state(WAIT, "the first ring", |s| stat(s, "rings_closed") >= 1);

    as_hostile(
        user.parent.path(),
        &format!("mv {HOSTILE_UID} user.old && ln -s {} {HOSTILE_UID}", root_only.path().display()),
    );
    // Two more rings in the directory the agent opened (now `user.old`), one after the
    // other: each closed means a scan happened after the swap.
    for (n, pid) in [(2, gone_pid(4)), (3, gone_pid(5))] {
        let r = RingFile::create(&user.parent.path().join("user.old"), pid, 1, HOSTILE_UID, 16);
        r.push(alloc(pid, 0x1000, 512));
        agent.wait_state(WAIT, "a scan after the swap", |s| stat(s, "rings_closed") >= n || !root_ring_path.exists());
    }
    let s = agent.state();
    assert!(root_ring_path.exists(), "the agent deleted {} through the swapped directory", root_ring_path.display());
    assert!(process(&s, gone_pid(2)).is_none(), "the agent drained the root ring through the swapped directory");
    assert!(process(&s, gone_pid(5)).is_some(), "the agent keeps draining the directory it opened");
}

/// A sparse ring of 1 GiB with a whole lap claimed and nothing published is refused by its
/// size before it is mapped; one under the size bound costs bounded work per poll.
#[test]
fn a_sparse_gigabyte_ring_is_refused_and_a_sparse_ring_costs_little() {
    let Some((user, me)) = hostile_user("a_sparse_gigabyte_ring_is_refused_and_a_sparse_ring_costs_little", "sparse")
    else {
        return;
    };
    let big = RingFile::create(&user.dir, me.pid, me.start, HOSTILE_UID, 1 << 24); // 1 GiB
    big.set_write_pos(1 << 24);
    let big_path = big.path.clone();
    let mut agent = Agent::start(&user.dir, &[]);
    let s = agent
        .wait_state(WAIT, "the 1 GiB ring to be judged", |s| stat(s, "rings_refused") + stat(s, "rings_opened") >= 1);
    assert_eq!(stat(&s, "rings_opened"), 0, "a 1 GiB ring was mapped: {}", s["agent"]);
    assert!(agent.log().contains("more than the 67112960 bytes"), "{}", agent.log());
    let backed = std::fs::metadata(&big_path).expect("ring").blocks() * 512;
    assert!(backed < 1 << 20, "{backed} bytes of /dev/shm backed behind the 1 GiB ring");

    // Under the bound: 32 MiB, a whole lap claimed by a live writer, nothing published.
    let other = Sleeper::start();
    let sparse = RingFile::create(&user.dir, other.pid, other.start, HOSTILE_UID, 1 << 19);
    sparse.set_write_pos(1 << 19);
    agent.wait_state(WAIT, "the 32 MiB ring to be opened", |s| stat(s, "rings_opened") >= 1);
    // CPU over a few seconds of the agent's idle loop with that ring open: a ratio, not a
    // latency, with a wide margin (unbounded scanning kept a core busy).
    let (t0, c0) = (std::time::Instant::now(), cpu_ticks(agent.pid()));
    std::thread::sleep(Duration::from_secs(3));
    let ticks = cpu_ticks(agent.pid()) - c0;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let share = ticks as f64 / hz / t0.elapsed().as_secs_f64();
    eprintln!("agent CPU with a sparse 32 MiB ring open: {:.1}%", share * 100.0);
    assert!(share < 0.35, "the agent spent {:.0}% of a core on an empty ring", share * 100.0);
    assert!(agent.exited().is_none());
}

/// Two rings each claiming 2^64-1 dropped events: both are closed as hostile, the totals
/// never wrap.
#[test]
fn rings_claiming_impossible_counters_are_hostile_and_totals_never_wrap() {
    if !require_root("rings_claiming_impossible_counters_are_hostile_and_totals_never_wrap") {
        return;
    }
    let user = UserDir::new("wrap");
    let a = RingFile::create(&user.dir, gone_pid(6), 1, HOSTILE_UID, 16);
    let b = RingFile::create(&user.dir, gone_pid(7), 1, HOSTILE_UID, 16);
    for r in [&a, &b] {
        r.set_dropped(u64::MAX);
    }
    let mut agent = Agent::start(&user.dir, &[]);
    let s = agent.wait_state(WAIT, "both rings judged", |s| {
        stat(s, "rings_hostile") + stat(s, "rings_closed") >= 2
            && (stat(s, "rings_hostile") >= 2 || stat(s, "writer_dropped") > 0)
    });
    assert!(stat(&s, "writer_dropped") < 1 << 50, "the drop total took a hostile claim: {}", s["agent"]);
    assert_eq!(stat(&s, "rings_hostile"), 2, "{}", s["agent"]);
    let metrics = agent.metrics();
    assert_eq!(prom_value(&metrics, "vramhook_agent_rings_hostile_total"), Some(2.0), "{metrics}");
    let log = agent.log();
    assert!(log.contains("more than the"), "a clear line:\n{log}");
    for pid in [gone_pid(6), gone_pid(7)] {
        let dropped = process(&s, pid).map(|p| p["dropped_events"].as_u64().unwrap_or(0)).unwrap_or(0);
        assert!(dropped < 1 << 50, "pid {pid} shows {dropped} dropped");
    }
}
