//! The annotation contract (DESIGN.md §2): which containers of a pod are sidecars, how crisp
//! judges them ready, how long it may hold, whether the pod is a Job.
//!
//! A malformed value never blocks a pod: it yields a [`Warning`] (logged once per pod, counted)
//! and the pod is treated as if the key were absent.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use super::injectors::{self, Injected, InjectorRule};
use crate::config::{parse_duration, SidecarRule, TimeoutPolicy, MAX_START_TIMEOUT};
use crate::readiness::{self, Cidr, Readiness};

pub const SIDECARS: &str = "crisp.dev/sidecars";
pub const READY_PREFIX: &str = "crisp.dev/ready.";
pub const START_TIMEOUT: &str = "crisp.dev/start-timeout";
pub const TIMEOUT_POLICY: &str = "crisp.dev/timeout-policy";
pub const JOB: &str = "crisp.dev/job";
pub const RESTART_POLICY: &str = "crisp.dev/restart-policy";
pub const INIT_CONTAINERS: &str = "crisp.dev/init-containers";

/// Most sidecars one pod may declare; more is a typo or an attack, not a pod.
pub const MAX_SIDECARS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sidecar {
    pub name: String,
    pub ready: Readiness,
    /// The sidecar will exist: when it is not created yet (listed after the app) the app is
    /// refused until it is. `false` (node rules, some injectors): waited for once it exists.
    pub required: bool,
    /// `ready` came from the pod's own `crisp.dev/ready.<name>` and names a host that only the
    /// pod's addresses may be (see [`tenant_may_aim`]): checked before the first probe.
    pub tenant: Option<Box<TenantReady>>,
}

/// A readiness the pod's author wrote naming a host (not the pod IP, not loopback): it may be
/// probed only if that host turns out to be one of the pod's own IPs (known once the sandbox
/// runs) or in the operator's `[ordering] probe_allow`. Else the annotation is malformed:
/// warned about once, and `fallback` (what the sidecar's readiness is without the key) is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantReady {
    pub key: String,
    pub value: String,
    pub fallback: Readiness,
}

impl TenantReady {
    /// The warning for an annotation that named someone else's address.
    pub fn warning(&self, reason: String) -> Warning {
        Warning { key: self.key.clone(), value: self.value.clone(), reason: format!("{reason}; using `{}`", self.fallback) }
    }
}

/// The check a readiness from a pod annotation must pass before crisp connects anywhere: its
/// host is the pod IP (empty), loopback or unspecified (the pod's own namespace), one of the
/// pod's IPs (`pod_ips`, from the runtime), or inside a network the operator allowed.
pub fn tenant_may_aim(ready: &Readiness, pod_ips: &[IpAddr], allow: &[Cidr]) -> Result<(), String> {
    let host = match ready {
        Readiness::Tcp { host: Some(h), .. } | Readiness::Http { host: Some(h), .. } => h.to_canonical(),
        _ => return Ok(()),
    };
    if readiness::is_local(host) || pod_ips.iter().any(|ip| ip.to_canonical() == host) || allow.iter().any(|c| c.contains(host)) {
        return Ok(());
    }
    Err(format!("host {host} is not one of the pod's own addresses (its IPs or loopback) nor in the node's [ordering] probe_allow"))
}

/// The [`TenantReady`] for a readiness parsed from annotation `key`, when its host needs the
/// check at all (a local host passes whatever the pod's IPs are).
pub fn tenant_ready(key: &str, value: &str, ready: &Readiness, fallback: impl FnOnce() -> Readiness) -> Option<Box<TenantReady>> {
    match ready {
        Readiness::Tcp { host: Some(h), .. } | Readiness::Http { host: Some(h), .. } if !readiness::is_local(*h) => {
            Some(Box::new(TenantReady { key: key.to_string(), value: value.to_string(), fallback: fallback() }))
        }
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

/// Where a pod's sidecar list came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `crisp.dev/sidecars`: the full, ordered list; a listed sidecar that does not exist yet
    /// makes app creation fail fast.
    Annotation,
    /// A known injector's own annotations (`injectors.rs`): the sidecars it added.
    Injector,
    /// Node-wide rules: only sidecars that exist in the sandbox are waited for.
    NodeRules,
    /// `crisp.dev/sidecars: ""`: the pod opted out; crisp leaves it alone.
    OptOut,
}

/// Everything crisp reads from one pod's annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPolicy {
    pub sidecars: Vec<Sidecar>,
    pub source: Source,
    pub start_timeout: Option<Duration>,
    pub timeout_policy: Option<TimeoutPolicy>,
    pub job: Option<bool>,
    pub restart_policy: Option<RestartPolicy>,
    /// Containers known to be init containers (`crisp.dev/init-containers`, injectors).
    pub init_containers: Vec<String>,
    /// `crisp.dev/init-containers` was given: it is the complete list, so every other
    /// container is a regular one and nothing is inferred.
    pub init_complete: bool,
    /// The known injectors recognised on the pod.
    pub injectors: Vec<String>,
}

