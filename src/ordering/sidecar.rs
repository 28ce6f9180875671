//! A sidecar as a pod declares it (DESIGN.md §2): its name, how crisp judges it ready, whether
//! it must exist, and the check a readiness the pod's author aimed at a host must pass. Shared
//! by the annotation contract (`annotations.rs`) and the known injectors (`injectors.rs`), so
//! neither imports the other's vocabulary.

use std::net::IpAddr;

use super::warnings::Warning;
use crate::readiness::{self, Cidr, Readiness};

/// `crisp.dev/ready.<name>`: a sidecar's readiness, written by the pod's author.
pub const READY_PREFIX: &str = "crisp.dev/ready.";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sidecar {
    pub name: String,
    pub(crate) ready: Readiness,
    /// The sidecar will exist: when it is not created yet (listed after the app) the app is
    /// refused until it is. `false` (node rules, some injectors): waited for once it exists.
    pub(crate) required: bool,
    /// `ready` came from the pod's own `crisp.dev/ready.<name>` and names a host that only the
    /// pod's addresses may be (see [`tenant_may_aim`]): checked before the first probe.
    pub(crate) tenant: Option<Box<TenantReady>>,
}

/// A readiness the pod's author wrote naming a host (not the pod IP, not loopback): it may be
/// probed only if that host turns out to be one of the pod's own IPs (known once the sandbox
/// runs) or in the operator's `[ordering] probe_allow`. Else the annotation is malformed:
/// warned about once, and `fallback` (what the sidecar's readiness is without the key) is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TenantReady {
    pub(crate) key: String,
    pub(crate) value: String,
    pub(crate) fallback: Readiness,
}

impl TenantReady {
    /// The warning for an annotation that named someone else's address.
    pub(crate) fn warning(&self, reason: String) -> Warning {
        Warning::new(
            &self.key,
            &self.value,
            format!("{reason}; using `{}`", self.fallback),
        )
    }
}

/// The check a readiness from a pod annotation must pass before crisp connects anywhere: its
/// host is the pod IP (empty), loopback or unspecified (the pod's own namespace), one of the
/// pod's IPs (`pod_ips`, from the runtime), or inside a network the operator allowed.
pub fn tenant_may_aim(ready: &Readiness, pod_ips: &[IpAddr], allow: &[Cidr]) -> Result<(), String> {
    let host = match ready {
        Readiness::Tcp { host: Some(h), .. } | Readiness::Http { host: Some(h), .. } => {
            h.to_canonical()
        }
        _ => return Ok(()),
    };
    if readiness::is_local(host)
        || pod_ips.iter().any(|ip| ip.to_canonical() == host)
        || allow.iter().any(|c| c.contains(host))
    {
        return Ok(());
    }
    Err(format!("host {host} is not one of the pod's own addresses (its IPs or loopback) nor in the node's [ordering] probe_allow"))
}

/// The [`TenantReady`] for a readiness parsed from annotation `key`, when its host needs the
/// check at all (a local host passes whatever the pod's IPs are).
pub(crate) fn tenant_ready(
    key: &str,
    value: &str,
    ready: &Readiness,
    fallback: impl FnOnce() -> Readiness,
) -> Option<Box<TenantReady>> {
    match ready {
        Readiness::Tcp { host: Some(h), .. } | Readiness::Http { host: Some(h), .. }
            if !readiness::is_local(*h) =>
        {
            Some(Box::new(TenantReady {
                key: key.to_string(),
                value: value.to_string(),
                fallback: fallback(),
            }))
        }
        _ => None,
    }
}
