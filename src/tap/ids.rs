//! Who a call is about — sandbox and container ids, pod and container names, image — read
//! straight off the wire bytes of its request and response (a few top-level fields, no decode
//! of the whole message), then completed from the ordering engine's caches.

use crate::cri::patch::fields;
use crate::cri::Rpc;
use crate::intercept::PodNames;

/// The names and ids shown for one call. Empty when unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ids {
    pub pod_sandbox_id: String,
    pub container_id: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub container_name: String,
    pub image: String,
}

impl Ids {
    /// Fills the fields still empty from `other` (what was known earlier in the call).
    pub fn fill_from(&mut self, other: Ids) {
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
        let f = fields(cur).filter_map(Result::ok).find(|f| f.number == *n && f.wire_type == 2)?;
        cur = &cur[f.payload.0..f.payload.1];
    }
    Some(cur)
}

fn string_at(buf: &[u8], path: &[u32]) -> String {
    sub(buf, path).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or_default().to_string()
}

/// Pod namespace and name from a PodSandboxMetadata (name = 1, namespace = 3).
fn pod_metadata(ids: &mut Ids, md: Option<&[u8]>) {
    if let Some(md) = md {
        ids.pod_name = string_at(md, &[1]);
        ids.pod_namespace = string_at(md, &[3]);
    }
}

/// What the request (and, when it was read, the response) of `rpc` says. Field numbers are the
/// same in runtime.v1 and runtime.v1alpha2.
pub fn from_messages(rpc: Option<Rpc>, req: Option<&[u8]>, resp: Option<&[u8]>) -> Ids {
    let mut ids = Ids::default();
    let (Some(rpc), Some(req)) = (rpc, req) else { return ids };
    match rpc {
        Rpc::RunPodSandbox => {
            pod_metadata(&mut ids, sub(req, &[1, 1]));
            if let Some(r) = resp {
                ids.pod_sandbox_id = string_at(r, &[1]);
            }
        }
        Rpc::CreateContainer => {
            ids.pod_sandbox_id = string_at(req, &[1]);
            ids.container_name = string_at(req, &[2, 1, 1]);
            // ImageSpec.user_specified_image (18, kubelet ≥ 1.30) is what the pod spec says;
            // `image` is usually the resolved image id.
            ids.image = string_at(req, &[2, 2, 18]);
            if ids.image.is_empty() {
                ids.image = string_at(req, &[2, 2, 1]);
            }
            pod_metadata(&mut ids, sub(req, &[3, 1]));
            if let Some(r) = resp {
                ids.container_id = string_at(r, &[1]);
            }
        }
        Rpc::PullImage => {
            ids.image = string_at(req, &[1, 1]);
            pod_metadata(&mut ids, sub(req, &[3, 1]));
        }
        Rpc::ImageStatus | Rpc::RemoveImage => ids.image = string_at(req, &[1, 1]),
        Rpc::StopPodSandbox | Rpc::RemovePodSandbox | Rpc::PodSandboxStatus | Rpc::PodSandboxStats | Rpc::PortForward | Rpc::UpdatePodSandboxResources => {
            ids.pod_sandbox_id = string_at(req, &[1]);
            if rpc == Rpc::PodSandboxStatus {
                pod_metadata(&mut ids, resp.and_then(|r| sub(r, &[1, 2])));
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
            ids.container_id = string_at(req, &[1]);
            if rpc == Rpc::ContainerStatus {
                if let Some(r) = resp {
                    ids.container_name = string_at(r, &[1, 2, 1]);
                }
            }
        }
        // ContainerFilter.pod_sandbox_id: a List scoped to one pod (the ordering engine's own).
        Rpc::ListContainers => ids.pod_sandbox_id = string_at(req, &[1, 3]),
        _ => {}
    }
    ids
}

/// Fills what the messages did not say from what tracks pods (the ordering engine's caches,
/// never the runtime).
pub fn complete(ids: &mut Ids, names: &dyn PodNames) {
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
        let md = c::PodSandboxMetadata { name: "web".into(), namespace: "shop".into(), uid: "u".into(), attempt: 0 };
        let req = c::CreateContainerRequest {
            pod_sandbox_id: "sb1".into(),
            config: Some(c::ContainerConfig {
                metadata: Some(c::ContainerMetadata { name: "app".into(), attempt: 1 }),
                image: Some(c::ImageSpec { image: "nginx:1".into(), ..Default::default() }),
                ..Default::default()
            }),
            sandbox_config: Some(c::PodSandboxConfig { metadata: Some(md.clone()), ..Default::default() }),
        };
        let resp = c::CreateContainerResponse { container_id: "ctr1".into() };
        let ids = from_messages(Some(Rpc::CreateContainer), Some(&req.encode_to_vec()), Some(&resp.encode_to_vec()));
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
        let run = c::RunPodSandboxRequest { config: Some(c::PodSandboxConfig { metadata: Some(md), ..Default::default() }), ..Default::default() };
        let ids = from_messages(Some(Rpc::RunPodSandbox), Some(&run.encode_to_vec()), None);
        assert_eq!((ids.pod_namespace.as_str(), ids.pod_name.as_str()), ("shop", "web"));
        let stop = c::StopContainerRequest { container_id: "ctr1".into(), timeout: 30 };
        assert_eq!(from_messages(Some(Rpc::StopContainer), Some(&stop.encode_to_vec()), None).container_id, "ctr1");
        assert_eq!(from_messages(None, Some(&stop.encode_to_vec()), None), Ids::default());
        // Garbage never panics.
        assert_eq!(from_messages(Some(Rpc::CreateContainer), Some(&[0x0a, 0xff]), None), Ids::default());
    }
}
