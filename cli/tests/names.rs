//! One name per verdict and per outcome, everywhere: the snake_case names of
//! `Verdict::name` and `Outcome::name` (`framework_fragmentation`, `failed_again`, …) in the
//! text, JSON and HTML reports, the agent's metrics, state and OTLP attributes, and `top`;
//! never a Rust variant's name (`FrameworkFragmentation`, `FailedAgain`).

mod agent_support;

use agent_support::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;
use vramhook_model::{OomIncident, Outcome, Verdict};

fn vramhook(args: &[&str]) -> String {
    let out = Command::new(vramhook_bin()).args(args).output().expect("run vramhook");
    assert!(out.status.success(), "vramhook {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// One OOM incident (torch_fragmented: PyTorch's cache runs out, its lens says why), seen live
/// by the agent and then in the report of the agent's own capture: every format names its
/// verdict and outcome the same way.
#[test]
fn one_incident_has_one_verdict_name_in_every_format() {
    let captures = tempfile::tempdir().expect("capture dir");
    let (rings, mut agent) = Agent::on_new_rings("names", &["--capture-dir", captures.path().to_str().unwrap()]);
    let mut w = spawn_traced(&workload("torch_fragmented"), &[], rings.path(), &[]);
    let _ = w.wait();
    let state = agent.wait_state(Duration::from_secs(30), "the OOM incident", |s| {
        s["snapshot"]["incidents"].as_array().is_some_and(|i| !i.is_empty())
    });
    let incident = &state["snapshot"]["incidents"][0];
    let verdict = incident["verdict"].as_str().expect("the state's verdict is a string").to_string();
    let outcome = incident["outcome"].as_str().expect("the state's outcome is a string").to_string();
    assert_eq!((verdict.as_str(), outcome.as_str()), ("framework_fragmentation", "failed"), "{incident}");

    // The agent: its state (above), its metrics' label, top's recent OOMs, the OTLP attributes.
    let metrics = agent.get("/metrics");
    let series = format!("vramhook_device_ooms_total{{device=\"0\",verdict=\"{verdict}\"}}");
    assert_eq!(prom_value(&metrics, &series), Some(1.0), "{series} in:\n{metrics}");
    let top = vramhook(&["top", "--agent", &agent.addr.to_string(), "--once", "160x40"]);
    assert!(top.contains(&format!("· {verdict}: asked")), "top:\n{top}");
    let parsed: OomIncident = serde_json::from_value(incident.clone()).expect("the state's incident reads back");
    assert_eq!((parsed.verdict, parsed.outcome), (Verdict::FrameworkFragmentation, Outcome::Failed));
    let attrs = vramhook_agent::otlp::incident_attributes(&parsed);
    let attr = |k: &str| attrs.iter().find(|a| a.key.as_str() == k).map(|a| a.value.as_str().to_string());
    assert_eq!(attr("vramhook.oom.verdict").as_deref(), Some(verdict.as_str()));
    assert_eq!(attr("vramhook.oom.outcome").as_deref(), Some(outcome.as_str()));

    // The report of the agent's capture: text, JSON, HTML.
    agent.terminate();
    let files: Vec<String> =
        captures_in(captures.path()).into_iter().map(|p| p.to_str().unwrap().to_string()).collect();
    assert!(!files.is_empty(), "the agent wrote no capture in {}", captures.path().display());
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["analyze".to_string()];
        a.extend(files.iter().cloned());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |a: Vec<String>| vramhook(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let text = run(args(&[]));
    assert!(text.contains(&format!("verdict: {verdict}\n")), "text:\n{text}");
    assert!(text.contains(&format!("outcome: {outcome} after")), "text:\n{text}");
    let json: Value = serde_json::from_str(&run(args(&["--json"]))).expect("JSON");
    let o = &json["ooms"][0];
    assert_eq!((o["verdict"].as_str(), o["outcome"].as_str()), (Some(verdict.as_str()), Some(outcome.as_str())), "{o}");
    assert!(o.get("verdict_name").is_none(), "verdict_name is gone: {o}");
    let html_path = captures.path().join("report.html");
    run(args(&["--html", html_path.to_str().unwrap()]));
    let html = std::fs::read_to_string(&html_path).expect("HTML");
    assert!(html.contains(&format!("<span class=verdict>{verdict}</span>")), "HTML names the verdict {verdict}");
    assert!(html.contains(&format!("outcome: {outcome} after")), "HTML names the outcome {outcome}");
}

/// The names themselves: JSON carries exactly `name()`, for every variant.
#[test]
fn json_names_are_the_names() {
    for v in Verdict::ALL {
        assert_eq!(serde_json::to_value(v).unwrap(), Value::from(v.name()));
        assert_eq!(serde_json::from_value::<Verdict>(Value::from(v.name())).unwrap(), v);
    }
    for o in Outcome::ALL {
        assert_eq!(serde_json::to_value(o).unwrap(), Value::from(o.name()));
        assert_eq!(serde_json::from_value::<Outcome>(Value::from(o.name())).unwrap(), o);
    }
}

/// Whether `pattern` occurs in `code` and ends a word there.
fn word_at(code: &str, pattern: &str) -> bool {
    code.match_indices(pattern)
        .any(|(i, _)| !code[i + pattern.len()..].chars().next().is_some_and(|c| c.is_alphanumeric() || c == '_'))
}

/// `git grep`: no Rust variant name of a verdict or an outcome in any output format's
/// fixture, schema, expected output or documented output. Rust code that names a variant
/// (`Verdict::Capacity`) is not output and is left out; so are the records of past runs on
/// the GPU (`docs/measurements/gpu/`), which are what those builds printed.
#[test]
fn no_rust_variant_name_in_outputs_or_fixtures() {
    let root = repo_root();
    if !root.join(".git").exists() {
        println!("not run: {} is not a git checkout", root.display());
        return;
    }
    // Compound names are never English: any occurrence counts.
    let compound = ["OtherProcess", "ArenaFragmentation", "FrameworkFragmentation", "FrameworkCache", "FailedAgain"];
    // One-word names are English too: they count where a name would be printed.
    let single = ["Capacity", "Reclaimable", "Granularity", "Unknown", "Recovered", "Open", "Failed"];
    // The text report once printed the names in capitals (`verdict: CAPACITY`).
    let upper: Vec<String> =
        Verdict::ALL.iter().map(|v| v.name().to_uppercase()).chain(["NOT_AN_OOM".to_string()]).collect();
    let out = Command::new("git")
        .current_dir(&root)
        .args(["grep", "-nIE", &format!("{}|{}|{}", compound.join("|"), single.join("|"), upper.join("|")), "--"])
        .args([
            "*.md",
            "*.json",
            "*.txt",
            "*.jsonl",
            "*.log",
            "*.html",
            "*.py",
            "*.sh",
            "*/tests/*.rs",
            "tests/**",
            ":!docs/measurements/gpu/**",
            ":!model/src/**",
            // This test names the variants it looks for.
            ":!cli/tests/names.rs",
        ])
        .output()
        .expect("git grep");
    let hits = String::from_utf8_lossy(&out.stdout);
    let mut bad = Vec::new();
    for line in hits.lines() {
        // Rust code naming a variant, and Rust comments, are not output.
        let mut text = line.to_string();
        for prefix in ["Verdict::", "Outcome::", "FitLimit::", "SupplyRule::"] {
            for name in compound.iter().chain(single.iter()) {
                text = text.replace(&format!("{prefix}{name}"), "");
            }
        }
        let code = text.split_once("//").map_or(text.as_str(), |(c, _)| c);
        let word = |name: &str| {
            code.match_indices(name).any(|(i, _)| {
                let before = code[..i].chars().next_back();
                let after = code[i + name.len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        };
        let printed = |name: &str| {
            [
                format!("\"{name}\""),
                format!("'{name}'"),
                format!("`{name}`"),
                format!("verdict: {name}"),
                format!("outcome: {name}"),
                format!("outcome {name}"),
                format!("verdict={name}"),
                format!("({name})"),
            ]
            .iter()
            .any(|p| code.contains(p.as_str()))
        };
        let shouted =
            |name: &String| [format!("verdict: {name}"), format!("): {name}")].iter().any(|p| word_at(code, p));
        if compound.iter().any(|n| word(n)) || single.iter().any(|n| printed(n)) || upper.iter().any(shouted) {
            bad.push(line.to_string());
        }
    }
    assert!(bad.is_empty(), "Rust variant names where a verdict or outcome name belongs:\n{}", bad.join("\n"));
}
