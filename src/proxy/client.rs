//! crisp's own calls to the runtime (readiness probes, status reads, job-mode stops), sent over
//! the same multiplexed upstream connection as kubelet's. These are the only messages crisp
//! encodes itself; they are built from views, never from a forwarded message.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request};
use prost::Message;

use super::body::{self, ProxyBody};
use super::Upstream;
use crate::cri::views;
use crate::cri::wire::{self, Frame};
use crate::cri::ApiVersion;
use crate::status::{code_of, Status};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Upstream(#[from] super::upstream::UpstreamError),
    #[error("runtime answered {method} with {status}")]
    Status { method: &'static str, status: Status },
    #[error("{method}: malformed response: {detail}")]
    Malformed { method: &'static str, detail: String },
    #[error("{method}: no answer within {timeout:?}")]
    Timeout { method: &'static str, timeout: Duration },
}

impl ClientError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Status { status, .. } if status.code == crate::status::code::NOT_FOUND)
    }
}

#[derive(Clone)]
pub struct RuntimeClient {
    upstream: Arc<Upstream>,
    timeout: Duration,
}

impl RuntimeClient {
    pub fn new(upstream: Arc<Upstream>, timeout: Duration) -> Self {
        RuntimeClient { upstream, timeout }
    }

    async fn call<Req: Message, Resp: Message + Default>(&self, version: ApiVersion, method: &'static str, req: &Req, timeout: Duration) -> Result<Resp, ClientError> {
        let uri = format!("http://localhost/runtime.{}.RuntimeService/{method}", version.as_str());
        let mut r = Request::builder().method(Method::POST).uri(uri);
        let h = r.headers_mut().expect("builder has no error yet");
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(http::header::TE, HeaderValue::from_static("trailers"));
        h.insert(http::header::USER_AGENT, HeaderValue::from_static(concat!("crisp/", env!("CARGO_PKG_VERSION"))));
        let ms = timeout.as_millis().clamp(1, 99_999_999);
        if let Ok(v) = HeaderValue::from_str(&format!("{ms}m")) {
            h.insert("grpc-timeout", v);
        }
        let request = r.body(ProxyBody::buffered(wire::frame(&req.encode_to_vec()), None)).map_err(|e| ClientError::Malformed { method, detail: e.to_string() })?;
        let fut = async {
            let resp = self.upstream.send(request).await?;
            let (parts, body) = resp.into_parts();
            if let Some(c) = code_of(&parts.headers) {
                return Err(status_error(method, c, &parts.headers));
            }
            let (data, trailers) = body::collect(ProxyBody::Upstream(body), 64 << 20).await.map_err(|e| ClientError::Malformed { method, detail: e.to_string() })?;
            let trailers = trailers.unwrap_or_default();
            match code_of(&trailers) {
                Some(0) => {}
                Some(c) => return Err(status_error(method, c, &trailers)),
                None => return Err(ClientError::Malformed { method, detail: "no grpc-status".into() }),
            }
            match wire::single_message(&data) {
                Some(Frame::Message(m)) => Resp::decode(m).map_err(|e| ClientError::Malformed { method, detail: e.to_string() }),
                _ if data.is_empty() => Ok(Resp::default()),
                _ => Err(ClientError::Malformed { method, detail: "not one uncompressed message".into() }),
            }
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| ClientError::Timeout { method, timeout })?
    }

    /// Containers of one sandbox (all states).
    pub async fn list_containers(&self, version: ApiVersion, sandbox_id: &str) -> Result<Vec<views::Container>, ClientError> {
        let req = views::ListContainersRequest { filter: Some(views::ContainerFilter { pod_sandbox_id: sandbox_id.to_string(), ..Default::default() }) };
        let resp: views::ListContainersResponse = self.call(version, "ListContainers", &req, self.timeout).await?;
        Ok(resp.containers)
    }

