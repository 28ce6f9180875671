//! The CRI client: kubelet's `remote_runtime.go` / `remote_image.go` in one type, for both
//! `runtime.v1` and `runtime.v1alpha2`, with kubelet's per-method deadlines and a call journal.
//!
//! One implementation serves both API versions: the protos are wire-identical apart from the gRPC
//! service path (KUBELET-CRI §8.1), so requests are `k8s_cri::v1` messages sent to a path prefix
//! chosen at connect time.

use std::path::Path;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::journal::{CallMeta, Journal};
use tonic_prost::ProstCodec;

/// kubelet's maximum gRPC message size (`remote.maxMsgSize`, 16 MiB).
const MAX_MSG_SIZE: usize = 16 * 1024 * 1024;

/// `kubeRuntimeAPIVersion`: the `version` a runtime must answer (KUBELET-CRI §7.5).
pub const KUBE_RUNTIME_API_VERSION: &str = "0.1.0";

/// Which CRI API version to speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiVersion {
    /// `runtime.v1` only, as kubelet 1.26+ (Unimplemented is fatal; KUBELET-CRI §7.5).
    V1,
    /// `runtime.v1alpha2` only, as kubelet 1.20–1.22.
    V1alpha2,
    /// kubelet 1.23–1.25: probe v1 (runtime: `Version`, image: `ImageFsInfo`) and fall back to
    /// v1alpha2 on `Unimplemented`, separately for each service (KUBELET-CRI §7.5).
    Negotiate,
}

impl std::str::FromStr for ApiVersion {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "v1" => Ok(ApiVersion::V1),
            "v1alpha2" => Ok(ApiVersion::V1alpha2),
            "negotiate" => Ok(ApiVersion::Negotiate),
            other => anyhow::bail!(
                "unknown CRI API version {other:?} (expected v1, v1alpha2 or negotiate)"
            ),
        }
    }
}

/// The protocol package a service ended up on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Package {
    /// `runtime.v1`
    V1,
    /// `runtime.v1alpha2`
    V1alpha2,
}

impl Package {
    fn prefix(self, service: Service) -> &'static str {
        match (self, service) {
            (Package::V1, Service::Runtime) => "/runtime.v1.RuntimeService/",
            (Package::V1, Service::Image) => "/runtime.v1.ImageService/",
            (Package::V1alpha2, Service::Runtime) => "/runtime.v1alpha2.RuntimeService/",
            (Package::V1alpha2, Service::Image) => "/runtime.v1alpha2.ImageService/",
        }
    }
}

/// The two CRI services.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// RuntimeService
    Runtime,
    /// ImageService
    Image,
}

/// Connects a tonic channel to a gRPC server on a unix socket, as kubelet dials its CRI endpoint.
pub async fn connect_uds(socket: &Path) -> anyhow::Result<Channel> {
    crate::harness::cri_channel(socket).await
}

/// A CRI client with kubelet's deadlines. Cheap to clone.
#[derive(Clone, Debug)]
pub struct CriClient {
    runtime: Channel,
    image: Channel,
    runtime_pkg: Package,
    image_pkg: Package,
    /// `--runtime-request-timeout` (`r.timeout`, default 2 min; KUBELET-CRI §3.3).
    request_timeout: Duration,
    journal: Journal,
}

// === impl CriClient ===

