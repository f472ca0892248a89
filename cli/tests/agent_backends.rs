//! The agent against REAL backends started on loopback by the tests: Jaeger v2 receives
//! the OOM incident spans (checked through its query API), Prometheus 3 receives the
//! metrics over OTLP (checked with PromQL against the model's numbers, through an
//! endpoint that is down, then slow, then back), and promtool accepts /metrics.
//!
//! The binaries come from `.tools/bin`, built by `scripts/lib/backends.sh`; a missing one
//! fails the test with how to build it.

mod agent_support;

use agent_support::*;
use serde_json::Value;
use std::io::Write;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A backend process and its scratch directory (config, data, log), removed with it.
struct Backend(Child, tempfile::TempDir);

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn wait_http(port: u16, path: &str, what: &str) {
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let start = Instant::now();
    while http_get(addr, path).is_err() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what} did not come up on port {port}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Starts backend `name` (`.tools/bin/<name>`) with `args`, its output in `<dir>/<name>.log`,
/// and waits until `port` answers GET `ready_path`.
fn start_backend(name: &str, dir: tempfile::TempDir, args: &[String], port: u16, ready_path: &str) -> Backend {
    let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).expect("log");
    let child = Command::new(backend_bin(name))
        .args(args)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let b = Backend(child, dir);
    wait_http(port, ready_path, name);
    b
}

/// Tries `probe` every 300 ms until it gives a value. Past `timeout` after `start` the test
/// fails with what the last try said and the agent's counters.
fn poll_for<T>(agent: &Agent, start: Instant, timeout: Duration, mut probe: impl FnMut() -> Result<T, String>) -> T {
    loop {
        match probe() {
            Ok(v) => return v,
            Err(what) => assert!(start.elapsed() < timeout, "{what}; agent counters {}", agent.state()["agent"]),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// This build's agent on `rings`, with the exporter settings `otel_env`.
fn agent_on(rings: &tempfile::TempDir, otel_env: &[(&str, &str)]) -> Agent {
    Agent::start(&vramhook_bin(), &["--ring-dir", rings.path().to_str().expect("utf-8 ring dir")], otel_env)
}

/// The exporter settings of an agent sending to `endpoint` over OTLP/gRPC, its spans and
/// log records batched every 200 ms (the SDK's default waits seconds), then `more`.
fn otlp_grpc_env<'a>(endpoint: &'a str, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ("OTEL_BLRP_SCHEDULE_DELAY", "200"),
    ];
    env.extend_from_slice(more);
    env
}

#[test]
fn promtool_accepts_the_metrics_endpoint() {
    let promtool = backend_bin("promtool");
    let rings = ring_dir("promtool");
    let agent = agent_on(&rings, &[]);
    let mut leak = spawn_traced(&workload("leak"), &["--n", "4", "--hold", "5"], rings.path(), &[]);
    let mut oom = spawn_traced(&workload("torch_caching"), &[], rings.path(), &[("SIM_OOM_GIB", "200")]);
    let _ = oom.wait();
    let pid = leak.id();
    agent.wait_state(Duration::from_secs(20), "the leak", |s| {
        process(s, pid).is_some_and(|p| p["live_bytes"] == 6_295_456u64)
    });
    let metrics = agent.get("/metrics");
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    check.stdin.take().expect("stdin").write_all(metrics.as_bytes()).expect("write");
    let out = check.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics rejected /metrics:\n{}{}\n{metrics}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = leak.kill();
    let _ = leak.wait();
}

fn start_jaeger(otlp_grpc: u16, otlp_http: u16, query_http: u16, query_grpc: u16) -> Backend {
    let dir = tempfile::tempdir().expect("jaeger dir");
    let config = format!(
        r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
    logs:
      receivers: [otlp]
      exporters: [debug]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query_http}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc}
      http:
        endpoint: 127.0.0.1:{otlp_http}
processors:
  batch:
    timeout: 200ms
exporters:
  debug:
    verbosity: detailed
  jaeger_storage_exporter:
    trace_storage: memstore
"#
    );
    let path = dir.path().join("jaeger.yaml");
    std::fs::write(&path, config).expect("config");
    start_backend("jaeger", dir, &["--config".into(), path.display().to_string()], query_http, "/api/services")
}

