//! The annotation contract (DESIGN.md §2): which containers of a pod are sidecars, how crisp
//! judges them ready, how long it may hold, whether the pod is a Job.
//!
//! A malformed value never blocks a pod: it yields a [`Warning`] (the pod's [`Warnings`] are
//! logged as one line, each counted) and the pod is treated as if the key were absent.
//!
//! Every value is bounded where it is read, by the one rule of [`crate::tenant`]: a value longer
//! than [`tenant::MAX_VALUE`] is refused before it is parsed, and every list of names (this
//! pod's, a known injector's) is at most [`MAX_SIDECARS`] distinct DNS-1123 labels. So parsing a
//! pod's policy costs a bounded amount per annotation key whatever the values hold: one look at
//! each key (`crisp.dev/ready.` keys are matched against a set of at most 64 names) and at most
//! 16 KiB parsed per value crisp reads — no more than decoding the RunPodSandboxRequest that
//! carried them, which is why it may run on the tokio worker that completes that call.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::injectors::{self, Injected, InjectorRule};
pub use super::sidecar::{Sidecar, READY_PREFIX};
// The annotation contract's public surface (the fuzz targets and tests name these here).
#[allow(unused_imports)]
pub use super::sidecar::tenant_may_aim;
use super::sidecar::tenant_ready;
#[allow(unused_imports)]
pub use super::warnings::MAX_WARNINGS_KEPT;
pub use super::warnings::{Warning, Warnings};
use crate::config::{parse_duration, SidecarRule, TimeoutPolicy, MAX_START_TIMEOUT};
use crate::readiness::Readiness;
use crate::tenant;

pub const SIDECARS: &str = "crisp.dev/sidecars";
pub(crate) const START_TIMEOUT: &str = "crisp.dev/start-timeout";
pub(crate) const TIMEOUT_POLICY: &str = "crisp.dev/timeout-policy";
pub(crate) const JOB: &str = "crisp.dev/job";
pub(crate) const RESTART_POLICY: &str = "crisp.dev/restart-policy";
pub(crate) const INIT_CONTAINERS: &str = "crisp.dev/init-containers";

/// Most sidecars one pod may declare; more is a typo or an attack, not a pod.
pub const MAX_SIDECARS: usize = tenant::MAX_NAMES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestartPolicy {
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
    pub(crate) timeout_policy: Option<TimeoutPolicy>,
    pub(crate) job: Option<bool>,
    pub(crate) restart_policy: Option<RestartPolicy>,
    /// Containers known to be init containers (`crisp.dev/init-containers`, injectors).
    pub init_containers: Vec<String>,
    /// `crisp.dev/init-containers` was given: it is the complete list, so every other
    /// container is a regular one and nothing is inferred.
    pub(crate) init_complete: bool,
    /// The known injectors recognised on the pod.
    pub injectors: Vec<String>,
    /// Native sidecars (kubelet 1.29+: init containers with `restartPolicy: Always`) the pod
    /// names only in `crisp.dev/ready.<name>`: a name no sidecar list of the pod holds. Never
    /// required (waited for only once they exist: kubelet creates and starts them before any
    /// regular container, KUBELET-CRI §1.5), never gated themselves, never stop-ordered nor
    /// ended by Job mode (kubelet stops them), by name.
    pub native: Vec<Sidecar>,
    /// What a regular container waits for: [`PodPolicy::native`], then [`PodPolicy::sidecars`]
    /// (kubelet starts native sidecars before every regular container).
    pub(crate) gate: Vec<Sidecar>,
}

impl PodPolicy {
    /// Parses a pod's annotations against the node's rules (no known injectors).
    #[cfg(test)]
    pub(crate) fn parse(
        annotations: &HashMap<String, String>,
        rules: &[SidecarRule],
    ) -> (PodPolicy, Warnings) {
        PodPolicy::parse_with(annotations, rules, &[])
    }

