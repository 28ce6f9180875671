//! The pod model: the subset of a `v1.Pod` that reaches (or shapes) kubelet's CRI traffic.
//!
//! # YAML format
//!
//! A flat document (unknown keys are rejected, so typos don't go unnoticed):
//!
//! ```yaml
//! name: web
//! namespace: default              # default "default"
//! uid: 6f1c…                      # default: a random UUID
//! annotations:
//!   crisp.dev/sidecars: proxy
//! labels:
//!   app: web
//! restartPolicy: Always           # Always (default) | OnFailure | Never
//! terminationGracePeriodSeconds: 30   # default 30
//! hostNetwork: true               # default false (needs CNI in the runtime)
//! initContainers:
//!   - name: init
//!     command: [sh, -c, "true"]
//! containers:
//!   - name: proxy
//!     image: crisp.test/busybox:latest   # the default
//!     imagePullPolicy: IfNotPresent      # IfNotPresent (default) | Always | Never
//!     command: [sh, -c]
//!     args: ["trap 'exit 0' TERM; sleep 3600 & wait"]
//!     env:
//!       - {name: MODE, value: sidecar}
//!     lifecycle:
//!       postStart: {exec: {command: [sh, -c, "touch /tmp/ready"]}}
//!       preStop:   {exec: {command: [sh, -c, "sleep 1"]}}
//!   - name: app
//!     command: [sh, -c, "sleep 3600"]
//! ```
//!
//! A real manifest (`apiVersion: v1`, `kind: Pod`, `metadata`, `spec`) is accepted too; there,
//! fields the emulator does not model (ports, resources, probes, volumes, …) are ignored.
//!
//! Differences from the API server's defaulting: `imagePullPolicy` defaults to `IfNotPresent`
//! even for `:latest` images (the test runtime has no registry), and no service-account volume,
//! DNS policy or priority is added.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// Default image of a container.
pub const DEFAULT_IMAGE: &str = "crisp.test/busybox:latest";

/// `v1.RestartPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartPolicy {
    /// Always restart.
    #[default]
    Always,
    /// Restart on non-zero exit.
    OnFailure,
    /// Never restart.
    Never,
}

/// `v1.PullPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull only when ImageStatus says the image is absent.
    #[default]
    IfNotPresent,
    /// Never pull.
    Never,
}

/// One environment variable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value (literal; `valueFrom` is not modelled).
    #[serde(default)]
    pub value: String,
}

/// `v1.ExecAction`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecAction {
    /// argv.
    pub command: Vec<String>,
}

/// `v1.LifecycleHandler`; only `exec` (HTTP hooks never touch the CRI, KUBELET-CRI §6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Handler {
    /// The exec action.
    pub exec: ExecAction,
}

/// `v1.Lifecycle`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lifecycle {
    /// Run by ExecSync(timeout 0) right after StartContainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_start: Option<Handler>,
    /// Run by ExecSync(timeout 0) before StopContainer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<Handler>,
}

/// `v1.Container` (modelled subset).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSpec {
    /// Name, unique in the pod.
    pub name: String,
    /// Image reference.
    #[serde(default = "default_image")]
    pub image: String,
    /// Pull policy.
    #[serde(default)]
    pub image_pull_policy: PullPolicy,
    /// Entrypoint override.
    #[serde(default)]
    pub command: Vec<String>,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Environment.
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// Hooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    /// Default `/dev/termination-log`.
    #[serde(default = "default_termination_message_path")]
    pub termination_message_path: String,
    /// Default `File`.
    #[serde(default = "default_termination_message_policy")]
    pub termination_message_policy: String,
}

