//! Isolated pods (issue #35, DESIGN.md §3.2 "Isolated pods"): a pod whose runtime handler runs
//! its containers under a kernel of their own (Kata Containers, Firecracker through Kata) or a
//! user-space one (gVisor) keeps its loopback out of every network namespace crisp can enter:
//! the host-side namespace only holds the device the runtime redirects to the guest. crisp
//! then probes such a pod as kubelet does — `tcp://` and `http://` at the pod IP from crisp's
//! own namespace, `exec:` through the runtime's ExecSync (which runs in the guest) — and never
//! enters the sandbox's namespace. A readiness target on the pod's loopback cannot be reached
//! at all: that is said once per pod, and the hold falls back to the pod's timeout policy at
//! once instead of waiting out the start timeout for a probe that cannot succeed.
//!
//! Which pods are isolated: the pod's runtime handler (RunPodSandbox's `runtime_handler`, or
//! PodSandboxStatus's after a crisp restart) against `[readiness] shared_kernel_handlers`;
//! any handler not listed is isolated. The handler is the pod author's choice (a
//! RuntimeClass name in the pod spec), so it is bounded and escaped before it is kept.
//!
//! What crisp knows and what it infers: "loopback-only" is read from the readiness spec alone
//! (`127.0.0.1`, `::1`, `localhost`, `0.0.0.0`, `::`). A sidecar whose spec names the pod IP
//! (`http://:PORT`) but that listens only on its loopback answers "connection refused" at the
//! pod IP, exactly like one that is still starting: crisp cannot tell the two apart, so it
//! keeps probing until the start timeout and says in the probe's result that the port may be
//! bound to loopback only.

use crate::readiness::{self, Readiness};
use crate::tenant;

/// Longest runtime handler kept: a RuntimeClass handler is a DNS-1123 label (63 bytes); a
/// longer one is cut (and can match no configured handler, which are labels too).
const MAX_HANDLER: usize = 63;

/// How a pod's sidecars can be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Isolation {
    /// The handler shares the node's kernel: probes run inside the sandbox's network namespace.
    SharedKernel { handler: String },
    /// Anything else: probes at the pod IP from crisp's own namespace, or ExecSync.
    Isolated { handler: String },
}

impl Isolation {
    /// Classifies `handler` (the pod's, as the runtime got it) by the node's list of
    /// shared-kernel handlers. The kept name is cut to [`MAX_HANDLER`] bytes.
    pub(crate) fn classify(handler: &str, shared_kernel: &[String]) -> Isolation {
        let shared = handler.len() <= MAX_HANDLER && shared_kernel.iter().any(|h| h == handler);
        let handler = tenant::cut(handler, MAX_HANDLER);
        if shared {
            Isolation::SharedKernel { handler }
        } else {
            Isolation::Isolated { handler }
        }
    }

    pub(crate) fn is_isolated(&self) -> bool {
        matches!(self, Isolation::Isolated { .. })
    }

    pub(crate) fn handler(&self) -> &str {
        match self {
            Isolation::SharedKernel { handler } | Isolation::Isolated { handler } => handler,
        }
    }
}

/// As `crisp pods` shows it: `isolated (handler kata)`, `shared kernel (the runtime's default
/// handler)`. The handler escaped (tenant text).
impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_isolated() {
            "isolated"
        } else {
            "shared kernel"
        };
        write!(f, "{kind} ({})", HandlerText(self))
    }
}

/// `handler kata`, or `the runtime's default handler`; escaped.
struct HandlerText<'a>(&'a Isolation);

impl std::fmt::Display for HandlerText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.handler() {
            "" => f.write_str("the runtime's default handler"),
            h => write!(f, "handler {}", tenant::text(h, MAX_HANDLER)),
        }
    }
}

/// Why `ready` cannot be probed in an isolated pod, if it cannot: a `tcp://` or `http://`
/// target on the pod's loopback (or the unspecified address, which means the same). `None`
/// for every other readiness (the pod IP, an address the operator allowed, `exec:`,
/// `running`).
pub(crate) fn unreachable_target(ready: &Readiness) -> Option<std::net::SocketAddr> {
    let (host, port) = match ready {
        Readiness::Tcp {
            host: Some(h),
            port,
        }
        | Readiness::Http {
            host: Some(h),
            port,
            ..
        } => (*h, *port),
        _ => return None,
    };
    readiness::is_local(host).then_some(std::net::SocketAddr::new(host, port))
}

