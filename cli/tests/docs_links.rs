//! The documents match the tree.
//!
//! - Every relative link in a Markdown file of the repository (README.md, docs/, every
//!   crate's and folder's README) names a file or folder that exists, and every `#anchor`
//!   names a heading of the file it points into, by GitHub's rule for heading ids (lowercase,
//!   spaces to `-`, punctuation other than `-` and `_` dropped, `-1`, `-2` … for repeats).
//! - Every module under a crate's `src/` (each `.rs` file, each module folder) is named in
//!   that crate's README, and every fuzz target in `fuzz/fuzz_targets/` in `fuzz/README.md`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use vramhook_testkit::repo_root;

/// The workspace's crates (and the fuzz crate), each with a README that lists its modules.
/// The workspace's crates: the `members` of the root `Cargo.toml` (a new crate is checked
/// without anyone adding it here).
fn crates() -> Vec<String> {
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .expect("a one-line `members = [...]` in Cargo.toml");
    let members: Vec<String> =
        members.trim_end_matches(']').split(',').map(|m| m.trim().trim_matches('"').to_string()).collect();
    assert!(members.len() >= 10 && members.iter().any(|m| m == "ring"), "members: {members:?}");
    members
}

/// Folders never searched for documents: build outputs, tools, other repositories.
fn skipped(name: &str) -> bool {
    name.starts_with('.') || name == "target" || name == "node_modules" || name == "corpus" || name == "artifacts"
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = rd.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() && !skipped(&name) {
            markdown_files(&e.path(), out);
        } else if ft.is_file() && name.ends_with(".md") {
            out.push(e.path());
        }
    }
}

/// The text outside fenced code blocks and inline code spans, line by line (1-based).
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop inline code: `…` spans (an unmatched backtick ends the line's code).
        let mut kept = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                kept.push(c);
            }
        }
        out.push((i + 1, kept));
    }
    out
}

/// GitHub's id for a heading: lowercase, inline markup and punctuation dropped (letters,
/// digits, `-`, `_` and spaces kept), each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every heading id of a Markdown file, repeats numbered as GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base = slug(title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    // Explicit anchors: <a id="…"> / <a name="…">.
    for (i, _) in text.match_indices("<a ") {
        let rest = &text[i..];
        for attr in ["id=\"", "name=\""] {
            if let Some(j) = rest.find(attr) {
                let v = &rest[j + attr.len()..];
                if let Some(end) = v.find('"') {
                    out.insert(v[..end].to_string());
                }
            }
        }
    }
    out
}

