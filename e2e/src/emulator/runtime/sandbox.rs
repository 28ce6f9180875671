//! kubelet's `kuberuntime_sandbox.go`: creating a pod's sandbox and the config it is created
//! with, and checking the status the runtime reports for it.

use super::*;

impl Runtime {
    /// `createPodSandbox`: config, log directory, RunPodSandbox.
    pub(super) async fn create_pod_sandbox(
        &self,
        pod: &PodCtx,
        attempt: u32,
    ) -> Result<String, String> {
        let spec = &pod.spec;
        let config = self.generate_pod_sandbox_config(spec, attempt);
        std::fs::create_dir_all(&config.log_directory).map_err(|e| {
            format!(
                "Failed to create log directory for pod {:?}: {e}",
                spec.format()
            )
        })?;
        self.cri
            .run_pod_sandbox(config, spec.runtime_class_name.clone(), pod.meta())
            .await
            .map_err(|s| {
                format!(
                    "Failed to create sandbox for pod {:?}: {}",
                    spec.format(),
                    go_error(&s)
                )
            })
    }

    /// `generatePodSandboxConfig` (KUBELET-CRI §2.1).
    pub fn generate_pod_sandbox_config(
        &self,
        pod: &PodSpec,
        attempt: u32,
    ) -> cri::PodSandboxConfig {
        let mut labels: HashMap<String, String> = pod
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(LABEL_POD_NAME.into(), pod.name.clone());
        labels.insert(LABEL_POD_NAMESPACE.into(), pod.namespace.clone());
        labels.insert(LABEL_POD_UID.into(), pod.uid.clone());
        let mut security = cri::LinuxSandboxSecurityContext {
            namespace_options: Some(namespaces_for_pod(pod)),
            privileged: false,
            ..Default::default()
        };
        // The sandbox always runs with the runtime's default seccomp profile (kubernetes#84623).
        if self.cfg.version >= KubeletVersion::V1_26 {
            security.seccomp = Some(cri::SecurityProfile {
                profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                localhost_ref: String::new(),
            });
        } else {
            #[allow(deprecated)]
            {
                security.seccomp_profile_path = "runtime/default".into();
            }
        }
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                attempt,
            }),
            // Host-network pods get no hostname: they keep the node's.
            hostname: if pod.host_network {
                String::new()
            } else {
                pod.name.chars().take(63).collect()
            },
            log_directory: self.pod_log_dir(pod).display().to_string(),
            dns_config: Some(host_dns_config()),
            port_mappings: Vec::new(),
            labels,
            annotations: pod
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: String::new(),
                security_context: Some(security),
                sysctls: HashMap::new(),
                ..Default::default()
            }),
            windows: None,
        }
    }
}

/// Namespace options: network NODE for host network else POD, PID per container, IPC per pod.
pub(super) fn namespaces_for_pod(pod: &PodSpec) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: network_mode(pod.host_network),
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

pub(super) fn sandbox_ips(st: &cri::PodSandboxStatus) -> Vec<String> {
    let Some(n) = &st.network else {
        return Vec::new();
    };
    let mut ips = Vec::new();
    if !n.ip.is_empty() {
        ips.push(n.ip.clone());
    }
    ips.extend(n.additional_ips.iter().map(|i| i.ip.clone()));
    ips
}

/// kubelet's `verifySandboxStatus` (KUBELET-CRI §4.1).
pub(super) fn verify_sandbox_status(s: &cri::PodSandboxStatus) -> Result<(), String> {
    if s.id.is_empty() {
        return Err("status.Id is not set".into());
    }
    let Some(m) = &s.metadata else {
        return Err("status.Metadata is not set".into());
    };
    if m.name.is_empty() || m.namespace.is_empty() || m.uid.is_empty() {
        return Err(format!(
            "metadata.Name, metadata.Namespace or metadata.Uid is not in metadata {m:?}"
        ));
    }
    if s.created_at == 0 {
        return Err("status.CreatedAt is not set".into());
    }
    Ok(())
}

/// kubelet's "Default" DNS policy (what ClusterFirst falls back to without cluster DNS): the
/// node's resolv.conf.
pub(super) fn host_dns_config() -> cri::DnsConfig {
    let mut cfg = cri::DnsConfig::default();
    let Ok(text) = std::fs::read_to_string("/etc/resolv.conf") else {
        return cfg;
    };
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => cfg.servers.extend(f.next().map(str::to_string)),
            Some("search") => cfg.searches = f.map(str::to_string).collect(),
            Some("options") => cfg.options = f.map(str::to_string).collect(),
            _ => {}
        }
    }
    cfg
}