/// The one sentence crisp says (log line, probe result in `crisp pods` and the tap, refusal
/// under policy `fail`) about a sidecar whose readiness target is on an isolated pod's
/// loopback. Bounded: the sidecar's name is a DNS-1123 label, the handler is cut.
pub(crate) fn unreachable_reason(
    sidecar: &str,
    target: std::net::SocketAddr,
    isolation: &Isolation,
) -> String {
    format!(
        "readiness target {target} of sidecar \"{}\" cannot be probed in an isolated pod ({}): \
         its loopback is inside the pod's sandbox, out of crisp's reach; only the pod IP \
         (tcp://:PORT, http://:PORT/path) or exec: can be probed there",
        tenant::text(sidecar, tenant::MAX_NAME),
        HandlerText(isolation)
    )
}

/// Added to a probe's "connection refused" at an isolated pod's IP: what crisp cannot tell.
pub(crate) const REFUSED_HINT: &str =
    " (an isolated pod: if the sidecar listens only on its loopback, crisp cannot reach it)";

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Vec<String> {
        crate::config::ReadinessConfig::default().shared_kernel_handlers
    }

    #[test]
    fn handlers_not_listed_are_isolated() {
        for h in ["", "runc", "crun"] {
            assert!(!Isolation::classify(h, &shared()).is_isolated(), "{h:?}");
        }
        for h in [
            "kata",
            "kata-qemu",
            "runsc",
            "gvisor",
            "kata-fc",
            "RUNC",
            "runc ",
        ] {
            assert!(Isolation::classify(h, &shared()).is_isolated(), "{h:?}");
        }
        // The operator's list is the whole rule: the default handler may be isolated too.
        let kata_default = vec!["runc".to_string()];
        assert!(Isolation::classify("", &kata_default).is_isolated());
        assert!(!Isolation::classify("runc", &kata_default).is_isolated());
    }

    /// The handler is the pod author's text: kept cut and shown escaped.
    #[test]
    fn a_hostile_handler_is_cut_and_escaped() {
        let long = format!("runc{}", "x".repeat(10_000));
        let i = Isolation::classify(&long, std::slice::from_ref(&long));
        assert!(i.is_isolated(), "too long to be any configured handler");
        assert!(
            i.handler().len() <= MAX_HANDLER + 32,
            "{}",
            i.handler().len()
        );
        let evil = Isolation::classify("kata\n\u{1b}[31mfake log line", &shared());
        let shown = evil.to_string();
        assert!(
            !shown.contains('\n') && !shown.contains('\u{1b}'),
            "{shown}"
        );
        assert_eq!(
            Isolation::classify("", &shared()).to_string(),
            "shared kernel (the runtime's default handler)"
        );
        assert_eq!(
            Isolation::classify("kata", &shared()).to_string(),
            "isolated (handler kata)"
        );
    }

    #[test]
    fn only_loopback_targets_are_unreachable() {
        for spec in [
            "http://127.0.0.1:15000/ready",
            "tcp://localhost:9901",
            "tcp://[::1]:80",
            "http://0.0.0.0:15021/healthz/ready",
        ] {
            let r = Readiness::parse(spec).unwrap();
            assert!(unreachable_target(&r).is_some(), "{spec}");
        }
        for spec in [
            "http://:15021/healthz/ready",
            "http://:4191/ready",
            "tcp://10.1.2.3:80",
            "exec:[\"cat\",\"/ready\"]",
            "running",
        ] {
            let r = Readiness::parse(spec).unwrap();
            assert_eq!(unreachable_target(&r), None, "{spec}");
        }
        let why = unreachable_reason(
            "envoy",
            "127.0.0.1:15000".parse().unwrap(),
            &Isolation::classify("kata", &shared()),
        );
        assert!(
            why.contains("cannot be probed in an isolated pod (handler kata)")
                && why.contains("127.0.0.1:15000")
                && why.contains("\"envoy\""),
            "{why}"
        );
    }
}
