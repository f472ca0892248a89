//! Writes one hostile file of the safety suite: `hostile_file KIND N OUT`
//! (KIND: ooms, processes, process-ooms, devices, segments-ooms, big-pickle, nested).

use vramhook_safety_tests::files_kit::*;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: u64 = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let out = std::path::Path::new(a.get(3).expect("usage: hostile_file KIND N OUT"));
    let size = match a.get(1).map(String::as_str) {
        Some("ooms") => many_ooms(out, n),
        Some("processes") => many_processes(out, n),
        Some("process-ooms") => many_processes_with_an_oom(out, n),
        Some("process-exits") => many_processes_exiting(out, n),
        Some("process-ends") => many_process_ends(out, n),
        Some("devices") => many_devices(out, n),
        Some("segments-ooms") => segments_and_shared_ooms(out, n, n),
        Some("big-pickle") => big_snapshot(out, n),
        Some("nested") => nested_tuples(out, n as usize),
        _ => panic!("usage: hostile_file KIND N OUT"),
    };
    eprintln!("{} bytes", size);
}
