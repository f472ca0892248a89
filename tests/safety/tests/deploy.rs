//! The deployment artifacts, each checked by its own ecosystem's tool (issue 14): the
//! systemd units by `systemd-analyze verify` and `security`, `scripts/install.sh` by
//! installing, reinstalling and removing into a staging root, and the agent image by
//! assembling its runtime stage into a directory and running the agent from it as the
//! image's non-root user.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vramhook_safety_tests::ring_kit::process;
use vramhook_safety_tests::{as_uid, not_run, profile_dir, repo_root, require_root, sim_dir, workload};
use vramhook_testkit::http_get;

/// The units with `ExecStart` pointing at the built binary (verify checks that it exists).
fn units_with_built_binary(dir: &Path) -> Vec<PathBuf> {
    let bin = profile_dir().join("vramhook");
    let mut out = Vec::new();
    for (unit, as_name) in [
        ("vramhook-agent.service", "vramhook-agent.service"),
        ("vramhook-agent@.service", "vramhook-agent@daemon.service"),
    ] {
        let text = std::fs::read_to_string(repo_root().join("deploy/systemd").join(unit)).expect("unit");
        let path = dir.join(as_name);
        std::fs::write(&path, text.replace("/usr/local/bin/vramhook", bin.to_str().expect("utf-8 path")))
            .expect("write");
        out.push(path);
    }
    out
}

#[test]
fn systemd_units_verify_and_rate_ok_or_better() {
    const TEST: &str = "systemd_units_verify_and_rate_ok_or_better";
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        not_run(TEST, "systemd-analyze is not installed (apt install systemd)");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let units = units_with_built_binary(dir.path());
    let verify = Command::new("systemd-analyze").arg("verify").args(&units).output().expect("verify");
    let stderr = String::from_utf8_lossy(&verify.stderr);
    // The one note allowed: the example instance runs as a system user, which verify flags.
    let complaints: Vec<&str> = stderr.lines().filter(|l| !l.contains("Special user")).collect();
    assert!(verify.status.success() && complaints.is_empty(), "systemd-analyze verify: {stderr}");
    for unit in &units {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(unit)
            .output()
            .expect("security");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let level = text
            .lines()
            .find_map(|l| l.split("exposure level for ").nth(1))
            .and_then(|rest| rest.split(": ").nth(1))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
        eprintln!("{}: exposure {level}", unit.display());
        // systemd's scale: below 2.1 reads "OK" or better (the target).
        assert!(level <= 2.0, "{} rates {level}, above OK:\n{text}", unit.display());
    }
}

fn run_install(args: &[&str]) -> String {
    let out = Command::new("bash").arg(repo_root().join("scripts/install.sh")).args(args).output().expect("install.sh");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "install.sh {args:?}: {text}");
    text
}

