//! "Is it me, or is it them?" end to end (issue #26), on the simulated driver: two traced
//! processes share one 16 GiB device (`VRAMHOOK_SIM_SHARED`); a holder keeps 10 GiB, an
//! asker wants more than is free. Each case is checked in the agent's live incident, in
//! `vramhook analyze --json` of the agent's capture, and in the text report.

mod agent_support;

use agent_support::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

/// A verdict or sight as JSON spells it, compared without case or underscores.
fn same_name(v: &Value, want: &str) -> bool {
    let norm = |s: &str| s.to_lowercase().replace('_', "");
    v.as_str().is_some_and(|s| norm(s) == norm(want))
}

fn wait_for_file(path: &Path, child: &mut Child) {
    let start = Instant::now();
    while !path.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the holder exited before it was ready: {status}");
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Case {
    name: &'static str,
    holder_args: &'static [&'static str],
    holder_env: &'static [(&'static str, &'static str)],
    ask_gib: &'static str,
    verdict: &'static str,
    sight: &'static str,
    /// (releasable, not visible, live) of the holder, in GiB.
    bytes: (u64, u64, u64),
    /// Words the explanation must hold.
    says: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "idle cache seen through its lens",
        holder_args: &[],
        holder_env: &[],
        ask_gib: "8",
        verdict: "other_process",
        sight: "lens",
        bytes: (10, 0, 0),
        says: "with their releasable bytes given back",
    },
    Case {
        name: "idle cache without a lens",
        holder_args: &[],
        holder_env: &[("SIM_NO_LENS", "1")],
        ask_gib: "8",
        verdict: "other_process",
        sight: "cache_not_visible",
        bytes: (0, 10, 0),
        says: "cache not visible",
    },
    Case {
        name: "live memory",
        holder_args: &["--live"],
        holder_env: &[],
        ask_gib: "8",
        verdict: "other_process",
        sight: "lens",
        bytes: (0, 0, 10),
        says: "memory they were using",
    },
    Case {
        name: "larger than the device",
        holder_args: &[],
        holder_env: &[],
        ask_gib: "20",
        verdict: "capacity",
        sight: "lens",
        bytes: (10, 0, 0),
        says: "with the device to itself",
    },
];

fn check_holder(h: &Value, case: &Case, pid: u32, at: &str) {
    assert_eq!(h["pid"], pid, "{at}, {}: {h}", case.name);
    assert!(same_name(&h["sight"], case.sight), "{at}, {}: {h}", case.name);
    let got = (h["releasable_bytes"].as_u64(), h["not_visible_bytes"].as_u64(), h["live_bytes"].as_u64());
    let (r, n, l) = case.bytes;
    assert_eq!(got, (Some(r * GIB), Some(n * GIB), Some(l * GIB)), "{at}, {}: {h}", case.name);
}

