//! Framework verdicts end to end on the simulated driver (issue #10): a PyTorch-style cache
//! fragmented on purpose, with the lens (the simulated lens feed in C, and the real Python
//! lens over a stand-in `torch`), without it, and with the fix; and `vramhook demo`, which
//! tells the same story.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vramhook_testkit::{interposer, repo_root, sim_dir, vramhook_bin as vramhook};

/// `vramhook run --record dir/name.vhc -- program...` on the simulated driver.
fn run(dir: &Path, name: &str, program: &[&str], envs: &[(&str, &str)]) -> (PathBuf, Output) {
    let capture = dir.join(format!("{name}.vhc"));
    let mut cmd = Command::new(vramhook());
    cmd.arg("run").arg("--record").arg(&capture).arg("--ring-dir").arg(dir.join(format!("rings-{name}")));
    cmd.arg("--").args(program);
    cmd.env("VRAMHOOK_LIB", interposer()).env("LD_LIBRARY_PATH", sim_dir()).env_remove("LD_PRELOAD");
    cmd.env_remove("PYTHONPATH").env("VRAMHOOK_LENS_INTERVAL_S", "0");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run vramhook");
    assert!(capture.is_file(), "no capture:\n{}", String::from_utf8_lossy(&out.stderr));
    (capture, out)
}

fn report(capture: &Path) -> Value {
    let out = Command::new(vramhook()).arg("analyze").arg("--json").arg(capture).output().expect("analyze");
    assert!(out.status.success(), "analyze: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

fn workload(name: &str) -> String {
    sim_dir().join("workloads").join(name).to_string_lossy().into_owned()
}

const MIB: u64 = 1 << 20;

#[test]
fn a_fragmented_cache_with_the_simulated_lens_is_framework_fragmentation_with_its_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cap, out) = run(dir.path(), "frag", &[&workload("torch_fragmented")], &[]);
    assert_eq!(out.status.code(), Some(1), "the program raised its OOM");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // What the program itself computed: 16 segments of 1000 MiB, 600 MiB in use in each.
    assert!(stdout.contains("tensors=16 reserved=16777216000 allocated=10066329600"), "{stdout}");
    let r = report(&cap);
    let ooms = r["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = &ooms[0];
    assert_eq!(o["verdict"], "framework_fragmentation", "{}", o["explanation"]);
    assert_eq!(o["outcome"], "failed");
    assert_eq!(o["framework"], "pytorch", "attributed from the libc10_cuda.so it maps");
    let l = &o["framework_oom"];
    assert_eq!(l["requested"], 2000 * MIB);
    assert_eq!((l["reserved"].as_u64(), l["allocated"].as_u64()), (Some(16_777_216_000), Some(10_066_329_600)));
    assert_eq!((l["largest_free_block"].as_u64(), l["segments_listed"].as_u64()), (Some(400 * MIB), Some(16)));
    let text = o["explanation"].as_str().expect("explanation");
    // The program's own PyTorch-style message and vramhook's explanation give the same numbers.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("9.38 GiB is allocated by PyTorch, and 6.25 GiB is reserved by PyTorch but unallocated"));
    assert!(text.contains("9.38 GiB (10,066,329,600 bytes) allocated by PyTorch"), "{text}");
    assert!(text.contains("6.25 GiB (6,710,886,400 bytes) reserved by PyTorch but unallocated"), "{text}");
    assert!(text.contains("expandable_segments:True"), "{text}");
}

#[test]
fn without_the_lens_the_same_cache_is_framework_cache_not_capacity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cap, _) = run(dir.path(), "nolens", &[&workload("torch_fragmented")], &[("SIM_NO_LENS", "1")]);
    let r = report(&cap);
    let o = &r["ooms"][0];
    assert_eq!(o["verdict"], "framework_cache", "{}", o["explanation"]);
    assert!(o["explanation"].as_str().is_some_and(|t| t.contains("PyTorch held 15.62 GiB")), "{}", o["explanation"]);
    assert_eq!(o["framework_oom"], Value::Null);
}

#[test]
fn with_expandable_segments_the_same_program_does_not_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cap, out) = run(dir.path(), "fixed", &[&workload("torch_fragmented")], &[("SIM_EXPANDABLE", "1")]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let r = report(&cap);
    assert_eq!(r["ooms"].as_array().map(Vec::len), Some(0));
    assert_eq!(r["processes"][0]["failed_calls"], 0);
}

