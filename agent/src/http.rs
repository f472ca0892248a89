//! The HTTP endpoints: `/metrics` (Prometheus text) and `/api/v1/state` (JSON: the
//! model's snapshot and the agent's counters), served from the last published snapshot
//! so a scrape never touches the ingest loop.

use crate::metrics::render_prometheus;
use crate::stats::{add, AgentStats, StatsView};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::sync::watch;
use vramhook_model::ModelSnapshot;

/// The JSON state document (`/api/v1/state`); `vramhook top` reads it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct State {
    pub agent: StatsView,
    pub ring_dir: String,
    pub snapshot: ModelSnapshot,
}

#[derive(Clone)]
pub struct HttpState {
    pub stats: Arc<AgentStats>,
    pub snapshots: watch::Receiver<Arc<ModelSnapshot>>,
    pub ring_dir: String,
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn route(state: &HttpState, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    add(&state.stats.http_requests, 1);
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    let snap = state.snapshots.borrow().clone();
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            render_prometheus(&snap, &state.stats.view()),
        ),
        "/api/v1/state" => {
            let doc = State { agent: state.stats.view(), ring_dir: state.ring_dir.clone(), snapshot: (*snap).clone() };
            match serde_json::to_vec(&doc) {
                Ok(body) => reply(StatusCode::OK, "application/json", body),
                Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
            }
        }
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/" => reply(StatusCode::OK, "text/plain", "vramhook agent: /metrics, /api/v1/state, /healthz\n"),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// Serves until the listener fails; one task per connection.
pub async fn serve(listener: tokio::net::TcpListener, state: HttpState) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("vramhook agent: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let r = route(&state, &req);
                async move { Ok::<_, std::convert::Infallible>(r) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = conn.await;
        });
    }
}

/// Fetches `/api/v1/state` from an agent (a minimal HTTP/1.1 client for `vramhook top`).
pub fn fetch_state(addr: &str, timeout: std::time::Duration) -> Result<State, String> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let mut s = std::net::TcpStream::connect_timeout(&sock, timeout).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    write!(s, "GET /api/v1/state HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("{addr}: {e}"))?;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no HTTP header end")?;
    let head = String::from_utf8_lossy(&buf[..split]);
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{addr}: {}", head.lines().next().unwrap_or("")));
    }
    serde_json::from_slice(&buf[split + 4..]).map_err(|e| format!("{addr}: bad state JSON: {e}"))
}