/// Jaeger on free ports: the backend, the OTLP/gRPC endpoint an agent sends to, and the
/// port of its HTTP query API.
fn jaeger_on_free_ports() -> (Backend, String, u16) {
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let jaeger = start_jaeger(ports[0], ports[1], ports[2], ports[3]);
    (jaeger, format!("http://127.0.0.1:{}", ports[0]), ports[2])
}

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"].as_array()?.iter().find(|t| t["key"] == key).map(|t| &t["value"])
}

#[test]
fn jaeger_receives_the_oom_incident_spans_and_log_records_over_grpc() {
    let (jaeger, endpoint, query_port) = jaeger_on_free_ports();
    let rings = ring_dir("jaeger");
    let agent = agent_on(&rings, &otlp_grpc_env(&endpoint, &[("OTEL_METRICS_EXPORTER", "none")]));
    let mut oom = spawn_traced(&workload("torch_caching"), &[], rings.path(), &[("SIM_OOM_GIB", "200")]);
    let pid = oom.id();
    let _ = oom.wait();
    // Exported, and in the published state (the agent publishes the snapshot that holds a
    // new incident, then hands the incident to the exporter).
    let of_pid =
        |s: &Value| s["snapshot"]["incidents"].as_array().and_then(|v| v.iter().find(|i| i["pid"] == pid)).cloned();
    let state = agent.wait_state(Duration::from_secs(30), "the OOM incident to be exported and in the state", |s| {
        s["agent"]["incidents_exported"].as_u64().unwrap_or(0) >= 1 && of_pid(s).is_some()
    });
    let incident = of_pid(&state).expect("incident in the model");

    let query = format!("/api/traces?service=vramhook-agent&operation={}&limit=50", urlencode("vramhook.oom"));
    let addr = format!("127.0.0.1:{query_port}").parse().expect("addr");
    let span = poll_for(&agent, Instant::now(), Duration::from_secs(60), || {
        let found = http_get(addr, &query).ok().and_then(|body| {
            let v: Value = serde_json::from_str(&body).expect("jaeger JSON");
            v["data"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|t| t["spans"].as_array().into_iter().flatten())
                .find(|s| {
                    s["operationName"] == "vramhook.oom"
                        && tag(s, "process.pid").and_then(Value::as_u64) == Some(u64::from(pid))
                })
                .cloned()
        });
        found.ok_or_else(|| "Jaeger never received the OOM span".to_string())
    });
    let verdict = incident["verdict"].as_str().expect("verdict");
    assert_eq!(tag(&span, "vramhook.oom.verdict").and_then(Value::as_str), Some(verdict));
    assert_eq!(tag(&span, "vramhook.oom.explanation"), Some(&incident["explanation"]));
    assert_eq!(
        tag(&span, "vramhook.oom.requested_bytes").and_then(Value::as_u64),
        incident["requested_bytes"].as_u64()
    );
    assert_eq!(tag(&span, "vramhook.oom.requested_bytes").and_then(Value::as_u64), Some(200u64 << 30));
    assert_eq!(tag(&span, "error").and_then(Value::as_bool), Some(true), "OOM spans carry error status");

    // The log record went through the same collector (Jaeger v2 is one): its debug
    // exporter prints it.
    let log_path = jaeger.1.path().join("jaeger.log");
    let explanation = incident["explanation"].as_str().expect("explanation");
    poll_for(&agent, Instant::now(), Duration::from_secs(30), || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("vramhook.oom.verdict") && log.contains(explanation) && log.contains("ERROR") {
            Ok(())
        } else {
            Err(format!("the OOM log record never reached the collector:\n{log}\n"))
        }
    });
    assert!(agent.state()["agent"]["otlp_log_exports"].as_u64().unwrap_or(0) >= 1);
}

