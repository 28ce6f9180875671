//! A raw unary gRPC caller: sends message bytes to a path and returns exactly what came back
//! (headers, body bytes, trailers). Used to compare responses through crisp and direct, byte
//! for byte, with no decoding in between.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Debug, Clone, PartialEq)]
pub struct RawResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: HeaderMap,
}

impl RawResponse {
    /// grpc-status from trailers (or headers for a trailers-only answer).
    pub fn grpc_status(&self) -> Option<i32> {
        self.trailers
            .get("grpc-status")
            .or_else(|| self.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok()?.parse().ok())
    }
}

/// Frames `msg` as one uncompressed gRPC message.
pub fn frame(msg: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(5 + msg.len());
    v.push(0);
    v.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    v.extend_from_slice(msg);
    Bytes::from(v)
}

/// One unary call on a fresh HTTP/2 connection to `socket`.
pub async fn call(socket: &Path, path: &str, msg: &[u8]) -> Result<RawResponse> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connect {}", socket.display()))?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "30S")
        .body(Full::new(frame(msg)))?;
    let resp = tokio::time::timeout(Duration::from_secs(60), sender.send_request(req))
        .await
        .map_err(|_| anyhow!("{path}: no answer"))??;
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    Ok(RawResponse {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    })
}