#[test]
fn another_process_memory_is_named_live_in_the_capture_and_in_the_report() {
    let captures = tempfile::tempdir().expect("capture dir");
    let work = tempfile::tempdir().expect("work dir");
    let shared = work.path().join("device");
    let cap = captures.path().to_str().expect("utf-8").to_string();
    let (rings, mut agent) = Agent::on_new_rings("holders", &["--capture-dir", &cap, "--checkpoint-interval", "60"]);
    let sim_env =
        [("VRAMHOOK_SIM_SHARED", shared.to_str().expect("utf-8")), ("VRAMHOOK_SIM_VRAM_BYTES", "17179869184")];
    let mut expected = Vec::new(); // (asker pid, holder pid, case)
    for (k, case) in CASES.iter().enumerate() {
        let (ready, stop) = (work.path().join(format!("ready{k}")), work.path().join(format!("stop{k}")));
        let mut args = vec!["--hold", "10", "--ready", ready.to_str().expect("utf-8"), "--until"];
        args.push(stop.to_str().expect("utf-8"));
        args.extend_from_slice(case.holder_args);
        let env: Vec<(&str, &str)> = sim_env.iter().chain(case.holder_env).copied().collect();
        let mut holder = spawn_traced(&workload("cache_holder"), &args, rings.path(), &env);
        let hpid = holder.id();
        wait_for_file(&ready, &mut holder);
        // The agent has the holder's memory (and its lens's numbers) before the asker fails.
        let lens = case.holder_env.is_empty();
        agent.wait_state(Duration::from_secs(30), "the holder's memory", |s| {
            process(s, hpid).is_some_and(|p| {
                p["held_bytes"].as_u64() == Some(10 * GIB)
                    && (!lens || p["framework_caches"].as_array().is_some_and(|c| !c.is_empty()))
            })
        });
        let asker = spawn_traced(&workload("cache_holder"), &["--ask", case.ask_gib], rings.path(), &sim_env);
        let apid = asker.id();
        let out = asker.wait_with_output().expect("asker");
        assert_eq!(out.status.code(), Some(1), "{}: {}", case.name, String::from_utf8_lossy(&out.stdout));
        let s = agent.wait_state(Duration::from_secs(30), "the asker's incident", |s| {
            s["snapshot"]["incidents"].as_array().is_some_and(|v| v.iter().any(|i| i["pid"] == apid))
        });
        let incidents = s["snapshot"]["incidents"].as_array().expect("incidents");
        let inc = incidents.iter().find(|i| i["pid"] == apid).expect("incident");
        let text = inc["explanation"].as_str().unwrap_or("");
        assert!(same_name(&inc["verdict"], case.verdict), "live, {}: {text}", case.name);
        assert!(text.contains(case.says), "live, {}: {text}", case.name);
        check_holder(&inc["holders"][0], case, hpid, "live");
        std::fs::write(&stop, b"").expect("stop");
        assert!(holder.wait().expect("holder").success(), "{}", case.name);
        // The next case starts once the agent has seen this holder go.
        agent.wait_state(Duration::from_secs(30), "the holder's exit", |s| {
            process(s, hpid).is_none_or(|p| p["alive"] == false)
        });
        expected.push((apid, hpid, case));
    }
    agent.terminate();

    let files = captures_in(captures.path());
    assert!(!files.is_empty(), "no capture written");
    let json = Command::new(vramhook_bin()).arg("analyze").arg("--json").args(&files).output().expect("analyze");
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let report: Value = serde_json::from_slice(&json.stdout).expect("report JSON");
    let text = Command::new(vramhook_bin()).arg("analyze").args(&files).output().expect("analyze text");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    let ooms = report["ooms"].as_array().expect("ooms");
    for (apid, hpid, case) in &expected {
        let o = ooms.iter().find(|o| o["pid"] == *apid).unwrap_or_else(|| panic!("no OOM of {apid}: {ooms:#?}"));
        assert!(same_name(&o["verdict"], case.verdict), "capture, {}: {}", case.name, o["explanation"]);
        check_holder(&o["holders"][0], case, *hpid, "capture");
        assert!(text.contains(case.says), "text report, {}:\n{text}", case.name);
    }
    assert!(text.contains("other processes on GPU 0 at the failure"), "{text}");
}

/// Two processes recorded apart, each by its own `vramhook run`, on one shared device:
/// `analyze` of both captures (in either order) replays them side by side in time order,
/// so the asker's failure sees the holder's cache as it was then.
#[test]
fn captures_recorded_apart_are_analysed_side_by_side() {
    let work = tempfile::tempdir().expect("work dir");
    let dir = work.path();
    let shared = dir.join("device");
    let (ready, stop) = (dir.join("ready"), dir.join("stop"));
    let run = |name: &str, args: &[&str]| {
        let mut cmd = Command::new(vramhook_bin());
        cmd.arg("run").arg("--record").arg(dir.join(format!("{name}.vhc"))).arg("--ring-dir").arg(dir.join(name));
        cmd.arg("--").arg(workload("cache_holder")).args(args);
        cmd.env("VRAMHOOK_LIB", interposer()).env_remove("LD_PRELOAD").env("VRAMHOOK_LENS_INTERVAL_S", "0");
        cmd.env("VRAMHOOK_SIM_SHARED", &shared).env("VRAMHOOK_SIM_VRAM_BYTES", "17179869184");
        cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        cmd
    };
    let (r, s) = (ready.to_str().expect("utf-8"), stop.to_str().expect("utf-8"));
    let mut holder = run("holder", &["--hold", "10", "--ready", r, "--until", s]).spawn().expect("holder");
    wait_for_file(&ready, &mut holder);
    let asked = run("asker", &["--ask", "8"]).status().expect("asker");
    assert_eq!(asked.code(), Some(1), "the asker's request failed");
    std::fs::write(&stop, b"").expect("stop");
    assert!(holder.wait().expect("holder").success());
    let hpid = {
        let out = Command::new(vramhook_bin()).arg("analyze").arg("--json").arg(dir.join("holder.vhc")).output();
        let v: Value = serde_json::from_slice(&out.expect("analyze").stdout).expect("JSON");
        v["processes"][0]["pid"].as_u64().expect("holder pid")
    };
    for order in [["holder.vhc", "asker.vhc"], ["asker.vhc", "holder.vhc"]] {
        let out = Command::new(vramhook_bin())
            .arg("analyze")
            .arg("--json")
            .args(order.iter().map(|f| dir.join(f)))
            .output()
            .expect("analyze");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let ooms = report["ooms"].as_array().expect("ooms");
        assert_eq!(ooms.len(), 1, "{order:?}: {ooms:#?}");
        let o = &ooms[0];
        assert!(same_name(&o["verdict"], "other_process"), "{order:?}: {}", o["explanation"]);
        let h = &o["holders"][0];
        assert_eq!((h["pid"].as_u64(), h["releasable_bytes"].as_u64()), (Some(hpid), Some(10 * GIB)), "{order:?}: {h}");
    }
}