/// The pod (metadata and spec flattened).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// metadata.name
    pub name: String,
    /// metadata.namespace
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// metadata.uid; empty = generate one in [`PodSpec::validate`].
    #[serde(default)]
    pub uid: String,
    /// metadata.annotations
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// metadata.labels
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// spec.restartPolicy
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// spec.terminationGracePeriodSeconds
    #[serde(default = "default_grace")]
    pub termination_grace_period_seconds: i64,
    /// spec.hostNetwork
    #[serde(default)]
    pub host_network: bool,
    /// spec.runtimeClassName, sent as RunPodSandbox's `runtime_handler` as is (the emulator
    /// has no RuntimeClass objects: each class's handler is its name). Empty: the runtime's
    /// default handler.
    #[serde(default)]
    pub runtime_class_name: String,
    /// spec.initContainers
    #[serde(default)]
    pub init_containers: Vec<ContainerSpec>,
    /// spec.containers
    pub containers: Vec<ContainerSpec>,
}

fn default_image() -> String {
    DEFAULT_IMAGE.to_string()
}
fn default_namespace() -> String {
    "default".to_string()
}
fn default_grace() -> i64 {
    30
}
fn default_termination_message_path() -> String {
    "/dev/termination-log".to_string()
}
fn default_termination_message_policy() -> String {
    "File".to_string()
}

const POD_KEYS: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "annotations",
    "labels",
    "restartPolicy",
    "terminationGracePeriodSeconds",
    "hostNetwork",
    "runtimeClassName",
    "initContainers",
    "containers",
];
const CONTAINER_KEYS: &[&str] = &[
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "workingDir",
    "env",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
];

// === impl ContainerSpec ===

impl ContainerSpec {
    /// A container running `sh -c script` in the default image.
    pub fn sh(name: &str, script: &str) -> ContainerSpec {
        ContainerSpec {
            name: name.to_string(),
            image: default_image(),
            image_pull_policy: PullPolicy::IfNotPresent,
            command: vec!["sh".into(), "-c".into(), script.to_string()],
            args: Vec::new(),
            working_dir: None,
            env: Vec::new(),
            lifecycle: None,
            termination_message_path: default_termination_message_path(),
            termination_message_policy: default_termination_message_policy(),
        }
    }

    /// Adds an exec postStart hook running `sh -c script`.
    pub fn post_start(mut self, script: &str) -> ContainerSpec {
        let h = Handler {
            exec: ExecAction {
                command: vec!["sh".into(), "-c".into(), script.to_string()],
            },
        };
        self.lifecycle
            .get_or_insert_with(Lifecycle::default)
            .post_start = Some(h);
        self
    }

    /// Adds an exec preStop hook running `sh -c script`.
    pub fn pre_stop(mut self, script: &str) -> ContainerSpec {
        let h = Handler {
            exec: ExecAction {
                command: vec!["sh".into(), "-c".into(), script.to_string()],
            },
        };
        self.lifecycle
            .get_or_insert_with(Lifecycle::default)
            .pre_stop = Some(h);
        self
    }

    /// The postStart handler, if any.
    pub fn post_start_hook(&self) -> Option<&Handler> {
        self.lifecycle.as_ref().and_then(|l| l.post_start.as_ref())
    }

    /// The preStop handler, if any.
    pub fn pre_stop_hook(&self) -> Option<&Handler> {
        self.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
    }

    /// `kubecontainer.HashContainer`: FNV-32a over the container's JSON (KUBELET-CRI §2.2),
    /// formatted in hex for the `io.kubernetes.container.hash` annotation. Stable for a spec.
    pub fn hash(&self) -> String {
        // Serializing plain strings/vectors cannot fail; fall back to Debug just in case.
        let json = serde_json::to_vec(self).unwrap_or_else(|_| format!("{self:?}").into_bytes());
        format!("{:x}", fnv32a(&json))
    }
}

fn fnv32a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

// === impl PodSpec ===

impl PodSpec {
    /// A pod with defaults and the given regular containers.
    pub fn new(name: &str, containers: Vec<ContainerSpec>) -> PodSpec {
        PodSpec {
            name: name.to_string(),
            namespace: default_namespace(),
            uid: String::new(),
            annotations: BTreeMap::new(),
            labels: BTreeMap::new(),
            restart_policy: RestartPolicy::Always,
            termination_grace_period_seconds: default_grace(),
            host_network: false,
            runtime_class_name: String::new(),
            init_containers: Vec::new(),
            containers,
        }
    }

