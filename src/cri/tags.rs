//! The CRI field numbers crisp reads or writes on the wire by number: the tap's id walk
//! (`tap::ids`), the job-mode status patch ([`super::patch`]) and the ordering engine's patches.
//! One module a CRI message, named after it; one constant a field, with the field as api.proto
//! declares it. Numbers are those of `runtime.v1`, identical in `runtime.v1alpha2`
//! (KUBELET-CRI.md §8.2).
//!
//! The decoded views ([`super::views`]) declare the same numbers in their `#[prost(tag = "N")]`
//! attributes, which take only a literal; the tests below hold every view field named here to
//! its constant, and every constant to k8s-cri's generated types.

/// `PodSandboxMetadata`.
pub mod pod_sandbox_metadata {
    /// `string name = 1`.
    pub const NAME: u32 = 1;
    /// `string namespace = 3`.
    pub const NAMESPACE: u32 = 3;
}

/// `PodSandboxConfig`.
pub mod pod_sandbox_config {
    /// `PodSandboxMetadata metadata = 1`.
    pub const METADATA: u32 = 1;
}

/// `RunPodSandboxRequest`.
pub mod run_pod_sandbox_request {
    /// `PodSandboxConfig config = 1`.
    pub const CONFIG: u32 = 1;
}

/// `RunPodSandboxResponse`.
pub mod run_pod_sandbox_response {
    /// `string pod_sandbox_id = 1`.
    pub const POD_SANDBOX_ID: u32 = 1;
}

/// The requests about one sandbox: `StopPodSandboxRequest`, `RemovePodSandboxRequest`,
/// `PodSandboxStatusRequest`, `PodSandboxStatsRequest`, `PortForwardRequest`,
/// `UpdatePodSandboxResourcesRequest`.
pub mod pod_sandbox_id_request {
    /// `string pod_sandbox_id = 1`.
    pub const POD_SANDBOX_ID: u32 = 1;
}

/// `ContainerMetadata`.
pub mod container_metadata {
    /// `string name = 1`.
    pub const NAME: u32 = 1;
}

/// `ImageSpec`.
pub mod image_spec {
    /// `string image = 1`: usually the resolved image id in a CreateContainerRequest.
    pub const IMAGE: u32 = 1;
    /// `string user_specified_image = 18` (kubelet ≥ 1.30): the image as the pod spec names it.
    pub const USER_SPECIFIED_IMAGE: u32 = 18;
}

/// `ContainerConfig`.
pub mod container_config {
    /// `ContainerMetadata metadata = 1`.
    pub const METADATA: u32 = 1;
    /// `ImageSpec image = 2`.
    pub const IMAGE: u32 = 2;
}

/// `CreateContainerRequest`.
pub mod create_container_request {
    /// `string pod_sandbox_id = 1`.
    pub const POD_SANDBOX_ID: u32 = 1;
    /// `ContainerConfig config = 2`.
    pub const CONFIG: u32 = 2;
    /// `PodSandboxConfig sandbox_config = 3`.
    pub const SANDBOX_CONFIG: u32 = 3;
}

/// `CreateContainerResponse`.
pub mod create_container_response {
    /// `string container_id = 1`.
    pub const CONTAINER_ID: u32 = 1;
}

/// The requests about one container: `StartContainerRequest`, `StopContainerRequest`,
/// `RemoveContainerRequest`, `ContainerStatusRequest`, `UpdateContainerResourcesRequest`,
/// `ReopenContainerLogRequest`, `ExecSyncRequest`, `ExecRequest`, `AttachRequest`,
/// `ContainerStatsRequest`, `CheckpointContainerRequest`.
pub mod container_id_request {
    /// `string container_id = 1`.
    pub const CONTAINER_ID: u32 = 1;
}

/// `StopContainerRequest`.
pub mod stop_container_request {
    /// `int64 timeout = 2` (seconds).
    pub const TIMEOUT: u32 = 2;
}

/// `ContainerStatus`.
pub mod container_status {
    /// `string id = 1`.
    pub const ID: u32 = 1;
    /// `ContainerMetadata metadata = 2`.
    pub const METADATA: u32 = 2;
    /// `int32 exit_code = 7`.
    pub const EXIT_CODE: u32 = 7;
    /// `string reason = 10`.
    pub const REASON: u32 = 10;
}

/// `ContainerStatusResponse`.
pub mod container_status_response {
    /// `ContainerStatus status = 1`.
    pub const STATUS: u32 = 1;
}

/// `PodSandboxStatus`.
pub mod pod_sandbox_status {
    /// `PodSandboxMetadata metadata = 2`.
    pub const METADATA: u32 = 2;
}

