//! The annotation contract (DESIGN.md §2): which containers of a pod are sidecars, how crisp
//! judges them ready, how long it may hold, whether the pod is a Job.
//!
//! A malformed value never blocks a pod: it yields a [`Warning`] (logged once per pod, counted)
//! and the pod is treated as if the key were absent.

use std::collections::HashMap;
use std::time::Duration;

use super::readiness::Readiness;
use crate::config::{parse_duration, SidecarRule, TimeoutPolicy, MAX_START_TIMEOUT};

pub const SIDECARS: &str = "crisp.dev/sidecars";
pub const READY_PREFIX: &str = "crisp.dev/ready.";
pub const START_TIMEOUT: &str = "crisp.dev/start-timeout";
pub const TIMEOUT_POLICY: &str = "crisp.dev/timeout-policy";
pub const JOB: &str = "crisp.dev/job";
pub const RESTART_POLICY: &str = "crisp.dev/restart-policy";

/// Most sidecars one pod may declare; more is a typo or an attack, not a pod.
pub const MAX_SIDECARS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sidecar {
    pub name: String,
    pub ready: Readiness,
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
    /// Node-wide rules: only sidecars that exist in the sandbox are waited for.
    NodeRules,
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
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl PodPolicy {
    /// Parses a pod's annotations against the node's rules.
    pub fn parse(annotations: &HashMap<String, String>, rules: &[SidecarRule]) -> (PodPolicy, Vec<Warning>) {
        let mut warnings = Vec::new();
        let mut warn = |key: &str, value: &str, reason: String| {
            warnings.push(Warning { key: key.to_string(), value: value.to_string(), reason });
        };

        let mut names: Option<Vec<String>> = None;
        if let Some(v) = annotations.get(SIDECARS) {
            match parse_sidecar_list(v) {
                Ok(list) => names = Some(list),
                Err(reason) => warn(SIDECARS, v, reason),
            }
        }

        let (sidecars, source) = match names {
            Some(names) => {
                let list = names
                    .into_iter()
                    .map(|name| {
                        let key = format!("{READY_PREFIX}{name}");
                        let ready = match annotations.get(&key) {
                            None => rules.iter().find(|r| r.name == name).and_then(|r| Readiness::parse(&r.ready).ok()).unwrap_or(Readiness::Running),
                            Some(spec) => Readiness::parse(spec).unwrap_or_else(|reason| {
                                warn(&key, spec, format!("{reason}; using `running`"));
                                Readiness::Running
                            }),
                        };
                        Sidecar { name, ready }
                    })
                    .collect::<Vec<_>>();
                (list, Source::Annotation)
            }
            None => {
                // Node rules; invalid rule readiness was rejected at config load.
                let list = rules
                    .iter()
                    .map(|r| Sidecar { name: r.name.clone(), ready: Readiness::parse(&r.ready).unwrap_or(Readiness::Running) })
                    .collect();
                (list, Source::NodeRules)
            }
        };

        for (k, v) in annotations {
            if let Some(name) = k.strip_prefix(READY_PREFIX) {
                if source == Source::Annotation && !sidecars.iter().any(|s| s.name == name) {
                    warn(k, v, format!("`{name}` is not listed in {SIDECARS}"));
                }
            }
        }

        let start_timeout = annotations.get(START_TIMEOUT).and_then(|v| match parse_duration(v) {
            Ok(d) if d.is_zero() => {
                warn(START_TIMEOUT, v, "must be greater than 0".into());
                None
            }
            Ok(d) if d > MAX_START_TIMEOUT => {
                warn(START_TIMEOUT, v, format!("longer than {MAX_START_TIMEOUT:?}: holds must end before kubelet's 2 min deadline"));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                warn(START_TIMEOUT, v, e);
                None
            }
        });
        let timeout_policy = annotations.get(TIMEOUT_POLICY).and_then(|v| match v.trim() {
            "proceed" => Some(TimeoutPolicy::Proceed),
            "fail" => Some(TimeoutPolicy::Fail),
            _ => {
                warn(TIMEOUT_POLICY, v, "expected `proceed` or `fail`".into());
                None
            }
        });
        let job = annotations.get(JOB).and_then(|v| match v.trim() {
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                warn(JOB, v, "expected \"true\" or \"false\"".into());
                None
            }
        });
        let restart_policy = annotations.get(RESTART_POLICY).and_then(|v| match v.trim() {
            "Always" => Some(RestartPolicy::Always),
            "OnFailure" => Some(RestartPolicy::OnFailure),
            "Never" => Some(RestartPolicy::Never),
            _ => {
                warn(RESTART_POLICY, v, "expected Always, OnFailure or Never".into());
                None
            }
        });
        warnings.sort_by(|a, b| a.key.cmp(&b.key));
        (PodPolicy { sidecars, source, start_timeout, timeout_policy, job, restart_policy }, warnings)
    }

    pub fn has_sidecars(&self) -> bool {
        !self.sidecars.is_empty()
    }

    pub fn sidecar_index(&self, container: &str) -> Option<usize> {
        self.sidecars.iter().position(|s| s.name == container)
    }
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