    /// Parses a pod's annotations against the node's rules and known injectors. Precedence:
    /// `crisp.dev/sidecars` (`""` opts out), then the injectors recognised on the pod, then
    /// the node rules.
    pub fn parse_with(
        annotations: &HashMap<String, String>,
        rules: &[SidecarRule],
        injectors: &[InjectorRule],
    ) -> (PodPolicy, Warnings) {
        let mut warnings = Warnings::default();
        let names = read(annotations, SIDECARS, &mut warnings, parse_name_list);
        // A `crisp.dev/sidecars` that was there but rejected (warned about): the pod's
        // `crisp.dev/ready.*` keys were for the sidecars it tried to list, not native ones, and
        // are ignored with it, as before native sidecars were read.
        let rejected_list = names.is_none() && annotations.contains_key(SIDECARS);
        let injected = match names {
            None => recognise_injectors(annotations, injectors, &mut warnings),
            Some(_) => Injected::default(),
        };
        let (sidecars, source) = match names {
            Some(names) if names.is_empty() => (Vec::new(), Source::OptOut),
            None if !injected.injectors.is_empty() => (injected.sidecars, Source::Injector),
            Some(names) => {
                let list = names
                    .into_iter()
                    .map(|name| listed_sidecar(name, annotations, rules, &mut warnings))
                    .collect();
                (list, Source::Annotation)
            }
            // Node rules; invalid rule readiness was rejected at config load.
            None => {
                let list = rules
                    .iter()
                    .map(|r| Sidecar {
                        name: r.name.clone(),
                        ready: Readiness::parse(&r.ready).unwrap_or(Readiness::Running),
                        required: false,
                        tenant: None,
                    })
                    .collect();
                (list, Source::NodeRules)
            }
        };
        let native = match source {
            // Opted out: every `crisp.dev/ready.*` key is ignored, and said to be.
            Source::OptOut => {
                warn_unlisted_ready(annotations, &sidecars, &mut warnings);
                Vec::new()
            }
            _ if rejected_list => Vec::new(),
            _ => native_sidecars(annotations, &sidecars, &mut warnings),
        };

        let start_timeout = read(
            annotations,
            START_TIMEOUT,
            &mut warnings,
            parse_start_timeout,
        );
        let timeout_policy = read_choice(annotations, TIMEOUT_POLICY, &mut warnings, |v| {
            one_of(
                v,
                &[
                    ("proceed", TimeoutPolicy::Proceed),
                    ("fail", TimeoutPolicy::Fail),
                ],
                "expected `proceed` or `fail`",
            )
        });
        let job = read_choice(annotations, JOB, &mut warnings, |v| {
            one_of(
                v,
                &[("true", true), ("false", false)],
                "expected \"true\" or \"false\"",
            )
        });
        let restart_policy = read_choice(annotations, RESTART_POLICY, &mut warnings, |v| {
            let choices = [
                ("Always", RestartPolicy::Always),
                ("OnFailure", RestartPolicy::OnFailure),
                ("Never", RestartPolicy::Never),
            ];
            one_of(v, &choices, "expected Always, OnFailure or Never")
        });
        let mut init_containers = injected.init_containers;
        let declared_init = read(annotations, INIT_CONTAINERS, &mut warnings, parse_name_list);
        let init_complete = declared_init.is_some();
        let mut known: HashSet<String> = init_containers.iter().cloned().collect();
        for n in declared_init.into_iter().flatten() {
            if known.insert(n.clone()) {
                init_containers.push(n);
            }
        }
        // A sidecar is a regular container: a name in both lists is a sidecar.
        let sidecar_names: HashSet<&str> = sidecars.iter().map(|s| s.name.as_str()).collect();
        init_containers.retain(|n| !sidecar_names.contains(n.as_str()));
        warnings.sort();
        let injectors = injected.injectors;
        let gate = native.iter().chain(&sidecars).cloned().collect();
        (
            PodPolicy {
                native,
                gate,
                sidecars,
                source,
                start_timeout,
                timeout_policy,
                job,
                restart_policy,
                init_containers,
                init_complete,
                injectors,
            },
            warnings,
        )
    }

    pub(crate) fn has_sidecars(&self) -> bool {
        !self.sidecars.is_empty()
    }

    /// A native sidecar the pod names in `crisp.dev/ready.<name>` (see [`PodPolicy::native`]).
    pub(crate) fn is_native(&self, container: &str) -> bool {
        self.native.iter().any(|s| s.name == container)
    }

