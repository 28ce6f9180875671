//! Known injectors (DESIGN.md §2): pods that a mesh or agent injector mutated carry the
//! injector's own annotations, so crisp orders them with zero configuration. The table is data
//! (`config/injectors.rs`); this applies it to one pod's annotations.
//!
//! An injector's annotations are the pod author's to write like any other (a pod can carry a
//! forged `sidecar.istio.io/status`), so they are bounded by the same rule as
//! `crisp.dev/sidecars` ([`crate::tenant`]): a status value is refused unread past
//! [`tenant::MAX_VALUE`], its lists are at most 64 distinct DNS-1123 labels, a port annotation
//! is read only within the same cap. Any breach: the rule's injector is not recognised on the
//! pod, with a warning. So recognising costs a bounded amount per rule whatever the pod holds.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;

use super::sidecar::{tenant_ready, Sidecar, READY_PREFIX};
use super::warnings::{Warning, Warnings};
pub(crate) use crate::config::injectors::{InjectedSidecar, InjectorRule};
use crate::readiness::Readiness;
use crate::tenant;

/// What the injectors that mutated one pod added to it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Injected {
    /// Names of the injectors recognised on the pod.
    pub(crate) injectors: Vec<String>,
    pub(crate) sidecars: Vec<Sidecar>,
    pub(crate) init_containers: Vec<String>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default, rename = "initContainers")]
    init_containers: Option<Vec<String>>,
    #[serde(default)]
    containers: Option<Vec<String>>,
}

/// An injector's status lists, checked: each at most [`tenant::MAX_NAMES`] distinct DNS-1123
/// labels.
struct Listed {
    init_containers: Vec<String>,
    containers: Vec<String>,
}

/// Reads the status annotation `v`: the size first (a longer one is refused before any JSON is
/// decoded), then the shape, then the lists.
fn read_status(v: &str) -> Result<Listed, String> {
    let v = tenant::value(v).map_err(|e| e.to_string())?;
    let s: Status = serde_json::from_str(v).map_err(|e| {
        format!(
            "not JSON of the expected shape: {}",
            tenant::text(&e.to_string(), tenant::MAX_FIELD)
        )
    })?;
    let list = |l: Option<Vec<String>>, what: &str| {
        tenant::names(l.iter().flatten().map(String::as_str)).map_err(|e| format!("{what}: {e}"))
    };
    Ok(Listed {
        init_containers: list(s.init_containers, "initContainers")?,
        containers: list(s.containers, "containers")?,
    })
}

/// Applies the table to a pod's annotations. `crisp.dev/ready.<name>` (in `ready_override`)
/// wins over the table's readiness; malformed injector annotations yield warnings and are
/// treated as absent.
pub(crate) fn recognise(
    table: &[InjectorRule],
    annotations: &HashMap<String, String>,
    ready_override: &dyn Fn(&str) -> Option<Readiness>,
    warnings: &mut Warnings,
) -> Injected {
    let mut out = Injected::default();
    // Names already added, so each is added once in one look (the table's lists are the
    // operator's, the status lists at most 64 names each).
    let mut init_seen: HashSet<String> = HashSet::new();
    let mut sidecar_seen: HashSet<String> = HashSet::new();
    for rule in table {
        if !rule
            .when
            .iter()
            .any(|k| annotations.get(k).is_some_and(|v| !v.trim().is_empty()))
        {
            continue;
        }
        if rule
            .unless
            .iter()
            .any(|(k, v)| annotations.get(k).is_some_and(|a| a.trim() == v))
        {
            continue;
        }
        let mut status: Option<Listed> = None;
        if let Some(key) = &rule.status {
            if let Some(v) = annotations.get(key) {
                match read_status(v) {
                    Ok(s) => status = Some(s),
                    Err(e) => {
                        warnings.push(Warning::new(
                            key,
                            v,
                            format!(
                                "not the {} injector's status ({e}); pod not treated as injected",
                                rule.name
                            ),
                        ));
                        continue;
                    }
                }
            }
        }
        out.injectors.push(rule.name.clone());
        let has_status = status.is_some();
        let (listed_init, listed) = match status {
            Some(s) => (s.init_containers, s.containers),
            None => (Vec::new(), Vec::new()),
        };
        let listed_init_set: HashSet<&str> = listed_init.iter().map(String::as_str).collect();
        let listed_set: HashSet<&str> = listed.iter().map(String::as_str).collect();
        for name in rule.init_containers.iter().chain(&listed_init) {
            if init_seen.insert(name.clone()) {
                out.init_containers.push(name.clone());
            }
        }
        let mut add =
            |name: &str, ready: Readiness, required: bool, base: &dyn Fn() -> Readiness| {
                if sidecar_seen.insert(name.to_string()) {
                    // An overriding `crisp.dev/ready.<name>` is the pod author's: checked at probe
                    // time, falling back to the table's own readiness.
                    let key = format!("{READY_PREFIX}{name}");
                    let tenant = annotations
                        .get(&key)
                        .and_then(|v| tenant_ready(&key, v, &ready, base));
                    out.sidecars.push(Sidecar {
                        name: name.to_string(),
                        ready,
                        required,
                        tenant,
                    });
                }
            };
        for s in &rule.sidecars {
            if has_status && !listed_set.contains(s.name.as_str()) {
                continue; // Not injected (or injected as an init container: native sidecar).
            }
            let ready = match ready_override(&s.name) {
                Some(r) => r,
                None => with_port(&rule.name, s, annotations, warnings),
            };
            // Without the override: the table's readiness (its warnings were given above or
            // are not wanted twice).
            add(&s.name, ready, s.always, &|| {
                with_port(&rule.name, s, annotations, &mut Warnings::default())
            });
        }
        // Containers the injector says it added that the table does not describe: sidecars,
        // judged by `running`.
        for name in &listed {
            if !listed_init_set.contains(name.as_str()) {
                let ready = ready_override(name).unwrap_or(Readiness::Running);
                add(name, ready, true, &|| Readiness::Running);
            }
        }
    }
    out
}

fn with_port(
    injector: &str,
    s: &InjectedSidecar,
    annotations: &HashMap<String, String>,
    warnings: &mut Warnings,
) -> Readiness {
    // Validated at config load (built-ins by a test).
    let ready = Readiness::parse(&s.ready).unwrap_or(Readiness::Running);
    let Some(key) = &s.port_annotation else {
        return ready;
    };
    let Some(v) = annotations.get(key) else {
        return ready;
    };
    match tenant::value(v)
        .ok()
        .and_then(|v| v.trim().parse::<u16>().ok())
        .ok_or(())
    {
        Ok(0) => Readiness::Running,
        Ok(p) => match ready {
            Readiness::Http { host, path, .. } => Readiness::Http {
                host,
                port: p,
                path,
            },
            Readiness::Tcp { host, .. } => Readiness::Tcp { host, port: p },
            other => other,
        },
        Err(_) => {
            warnings.push(Warning::new(
                key,
                v,
                format!(
                    "not a port number; using the {injector} default for {}",
                    s.name
                ),
            ));
            ready
        }
    }
}