/// The targets of `[text](target)` and `![alt](target)` links on a line of prose.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while let Some(j) = line[i..].find("](") {
        let start = i + j + 2;
        let mut depth = 1;
        let mut k = start;
        while k < bytes.len() {
            match bytes[k] {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        if k >= bytes.len() {
            break;
        }
        let raw = line[start..k].trim();
        // `(path "title")` and `(<path>)`.
        let raw = raw.split_once(' ').map_or(raw, |(p, _)| p);
        let raw = raw.trim_start_matches('<').trim_end_matches('>');
        out.push(raw.to_string());
        i = k + 1;
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = repo_root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("README.md")), "no README.md found under {}", root.display());
    let mut anchor_cache: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut bad = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        for (line_no, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                if target.is_empty()
                    || target.contains("://")
                    || target.starts_with("mailto:")
                    || target.starts_with("data:")
                {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if path.is_empty() {
                    file.clone()
                } else if let Some(abs) = path.strip_prefix('/') {
                    root.join(abs)
                } else {
                    file.parent().unwrap().join(path)
                };
                if !dest.exists() {
                    bad.push(format!("{rel}:{line_no}: {target}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if dest.extension().is_none_or(|e| e != "md") {
                    bad.push(format!("{rel}:{line_no}: {target}: an anchor into a file that is not Markdown"));
                    continue;
                }
                let dest = dest.canonicalize().unwrap();
                let set = anchor_cache
                    .entry(dest.clone())
                    .or_insert_with(|| anchors(&std::fs::read_to_string(&dest).unwrap_or_default()));
                if !set.contains(anchor) {
                    bad.push(format!("{rel}:{line_no}: {target}: no heading with the id #{anchor}"));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} relative links found: is the parser still right?");
    assert!(bad.is_empty(), "links that do not resolve:\n{}", bad.join("\n"));
}

/// Whether `name` occurs in `text` not preceded by a letter, digit or `_` (so `ring.rs` is
/// not found in `fooring.rs`), and not followed by one.
fn named(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Every module file and module folder under `src`, as paths relative to it.
fn modules(src: &Path, rel: &Path, out: &mut Vec<(PathBuf, bool)>) {
    let mut entries: Vec<_> = std::fs::read_dir(src.join(rel)).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = rel.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            out.push((p.clone(), true));
            modules(src, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push((p, false));
        }
    }
}

#[test]
fn every_module_is_named_in_its_crates_readme() {
    let root = repo_root();
    let mut missing = Vec::new();
    for krate in &crates() {
        let readme_path = root.join(krate).join("README.md");
        let Ok(readme) = std::fs::read_to_string(&readme_path) else {
            missing.push(format!("{krate}/README.md: missing (it must list the crate's modules)"));
            continue;
        };
        let mut all = Vec::new();
        modules(&root.join(krate).join("src"), Path::new(""), &mut all);
        // A file name is enough where it is unique in the crate; otherwise its path from src/.
        let mut counts: HashMap<String, usize> = HashMap::new();
        for (p, _) in &all {
            *counts.entry(p.file_name().unwrap().to_string_lossy().into_owned()).or_default() += 1;
        }
        for (p, is_dir) in &all {
            let file = p.file_name().unwrap().to_string_lossy().into_owned();
            let path = p.display().to_string();
            if *is_dir {
                if !named(&readme, &format!("{path}/")) {
                    missing.push(format!("{krate}/README.md: the module folder src/{path}/"));
                }
                continue;
            }
            if ["lib.rs", "main.rs", "mod.rs"].contains(&file.as_str()) && p.parent() != Some(Path::new("")) {
                // A folder's mod.rs is the folder, named above.
                continue;
            }
            let ok = named(&readme, &path) || (counts[&file] == 1 && named(&readme, &file));
            if !ok {
                missing.push(format!("{krate}/README.md: src/{path}"));
            }
        }
    }
    assert!(missing.is_empty(), "modules a crate README does not name:\n{}", missing.join("\n"));
}

#[test]
fn every_fuzz_target_is_named_in_the_fuzz_readme() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("fuzz/README.md")).unwrap();
    let mut targets: Vec<String> = std::fs::read_dir(root.join("fuzz/fuzz_targets"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().strip_suffix(".rs").map(str::to_string))
        .collect();
    targets.sort();
    assert!(targets.len() >= 7, "fuzz targets: {targets:?}");
    let missing: Vec<&String> = targets.iter().filter(|t| !named(&readme, t)).collect();
    assert!(missing.is_empty(), "fuzz targets fuzz/README.md does not name: {missing:?}");
    // Each target is declared in fuzz/Cargo.toml too, or `cargo fuzz run` cannot find it.
    let cargo = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).unwrap();
    let undeclared: Vec<&String> =
        targets.iter().filter(|t| !cargo.contains(&format!("fuzz_targets/{t}.rs"))).collect();
    assert!(undeclared.is_empty(), "fuzz targets fuzz/Cargo.toml does not declare: {undeclared:?}");
}

#[test]
fn slugs_follow_githubs_rule() {
    assert_eq!(slug("Post-mortems: `vramhook analyze`"), "post-mortems-vramhook-analyze");
    assert_eq!(slug("Deploying: one host, systemd, containers"), "deploying-one-host-systemd-containers");
    assert_eq!(slug("The hook's cost per call"), "the-hooks-cost-per-call");
    assert_eq!(slug("Fleet post-mortems: captures from many hosts"), "fleet-post-mortems-captures-from-many-hosts");
    let a = anchors("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n");
    assert!(a.contains("a") && a.contains("notes") && a.contains("notes-1") && !a.contains("not-a-heading"));
    assert_eq!(
        link_targets("see [x](a.md#b) and ![p](docs/p.png \"t\") [y](f(1).md)"),
        ["a.md#b", "docs/p.png", "f(1).md"]
    );
}

/// Every script under `scripts/` (as git tracks them) is named in `scripts/README.md`, by its
/// path below `scripts/` or, in a topic folder the README's row names, by its file name.
#[test]
fn every_script_is_named_in_the_scripts_readme() {
    let root = vramhook_testkit::repo_root();
    let readme = std::fs::read_to_string(root.join("scripts/README.md")).expect("scripts/README.md");
    let out = std::process::Command::new("git")
        .args(["ls-files", "scripts"])
        .current_dir(&root)
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files: {}", String::from_utf8_lossy(&out.stderr));
    let files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("scripts/"))
        .filter(|l| *l != "README.md")
        .map(str::to_string)
        .collect();
    assert!(files.len() > 40, "the scripts are there: {files:?}");
    let missing: Vec<&String> = files
        .iter()
        .filter(|f| {
            let name = f.rsplit('/').next().unwrap_or(f);
            !named(&readme, f) && !named(&readme, name)
        })
        .collect();
    assert!(missing.is_empty(), "scripts not named in scripts/README.md: {missing:?}");
}
