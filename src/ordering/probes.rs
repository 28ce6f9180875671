//! Readiness probes of sidecars (DESIGN.md §3.2), through the engine: from the pod's own
//! network namespace, aimed only at the pod's own addresses unless the operator allowed more
//! (DESIGN.md §6a), under the node-wide bounds on probing. [`ProbeTarget`] is what a
//! [`Readiness`] probe reaches: the pod's IP, a socket in its namespace, ExecSync.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use super::annotations::Sidecar;
use super::isolation;
use super::pod::{Outside, PodNet, PodNs};
use super::{Engine, Pod};
use crate::cri::ApiVersion;
use crate::metrics::GaugeGuard;
use crate::netns;
use crate::readiness::{self, Readiness};

impl Engine {
    pub(super) async fn pod_ip(&self, version: ApiVersion, pod: &Pod) -> Option<IpAddr> {
        if pod.host_network {
            return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        self.pod_net(version, pod).await?.ips.first().copied()
    }

    /// The pod's addresses and network namespace: cached on the pod, read from the runtime's
    /// verbose PodSandboxStatus on a miss (and again when the namespace's path moved).
    pub(super) async fn pod_net(&self, version: ApiVersion, pod: &Pod) -> Option<Arc<PodNet>> {
        let cached = pod.net.lock().as_ref().filter(|net| !net.stale()).cloned();
        if cached.is_some() {
            return cached;
        }
        let status = match self
            .runtime
            .pod_sandbox_status_verbose(version, &pod.sandbox_id)
            .await
        {
            Ok(status) => status,
            Err(e) => {
                tracing::debug!(
                    pod_namespace = %pod.namespace,
                    pod_name = %pod.name,
                    error = %e,
                    "cannot read the sandbox's status for its addresses"
                );
                return None;
            }
        };
        let handler = status
            .status
            .as_ref()
            .map(|sandbox| sandbox.runtime_handler.clone());
        let network = status
            .status
            .and_then(|sandbox| sandbox.network)
            .unwrap_or_default();
        let ips: Vec<IpAddr> = std::iter::once(network.ip.as_str())
            .chain(network.additional_ips.iter().map(|extra| extra.ip.as_str()))
            .filter_map(|ip| ip.parse().ok())
            .collect();
        if ips.is_empty() && !pod.host_network {
            return None; // Not networked yet: ask again next time.
        }
        // A pod crisp learnt of after its RunPodSandbox (a restart): the runtime says which
        // handler it runs with.
        if let Some(handler) = handler {
            self.classify(pod, &handler);
        }
        let ns = if pod.host_network {
            PodNs::Host
        } else {
            let info = status.info.get("info").map(String::as_str);
            match self.enter(info, pod, &ips).await {
                Ok(ns) => {
                    tracing::debug!(
                        pod_namespace = %pod.namespace,
                        pod_name = %pod.name,
                        netns = %ns.path().display(),
                        inode = ns.inode(),
                        "probing from the pod's network namespace"
                    );
                    PodNs::Pod(ns)
                }
                Err(outside) => {
                    if !pod.netns_warned.swap(true, Relaxed) {
                        if matches!(
                            outside,
                            Outside::NoNamespace {
                                isolated: false,
                                ..
                            }
                        ) {
                            self.metrics.probe_netns_failures.inc();
                        }
                        tracing::warn!(
                            pod_namespace = %pod.namespace,
                            pod_name = %pod.name,
                            handler = %pod.isolation().map(|i| i.to_string()).unwrap_or_default(),
                            "the pod's network is out of crisp's reach ({outside}): an isolated pod, probed only at its own IPs from crisp's own network namespace (never the node's addresses, never its loopback)"
                        );
                    }
                    PodNs::Outside(outside)
                }
            }
        };
        let net = Arc::new(PodNet { ips, ns });
        *pod.net.lock() = Some(net.clone());
        Some(net)
    }

    /// The sandbox's network namespace, if crisp can probe from inside it: the runtime names
    /// one crisp can open, it is not crisp's own, and the pod's first IP is an address there
    /// (issue #44: evidence, whatever the runtime handler says).
    async fn enter(
        &self,
        info: Option<&str>,
        pod: &Pod,
        ips: &[IpAddr],
    ) -> Result<netns::NetNs, Outside> {
        let isolated = pod.isolation().is_some_and(|i| i.is_isolated());
        let ns = netns::resolve(info, &pod.sandbox_id)
            .map_err(|why| Outside::NoNamespace { why, isolated })?;
        if ns.is_crisps_own().unwrap_or(true) {
            return Err(Outside::CrispsOwn);
        }
        let ip = ips.first().ok_or(Outside::NotHeld)?;
        match ns.holds(*ip).await {
            Ok(true) => Ok(ns),
            Ok(false) => Err(Outside::NotHeld),
            Err(e) => Err(Outside::NoNamespace {
                why: format!("cannot enter {}: {e}", ns.path().display()),
                isolated,
            }),
        }
    }

    /// The readiness to probe for `sidecar`: its own, unless the pod's annotation named an
    /// address that is not the pod's (then: warned once, counted, and as if the key were absent).
    async fn checked_ready<'s>(
        &self,
        version: ApiVersion,
        pod: &Pod,
        sidecar: &'s Sidecar,
    ) -> Result<&'s Readiness, String> {
        let Some(tenant) = &sidecar.tenant else {
            return Ok(&sidecar.ready);
        };
        let net = self
            .pod_net(version, pod)
            .await
            .ok_or("the pod's addresses are not known yet")?;
        // Probed from outside the pod's network, a target the operator allowed would be reached
        // with the node's address: only the pod's own addresses then (issue #44).
        let allow = match net.ns {
            PodNs::Outside(_) => &[][..],
            _ => &self.cfg.probe_allow[..],
        };
        match super::sidecar::tenant_may_aim(&sidecar.ready, &net.ips, allow) {
            Ok(()) => Ok(&sidecar.ready),
            Err(reason) => {
                let first_time = pod.tenant_warned.lock().insert(tenant.key.clone());
                if first_time {
                    tracing::warn!(
                        pod_namespace = %pod.namespace,
                        pod_name = %pod.name,
                        "{}",
                        tenant.warning(reason)
                    );
                    self.metrics.bad_annotations.inc();
                }
                Ok(&tenant.fallback)
            }
        }
    }

    /// Probes one sidecar and keeps the result on the pod (why it is not ready, for operators).
    /// Bounded: one probe slot of the node's (waited for within the probe timeout), the probe
    /// itself within what is left of it. A readiness target an isolated pod keeps out of
    /// crisp's reach is not probed at all ([`Probed::Unreachable`]).
    pub(super) async fn probe(
        &self,
        version: ApiVersion,
        pod: &Pod,
        sidecar: &Sidecar,
        container_id: &str,
    ) -> Probed {
        let deadline = tokio::time::Instant::now() + self.cfg.probe_timeout;
        let mut unreachable = None;
        let result = async {
            let ready = self.checked_ready(version, pod, sidecar).await?;
            if *ready == Readiness::Running {
                return Ok(());
            }
            if let Some(why) = self.unreachable(version, pod, &sidecar.name, ready).await {
                unreachable = Some(why.clone());
                return Err(why);
            }
            let _slot = self
                .limiter
                .slot(&pod.sandbox_id, deadline)
                .await
                .inspect_err(|_| {
                    self.metrics.probe_limited.inc();
                })?;
            let _counted = GaugeGuard::new(&self.metrics.probe_in_flight);
            let env = ProbeTarget {
                engine: self,
                version,
                pod,
                sidecar: &sidecar.name,
                container_id,
                deadline,
            };
            ready
                .probe(
                    &env,
                    deadline.saturating_duration_since(tokio::time::Instant::now()),
                )
                .await
        }
        .await;
        let ready = result.is_ok();
        pod.note_probe(&sidecar.name, result);
        match unreachable {
            Some(why) => Probed::Unreachable(why),
            None if ready => Probed::Ready,
            None => Probed::NotReady,
        }
    }

    /// Why `ready` (the readiness crisp would probe for sidecar `name`) cannot be probed in
    /// `pod`, if the pod is isolated and the target is its loopback. Said once per pod: a log
    /// line naming the pod and the handler; each probe's result carries it for `crisp pods`.
    async fn unreachable(
        &self,
        version: ApiVersion,
        pod: &Pod,
        name: &str,
        ready: &Readiness,
    ) -> Option<String> {
        let target = isolation::unreachable_target(ready)?;
        if pod.host_network {
            return None;
        }
        // The evidence decides (issue #44): the pod's network is out of crisp's reach.
        let net = self.pod_net(version, pod).await?;
        if !matches!(&net.ns, PodNs::Outside(why) if why.isolated()) {
            return None;
        }
        let isolation =
            pod.isolation()
                .filter(|i| i.is_isolated())
                .unwrap_or(isolation::Isolation::Isolated {
                    handler: String::new(),
                });
        let why = isolation::unreachable_reason(name, target, &isolation);
        if !pod.isolation_warned.swap(true, Relaxed) {
            tracing::warn!(
                pod_namespace = %pod.namespace,
                pod_name = %pod.name,
                "pod {}: {why}; falling back to the pod's timeout policy now, not at its start timeout",
                pod.display()
            );
        }
        Some(why)
    }
}