/// `PodSandboxStatusResponse`.
pub mod pod_sandbox_status_response {
    /// `PodSandboxStatus status = 1`.
    pub const STATUS: u32 = 1;
    /// `repeated ContainerStatus containers_statuses = 3`.
    pub const CONTAINERS_STATUSES: u32 = 3;
}

/// `ContainerEventResponse` (GetContainerEvents).
pub mod container_event_response {
    /// `repeated ContainerStatus containers_statuses = 5`.
    pub const CONTAINERS_STATUSES: u32 = 5;
}

/// `ContainerFilter`.
pub mod container_filter {
    /// `string pod_sandbox_id = 3`.
    pub const POD_SANDBOX_ID: u32 = 3;
}

/// `ListContainersRequest`.
pub mod list_containers_request {
    /// `ContainerFilter filter = 1`.
    pub const FILTER: u32 = 1;
}

/// The requests about one image: `ImageStatusRequest`, `RemoveImageRequest`.
pub mod image_request {
    /// `ImageSpec image = 1`.
    pub const IMAGE: u32 = 1;
}

/// `PullImageRequest`.
pub mod pull_image_request {
    /// `ImageSpec image = 1`.
    pub const IMAGE: u32 = 1;
    /// `PodSandboxConfig sandbox_config = 3`.
    pub const SANDBOX_CONFIG: u32 = 3;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::patch::fields;
    use crate::cri::views as v;
    use k8s_cri::v1 as c;
    use prost::Message;

    /// The number of the one field `m` puts on the wire (the test sets exactly one).
    fn number(m: &impl Message) -> u32 {
        let bytes = m.encode_to_vec();
        let fs: Vec<_> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(fs.len(), 1, "the message sets {} fields, not one: {fs:?}", fs.len());
        fs[0].number
    }

    fn s() -> String {
        "x".into()
    }

    fn d<T: Default>() -> T {
        T::default()
    }

    /// `constant => message;`: the one field the message sets has the constant's number.
    macro_rules! numbers {
        ($($constant:path => $message:expr;)*) => {
            $(assert_eq!($constant, number(&$message), "{}", stringify!($constant));)*
        };
    }

