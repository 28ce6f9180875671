//! The known-injector table (DESIGN.md §2): which pod annotations prove that a mesh or agent
//! injector mutated a pod, and what it added. Plain data, read with the config: [`builtin`],
//! extended or replaced by `[[injectors]]` in the config file. The ordering engine applies it
//! (`ordering/injectors.rs`).
//!
//! An entry says which pod annotation proves the injector ran (`when`), which annotation values
//! mean it injected no legacy sidecar after all (`unless`: native-sidecar modes, init-only
//! modes), which containers it adds as init containers and which as sidecars (with their
//! readiness, and the pod annotation that moves the readiness port). Istio also writes the
//! names it injected into a JSON annotation (`status`), which then decides.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::readiness::Readiness;

/// One injector crisp recognises.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InjectorRule {
    /// A short name for logs and the admin API (`istio`); a config entry with the name of a
    /// built-in one replaces it.
    pub(crate) name: String,
    /// `false` removes the built-in entry of this name.
    #[serde(default = "yes")]
    pub(crate) enabled: bool,
    /// The pod was injected when any of these annotations is present and not empty. They must
    /// be annotations the injector itself writes, not the user's request (`linkerd.io/inject:
    /// enabled` stays on a pod the webhook failed to mutate).
    pub(crate) when: Vec<String>,
    /// ... unless one of these annotations has exactly this value (the injector then added no
    /// legacy sidecar: native-sidecar mode, an init-only mode).
    #[serde(default)]
    pub(crate) unless: BTreeMap<String, String>,
    /// An annotation holding the injector's JSON record of what it added:
    /// `{"initContainers": [...], "containers": [...]}` (Istio's `sidecar.istio.io/status`).
    /// When present it decides: a listed container is a sidecar if it is in `containers`, and
    /// an init container (left alone: native sidecars) if it is in `initContainers`.
    #[serde(default)]
    pub(crate) status: Option<String>,
    /// Init containers the injector adds.
    #[serde(default)]
    pub(crate) init_containers: Vec<String>,
    /// Sidecars the injector adds, in start order.
    #[serde(default)]
    pub sidecars: Vec<InjectedSidecar>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InjectedSidecar {
    pub(crate) name: String,
    /// Readiness spec, the forms of `crisp.dev/ready.<name>` (which wins when set).
    #[serde(default = "running")]
    pub(crate) ready: String,
    /// A pod annotation whose value, when set, replaces the port of `ready` ("0": no probe,
    /// `running` is used).
    #[serde(default)]
    pub(crate) port_annotation: Option<String>,
    /// The injector always adds this container, so the app waits for it even when it is listed
    /// after the app (crisp refuses the app until it exists). `false`: ordered once it exists.
    #[serde(default = "yes")]
    pub(crate) always: bool,
}

fn yes() -> bool {
    true
}
fn running() -> String {
    "running".into()
}

