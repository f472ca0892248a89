//! The OTLP sink: metrics as observable gauges and counters read from the published
//! snapshot, each OOM incident as a span and a log record, each crossing of 1 by a
//! process's fit (`crate::fit_crossings`) as a log record. gRPC (tonic) or HTTP/protobuf
//! as `OTEL_EXPORTER_OTLP_PROTOCOL` says; every standard `OTEL_*` variable is honoured by
//! the exporters and the SDK (endpoint, headers, timeout, interval, resource attributes,
//! service name; `OTEL_{METRICS,TRACES,LOGS}_EXPORTER=none` turns a signal off).
//!
//! Every export runs on the agent's tokio runtime behind the SDK's bounded batch queues;
//! the ingest loop never waits for it. A failing endpoint is retried with exponential
//! backoff (metrics: exports are skipped while backing off; incident spans: the batch is
//! retried for up to ~15 s), and failures are counted in the agent's self-metrics.

use crate::fit_crossings::FitCrossing;
use crate::metrics::{self, Kind, MetricDef};
use crate::stats::{add, AgentStats};
use opentelemetry::logs::{AnyValue, LogRecord, Logger, LoggerProvider, Severity};
use opentelemetry::metrics::MeterProvider;
use opentelemetry::trace::{Span, Tracer, TracerProvider};
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::logs::{LogBatch, LogExporter, SdkLoggerProvider};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{SdkMeterProvider, Temporality};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};
use vramhook_model::{fmt_bytes, ModelSnapshot, OomIncident};

/// What the ingest loop hands the exporter, in the order it saw them.
#[derive(Clone, Debug)]
pub enum Notice {
    /// An OOM incident: a span and a log record.
    Oom(Box<OomIncident>),
    /// A fit crossed 1: a log record only. (A crossing is a moment of no duration that no
    /// request's trace contains; a span would say nothing the record does not.)
    Fit(FitCrossing),
}

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("cannot build the OTLP {signal} exporter: {message}")]
    Build { signal: &'static str, message: String },
}

/// Exponential backoff shared by an exporter's calls: 1 s, 2 s, 4 s … 30 s.
#[derive(Debug, Default)]
struct Backoff {
    failures: AtomicU64,
    until: Mutex<Option<Instant>>,
}

impl Backoff {
    fn waiting(&self) -> bool {
        self.until.lock().map(|u| u.is_some_and(|t| Instant::now() < t)).unwrap_or(false)
    }
    fn failed(&self) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed).min(5);
        let delay = Duration::from_secs(1 << n).min(Duration::from_secs(30));
        if let Ok(mut u) = self.until.lock() {
            *u = Some(Instant::now() + delay);
        }
    }
    fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if let Ok(mut u) = self.until.lock() {
            *u = None;
        }
    }
}

/// Where each signal is exported, as the exporters resolve it from the `OTEL_*` variables
/// (`http/protobuf` unless a protocol variable says `grpc`).
pub fn endpoint(signal: &str) -> (String, String) {
    let var = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let upper = signal.to_ascii_uppercase();
    let protocol = var(&format!("OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"))
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".into())
        .to_ascii_lowercase();
    let grpc = protocol == "grpc";
    let url = if let Some(url) = var(&format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")) {
        url
    } else {
        let base = var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .unwrap_or_else(|| if grpc { "http://localhost:4317" } else { "http://localhost:4318" }.to_string());
        if grpc {
            base
        } else {
            format!("{}/v1/{signal}", base.trim_end_matches('/'))
        }
    };
    (protocol, url)
}

/// What went wrong, in a few words that stay the same from one failure to the next.
fn failure_kind(e: &OTelSdkError) -> String {
    let msg = e.to_string();
    if let Some(at) = msg.find("status code: ") {
        let code: String = msg[at + 13..].chars().take_while(char::is_ascii_digit).collect();
        return match code.as_str() {
            "404" => "HTTP 404 (the endpoint does not take this signal at this path)".into(),
            _ => format!("HTTP {code}"),
        };
    }
    if msg.contains("network error") {
        return "network error (cannot connect or the connection failed)".into();
    }
    if matches!(e, OTelSdkError::Timeout(_)) {
        return "timeout".into();
    }
    msg.chars().take(120).collect()
}

/// Export failures, said on stderr: the first of each kind (signal × error) at once, then
/// how many more at most once a minute, and at shutdown.
#[derive(Debug)]
pub struct FailureLog {
    state: Mutex<FailureState>,
}