#[test]
fn install_script_installs_is_idempotent_and_uninstalls() {
    let root = tempfile::tempdir().expect("staging root");
    let dest = root.path().to_str().expect("utf-8");
    let from = profile_dir();
    let from = from.to_str().expect("utf-8");
    run_install(&["--from", from, "--destdir", dest]);
    let expect = [
        ("usr/local/bin/vramhook", 0o755),
        ("opt/vramhook/libvramhook.so", 0o755),
        ("etc/systemd/system/vramhook-agent.service", 0o644),
        ("etc/systemd/system/vramhook-agent@.service", 0o644),
        ("etc/default/vramhook", 0o644),
        ("usr/local/share/vramhook/ollama-vramhook.conf", 0o644),
    ];
    for (path, mode) in expect {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(root.path().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(meta.permissions().mode() & 0o777, mode, "{path}");
    }
    let version = Command::new(root.path().join("usr/local/bin/vramhook")).arg("--version").output().expect("run");
    assert!(version.status.success());
    // Twice: nothing changes.
    let again = run_install(&["--from", from, "--destdir", dest]);
    assert!(again.contains("nothing changed"), "{again}");
    // An edited settings file survives both a reinstall and an uninstall.
    let settings = root.path().join("etc/default/vramhook");
    std::fs::write(&settings, "VRAMHOOK_AGENT_ARGS=\"--listen 127.0.0.1:9999\"\n").expect("edit");
    run_install(&["--from", from, "--destdir", dest]);
    assert!(std::fs::read_to_string(&settings).expect("settings").contains("9999"));
    let removed = run_install(&["--uninstall", "--destdir", dest]);
    assert!(removed.contains("kept"), "{removed}");
    for (path, _) in expect.iter().filter(|(p, _)| !p.starts_with("etc/default")) {
        assert!(!root.path().join(path).exists(), "{path} left behind");
    }
    assert!(settings.exists());
}

/// The paths the Dockerfile's runtime stage copies to, and its user.
fn dockerfile_runtime() -> (Vec<String>, String) {
    let text = std::fs::read_to_string(repo_root().join("deploy/docker/Dockerfile")).expect("Dockerfile");
    let runtime = text.rsplit("\nFROM ").next().expect("a runtime stage");
    let copies = runtime
        .lines()
        .filter(|l| l.starts_with("COPY "))
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect();
    let user = runtime.lines().find_map(|l| l.strip_prefix("USER ")).expect("a USER line").trim().to_string();
    (copies, user)
}

#[test]
fn agent_image_tree_runs_the_agent_as_its_non_root_user() {
    const TEST: &str = "agent_image_tree_runs_the_agent_as_its_non_root_user";
    if !require_root(TEST) {
        return;
    }
    let (copies, user) = dockerfile_runtime();
    assert_eq!(copies, ["/usr/local/bin/vramhook", "/opt/vramhook/libvramhook.so"], "the Dockerfile's runtime files");
    let uid: u32 = user.split(':').next().and_then(|u| u.parse().ok()).expect("a numeric USER");
    assert_ne!(uid, 0, "the image runs as a non-root user");
    let tree = tempfile::tempdir().expect("tree");
    let status = Command::new("bash")
        .arg(repo_root().join("deploy/docker/assemble-tree.sh"))
        .arg(tree.path())
        .arg(profile_dir())
        .status()
        .expect("assemble");
    assert!(status.success());
    for path in &copies {
        assert!(tree.path().join(path.trim_start_matches('/')).is_file(), "{path} in the tree");
    }
    let passwd = std::fs::read_to_string(tree.path().join("etc/passwd")).expect("passwd");
    assert!(passwd.contains(&format!(":{uid}:{uid}:")), "the image's user: {passwd}");
    // Let the image's user reach the tree (a tempdir is 0700, root's).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tree.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    // The agent from the tree, as the image's user, drains that user's rings: a traced
    // process of that uid (the library from the tree too) shows up with its live bytes.
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let parent = tempfile::Builder::new().prefix("vramhook-image-").tempdir_in(base).expect("ring parent");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o1777)).expect("1777");
    let rings = parent.path().join(uid.to_string());
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr").port()
    };
    let mut agent = as_uid(
        Command::new(tree.path().join("entrypoint")).args([
            "agent",
            "--ring-dir",
            rings.to_str().expect("utf-8"),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ]),
        uid,
    )
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("agent from the tree");
    let state_addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    // The interposer preloaded is the tree's copy.
    let lib = tree.path().join("opt/vramhook/libvramhook.so");
    let traced = as_uid(
        Command::new(workload("leak"))
            .args(["--n", "6", "--hold", "2"])
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("LD_PRELOAD", &lib)
            .env("VRAMHOOK_DIR", &rings)
            .env_remove("VRAMHOOK_RUN_ID")
            .stdout(std::process::Stdio::piped()),
        uid,
    )
    .spawn()
    .expect("traced workload");
    let pid = traced.id();
    let out = traced.wait_with_output().expect("workload");
    assert!(out.status.success(), "workload: {}", String::from_utf8_lossy(&out.stdout));
    let live: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("live="))
        .and_then(|v| v.parse().ok())
        .expect("live=N");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut seen = None;
    while std::time::Instant::now() < deadline {
        if let Ok(body) = http_get(state_addr, "/api/v1/state") {
            if let Ok(state) = serde_json::from_str::<serde_json::Value>(&body) {
                if let Some(p) = process(&state, pid) {
                    if p["peak_bytes"].as_u64().unwrap_or(0) > 0 && p["alive"] == false {
                        seen = Some(p.clone());
                        break;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = agent.kill();
    let _ = agent.wait();
    let p = seen.expect("the traced process in the tree agent's state");
    assert_eq!(p["dropped_events"], 0, "{p}");
    assert!(p["peak_bytes"].as_u64().unwrap_or(0) >= live, "{p}");
}

/// `.tools/bin/<name>`, one of the programs `scripts/lib/backends.sh` builds; without it the
/// test is not run (and says so).
fn ci_tool(test: &str, name: &str) -> Option<PathBuf> {
    let bin = repo_root().join(".tools/bin").join(name);
    if bin.is_file() {
        return Some(bin);
    }
    not_run(test, &format!(".tools/bin/{name} is missing (scripts/lib/backends.sh builds it)"));
    None
}

#[test]
fn kubernetes_manifests_decode_strictly_into_the_api_types() {
    const TEST: &str = "kubernetes_manifests_decode_strictly_into_the_api_types";
    // The manifest checker: k8s.io/api's types, decoded strictly.
    let Some(check) = ci_tool(TEST, "k8s-check") else { return };
    let dir = repo_root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "the DaemonSet and the workload patch: {files:?}");
    let out = Command::new(&check).args(&files).output().expect("k8s-check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for kind in ["DaemonSet", "Service", "ServiceAccount", "Deployment"] {
        assert!(text.contains(&format!(" {kind}\n")), "{kind} checked: {text}");
    }

    // The checker fails where the API server would not do what the file says: a misspelt
    // field, and a variable used before it is defined (the DaemonSet's old bug).
    let bad = tempfile::tempdir().expect("dir");
    let original = std::fs::read_to_string(dir.join("daemonset.yaml")).expect("daemonset");
    let misspelt = original.replace("hostPID: true", "hostPid: true");
    let node_name = "            - name: NODE_NAME\n              valueFrom: {fieldRef: {fieldPath: spec.nodeName}}\n";
    assert!(original.contains(node_name));
    // NODE_NAME moved after its user.
    let late = original
        .replace(node_name, "")
        .replace("k8s.node.name=$(NODE_NAME)\"}\n", &format!("k8s.node.name=$(NODE_NAME)\"}}\n{node_name}"));
    assert_ne!(late, original.replace(node_name, ""));
    for (name, text, expect) in [("misspelt.yaml", misspelt, "hostPid"), ("late.yaml", late, "before it is defined")] {
        let path = bad.path().join(name);
        std::fs::write(&path, text).expect("write");
        let out = Command::new(&check).arg(&path).output().expect("k8s-check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(expect), "{name} must fail with {expect:?}: {stderr}");
    }
}

#[test]
fn collector_pipeline_is_loaded_by_a_real_collector() {
    const TEST: &str = "collector_pipeline_is_loaded_by_a_real_collector";
    // Jaeger v2 is an OpenTelemetry Collector build: it loads the pipeline as any would.
    let Some(jaeger) = ci_tool(TEST, "jaeger") else { return };
    let config = repo_root().join("deploy/otel-collector.yaml");
    let validate = |path: &Path| {
        Command::new(&jaeger).arg("validate").arg(format!("--config={}", path.display())).output().expect("jaeger")
    };
    let out = validate(&config);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A pipeline naming a component the collector lacks is refused: the check can fail.
    let dir = tempfile::tempdir().expect("dir");
    let bad = dir.path().join("bad.yaml");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&bad, text.replace("exporters: [debug]", "exporters: [no_such_exporter]")).expect("write");
    let out = validate(&bad);
    assert!(!out.status.success(), "a pipeline with an unknown exporter must not validate");
}

#[test]
fn alert_rules_check_and_their_tests_pass_including_the_headroom_forecast() {
    const TEST: &str = "alert_rules_check_and_their_tests_pass_including_the_headroom_forecast";
    let Some(promtool) = ci_tool(TEST, "promtool") else { return };
    let dir = repo_root().join("deploy/prometheus");
    for args in [&["check", "rules", "alerts.yml"][..], &["test", "rules", "alerts_test.yml"][..]] {
        let out = Command::new(&promtool).args(args).current_dir(&dir).output().expect("promtool");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "promtool {args:?}:\n{text}");
        assert!(text.contains("SUCCESS"), "{text}");
    }
    // The forecast's test can fail: with the leak slowed to a tenth, nothing runs out
    // within the hour and the expected alert is missing.
    let tmp = tempfile::tempdir().expect("dir");
    std::fs::copy(dir.join("alerts.yml"), tmp.path().join("alerts.yml")).expect("copy");
    let tests = std::fs::read_to_string(dir.join("alerts_test.yml")).expect("tests");
    std::fs::write(tmp.path().join("alerts_test.yml"), tests.replace("-536870912x60", "-53687091x60")).expect("write");
    let out = Command::new(&promtool)
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(tmp.path())
        .output()
        .expect("promtool");
    assert!(!out.status.success(), "a slow leak must not fire the forecast");
}

#[test]
fn debian_package_installs_and_removes_with_dpkg() {
    const TEST: &str = "debian_package_installs_and_removes_with_dpkg";
    let cargo_deb = repo_root().join(".tools/bin/cargo-deb");
    if !cargo_deb.is_file() && Command::new("cargo-deb").arg("--version").output().is_err() {
        not_run(TEST, "cargo-deb is not installed (scripts/lib/backends.sh installs it in .tools/bin)");
        return;
    }
    if Command::new("dpkg").arg("--version").output().is_err() {
        not_run(TEST, "dpkg is not installed (not a Debian system)");
        return;
    }
    // Built under a lock (two test runs share target/deb), from this test's own profile.
    let profile = if profile_dir().ends_with("release") { "release" } else { "dev" };
    let work = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(repo_root().join("target/deb")).expect("target/deb");
    let script = format!(
        "scripts/package-deb.sh --profile {profile} --no-build && cp target/deb/vramhook_*.deb {}/",
        work.path().display()
    );
    let out = Command::new("flock")
        .arg(repo_root().join("target/deb/.lock"))
        .args(["sh", "-c", &script])
        .current_dir(repo_root())
        .output()
        .expect("package-deb.sh");
    assert!(out.status.success(), "package-deb.sh: {}", String::from_utf8_lossy(&out.stderr));
    let deb = std::fs::read_dir(work.path())
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .expect("a .deb");

    // dpkg on a root of its own: the real system's package database is left alone.
    let root = work.path().join("root");
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(root.join(dir)).expect("dpkg dirs");
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").expect("status");
    let dpkg = |args: &[&str]| {
        let out = Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["--log=/dev/null", "--force-depends"])
            .args(args)
            .output()
            .expect("dpkg");
        assert!(out.status.success(), "dpkg {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    dpkg(&["-i", deb.to_str().expect("utf-8")]);
    let version = Command::new(root.join("usr/bin/vramhook")).arg("--version").output().expect("installed binary");
    assert!(version.status.success());
    assert!(root.join("usr/lib/vramhook/libvramhook.so").is_file());
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/vramhook-agent.service")).expect("unit");
    assert!(unit.contains("ExecStart=/usr/bin/vramhook agent"), "the unit runs the packaged binary:\n{unit}");
    let dropin = std::fs::read_to_string(root.join("usr/share/vramhook/ollama-vramhook.conf")).expect("drop-in");
    assert!(dropin.contains("LD_PRELOAD=/usr/lib/vramhook/libvramhook.so"), "{dropin}");
    dpkg(&["--purge", "vramhook"]);
    for path in [
        "usr/bin/vramhook",
        "usr/lib/vramhook/libvramhook.so",
        "lib/systemd/system/vramhook-agent.service",
        "etc/default/vramhook",
    ] {
        assert!(!root.join(path).exists(), "{path} left after purge");
    }
}

/// maturin, from `$MATURIN`, `.tools/venv` (scripts/lib/backends.sh) or `PATH`.
fn maturin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MATURIN").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    let tools = repo_root().join(".tools/venv/bin/maturin");
    if tools.is_file() {
        return Some(tools);
    }
    Command::new("maturin").arg("--version").output().ok().filter(|o| o.status.success()).map(|_| "maturin".into())
}

#[test]
fn python_wheel_installs_into_a_fresh_venv_and_traces_a_workload() {
    const TEST: &str = "python_wheel_installs_into_a_fresh_venv_and_traces_a_workload";
    let Some(maturin) = maturin() else {
        not_run(TEST, "maturin is not installed (pip install maturin; scripts/lib/backends.sh puts it in .tools/venv)");
        return;
    };
    if Command::new("python3").args(["-m", "venv", "--help"]).output().map(|o| !o.status.success()).unwrap_or(true) {
        not_run(TEST, "python3 with the venv module is not installed (apt install python3-venv)");
        return;
    }
    let profile = if profile_dir().ends_with("release") { "release" } else { "dev" };
    let work = tempfile::tempdir().expect("dir");
    let wheels = work.path().join("wheels");
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/build-wheel.sh"))
        .args(["--profile", profile, "--no-build", "--out", wheels.to_str().expect("utf-8")])
        .env("MATURIN", &maturin)
        .env("MATURIN_QUIET", "1")
        .current_dir(repo_root())
        .output()
        .expect("build-wheel.sh");
    assert!(out.status.success(), "build-wheel.sh: {}", String::from_utf8_lossy(&out.stderr));
    let wheel = std::fs::read_dir(&wheels)
        .expect("wheels")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel");

    // A fresh environment; pip installs the wheel alone, from the file (no index).
    let venv = work.path().join("venv");
    let status = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("venv");
    assert!(status.success());
    let pip = Command::new(venv.join("bin/pip"))
        .args(["install", "--no-index", "--no-deps", "--quiet"])
        .arg(&wheel)
        .output()
        .expect("pip");
    assert!(pip.status.success(), "pip install: {}", String::from_utf8_lossy(&pip.stderr));
    let bin = venv.join("bin/vramhook");
    let lib = venv.join("share/vramhook/libvramhook.so");
    assert!(lib.is_file(), "the interposer in the environment's share/vramhook");
    assert!(!venv.join("bin/libvramhook.so").exists(), "found through share/vramhook, not beside the binary");
    let version = Command::new(&bin).arg("--version").output().expect("vramhook --version");
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("vramhook "), "{version:?}");
    if repo_root().join("lens").is_dir() {
        assert!(venv.join("share/vramhook/lens").is_dir(), "the lens directory is in the wheel");
    }

    // `vramhook run` from the environment finds the packaged library by itself and
    // records a simulated workload; the capture has the driver's ground truth.
    let capture = work.path().join("leak.vhc");
    let run = Command::new(&bin)
        .arg("run")
        .arg("--record")
        .arg(&capture)
        .arg("--ring-dir")
        .arg(work.path().join("rings"))
        .arg("--")
        .arg(workload("leak"))
        .args(["--n", "4"])
        .env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("VRAMHOOK_LIB")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("vramhook run");
    assert!(run.status.success(), "vramhook run: {}", String::from_utf8_lossy(&run.stderr));
    let report = Command::new(&bin).args(["analyze", "--json"]).arg(&capture).output().expect("analyze");
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).expect("report");
    let leaked: u64 = report["leaks"].as_array().into_iter().flatten().filter_map(|l| l["bytes"].as_u64()).sum();
    assert_eq!(leaked, 6_295_456, "leak --n 4 leaves 6,295,456 bytes: {}", report["leaks"]);

    // The packaged library preloaded by hand, as a service's environment would: the
    // workload's ring appears in the directory it was given.
    let rings = work.path().join("preload-rings");
    let direct = Command::new(workload("leak"))
        .args(["--n", "2"])
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", &lib)
        .env("VRAMHOOK_DIR", &rings)
        .env_remove("VRAMHOOK_RUN_ID")
        .output()
        .expect("preloaded workload");
    assert!(direct.status.success(), "{}", String::from_utf8_lossy(&direct.stderr));
    let ring_files = std::fs::read_dir(&rings).map(|d| d.count()).unwrap_or(0);
    assert!(ring_files >= 1, "the preloaded library wrote a ring in {}", rings.display());
}
