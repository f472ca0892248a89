//! Helpers for the agent tests: start `vramhook agent` on a free loopback port, talk HTTP
//! to it, run workloads traced into its ring directory.
#![allow(dead_code)]

use serde_json::Value;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

pub use vramhook_testkit::{http_get, interposer, repo_root, shm_dir as ring_dir, vramhook_bin, workload};

pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: vramhook_testkit::StderrLog,
}

/// A traced process in the agent's state document, by pid.
pub fn process(state: &Value, pid: u32) -> Option<&Value> {
    state["snapshot"]["processes"].as_array()?.iter().find(|p| p["pid"] == pid)
}

impl Agent {
    /// This build's agent on a fresh ring directory (tagged `tag`), with `args` added.
    pub fn on_new_rings(tag: &str, args: &[&str]) -> (tempfile::TempDir, Agent) {
        let rings = ring_dir(tag);
        let dir = rings.path().to_str().expect("utf-8 ring dir").to_string();
        let mut all = vec!["--ring-dir", dir.as_str()];
        all.extend_from_slice(args);
        let agent = Agent::start(&vramhook_bin(), &all, &[]);
        (rings, agent)
    }

    /// Starts the agent with `args` (plus `--listen 127.0.0.1:0`) and waits until it listens.
    pub fn start(bin: &Path, args: &[&str], envs: &[(&str, &str)]) -> Agent {
        let mut cmd = Command::new(bin);
        cmd.arg("agent").args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let (child, log, addr) = vramhook_testkit::spawn_agent(cmd, Duration::from_secs(30));
        Agent { child, addr, log }
    }

    pub fn get(&self, path: &str) -> String {
        http_get(self.addr, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    pub fn state(&self) -> Value {
        serde_json::from_str(&self.get("/api/v1/state")).expect("state JSON")
    }

    pub fn log(&self) -> String {
        self.log.text()
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

    /// One frame of `vramhook top` drawn from this agent, 200 columns by 30 rows.
    pub fn top_once(&self) -> String {
        let top = Command::new(vramhook_bin())
            .args(["top", "--once", "200x30", "--agent"])
            .arg(self.addr.to_string())
            .output()
            .expect("vramhook top --once");
        String::from_utf8_lossy(&top.stdout).into_owned()
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

/// A binary the backend tests need, from `.tools/bin` (built by scripts/lib/backends.sh).
/// Fails loudly, with how to build it, when it is missing: never skips.
/// The capture files (`.vrhk`) an agent wrote into `dir`, sorted.
pub fn captures_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("captures")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "vrhk"))
        .collect();
    files.sort();
    files
}

pub fn backend_bin(name: &str) -> PathBuf {
    let p = repo_root().join(".tools/bin").join(name);
    assert!(
        p.is_file(),
        "MISSING backend binary {}: build the real backends with `scripts/lib/backends.sh` \
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

/// A loopback port held while nothing listens on it: a socket bound and not listening, so
/// connections are refused (the endpoint is down), and no other test is handed the port in
/// the meantime. (A port merely found free and left unbound for the down phase was once
/// handed to the two-host test's Prometheus as well; whichever Prometheus went away second
/// left the other test's queries refused.)
pub struct DownPort(std::os::fd::OwnedFd);

impl DownPort {
    pub fn bind() -> (DownPort, u16) {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket calls on a descriptor of ours, with our own address buffers.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let fd = std::os::fd::OwnedFd::from_raw_fd(fd);
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
            assert_eq!(libc::bind(raw, (&raw const addr).cast(), len), 0, "bind: {}", std::io::Error::last_os_error());
            let mut len = len;
            assert_eq!(libc::getsockname(raw, (&raw mut addr).cast(), &mut len), 0, "getsockname");
            (DownPort(fd), u16::from_be(addr.sin_port))
        }
    }

    /// The same socket, now listening on the same port.
    pub fn listen(self) -> std::net::TcpListener {
        // SAFETY: our bound socket; the listener takes the descriptor over.
        unsafe {
            let raw = std::os::fd::IntoRawFd::into_raw_fd(self.0);
            assert_eq!(libc::listen(raw, 128), 0, "listen: {}", std::io::Error::last_os_error());
            <std::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(raw)
        }
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}