/// A malformed annotation, reported once per pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Everything is shown truncated and with control characters escaped: annotations can be
        // huge (and the reason may quote the value), and the log line must stay one short line.
        let mut v: String = self.value.chars().take(120).collect();
        if v.len() < self.value.len() {
            v.push('…');
        }
        write!(f, "annotation {}={:?} ignored: {}", clip(&self.key, 256), v, clip(&self.reason, 512))
    }
}

/// At most `max` characters of `s`, control characters escaped, `…` when cut.
fn clip(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// A DNS-1123 label, which is what Kubernetes requires of container names.
fn is_container_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && !s.starts_with('-') && !s.ends_with('-')
}

impl PodPolicy {
    /// Parses a pod's annotations against the node's rules (no known injectors).
    pub fn parse(annotations: &HashMap<String, String>, rules: &[SidecarRule]) -> (PodPolicy, Vec<Warning>) {
        PodPolicy::parse_with(annotations, rules, &[])
    }

    /// Parses a pod's annotations against the node's rules and known injectors. Precedence:
    /// `crisp.dev/sidecars` (`""` opts out), then the injectors recognised on the pod, then
    /// the node rules.
    pub fn parse_with(annotations: &HashMap<String, String>, rules: &[SidecarRule], injectors: &[InjectorRule]) -> (PodPolicy, Vec<Warning>) {
        let mut warnings = Vec::new();
        let names = read(annotations, SIDECARS, &mut warnings, parse_name_list);
        let injected = match names {
            None => recognise_injectors(annotations, injectors, &mut warnings),
            Some(_) => Injected::default(),
        };
        let (sidecars, source) = match names {
            Some(names) if names.is_empty() => (Vec::new(), Source::OptOut),
            None if !injected.injectors.is_empty() => (injected.sidecars, Source::Injector),
            Some(names) => {
                let list = names.into_iter().map(|name| listed_sidecar(name, annotations, rules, &mut warnings)).collect();
                (list, Source::Annotation)
            }
            // Node rules; invalid rule readiness was rejected at config load.
            None => {
                let list = rules
                    .iter()
                    .map(|r| Sidecar { name: r.name.clone(), ready: Readiness::parse(&r.ready).unwrap_or(Readiness::Running), required: false, tenant: None })
                    .collect();
                (list, Source::NodeRules)
            }
        };
        if matches!(source, Source::Annotation | Source::OptOut) {
            warn_unlisted_ready(annotations, &sidecars, &mut warnings);
        }

        let start_timeout = read(annotations, START_TIMEOUT, &mut warnings, parse_start_timeout);
        let timeout_policy =
            read(annotations, TIMEOUT_POLICY, &mut warnings, |v| one_of(v, &[("proceed", TimeoutPolicy::Proceed), ("fail", TimeoutPolicy::Fail)], "expected `proceed` or `fail`"));
        let job = read(annotations, JOB, &mut warnings, |v| one_of(v, &[("true", true), ("false", false)], "expected \"true\" or \"false\""));
        let restart_policy = read(annotations, RESTART_POLICY, &mut warnings, |v| {
            let choices = [("Always", RestartPolicy::Always), ("OnFailure", RestartPolicy::OnFailure), ("Never", RestartPolicy::Never)];
            one_of(v, &choices, "expected Always, OnFailure or Never")
        });
        let mut init_containers = injected.init_containers;
        let declared_init = read(annotations, INIT_CONTAINERS, &mut warnings, parse_name_list);
        let init_complete = declared_init.is_some();
        for n in declared_init.into_iter().flatten() {
            if !init_containers.contains(&n) {
                init_containers.push(n);
            }
        }
        // A sidecar is a regular container: a name in both lists is a sidecar.
        init_containers.retain(|n| !sidecars.iter().any(|s| &s.name == n));
        warnings.sort_by(|a, b| a.key.cmp(&b.key));
        let injectors = injected.injectors;
        (PodPolicy { sidecars, source, start_timeout, timeout_policy, job, restart_policy, init_containers, init_complete, injectors }, warnings)
    }

    pub fn has_sidecars(&self) -> bool {
        !self.sidecars.is_empty()
    }

    pub fn sidecar_index(&self, container: &str) -> Option<usize> {
        self.sidecars.iter().position(|s| s.name == container)
    }

    /// Named an init container by an annotation (never by inference).
    pub fn is_known_init(&self, container: &str) -> bool {
        self.init_containers.iter().any(|n| n == container)
    }

    /// Some sidecar will exist whether or not it does yet (see [`Sidecar::required`]).
    pub fn any_required(&self) -> bool {
        self.sidecars.iter().any(|s| s.required)
    }
}

