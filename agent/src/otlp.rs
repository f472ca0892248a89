//! The OTLP sink: metrics as observable gauges and counters read from the published
//! snapshot, each OOM incident as a span and a log record. gRPC (tonic) or HTTP/protobuf
//! as `OTEL_EXPORTER_OTLP_PROTOCOL` says; every standard `OTEL_*` variable is honoured by
//! the exporters and the SDK (endpoint, headers, timeout, interval, resource attributes,
//! service name; `OTEL_{METRICS,TRACES,LOGS}_EXPORTER=none` turns a signal off).
//!
//! Every export runs on the agent's tokio runtime behind the SDK's bounded batch queues;
//! the ingest loop never waits for it. A failing endpoint is retried with exponential
//! backoff (metrics: exports are skipped while backing off; incident spans: the batch is
//! retried for up to ~15 s), and failures are counted in the agent's self-metrics.

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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};
use vramhook_model::{ModelSnapshot, OomIncident};

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

struct CountingMetrics<E> {
    inner: E,
    stats: Arc<AgentStats>,
    backoff: Backoff,
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
            Err(_) => {
                add(&self.stats.otlp_metric_errors, 1);
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
                    if delay > Duration::from_secs(8) {
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
}

impl<E: LogExporter> LogExporter for CountingLogs<E> {
    async fn export(&self, batch: LogBatch<'_>) -> OTelSdkResult {
        let r = self.inner.export(batch).await;
        match &r {
            Ok(()) => add(&self.stats.otlp_log_exports, 1),
            Err(_) => add(&self.stats.otlp_log_errors, 1),
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
}

fn resource(ring_dir: &str) -> Resource {
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
    let cmdline: Vec<String> = std::env::args().collect();
    Resource::builder()
        .with_service_name(std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "vramhook-agent".into()))
        .with_attributes([
            KeyValue::new("host.name", vramhook_protocol::capture::hostname()),
            KeyValue::new("process.pid", i64::from(std::process::id())),
            KeyValue::new("process.executable.path", exe),
            KeyValue::new("process.command_line", cmdline.join(" ")),
            KeyValue::new("vramhook.ring_dir", ring_dir.to_string()),
        ])
        .build()
}

fn build_err(signal: &'static str) -> impl Fn(opentelemetry_otlp::ExporterBuildError) -> OtlpError {
    move |e| OtlpError::Build { signal, message: e.to_string() }
}

/// Builds the exporters and registers the instruments. Must run inside the tokio runtime.
pub fn start(
    stats: Arc<AgentStats>,
    snapshots: watch::Receiver<Arc<ModelSnapshot>>,
    incidents: mpsc::Receiver<OomIncident>,
    ring_dir: &str,
) -> Result<Otlp, OtlpError> {
    use opentelemetry_sdk::runtime::Tokio;
    let res = resource(ring_dir);
    let mut otlp = Otlp { meters: None, tracer: None, logger: None };

    if signal_on("OTEL_METRICS_EXPORTER") {
        let exporter = opentelemetry_otlp::MetricExporter::builder().build().map_err(build_err("metrics"))?;
        let exporter = CountingMetrics { inner: exporter, stats: stats.clone(), backoff: Backoff::default() };
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
        let exporter = RetryingSpans { inner: exporter, stats: stats.clone() };
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
        let exporter = CountingLogs { inner: exporter, stats: stats.clone() };
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
    match (def.kind, def.unit) {
        (Kind::Gauge, "1") => {
            meter
                .f64_observable_gauge(def.otel)
                .with_unit(def.unit)
                .with_description(def.help)
                .with_callback(move |o| {
                    for (attrs, v) in observe() {
                        o.observe(v, &attrs);
                    }
                })
                .build();
        }
        (Kind::Gauge, _) => {
            meter
                .u64_observable_gauge(def.otel)
                .with_unit(def.unit)
                .with_description(def.help)
                .with_callback(move |o| {
                    for (attrs, v) in observe() {
                        o.observe(v as u64, &attrs);
                    }
                })
                .build();
        }
        (Kind::Counter, _) => {
            meter
                .u64_observable_counter(def.otel)
                .with_unit(def.unit)
                .with_description(def.help)
                .with_callback(move |o| {
                    for (attrs, v) in observe() {
                        o.observe(v as u64, &attrs);
                    }
                })
                .build();
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
        KeyValue::new("pid", i64::from(i.pid)),
        KeyValue::new("command", metrics::command_label(&i.command, "")),
        KeyValue::new("device", i64::from(i.device)),
        KeyValue::new("vramhook.oom.verdict", format!("{:?}", i.verdict)),
        KeyValue::new("vramhook.oom.explanation", i.explanation.clone()),
        KeyValue::new("vramhook.oom.api", i.api.clone()),
        KeyValue::new("vramhook.oom.caller", i.caller.clone()),
        KeyValue::new("vramhook.oom.requested_bytes", i.requested_bytes as i64),
        KeyValue::new("vramhook.oom.failures", i.failures as i64),
        KeyValue::new("vramhook.oom.retries", i.retries as i64),
        KeyValue::new("vramhook.oom.freed_bytes_between", i.freed_bytes_between as i64),
        KeyValue::new("vramhook.oom.outcome", format!("{:?}", i.outcome)),
        KeyValue::new("vramhook.oom.own_idle_bytes", i.own_idle_bytes as i64),
        KeyValue::new("vramhook.oom.other_idle_bytes", i.other_idle_bytes as i64),
        KeyValue::new("vramhook.oom.arena_free_bytes", i.arena_free_bytes as i64),
        KeyValue::new("vramhook.oom.arena_largest_free_span", i.arena_largest_free_span as i64),
    ];
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

async fn incident_task(
    mut rx: mpsc::Receiver<OomIncident>,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    logger: Option<opentelemetry_sdk::logs::SdkLogger>,
    stats: Arc<AgentStats>,
) {
    while let Some(incident) = rx.recv().await {
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
            let mut rec = logger.create_log_record();
            rec.set_event_name("vramhook.oom");
            rec.set_timestamp(at);
            rec.set_severity_number(Severity::Error);
            rec.set_severity_text("ERROR");
            rec.set_body(AnyValue::from(incident.explanation.clone()));
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
        add(&stats.incidents_exported, 1);
    }
}

impl Otlp {
    /// Flushes and stops every provider (blocking: call from a blocking context).
    pub fn shutdown(self) {
        if let Some(p) = self.meters {
            let _ = p.shutdown();
        }
        if let Some(p) = self.tracer {
            let _ = p.shutdown();
        }
        if let Some(p) = self.logger {
            let _ = p.shutdown();
        }
    }
}