    /// Every sidecar a regular container may wait for: native ones first, then the pod's
    /// (legacy) sidecars in declared order.
    pub(crate) fn gated(&self) -> &[Sidecar] {
        &self.gate
    }

    /// A sidecar, native or not, by name.
    pub(crate) fn find_sidecar(&self, container: &str) -> Option<&Sidecar> {
        self.gate.iter().find(|s| s.name == container)
    }

    pub fn sidecar_index(&self, container: &str) -> Option<usize> {
        self.sidecars.iter().position(|s| s.name == container)
    }

    /// Named an init container by an annotation (never by inference).
    pub(crate) fn is_known_init(&self, container: &str) -> bool {
        self.init_containers.iter().any(|n| n == container)
    }

    /// Some sidecar will exist whether or not it does yet (see [`Sidecar::required`]).
    pub(crate) fn any_required(&self) -> bool {
        self.sidecars.iter().any(|s| s.required)
    }
}

/// The value of annotation `key` as `parse` reads it; a value longer than
/// [`tenant::MAX_VALUE`] (unread) or one `parse` refuses is a [`Warning`] and the key counts as
/// absent.
fn read<T>(
    annotations: &HashMap<String, String>,
    key: &str,
    warnings: &mut Warnings,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Option<T> {
    read_choice(annotations, key, warnings, |value| {
        tenant::value(value)
            .map_err(|e| e.to_string())
            .and_then(parse)
    })
}

/// [`read`] for a key whose value is one of a few names ([`one_of`]): no size cap first, since
/// comparing with a short name costs the same whatever the value's length (lengths differ), and
/// the warning then says what was expected rather than only that the value is long.
fn read_choice<T>(
    annotations: &HashMap<String, String>,
    key: &str,
    warnings: &mut Warnings,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Option<T> {
    let value = annotations.get(key)?;
    match parse(value) {
        Ok(t) => Some(t),
        Err(reason) => {
            warnings.push(Warning::new(key, value, reason));
            None
        }
    }
}

/// The choice whose name is `v` (trimmed), else `expected` as the reason.
fn one_of<T: Copy>(v: &str, choices: &[(&str, T)], expected: &str) -> Result<T, String> {
    choices
        .iter()
        .find(|(name, _)| *name == v.trim())
        .map(|&(_, t)| t)
        .ok_or_else(|| expected.to_string())
}

/// `crisp.dev/start-timeout`: a duration in (0, MAX_START_TIMEOUT].
fn parse_start_timeout(v: &str) -> Result<Duration, String> {
    match parse_duration(v)? {
        d if d.is_zero() => Err("must be greater than 0".into()),
        d if d > MAX_START_TIMEOUT => Err(format!(
            "longer than {MAX_START_TIMEOUT:?}: holds must end before kubelet's 2 min deadline"
        )),
        d => Ok(d),
    }
}

/// The known injectors recognised on the pod; `crisp.dev/ready.<name>` wins over an injector's
/// readiness, and a bad one is warned about once and read as `running`.
fn recognise_injectors(
    annotations: &HashMap<String, String>,
    injectors: &[InjectorRule],
    warnings: &mut Warnings,
) -> Injected {
    let bad_ready = RefCell::new(Vec::new());
    let ready_override = |name: &str| -> Option<Readiness> {
        let key = format!("{READY_PREFIX}{name}");
        let spec = annotations.get(&key)?;
        match Readiness::parse(spec) {
            Ok(r) => Some(r),
            Err(reason) => {
                bad_ready.borrow_mut().push(Warning::new(
                    &key,
                    spec,
                    format!("{reason}; using `running`"),
                ));
                Some(Readiness::Running)
            }
        }
    };
    let injected = injectors::recognise(injectors, annotations, &ready_override, warnings);
    for w in bad_ready.take() {
        warnings.push(w);
    }
    injected
}

/// A sidecar named in `crisp.dev/sidecars`: its readiness from `crisp.dev/ready.<name>`, else
/// from the node rule of that name, else `running`.
fn listed_sidecar(
    name: String,
    annotations: &HashMap<String, String>,
    rules: &[SidecarRule],
    warnings: &mut Warnings,
) -> Sidecar {
    let key = format!("{READY_PREFIX}{name}");
    let from_rule = || {
        rules
            .iter()
            .find(|r| r.name == name)
            .and_then(|r| Readiness::parse(&r.ready).ok())
            .unwrap_or(Readiness::Running)
    };
    let (ready, tenant) = match annotations.get(&key) {
        None => (from_rule(), None),
        Some(spec) => match Readiness::parse(spec) {
            Ok(r) => {
                let tenant = tenant_ready(&key, spec, &r, from_rule);
                (r, tenant)
            }
            Err(reason) => {
                warnings.push(Warning::new(
                    &key,
                    spec,
                    format!("{reason}; using `running`"),
                ));
                (Readiness::Running, None)
            }
        },
    };
    Sidecar {
        name,
        ready,
        required: true,
        tenant,
    }
}

/// The native sidecars of a pod: each `crisp.dev/ready.<name>` whose name is none of the pod's
/// `sidecars` (listed, injected or a node rule's) names a native sidecar, the only way the CRI
/// can learn of one (restartPolicy is on no CRI call, KUBELET-CRI §2.4). A key whose name is
/// not a DNS-1123 label or whose readiness does not parse is a warning and counts as absent;
/// at most [`MAX_SIDECARS`] sidecars in all (the rest warned about). Sorted by name: kubelet
/// starts them in spec order before any app, and each gates only the apps, so their order
/// does not matter. One look per key, however many keys the pod has.
fn native_sidecars(
    annotations: &HashMap<String, String>,
    sidecars: &[Sidecar],
    warnings: &mut Warnings,
) -> Vec<Sidecar> {
    let listed: HashSet<&str> = sidecars.iter().map(|s| s.name.as_str()).collect();
    let mut keys: Vec<(&str, &String, &String)> = annotations
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(READY_PREFIX)?, k, v)))
        .filter(|(name, _, _)| !listed.contains(name))
        .collect();
    keys.sort_unstable_by_key(|(name, _, _)| *name);
    let mut native = Vec::new();
    for (name, key, value) in keys {
        if !tenant::is_dns1123_label(name) {
            warnings.push_with(key, || {
                Warning::new(key, value, "not a container name (a DNS-1123 label)".into())
            });
            continue;
        }
        if sidecars.len() + native.len() >= MAX_SIDECARS {
            warnings.push_with(key, || {
                Warning::new(key, value, format!("more than {MAX_SIDECARS} sidecars"))
            });
            continue;
        }
        let ready = tenant::value(value)
            .map_err(|e| e.to_string())
            .and_then(Readiness::parse);
        match ready {
            Ok(ready) => native.push(Sidecar {
                name: name.to_string(),
                tenant: tenant_ready(key, value, &ready, || Readiness::Running),
                ready,
                required: false,
            }),
            Err(reason) => warnings.push_with(key, || Warning::new(key, value, reason)),
        }
    }
    native
}

