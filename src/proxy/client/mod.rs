//! crisp's own calls to the runtime (readiness probes, status reads, job-mode stops), sent over
//! the runtime pool's multiplexed connections ([`super::runtime_pool`]), as diverted calls are.
//! These are the only messages crisp encodes itself; they are built from views, never from a
//! forwarded message.
//!
//! The unary calls go through tonic's [`Grpc`] client with prost's codec over [`PoolService`], a
//! tower service around [`RuntimePool::send`]: tonic frames the message, writes the gRPC headers
//! and reads the answer. The service keeps what crisp decided before tonic (issue #36): the
//! request body is sent buffered (the pool sends it again after a REFUSED_STREAM), a runtime's
//! non-OK status is read as crisp reads every grpc-message, and a pool error comes back typed.
//! ExecSync is read by hand ([`exec`]): tonic would hold the command's whole output.
//!
//! Container lists use `StreamContainers` (cri-api v0.36, KEP-5825: the list as a server stream
//! of chunks) where the runtime serves it, and `ListContainers` where it answers `UNIMPLEMENTED`
//! — remembered until the pool dials the runtime again (a restarted runtime may be a newer one).

mod exec;
mod pool_service;
mod raw;

pub(crate) use raw::{RawCall, RawCodec};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{PathAndQuery, Uri};
use prost::Message;
use tonic::client::Grpc;
use tonic::codec::Codec;
use tonic::metadata::MetadataValue;
use tonic_prost::ProstCodec;

use self::pool_service::{Failure, PoolService, Runtime};
use super::RuntimePool;
use crate::cri::views;
use crate::cri::ApiVersion;
use crate::status::Status;

// The exec-probe tests bound the call by it; within crisp, only `exec` reads it.
#[cfg(any(test, feature = "test-util"))]
pub use exec::EXEC_RUNTIME_SLACK;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    RuntimePool(#[from] super::runtime_pool::RuntimePoolError),
    #[error("runtime answered {method} with {status}")]
    Status {
        method: &'static str,
        status: Status,
    },
    #[error("{method}: malformed response: {detail}")]
    Malformed {
        method: &'static str,
        detail: String,
    },
    #[error("{method}: no answer within {timeout:?}")]
    Timeout {
        method: &'static str,
        timeout: Duration,
    },
}

impl ClientError {
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(
            self,
            ClientError::Status { status, .. } if status.code == crate::status::code::NOT_FOUND
        )
    }

    pub(crate) fn is_unimplemented(&self) -> bool {
        matches!(
            self,
            ClientError::Status { status, .. } if status.code == UNIMPLEMENTED
        )
    }

    /// The status a call that failed this way ended with, as the tap shows it: the runtime's
    /// own, else crisp's for an answer it never had (UNAVAILABLE: no runtime to ask;
    /// DEADLINE_EXCEEDED: no answer in time; INTERNAL: one it could not read).
    pub(crate) fn status(&self) -> Status {
        use crate::status::code;
        match self {
            ClientError::Status { status, .. } => status.clone(),
            ClientError::RuntimePool(e) => Status::runtime_unavailable(e),
            ClientError::Timeout { .. } => {
                Status::new(code::DEADLINE_EXCEEDED, format!("crisp: {self}"))
            }
            ClientError::Malformed { .. } => Status::new(code::INTERNAL, format!("crisp: {self}")),
        }
    }
}

/// Largest answer crisp decodes (a node's ListContainers; tonic's own default is 4 MiB).
const MAX_ANSWER: usize = 64 << 20;

/// gRPC's UNIMPLEMENTED: the runtime has no such method.
const UNIMPLEMENTED: i32 = 12;
/// What a StopPodSandbox crisp sends itself may take beyond the read timeout: the teardown of
/// the sandbox's network and whatever still runs in it.
const SANDBOX_STOP_WAIT: Duration = Duration::from_secs(60);

/// Most containers a streamed list may carry in all (a node's ListContainers is bounded by
/// [`MAX_ANSWER`] bytes; a stream's chunks each are, so their number is bounded here: 64 MiB
/// of the smallest container a runtime could list, 16 bytes).
const MAX_STREAMED_CONTAINERS: usize = MAX_ANSWER / 16;

/// Whether the runtime serves `StreamContainers`: the pool's dial count when it last answered
/// `UNIMPLEMENTED` (`u64::MAX`: it never did). Shared by the clones of one client.
#[derive(Debug)]
struct Streams {
    unimplemented_at: AtomicU64,
}

impl Default for Streams {
    fn default() -> Self {
        Streams {
            unimplemented_at: AtomicU64::new(u64::MAX),
        }
    }
}

/// What crisp's own calls say they are.
const USER_AGENT: &str = concat!("crisp/", env!("CARGO_PKG_VERSION"));

