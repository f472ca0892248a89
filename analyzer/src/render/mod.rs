//! The report, rendered: plain text for terminals ([`text`]), one self-contained HTML page
//! ([`html`], its style and script in `assets/`), and a Perfetto / Chrome trace
//! ([`perfetto`]). Renderers read a finished [`crate::Report`] and nothing else; JSON is
//! the report itself, serialised.

pub mod html;
pub mod perfetto;
pub mod text;

use vramhook_model::EventRecord;
use vramhook_protocol::record::EventKind;

/// `n` and its noun, singular for one: `count(1, "process", "processes")` is "1 process".
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `s` with every path in it folded lexically: `.` components dropped and `dir/..` pairs
/// removed, so `/repo/target/release/../../tests/x` reads `/repo/tests/x`. A path is a run
/// of characters without blanks, quotes, parentheses or commas that holds a `/`.
pub fn tidy_paths(s: &str) -> String {
    if !s.contains("/.") {
        return s.to_string();
    }
    let is_sep = |c: char| c.is_whitespace() || matches!(c, '(' | ')' | '"' | '\'' | ',' | ';' | '[' | ']');
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        let end = rest.find(is_sep).unwrap_or(rest.len());
        let (token, tail) = rest.split_at(end);
        out.push_str(&tidy_path(token));
        let sep_len = tail.chars().next().map_or(0, char::len_utf8);
        out.push_str(&tail[..sep_len]);
        rest = &tail[sep_len..];
    }
    out
}

fn tidy_path(token: &str) -> String {
    if !token.contains('/') || !token.split('/').any(|c| c == "." || c == "..") {
        return token.to_string();
    }
    let absolute = token.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in token.split('/') {
        match c {
            "" | "." => {}
            ".." => match parts.last() {
                Some(&last) if last != ".." => {
                    parts.pop();
                }
                // Above the root there is only the root.
                _ if absolute => {}
                _ => parts.push(".."),
            },
            c => parts.push(c),
        }
    }
    let joined = parts.join("/");
    let trailing = if token.ends_with('/') && !joined.is_empty() { "/" } else { "" };
    match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}{trailing}"),
        (false, true) => ".".to_string(),
        (false, false) => format!("{joined}{trailing}"),
    }
}

/// An arena's kind in words (the text and HTML reports).
pub fn arena_kind(k: vramhook_model::ArenaKind) -> &'static str {
    match k {
        vramhook_model::ArenaKind::VmmReservation => "VMM reservation",
        vramhook_model::ArenaKind::Pool => "pool",
        vramhook_model::ArenaKind::FrameworkSegment => "framework segment",
    }
}

/// What a lead-up event's size and address words hold, in words: the address only where
/// the event has one (a lens record's or a device sample's words are byte counts).
pub fn event_words(e: &EventRecord) -> String {
    use vramhook_model::fmt_bytes;
    use EventKind as K;
    match EventKind::from_code(e.kind) {
        Some(K::MemInfo) => format!("device free {} of {}", fmt_bytes(e.addr), fmt_bytes(e.size)),
        Some(K::FrameworkSample) => format!("{} allocated of {} reserved", fmt_bytes(e.size), fmt_bytes(e.addr)),
        Some(K::PoolSample) => format!("{} used of {} reserved", fmt_bytes(e.size), fmt_bytes(e.addr)),
        Some(K::FrameworkOom) => format!("{} requested, {} reserved", fmt_bytes(e.addr), fmt_bytes(e.size)),
        Some(K::PoolTrim) => format!("keep {}", fmt_bytes(e.size)),
        Some(K::Dropped) => count(e.size, "event lost", "events lost"),
        Some(K::ProcessStart) => format!("parent pid {}", e.addr),
        Some(
            K::ProcessExit
            | K::PoolCreate
            | K::PoolDestroy
            | K::StreamCreate
            | K::StreamDestroy
            | K::Frameworks
            | K::HookMiss,
        ) => String::new(),
        _ if e.addr == 0 => format!("{:>11}", fmt_bytes(e.size)),
        _ => format!("{:>11} at {:#x}", fmt_bytes(e.size), e.addr),
    }
}

/// An incident's numbers, as (label, value) rows: what the verdict was judged on.
pub fn oom_numbers(i: &crate::OomReport) -> Vec<(&'static str, String)> {
    use vramhook_model::fmt_bytes;
    let i = &i.incident;
    let mut v = vec![("requested", fmt_bytes(i.requested_bytes))];
    v.push((
        "device free",
        match (i.device_free_bytes, i.device_total_bytes) {
            (Some(f), Some(t)) => format!("{} of {}", fmt_bytes(f), fmt_bytes(t)),
            (Some(f), None) => fmt_bytes(f),
            (None, _) => "not sampled".into(),
        },
    ));
    if let Some(l) = i.framework_limit {
        v.push(("framework limit", fmt_bytes(l)));
    }
    v.push((
        "this process idle",
        format!("{} (its pools' idle reserve and its cache's free bytes)", fmt_bytes(i.own_idle_bytes)),
    ));
    if let Some(l) = &i.framework_oom {
        let largest = l.largest_free_block.map_or("not measured".to_string(), fmt_bytes);
        v.push((
            "framework",
            format!(
                "{} allocated, {} reserved, largest free block {}",
                fmt_bytes(l.allocated),
                fmt_bytes(l.reserved),
                largest
            ),
        ));
    }
    if !i.holders.is_empty() {
        let o = vramhook_model::VerdictInputs { holders: i.holders.clone(), ..Default::default() }.others();
        v.push((
            "other processes",
            format!(
                "{} releasable, {} stranded, {} not visible, {} live, {} untraced",
                fmt_bytes(o.releasable),
                fmt_bytes(o.stranded),
                fmt_bytes(o.not_visible),
                fmt_bytes(o.live),
                fmt_bytes(o.untraced.saturating_add(o.unnamed))
            ),
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_folded() {
        assert_eq!(
            tidy_paths("process 1 (/w/target/release/../../tests/simcuda/x --n 4) asked"),
            "process 1 (/w/tests/simcuda/x --n 4) asked"
        );
        assert_eq!(tidy_paths("./a/./b/../c and ../up/x and 1.5/2 and /.."), "a/c and ../up/x and 1.5/2 and /");
        assert_eq!(tidy_paths("no path here."), "no path here.");
    }

    #[test]
    fn counts_agree() {
        assert_eq!(count(1u64, "process", "processes"), "1 process");
        assert_eq!(count(0u64, "leak", "leaks"), "0 leaks");
        assert_eq!(count(2u32, "retry", "retries"), "2 retries");
    }
}
