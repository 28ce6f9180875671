//! The CRI field numbers crisp reads or writes on the wire by number: the tap's id walk
//! (`tap::ids`), the job-mode status patch ([`super::patch`]) and the ordering engine's patches.
//! One module a CRI message, named after it; one constant a field, with the field as api.proto
//! declares it. Numbers are those of `runtime.v1`, identical in `runtime.v1alpha2`
//! (KUBELET-CRI.md §8.2).
//!
//! The decoded views ([`super::views`]) declare the same numbers where they are declared; the
//! tests below hold every view field named here to its constant, and every constant to k8s-cri's
//! generated types.

/// `/// message doc` then `module { CONSTANT: "declaration" = number, … }`: one module a message
/// (or a group of requests sharing a field), one `u32` constant a field, documented with its
/// declaration as api.proto writes it.
macro_rules! messages {
    ($($(#[$doc:meta])* $module:ident { $($constant:ident: $decl:literal = $number:literal),+ $(,)? })*) => {
        $(
            $(#[$doc])*
            pub mod $module {
                $(
                    #[doc = concat!("`", $decl, " = ", stringify!($number), "`.")]
                    pub const $constant: u32 = $number;
                )+
            }
        )*
    };
}

messages! {
    /// `PodSandboxMetadata`.
    pod_sandbox_metadata { NAME: "string name" = 1, NAMESPACE: "string namespace" = 3 }
    /// `PodSandboxConfig`.
    pod_sandbox_config { METADATA: "PodSandboxMetadata metadata" = 1 }
    /// `RunPodSandboxRequest`.
    run_pod_sandbox_request { CONFIG: "PodSandboxConfig config" = 1 }
    /// `RunPodSandboxResponse`.
    run_pod_sandbox_response { POD_SANDBOX_ID: "string pod_sandbox_id" = 1 }
    /// The requests about one sandbox: `StopPodSandboxRequest`, `RemovePodSandboxRequest`,
    /// `PodSandboxStatusRequest`, `PodSandboxStatsRequest`, `PortForwardRequest`,
    /// `UpdatePodSandboxResourcesRequest`.
    pod_sandbox_id_request { POD_SANDBOX_ID: "string pod_sandbox_id" = 1 }
    /// `ContainerMetadata`.
    container_metadata { NAME: "string name" = 1 }
    /// `ImageSpec`: `image` is usually the resolved image id in a CreateContainerRequest;
    /// `user_specified_image` (kubelet ≥ 1.30) is the image as the pod spec names it.
    image_spec { IMAGE: "string image" = 1, USER_SPECIFIED_IMAGE: "string user_specified_image" = 18 }
    /// `ContainerConfig`.
    container_config { METADATA: "ContainerMetadata metadata" = 1, IMAGE: "ImageSpec image" = 2 }
    /// `CreateContainerRequest`.
    create_container_request { POD_SANDBOX_ID: "string pod_sandbox_id" = 1, CONFIG: "ContainerConfig config" = 2, SANDBOX_CONFIG: "PodSandboxConfig sandbox_config" = 3 }
    /// `CreateContainerResponse`.
    create_container_response { CONTAINER_ID: "string container_id" = 1 }
    /// The requests about one container: `StartContainerRequest`, `StopContainerRequest`,
    /// `RemoveContainerRequest`, `ContainerStatusRequest`, `UpdateContainerResourcesRequest`,
    /// `ReopenContainerLogRequest`, `ExecSyncRequest`, `ExecRequest`, `AttachRequest`,
    /// `ContainerStatsRequest`, `CheckpointContainerRequest`.
    container_id_request { CONTAINER_ID: "string container_id" = 1 }
    /// `StopContainerRequest`: `timeout` in seconds.
    stop_container_request { TIMEOUT: "int64 timeout" = 2 }
    /// `ContainerStatus`.
    container_status { ID: "string id" = 1, METADATA: "ContainerMetadata metadata" = 2, EXIT_CODE: "int32 exit_code" = 7, REASON: "string reason" = 10 }
    /// `ContainerStatusResponse`.
    container_status_response { STATUS: "ContainerStatus status" = 1 }
    /// `PodSandboxStatus`.
    pod_sandbox_status { METADATA: "PodSandboxMetadata metadata" = 2 }
    /// `PodSandboxStatusResponse`.
    pod_sandbox_status_response { STATUS: "PodSandboxStatus status" = 1, CONTAINERS_STATUSES: "repeated ContainerStatus containers_statuses" = 3 }
    /// `ContainerEventResponse` (GetContainerEvents).
    container_event_response { CONTAINERS_STATUSES: "repeated ContainerStatus containers_statuses" = 5 }
    /// `ContainerFilter`.
    container_filter { POD_SANDBOX_ID: "string pod_sandbox_id" = 3 }
    /// `ListContainersRequest`.
    list_containers_request { FILTER: "ContainerFilter filter" = 1 }
    /// The requests about one image: `ImageStatusRequest`, `RemoveImageRequest`.
    image_request { IMAGE: "ImageSpec image" = 1 }
    /// `PullImageRequest`.
    pull_image_request { IMAGE: "ImageSpec image" = 1, SANDBOX_CONFIG: "PodSandboxConfig sandbox_config" = 3 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::views as v;
    use k8s_cri::v1 as c;
    use prost::Message;

    /// The number of the one field `m` puts on the wire (the test sets exactly one), read by
    /// prost's own decoder rather than crisp's (`cri::patch`), which these numbers serve.
    fn number(m: &impl Message) -> u32 {
        use prost::encoding::{decode_key, skip_field, DecodeContext};
        let bytes = m.encode_to_vec();
        let mut buf = bytes.as_slice();
        let (number, wire_type) = decode_key(&mut buf).unwrap();
        skip_field(wire_type, number, &mut buf, DecodeContext::default()).unwrap();
        assert!(
            buf.is_empty(),
            "the message sets more than one field: {bytes:?}"
        );
        number
    }

    fn s() -> String {
        "x".into()
    }

    fn d<T: Default>() -> T {
        T::default()
    }

    /// `constant => message [, view];`: the one field the message (and the view, where one reads
    /// it) sets has the constant's number.
    macro_rules! numbers {
        ($($constant:path => $message:expr $(, $view:expr)?;)*) => {
            $(
                assert_eq!($constant, number(&$message), "{}", stringify!($constant));
                $(assert_eq!($constant, number(&$view), "view: {}", stringify!($constant));)?
            )*
        };
    }

    /// Every constant is the CRI's number; the views' fields named here are declared with it.
    #[test]
    fn constants_are_the_cri_field_numbers_and_the_views_use_them() {
        numbers! {
        pod_sandbox_metadata::NAME => c::PodSandboxMetadata { name: s(), ..d() }, v::PodSandboxMetadata { name: s(), ..d() };
        pod_sandbox_metadata::NAMESPACE => c::PodSandboxMetadata { namespace: s(), ..d() }, v::PodSandboxMetadata { namespace: s(), ..d() };
        pod_sandbox_config::METADATA => c::PodSandboxConfig { metadata: Some(d()), ..d() }, v::PodSandboxConfig { metadata: Some(d()), ..d() };
        run_pod_sandbox_request::CONFIG => c::RunPodSandboxRequest { config: Some(d()), ..d() }, v::RunPodSandboxRequest { config: Some(d()), ..d() };
        run_pod_sandbox_response::POD_SANDBOX_ID => c::RunPodSandboxResponse { pod_sandbox_id: s() }, v::RunPodSandboxResponse { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::StopPodSandboxRequest { pod_sandbox_id: s() }, v::PodSandboxIdRequest { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::RemovePodSandboxRequest { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::PodSandboxStatusRequest { pod_sandbox_id: s(), ..d() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::PodSandboxStatsRequest { pod_sandbox_id: s() };
        pod_sandbox_id_request::POD_SANDBOX_ID => c::PortForwardRequest { pod_sandbox_id: s(), ..d() };
        container_metadata::NAME => c::ContainerMetadata { name: s(), ..d() }, v::ContainerMetadata { name: s(), ..d() };
        image_spec::IMAGE => c::ImageSpec { image: s(), ..d() }, v::ImageSpec { image: s(), ..d() };
        image_spec::USER_SPECIFIED_IMAGE => c::ImageSpec { user_specified_image: s(), ..d() };
        container_config::METADATA => c::ContainerConfig { metadata: Some(d()), ..d() }, v::ContainerConfig { metadata: Some(d()), ..d() };
        container_config::IMAGE => c::ContainerConfig { image: Some(d()), ..d() };
        create_container_request::POD_SANDBOX_ID => c::CreateContainerRequest { pod_sandbox_id: s(), ..d() }, v::CreateContainerRequest { pod_sandbox_id: s(), ..d() };
        create_container_request::CONFIG => c::CreateContainerRequest { config: Some(d()), ..d() }, v::CreateContainerRequest { config: Some(d()), ..d() };
        create_container_request::SANDBOX_CONFIG => c::CreateContainerRequest { sandbox_config: Some(d()), ..d() }, v::CreateContainerRequest { sandbox_config: Some(d()), ..d() };
        create_container_response::CONTAINER_ID => c::CreateContainerResponse { container_id: s() }, v::CreateContainerResponse { container_id: s() };
        container_id_request::CONTAINER_ID => c::StartContainerRequest { container_id: s() }, v::ContainerIdRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::StopContainerRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::RemoveContainerRequest { container_id: s() };
        container_id_request::CONTAINER_ID => c::ContainerStatusRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::UpdateContainerResourcesRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::ReopenContainerLogRequest { container_id: s() };
        container_id_request::CONTAINER_ID => c::ExecSyncRequest { container_id: s(), ..d() }, v::ExecSyncRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::ExecRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::AttachRequest { container_id: s(), ..d() };
        container_id_request::CONTAINER_ID => c::ContainerStatsRequest { container_id: s() };
        container_id_request::CONTAINER_ID => c::CheckpointContainerRequest { container_id: s(), ..d() };
        stop_container_request::TIMEOUT => c::StopContainerRequest { timeout: 1, ..d() }, v::ContainerIdRequest { timeout: 1, ..d() };
        container_status::ID => c::ContainerStatus { id: s(), ..d() }, v::ContainerStatus { id: s(), ..d() };
        container_status::METADATA => c::ContainerStatus { metadata: Some(d()), ..d() }, v::ContainerStatus { metadata: Some(d()), ..d() };
        container_status::EXIT_CODE => c::ContainerStatus { exit_code: 1, ..d() }, v::ContainerStatus { exit_code: 1, ..d() };
        container_status::REASON => c::ContainerStatus { reason: s(), ..d() }, v::ContainerStatus { reason: s(), ..d() };
        container_status_response::STATUS => c::ContainerStatusResponse { status: Some(d()), ..d() }, v::ContainerStatusResponse { status: Some(d()) };
        pod_sandbox_status::METADATA => c::PodSandboxStatus { metadata: Some(d()), ..d() }, v::PodSandboxStatus { metadata: Some(d()), ..d() };
        pod_sandbox_status_response::STATUS => c::PodSandboxStatusResponse { status: Some(d()), ..d() }, v::PodSandboxStatusResponse { status: Some(d()), ..d() };
        pod_sandbox_status_response::CONTAINERS_STATUSES => c::PodSandboxStatusResponse { containers_statuses: vec![d()], ..d() }, v::PodSandboxStatusResponse { containers_statuses: vec![d()], ..d() };
        container_event_response::CONTAINERS_STATUSES => c::ContainerEventResponse { containers_statuses: vec![d()], ..d() }, v::ContainerEventResponse { containers_statuses: vec![d()], ..d() };
        container_filter::POD_SANDBOX_ID => c::ContainerFilter { pod_sandbox_id: s(), ..d() }, v::ContainerFilter { pod_sandbox_id: s(), ..d() };
        list_containers_request::FILTER => c::ListContainersRequest { filter: Some(d()) }, v::ListContainersRequest { filter: Some(d()) };
        image_request::IMAGE => c::ImageStatusRequest { image: Some(d()), ..d() }, v::ImageStatusRequest { image: Some(d()) };
        image_request::IMAGE => c::RemoveImageRequest { image: Some(d()) };
        pull_image_request::IMAGE => c::PullImageRequest { image: Some(d()), ..d() }, v::PullImageRequest { image: Some(d()), ..d() };
        pull_image_request::SANDBOX_CONFIG => c::PullImageRequest { sandbox_config: Some(d()), ..d() }, v::PullImageRequest { sandbox_config: Some(d()), ..d() };
        }
    }
}
