//! Who a call is about — sandbox and container ids, pod and container names, image — read
//! straight off the wire bytes of its request and response (a few top-level fields, no decode
//! of the whole message), then completed from the ordering engine's caches.

use crate::cri::patch::fields;
use crate::cri::tags::{
    container_config, container_filter, container_id_request, container_metadata, container_status,
    container_status_response, create_container_request, create_container_response, image_request,
    image_spec, list_containers_request, pod_sandbox_config, pod_sandbox_id_request,
    pod_sandbox_metadata, pod_sandbox_status, pod_sandbox_status_response, pull_image_request,
    run_pod_sandbox_request, run_pod_sandbox_response,
};
use crate::cri::Rpc;
use crate::intercept::PodNames;

/// The names and ids shown for one call. Empty when unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ids {
    pub(crate) pod_sandbox_id: String,
    pub(crate) container_id: String,
    pub(crate) pod_namespace: String,
    pub(crate) pod_name: String,
    pub(crate) container_name: String,
    pub(crate) image: String,
}

impl Ids {
    /// Fills the fields still empty from `other` (what was known earlier in the call).
    pub(crate) fn fill_from(&mut self, other: Ids) {
        let fill = |mine: &mut String, theirs: String| {
            if mine.is_empty() {
                *mine = theirs;
            }
        };
        fill(&mut self.pod_sandbox_id, other.pod_sandbox_id);
        fill(&mut self.container_id, other.container_id);
        fill(&mut self.pod_namespace, other.pod_namespace);
        fill(&mut self.pod_name, other.pod_name);
        fill(&mut self.container_name, other.container_name);
        fill(&mut self.image, other.image);
    }
}

/// The payload of the first length-delimited field at `path` (field numbers, outermost first).
fn sub<'a>(buf: &'a [u8], path: &[u32]) -> Option<&'a [u8]> {
    let mut cur = buf;
    for n in path {
        let f = fields(cur)
            .filter_map(Result::ok)
            .find(|f| f.number == *n && f.wire_type == 2)?;
        cur = &cur[f.payload.0..f.payload.1];
    }
    Some(cur)
}

fn string_at(buf: &[u8], path: &[u32]) -> String {
    sub(buf, path)
        .and_then(|b| std::str::from_utf8(b).ok())
        .unwrap_or_default()
        .to_string()
}

/// Pod namespace and name from a PodSandboxMetadata.
fn pod_metadata(ids: &mut Ids, md: Option<&[u8]>) {
    if let Some(md) = md {
        ids.pod_name = string_at(md, &[pod_sandbox_metadata::NAME]);
        ids.pod_namespace = string_at(md, &[pod_sandbox_metadata::NAMESPACE]);
    }
}

/// What the request (and, when it was read, the response) of `rpc` says. Field numbers are the
/// same in runtime.v1 and runtime.v1alpha2 ([`crate::cri::tags`]).
pub(crate) fn from_messages(rpc: Option<Rpc>, req: Option<&[u8]>, resp: Option<&[u8]>) -> Ids {
    let mut ids = Ids::default();
    let (Some(rpc), Some(req)) = (rpc, req) else {
        return ids;
    };
    match rpc {
        Rpc::RunPodSandbox => {
            pod_metadata(
                &mut ids,
                sub(
                    req,
                    &[
                        run_pod_sandbox_request::CONFIG,
                        pod_sandbox_config::METADATA,
                    ],
                ),
            );
            if let Some(r) = resp {
                ids.pod_sandbox_id = string_at(r, &[run_pod_sandbox_response::POD_SANDBOX_ID]);
            }
        }
        Rpc::CreateContainer => {
            use create_container_request::{CONFIG, POD_SANDBOX_ID, SANDBOX_CONFIG};
            ids.pod_sandbox_id = string_at(req, &[POD_SANDBOX_ID]);
            ids.container_name = string_at(
                req,
                &[CONFIG, container_config::METADATA, container_metadata::NAME],
            );
            // ImageSpec.user_specified_image (kubelet ≥ 1.30) is what the pod spec says;
            // `image` is usually the resolved image id.
            ids.image = string_at(
                req,
                &[
                    CONFIG,
                    container_config::IMAGE,
                    image_spec::USER_SPECIFIED_IMAGE,
                ],
            );
            if ids.image.is_empty() {
                ids.image = string_at(req, &[CONFIG, container_config::IMAGE, image_spec::IMAGE]);
            }
            pod_metadata(
                &mut ids,
                sub(req, &[SANDBOX_CONFIG, pod_sandbox_config::METADATA]),
            );
            if let Some(r) = resp {
                ids.container_id = string_at(r, &[create_container_response::CONTAINER_ID]);
            }
        }
        Rpc::PullImage => {
            ids.image = string_at(req, &[pull_image_request::IMAGE, image_spec::IMAGE]);
            pod_metadata(
                &mut ids,
                sub(
                    req,
                    &[
                        pull_image_request::SANDBOX_CONFIG,
                        pod_sandbox_config::METADATA,
                    ],
                ),
            );
        }
        Rpc::ImageStatus | Rpc::RemoveImage => {
            ids.image = string_at(req, &[image_request::IMAGE, image_spec::IMAGE])
        }
        Rpc::StopPodSandbox
        | Rpc::RemovePodSandbox
        | Rpc::PodSandboxStatus
        | Rpc::PodSandboxStats
        | Rpc::PortForward
        | Rpc::UpdatePodSandboxResources => {
            ids.pod_sandbox_id = string_at(req, &[pod_sandbox_id_request::POD_SANDBOX_ID]);
            if rpc == Rpc::PodSandboxStatus {
                pod_metadata(
                    &mut ids,
                    resp.and_then(|r| {
                        sub(
                            r,
                            &[
                                pod_sandbox_status_response::STATUS,
                                pod_sandbox_status::METADATA,
                            ],
                        )
                    }),
                );
            }
        }
        Rpc::StartContainer
        | Rpc::StopContainer
        | Rpc::RemoveContainer
        | Rpc::ContainerStatus
        | Rpc::UpdateContainerResources
        | Rpc::ReopenContainerLog
        | Rpc::ExecSync
        | Rpc::Exec
        | Rpc::Attach
        | Rpc::ContainerStats
        | Rpc::CheckpointContainer => {
            ids.container_id = string_at(req, &[container_id_request::CONTAINER_ID]);
            if rpc == Rpc::ContainerStatus {
                if let Some(r) = resp {
                    ids.container_name = string_at(
                        r,
                        &[
                            container_status_response::STATUS,
                            container_status::METADATA,
                            container_metadata::NAME,
                        ],
                    );
                }
            }
        }
        // ContainerFilter.pod_sandbox_id: a List scoped to one pod (the ordering engine's own).
        Rpc::ListContainers => {
            ids.pod_sandbox_id = string_at(
                req,
                &[
                    list_containers_request::FILTER,
                    container_filter::POD_SANDBOX_ID,
                ],
            )
        }
        _ => {}
    }
    ids
}