    /// Parses every YAML document in `text` (flat format or `kind: Pod` manifests).
    pub fn from_yaml(text: &str) -> anyhow::Result<Vec<PodSpec>> {
        let mut pods = Vec::new();
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let value = serde_yaml_ng::Value::deserialize(doc)
                .with_context(|| format!("YAML document {}", i + 1))?;
            if value.is_null() {
                continue;
            }
            let pod =
                PodSpec::from_value(value).with_context(|| format!("YAML document {}", i + 1))?;
            pods.push(pod);
        }
        Ok(pods)
    }

    /// Reads and parses a YAML file.
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Vec<PodSpec>> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        PodSpec::from_yaml(&text).with_context(|| format!("parsing {}", path.display()))
    }

    fn from_value(value: serde_yaml_ng::Value) -> anyhow::Result<PodSpec> {
        use serde_yaml_ng::{Mapping, Value};
        let Value::Mapping(map) = value else {
            bail!("a pod must be a YAML mapping")
        };
        let is_manifest =
            map.contains_key("spec") || map.contains_key("metadata") || map.contains_key("kind");
        let flat = if is_manifest {
            if let Some(kind) = map.get("kind").and_then(Value::as_str) {
                if kind != "Pod" {
                    bail!("kind {kind:?} is not supported, only Pod");
                }
            }
            // Fold metadata and spec into the flat form, keeping only modelled keys.
            let mut flat = Mapping::new();
            for section in ["metadata", "spec"] {
                if let Some(Value::Mapping(m)) = map.get(section) {
                    for (k, v) in m {
                        if k.as_str().is_some_and(|k| POD_KEYS.contains(&k)) {
                            flat.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            for key in ["initContainers", "containers"] {
                if let Some(Value::Sequence(cs)) = flat.get_mut(key) {
                    for c in cs.iter_mut() {
                        if let Value::Mapping(cm) = c {
                            cm.retain(|k, _| {
                                k.as_str().is_some_and(|k| CONTAINER_KEYS.contains(&k))
                            });
                            if let Some(Value::Mapping(lc)) = cm.get_mut("lifecycle") {
                                lc.retain(|k, _| {
                                    matches!(k.as_str(), Some("postStart" | "preStop"))
                                });
                            }
                        }
                    }
                }
            }
            flat
        } else {
            check_keys(&map, POD_KEYS, "pod")?;
            for key in ["initContainers", "containers"] {
                if let Some(Value::Sequence(cs)) = map.get(key) {
                    for c in cs {
                        if let Value::Mapping(cm) = c {
                            check_keys(cm, CONTAINER_KEYS, "container")?;
                        }
                    }
                }
            }
            map
        };
        let pod: PodSpec = serde_yaml_ng::from_value(Value::Mapping(flat))?;
        Ok(pod)
    }

    /// Checks names and hooks, and fills in a generated UID if none was given.
    pub fn validate(&mut self) -> anyhow::Result<()> {
        if self.name.is_empty() {
            bail!("pod name is empty");
        }
        if self.containers.is_empty() {
            bail!("pod {} has no containers", self.name);
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in self.init_containers.iter().chain(&self.containers) {
            if c.name.is_empty() {
                bail!("pod {}: a container has an empty name", self.name);
            }
            if !seen.insert(c.name.as_str()) {
                bail!("pod {}: duplicate container name {:?}", self.name, c.name);
            }
        }
        // API validation rejects hooks on init containers (KUBELET-CRI §7.5).
        if let Some(c) = self.init_containers.iter().find(|c| c.lifecycle.is_some()) {
            bail!(
                "pod {}: init container {:?} may not have lifecycle hooks",
                self.name,
                c.name
            );
        }
        if self.termination_grace_period_seconds < 0 {
            bail!(
                "pod {}: terminationGracePeriodSeconds must be >= 0",
                self.name
            );
        }
        if self.uid.is_empty() {
            self.uid = super::rand::uuid_v4();
        }
        Ok(())
    }

    /// A container (init or regular) by name.
    pub fn container(&self, name: &str) -> Option<&ContainerSpec> {
        self.containers
            .iter()
            .chain(&self.init_containers)
            .find(|c| c.name == name)
    }

    /// kubelet's `format.Pod`: `name_namespace(uid)`.
    pub fn format(&self) -> String {
        format!("{}_{}({})", self.name, self.namespace, self.uid)
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
impl PodSpec {
    /// Pod `p` (uid `uid`) of the unit tests: init containers `init` and containers
    /// `containers` that each run `true`, restarted as `policy` says.
    pub(crate) fn of_true(policy: RestartPolicy, init: &[&str], containers: &[&str]) -> PodSpec {
        let mut p = PodSpec::new(
            "p",
            containers
                .iter()
                .map(|n| ContainerSpec::sh(n, "true"))
                .collect(),
        );
        p.init_containers = init.iter().map(|n| ContainerSpec::sh(n, "true")).collect();
        p.restart_policy = policy;
        p.uid = "uid".into();
        p
    }
}

impl fmt::Display for PodSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

fn check_keys(map: &serde_yaml_ng::Mapping, allowed: &[&str], what: &str) -> anyhow::Result<()> {
    for k in map.keys() {
        match k.as_str() {
            Some(k) if allowed.contains(&k) => {}
            other => bail!(
                "unknown {what} field {:?} (known: {})",
                other.unwrap_or("<non-string>"),
                allowed.join(", ")
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flat_yaml_with_defaults() {
        let pods =
            PodSpec::from_yaml("name: web\nhostNetwork: true\ncontainers:\n  - name: a\n    command: [sh]\n    lifecycle:\n      preStop: {exec: {command: [sleep, '1']}}\n")
                .expect("parse");
        let p = &pods[0];
        assert_eq!(p.namespace, "default");
        assert_eq!(p.termination_grace_period_seconds, 30);
        assert_eq!(p.restart_policy, RestartPolicy::Always);
        assert_eq!(p.containers[0].image, DEFAULT_IMAGE);
        assert_eq!(p.containers[0].image_pull_policy, PullPolicy::IfNotPresent);
        let json =
            serde_json::to_string(p.containers[0].pre_stop_hook().expect("hook")).expect("json");
        assert_eq!(json, r#"{"exec":{"command":["sleep","1"]}}"#);
    }

    #[test]
    fn rejects_unknown_flat_keys() {
        let err = PodSpec::from_yaml("name: web\nrestartpolicy: Never\ncontainers: [{name: a}]\n")
            .expect_err("typo must fail");
        assert!(format!("{err:#}").contains("restartpolicy"), "{err:#}");
    }

    #[test]
    fn parses_manifest_ignoring_unmodelled_fields() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: m\n  namespace: ns\n  labels: {a: b}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    ports: [{containerPort: 80}]\n    lifecycle: {postStart: {exec: {command: [x]}}}\n";
        let pods = PodSpec::from_yaml(text).expect("parse");
        assert_eq!(pods[0].namespace, "ns");
        assert_eq!(pods[0].restart_policy, RestartPolicy::Never);
        assert!(pods[0].containers[0].post_start_hook().is_some());
    }

    #[test]
    fn hash_is_stable_and_spec_sensitive() {
        let a = ContainerSpec::sh("a", "sleep 1");
        assert_eq!(a.hash(), a.clone().hash());
        assert_ne!(a.hash(), ContainerSpec::sh("a", "sleep 2").hash());
    }

    #[test]
    fn validate_generates_uid_and_rejects_duplicates() {
        let mut p = PodSpec::new("p", vec![ContainerSpec::sh("a", "true")]);
        p.validate().expect("valid");
        assert_eq!(p.uid.len(), 36);
        let mut d = PodSpec::new(
            "p",
            vec![
                ContainerSpec::sh("a", "true"),
                ContainerSpec::sh("a", "true"),
            ],
        );
        assert!(d.validate().is_err());
    }
}