    #[test]
    fn constants_are_the_cri_field_numbers() {
        numbers! {
        pod_sandbox_metadata::NAME => c::PodSandboxMetadata { name: s(), ..d() };
        pod_sandbox_metadata::NAMESPACE => c::PodSandboxMetadata { namespace: s(), ..d() };
        pod_sandbox_config::METADATA => c::PodSandboxConfig { metadata: Some(d()), ..d() };
        run_pod_sandbox_request::CONFIG => c::RunPodSandboxRequest { config: Some(d()), ..d() };
        run_pod_sandbox_response::POD_SANDBOX_ID => c::RunPodSandboxResponse { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::StopPodSandboxRequest { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::RemovePodSandboxRequest { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::PodSandboxStatusRequest { pod_sandbox_id: s(), ..d() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::PodSandboxStatsRequest { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::PortForwardRequest { pod_sandbox_id: s(), ..d() };
        container_metadata::NAME => c::ContainerMetadata { name: s(), ..d() };
        image_spec::IMAGE => c::ImageSpec { image: s(), ..d() };
        image_spec::USER_SPECIFIED_IMAGE => c::ImageSpec { user_specified_image: s(), ..d() };
        container_config::METADATA => c::ContainerConfig { metadata: Some(d()), ..d() };
        container_config::IMAGE => c::ContainerConfig { image: Some(d()), ..d() };
        create_container_request::POD_SANDBOX_ID => c::CreateContainerRequest { pod_sandbox_id: s(), ..d() };
        create_container_request::CONFIG => c::CreateContainerRequest { config: Some(d()), ..d() };
        create_container_request::SANDBOX_CONFIG => c::CreateContainerRequest { sandbox_config: Some(d()), ..d() };
        create_container_response::CONTAINER_ID => c::CreateContainerResponse { container_id: s() };
        container_id_request::CONTAINER_ID => c::StartContainerRequest { container_id: s() };
        container_id_request::CONTAINER_ID => c::StopContainerRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::RemoveContainerRequest { container_id: s() };
        container_id_request::CONTAINER_ID => c::ContainerStatusRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::UpdateContainerResourcesRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::ReopenContainerLogRequest { container_id: s() };
        container_id_request::CONTAINER_ID => c::ExecSyncRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::ExecRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::AttachRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::ContainerStatsRequest { container_id: s() };
        container_id_request::CONTAINER_ID => c::CheckpointContainerRequest { container_id: s(), ..d() };
        stop_container_request::TIMEOUT => c::StopContainerRequest { timeout: 1, ..d() };
        container_status::ID => c::ContainerStatus { id: s(), ..d() };
        container_status::METADATA => c::ContainerStatus { metadata: Some(d()), ..d() };
        container_status::EXIT_CODE => c::ContainerStatus { exit_code: 1, ..d() };
        container_status::REASON => c::ContainerStatus { reason: s(), ..d() };
        container_status_response::STATUS => c::ContainerStatusResponse { status: Some(d()), ..d() };
        pod_sandbox_status::METADATA => c::PodSandboxStatus { metadata: Some(d()), ..d() };
        pod_sandbox_status_response::STATUS => c::PodSandboxStatusResponse { status: Some(d()), ..d() };
        pod_sandbox_status_response::CONTAINERS_STATUSES => c::PodSandboxStatusResponse { containers_statuses: vec![d()], ..d() };
        container_event_response::CONTAINERS_STATUSES => c::ContainerEventResponse { containers_statuses: vec![d()], ..d() };
        container_filter::POD_SANDBOX_ID => c::ContainerFilter { pod_sandbox_id: s(), ..d() };
        list_containers_request::FILTER => c::ListContainersRequest { filter: Some(d()) };
        image_request::IMAGE => c::ImageStatusRequest { image: Some(d()), ..d() };
        image_request::IMAGE => c::RemoveImageRequest { image: Some(d()) };
        pull_image_request::IMAGE => c::PullImageRequest { image: Some(d()), ..d() };
        pull_image_request::SANDBOX_CONFIG => c::PullImageRequest { sandbox_config: Some(d()), ..d() };
        }
    }

    /// The views' prost attributes name these fields by literal: each must be the constant.
    #[test]
    fn views_use_the_constants() {
        numbers! {
        pod_sandbox_metadata::NAME => v::PodSandboxMetadata { name: s(), ..d() };
        pod_sandbox_metadata::NAMESPACE => v::PodSandboxMetadata { namespace: s(), ..d() };
        pod_sandbox_config::METADATA => v::PodSandboxConfig { metadata: Some(d()), ..d() };
        run_pod_sandbox_request::CONFIG => v::RunPodSandboxRequest { config: Some(d()), ..d() };
        run_pod_sandbox_response::POD_SANDBOX_ID => v::RunPodSandboxResponse { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => v::PodSandboxIdRequest { pod_sandbox_id: s() };
        container_metadata::NAME => v::ContainerMetadata { name: s(), ..d() };
        image_spec::IMAGE => v::ImageSpec { image: s(), ..d() };
        container_config::METADATA => v::ContainerConfig { metadata: Some(d()), ..d() };
        create_container_request::POD_SANDBOX_ID => v::CreateContainerRequest { pod_sandbox_id: s(), ..d() };
        create_container_request::CONFIG => v::CreateContainerRequest { config: Some(d()), ..d() };
        create_container_request::SANDBOX_CONFIG => v::CreateContainerRequest { sandbox_config: Some(d()), ..d() };
        create_container_response::CONTAINER_ID => v::CreateContainerResponse { container_id: s() };
        container_id_request::CONTAINER_ID => v::ContainerIdRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => v::ExecSyncRequest { container_id: s(), ..d() };
        stop_container_request::TIMEOUT => v::ContainerIdRequest { timeout: 1, ..d() };
        container_status::ID => v::ContainerStatus { id: s(), ..d() };
        container_status::METADATA => v::ContainerStatus { metadata: Some(d()), ..d() };
        container_status::EXIT_CODE => v::ContainerStatus { exit_code: 1, ..d() };
        container_status::REASON => v::ContainerStatus { reason: s(), ..d() };
        container_status_response::STATUS => v::ContainerStatusResponse { status: Some(d()) };
        pod_sandbox_status::METADATA => v::PodSandboxStatus { metadata: Some(d()), ..d() };
        pod_sandbox_status_response::STATUS => v::PodSandboxStatusResponse { status: Some(d()), ..d() };
        pod_sandbox_status_response::CONTAINERS_STATUSES => v::PodSandboxStatusResponse { containers_statuses: vec![d()], ..d() };
        container_event_response::CONTAINERS_STATUSES => v::ContainerEventResponse { containers_statuses: vec![d()], ..d() };
        container_filter::POD_SANDBOX_ID => v::ContainerFilter { pod_sandbox_id: s(), ..d() };
        list_containers_request::FILTER => v::ListContainersRequest { filter: Some(d()) };
        image_request::IMAGE => v::ImageStatusRequest { image: Some(d()) };
        pull_image_request::IMAGE => v::PullImageRequest { image: Some(d()), ..d() };
        pull_image_request::SANDBOX_CONFIG => v::PullImageRequest { sandbox_config: Some(d()), ..d() };
        }
    }
}