#[derive(Clone)]
pub struct RuntimeClient {
    pool: Arc<RuntimePool>,
    timeout: Duration,
    streams: Arc<Streams>,
}

impl RuntimeClient {
    pub fn new(pool: Arc<RuntimePool>, timeout: Duration) -> Self {
        RuntimeClient {
            pool,
            timeout,
            streams: Arc::default(),
        }
    }

    async fn call<Req, Resp>(
        &self,
        version: ApiVersion,
        method: &'static str,
        req: Req,
        timeout: Duration,
    ) -> Result<Resp, ClientError>
    where
        Req: Message + Send + Sync + 'static,
        Resp: Message + Default + Send + Sync + 'static,
    {
        unary(
            self.pool.clone(),
            OwnCall::new(version, method, req, timeout),
        )
        .await
    }

    /// The containers that match `filter` (None: every container of the node, all states):
    /// StreamContainers where the runtime serves it, else ListContainers.
    async fn list(
        &self,
        version: ApiVersion,
        filter: Option<views::ContainerFilter>,
    ) -> Result<Vec<views::Container>, ClientError> {
        let dials = self.pool.dials();
        list_containers(
            self.pool.clone(),
            dials,
            &self.streams,
            version,
            filter,
            self.timeout,
        )
        .await
    }

    /// Containers of one sandbox (all states).
    pub(crate) async fn list_containers(
        &self,
        version: ApiVersion,
        sandbox_id: &str,
    ) -> Result<Vec<views::Container>, ClientError> {
        let filter = views::ContainerFilter {
            pod_sandbox_id: sandbox_id.to_string(),
            ..Default::default()
        };
        self.list(version, Some(filter)).await
    }

    /// Every container of the node (all states).
    pub(crate) async fn list_all_containers(
        &self,
        version: ApiVersion,
    ) -> Result<Vec<views::Container>, ClientError> {
        self.list(version, None).await
    }

    /// One container by id, with its sandbox id (ContainerStatus has none, KUBELET-CRI §2.3).
    pub(crate) async fn container(
        &self,
        version: ApiVersion,
        id: &str,
    ) -> Result<Option<views::Container>, ClientError> {
        let filter = views::ContainerFilter {
            id: id.to_string(),
            ..Default::default()
        };
        let containers = self.list(version, Some(filter)).await?;
        Ok(containers.into_iter().find(|c| c.id == id))
    }

    pub(crate) async fn list_pod_sandboxes(
        &self,
        version: ApiVersion,
    ) -> Result<Vec<views::PodSandbox>, ClientError> {
        let resp: views::ListPodSandboxResponse = self
            .call(
                version,
                "ListPodSandbox",
                views::ListPodSandboxRequest {},
                self.timeout,
            )
            .await?;
        Ok(resp.items)
    }

    pub(crate) async fn pod_sandbox_status(
        &self,
        version: ApiVersion,
        sandbox_id: &str,
    ) -> Result<views::PodSandboxStatusResponse, ClientError> {
        self.sandbox_status(version, sandbox_id, false).await
    }

    /// PodSandboxStatus with `verbose: true`: the runtime's own `info` too (the sandbox's
    /// network namespace, for probes).
    pub(crate) async fn pod_sandbox_status_verbose(
        &self,
        version: ApiVersion,
        sandbox_id: &str,
    ) -> Result<views::PodSandboxStatusResponse, ClientError> {
        self.sandbox_status(version, sandbox_id, true).await
    }