#[derive(Debug, Default)]
struct FailureState {
    seen: std::collections::BTreeSet<(&'static str, String)>,
    /// Failures not yet said, per signal, and since when.
    unsaid: std::collections::BTreeMap<&'static str, u64>,
    since: Option<SystemTime>,
}

/// `HH:MM:SS UTC` of a wall-clock time.
fn utc_hms(t: SystemTime) -> String {
    let s = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

impl FailureLog {
    pub fn new() -> FailureLog {
        FailureLog { state: Mutex::new(FailureState::default()) }
    }

    /// Notes a failed export of `signal` ("metrics", "traces", "logs").
    pub fn failed(&self, signal: &'static str, e: &OTelSdkError) {
        let kind = failure_kind(e);
        let Ok(mut st) = self.state.lock() else { return };
        if st.seen.insert((signal, kind.clone())) {
            let (protocol, url) = endpoint(signal);
            eprintln!(
                "vramhook agent: OTLP {signal} export to {url} ({protocol}) failed: {kind} [{e}]; further failures are counted and summarised once a minute"
            );
        } else {
            *st.unsaid.entry(signal).or_default() += 1;
            st.since.get_or_insert_with(SystemTime::now);
        }
    }

    /// The failures not yet said, as one line (and forgets them); `None` when there are none.
    pub fn summary(&self) -> Option<String> {
        let mut st = self.state.lock().ok()?;
        let total: u64 = st.unsaid.values().sum();
        if total == 0 {
            return None;
        }
        let parts: Vec<String> = st.unsaid.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let since = st.since.take().map(utc_hms).unwrap_or_default();
        st.unsaid.clear();
        Some(format!("vramhook agent: {total} more failed OTLP exports since {since} ({})", parts.join(", ")))
    }

    fn say_summary(&self) {
        if let Some(line) = self.summary() {
            eprintln!("{line}");
        }
    }
}

impl Default for FailureLog {
    fn default() -> FailureLog {
        FailureLog::new()
    }
}

struct CountingMetrics<E> {
    inner: E,
    stats: Arc<AgentStats>,
    backoff: Backoff,
    failures: Arc<FailureLog>,
}

impl<E: PushMetricExporter> PushMetricExporter for CountingMetrics<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        if self.backoff.waiting() {
            add(&self.stats.otlp_skipped_backoff, 1);
            return Err(OTelSdkError::InternalFailure("backing off after export failures".into()));
        }
        let r = self.inner.export(metrics).await;
        match &r {
            Ok(()) => {
                add(&self.stats.otlp_metric_exports, 1);
                self.backoff.succeeded();
            }
            Err(e) => {
                add(&self.stats.otlp_metric_errors, 1);
                self.failures.failed("metrics", e);
                self.backoff.failed();
            }
        }
        r
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

#[derive(Debug)]
struct RetryingSpans<E> {
    inner: E,
    stats: Arc<AgentStats>,
    failures: Arc<FailureLog>,
    /// Set at shutdown: the last flush tries once, it does not hold the exit for retries.
    stopping: Arc<AtomicBool>,
}

impl<E: SpanExporter> SpanExporter for RetryingSpans<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut delay = Duration::from_secs(1);
        loop {
            match self.inner.export(batch.clone()).await {
                Ok(()) => {
                    add(&self.stats.otlp_span_exports, 1);
                    return Ok(());
                }
                Err(e) => {
                    add(&self.stats.otlp_span_errors, 1);
                    self.failures.failed("traces", &e);
                    if delay > Duration::from_secs(8) || self.stopping.load(Ordering::Relaxed) {
                        return Err(e);
                    }
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

#[derive(Debug)]
struct CountingLogs<E> {
    inner: E,
    stats: Arc<AgentStats>,
    failures: Arc<FailureLog>,
}

impl<E: LogExporter> LogExporter for CountingLogs<E> {
    async fn export(&self, batch: LogBatch<'_>) -> OTelSdkResult {
        let r = self.inner.export(batch).await;
        match &r {
            Ok(()) => add(&self.stats.otlp_log_exports, 1),
            Err(e) => {
                add(&self.stats.otlp_log_errors, 1);
                self.failures.failed("logs", e);
            }
        }
        r
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

fn signal_on(var: &str) -> bool {
    !std::env::var(var).is_ok_and(|v| v.trim().eq_ignore_ascii_case("none"))
}

/// Whether the environment asks for OTLP (an endpoint is set and the SDK not disabled).
pub fn configured_by_env() -> bool {
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled
        && [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

/// The running OTLP pipeline; `shutdown` flushes it.
pub struct Otlp {
    meters: Option<SdkMeterProvider>,
    tracer: Option<SdkTracerProvider>,
    logger: Option<SdkLoggerProvider>,
    failures: Arc<FailureLog>,
    stopping: Arc<AtomicBool>,
}

/// The agent's resource. Defaults (`service.name` vramhook-agent, `host.name` this host's
/// name) are overridden by `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`, as the
/// OpenTelemetry specification says; `service.instance.id`, which Prometheus turns into
/// `instance`, is the host name unless set, so that every series says which host it is
/// from (two hosts' series no longer collide).
fn resource(ring_dir: &str) -> Resource {
    use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector, TelemetryResourceDetector};
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
    let cmdline: Vec<String> = std::env::args().collect();
    let detectors: [Box<dyn ResourceDetector>; 1] = [Box::new(EnvResourceDetector::new())];
    let mut builder = Resource::builder_empty()
        .with_detectors(&[Box::new(TelemetryResourceDetector) as Box<dyn ResourceDetector>])
        .with_attributes([
            KeyValue::new("service.name", "vramhook-agent"),
            KeyValue::new("host.name", vramhook_protocol::host::hostname()),
            KeyValue::new("process.pid", i64::from(std::process::id())),
            KeyValue::new("process.executable.path", exe),
            KeyValue::new("process.command_line", cmdline.join(" ")),
            KeyValue::new("vramhook.ring_dir", ring_dir.to_string()),
        ])
        .with_detectors(&detectors);
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME").ok().filter(|n| !n.trim().is_empty()) {
        builder = builder.with_service_name(name);
    }
    let res = builder.build();
    if res.get(&opentelemetry::Key::from_static_str("service.instance.id")).is_some() {
        return res;
    }
    let host = res
        .get(&opentelemetry::Key::from_static_str("host.name"))
        .map(|v| v.to_string())
        .unwrap_or_else(vramhook_protocol::host::hostname);
    let attrs: Vec<KeyValue> = res.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())).collect();
    Resource::builder_empty().with_attributes(attrs).with_attribute(KeyValue::new("service.instance.id", host)).build()
}

fn build_err(signal: &'static str) -> impl Fn(opentelemetry_otlp::ExporterBuildError) -> OtlpError {
    move |e| OtlpError::Build { signal, message: e.to_string() }
}

/// How often failures after the first of their kind are summarised.
const FAILURE_SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Builds the exporters and registers the instruments. Must run inside the tokio runtime.
pub fn start(
    stats: Arc<AgentStats>,
    snapshots: watch::Receiver<Arc<ModelSnapshot>>,
    incidents: mpsc::Receiver<Notice>,
    ring_dir: &str,
) -> Result<Otlp, OtlpError> {
    use opentelemetry_sdk::runtime::Tokio;
    let res = resource(ring_dir);
    let failures = Arc::new(FailureLog::new());
    let stopping = Arc::new(AtomicBool::new(false));
    let mut otlp =
        Otlp { meters: None, tracer: None, logger: None, failures: failures.clone(), stopping: stopping.clone() };
    for (signal, var) in
        [("metrics", "OTEL_METRICS_EXPORTER"), ("traces", "OTEL_TRACES_EXPORTER"), ("logs", "OTEL_LOGS_EXPORTER")]
    {
        if signal_on(var) {
            let (protocol, url) = endpoint(signal);
            eprintln!("vramhook agent: OTLP {signal} to {url} ({protocol})");
        } else {
            eprintln!("vramhook agent: OTLP {signal} off ({var}=none)");
        }
    }

    if signal_on("OTEL_METRICS_EXPORTER") {
        let exporter = opentelemetry_otlp::MetricExporter::builder().build().map_err(build_err("metrics"))?;
        let exporter = CountingMetrics {
            inner: exporter,
            stats: stats.clone(),
            backoff: Backoff::default(),
            failures: failures.clone(),
        };
        let mut reader =
            opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(exporter, Tokio);
        if std::env::var_os("OTEL_METRIC_EXPORT_INTERVAL").is_none() {
            reader = reader.with_interval(Duration::from_secs(10));
        }
        let provider = SdkMeterProvider::builder().with_reader(reader.build()).with_resource(res.clone()).build();
        let meter = provider.meter("vramhook");
        for def in metrics::ALL {
            register(&meter, def, snapshots.clone(), stats.clone());
        }
        otlp.meters = Some(provider);
    }

    let tracer = if signal_on("OTEL_TRACES_EXPORTER") {
        let exporter = opentelemetry_otlp::SpanExporter::builder().build().map_err(build_err("traces"))?;
        let exporter = RetryingSpans { inner: exporter, stats: stats.clone(), failures: failures.clone(), stopping };
        let processor =
            opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(exporter, Tokio)
                .build();
        let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(res.clone()).build();
        let tracer = provider.tracer("vramhook");
        otlp.tracer = Some(provider);
        Some(tracer)
    } else {
        None
    };
    let logger = if signal_on("OTEL_LOGS_EXPORTER") {
        let exporter = opentelemetry_otlp::LogExporter::builder().build().map_err(build_err("logs"))?;
        let exporter = CountingLogs { inner: exporter, stats: stats.clone(), failures: failures.clone() };
        let processor =
            opentelemetry_sdk::logs::log_processor_with_async_runtime::BatchLogProcessor::builder(exporter, Tokio)
                .build();
        let provider = SdkLoggerProvider::builder().with_log_processor(processor).with_resource(res).build();
        let logger = provider.logger("vramhook");
        otlp.logger = Some(provider);
        Some(logger)
    } else {
        None
    };
    tokio::spawn(incident_task(incidents, tracer, logger, stats));
    tokio::spawn(async move {
        let mut every = tokio::time::interval(FAILURE_SUMMARY_EVERY);
        every.tick().await; // the first tick is immediate
        loop {
            every.tick().await;
            failures.say_summary();
        }
    });
    Ok(otlp)
}

fn register(
    meter: &opentelemetry::metrics::Meter,
    def: &'static MetricDef,
    rx: watch::Receiver<Arc<ModelSnapshot>>,
    stats: Arc<AgentStats>,
) {
    let observe = move || {
        let snap = rx.borrow().clone();
        metrics::points(def, &snap, &stats.view())
            .into_iter()
            .map(|(labels, v)| (labels.into_iter().map(|(k, v)| KeyValue::new(k, v)).collect::<Vec<_>>(), v))
            .collect::<Vec<_>>()
    };
    // The same callback for every instrument; only the instrument and the value type differ.
    macro_rules! register_with {
        ($builder:expr, $value:expr) => {
            $builder
                .with_unit(def.unit)
                .with_description(def.help)
                .with_callback(move |o| {
                    for (attrs, v) in observe() {
                        o.observe($value(v), &attrs);
                    }
                })
                .build()
        };
    }
    match (def.kind, def.unit) {
        (Kind::Gauge, "1") => {
            register_with!(meter.f64_observable_gauge(def.otel), |v: f64| v);
        }
        (Kind::Gauge, _) => {
            register_with!(meter.u64_observable_gauge(def.otel), |v: f64| v as u64);
        }
        (Kind::Counter, _) => {
            register_with!(meter.u64_observable_counter(def.otel), |v: f64| v as u64);
        }
        (Kind::UpDownCounter, _) => {
            register_with!(meter.i64_observable_up_down_counter(def.otel), |v: f64| v as i64);
        }
    }
}

/// Wall-clock time of a monotonic timestamp.
fn wall_time(mono_ns: u64) -> SystemTime {
    let now_mono = vramhook_protocol::clock::monotonic_ns();
    let now = SystemTime::now();
    if mono_ns == 0 || mono_ns > now_mono {
        return now;
    }
    now.checked_sub(Duration::from_nanos(now_mono - mono_ns)).unwrap_or(now)
}

/// The attributes of an incident, for both its span and its log record.
pub fn incident_attributes(i: &OomIncident) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new("vramhook.incident.id", i.id as i64),
        KeyValue::new("process.pid", i64::from(i.pid)),
        KeyValue::new("process.executable.name", metrics::executable_name(&i.command, "")),
        KeyValue::new("process.command_line", i.command.clone()),
        KeyValue::new("device", i64::from(i.device)),
        KeyValue::new("vramhook.oom.verdict", i.verdict.name()),
        KeyValue::new("vramhook.oom.explanation", i.explanation.clone()),
        KeyValue::new("vramhook.oom.api", i.api.name()),
        KeyValue::new("vramhook.oom.caller", i.caller.clone()),
        KeyValue::new("vramhook.oom.requested_bytes", i.requested_bytes as i64),
        KeyValue::new("vramhook.oom.failures", i.failures as i64),
        KeyValue::new("vramhook.oom.retries", i.retries as i64),
        KeyValue::new("vramhook.oom.freed_bytes_between", i.freed_bytes_between as i64),
        KeyValue::new("vramhook.oom.outcome", i.outcome.name()),
        KeyValue::new("vramhook.oom.own_idle_bytes", i.own_idle_bytes as i64),
        KeyValue::new("vramhook.oom.other_idle_bytes", i.other_idle_bytes as i64),
        KeyValue::new("vramhook.oom.arena_free_bytes", i.arena_free_bytes as i64),
        KeyValue::new("vramhook.oom.arena_largest_free_span", i.arena_largest_free_span as i64),
    ];
    if !i.holders.is_empty() {
        let o = vramhook_model::VerdictInputs { holders: i.holders.clone(), ..Default::default() }.others();
        a.push(KeyValue::new("vramhook.oom.others_releasable_bytes", o.releasable as i64));
        a.push(KeyValue::new("vramhook.oom.others_stranded_bytes", o.stranded as i64));
        a.push(KeyValue::new("vramhook.oom.others_not_visible_bytes", o.not_visible as i64));
        a.push(KeyValue::new("vramhook.oom.others_live_bytes", o.live as i64));
        a.push(KeyValue::new("vramhook.oom.others_untraced_bytes", o.untraced.saturating_add(o.unnamed) as i64));
        // The top holders, one string each: "pid command sight held releasable stranded live".
        let holders: Vec<opentelemetry::StringValue> = i
            .holders
            .iter()
            .take(8)
            .map(|h| {
                format!(
                    "{} {} {} held={} releasable={} stranded={} not_visible={} live={}",
                    h.pid,
                    if h.command.is_empty() { "-" } else { &h.command },
                    h.sight.name(),
                    h.held_bytes,
                    h.releasable_bytes,
                    h.stranded_bytes,
                    h.not_visible_bytes,
                    h.live_bytes
                )
                .into()
            })
            .collect();
        a.push(KeyValue::new("vramhook.oom.holders", opentelemetry::Value::Array(holders.into())));
    }
    if let Some(v) = i.device_free_bytes {
        a.push(KeyValue::new("vramhook.oom.device_free_bytes", v as i64));
    }
    if let Some(v) = i.device_total_bytes {
        a.push(KeyValue::new("vramhook.oom.device_total_bytes", v as i64));
    }
    if let Some(r) = &i.unknown_reason {
        a.push(KeyValue::new("vramhook.oom.unknown_reason", r.clone()));
    }
    a
}

/// The attributes of a fit's crossing of 1, for its log record.
pub fn fit_attributes(c: &FitCrossing) -> Vec<KeyValue> {
    let f = &c.fit;
    let mut a = vec![
        KeyValue::new("process.pid", i64::from(c.pid)),
        KeyValue::new("process.executable.name", metrics::executable_name(&c.command, &c.exe)),
        KeyValue::new("process.command_line", c.command.clone()),
        KeyValue::new("device", i64::from(c.device)),
        KeyValue::new("vramhook.fit.direction", c.direction()),
        KeyValue::new("vramhook.fit.ratio", f.fit_ratio),
        KeyValue::new("vramhook.fit.demand_bytes", f.demand_bytes as i64),
        KeyValue::new("vramhook.fit.demand_source", f.demand_source.name()),
        KeyValue::new("vramhook.fit.supply_bytes", f.supply_bytes as i64),
        KeyValue::new("vramhook.fit.supply_rule", f.supply_rule.name()),
    ];
    // Below 1: the verdict such a failure would likely get (as analyze's fit line says it).
    if let Some(l) = f.limited_by {
        a.push(KeyValue::new("vramhook.fit.limited_by", l.name()));
    }
    a
}

/// The record's body: one sentence, as `vramhook analyze` would say it.
fn fit_body(c: &FitCrossing) -> String {
    let f = &c.fit;
    let who = format!("pid {} ({}) GPU {}", c.pid, metrics::executable_name(&c.command, &c.exe), c.device);
    if c.below {
        format!(
            "{who}: its next large request would not fit: {} asked for within the fit window, {} to be had now{} (fit {:.2})",
            fmt_bytes(f.demand_bytes),
            fmt_bytes(f.supply_bytes),
            f.limited_by.map_or(String::new(), |l| format!(", limited by {}", l.name())),
            f.fit_ratio
        )
    } else {
        format!(
            "{who}: its next large request fits again: {} asked for, {} to be had now (fit {:.2})",
            fmt_bytes(f.demand_bytes),
            fmt_bytes(f.supply_bytes),
            f.fit_ratio
        )
    }
}

/// One log record of `name` with `attrs` (typed where OTLP has the type).
fn emit(
    logger: &opentelemetry_sdk::logs::SdkLogger,
    name: &'static str,
    at: SystemTime,
    severity: Severity,
    body: String,
    attrs: Vec<KeyValue>,
) {
    let mut rec = logger.create_log_record();
    rec.set_event_name(name);
    rec.set_timestamp(at);
    rec.set_severity_number(severity);
    rec.set_severity_text(severity.name());
    rec.set_body(AnyValue::from(body));
    for kv in attrs {
        let v = match kv.value {
            opentelemetry::Value::I64(i) => AnyValue::Int(i),
            opentelemetry::Value::F64(f) => AnyValue::Double(f),
            opentelemetry::Value::Bool(b) => AnyValue::Boolean(b),
            other => AnyValue::from(other.to_string()),
        };
        rec.add_attribute(kv.key, v);
    }
    logger.emit(rec);
}

async fn incident_task(
    mut rx: mpsc::Receiver<Notice>,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    logger: Option<opentelemetry_sdk::logs::SdkLogger>,
    stats: Arc<AgentStats>,
) {
    while let Some(notice) = rx.recv().await {
        let incident = match notice {
            Notice::Oom(i) => i,
            Notice::Fit(c) => {
                if let Some(logger) = &logger {
                    // Below 1 is a warning (the alert rule's severity); back above, news.
                    let severity = if c.below { Severity::Warn } else { Severity::Info };
                    emit(logger, "vramhook.fit", wall_time(c.ts_ns), severity, fit_body(&c), fit_attributes(&c));
                    add(&stats.fit_crossings_exported, 1);
                }
                continue;
            }
        };
        let at = wall_time(incident.ts_ns);
        let attrs = incident_attributes(&incident);
        if let Some(tracer) = &tracer {
            let mut span = tracer
                .span_builder("vramhook.oom")
                .with_kind(opentelemetry::trace::SpanKind::Internal)
                .with_start_time(at)
                .with_attributes(attrs.clone())
                .start(tracer);
            span.set_status(opentelemetry::trace::Status::error(incident.explanation.clone()));
            span.end_with_timestamp(at + Duration::from_micros(1));
        }
        if let Some(logger) = &logger {
            emit(logger, "vramhook.oom", at, Severity::Error, incident.explanation.clone(), attrs);
        }
        add(&stats.incidents_exported, 1);
    }
}

impl Otlp {
    /// Flushes and stops every provider (blocking: call from a blocking context), then says
    /// the failures not yet said.
    pub fn shutdown(self) {
        self.stopping.store(true, Ordering::Relaxed);
        if let Some(p) = self.meters {
            let _ = p.shutdown();
        }
        if let Some(p) = self.tracer {
            let _ = p.shutdown();
        }
        if let Some(p) = self.logger {
            let _ = p.shutdown();
        }
        self.failures.say_summary();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_said_once_per_kind_then_counted() {
        let log = FailureLog::new();
        let not_found = OTelSdkError::InternalFailure("HTTP export failed with status code: 404".into());
        let refused = OTelSdkError::InternalFailure("HTTP export failed: network error".into());
        assert_eq!(failure_kind(&refused), "network error (cannot connect or the connection failed)");
        assert!(failure_kind(&not_found).starts_with("HTTP 404"));
        log.failed("logs", &not_found); // said at once
        assert_eq!(log.summary(), None, "the first of a kind is not in the summary");
        log.failed("logs", &not_found);
        log.failed("logs", &not_found);
        log.failed("traces", &refused); // a new kind: said at once
        log.failed("traces", &refused);
        let line = log.summary().expect("a summary");
        assert!(line.contains("3 more failed OTLP exports since ") && line.contains("(logs 2, traces 1)"), "{line}");
        assert_eq!(log.summary(), None, "said once");
    }
}