    /// One container by id, with its sandbox id (ContainerStatus has none, KUBELET-CRI §2.3).
    pub async fn container(&self, version: ApiVersion, id: &str) -> Result<Option<views::Container>, ClientError> {
        let req = views::ListContainersRequest { filter: Some(views::ContainerFilter { id: id.to_string(), ..Default::default() }) };
        let resp: views::ListContainersResponse = self.call(version, "ListContainers", &req, self.timeout).await?;
        Ok(resp.containers.into_iter().find(|c| c.id == id))
    }

    pub async fn list_pod_sandboxes(&self, version: ApiVersion) -> Result<Vec<views::PodSandbox>, ClientError> {
        let resp: views::ListPodSandboxResponse = self.call(version, "ListPodSandbox", &views::ListPodSandboxRequest {}, self.timeout).await?;
        Ok(resp.items)
    }

    pub async fn pod_sandbox_status(&self, version: ApiVersion, sandbox_id: &str) -> Result<views::PodSandboxStatusResponse, ClientError> {
        let req = views::PodSandboxIdRequest { pod_sandbox_id: sandbox_id.to_string() };
        self.call(version, "PodSandboxStatus", &req, self.timeout).await
    }

    /// PodSandboxStatus with `verbose: true`: the runtime's own `info` too (the sandbox's
    /// network namespace, for probes).
    pub async fn pod_sandbox_status_verbose(&self, version: ApiVersion, sandbox_id: &str) -> Result<views::PodSandboxStatusResponse, ClientError> {
        let req = views::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.to_string(), verbose: true };
        self.call(version, "PodSandboxStatus", &req, self.timeout).await
    }

    pub async fn container_status(&self, version: ApiVersion, id: &str) -> Result<views::ContainerStatusResponse, ClientError> {
        let req = views::ContainerIdRequest { container_id: id.to_string(), timeout: 0 };
        self.call(version, "ContainerStatus", &req, self.timeout).await
    }

    /// Runs `cmd` in a container; returns its exit code.
    pub async fn exec_sync(&self, version: ApiVersion, id: &str, cmd: &[String], timeout: Duration) -> Result<i32, ClientError> {
        let secs = timeout.as_secs().max(1) as i64;
        let req = views::ExecSyncRequest { container_id: id.to_string(), cmd: cmd.to_vec(), timeout: secs };
        let resp: views::ExecSyncResponse = self.call(version, "ExecSync", &req, timeout + Duration::from_secs(2)).await?;
        Ok(resp.exit_code)
    }

    pub async fn stop_container(&self, version: ApiVersion, id: &str, timeout_secs: i64) -> Result<(), ClientError> {
        let req = views::ContainerIdRequest { container_id: id.to_string(), timeout: timeout_secs };
        let wait = self.timeout + Duration::from_secs(timeout_secs.max(0) as u64);
        let _: views::ListPodSandboxRequest = self.call(version, "StopContainer", &req, wait).await?;
        Ok(())
    }
}

/// `runtime.v1.VersionRequest` (same field numbers in v1alpha2).
#[derive(Clone, PartialEq, Message)]
pub struct VersionRequest {
    /// The kubelet's CRI API version.
    #[prost(string, tag = "1")]
    pub version: String,
}

/// `runtime.v1.VersionResponse` (same field numbers in v1alpha2).
#[derive(Clone, PartialEq, Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

impl RuntimeClient {
    /// RuntimeService/Version in the given CRI API version (`crisp doctor`).
    pub async fn version(&self, version: ApiVersion) -> Result<VersionResponse, ClientError> {
        let req = VersionRequest { version: version.as_str().to_string() };
        self.call(version, "Version", &req, self.timeout).await
    }
}

fn status_error(method: &'static str, code: i32, h: &http::HeaderMap) -> ClientError {
    let message = h.get("grpc-message").and_then(|v| v.to_str().ok()).map(|m| percent_encoding::percent_decode_str(m).decode_utf8_lossy().into_owned()).unwrap_or_default();
    ClientError::Status { method, status: Status::new(code, message) }
}
