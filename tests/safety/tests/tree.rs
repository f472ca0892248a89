//! Checks on the shape of the source tree.
//!
//! `no_function_over_120_lines`: every `fn` in a crate's `src/` (not its tests, benches or
//! the fuzz crate, not `#[cfg(test)] mod` blocks, not files named `tests.rs`) is at most
//! 120 lines from the line of its `fn` keyword to the line of its closing brace. Bodies
//! are found by brace matching over the source with strings, raw strings, chars and
//! comments blanked out. A function that is one big literal table may be allowed, with a
//! reason, in `ALLOWED`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 120;

/// (path relative to the workspace root, function name, why it may be longer).
/// Only for generated or literal tables; a function with logic in it is split instead.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// Directories never scanned: build output, the fuzz crate, hidden folders.
const SKIP_DIRS: &[&str] = &["target", "fuzz", "node_modules"];

#[derive(Debug, Clone, PartialEq, Eq)]
struct LongFn {
    path: String,
    name: String,
    line: usize,
    lines: usize,
}

#[test]
fn no_function_over_120_lines() {
    let root = workspace_root();
    let mut long = Vec::new();
    let mut scanned = 0usize;
    for src in crate_src_dirs(&root) {
        for file in rs_files(&src) {
            let rel = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&file).unwrap();
            scanned += 1;
            for f in functions(&text) {
                if f.lines > MAX_LINES && !ALLOWED.iter().any(|(p, n, _)| *p == rel && *n == f.name) {
                    long.push(LongFn { path: rel.clone(), ..f });
                }
            }
        }
    }
    assert!(scanned > 50, "found only {scanned} source files under {}", root.display());
    long.sort_by(|a, b| b.lines.cmp(&a.lines).then_with(|| a.path.cmp(&b.path)));
    let mut msg = String::new();
    for f in &long {
        let _ = writeln!(msg, "  {}:{} fn {} is {} lines", f.path, f.line, f.name, f.lines);
    }
    assert!(
        long.is_empty(),
        "{} functions are over {MAX_LINES} lines (split them into steps, or allow a literal table in ALLOWED with a reason):\n{msg}",
        long.len()
    );
}

#[test]
fn allowlist_entries_exist_and_have_reasons() {
    let root = workspace_root();
    for (path, name, reason) in ALLOWED {
        assert!(!reason.trim().is_empty(), "{path} {name}: no reason given");
        let text = std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        let f = functions(&text).into_iter().find(|f| f.name == *name);
        let f = f.unwrap_or_else(|| panic!("{path}: no fn {name} (remove it from ALLOWED)"));
        assert!(f.lines > MAX_LINES, "{path} fn {name} is {} lines: remove it from ALLOWED", f.lines);
    }
}

#[test]
fn scanner_measures_what_it_should() {
    let src = r####"
fn short() {
    let s = "}{ fn not_a_fn() {";
    let r = r#"}"}"#;
    let b = br##"{"##;
    let c = '}';
    let e = '\'';
    let q = '"';
    let l: &'static str = "x";
    // } fn comment() {
    /* } /* nested } */ { */
}

#[cfg(test)]
mod tests {
    fn hidden() {
    }
}

impl X {
    pub(crate) async unsafe fn method<'a, T: Fn(u8) -> u8>(&'a self, f: fn(u8)) -> T
    where
        T: Default,
    {
        {
        }
    }
    fn decl(&self);
}
"####;
    let got: Vec<(String, usize, usize)> = functions(src).into_iter().map(|f| (f.name, f.line, f.lines)).collect();
    assert_eq!(got, vec![("short".to_string(), 2, 11), ("method".to_string(), 21, 7)]);
}

fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().find(|p| is_workspace_root(p)).expect("workspace root").to_path_buf()
}

fn is_workspace_root(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]"))
}