/// What one probe of a sidecar found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Probed {
    Ready,
    NotReady,
    /// It cannot be probed at all (an isolated pod's loopback): the hold falls back to the
    /// pod's timeout policy at once. The reason, said once per pod.
    Unreachable(String),
}

/// What a readiness probe of one sidecar reaches through the engine: the pod's IP (from the
/// runtime, cached) and ExecSync in the sidecar's container.
struct ProbeTarget<'a> {
    engine: &'a Engine,
    version: ApiVersion,
    pod: &'a Pod,
    sidecar: &'a str,
    container_id: &'a str,
    /// The probe's end: waits for the node-wide bounds never go past it.
    deadline: tokio::time::Instant,
}

impl readiness::ProbeEnv for ProbeTarget<'_> {
    async fn pod_ip(&self) -> Option<IpAddr> {
        self.engine.pod_ip(self.version, self.pod).await
    }

    /// From inside the pod's network namespace (hostNetwork pods: the node's, which is theirs).
    /// A pod whose network crisp cannot enter is probed from the node's namespace, and then only
    /// at its own IPs that are no address of the node's (`readiness::outside_target`): never at
    /// loopback, an operator's `probe_allow` network, link-local or metadata addresses.
    async fn connect(&self, addr: SocketAddr) -> Result<tokio::net::TcpStream, String> {
        let engine = self.engine;
        engine
            .limiter
            .rate_turn(self.deadline)
            .await
            .inspect_err(|_| {
                engine.metrics.probe_limited.inc();
            })?;
        let net = if self.pod.host_network {
            None
        } else {
            engine.pod_net(self.version, self.pod).await
        };
        let local = readiness::is_local(addr.ip());
        let cannot_enter = |why: &dyn std::fmt::Display| {
            format!("cannot enter the pod's network namespace: {why}")
        };
        let socket = match net.as_deref() {
            // Caught before the probe (`Engine::unreachable`); never the node's loopback.
            Some(PodNet {
                ns:
                    PodNs::Outside(Outside::NoNamespace {
                        why,
                        isolated: false,
                    }),
                ..
            }) if local => return Err(cannot_enter(why)),
            Some(PodNet {
                ns: PodNs::Outside(_),
                ..
            }) if local => {
                return Err(format!(
                    "connect {addr}: an isolated pod's loopback cannot be probed"
                ))
            }
            Some(PodNet {
                ns: PodNs::Outside(_),
                ips,
            }) => {
                let ip = addr.ip();
                let node = engine.is_node_address(ip);
                readiness::outside_target(ip, ips, node, &engine.outside_allow).map_err(|why| {
                    format!("connect {addr}: not probed from outside the pod's network: {why}")
                })?;
                engine.metrics.probe_connects.inc();
                return readiness::connect_here(addr).await.map_err(|e| {
                    if e.contains("refused") {
                        e + isolation::REFUSED_HINT
                    } else {
                        e
                    }
                });
            }
            Some(PodNet {
                ns: PodNs::Pod(ns), ..
            }) => Some(
                ns.socket(addr.is_ipv6())
                    .await
                    .map_err(|err| cannot_enter(&err))?,
            ),
            Some(PodNet {
                ns: PodNs::Host, ..
            }) => None,
            None if self.pod.host_network => None,
            None => {
                return Err(cannot_enter(
                    &"the runtime has not reported the sandbox's status",
                ))
            }
        };
        engine.metrics.probe_connects.inc();
        match socket {
            Some(socket) => socket
                .connect(addr)
                .await
                .map_err(|err| format!("connect {addr}: {err}")),
            None => readiness::connect_here(addr).await,
        }
    }

    /// Under the exec probes' own budget, not the connects' (issue #33: each ExecSync is a
    /// process started in a container): a turn of the pod's own exec rate (waited for before
    /// anything of the node's is taken), an exec slot of the node's, a pod holding at most its
    /// share, and a turn of the node's exec rate; over by the probe's end whatever the waits
    /// took.
    async fn exec(&self, cmd: &[String], timeout: Duration) -> Result<i32, String> {
        let limiter = &self.engine.exec_limiter;
        let metrics = &self.engine.metrics;
        match limiter.pod_turn(&self.pod.sandbox_id, self.deadline).await {
            Ok(waited) if !waited.is_zero() => {
                metrics.exec_probe_pod_paced.inc();
            }
            Ok(_) => {}
            Err(e) => {
                metrics.exec_probe_pod_limited.inc();
                return Err(format!("exec {e}"));
            }
        }
        let limited = |e: String| {
            metrics.probe_limited.inc();
            format!("exec {e}")
        };
        let _slot = limiter
            .slot(&self.pod.sandbox_id, self.deadline)
            .await
            .map_err(limited)?;
        limiter.rate_turn(self.deadline).await.map_err(limited)?;
        let timeout = timeout.min(
            self.deadline
                .saturating_duration_since(tokio::time::Instant::now()),
        );
        let runtime = &self.engine.runtime;
        let exec = runtime.exec_sync(self.version, self.container_id, cmd, timeout);
        exec.await.map_err(|e| {
            self.engine.metrics.probe_errors.inc();
            tracing::debug!(
                container_name = %self.sidecar,
                error = %e,
                "exec readiness probe failed to run"
            );
            e.to_string()
        })
    }
}