/// The fit's crossings of 1 (issue #30) reach a real collector as log records: the
/// fragmenting server of `torch_serving` (9 GiB simulated device, `--fit-window 60`) goes
/// below 1 before its OOM, and Jaeger v2's debug exporter prints the record with the
/// process, the device, the demand (its 1.50 GiB request), the supply, what limits it and
/// the direction. No record, no pass.
#[test]
fn jaeger_receives_a_log_record_when_the_fit_crosses_below_one() {
    let (jaeger, endpoint, _query_port) = jaeger_on_free_ports();
    let rings = ring_dir("jaeger-fit");
    let agent = Agent::start(
        &vramhook_bin(),
        &["--ring-dir", rings.path().to_str().expect("utf-8"), "--fit-window", "60", "--snapshot-ms", "100"],
        &otlp_grpc_env(&endpoint, &[("OTEL_METRICS_EXPORTER", "none"), ("OTEL_TRACES_EXPORTER", "none")]),
    );
    let vram = (9u64 << 30).to_string();
    let mut server = spawn_traced(
        &workload("torch_serving"),
        &[],
        rings.path(),
        &[("VRAMHOOK_SIM_VRAM_BYTES", vram.as_str()), ("SIM_STEP_MS", "50")],
    );
    let pid = server.id();
    assert_eq!(server.wait().expect("wait").code(), Some(1), "the fragmenting server fails");
    agent.wait_state(Duration::from_secs(30), "a fit crossing handed to the exporter", |s| {
        s["agent"]["fit_crossings_exported"].as_u64().unwrap_or(0) >= 1
    });
    // One record of the debug exporter's output: from its "LogRecord #" to the next.
    let log_path = jaeger.1.path().join("jaeger.log");
    let record = poll_for(&agent, Instant::now(), Duration::from_secs(30), || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        log.split("LogRecord #")
            .find(|r| {
                r.contains("vramhook.fit.direction: Str(below)") && r.contains(&format!("process.pid: Int({pid})"))
            })
            .map(str::to_string)
            .ok_or_else(|| format!("no fit crossing below 1 of pid {pid} reached the collector:\n{log}\n"))
    });
    for want in [
        "SeverityText: WARN",
        "device: Int(0)",
        "process.executable.name: Str(torch_serving)",
        "vramhook.fit.demand_bytes: Int(1610612736)",
        "vramhook.fit.supply_bytes: Int(",
        "vramhook.fit.ratio: Double(0.",
        "vramhook.fit.limited_by: Str(framework_fragmentation)",
        "its next large request would not fit: 1.50 GiB asked for",
    ] {
        assert!(record.contains(want), "{want:?} not in the record:\n{record}");
    }
}

