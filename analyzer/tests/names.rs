//! The JSON schema names every verdict and outcome as the code does: `ooms[].verdict`,
//! `ooms[].outcome` and `log_incidents[].verdict` take exactly the snake_case names of
//! `Verdict::name` and `Outcome::name` (schema 4), and `verdict_name` is gone.

mod common;
use common::*;
use serde_json::Value;
use vramhook_model::{Outcome, Verdict};

fn enum_of(schema: &Value, def: &str, field: &str) -> Vec<String> {
    schema["$defs"][def]["properties"][field]["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("$defs.{def}.properties.{field}.enum"))
        .iter()
        .map(|v| v.as_str().expect("a name").to_string())
        .collect()
}

#[test]
fn the_schema_names_are_the_code_names() {
    let s = schema();
    assert_eq!(s["properties"]["schema_version"]["const"], vramhook_analyzer::report::SCHEMA_VERSION);
    let verdicts: Vec<String> = Verdict::ALL.iter().map(|v| v.name().to_string()).collect();
    let outcomes: Vec<String> = Outcome::ALL.iter().map(|o| o.name().to_string()).collect();
    let oom_def = s["$defs"]
        .as_object()
        .expect("$defs")
        .iter()
        .find(|(_, d)| d["properties"].get("outcome").is_some())
        .map(|(k, _)| k.clone())
        .expect("the OOM definition");
    assert_eq!(enum_of(&s, &oom_def, "verdict"), verdicts);
    assert_eq!(enum_of(&s, &oom_def, "outcome"), outcomes);
    assert!(s["$defs"][&oom_def]["properties"].get("verdict_name").is_none());
    let log_def = s["$defs"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, d)| d["properties"].get("quoted").is_some())
        .map(|(k, _)| k.clone())
        .expect("the log incident definition");
    let log_names = enum_of(&s, &log_def, "verdict");
    for n in &log_names {
        assert!(verdicts.contains(n) || n == "not_an_oom", "log verdict {n} is not a verdict's name");
    }
    assert!(s["$defs"][&log_def]["properties"].get("verdict_name").is_none());
}