/// The value of annotation `key` as `parse` reads it; a value it refuses is a [`Warning`] and
/// the key counts as absent.
fn read<T>(annotations: &HashMap<String, String>, key: &str, warnings: &mut Vec<Warning>, parse: impl FnOnce(&str) -> Result<T, String>) -> Option<T> {
    let value = annotations.get(key)?;
    match parse(value) {
        Ok(t) => Some(t),
        Err(reason) => {
            warnings.push(Warning { key: key.to_string(), value: value.clone(), reason });
            None
        }
    }
}

/// The choice whose name is `v` (trimmed), else `expected` as the reason.
fn one_of<T: Copy>(v: &str, choices: &[(&str, T)], expected: &str) -> Result<T, String> {
    choices.iter().find(|(name, _)| *name == v.trim()).map(|&(_, t)| t).ok_or_else(|| expected.to_string())
}

/// `crisp.dev/start-timeout`: a duration in (0, MAX_START_TIMEOUT].
fn parse_start_timeout(v: &str) -> Result<Duration, String> {
    match parse_duration(v)? {
        d if d.is_zero() => Err("must be greater than 0".into()),
        d if d > MAX_START_TIMEOUT => Err(format!("longer than {MAX_START_TIMEOUT:?}: holds must end before kubelet's 2 min deadline")),
        d => Ok(d),
    }
}

/// The known injectors recognised on the pod; `crisp.dev/ready.<name>` wins over an injector's
/// readiness, and a bad one is warned about once and read as `running`.
fn recognise_injectors(annotations: &HashMap<String, String>, injectors: &[InjectorRule], warnings: &mut Vec<Warning>) -> Injected {
    let bad_ready = RefCell::new(Vec::new());
    let ready_override = |name: &str| -> Option<Readiness> {
        let key = format!("{READY_PREFIX}{name}");
        let spec = annotations.get(&key)?;
        match Readiness::parse(spec) {
            Ok(r) => Some(r),
            Err(reason) => {
                bad_ready.borrow_mut().push(Warning { key, value: spec.clone(), reason: format!("{reason}; using `running`") });
                Some(Readiness::Running)
            }
        }
    };
    let injected = injectors::recognise(injectors, annotations, &ready_override, warnings);
    warnings.append(&mut bad_ready.borrow_mut());
    injected
}

/// A sidecar named in `crisp.dev/sidecars`: its readiness from `crisp.dev/ready.<name>`, else
/// from the node rule of that name, else `running`.
fn listed_sidecar(name: String, annotations: &HashMap<String, String>, rules: &[SidecarRule], warnings: &mut Vec<Warning>) -> Sidecar {
    let key = format!("{READY_PREFIX}{name}");
    let from_rule = || rules.iter().find(|r| r.name == name).and_then(|r| Readiness::parse(&r.ready).ok()).unwrap_or(Readiness::Running);
    let (ready, tenant) = match annotations.get(&key) {
        None => (from_rule(), None),
        Some(spec) => match Readiness::parse(spec) {
            Ok(r) => {
                let tenant = tenant_ready(&key, spec, &r, from_rule);
                (r, tenant)
            }
            Err(reason) => {
                warnings.push(Warning { key, value: spec.clone(), reason: format!("{reason}; using `running`") });
                (Readiness::Running, None)
            }
        },
    };
    Sidecar { name, ready, required: true, tenant }
}

/// A `crisp.dev/ready.<name>` for a container the pod's own list does not name is a typo.
fn warn_unlisted_ready(annotations: &HashMap<String, String>, sidecars: &[Sidecar], warnings: &mut Vec<Warning>) {
    for (k, v) in annotations {
        if let Some(name) = k.strip_prefix(READY_PREFIX) {
            if !sidecars.iter().any(|s| s.name == name) {
                warnings.push(Warning { key: k.clone(), value: v.clone(), reason: format!("`{name}` is not listed in {SIDECARS}") });
            }
        }
    }
}

/// A comma-separated list of container names; blank is the empty list.
fn parse_name_list(v: &str) -> Result<Vec<String>, String> {
    if v.trim().is_empty() {
        return Ok(Vec::new());
    }
    parse_sidecar_list(v)
}

fn parse_sidecar_list(v: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for raw in v.split(',') {
        let name = raw.trim();
        if name.is_empty() {
            continue;
        }
        if !is_container_name(name) {
            return Err(format!("{name:?} is not a valid container name"));
        }
        if out.iter().any(|n| n == name) {
            return Err(format!("{name:?} is listed twice"));
        }
        out.push(name.to_string());
        if out.len() > MAX_SIDECARS {
            return Err(format!("more than {MAX_SIDECARS} sidecars"));
        }
    }
    if out.is_empty() {
        return Err("no container names".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