impl CriClient {
    /// Builds the client and performs kubelet's start-up handshake for `api` (KUBELET-CRI §7.5):
    /// - `V1`: `Version` on v1 and `ImageFsInfo` on v1 must succeed;
    /// - `Negotiate`: the same probes, falling back per service to v1alpha2 on `Unimplemented`;
    /// - `V1alpha2`: no probe.
    ///
    /// Then `Version{version: "0.1.0"}` on the chosen runtime package, whose answer must be
    /// `0.1.0` (`getTypedVersion`).
    ///
    /// kubelet dials the runtime and image services separately (KUBELET-CRI §7.1), hence two channels
    /// (they may be clones of one).
    pub async fn connect(
        runtime: Channel,
        image: Channel,
        api: ApiVersion,
        request_timeout: Duration,
        journal: Journal,
    ) -> anyhow::Result<CriClient> {
        let initial = match api {
            ApiVersion::V1alpha2 => Package::V1alpha2,
            ApiVersion::V1 | ApiVersion::Negotiate => Package::V1,
        };
        let mut client = CriClient {
            runtime,
            image,
            runtime_pkg: initial,
            image_pkg: initial,
            request_timeout,
            journal,
        };
        if api != ApiVersion::V1alpha2 {
            let probe = client.version_request(String::new()).await;
            match probe {
                Ok(_) => {}
                Err(s) if s.code() == Code::Unimplemented && api == ApiVersion::Negotiate => {
                    tracing::info!("falling back to the v1alpha2 runtime API");
                    client.runtime_pkg = Package::V1alpha2;
                }
                Err(s) => {
                    return Err(anyhow::anyhow!(
                        "validate CRI v1 runtime API for endpoint: {}",
                        go_error(&s)
                    ))
                }
            }
            match client.image_fs_info().await {
                Ok(_) => {}
                Err(s) if s.code() == Code::Unimplemented && api == ApiVersion::Negotiate => {
                    tracing::info!("falling back to the v1alpha2 image API");
                    client.image_pkg = Package::V1alpha2;
                }
                Err(s) => {
                    return Err(anyhow::anyhow!(
                        "validate CRI v1 image API for endpoint: {}",
                        go_error(&s)
                    ))
                }
            }
        }
        let v = client
            .version_request(KUBE_RUNTIME_API_VERSION.to_string())
            .await
            .map_err(|s| {
                anyhow::anyhow!("get remote runtime typed version failed: {}", go_error(&s))
            })?;
        if v.version != KUBE_RUNTIME_API_VERSION {
            anyhow::bail!("Runtime api version {} is not supported, only {KUBE_RUNTIME_API_VERSION} is supported", v.version);
        }
        Ok(client)
    }

    /// The journal every call is recorded in.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The package the runtime service speaks after negotiation.
    pub fn runtime_package(&self) -> Package {
        self.runtime_pkg
    }

    /// The package the image service speaks after negotiation.
    pub fn image_package(&self) -> Package {
        self.image_pkg
    }

