//! Helpers for the agent tests: start `vramhook agent` on a free loopback port, talk HTTP
//! to it, run workloads traced into its ring directory.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

pub fn vramhook_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vramhook"))
}

/// libvramhook.so from the same build as the binary under test.
pub fn interposer() -> PathBuf {
    let lib = vramhook_bin().parent().expect("bin dir").join("libvramhook.so");
    assert!(
        lib.is_file(),
        "MISSING {}: build the interposer first (`cargo build -p vramhook-interposer`)",
        lib.display()
    );
    lib
}

/// A simulated-driver workload (builds tests/simcuda once; a failure fails loudly).
pub fn workload(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = repo_root().join("tests/simcuda");
            let out = Command::new("make").arg("-s").arg("-C").arg(&dir).output().expect("cannot run make");
            assert!(
                out.status.success(),
                "building the simulated CUDA driver failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            dir.join("build")
        })
        .join("workloads")
        .join(name)
}

pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Agent {
    /// Starts the agent with `args` (plus `--listen 127.0.0.1:0`) and waits until it listens.
    pub fn start(bin: &Path, args: &[&str], envs: &[(&str, &str)]) -> Agent {
        let mut cmd = Command::new(bin);
        cmd.arg("agent").args(args).args(["--listen", "127.0.0.1:0"]).stderr(Stdio::piped()).stdout(Stdio::null());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start vramhook agent");
        let stderr = child.stderr.take().expect("stderr");
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("vramhook agent: listening on ") {
                    let _ = tx.send(a.trim().to_string());
                }
                if let Ok(mut l) = log2.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            panic!("agent did not start listening: {}", log.lock().map(|l| l.clone()).unwrap_or_default())
        });
        Agent { child, addr: addr.parse().expect("addr"), log }
    }

    pub fn get(&self, path: &str) -> String {
        http_get(self.addr, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    pub fn state(&self) -> Value {
        serde_json::from_str(&self.get("/api/v1/state")).expect("state JSON")
    }

    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Polls the state until `pred` holds (panics after `timeout`).
    pub fn wait_state(&self, timeout: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let s = self.state();
            if pred(&s) {
                return s;
            }
            assert!(start.elapsed() < timeout, "timed out waiting for {what}; last state agent={}", s["agent"]);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn terminate(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no header end")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.to_string());
    }
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return dechunk(body);
    }
    Ok(body.to_string())
}

/// Decodes a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").ok_or("bad chunk header")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).map_err(|e| e.to_string())?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).ok_or("short chunk")?);
        body = rest.get(size + 2..).ok_or("short chunk")?;
    }
}

/// A fresh directory on tmpfs for rings.
pub fn ring_dir(tag: &str) -> tempfile::TempDir {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() { base.to_path_buf() } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix(&format!("vramhook-{tag}-")).tempdir_in(base).expect("ring dir")
}

/// A workload started traced into `ring_dir` (not waited for).
pub fn spawn_traced(workload: &Path, args: &[&str], ring_dir: &Path, envs: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(workload);
    cmd.args(args)
        .env("LD_PRELOAD", interposer())
        .env("VRAMHOOK_DIR", ring_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start workload")
}

/// A binary the backend tests need, from `.tools/bin` (built by scripts/ci-backends.sh).
/// Fails loudly, with how to build it, when it is missing: never skips.
pub fn backend_bin(name: &str) -> PathBuf {
    let p = repo_root().join(".tools/bin").join(name);
    assert!(
        p.is_file(),
        "MISSING backend binary {}: build the real backends with `scripts/ci-backends.sh` \
         (go install of jaeger v1.76.0, prometheus and promtool v0.316.0 into .tools/bin)",
        p.display()
    );
    p
}

/// Numeric value of one series in Prometheus text output.
pub fn prom_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
    })
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}
