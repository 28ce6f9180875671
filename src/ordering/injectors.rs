//! Known injectors (DESIGN.md §2): pods that a mesh or agent injector mutated carry the
//! injector's own annotations, so crisp orders them with zero configuration. The table is data
//! (`config/injectors.rs`); this applies it to one pod's annotations.

use std::collections::HashMap;

use serde::Deserialize;

use super::annotations::{Sidecar, Warning};
#[cfg(test)]
use crate::config::injectors::{builtin, table, validate};
pub use crate::config::injectors::{InjectedSidecar, InjectorRule};
use crate::readiness::Readiness;

/// What the injectors that mutated one pod added to it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Injected {
    /// Names of the injectors recognised on the pod.
    pub injectors: Vec<String>,
    pub sidecars: Vec<Sidecar>,
    pub init_containers: Vec<String>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default, rename = "initContainers")]
    init_containers: Option<Vec<String>>,
    #[serde(default)]
    containers: Option<Vec<String>>,
}

/// Applies the table to a pod's annotations. `crisp.dev/ready.<name>` (in `ready_override`)
/// wins over the table's readiness; malformed injector annotations yield warnings and are
/// treated as absent.
pub fn recognise(table: &[InjectorRule], annotations: &HashMap<String, String>, ready_override: &dyn Fn(&str) -> Option<Readiness>, warnings: &mut Vec<Warning>) -> Injected {
    let mut out = Injected::default();
    for rule in table {
        if !rule.when.iter().any(|k| annotations.get(k).is_some_and(|v| !v.trim().is_empty())) {
            continue;
        }
        if rule.unless.iter().any(|(k, v)| annotations.get(k).is_some_and(|a| a.trim() == v)) {
            continue;
        }
        let mut status: Option<Status> = None;
        if let Some(key) = &rule.status {
            if let Some(v) = annotations.get(key) {
                match serde_json::from_str::<Status>(v) {
                    Ok(s) => status = Some(s),
                    Err(e) => {
                        warnings.push(Warning {
                            key: key.clone(),
                            value: v.clone(),
                            reason: format!("not the {} injector's JSON status ({e}); pod not treated as injected", rule.name),
                        });
                        continue;
                    }
                }
            }
        }
        out.injectors.push(rule.name.clone());
        let listed_init = status.as_ref().and_then(|s| s.init_containers.clone()).unwrap_or_default();
        let listed = status.as_ref().and_then(|s| s.containers.clone()).unwrap_or_default();
        for name in rule.init_containers.iter().chain(&listed_init) {
            if !out.init_containers.contains(name) {
                out.init_containers.push(name.clone());
            }
        }
        let mut add = |name: &str, ready: Readiness, required: bool, base: &dyn Fn() -> Readiness| {
            if !out.sidecars.iter().any(|s| s.name == name) {
                // An overriding `crisp.dev/ready.<name>` is the pod author's: checked at probe
                // time, falling back to the table's own readiness.
                let key = format!("{}{name}", super::annotations::READY_PREFIX);
                let tenant = annotations.get(&key).and_then(|v| super::annotations::tenant_ready(&key, v, &ready, base));
                out.sidecars.push(Sidecar { name: name.to_string(), ready, required, tenant });
            }
        };
        for s in &rule.sidecars {
            if status.is_some() && !listed.contains(&s.name) {
                continue; // Not injected (or injected as an init container: native sidecar).
            }
            let ready = match ready_override(&s.name) {
                Some(r) => r,
                None => with_port(&rule.name, s, annotations, warnings),
            };
            // Without the override: the table's readiness (its warnings were given above or
            // are not wanted twice).
            add(&s.name, ready, s.always, &|| with_port(&rule.name, s, annotations, &mut Vec::new()));
        }
        // Containers the injector says it added that the table does not describe: sidecars,
        // judged by `running`.
        for name in &listed {
            if !listed_init.contains(name) {
                let ready = ready_override(name).unwrap_or(Readiness::Running);
                add(name, ready, true, &|| Readiness::Running);
            }
        }
    }
    out
}

fn with_port(injector: &str, s: &InjectedSidecar, annotations: &HashMap<String, String>, warnings: &mut Vec<Warning>) -> Readiness {
    // Validated at config load (built-ins by a test).
    let ready = Readiness::parse(&s.ready).unwrap_or(Readiness::Running);
    let Some(key) = &s.port_annotation else { return ready };
    let Some(v) = annotations.get(key) else { return ready };
    match v.trim().parse::<u16>() {
        Ok(0) => Readiness::Running,
        Ok(p) => match ready {
            Readiness::Http { host, path, .. } => Readiness::Http { host, port: p, path },
            Readiness::Tcp { host, .. } => Readiness::Tcp { host, port: p },
            other => other,
        },
        Err(_) => {
            warnings.push(Warning { key: key.clone(), value: v.clone(), reason: format!("not a port number; using the {injector} default for {}", s.name) });
            ready
        }
    }
}

#[cfg(test)]
mod tests;