#[test]
fn a_true_shortage_stays_capacity() {
    // torch_caching asks for 200 GiB of a 16 GiB device: no cache could have covered it.
    let dir = tempfile::tempdir().expect("tempdir");
    let (cap, _) = run(dir.path(), "capacity", &[&workload("torch_caching")], &[]);
    let r = report(&cap);
    let ooms = r["ooms"].as_array().expect("ooms");
    assert!(!ooms.is_empty());
    assert!(ooms.iter().all(|o| o["verdict"] == "capacity"), "{ooms:#?}");
}

/// A framework library loaded after the process's first CUDA call (the ring's creation scan
/// saw none): our `dlopen` (by path) or our `dlsym` in its handle (loaded by bare name,
/// through the program's RUNPATH, where glibc's own `dlopen` ran) looks again and records
/// it, so the OOM of a full device is `framework_cache`; without the library, `capacity`.
#[test]
fn a_framework_library_loaded_after_the_first_cuda_call_is_attributed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, &[&str], &str, Value); 3] = [
        ("late-path", &[], "framework_cache", Value::from("cupy")),
        ("late-bare", &["--bare"], "framework_cache", Value::from("cupy")),
        ("late-none", &["--no-dlopen"], "capacity", Value::Null),
    ];
    for (name, args, verdict, framework) in cases {
        let program = workload("late_framework");
        let mut argv = vec![program.as_str()];
        argv.extend_from_slice(args);
        let (cap, out) = run(dir.path(), name, &argv, &[("VRAMHOOK_SIM_VRAM_BYTES", "1073741824")]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("allocations=10 oom=1"), "{name}: {stdout}");
        assert_eq!(stdout.contains("loaded the framework library"), !args.contains(&"--no-dlopen"), "{name}");
        let r = report(&cap);
        let ooms = r["ooms"].as_array().expect("ooms");
        // The fill's last 100 MiB and the 500 MiB request.
        assert_eq!(ooms.len(), 2, "{name}: {ooms:#?}");
        for o in ooms {
            assert_eq!(o["verdict"], verdict, "{name}: {}", o["explanation"]);
            assert_eq!(o["framework"], framework, "{name}");
        }
    }
}

/// The real CuPy and JAX lenses (lens/) over stand-in `cupy` and `jax` modules
/// (tests/fixtures/fake_frameworks) that cache on the simulated driver: each fragments its
/// cache, pauses for a sample, and fails a 300 MiB request with 400 MiB stranded in 40 MiB
/// pieces. Their samples carry the pool's own numbers, and the verdict comes from them.
#[test]
fn the_cupy_and_jax_lenses_sample_their_pools_and_judge_the_oom() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = repo_root().join("tests/fixtures/fake_frameworks");
    let pythonpath = fake.display().to_string();
    for (name, framework, args, largest) in [
        ("cupy", "CuPy", &[][..], Value::Null),
        ("jax", "JAX/XLA", &[][..], Value::from(40 * MIB)),
        ("cupy-whole", "CuPy", &["whole"][..], Value::Null),
    ] {
        let script = fake.join(format!("{}_fragment.py", name.trim_end_matches("-whole")));
        let mut argv = vec!["python3", script.to_str().expect("path")];
        argv.extend_from_slice(args);
        let envs = [
            ("VRAMHOOK_SIM_VRAM_BYTES", "1073741824"),
            ("PYTHONPATH", pythonpath.as_str()),
            ("VRAMHOOK_LENS_INTERVAL_S", "0.05"),
            ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
        ];
        let (cap, out) = run(dir.path(), name, &argv, &envs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(lens_lines(&stderr), late_note(&stderr), "{name}: the lens complained: {stderr}");
        let r = report(&cap);
        let ooms = r["ooms"].as_array().expect("ooms");
        // The lens's samples: the last one before the OOM is the pool's own numbers.
        let samples = dump_kind(&cap, "framework_sample");
        assert!(!samples.is_empty(), "{name}: no framework_sample recorded");
        if name == "jax" {
            // XLA's largest allocation served (`largest_alloc_size`), the fit's demand: in `aux`.
            let stats = dump_kind(&cap, "framework_stats");
            assert!(stats.iter().any(|s| s["aux"] == 100 * MIB), "{name}: largest allocation not recorded: {stats:?}");
        }
        if name == "cupy-whole" {
            // Freed whole: CuPy's give-back and retry got the bytes; the incident recovered.
            assert_eq!(out.status.code(), Some(0), "{stderr}");
            assert!(stdout.contains("no_oom"), "{stdout}");
            assert_eq!(ooms.len(), 1, "{ooms:#?}");
            assert_eq!(ooms[0]["outcome"], "recovered");
            assert_eq!(ooms[0]["verdict"], "reclaimable", "{}", ooms[0]["explanation"]);
            continue;
        }
        assert_eq!(out.status.code(), Some(1), "{name}: the program raised its OOM: {stderr}");
        assert!(stdout.contains("reserved=1048576000 allocated=629145600"), "{name}: {stdout}");
        let last = samples.last().expect("a sample");
        // A sample's reserved bytes are in `addr`, allocated in `size`, the largest free block in `aux`.
        assert_eq!(
            (last["addr"].as_u64(), last["size"].as_u64()),
            (Some(1000 * MIB), Some(600 * MIB)),
            "{name}: {last}"
        );
        let unknown = Value::from(u64::MAX);
        assert_eq!(last["aux"], if largest.is_null() { unknown } else { largest.clone() }, "{name}");
        assert_eq!(ooms.len(), 1, "{name}: {ooms:#?}");
        let o = &ooms[0];
        assert_eq!(o["verdict"], "framework_fragmentation", "{name}: {}", o["explanation"]);
        // The framework raised: its lens (at exit, on this Python) says it gave up.
        assert_eq!(o["outcome"], "failed", "{name}");
        assert_eq!(o["framework_oom"]["requested"], 300 * MIB, "{name}");
        assert_eq!(o["framework_oom"]["allocated"], 600 * MIB, "{name}");
        assert_eq!(o["requested_bytes"], 300 * MIB);
        let text = o["explanation"].as_str().expect("explanation");
        // Judged on the framework's numbers at its raise (no longer on the last sample).
        assert!(text.contains(&format!("{framework} said, when it gave up")), "{name}: {text}");
        assert!(text.contains("400.00 MiB (419,430,400 bytes) reserved by"), "{name}: {text}");
        if largest.is_null() {
            assert!(text.contains("The largest free block was not measured"), "{name}: {text}");
        } else {
            assert!(text.contains("The largest free block was 40.00 MiB"), "{name}: {text}");
        }
    }
}

