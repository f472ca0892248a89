//! The report of every input fixture, byte for byte: `vramhook analyze --json` (and the text
//! report) of each capture, PyTorch snapshot and log under `tests/fixtures/`, against the
//! length and FNV-1a hash of each kept in `tests/fixtures/golden-reports.txt` (5 MB of
//! reports in the tree would be a copy of what the fixtures already say). Code moves that
//! must not change behaviour (issue 31) are checked by it; a change meant to change a
//! report rewrites the list with `VRAMHOOK_BLESS=1 cargo test -p vramhook --test
//! golden_reports`, and its diff names the reports that changed.

use std::path::{Path, PathBuf};
use std::process::Command;
use vramhook_testkit::{repo_root, vramhook_bin};

fn fixtures() -> PathBuf {
    repo_root().join("tests/fixtures")
}

/// Every input under `tests/fixtures` (captures: `vramhook run`'s `.vhc` and the agent's
/// `.vrhk`; snapshots, logs), relative, sorted.
fn inputs() -> Vec<PathBuf> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).expect("fixtures").filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(root).expect("under root").to_path_buf();
            if p.is_dir() {
                if !rel.starts_with("golden") && !rel.starts_with("fake_torch") && !rel.starts_with("fake_frameworks") {
                    walk(&p, root, out);
                }
            } else if matches!(p.extension().and_then(|x| x.to_str()), Some("vhc" | "vrhk" | "pickle" | "log"))
                && std::fs::metadata(&p).map(|m| m.len() > 0).unwrap_or(false)
            {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(&fixtures(), &fixtures(), &mut out);
    out
}

fn analyze(rel: &Path, json: bool) -> Vec<u8> {
    let mut cmd = Command::new(vramhook_bin());
    cmd.current_dir(fixtures()).arg("analyze").arg(rel);
    if json {
        cmd.arg("--json");
    }
    // Inputs that a reader judges partial exit non-zero with a full report: kept as they are.
    let out = cmd.env_remove("VRAMHOOK_FIT_WINDOW").output().expect("run vramhook analyze");
    let mut bytes = format!("exit {:?}\n", out.status.code()).into_bytes();
    bytes.extend_from_slice(&out.stdout);
    bytes
}

/// FNV-1a, 64 bits: stable across Rust releases (std's hasher is not promised to be).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[test]
fn every_fixtures_report_is_unchanged() {
    let inputs = inputs();
    assert!(inputs.len() >= 20, "the fixtures are there: {inputs:?}");
    let mut lines = Vec::new();
    for rel in &inputs {
        for (json, format) in [(true, "json"), (false, "text")] {
            let got = analyze(rel, json);
            lines.push(format!("{} {format} {} {:016x}", rel.display(), got.len(), fnv1a(&got)));
        }
    }
    let list = fixtures().join("golden-reports.txt");
    let got = lines.join("\n") + "\n";
    if std::env::var_os("VRAMHOOK_BLESS").is_some() {
        std::fs::write(&list, &got).expect("write the list");
        return;
    }
    let want = std::fs::read_to_string(&list)
        .unwrap_or_else(|e| panic!("{}: {e} (VRAMHOOK_BLESS=1 writes it)", list.display()));
    let changed: Vec<&str> = got.lines().filter(|l| !want.lines().any(|w| w == *l)).collect();
    assert!(
        changed.is_empty() && got.lines().count() == want.lines().count(),
        "reports changed (VRAMHOOK_BLESS=1 rewrites the list):\n{}",
        changed.join("\n")
    );
}