    /// `r.timeout`.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Sends one unary call to `service`/`method` with `deadline` (sent as `grpc-timeout` and
    /// enforced locally as kubelet's context deadline), recording it in the journal.
    /// `on_ok` may add response-derived attribution (e.g. the new container ID).
    pub async fn unary<Req, Resp>(
        &self,
        service: Service,
        method: &'static str,
        req: Req,
        deadline: Option<Duration>,
        meta: CallMeta,
        on_ok: impl FnOnce(&Resp, &mut CallMeta),
    ) -> Result<Resp, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let (channel, pkg) = match service {
            Service::Runtime => (self.runtime.clone(), self.runtime_pkg),
            Service::Image => (self.image.clone(), self.image_pkg),
        };
        let path_str = format!("{}{}", pkg.prefix(service), method);
        let seq = self.journal.begin(method, path_str.clone(), meta, deadline);
        let result = send(channel, path_str, req, deadline).await;
        match &result {
            Ok(resp) => self
                .journal
                .finish(seq, Code::Ok, String::new(), |m| on_ok(resp, m)),
            Err(s) => self
                .journal
                .finish(seq, s.code(), s.message().to_string(), |_| {}),
        }
        result
    }

    fn rt(&self) -> Option<Duration> {
        Some(self.request_timeout)
    }

    // --- RuntimeService, with the deadlines of KUBELET-CRI §3.3 ---

    /// A RuntimeService call with deadline r.timeout whose answer (`Resp`) carries nothing.
    async fn runtime_call<Req, Resp>(
        &self,
        method: &'static str,
        req: Req,
        meta: CallMeta,
    ) -> Result<(), Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let _: Resp = self
            .unary(Service::Runtime, method, req, self.rt(), meta, |_, _| {})
            .await?;
        Ok(())
    }

    async fn version_request(&self, version: String) -> Result<cri::VersionResponse, Status> {
        let req = cri::VersionRequest { version };
        self.unary(
            Service::Runtime,
            "Version",
            req,
            self.rt(),
            CallMeta::default(),
            |_, _| {},
        )
        .await
    }

    /// Version (deadline r.timeout).
    pub async fn version(&self) -> Result<cri::VersionResponse, Status> {
        self.version_request(KUBE_RUNTIME_API_VERSION.to_string())
            .await
    }

    /// Status(verbose=false) (deadline r.timeout).
    pub async fn status(&self) -> Result<cri::StatusResponse, Status> {
        let req = cri::StatusRequest { verbose: false };
        self.unary(
            Service::Runtime,
            "Status",
            req,
            self.rt(),
            CallMeta::default(),
            |_, _| {},
        )
        .await
    }

    /// RunPodSandbox (deadline 2 × r.timeout). Returns the sandbox ID.
    pub async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: String,
        meta: CallMeta,
    ) -> Result<String, Status> {
        let attempt = config.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
        let meta = meta.with_detail(format!("attempt={attempt}"));
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler,
        };
        let deadline = Some(self.request_timeout * 2);
        let resp: cri::RunPodSandboxResponse = self
            .unary(
                Service::Runtime,
                "RunPodSandbox",
                req,
                deadline,
                meta,
                |r: &cri::RunPodSandboxResponse, m| m.sandbox_id = Some(r.pod_sandbox_id.clone()),
            )
            .await?;
        Ok(resp.pod_sandbox_id)
    }

    /// StopPodSandbox (deadline r.timeout).
    pub async fn stop_pod_sandbox(&self, id: &str, meta: CallMeta) -> Result<(), Status> {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.runtime_call::<_, cri::StopPodSandboxResponse>(
            "StopPodSandbox",
            req,
            meta.with_sandbox_id(id),
        )
        .await
    }

    /// RemovePodSandbox (deadline r.timeout).
    pub async fn remove_pod_sandbox(&self, id: &str, meta: CallMeta) -> Result<(), Status> {
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.runtime_call::<_, cri::RemovePodSandboxResponse>(
            "RemovePodSandbox",
            req,
            meta.with_sandbox_id(id),
        )
        .await
    }

    /// PodSandboxStatus(verbose=false) (deadline r.timeout).
    pub async fn pod_sandbox_status(
        &self,
        id: &str,
        meta: CallMeta,
    ) -> Result<cri::PodSandboxStatusResponse, Status> {
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: false,
        };
        let meta = meta.with_sandbox_id(id);
        self.unary(
            Service::Runtime,
            "PodSandboxStatus",
            req,
            self.rt(),
            meta,
            |_, _| {},
        )
        .await
    }

    /// ListPodSandbox (deadline r.timeout). kubelet's relist sends no filter at all.
    pub async fn list_pod_sandbox(
        &self,
        filter: Option<cri::PodSandboxFilter>,
        meta: CallMeta,
    ) -> Result<Vec<cri::PodSandbox>, Status> {
        let req = cri::ListPodSandboxRequest { filter };
        let resp: cri::ListPodSandboxResponse = self
            .unary(
                Service::Runtime,
                "ListPodSandbox",
                req,
                self.rt(),
                meta,
                |_, _| {},
            )
            .await?;
        Ok(resp.items)
    }

    /// CreateContainer (deadline r.timeout). Returns the container ID.
    pub async fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
        meta: CallMeta,
    ) -> Result<String, Status> {
        let attempt = config.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
        let meta = meta
            .with_sandbox_id(pod_sandbox_id)
            .with_detail(format!("attempt={attempt}"));
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let resp: cri::CreateContainerResponse = self
            .unary(
                Service::Runtime,
                "CreateContainer",
                req,
                self.rt(),
                meta,
                |r: &cri::CreateContainerResponse, m| m.container_id = Some(r.container_id.clone()),
            )
            .await?;
        Ok(resp.container_id)
    }

    /// StartContainer (deadline r.timeout).
    pub async fn start_container(&self, id: &str, meta: CallMeta) -> Result<(), Status> {
        let req = cri::StartContainerRequest {
            container_id: id.to_string(),
        };
        self.runtime_call::<_, cri::StartContainerResponse>(
            "StartContainer",
            req,
            meta.with_container_id(id),
        )
        .await
    }

    /// StopContainer(timeout) (deadline r.timeout + timeout seconds).
    pub async fn stop_container(
        &self,
        id: &str,
        timeout: i64,
        meta: CallMeta,
    ) -> Result<(), Status> {
        let req = cri::StopContainerRequest {
            container_id: id.to_string(),
            timeout,
        };
        let meta = meta
            .with_container_id(id)
            .with_detail(format!("timeout={timeout}"));
        let deadline = Some(stop_deadline(self.request_timeout, timeout));
        let _: cri::StopContainerResponse = self
            .unary(
                Service::Runtime,
                "StopContainer",
                req,
                deadline,
                meta,
                |_, _| {},
            )
            .await?;
        Ok(())
    }

    /// RemoveContainer (deadline r.timeout).
    pub async fn remove_container(&self, id: &str, meta: CallMeta) -> Result<(), Status> {
        let req = cri::RemoveContainerRequest {
            container_id: id.to_string(),
        };
        self.runtime_call::<_, cri::RemoveContainerResponse>(
            "RemoveContainer",
            req,
            meta.with_container_id(id),
        )
        .await
    }

    /// ListContainers (deadline r.timeout). kubelet's relist sends an *empty* filter, not none.
    pub async fn list_containers(
        &self,
        filter: Option<cri::ContainerFilter>,
        meta: CallMeta,
    ) -> Result<Vec<cri::Container>, Status> {
        let req = cri::ListContainersRequest { filter };
        let resp: cri::ListContainersResponse = self
            .unary(
                Service::Runtime,
                "ListContainers",
                req,
                self.rt(),
                meta,
                |_, _| {},
            )
            .await?;
        Ok(resp.containers)
    }

    /// ContainerStatus(verbose=false) (deadline r.timeout).
    pub async fn container_status(
        &self,
        id: &str,
        meta: CallMeta,
    ) -> Result<cri::ContainerStatusResponse, Status> {
        let req = cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        };
        let meta = meta.with_container_id(id);
        self.unary(
            Service::Runtime,
            "ContainerStatus",
            req,
            self.rt(),
            meta,
            |_, _| {},
        )
        .await
    }

    /// ExecSync(cmd, timeout): deadline r.timeout + timeout, and **none** when timeout = 0, which is
    /// how lifecycle hooks call it (KUBELET-CRI §3.3, §6).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: i64,
        meta: CallMeta,
    ) -> Result<cri::ExecSyncResponse, Status> {
        let deadline = if timeout == 0 {
            None
        } else {
            Some(self.request_timeout + Duration::from_secs(timeout.max(0) as u64))
        };
        let meta = meta.with_container_id(id);
        let req = cri::ExecSyncRequest {
            container_id: id.to_string(),
            cmd,
            timeout,
        };
        self.unary(Service::Runtime, "ExecSync", req, deadline, meta, |_, _| {})
            .await
    }

    // --- ImageService ---

    /// ImageStatus(verbose=false) (deadline r.timeout).
    pub async fn image_status(
        &self,
        image: cri::ImageSpec,
        meta: CallMeta,
    ) -> Result<cri::ImageStatusResponse, Status> {
        let meta = meta.with_detail(image.image.clone());
        let req = cri::ImageStatusRequest {
            image: Some(image),
            verbose: false,
        };
        self.unary(
            Service::Image,
            "ImageStatus",
            req,
            self.rt(),
            meta,
            |_, _| {},
        )
        .await
    }

    /// PullImage (no deadline). Returns the image ref.
    pub async fn pull_image(
        &self,
        image: cri::ImageSpec,
        sandbox_config: Option<cri::PodSandboxConfig>,
        meta: CallMeta,
    ) -> Result<String, Status> {
        let meta = meta.with_detail(image.image.clone());
        let req = cri::PullImageRequest {
            image: Some(image),
            auth: None,
            sandbox_config,
        };
        let resp: cri::PullImageResponse = self
            .unary(Service::Image, "PullImage", req, None, meta, |_, _| {})
            .await?;
        Ok(resp.image_ref)
    }

    /// ImageFsInfo (no deadline).
    pub async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse, Status> {
        self.unary(
            Service::Image,
            "ImageFsInfo",
            cri::ImageFsInfoRequest {},
            None,
            CallMeta::default(),
            |_, _| {},
        )
        .await
    }
}