/// The lines of the lens on stderr.
fn lens_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains("vramhook lens:")).collect()
}

/// PyTorch with a slow snapshot (its memory history on: 6.6 s on the H200; the stand-in's
/// `_snapshot` sleeps 2.5 s, longer than the 2 s incident window): the lens writes its OOM
/// record first, stamped at the observer's call, and the segments after; one incident, the
/// segments joined to it and its largest free block from them.
#[test]
fn a_slow_snapshot_does_not_move_the_pytorch_lens_oom_record() {
    const SLEEP_NS: u64 = 2_500_000_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = repo_root().join("tests/fixtures/fake_torch");
    let path = fake.to_string_lossy().into_owned();
    let s = fake.join("fragment.py").to_string_lossy().into_owned();
    let envs =
        [("VRAMHOOK_SIM_VRAM_BYTES", "1073741824"), ("PYTHONPATH", &path), ("FAKE_TORCH_SNAPSHOT_SLEEP_S", "2.5")];
    let (cap, out) = run(dir.path(), "slow-snapshot", &["python3", &s], &envs);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let failed = dump_kind(&cap, "alloc")
        .into_iter()
        .filter(|e| e["result"] != 0)
        .filter_map(|e| e["ts_ns"].as_u64())
        .max()
        .expect("the driver's failures");
    let oom = dump_kind(&cap, "framework_oom");
    assert_eq!(oom.len(), 1);
    let oom_ts = oom[0]["ts_ns"].as_u64().expect("ts");
    assert_eq!(oom[0]["stream"].as_u64(), Some(u64::MAX), "largest free block unknown in the record");
    // Stamped at the observer's call, before the snapshot's sleep ends (not after it).
    assert!(oom_ts >= failed && oom_ts - failed < SLEEP_NS / 5, "record {} ns after the failure", oom_ts - failed);
    let segs = dump_kind(&cap, "framework_segment");
    assert_eq!(segs.len(), 10);
    assert!(
        segs.iter().all(|e| e["ts_ns"].as_u64().is_some_and(|t| t >= oom_ts + SLEEP_NS)),
        "segments after the snapshot"
    );
    let r = report(&cap);
    let ooms = r["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = &ooms[0];
    assert_eq!((o["verdict"].as_str(), o["outcome"].as_str()), (Some("framework_fragmentation"), Some("failed")));
    let l = &o["framework_oom"];
    assert_eq!((l["largest_free_block"].as_u64(), l["segments_listed"].as_u64()), (Some(40 * MIB), Some(10)));
    assert!(
        o["explanation"].as_str().is_some_and(|t| t.contains("largest free block was 40.00 MiB")),
        "{}",
        o["explanation"]
    );
    assert_eq!(r["anomalies"].as_object().map(|a| a.len()).unwrap_or(0), 0, "{}", r["anomalies"]);
}

/// The lens's one note, on a Python without sys.monitoring, that it saw the framework's error
/// only when uncaught (its record stamped at exit).
fn late_note(stderr: &str) -> Vec<&str> {
    lens_lines(stderr).into_iter().filter(|l| l.contains("seen when uncaught, at exit")).collect()
}

/// Python's own version (3.12 has sys.monitoring: the raise is seen where it happens).
fn python_has_monitoring() -> bool {
    Command::new("python3")
        .args(["-c", "import sys; sys.exit(0 if hasattr(sys, 'monitoring') else 1)"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Each framework that raises its out-of-memory error (stand-in `jax`, `jaxlib`, `cupy`,
/// `tensorflow` raising the real classes, same module paths, with the real messages), under
/// the real lens: one incident each, the framework's numbers at the raise, the right
/// verdict. On Python 3.11 the raise is seen through the excepthook fallback (uncaught, at
/// exit), and the lens says so once.
#[test]
fn each_frameworks_raised_oom_is_one_incident_with_its_own_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = repo_root().join("tests/fixtures/fake_frameworks");
    let pythonpath = fake.display().to_string();
    #[derive(Clone, Copy)]
    struct Case {
        name: &'static str,
        script: &'static str,
        env: &'static [(&'static str, &'static str)],
        error: &'static str,
        api: &'static str,
        lens: [u64; 3],
        largest: Option<u64>,
    }
    // JAX's default preallocation (768 MiB of the 1 GiB device): no driver call fails.
    let jax_prealloc = Case {
        name: "jax-prealloc",
        script: "jax_prealloc.py",
        env: &[],
        error: "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 200.00MiB",
        api: "lens",
        lens: [200 * MIB, 768 * MIB, 300 * MIB],
        largest: Some(168 * MIB),
    };
    let cases = [
        jax_prealloc,
        // An older jaxlib: the same numbers, its own error class and message.
        Case {
            name: "jax-old",
            env: &[("FAKE_JAX_OLD", "1")],
            error: "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 209715200 bytes.",
            ..jax_prealloc
        },
        // TensorFlow with growth: its failed region is the driver's failure; reserved unknown
        // to TensorFlow's API, the process's held bytes stand for it.
        Case {
            name: "tf",
            script: "tf_fragment.py",
            env: &[("TF_FORCE_GPU_ALLOW_GROWTH", "true")],
            error: "tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node __wrapped__Fill_device_/job:localhost/replica:0/task:0/device:GPU:0}} OOM when allocating tensor with shape[300,1024,1024] and type uint8",
            api: "cuMemAlloc_v2",
            lens: [300 * MIB, 1000 * MIB, 600 * MIB],
            largest: None,
        },
    ];
    for c in &cases {
        let script = fake.join(c.script);
        let mut envs = vec![("VRAMHOOK_SIM_VRAM_BYTES", "1073741824"), ("PYTHONPATH", pythonpath.as_str())];
        envs.extend_from_slice(c.env);
        let (cap, out) = run(dir.path(), c.name, &["python3", script.to_str().expect("path")], &envs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", c.name);
        assert!(stderr.contains(c.error), "{}: {stderr}", c.name);
        let late = late_note(&stderr);
        assert_eq!(lens_lines(&stderr), late, "{}: the lens complained: {stderr}", c.name);
        assert_eq!(late.len(), usize::from(!python_has_monitoring()), "{}: {stderr}", c.name);
        let r = report(&cap);
        let ooms = r["ooms"].as_array().expect("ooms");
        assert_eq!(ooms.len(), 1, "{}: {ooms:#?}", c.name);
        let o = &ooms[0];
        assert_eq!((o["api"].as_str(), o["outcome"].as_str()), (Some(c.api), Some("failed")), "{}", c.name);
        assert_eq!(o["verdict"], "framework_fragmentation", "{}: {}", c.name, o["explanation"]);
        let l = &o["framework_oom"];
        let got = [l["requested"].as_u64(), l["reserved"].as_u64(), l["allocated"].as_u64()];
        assert_eq!(got, c.lens.map(Some), "{}: {l}", c.name);
        assert_eq!(l["largest_free_block"].as_u64(), c.largest, "{}: {l}", c.name);
        assert_eq!(dump_kind(&cap, "framework_oom").len(), 1, "{}: one record per raise", c.name);
    }
}

/// A Python with sys.monitoring (3.12+): `VRAMHOOK_TEST_PYTHON312`, else `python3.12`, else
/// an installed pyenv version (its shims answer only for the selected one), else `python3`
/// when it is one (the GPU machine's).
fn python_with_monitoring() -> Option<String> {
    let mut candidates: Vec<String> = std::env::var("VRAMHOOK_TEST_PYTHON312").into_iter().collect();
    candidates.extend(["python3.12".to_string(), "python3.13".to_string()]);
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".pyenv")));
    if let Some(Ok(versions)) = pyenv.map(|root| std::fs::read_dir(root.join("versions"))) {
        let mut found: Vec<String> = versions
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin/python3"))
            .filter(|p| p.is_file())
            .map(|p| p.display().to_string())
            .collect();
        found.sort();
        candidates.extend(found.into_iter().rev());
    }
    candidates.push("python3".to_string());
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import sys; sys.exit(0 if hasattr(sys, 'monitoring') else 1)"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Python 3.12's sys.monitoring path, end to end: the lens records JAX's error where it is
/// raised (before the program's later calls, with no note of lateness), also when the
/// program catches it and goes on, which the 3.11 fallback (uncaught only) cannot see.
#[test]
fn on_python_312_the_raise_is_recorded_where_it_happens_even_when_caught() {
    let Some(py) = python_with_monitoring() else {
        let line = "not run: on_python_312_the_raise_is_recorded_where_it_happens_even_when_caught: no Python 3.12+ \
                    here (set VRAMHOOK_TEST_PYTHON312)";
        eprintln!("{line}");
        if let Ok(log) = std::env::var("VRAMHOOK_NOT_RUN_LOG") {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
                let _ = writeln!(f, "{line}");
            }
        }
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = repo_root().join("tests/fixtures/fake_frameworks");
    let pythonpath = fake.display().to_string();
    let script = fake.join("jax_prealloc.py");
    let envs = [("VRAMHOOK_SIM_VRAM_BYTES", "1073741824"), ("PYTHONPATH", pythonpath.as_str())];
    for (name, args, code) in [("py312-uncaught", &[][..], 1), ("py312-caught", &["catch"][..], 0)] {
        let mut argv = vec![py.as_str(), script.to_str().expect("path")];
        argv.extend_from_slice(args);
        let (cap, out) = run(dir.path(), name, &argv, &envs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{name}: {stderr}");
        assert!(lens_lines(&stderr).is_empty(), "{name}: no note, no complaint: {stderr}");
        let r = report(&cap);
        let ooms = r["ooms"].as_array().expect("ooms");
        assert_eq!(ooms.len(), 1, "{name}: {ooms:#?}");
        assert_eq!((ooms[0]["api"].as_str(), ooms[0]["outcome"].as_str()), (Some("lens"), Some("failed")));
        assert_eq!(ooms[0]["verdict"], "framework_fragmentation", "{name}");
        let oom = dump_kind(&cap, "framework_oom");
        assert_eq!(oom.len(), 1, "{name}: RAISE fires in each frame; one record");
        if args.is_empty() {
            continue;
        }
        // Stamped at the raise: before the program's 0.5 s wait and its exit after it.
        let marker = dump_kind(&cap, "process_exit").iter().filter_map(|e| e["ts_ns"].as_u64()).max().expect("exit");
        let t = oom[0]["ts_ns"].as_u64().expect("ts");
        assert!(t + 400_000_000 < marker, "{name}: record {t}, marker {marker}");
    }
    // CuPy's fill loop, its OutOfMemoryError caught: the lens's numbers (a pool fully used)
    // join the driver's failure, and the full device is `capacity`.
    let script = fake.join("cupy_fill.py");
    let (cap, out) = run(dir.path(), "py312-cupy-fill", &[py.as_str(), script.to_str().expect("path")], &envs);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let r = report(&cap);
    let ooms = r["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = &ooms[0];
    assert_eq!((o["api"].as_str(), o["outcome"].as_str()), (Some("cuMemAlloc_v2"), Some("failed")));
    assert_eq!(o["verdict"], "capacity", "{}", o["explanation"]);
    let l = &o["framework_oom"];
    assert_eq!((l["requested"].as_u64(), l["allocated"].as_u64()), (Some(100 * MIB), Some(1000 * MIB)), "{l}");
    assert_eq!(l["reserved"], l["allocated"], "nothing cached: {l}");
}

/// CuPy gives memory back: ~100 cached 10 MiB blocks freed by free_all_blocks (more than
/// the incident window's 64 events), then its retry of the same 300 MiB succeeds: the
/// incident ends `Recovered`, and CuPy raised nothing (no lens record).
#[test]
fn cupys_retry_after_freeing_its_cached_blocks_ends_recovered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = repo_root().join("tests/fixtures/fake_frameworks");
    let pythonpath = fake.display().to_string();
    let script = fake.join("cupy_recover.py");
    let envs = [
        ("VRAMHOOK_SIM_VRAM_BYTES", "1073741824"),
        ("PYTHONPATH", pythonpath.as_str()),
        ("VRAMHOOK_LENS_INTERVAL_S", "0.05"),
    ];
    let (cap, out) = run(dir.path(), "cupy-recover", &["python3", script.to_str().expect("path")], &envs);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let blocks: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("cached_blocks="))
        .and_then(|n| n.trim().parse().ok())
        .expect("cached_blocks");
    assert!(blocks > 64, "more frees than the incident window's events: {blocks}");
    let r = report(&cap);
    let ooms = r["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = &ooms[0];
    assert_eq!((o["outcome"].as_str(), o["retries"].as_u64()), (Some("recovered"), Some(1)), "{o:#}");
    assert_eq!(o["freed_bytes_between"].as_u64(), Some(blocks * 10 * MIB));
    assert_eq!(o["verdict"], "reclaimable", "{}", o["explanation"]);
    assert!(dump_kind(&cap, "framework_oom").is_empty());
}

/// The lens's own Python unit tests (lens/unit-tests/): the raise watcher's type filter, its
/// once-per-exception mark, the sys.monitoring registration (with a stand-in monitoring
/// namespace on a Python without it), the excepthook chain and the message parsers; and the
/// largest allocation the PyTorch and JAX lenses put in their `framework_stats`.
#[test]
fn the_lens_python_unit_tests_pass() {
    for file in ["test_raise_watch.py", "test_lens_stats.py"] {
        let test = repo_root().join("lens/unit-tests").join(file);
        let out = Command::new("python3").arg(&test).env_remove("PYTHONPATH").output().expect("python3");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{file}: {stderr}");
        assert!(stderr.contains("OK"), "{file}: {stderr}");
    }
}

/// The records of one kind in `vramhook dump`'s JSON lines.
fn dump_kind(capture: &Path, kind: &str) -> Vec<Value> {
    let out = Command::new(vramhook()).arg("dump").arg(capture).output().expect("dump");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect::<Vec<Value>>();
    lines.into_iter().filter(|v| v["kind"] == kind).collect()
}

/// The real Python lens (lens/) in a Python process that imports a stand-in `torch`
/// (tests/fixtures/fake_torch): sitecustomize from `vramhook run`, the import watch,
/// `torch.cuda._lazy_call`, the OOM observer, `memory_stats` and `memory._snapshot`.
#[test]
fn the_python_lens_sees_the_cache_of_a_python_program() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = repo_root().join("tests/fixtures/fake_torch");
    // A site's own sitecustomize, which the lens's must still run (chained).
    let site = dir.path().join("site");
    std::fs::create_dir_all(&site).expect("site dir");
    let marker = dir.path().join("site-ran");
    std::fs::write(site.join("sitecustomize.py"), format!("open({:?}, 'w').write('yes')\n", marker.to_string_lossy()))
        .expect("sitecustomize");
    let pythonpath = format!("{}:{}", fake.display(), site.display());
    let script = fake.join("fragment.py");
    let mut cmd_env = vec![("VRAMHOOK_SIM_VRAM_BYTES", "1073741824")];
    cmd_env.push(("PYTHONPATH", &pythonpath));
    let (cap, out) = {
        let capture = dir.path().join("py.vhc");
        let mut cmd = Command::new(vramhook());
        cmd.arg("run").arg("--record").arg(&capture).arg("--ring-dir").arg(dir.path().join("rings-py"));
        cmd.arg("--").arg("python3").arg(&script);
        cmd.env("VRAMHOOK_LIB", interposer()).env("LD_LIBRARY_PATH", sim_dir()).env_remove("LD_PRELOAD");
        cmd.env("VRAMHOOK_LENS_INTERVAL_S", "0");
        for (k, v) in &cmd_env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run python3 under vramhook");
        (capture, out)
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the program raised OutOfMemoryError: {stderr}");
    assert!(stderr.contains("torch.OutOfMemoryError"), "{stderr}");
    assert!(!stderr.contains("vramhook lens:"), "the lens complained: {stderr}");
    assert_eq!(std::fs::read_to_string(&marker).ok().as_deref(), Some("yes"), "the site's sitecustomize ran");
    assert!(stack_snapshots(dir.path()).is_empty(), "stacks are off by default");
    let r = report(&cap);
    let o = &r["ooms"][0];
    assert_eq!(o["verdict"], "framework_fragmentation", "{}", o["explanation"]);
    assert_eq!(o["outcome"], "failed");
    let l = &o["framework_oom"];
    assert_eq!(l["requested"], 300 * MIB);
    assert_eq!((l["reserved"].as_u64(), l["allocated"].as_u64()), (Some(1000 * MIB), Some(600 * MIB)));
    assert_eq!((l["largest_free_block"].as_u64(), l["segments_listed"].as_u64()), (Some(40 * MIB), Some(10)));

    // --no-lens: the same program, no lens: the driver sees no framework, only the calls.
    let capture = dir.path().join("py-nolens.vhc");
    let out = Command::new(vramhook())
        .args(["run", "--no-lens", "--record"])
        .arg(&capture)
        .arg("--ring-dir")
        .arg(dir.path().join("rings-py2"))
        .arg("--")
        .arg("python3")
        .arg(&script)
        .env("VRAMHOOK_LIB", interposer())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("LD_PRELOAD")
        .envs(cmd_env.iter().copied())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let r = report(&capture);
    assert_eq!(r["ooms"][0]["framework_oom"], Value::Null, "no lens ran");
}

/// PyTorch 2.11 in `backend:cudaMallocAsync` mode refuses an OOM observer, inside its lazy
/// CUDA init: a lens that let that out failed the program's first CUDA call (seen on the
/// H200). The program must end exactly as it does without the lens.
#[test]
fn the_lens_never_fails_a_program_whose_allocator_refuses_an_oom_observer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = repo_root().join("tests/fixtures/fake_torch");
    let run = |lens: bool, name: &str| {
        let mut cmd = Command::new(vramhook());
        cmd.arg("run");
        if !lens {
            cmd.arg("--no-lens");
        }
        cmd.arg("--record").arg(dir.path().join(format!("{name}.vhc")));
        cmd.arg("--ring-dir").arg(dir.path().join(format!("rings-{name}")));
        cmd.arg("--").arg("python3").arg(fake.join("fragment.py"));
        cmd.env("VRAMHOOK_LIB", interposer()).env("LD_LIBRARY_PATH", sim_dir()).env_remove("LD_PRELOAD");
        cmd.env("VRAMHOOK_SIM_VRAM_BYTES", "1073741824").env("PYTHONPATH", &fake);
        cmd.env("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync").env("VRAMHOOK_LENS_INTERVAL_S", "0.05");
        cmd.env("FRAGMENT_HOLD_S", "0.5");
        cmd.output().expect("run python3 under vramhook")
    };
    let with = run(true, "lens");
    let without = run(false, "nolens");
    let stderr = String::from_utf8_lossy(&with.stderr);
    assert_eq!(with.status.code(), without.status.code(), "{stderr}");
    assert_eq!(with.status.code(), Some(1), "the program's own OutOfMemoryError: {stderr}");
    assert!(stderr.contains("torch.OutOfMemoryError"), "{stderr}");
    assert!(!stderr.contains("DeferredCudaCallError"), "the lens failed the program: {stderr}");
    assert!(
        !dump_kind(&dir.path().join("lens.vhc"), "framework_sample").is_empty(),
        "the lens still sampled without an OOM observer"
    );
}

/// The snapshots with stacks the lens dumped in `dir`.
fn stack_snapshots(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("vramhook-stacks-")))
        .collect();
    v.sort();
    v
}

/// The line of `script` that contains `text` (1-based).
fn line_of(script: &Path, text: &str) -> u64 {
    let src = std::fs::read_to_string(script).expect("script");
    src.lines().position(|l| l.contains(text)).expect("line") as u64 + 1
}

/// VRAMHOOK_LENS_STACKS=1: the lens records PyTorch's memory history and dumps its snapshot
/// at the OOM beside the capture; `vramhook analyze capture snapshot` lists, under the
/// incident, the allocations live at the OOM with the program's file and line.
#[test]
fn with_stacks_on_the_lens_dumps_the_snapshot_and_analyze_names_the_lines_that_hold_the_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = repo_root().join("tests/fixtures/fake_torch");
    let script = fake.join("fragment.py");
    let path = fake.to_string_lossy().into_owned();
    let s = script.to_string_lossy().into_owned();
    let envs = [("VRAMHOOK_SIM_VRAM_BYTES", "1073741824"), ("PYTHONPATH", &path), ("VRAMHOOK_LENS_STACKS", "1")];
    let (cap, out) = run(dir.path(), "stacks", &["python3", &s], &envs);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the program raised OutOfMemoryError as without stacks: {stderr}");
    let snaps = stack_snapshots(dir.path());
    assert_eq!(snaps.len(), 1, "one OOM, one snapshot beside the capture: {stderr}");
    let line = format!("vramhook lens: PyTorch memory snapshot with stacks at this OOM: {}\n", snaps[0].display());
    assert_eq!(stderr.matches("vramhook lens:").count(), 1, "{stderr}");
    assert!(stderr.contains(&line), "{line:?} not in {stderr}");

    let out = Command::new(vramhook()).arg("analyze").arg("--json").arg(&cap).arg(&snaps[0]).output().expect("analyze");
    assert!(out.status.success(), "analyze: {}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let snap_input = r["inputs"].as_array().unwrap().iter().find(|i| i["kind"] == "pytorch_snapshot").expect("input");
    assert_eq!(snap_input["pytorch"]["join"]["joined"], true, "{}", snap_input["pytorch"]["join"]);
    // The capture's incident (the lens's verdict) carries the snapshot's stacks.
    let o =
        r["ooms"].as_array().unwrap().iter().find(|o| o["from_snapshot"].is_null()).expect("the capture's incident");
    assert_eq!(o["verdict"], "framework_fragmentation");
    let live = &o["live_at_oom"];
    assert_eq!((live["allocations"].as_u64(), live["bytes"].as_u64()), (Some(10), Some(600 * MIB)), "{live}");
    assert_eq!(live["without_stack"], 0);
    let top = &live["stacks"][0];
    assert_eq!((top["allocations"].as_u64(), top["largest_bytes"].as_u64()), (Some(10), Some(60 * MIB)));
    let kept = line_of(&script, "kept = [");
    let f = &top["frames"][0];
    assert_eq!((f["file"].as_str(), f["line"].as_u64()), (Some(&*s), Some(kept)), "{top}");
    let last = line_of(&script, "torch.cuda.empty(300 * MiB)");
    let rf = &live["request_frames"][0];
    assert_eq!(
        (rf["file"].as_str(), rf["line"].as_u64(), rf["function"].as_str()),
        (Some(&*s), Some(last), Some("<module>"))
    );
    // The text, as a user reads it.
    let out = Command::new(vramhook()).arg("analyze").arg(&cap).arg(&snaps[0]).output().expect("analyze");
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "600.00 MiB in 10 allocation(s) (largest 60.00 MiB)".to_string(),
        format!("{s}:{kept} in "),
        format!("the failed request of 300.00 MiB was made at:\n         {s}:{last} in <module>"),
    ] {
        assert!(text.contains(&want), "{want:?} not in {text}");
    }

    // VRAMHOOK_LENS_STACKS_MAX=0: history, but no snapshot; a chosen directory is kept.
    let other = dir.path().join("chosen");
    std::fs::create_dir(&other).expect("dir");
    let o = other.to_string_lossy().into_owned();
    let envs2 = [envs[0], envs[1], envs[2], ("VRAMHOOK_LENS_STACKS_MAX", "0"), ("VRAMHOOK_LENS_STACKS_DIR", &o)];
    let (_, out) = run(dir.path(), "stacks-max0", &["python3", &s], &envs2);
    assert_eq!(out.status.code(), Some(1));
    assert!(stack_snapshots(&other).is_empty() && stack_snapshots(dir.path()).len() == 1);
    let envs3 = [envs[0], envs[1], envs[2], ("VRAMHOOK_LENS_STACKS_DIR", &o)];
    let (_, out) = run(dir.path(), "stacks-chosen", &["python3", &s], &envs3);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stack_snapshots(&other).len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
    // An unwritable directory: one line on stderr, the program's own outcome unchanged.
    let envs4 = [envs[0], envs[1], envs[2], ("VRAMHOOK_LENS_STACKS_DIR", "/nonexistent/vramhook")];
    let (_, out) = run(dir.path(), "stacks-nodir", &["python3", &s], &envs4);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("torch.OutOfMemoryError"), "{stderr}");
    assert!(stderr.contains("vramhook lens: no snapshot with stacks at this OOM (/nonexistent/vramhook/"), "{stderr}");
}

#[test]
fn the_demo_tells_the_story_a_fragmented_cache_its_verdict_and_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("demo.vhc");
    let out = Command::new(vramhook())
        .args(["demo", "--record"])
        .arg(&record)
        .env("VRAMHOOK_LIB", interposer())
        // Through a path with `..` in it, as the demo finds the driver from target/<profile>.
        .env("VRAMHOOK_SIM_DIR", sim_dir().join("../build"))
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run vramhook demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The paths it prints are folded (issue #28): the workload's, in the verdict.
    assert!(!stderr.contains("/../") && !stderr.contains("/./"), "an unfolded path: {stderr}");
    assert!(stderr.contains(" (/") && stderr.contains("/tests/simcuda/build/workloads/torch_fragmented)"), "{stderr}");
    assert!(stderr.contains("verdict: framework_fragmentation"), "{stderr}");
    assert!(stderr.contains("6.25 GiB (6,710,886,400 bytes) reserved by PyTorch but unallocated"), "{stderr}");
    assert!(
        stderr.contains("As expected: 1 out-of-memory incident(s) without the fix (exit 1), 0 with it (exit 0)"),
        "{stderr}"
    );
    assert!(dir.path().join("demo.expandable.vhc").is_file());
}
