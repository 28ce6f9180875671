//! How a readiness is probed: TCP connects and HTTP GETs through the environment the ordering
//! engine gives (the pod's network namespace, the node-wide bounds), exec through ExecSync.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// What a probe needs from whoever runs it (the ordering engine): the pod's address, a TCP
/// connection from the right place (the pod's network namespace, under the node-wide bounds),
/// and a way to run a command in the sidecar's container (the runtime's ExecSync).
pub(crate) trait ProbeEnv {
    /// The pod IP (loopback for hostNetwork pods); `None` while it cannot be known.
    fn pod_ip(&self) -> impl std::future::Future<Output = Option<IpAddr>> + Send;
    /// A TCP connection to `addr`, or why not.
    fn connect(
        &self,
        addr: SocketAddr,
    ) -> impl std::future::Future<Output = Result<TcpStream, String>> + Send;
    /// Runs `cmd` in the container; its exit code, or why it could not run. Only the exit code:
    /// a command's output never reaches crisp's logs or tap.
    fn exec(
        &self,
        cmd: &[String],
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<i32, String>> + Send;
}

/// Connects from crisp's own network namespace (tests, and probes of the node itself).
pub(crate) async fn connect_here(addr: SocketAddr) -> Result<TcpStream, String> {
    TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))
}

/// What one probe found: `Ok` when the sidecar is ready, else why not, in words an operator
/// reads in `crisp pods` and the tap ("connect 10.1.2.3:15021: connection refused").
pub(crate) type ProbeResult = Result<(), String>;

impl Readiness {
    /// One probe, bounded by `timeout`: whether the sidecar is ready now, and if not, why.
    pub(crate) async fn probe(&self, env: &impl ProbeEnv, timeout: Duration) -> ProbeResult {
        let addr = |host: Option<IpAddr>, port: u16| async move {
            let ip = match host {
                Some(h) => Some(h),
                None => env.pod_ip().await,
            };
            ip.map(|ip| SocketAddr::new(ip, port))
                .ok_or_else(|| "the pod IP is not known yet".to_string())
        };
        match self {
            Readiness::Running => Ok(()),
            Readiness::Tcp { host, port } => {
                probe_tcp_with(env, addr(*host, *port).await?, timeout).await
            }
            Readiness::Http { host, port, path } => {
                probe_http_with(env, addr(*host, *port).await?, path, timeout).await
            }
            Readiness::Exec { cmd } => match env.exec(cmd, timeout).await {
                Ok(0) => Ok(()),
                Ok(code) => Err(format!("exec exited {code}")),
                Err(e) => Err(format!("exec failed: {e}")),
            },
        }
    }
}

/// TCP connect probe from crisp's own network namespace.
#[cfg(test)]
pub(super) async fn probe_tcp(addr: SocketAddr, timeout: Duration) -> ProbeResult {
    probe_tcp_with(&HostEnv, addr, timeout).await
}

/// TCP connect probe through `env`'s connector.
async fn probe_tcp_with(env: &impl ProbeEnv, addr: SocketAddr, timeout: Duration) -> ProbeResult {
    match tokio::time::timeout(timeout, env.connect(addr)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("connect {addr}: no answer within {timeout:?}")),
    }
}

/// Probes from crisp's own network namespace with no pod behind them: no pod IP, no exec.
#[cfg(test)]
pub(super) struct HostEnv;

#[cfg(test)]
impl ProbeEnv for HostEnv {
    async fn pod_ip(&self) -> Option<IpAddr> {
        None
    }

    async fn connect(&self, addr: SocketAddr) -> Result<TcpStream, String> {
        connect_here(addr).await
    }

    async fn exec(&self, _cmd: &[String], _timeout: Duration) -> Result<i32, String> {
        Err("no container to run a command in".into())
    }
}

/// HTTP/1.0 GET probe from crisp's own network namespace.
#[cfg(test)]
pub(super) async fn probe_http(addr: SocketAddr, path: &str, timeout: Duration) -> ProbeResult {
    probe_http_with(&HostEnv, addr, path, timeout).await
}

/// HTTP/1.0 GET probe: ready on a 2xx or 3xx status line. Kept minimal on purpose — a probe
/// needs the status line only, and HTTP/1.0 makes the server close the connection. Nothing of
/// the answer but its status code is kept.
async fn probe_http_with(
    env: &impl ProbeEnv,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> ProbeResult {
    let fut = async {
        let mut s = env.connect(addr).await?;
        let req = format!(
            "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: crisp-probe\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            let r = s
                .read(&mut buf[n..])
                .await
                .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
            if r == 0 {
                break;
            }
            n += r;
        }
        let code: Option<u16> = std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|l| l.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok());
        match code {
            Some(c) if (200..400).contains(&c) => Ok(()),
            Some(c) => Err(format!("GET http://{addr}{path}: status {c}")),
            None => Err(format!("GET http://{addr}{path}: no HTTP status line")),
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "GET http://{addr}{path}: no answer within {timeout:?}"
        )),
    }
}
