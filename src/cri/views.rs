//! Decoded views: prost messages holding only the CRI fields crisp reads (ids, names, labels,
//! annotations, states, times). They are declared in `proto/crisp/cri/views.proto`, field by
//! field as kubelet's `runtime.v1` api.proto declares them (identical in `runtime.v1alpha2`,
//! KUBELET-CRI.md §8.2), and compiled by build.rs. The fields that crisp also reads by number
//! are named in [`super::tags`], whose tests hold the views to them.
//!
//! A view is always a decoded *copy*; prost skips every field not declared, so a view can never
//! carry an env value or a registry credential (those fields are simply not in it), and it is
//! never re-encoded into a forwarded message. crisp only encodes views for calls it makes itself
//! (probes via ExecSync, status reads, job-mode stops).

use prost::Message;

include!(concat!(env!("OUT_DIR"), "/crisp.cri.views.rs"));

/// `NamespaceOption.network` of a pod on the node's network (`hostNetwork`).
const NAMESPACE_NODE: i32 = 2;

impl PodSandboxConfig {
    pub fn host_network(&self) -> bool {
        self.linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .is_some_and(|n| n.network == NAMESPACE_NODE)
    }
}

/// ContainerState enum values.
pub mod state {
    pub(crate) const CREATED: i32 = 0;
    pub const RUNNING: i32 = 1;
    pub(crate) const EXITED: i32 = 2;
    #[cfg(test)]
    pub(crate) const UNKNOWN: i32 = 3;
}

impl PodSandboxStatus {
    pub fn host_network(&self) -> bool {
        self.linux
            .as_ref()
            .and_then(|l| l.namespaces.as_ref())
            .and_then(|n| n.options.as_ref())
            .is_some_and(|o| o.network == NAMESPACE_NODE)
    }
}

/// Decodes a view, mapping prost's error to a string the caller can log.
pub fn decode<M: Message + Default>(buf: &[u8]) -> Result<M, prost::DecodeError> {
    M::decode(buf)
}
