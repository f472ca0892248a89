//! Where the live model goes: rotating capture files ([`capture`]), the HTTP endpoints
//! (Prometheus `/metrics` and the JSON state, [`http`]) and OTLP ([`otlp`]: metrics, OOM
//! spans and log records, fit crossings). Each sits behind a bounded queue or reads the
//! last published snapshot, so none can stall ingestion. [`metrics`] is the metric
//! catalogue Prometheus and OTLP share; [`oom_counts`] and [`fit_crossings`] turn
//! snapshots into what the sinks report once (incidents counted, crossings of 1).

pub mod capture;
pub mod fit_crossings;
pub mod http;
pub mod metrics;
pub mod oom_counts;
pub mod otlp;