/// Sends one unary call and applies the deadline the way kubelet's context does.
async fn send<Req, Resp>(
    channel: Channel,
    path: String,
    req: Req,
    deadline: Option<Duration>,
) -> Result<Resp, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let path = PathAndQuery::try_from(path)
        .map_err(|e| Status::internal(format!("bad gRPC path: {e}")))?;
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(MAX_MSG_SIZE)
        .max_encoding_message_size(MAX_MSG_SIZE);
    let mut request = tonic::Request::new(req);
    if let Some(d) = deadline {
        // Sends `grpc-timeout`, as grpc-go does for a context deadline.
        request.set_timeout(d);
    }
    let call = async move {
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("connection error: {e}")))?;
        grpc.unary(request, path, ProstCodec::<Req, Resp>::default())
            .await
    };
    let result = match deadline {
        // Dropping the call on expiry resets the HTTP/2 stream (RST_STREAM CANCEL), as grpc-go does
        // when the context expires.
        Some(d) => match tokio::time::timeout(d, call).await {
            Ok(r) => r,
            Err(_) => Err(deadline_exceeded()),
        },
        None => call.await,
    };
    result.map(tonic::Response::into_inner).map_err(normalize)
}

fn deadline_exceeded() -> Status {
    // grpc-go's client-side message for an expired context (KUBELET-CRI §7.3).
    Status::deadline_exceeded("context deadline exceeded")
}