/// Fills what the messages did not say from what tracks pods (the ordering engine's caches,
/// never the runtime).
pub(crate) fn complete(ids: &mut Ids, names: &dyn PodNames) {
    let have_pod = !ids.pod_name.is_empty();
    let have_container = ids.container_id.is_empty() || !ids.container_name.is_empty();
    if have_pod && have_container {
        return;
    }
    let sandbox = (!ids.pod_sandbox_id.is_empty()).then_some(ids.pod_sandbox_id.as_str());
    let container = (!ids.container_id.is_empty()).then_some(ids.container_id.as_str());
    let (pod, c) = names.names(sandbox, container);
    if let Some((sandbox_id, name)) = c {
        if ids.container_name.is_empty() {
            ids.container_name = name;
        }
        if ids.pod_sandbox_id.is_empty() {
            ids.pod_sandbox_id = sandbox_id;
        }
    }
    if let Some((namespace, name)) = pod {
        if !have_pod {
            ids.pod_namespace = namespace;
            ids.pod_name = name;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_cri::v1 as c;
    use prost::Message;

    #[test]
    fn reads_ids_and_names_off_the_wire() {
        let md = c::PodSandboxMetadata {
            name: "web".into(),
            namespace: "shop".into(),
            uid: "u".into(),
            attempt: 0,
        };
        let req = c::CreateContainerRequest {
            pod_sandbox_id: "sb1".into(),
            config: Some(c::ContainerConfig {
                metadata: Some(c::ContainerMetadata {
                    name: "app".into(),
                    attempt: 1,
                }),
                image: Some(c::ImageSpec {
                    image: "nginx:1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sandbox_config: Some(c::PodSandboxConfig {
                metadata: Some(md.clone()),
                ..Default::default()
            }),
        };
        let resp = c::CreateContainerResponse {
            container_id: "ctr1".into(),
        };
        let ids = from_messages(
            Some(Rpc::CreateContainer),
            Some(&req.encode_to_vec()),
            Some(&resp.encode_to_vec()),
        );
        assert_eq!(
            ids,
            Ids {
                pod_sandbox_id: "sb1".into(),
                container_id: "ctr1".into(),
                pod_namespace: "shop".into(),
                pod_name: "web".into(),
                container_name: "app".into(),
                image: "nginx:1".into()
            }
        );
        let run = c::RunPodSandboxRequest {
            config: Some(c::PodSandboxConfig {
                metadata: Some(md),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ids = from_messages(Some(Rpc::RunPodSandbox), Some(&run.encode_to_vec()), None);
        assert_eq!(
            (ids.pod_namespace.as_str(), ids.pod_name.as_str()),
            ("shop", "web")
        );
        let stop = c::StopContainerRequest {
            container_id: "ctr1".into(),
            timeout: 30,
        };
        assert_eq!(
            from_messages(Some(Rpc::StopContainer), Some(&stop.encode_to_vec()), None).container_id,
            "ctr1"
        );
        assert_eq!(
            from_messages(None, Some(&stop.encode_to_vec()), None),
            Ids::default()
        );
        // Garbage never panics.
        assert_eq!(
            from_messages(Some(Rpc::CreateContainer), Some(&[0x0a, 0xff]), None),
            Ids::default()
        );
    }
}