/// A TCP endpoint that accepts connections and never answers.
struct Slow {
    stop: Arc<AtomicBool>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl Slow {
    fn start(listener: TcpListener) -> Slow {
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let join = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(Ordering::Relaxed) {
                if let Ok((c, _)) = listener.accept() {
                    held.push(c);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Slow { stop, join: Some(join) }
    }
}

impl Drop for Slow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn start_prometheus(port: u16) -> Backend {
    let dir = tempfile::tempdir().expect("prometheus dir");
    std::fs::write(dir.path().join("prometheus.yml"), "global:\n  scrape_interval: 15s\n").expect("config");
    let args = [
        format!("--config.file={}", dir.path().join("prometheus.yml").display()),
        format!("--storage.tsdb.path={}", dir.path().join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--web.enable-otlp-receiver".into(),
    ];
    start_backend("prometheus", dir, &args, port, "/-/ready")
}

fn promql(port: u16, query: &str) -> Option<f64> {
    let addr = format!("127.0.0.1:{port}").parse().ok()?;
    let body = http_get(addr, &format!("/api/v1/query?query={}", urlencode(query))).ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"].as_array()?.first()?["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_gets_the_models_numbers_over_otlp_through_down_slow_and_back() {
    let (down, port) = DownPort::bind();
    let rings = ring_dir("prom");
    let endpoint = format!("http://127.0.0.1:{port}/api/v1/otlp/v1/metrics");
    let agent = agent_on(
        &rings,
        &[
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_LOGS_EXPORTER", "none"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
        ],
    );
    let mut leak = spawn_traced(&workload("leak"), &["--n", "4", "--hold", "60"], rings.path(), &[]);
    let pid = leak.id();

    // 1. Down: nothing listens. Exports fail and are counted; ingestion goes on.
    let s = agent.wait_state(Duration::from_secs(30), "failed exports while the endpoint is down", |s| {
        s["agent"]["otlp_metric_errors"].as_u64().unwrap_or(0) >= 1
            && process(s, pid).is_some_and(|p| p["live_bytes"] == 6_295_456u64)
    });
    let errors_down = s["agent"]["otlp_metric_errors"].as_u64().unwrap_or(0);

    // 2. Slow: the endpoint accepts and never answers. Exports time out; a new process is
    //    still ingested and /metrics still answers at once.
    let slow = Slow::start(down.listen());
    let mut more = spawn_traced(&workload("leak"), &["--n", "4"], rings.path(), &[]);
    let more_pid = more.id();
    let _ = more.wait();
    let t = Instant::now();
    agent.wait_state(Duration::from_secs(40), "timeouts against the slow endpoint", |s| {
        s["agent"]["otlp_metric_errors"].as_u64().unwrap_or(0) > errors_down
            && process(s, more_pid).is_some_and(|p| p["alive"] == false)
    });
    let m0 = Instant::now();
    let _ = agent.get("/metrics");
    assert!(m0.elapsed() < Duration::from_secs(1), "/metrics must not wait for the exporter");
    eprintln!("slow phase: {:?}", t.elapsed());
    drop(slow);

    // 3. Back: a real Prometheus 3 on the same port. The agent reconnects (after its
    //    backoff) and PromQL answers the model's numbers.
    let _prom = start_prometheus(port);
    let state = agent.state();
    let p = process(&state, pid).expect("process").clone();
    let dev = state["snapshot"]["devices"][0].clone();
    let checks = [
        (
            format!("vramhook_process_memory_live_by_kind_bytes{{process_pid=\"{pid}\",kind=\"plain\"}}"),
            p["live_by_class"]["plain"].as_f64(),
        ),
        (format!("vramhook_process_memory_peak_bytes{{process_pid=\"{pid}\"}}"), p["peak_bytes"].as_f64()),
        (format!("vramhook_process_allocations_total{{process_pid=\"{pid}\"}}"), p["allocations"].as_f64()),
        (format!("vramhook_process_allocations_live{{process_pid=\"{pid}\"}}"), p["live_allocations"].as_f64()),
        (format!("vramhook_process_memory_fragmentation_ratio{{process_pid=\"{pid}\"}}"), p["fragmentation"].as_f64()),
        ("vramhook_device_memory_total_bytes{device=\"0\"}".to_string(), dev["total"].as_f64()),
        ("vramhook_device_memory_traced_bytes{device=\"0\"}".to_string(), dev["traced_bytes"].as_f64()),
    ];
    let start = Instant::now();
    for (query, expected) in &checks {
        let expected = expected.unwrap_or_else(|| panic!("model has no value for {query}"));
        poll_for(&agent, start, Duration::from_secs(90), || match promql(port, query) {
            Some(got) if got == expected => Ok(()),
            got => Err(format!("PromQL {query} = {got:?}, the model says {expected}")),
        });
    }
    assert_eq!(p["live_bytes"], 6_295_456u64, "the simulated driver's ground truth");
    let s = agent.state();
    assert!(s["agent"]["otlp_metric_exports"].as_u64().unwrap_or(0) >= 1, "exports succeed again: {}", s["agent"]);
    let _ = leak.kill();
    let _ = leak.wait();
}

/// One series of an instant query: its labels and value.
type Series = (serde_json::Map<String, Value>, f64);

/// Every series of an instant PromQL query.
fn promql_series(port: u16, query: &str) -> Result<Vec<Series>, String> {
    let addr = format!("127.0.0.1:{port}").parse().map_err(|e| format!("{e}"))?;
    let body = http_get(addr, &format!("/api/v1/query?query={}", urlencode(query)))?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    let result = v["data"]["result"].as_array().ok_or_else(|| format!("no result: {body}"))?;
    Ok(result
        .iter()
        .filter_map(|r| {
            let labels = r["metric"].as_object()?.clone();
            let value = r["value"][1].as_str()?.parse().ok()?;
            Some((labels, value))
        })
        .collect())
}

/// The hosts (`instance` values) a query's series come from.
fn hosts_of(series: &[Series]) -> std::collections::BTreeSet<String> {
    series.iter().filter_map(|(l, _)| l.get("instance")?.as_str().map(str::to_string)).collect()
}

/// The dashboard's queries as Prometheus runs them: Grafana's variables replaced.
fn dashboard_queries() -> Vec<String> {
    let out = Command::new(backend_bin("dashboard"))
        .arg("check")
        .arg(repo_root().join("deploy/grafana/vramhook.json"))
        .output()
        .expect("dashboard check");
    assert!(out.status.success(), "dashboard check: {}", String::from_utf8_lossy(&out.stderr));
    let queries: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|q| q.replace("$instance", ".*").replace("$__rate_interval", "1m"))
        .collect();
    assert!(queries.len() >= 8, "the dashboard's queries: {queries:?}");
    queries
}

/// Two agents standing in for two hosts (`host.name` gpu-a and gpu-b through
/// `OTEL_RESOURCE_ATTRIBUTES`) export through ONE collector (Jaeger v2 running
/// deploy/otel-collector.yaml as it is) into a real Prometheus 3 (OTLP receiver, started
/// with deploy/prometheus/prometheus.yml and the alert rules) and a real Jaeger. PromQL
/// tells the hosts apart; every query of the Grafana dashboard returns series from both
/// hosts (a query of a series that does not exist fails the test); the OOM span in Jaeger
/// names its host. With VRAMHOOK_FLEET_DATA=DIR, the dashboard's queries over the run are
/// written there as Prometheus range-query JSON (scripts/dev/plot_dashboard.py draws them).
#[test]
fn two_hosts_through_one_collector_into_prometheus_and_jaeger_and_every_dashboard_query_has_data() {
    let started = std::time::SystemTime::now();
    let queries = dashboard_queries();
    let prom_port = free_port();
    let prom_dir = tempfile::tempdir().expect("prometheus dir");
    for f in ["prometheus.yml", "alerts.yml"] {
        std::fs::copy(repo_root().join("deploy/prometheus").join(f), prom_dir.path().join(f)).expect("copy");
    }
    let mut prom = Command::new(backend_bin("prometheus"));
    prom.arg(format!("--config.file={}", prom_dir.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", prom_dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .arg("--web.enable-otlp-receiver");
    let prom = spawn_logged(prom, &prom_dir.path().join("prometheus.log"));
    let _prom = Backend(prom, prom_dir);
    wait_http(prom_port, "/-/ready", "prometheus");
    let jp: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let jaeger = start_jaeger(jp[0], jp[1], jp[2], jp[3]);

    // The collector: the deployment's configuration file, unchanged; endpoints from its
    // environment variables.
    let (grpc, http, telemetry) = (free_port(), free_port(), free_port());
    let col_dir = tempfile::tempdir().expect("collector dir");
    let mut collector = Command::new(backend_bin("jaeger"));
    collector
        .arg(format!("--config={}", repo_root().join("deploy/otel-collector.yaml").display()))
        .env("VRAMHOOK_COLLECTOR_GRPC", format!("127.0.0.1:{grpc}"))
        .env("VRAMHOOK_COLLECTOR_HTTP", format!("127.0.0.1:{http}"))
        .env("VRAMHOOK_COLLECTOR_TELEMETRY_HOST", "127.0.0.1")
        .env("VRAMHOOK_COLLECTOR_TELEMETRY_PORT", telemetry.to_string())
        .env("PROMETHEUS_OTLP_ENDPOINT", format!("http://127.0.0.1:{prom_port}/api/v1/otlp/v1/metrics"))
        .env("JAEGER_OTLP_ENDPOINT", format!("127.0.0.1:{}", jp[0]));
    let collector = spawn_logged(collector, &col_dir.path().join("collector.log"));
    let collector = Backend(collector, col_dir);
    wait_http(telemetry, "/metrics", "the collector");

    let endpoint = format!("http://127.0.0.1:{grpc}");
    let hosts = ["gpu-a", "gpu-b"];
    let rings: Vec<_> = hosts.iter().map(|h| ring_dir(&format!("fleet-{h}"))).collect();
    let agents: Vec<Agent> = hosts
        .iter()
        .zip(&rings)
        .map(|(h, r)| {
            let attrs = format!("host.name={h}");
            Agent::start(
                &vramhook_bin(),
                &["--ring-dir", r.path().to_str().expect("utf-8")],
                &otlp_grpc_env(
                    &endpoint,
                    &[("OTEL_RESOURCE_ATTRIBUTES", attrs.as_str()), ("OTEL_METRIC_EXPORT_INTERVAL", "500")],
                ),
            )
        })
        .collect();

    // Host a: two leaks one after the other, a VMM pool, and an OOM; host b: one leak.
    let mut held = Vec::new();
    let leak_a = spawn_traced(&workload("leak"), &["--n", "4", "--hold", "120"], rings[0].path(), &[]);
    let leak_b = spawn_traced(&workload("leak"), &["--n", "8", "--hold", "120"], rings[1].path(), &[]);
    let (pid_a, pid_b) = (leak_a.id(), leak_b.id());
    held.push(leak_a);
    held.push(leak_b);
    // Settled means the leak's last allocation is in: a snapshot taken half-way through its
    // allocations would not be what Prometheus ends up with.
    let settle = |agent: &Agent, pid: u32, n: u64| {
        agent.wait_state(Duration::from_secs(30), "the leak", |s| {
            process(s, pid).is_some_and(|p| p["live_bytes"] == leak_live_bytes(n))
        })
    };
    let live_a = process(&settle(&agents[0], pid_a, 4), pid_a).expect("a")["live_bytes"].as_f64();
    let live_b = process(&settle(&agents[1], pid_b, 8), pid_b).expect("b")["live_bytes"].as_f64();
    std::thread::sleep(Duration::from_secs(3));
    held.push(spawn_traced(&workload("leak"), &["--n", "12", "--hold", "120"], rings[0].path(), &[]));
    let mut vmm = spawn_traced(&workload("ggml_vmm"), &[], rings[0].path(), &[]);
    let _ = vmm.wait();
    std::thread::sleep(Duration::from_secs(3));
    let mut oom = spawn_traced(&workload("torch_caching"), &[], rings[0].path(), &[("SIM_OOM_GIB", "200")]);
    // A fragmented PyTorch-style cache on each host, held while the agents export it: the
    // lens's numbers (the dashboard's framework-cache panels) from both hosts.
    let caches: Vec<_> = rings
        .iter()
        .map(|r| spawn_traced(&workload("torch_fragmented"), &[], r.path(), &[("SIM_HOLD_S", "120")]))
        .collect();
    held.extend(caches);
    let oom_pid = oom.id();
    let _ = oom.wait();
    agents[0].wait_state(Duration::from_secs(30), "the OOM incident", |s| {
        s["agent"]["ooms"].as_array().is_some_and(|v| !v.is_empty())
    });

    // PromQL tells the two hosts apart: the same pid-free query gives one series per host,
    // each with the host's own numbers; host.name is promoted to a label.
    let deadline = Instant::now() + Duration::from_secs(90);
    let wait_for = |what: &str, query: &str, ok: &dyn Fn(&[Series]) -> bool| loop {
        let got = promql_series(prom_port, query);
        if got.as_ref().is_ok_and(|g| ok(g)) {
            return got.unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: PromQL {query} = {got:?}; agents {} / {}",
            agents[0].state()["agent"],
            agents[1].state()["agent"]
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let both = |g: &[Series]| hosts_of(g).len() == 2;
    let devices = wait_for("device series from both hosts", "vramhook_device_memory_total_bytes", &both);
    for (labels, _) in &devices {
        assert_eq!(labels.get("host_name"), labels.get("instance"), "host.name promoted: {labels:?}");
        assert_eq!(labels.get("job").and_then(Value::as_str), Some("vramhook-agent"), "{labels:?}");
    }
    for (host, pid, live) in [("gpu-a", pid_a, live_a), ("gpu-b", pid_b, live_b)] {
        let q = format!("vramhook_process_memory_live_bytes{{instance=\"{host}\",process_pid=\"{pid}\",device=\"0\"}}");
        let got = wait_for("a process's live bytes on its host", &q, &|g| g.len() == 1 && Some(g[0].1) == live);
        assert_eq!(got[0].0.get("process_executable_name").and_then(Value::as_str), Some("leak"), "{got:?}");
    }
    let ooms = wait_for("the OOM counted on host a only", "sum by (instance) (vramhook_host_ooms_total)", &|g| {
        g.len() == 2
            && g.iter().all(|(l, v)| {
                let want = if l.get("instance").and_then(Value::as_str) == Some("gpu-a") { 1.0 } else { 0.0 };
                *v == want
            })
    });
    eprintln!("OOMs per host: {ooms:?}");

    // Every query of the dashboard returns series, from both hosts.
    for q in &queries {
        wait_for(&format!("dashboard query {q}"), q, &both);
    }
    // The check can fail: a query of a series that does not exist returns nothing.
    let missing = promql_series(prom_port, "vramhook_process_memory_live_bytes_typo").expect("query");
    assert!(missing.is_empty(), "a missing series must have no data: {missing:?}");
    let rules = {
        let addr = format!("127.0.0.1:{prom_port}").parse().expect("addr");
        http_get(addr, "/api/v1/rules").expect("rules")
    };
    assert!(rules.contains("VramhookHeadroomExhaustedSoon"), "Prometheus loaded the alert rules: {rules}");

    // The OOM span reached Jaeger through the collector, from host a's resource.
    let addr = format!("127.0.0.1:{}", jp[2]).parse().expect("addr");
    let query = format!("/api/traces?service=vramhook-agent&operation={}&limit=50", urlencode("vramhook.oom"));
    let span_host = loop {
        let found = http_get(addr, &query).ok().and_then(|body| {
            let v: Value = serde_json::from_str(&body).ok()?;
            v["data"].as_array()?.iter().find_map(|t| {
                let span = t["spans"]
                    .as_array()?
                    .iter()
                    .find(|s| tag(s, "process.pid").and_then(Value::as_u64) == Some(u64::from(oom_pid)))?;
                let process = &t["processes"][span["processID"].as_str()?];
                let host = process["tags"].as_array()?.iter().find(|t| t["key"] == "host.name")?;
                host["value"].as_str().map(str::to_string)
            })
        });
        if let Some(h) = found {
            break h;
        }
        let log = std::fs::read_to_string(collector.1.path().join("collector.log")).unwrap_or_default();
        assert!(Instant::now() < deadline, "no OOM span in Jaeger; collector log:\n{log}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(span_host, "gpu-a");
    let _ = &jaeger;

    if let Some(dir) = std::env::var_os("VRAMHOOK_FLEET_DATA") {
        // For the picture only: a minute more of traffic (more processes arriving on both
        // hosts, an OOM on b) before the range queries are taken.
        for round in 0..6u32 {
            std::thread::sleep(Duration::from_secs(8));
            let n = (4 + 4 * round).to_string();
            let rings = rings[(round % 2) as usize].path();
            held.push(spawn_traced(&workload("leak"), &["--n", n.as_str(), "--hold", "120"], rings, &[]));
            if round == 3 {
                let mut oom = spawn_traced(&workload("torch_caching"), &[], rings, &[("SIM_OOM_GIB", "100")]);
                let _ = oom.wait();
            }
        }
        std::thread::sleep(Duration::from_secs(8));
        dump_ranges(prom_port, &queries, started, std::path::Path::new(&dir));
    }
    for mut p in held {
        let _ = p.kill();
        let _ = p.wait();
    }
}

/// What the `leak` workload leaves live with `--n N`: its odd-numbered buffers, buffer i
/// being (i % 5 + 1) MiB + i * 1000 bytes (tests/simcuda/workloads/leak.c).
fn leak_live_bytes(n: u64) -> u64 {
    (1..n).step_by(2).map(|i| (i % 5 + 1) * 1024 * 1024 + i * 1000).sum()
}

/// Writes each query's range result over the run to DIR/queries.json, for the picture.
fn dump_ranges(port: u16, queries: &[String], since: std::time::SystemTime, dir: &std::path::Path) {
    let unix =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let (start, end) = (unix(since), unix(std::time::SystemTime::now()));
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut out = Vec::new();
    for q in queries {
        let path = format!("/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1", urlencode(q));
        let body = http_get(addr, &path).expect("range query");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        out.push(serde_json::json!({"query": q, "result": v["data"]["result"]}));
    }
    std::fs::create_dir_all(dir).expect("data dir");
    std::fs::write(dir.join("queries.json"), serde_json::to_string_pretty(&out).expect("json")).expect("write");
}

/// Starts `cmd` with its stdout and stderr in the file `log`.
fn spawn_logged(mut cmd: Command, log: &std::path::Path) -> std::process::Child {
    let file = std::fs::File::create(log).expect("log file");
    cmd.stdout(file.try_clone().expect("log file")).stderr(file);
    cmd.spawn().unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()))
}