/// A pod that opted out (`crisp.dev/sidecars: ""`) has its `crisp.dev/ready.*` keys ignored:
/// said once each. One look per key (a set of at most 64 names), however many keys the pod has.
fn warn_unlisted_ready(
    annotations: &HashMap<String, String>,
    sidecars: &[Sidecar],
    warnings: &mut Warnings,
) {
    let listed: HashSet<&str> = sidecars.iter().map(|s| s.name.as_str()).collect();
    for (k, v) in annotations {
        if let Some(name) = k.strip_prefix(READY_PREFIX) {
            if !listed.contains(name) {
                warnings.push_with(k, || {
                    Warning::new(
                        k,
                        v,
                        format!(
                            "`{}` is not listed in {SIDECARS}",
                            tenant::text(name, tenant::MAX_NAME + 1)
                        ),
                    )
                });
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

/// At most [`MAX_SIDECARS`] distinct DNS-1123 labels ([`tenant::names`]), at least one.
fn parse_sidecar_list(v: &str) -> Result<Vec<String>, String> {
    match tenant::names(v.split(',').map(str::trim).filter(|n| !n.is_empty())) {
        Ok(names) if names.is_empty() => Err(tenant::Refused::Empty.to_string()),
        Ok(names) => Ok(names),
        // Said in the pod's terms: these are its sidecars.
        Err(tenant::Refused::TooMany) => Err(format!("more than {MAX_SIDECARS} sidecars")),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod injected;
#[cfg(test)]
mod tests;
