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
    // Counters first, then the snapshot: it is at least as new as what they count.
    let stats = state.stats.view();
    let snap = state.snapshots.borrow().clone();
    match req.uri().path() {
        "/metrics" => {
            reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", render_prometheus(&snap, &stats))
        }
        "/api/v1/state" => {
            let doc = State { agent: stats, ring_dir: state.ring_dir.clone(), snapshot: (*snap).clone() };
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

/// Reads `/api/v1/state` from an agent (`vramhook top`) with hyper's HTTP/1.1 client
/// (chunked bodies, status codes and headers as hyper parses them), on a runtime of its own
/// kept for the client's life.
pub struct StateClient {
    addr: String,
    rt: tokio::runtime::Runtime,
}

impl StateClient {
    pub fn new(addr: &str) -> Result<StateClient, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start an HTTP client: {e}"))?;
        Ok(StateClient { addr: addr.to_string(), rt })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// One GET, the whole exchange bounded by `timeout`.
    pub fn fetch(&self, timeout: std::time::Duration) -> Result<State, String> {
        let addr = &self.addr;
        self.rt
            .block_on(async { tokio::time::timeout(timeout, get_state(addr)).await })
            .map_err(|_| format!("{addr}: no answer within {timeout:?}"))?
            .map_err(|e| format!("{addr}: {e}"))
    }
}

async fn get_state(addr: &str) -> Result<State, String> {
    use http_body_util::{BodyExt, Empty};
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    // The connection is driven beside the request; it ends when the answer is read.
    let conn = tokio::spawn(conn);
    let req = Request::get("/api/v1/state")
        .header(hyper::header::HOST, addr)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if res.status() != StatusCode::OK {
        return Err(format!("HTTP {}", res.status()));
    }
    let body = res.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    conn.abort();
    serde_json::from_slice(&body).map_err(|e| format!("bad state JSON: {e}"))
}