pub(crate) fn sidecar(
    name: &str,
    ready: &str,
    port_annotation: Option<&str>,
    always: bool,
) -> InjectedSidecar {
    InjectedSidecar {
        name: name.into(),
        ready: ready.into(),
        port_annotation: port_annotation.map(Into::into),
        always,
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The injectors crisp knows out of the box. Only those whose injected pods are unambiguous:
/// an annotation the injector itself writes, and fixed container names. See README "Known
/// injectors" for what was left out and why.
pub fn builtin() -> Vec<InjectorRule> {
    vec![
        // Istio: the injector writes sidecar.istio.io/status, e.g.
        // {"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":[...],...}.
        // In native-sidecar mode (kubelet ≥ 1.28) istio-proxy is listed under initContainers.
        // holdApplicationUntilProxyStarts lists the proxy first with a blocking postStart:
        // kubelet then waits by itself, and crisp's gate finds it ready.
        InjectorRule {
            name: "istio".into(),
            enabled: true,
            when: strings(&["sidecar.istio.io/status"]),
            unless: BTreeMap::new(),
            status: Some("sidecar.istio.io/status".into()),
            init_containers: strings(&["istio-init", "istio-validation"]),
            sidecars: vec![sidecar(
                "istio-proxy",
                "http://:15021/healthz/ready",
                Some("status.sidecar.istio.io/port"),
                true,
            )],
        },
        // Linkerd: the injector writes linkerd.io/proxy-version (also `linkerd inject --manual`).
        // linkerd-network-validator replaces linkerd-init with the CNI plugin. With native
        // sidecars enabled per pod, linkerd-proxy is an init container: kubelet orders it.
        InjectorRule {
            name: "linkerd".into(),
            enabled: true,
            when: strings(&["linkerd.io/proxy-version"]),
            unless: [
                (
                    "config.beta.linkerd.io/proxy-enable-native-sidecar".to_string(),
                    "true".to_string(),
                ),
                (
                    "config.alpha.linkerd.io/proxy-enable-native-sidecar".to_string(),
                    "true".to_string(),
                ),
            ]
            .into(),
            status: None,
            init_containers: strings(&["linkerd-init", "linkerd-network-validator"]),
            sidecars: vec![sidecar(
                "linkerd-proxy",
                "http://:4191/ready",
                Some("config.linkerd.io/admin-port"),
                true,
            )],
        },
        // Vault Agent injector (vault-k8s): writes agent-inject-status after injecting
        // vault-agent-init and, unless agent-pre-populate-only, the vault-agent sidecar — which
        // it appends after the apps, and which the apps do not need at start (the init
        // container rendered the secrets). So it is ordered only once it exists: it stops after
        // the apps, and a Job's vault-agent is ended with the Job.
        InjectorRule {
            name: "vault-agent".into(),
            enabled: true,
            when: strings(&["vault.hashicorp.com/agent-inject-status"]),
            unless: [(
                "vault.hashicorp.com/agent-pre-populate-only".to_string(),
                "true".to_string(),
            )]
            .into(),
            status: None,
            init_containers: strings(&["vault-agent-init"]),
            sidecars: vec![sidecar("vault-agent", "running", None, false)],
        },
    ]
}

/// The node's table: the built-ins (unless `known_injectors = false`), then the config's
/// entries, each replacing a built-in of the same name.
pub(crate) fn table(known_injectors: bool, configured: &[InjectorRule]) -> Vec<InjectorRule> {
    let mut out: Vec<InjectorRule> = if known_injectors {
        builtin()
    } else {
        Vec::new()
    };
    for rule in configured {
        out.retain(|r| r.name != rule.name);
        if rule.enabled {
            out.push(rule.clone());
        }
    }
    out
}

/// Checks one entry at config load (same rules for built-ins, tested below).
pub fn validate(rule: &InjectorRule) -> Result<(), (String, String)> {
    if rule.name.is_empty() {
        return Err(("name".into(), "must not be empty".into()));
    }
    if rule.enabled && rule.when.iter().all(|w| w.is_empty()) {
        return Err((
            "when".into(),
            "needs at least one annotation that the injector writes on the pods it mutated".into(),
        ));
    }
    // A name that no container can have would never match one: a typo, said at load.
    let not_a_name = "must be a container name (a DNS-1123 label: a-z, 0-9 and '-', at most 63)";
    for (i, s) in rule.sidecars.iter().enumerate() {
        if s.name.is_empty() {
            return Err((format!("sidecars[{i}].name"), "must not be empty".into()));
        }
        if !crate::tenant::is_dns1123_label(&s.name) {
            return Err((format!("sidecars[{i}].name"), not_a_name.into()));
        }
        Readiness::parse(&s.ready).map_err(|m| (format!("sidecars[{i}].ready"), m))?;
    }
    if let Some(i) = rule
        .init_containers
        .iter()
        .position(|n| !crate::tenant::is_dns1123_label(n))
    {
        return Err((format!("init_containers[{i}]"), not_a_name.into()));
    }
    Ok(())
}