/// tonic's channel enforces `grpc-timeout` itself and reports it as `Cancelled: Timeout expired`;
/// kubelet sees `DeadlineExceeded` in that case.
fn normalize(s: Status) -> Status {
    if s.code() == Code::Cancelled && s.message().contains("Timeout expired") {
        return deadline_exceeded();
    }
    s
}

/// A gRPC status as grpc-go prints it (`rpc error: code = NotFound desc = …`), which is what
/// kubelet puts into sync errors and events.
pub fn go_error(s: &Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        go_code_name(s.code()),
        s.message()
    )
}

/// grpc-go's `codes.Code.String()`.
pub fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// kubelet's StopContainer deadline, `r.timeout + time.Duration(timeout)*time.Second`, computed
/// as Go computes it: in int64 nanoseconds, wrapping. A pod's terminationGracePeriodSeconds is
/// any int64 ≥ 0, so a huge one wraps (i64::MAX seconds → −1 s → a deadline of r.timeout − 1 s);
/// a sum ≤ 0 is a context that has already expired.
pub fn stop_deadline(request_timeout: Duration, timeout: i64) -> Duration {
    let base = i64::try_from(request_timeout.as_nanos()).unwrap_or(i64::MAX);
    let ns = base.wrapping_add(timeout.wrapping_mul(1_000_000_000));
    Duration::from_nanos(ns.max(0) as u64)
}

#[cfg(test)]
mod stop_deadline_tests {
    use super::*;

    #[test]
    fn wraps_as_go_does() {
        let r = Duration::from_secs(120);
        assert_eq!(stop_deadline(r, 30), Duration::from_secs(150));
        assert_eq!(stop_deadline(r, 0), r);
        // (2^63 − 1) × 10^9 ≡ −10^9 (mod 2^64).
        assert_eq!(stop_deadline(r, i64::MAX), Duration::from_secs(119));
        assert_eq!(stop_deadline(r, -200), Duration::ZERO);
    }
}