/// Every `src/` folder that sits beside a `Cargo.toml`, outside `SKIP_DIRS`.
fn crate_src_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
            out.push(dir.join("src"));
        }
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if path.is_dir() && !name.starts_with('.') && !SKIP_DIRS.contains(&name.as_str()) && name != "src" {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The `.rs` files under `dir`, leaving out `tests.rs` files and `tests/` folders.
fn rs_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The source with the insides of comments, strings and char literals replaced by spaces
/// (newlines kept, so line numbers hold). Quotes and comment markers stay as spaces too.
fn blank(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let mut out = c.clone();
    let n = c.len();
    let mut i = 0;
    let wipe = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to.min(n)] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < n {
        let prev_ident = i > 0 && ident(c[i - 1]);
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            let end = (i..n).find(|&j| c[j] == '\n').unwrap_or(n);
            wipe(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < n && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            wipe(&mut out, i, j);
            i = j;
        } else if let Some(end) = raw_string_end(&c, i).filter(|_| !prev_ident) {
            wipe(&mut out, i, end);
            i = end;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < n && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            wipe(&mut out, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a, 'static).
            if c.get(i + 1) == Some(&'\\') {
                let mut j = i + 2;
                while j < n && c[j] != '\'' {
                    j += 1;
                }
                wipe(&mut out, i, j + 1);
                i = j + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                wipe(&mut out, i, i + 3);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Where the raw string (`r"…"`, `r#"…"#`, `br"…"`, `cr"…"`) starting at `i` ends, if one does.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if c[j] == 'b' || c[j] == 'c' {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|&&ch| ch == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && c[j + 1..].iter().take(hashes).filter(|&&ch| ch == '#').count() == hashes {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

/// Every `fn` with a body: name, line of the `fn` keyword (1-based), and its length in
/// lines to the closing brace. Functions inside `#[cfg(test)] mod … { }` are left out.
fn functions(src: &str) -> Vec<LongFn> {
    let c = blank(src);
    let n = c.len();
    let mut line_of = Vec::with_capacity(n);
    let mut line = 1;
    for &ch in &c {
        line_of.push(line);
        if ch == '\n' {
            line += 1;
        }
    }
    let test_mods = cfg_test_mods(&c);
    let in_test = |i: usize| test_mods.iter().any(|&(a, b)| a <= i && i <= b);
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < n {
        let is_fn = c[i] == 'f' && c[i + 1] == 'n' && (i == 0 || !ident(c[i - 1])) && c[i + 2].is_whitespace();
        if !is_fn || in_test(i) {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        while j < n && c[j].is_whitespace() {
            j += 1;
        }
        let name_start = j;
        while j < n && ident(c[j]) {
            j += 1;
        }
        if j == name_start {
            i += 1;
            continue;
        }
        let name: String = c[name_start..j].iter().collect();
        // The body opens at the first `{` outside parentheses and brackets; a `;` first
        // means a declaration without a body.
        let mut depth = 0i32;
        let mut open = None;
        while j < n {
            match c[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => {
                    open = Some(j);
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        if let Some(open) = open {
            let close = matching_brace(&c, open);
            out.push(LongFn { path: String::new(), name, line: line_of[i], lines: line_of[close] - line_of[i] + 1 });
        }
        i += 2;
    }
    out
}

/// The index of the `}` that closes the `{` at `open` (or the last index).
fn matching_brace(c: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, &ch) in c.iter().enumerate().skip(open) {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    c.len() - 1
}

/// Char ranges of `#[cfg(test)] mod name { … }` blocks.
fn cfg_test_mods(c: &[char]) -> Vec<(usize, usize)> {
    let pat: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + pat.len() <= c.len() {
        if c[i..i + pat.len()] != pat[..] {
            i += 1;
            continue;
        }
        // Skip whitespace and further attributes, then expect `[pub…] mod name {`.
        let mut j = i + pat.len();
        loop {
            while j < c.len() && c[j].is_whitespace() {
                j += 1;
            }
            if c.get(j) == Some(&'#') {
                let mut depth = 0;
                while j < c.len() {
                    match c[j] {
                        '[' => depth += 1,
                        ']' => {
                            depth -= 1;
                            if depth == 0 {
                                j += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
            } else {
                break;
            }
        }
        let rest: String = c[j..c.len().min(j + 200)].iter().collect();
        let item = rest.split('{').next().unwrap_or("");
        let words: Vec<&str> = item.split_whitespace().collect();
        let is_mod = words.contains(&"mod") && !item.contains(';');
        if is_mod && rest.contains('{') {
            let open = j + item.chars().count();
            let close = matching_brace(c, open);
            out.push((i, close));
            i = close;
        } else {
            i += pat.len();
        }
    }
    out
}
