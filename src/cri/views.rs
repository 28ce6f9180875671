//! Decoded views: prost messages holding only the CRI fields crisp reads (ids, names, labels,
//! annotations, states, times). Field numbers are those of `runtime.v1`, identical in
//! `runtime.v1alpha2` (KUBELET-CRI.md §8.2). prost's `tag` takes only a literal: the fields that
//! crisp also reads by number are named in [`super::tags`], whose tests hold these to them.
//!
//! A view is always a decoded *copy*; prost skips every field not declared here, so a view can
//! never carry an env value or a registry credential (those fields are simply not in it), and it
//! is never re-encoded into a forwarded message. crisp only encodes views for calls it makes
//! itself (probes via ExecSync, status reads, job-mode stops).

use std::collections::HashMap;

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamespaceOption {
    /// 0 = POD, 1 = CONTAINER, 2 = NODE (hostNetwork).
    #[prost(int32, tag = "1")]
    pub network: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub namespace_options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: HashMap<String, String>,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

impl PodSandboxConfig {
    pub fn host_network(&self) -> bool {
        self.linux.as_ref().and_then(|l| l.security_context.as_ref()).and_then(|s| s.namespace_options.as_ref()).is_some_and(|n| n.network == 2)
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// StopPodSandbox, RemovePodSandbox and PodSandboxStatus requests share this shape.
#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxIdRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// PodSandboxStatus with `verbose` (the runtime adds its own `info`: crisp reads the sandbox's
/// network namespace from it, `netns.rs`).
#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(map = "string, string", tag = "9")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "10")]
    pub annotations: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

/// StartContainer, StopContainer, RemoveContainer and ContainerStatus requests: `container_id`
/// is field 1 in all of them; `timeout` (field 2) only exists in StopContainer.
#[derive(Clone, PartialEq, Message)]
pub struct ContainerIdRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

/// ContainerState enum values.
pub mod state {
    pub const CREATED: i32 = 0;
    pub const RUNNING: i32 = 1;
    pub const EXITED: i32 = 2;
    pub const UNKNOWN: i32 = 3;
}

#[derive(Clone, PartialEq, Message)]
pub struct ContainerStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(int64, tag = "5")]
    pub started_at: i64,
    #[prost(int64, tag = "6")]
    pub finished_at: i64,
    #[prost(int32, tag = "7")]
    pub exit_code: i32,
    #[prost(string, tag = "10")]
    pub reason: String,
    #[prost(map = "string, string", tag = "12")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "13")]
    pub annotations: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ContainerStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodIp {
    #[prost(string, tag = "1")]
    pub ip: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxNetworkStatus {
    #[prost(string, tag = "1")]
    pub ip: String,
    #[prost(message, repeated, tag = "2")]
    pub additional_ips: Vec<PodIp>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Namespace {
    #[prost(message, optional, tag = "2")]
    pub options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxPodSandboxStatus {
    #[prost(message, optional, tag = "1")]
    pub namespaces: Option<Namespace>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// 0 = SANDBOX_READY, 1 = SANDBOX_NOTREADY.
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
    #[prost(message, optional, tag = "6")]
    pub linux: Option<LinuxPodSandboxStatus>,
    #[prost(map = "string, string", tag = "7")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "8")]
    pub annotations: HashMap<String, String>,
}

impl PodSandboxStatus {
    pub fn host_network(&self) -> bool {
        self.linux.as_ref().and_then(|l| l.namespaces.as_ref()).and_then(|n| n.options.as_ref()).is_some_and(|o| o.network == 2)
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
    /// Only in verbose answers: runtime-specific, e.g. containerd's `info` JSON.
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
    #[prost(message, repeated, tag = "3")]
    pub containers_statuses: Vec<ContainerStatus>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(int32, tag = "6")]
    pub state: i32,
    #[prost(int64, tag = "7")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "8")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "9")]
    pub annotations: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ContainerFilter {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "3")]
    pub pod_sandbox_id: String,
    #[prost(map = "string, string", tag = "4")]
    pub label_selector: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ListContainersRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ContainerFilter>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "6")]
    pub annotations: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ListPodSandboxRequest {}

#[derive(Clone, PartialEq, Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExecSyncRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, repeated, tag = "2")]
    pub cmd: Vec<String>,
    #[prost(int64, tag = "3")]
    pub timeout: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExecSyncResponse {
    #[prost(int32, tag = "3")]
    pub exit_code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct ContainerEventResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(int32, tag = "2")]
    pub container_event_type: i32,
    #[prost(message, optional, tag = "4")]
    pub pod_sandbox_status: Option<PodSandboxStatus>,
    #[prost(message, repeated, tag = "5")]
    pub containers_statuses: Vec<ContainerStatus>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
    /// kubelet's EnsureImageExists copies the pod's annotations here.
    #[prost(map = "string, string", tag = "2")]
    pub annotations: HashMap<String, String>,
}

/// ImageStatus: the image (with the pod's annotations when kubelet checks a container's image).
#[derive(Clone, PartialEq, Message)]
pub struct ImageStatusRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

/// PullImage: the image name and the pod it is pulled for. `auth` (field 2) is deliberately
/// absent so that no decoded copy can ever hold a registry credential.
#[derive(Clone, PartialEq, Message)]
pub struct PullImageRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

/// Decodes a view, mapping prost's error to a string the caller can log.
pub fn decode<M: Message + Default>(buf: &[u8]) -> Result<M, prost::DecodeError> {
    M::decode(buf)
}