    /// PodSandboxStatus (`verbose: false` is the field's default, so the plain request's bytes
    /// are those of the request without it).
    async fn sandbox_status(
        &self,
        version: ApiVersion,
        sandbox_id: &str,
        verbose: bool,
    ) -> Result<views::PodSandboxStatusResponse, ClientError> {
        let req = views::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            verbose,
        };
        self.call(version, "PodSandboxStatus", req, self.timeout)
            .await
    }

    pub(crate) async fn container_status(
        &self,
        version: ApiVersion,
        id: &str,
    ) -> Result<views::ContainerStatusResponse, ClientError> {
        let req = views::ContainerIdRequest {
            container_id: id.to_string(),
            timeout: 0,
        };
        self.call(version, "ContainerStatus", req, self.timeout)
            .await
    }

    pub(crate) async fn stop_container(
        &self,
        version: ApiVersion,
        id: &str,
        timeout_secs: i64,
    ) -> Result<(), ClientError> {
        let req = views::ContainerIdRequest {
            container_id: id.to_string(),
            timeout: timeout_secs,
        };
        let wait = self.timeout + Duration::from_secs(timeout_secs.max(0) as u64);
        self.act(version, "StopContainer", req, wait).await
    }

    /// StopPodSandbox: the runtime stops whatever of the sandbox still runs and tears its
    /// network down (a restarted crisp carrying out a kept one).
    pub(crate) async fn stop_pod_sandbox(
        &self,
        version: ApiVersion,
        sandbox_id: &str,
    ) -> Result<(), ClientError> {
        let req = views::PodSandboxIdRequest {
            pod_sandbox_id: sandbox_id.to_string(),
        };
        // kubelet gives it two minutes (KUBELET-CRI §3.3); crisp's own read timeout on top
        // of a teardown's worst case is the same order.
        let wait = self.timeout + SANDBOX_STOP_WAIT;
        self.act(version, "StopPodSandbox", req, wait).await
    }

    /// A call whose answer is an empty message (the stops): only its status counts.
    async fn act<Req>(
        &self,
        version: ApiVersion,
        method: &'static str,
        req: Req,
        wait: Duration,
    ) -> Result<(), ClientError>
    where
        Req: Message + Send + Sync + 'static,
    {
        let _: views::ListPodSandboxRequest = self.call(version, method, req, wait).await?;
        Ok(())
    }

    /// RuntimeService/Version in the given CRI API version (`crisp doctor`).
    pub async fn version(&self, version: ApiVersion) -> Result<VersionResponse, ClientError> {
        let req = VersionRequest {
            version: version.as_str().to_string(),
        };
        self.call(version, "Version", req, self.timeout).await
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

/// The containers that match `filter`, over `runtime` (whose pool has dialed `dials` times):
/// `StreamContainers` in runtime.v1 unless the runtime answered it `UNIMPLEMENTED` since its
/// last dial, then `ListContainers` (runtime.v1alpha2 has no streams). Each streamed message is
/// a chunk of the list (`StreamContainersResponse` is `ListContainersResponse`'s shape, field 1).
async fn list_containers<R: Runtime>(
    runtime: R,
    dials: u64,
    streams: &Streams,
    version: ApiVersion,
    filter: Option<views::ContainerFilter>,
    timeout: Duration,
) -> Result<Vec<views::Container>, ClientError> {
    let req = views::ListContainersRequest { filter };
    if version == ApiVersion::V1 && streams.unimplemented_at.load(Ordering::Relaxed) != dials {
        let chunks = streamed::<_, _, views::ListContainersResponse>(
            runtime.clone(),
            OwnCall::new(version, "StreamContainers", req.clone(), timeout),
            MAX_STREAMED_CONTAINERS,
            |m| m.containers.len(),
        )
        .await;
        match chunks {
            Ok(chunks) => return Ok(chunks.into_iter().flat_map(|c| c.containers).collect()),
            Err(e) if e.is_unimplemented() => {
                tracing::debug!("the runtime has no StreamContainers: ListContainers from now on");
                streams.unimplemented_at.store(dials, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    let resp: views::ListContainersResponse = unary(
        runtime,
        OwnCall::new(version, "ListContainers", req, timeout),
    )
    .await?;
    Ok(resp.containers)
}

/// The CRI service a method belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    Runtime,
    Image,
}

impl Service {
    fn as_str(self) -> &'static str {
        match self {
            Service::Runtime => "RuntimeService",
            Service::Image => "ImageService",
        }
    }
}

/// The gRPC path of `method` of `service` in CRI API `version`.
pub(crate) fn method_path(version: ApiVersion, service: Service, method: &str) -> String {
    format!(
        "/runtime.{}.{}/{method}",
        version.as_str(),
        service.as_str()
    )
}

/// The path of `method` of `service` in CRI API `version`.
fn path(
    version: ApiVersion,
    service: Service,
    method: &'static str,
) -> Result<PathAndQuery, ClientError> {
    PathAndQuery::try_from(method_path(version, service, method)).map_err(|e| {
        ClientError::Malformed {
            method,
            detail: e.to_string(),
        }
    })
}

/// One of crisp's own calls: `method` of the RuntimeService (or another `service`) in CRI API
/// `version`, its request, and how long the runtime is told it has (`grpc-timeout`, to the
/// millisecond) and crisp waits.
pub(super) struct OwnCall<Req> {
    version: ApiVersion,
    service: Service,
    method: &'static str,
    req: Req,
    timeout: Duration,
}

impl<Req> OwnCall<Req> {
    pub(super) fn new(
        version: ApiVersion,
        method: &'static str,
        req: Req,
        timeout: Duration,
    ) -> Self {
        OwnCall {
            version,
            service: Service::Runtime,
            method,
            req,
            timeout,
        }
    }

    /// The same call, of `service` instead of the RuntimeService.
    pub(super) fn of(mut self, service: Service) -> Self {
        self.service = service;
        self
    }
}

/// `call` as a unary call through tonic over `runtime`, given up on when its timeout runs out.
/// An OK answer without a message is the default message, as protobuf reads an empty one; more
/// than one message is refused.
async fn unary<R, Req, Resp>(runtime: R, call: OwnCall<Req>) -> Result<Resp, ClientError>
where
    R: Runtime,
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    unary_with(runtime, call, ProstCodec::<Req, Resp>::default()).await
}

/// [`unary`] with `codec` (`raw::RawCodec`: the answer's bytes as they came).
async fn unary_with<R, C>(
    runtime: R,
    call: OwnCall<C::Encode>,
    codec: C,
) -> Result<C::Decode, ClientError>
where
    R: Runtime,
    C: Codec + Send + 'static,
    C::Encode: Sync,
    C::Decode: Default + Sync,
{
    let method = call.method;
    // A server stream, not tonic's `unary`: that refuses an OK answer without a message.
    answer_stream(runtime, call, codec, |mut answer| async move {
        let fail = |status| client_error(method, status);
        let first = answer.message().await.map_err(fail)?;
        if first.is_some() && answer.message().await.map_err(fail)?.is_some() {
            return Err(ClientError::Malformed {
                method,
                detail: "more than one message".into(),
            });
        }
        Ok(first.unwrap_or_default())
    })
    .await
}

/// `call` as a server-streaming call through tonic over `runtime`: every message, in order,
/// within its timeout for the whole stream; at most `max_items` items in all (`items` counts a
/// message's), each message at most [`MAX_ANSWER`] bytes.
async fn streamed<R, Req, Resp>(
    runtime: R,
    call: OwnCall<Req>,
    max_items: usize,
    items: impl Fn(&Resp) -> usize + Send,
) -> Result<Vec<Resp>, ClientError>
where
    R: Runtime,
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    let method = call.method;
    let codec = ProstCodec::<Req, Resp>::default();
    answer_stream(runtime, call, codec, |mut answer| async move {
        let mut out = Vec::new();
        let mut n = 0usize;
        while let Some(m) = answer
            .message()
            .await
            .map_err(|status| client_error(method, status))?
        {
            n = n.saturating_add(items(&m));
            if n > max_items {
                return Err(ClientError::Malformed {
                    method,
                    detail: format!("more than {max_items} items"),
                });
            }
            out.push(m);
        }
        Ok(out)
    })
    .await
}

/// `call` made through tonic with `codec` over `runtime` (each message of its answer at most
/// [`MAX_ANSWER`] bytes), the answer's messages read by `read`; the whole call, `read` too,
/// given up on when its timeout runs out.
async fn answer_stream<R, C, T, Read>(
    runtime: R,
    call: OwnCall<C::Encode>,
    codec: C,
    read: impl FnOnce(tonic::codec::Streaming<C::Decode>) -> Read,
) -> Result<T, ClientError>
where
    R: Runtime,
    C: Codec + Send + 'static,
    C::Encode: Sync,
    C::Decode: Sync,
    Read: std::future::Future<Output = Result<T, ClientError>>,
{
    let OwnCall {
        version,
        service,
        method,
        req,
        timeout,
    } = call;
    let path = path(version, service, method)?;
    let request = request(req, timeout);
    let mut grpc = Grpc::with_origin(
        PoolService::new(runtime),
        Uri::from_static("http://localhost"),
    )
    .max_decoding_message_size(MAX_ANSWER);
    let fut = async move {
        let answer = grpc
            .server_streaming(request, path, codec)
            .await
            .map_err(|status| client_error(method, status))?
            .into_inner();
        read(answer).await
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ClientError::Timeout { method, timeout })?
}

/// A request of crisp's own, with its user agent and the deadline the runtime is told.
fn request<Req>(req: Req, timeout: Duration) -> tonic::Request<Req> {
    let mut request = tonic::Request::new(req);
    let metadata = request.metadata_mut();
    metadata.insert("user-agent", MetadataValue::from_static(USER_AGENT));
    if let Ok(v) = MetadataValue::try_from(crate::status::grpc_timeout_ms(timeout)) {
        metadata.insert("grpc-timeout", v);
    }
    request
}

/// The error of a call tonic gave up on, from what [`PoolService`] put under its status: the
/// pool's own error, typed as it was; the runtime's non-OK status; or a malformed answer (tonic's
/// own statuses: a message it cannot decode, too large, compressed, no grpc-status).
fn client_error(method: &'static str, status: tonic::Status) -> ClientError {
    let failure = std::error::Error::source(&status).and_then(|e| e.downcast_ref::<Failure>());
    let detail = match failure {
        Some(Failure::Pool(slot)) => match slot.lock().take() {
            Some(e) => return ClientError::RuntimePool(e),
            None => "the runtime pool's error was read already".to_string(),
        },
        Some(Failure::Answered(status)) => {
            return ClientError::Status {
                method,
                status: status.clone(),
            }
        }
        Some(failure) => failure.to_string(),
        None => status.message().to_string(),
    };
    ClientError::Malformed { method, detail }
}

#[cfg(test)]
mod tests;
