//! kubelet's `kuberuntime_container.go`: starting a container (create, start, the postStart
//! hook), killing it (preStop, StopContainer with the grace period), removing it, and the init
//! containers' bookkeeping.

use super::*;

impl Runtime {
    /// The `start` helper of SyncPod: the crash back-off check, then `startContainer` (§1.1 a–f).
    pub(super) async fn start(
        &self,
        pod: &PodCtx,
        c: &ContainerSpec,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        status: &RuntimePodStatus,
        pod_ips: &[String],
    ) -> Result<(), (&'static str, String)> {
        if let Some(msg) = self.do_backoff(&pod.spec, c, status) {
            return Err((ERR_CRASH_LOOP_BACK_OFF, msg));
        }
        let spec = &pod.spec;
        let meta = pod.meta().with_container(&c.name);

        // a. Ensure the image exists.
        let image_ref = self
            .ensure_image_exists(spec, c, sandbox_config, &meta)
            .await?;

        // b. Restart count: the newest instance's + 1, else from the log directory (§5).
        let restart_count = match status.find(&c.name) {
            Some(s) => s.restart_count + 1,
            None => calc_restart_count_by_log_dir(&self.pod_log_dir(spec).join(&c.name)),
        };

        // c. Container config (second ImageStatus, log dir).
        let config = self
            .generate_container_config(spec, c, &image_ref, restart_count, pod_ips, &meta)
            .await
            .map_err(|m| (ERR_CREATE_CONTAINER_CONFIG, m))?;

        // d. CreateContainer with the regenerated sandbox config.
        let id = self
            .cri
            .create_container(sandbox_id, config, sandbox_config.clone(), meta.clone())
            .await
            .map_err(|s| (ERR_CREATE_CONTAINER, s.message().to_string()))?;

        // e. StartContainer. On failure the CREATED container is left behind (§1.3).
        self.cri
            .start_container(&id, meta.clone())
            .await
            .map_err(|s| (ERR_RUN_CONTAINER, s.message().to_string()))?;

        // f. postStart blocks the start loop; failure kills the container (§1.1f).
        if let Some(hook) = c.post_start_hook() {
            if let Err(msg) = run_exec_hook(&self.cri, spec, c, &id, hook, meta.clone()).await {
                let kill = self
                    .kill_container(
                        pod,
                        &id,
                        &c.name,
                        "FailedPostStartHook",
                        KillReason::FailedPostStartHook,
                        None,
                    )
                    .await;
                if let Err(e) = kill {
                    tracing::warn!(pod = %spec, container = %c.name, "failed to kill container after postStart failure: {e}");
                }
                return Err((ERR_POST_START_HOOK, msg));
            }
        }
        Ok(())
    }

    /// What RestorePod (KEP-5823) leaves on the runtime, for a restored pod of the emulator: the
    /// sandbox (attempt 0) and every regular container CREATED with the config kubelet would
    /// have sent, none started. This runtime's client is on the runtime's own socket: a proxy
    /// in front of kubelet sees none of these calls, as it sees no CreateContainer of a pod the
    /// runtime restored.
    pub(crate) async fn restore_pod(&self, spec: &PodSpec) -> Result<(), String> {
        let pod = PodCtx {
            spec: Arc::new(spec.clone()),
            deletion_requested: false,
            deletion_grace: None,
            termination_requested: Arc::new(AtomicBool::new(false)),
            restored: true,
        };
        let sandbox_id = self.create_pod_sandbox(&pod, 0).await?;
        let sandbox_config = self.generate_pod_sandbox_config(spec, 0);
        for c in &spec.containers {
            let meta = pod.meta().with_container(&c.name);
            let image = self
                .ensure_image_exists(spec, c, &sandbox_config, &meta)
                .await
                .map_err(|(_, m)| m)?;
            let config = self
                .generate_container_config(spec, c, &image, 0, &[], &meta)
                .await?;
            self.cri
                .create_container(&sandbox_id, config, sandbox_config.clone(), meta)
                .await
                .map_err(|s| format!("CreateContainer of {}: {}", c.name, s.message()))?;
        }
        Ok(())
    }

    /// `generateContainerConfig` (KUBELET-CRI §2.2).
    pub(super) async fn generate_container_config(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        image_ref: &str,
        restart_count: u32,
        pod_ips: &[String],
        meta: &CallMeta,
    ) -> Result<cri::ContainerConfig, String> {
        // getImageUser: the second ImageStatus, with the image as written in the spec (§1.1c).
        let spec = cri::ImageSpec {
            image: c.image.clone(),
            ..Default::default()
        };
        self.cri
            .image_status(spec, meta.clone())
            .await
            .map_err(|s| s.message().to_string())?;

        let log_dir = self.pod_log_dir(pod).join(&c.name);
        std::fs::create_dir_all(&log_dir).map_err(|e| {
            format!(
                "create container log directory for container {} failed: {e}",
                c.name
            )
        })?;

        let mut labels = HashMap::new();
        labels.insert(LABEL_POD_NAME.to_string(), pod.name.clone());
        labels.insert(LABEL_POD_NAMESPACE.to_string(), pod.namespace.clone());
        labels.insert(LABEL_POD_UID.to_string(), pod.uid.clone());
        labels.insert(LABEL_CONTAINER_NAME.to_string(), c.name.clone());

        let mut annotations = HashMap::new();
        annotations.insert("io.kubernetes.container.hash".to_string(), c.hash());
        annotations.insert(
            "io.kubernetes.container.restartCount".to_string(),
            restart_count.to_string(),
        );
        annotations.insert(
            "io.kubernetes.container.terminationMessagePath".to_string(),
            c.termination_message_path.clone(),
        );
        annotations.insert(
            "io.kubernetes.container.terminationMessagePolicy".to_string(),
            c.termination_message_policy.clone(),
        );
        annotations.insert(
            "io.kubernetes.pod.terminationGracePeriod".to_string(),
            pod.termination_grace_period_seconds.to_string(),
        );
        if let Some(h) = c.pre_stop_hook() {
            let json =
                serde_json::to_string(h).map_err(|e| format!("encoding preStop handler: {e}"))?;
            annotations.insert("io.kubernetes.container.preStopHandler".to_string(), json);
        }

        let mounts = self.make_mounts(pod, c, pod_ips)?;
        let ns = namespaces_for_pod(pod);
        Ok(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: c.name.clone(),
                attempt: restart_count,
            }),
            image: Some(cri::ImageSpec {
                image: image_ref.to_string(),
                ..Default::default()
            }),
            command: c.command.iter().map(|a| expand_env(a, &c.env)).collect(),
            args: c.args.iter().map(|a| expand_env(a, &c.env)).collect(),
            working_dir: c.working_dir.clone().unwrap_or_default(),
            envs: c
                .env
                .iter()
                .map(|e| cri::KeyValue {
                    key: e.name.clone(),
                    value: e.value.clone(),
                })
                .collect(),
            mounts,
            labels,
            annotations,
            log_path: format!("{}/{}.log", c.name, restart_count),
            linux: Some(cri::LinuxContainerConfig {
                // A BestEffort container: minimum CPU shares, CFS period, OOM score 1000.
                resources: Some(cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_quota: 0,
                    cpu_shares: 2,
                    oom_score_adj: 1000,
                    ..Default::default()
                }),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(ns),
                    masked_paths: DEFAULT_MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
                    readonly_paths: DEFAULT_READONLY_PATHS
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        })
    }

    /// kubelet's termination-log and `/etc/hosts` mounts (only with `root_dir` configured).
    pub(super) fn make_mounts(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        pod_ips: &[String],
    ) -> Result<Vec<cri::Mount>, String> {
        let Some(root) = &self.cfg.root_dir else {
            return Ok(Vec::new());
        };
        let pod_dir = root.join("pods").join(&pod.uid);
        let mut mounts = Vec::new();
        // /etc/hosts: a managed file for pods with an IP, a copy of the node's for host network.
        if pod.host_network || !pod_ips.is_empty() {
            let hosts = pod_dir.join("etc-hosts");
            let content = if pod.host_network {
                let host = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
                format!("# Kubernetes-managed hosts file (host network).\n{host}")
            } else {
                let mut s = String::from(
                    "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
                );
                for ip in pod_ips {
                    s.push_str(&format!("{ip}\t{}\n", pod.name));
                }
                s
            };
            std::fs::create_dir_all(&pod_dir).map_err(|e| format!("create pod dir: {e}"))?;
            std::fs::write(&hosts, content)
                .map_err(|e| format!("write {}: {e}", hosts.display()))?;
            mounts.push(cri::Mount {
                container_path: "/etc/hosts".into(),
                host_path: hosts.display().to_string(),
                ..Default::default()
            });
        }
        if !c.termination_message_path.is_empty() {
            let dir = pod_dir.join("containers").join(&c.name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            let file = dir.join(super::super::rand::hex8());
            std::fs::write(&file, b"").map_err(|e| format!("create {}: {e}", file.display()))?;
            set_mode_0666(&file);
            mounts.push(cri::Mount {
                container_path: c.termination_message_path.clone(),
                host_path: file.display().to_string(),
                ..Default::default()
            });
        }
        Ok(mounts)
    }

    // --- killing ---

    /// `killContainer` (KUBELET-CRI §3.1, §3.2): preStop (if grace > 0, waited at most grace
    /// seconds), grace reduced by the hook's whole seconds, minimum 2, replaced by the override if
    /// any; then StopContainer. NotFound counts as success.
    pub async fn kill_container(
        &self,
        pod: &PodCtx,
        id: &str,
        name: &str,
        message: &str,
        reason: KillReason,
        grace_override: Option<i64>,
    ) -> Result<(), String> {
        let spec = &pod.spec;
        let Some(c) = spec.container(name) else {
            return Err(format!("failed to get containerSpec {name:?} (id={id:?}) in pod {:?} when killing container for reason {message:?}", spec.format()));
        };
        tracing::debug!(pod = %spec, container = name, ?reason, "killing container");
        let meta = pod.meta().with_container(name);
        let mut grace = pod
            .deletion_grace
            .unwrap_or(spec.termination_grace_period_seconds);
        if let Some(hook) = c.pre_stop_hook() {
            if grace > 0 {
                grace -=
                    execute_pre_stop_hook(&self.cri, spec, c, id, hook, grace, meta.clone()).await;
            }
        }
        if grace < MINIMUM_GRACE_PERIOD {
            grace = MINIMUM_GRACE_PERIOD;
        }
        if let Some(o) = grace_override {
            grace = o;
        }
        match self.cri.stop_container(id, grace, meta).await {
            Ok(()) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(go_error(&s)),
        }
    }

    /// `removeContainer`: ContainerStatus (legacy log symlink), then RemoveContainer.
    pub async fn remove_container(&self, id: &str, meta: CallMeta) -> Result<(), Status> {
        match self.cri.container_status(id, meta.clone()).await {
            Ok(_) => {}
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => return Err(s),
        }
        self.cri.remove_container(id, meta).await
    }

    /// `purgeInitContainers`: when the sandbox is re-created, every init container goes.
    pub(super) async fn purge_init_containers(&self, pod: &PodCtx, status: &RuntimePodStatus) {
        for c in &pod.spec.init_containers {
            for s in status.containers.iter().filter(|s| s.name == c.name) {
                if let Err(e) = self
                    .remove_container(&s.id, pod.meta().with_container(&c.name))
                    .await
                {
                    tracing::warn!(pod = %pod.spec, container = %c.name, "failed to remove init container: {e}");
                }
            }
        }
    }

    /// `pruneInitContainersBeforeStart`: keep only the newest EXITED instance of each init container.
    pub(super) async fn prune_init_containers_before_start(
        &self,
        pod: &PodCtx,
        status: &RuntimePodStatus,
    ) {
        for c in &pod.spec.init_containers {
            let mut count = 0;
            for s in status.containers.iter().filter(|s| s.name == c.name) {
                if s.state != CriState::Exited && s.state != CriState::Unknown {
                    continue;
                }
                count += 1;
                if count == 1 && s.state == CriState::Exited {
                    continue;
                }
                if let Err(e) = self
                    .remove_container(&s.id, pod.meta().with_container(&c.name))
                    .await
                {
                    tracing::warn!(pod = %pod.spec, container = %c.name, "failed to remove init container: {e}");
                }
            }
        }
    }

    // --- status ---
}

pub(super) fn is_init_container_failed(s: &RuntimeContainerStatus) -> bool {
    s.reason == "OOMKilled"
        || (s.state == CriState::Exited && s.exit_code != 0)
        || s.state == CriState::Unknown
}

/// `findNextInitContainerToRun`: (last failed status, next index, done).
pub(super) fn find_next_init_container_to_run<'a>(
    pod: &PodSpec,
    status: &'a RuntimePodStatus,
) -> (Option<&'a RuntimeContainerStatus>, Option<usize>, bool) {
    if pod.init_containers.is_empty() {
        return (None, None, true);
    }
    // A running regular container means initialization happened in the past.
    if pod.containers.iter().any(|c| {
        status
            .find(&c.name)
            .is_some_and(|s| s.state == CriState::Running)
    }) {
        return (None, None, true);
    }
    for (i, c) in pod.init_containers.iter().enumerate().rev() {
        if let Some(s) = status.find(&c.name) {
            if is_init_container_failed(s) {
                return (Some(s), Some(i), false);
            }
        }
    }
    for (i, c) in pod.init_containers.iter().enumerate().rev() {
        let Some(s) = status.find(&c.name) else {
            continue;
        };
        if s.state == CriState::Running {
            return (None, None, false);
        }
        if s.state == CriState::Exited {
            if i == pod.init_containers.len() - 1 {
                return (None, None, true);
            }
            return (None, Some(i + 1), false);
        }
    }
    (None, Some(0), false)
}

/// kubelet's `verifyContainerStatus` (KUBELET-CRI §4.1).
pub(super) fn verify_container_status(s: &cri::ContainerStatus) -> Result<(), String> {
    if s.id.is_empty() {
        return Err("status.Id is not set".into());
    }
    let Some(m) = &s.metadata else {
        return Err("status.Metadata is not set".into());
    };
    if m.name.is_empty() {
        return Err(format!("metadata.Name is not in metadata {m:?}"));
    }
    if s.created_at == 0 {
        return Err("status.CreatedAt is not set".into());
    }
    if s.image.as_ref().is_none_or(|i| i.image.is_empty()) {
        return Err("status.Image is not set".into());
    }
    if s.image_ref.is_empty() {
        return Err("status.ImageRef is not set".into());
    }
    Ok(())
}

/// `calcRestartCountByLogDir`: highest `N.log` + 1 in the container's log dir, 0 if none.
pub(super) fn calc_restart_count_by_log_dir(dir: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut count = 0;
    for e in entries.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(true) {
            continue;
        }
        let name = e.file_name().to_string_lossy().to_string();
        let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() || !name[digits.len()..].starts_with(".log") {
            continue;
        }
        if let Ok(n) = digits.parse::<u32>() {
            count = count.max(n + 1);
        }
    }
    count
}

pub(super) fn set_mode_0666(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666));
}

/// An exec hook: ExecSync with timeout 0 and no deadline (KUBELET-CRI §6). A non-zero exit is a
/// failure. Returns kubelet's message on failure.
pub(super) async fn run_exec_hook(
    cri: &CriClient,
    pod: &PodSpec,
    c: &ContainerSpec,
    id: &str,
    hook: &Handler,
    meta: CallMeta,
) -> Result<(), String> {
    let cmd = hook.exec.command.clone();
    let meta = meta.with_detail(format!("hook {:?}", cmd.join(" ")));
    let (err, output) = match cri.exec_sync(id, cmd.clone(), 0, meta).await {
        Ok(r) if r.exit_code == 0 => return Ok(()),
        Ok(r) => {
            let stderr = String::from_utf8_lossy(&r.stderr).to_string();
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            (
                format!(
                    "command '{}' exited with {}: {}",
                    cmd.join(" "),
                    r.exit_code,
                    stderr
                ),
                String::from_utf8_lossy(&out).to_string(),
            )
        }
        Err(s) => (go_error(&s), String::new()),
    };
    Err(format!("Exec lifecycle hook ({:?}) for Container {:?} in Pod {:?} failed - error: {}, message: {:?}", cmd, c.name, pod.format(), err, output))
}

/// `executePreStopHook`: runs the hook in its own task (not cancelled at the deadline) and waits
/// at most `grace` seconds. Returns the whole seconds elapsed.
pub(super) async fn execute_pre_stop_hook(
    cri: &CriClient,
    pod: &PodSpec,
    c: &ContainerSpec,
    id: &str,
    hook: &Handler,
    grace: i64,
    meta: CallMeta,
) -> i64 {
    let start = Instant::now();
    let (cri, pod, c, id, hook) = (
        cri.clone(),
        pod.clone(),
        c.clone(),
        id.to_string(),
        hook.clone(),
    );
    let (pod_key, name) = (pod.key(), c.name.clone());
    let task = tokio::spawn(async move {
        if let Err(msg) = run_exec_hook(&cri, &pod, &c, &id, &hook, meta).await {
            tracing::warn!(pod = %pod, container = %c.name, "PreStop hook failed: {msg}");
        }
    });
    let limit = Duration::from_secs(grace.max(0) as u64);
    if tokio::time::timeout(limit, task).await.is_err() {
        tracing::info!(pod = %pod_key, container = %name, grace, "PreStop hook not completed in grace period");
    }
    start.elapsed().as_secs() as i64
}

/// kubelet's `expandContainerCommandAndArgs`: `$(NAME)` in a container's command and args is
/// replaced by the value of its env var NAME (Secret-backed ones included), `$$` is a literal
/// `$`, and a reference to an undefined name stays as written.
pub fn expand_env(s: &str, env: &[super::super::pod::EnvVar]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after.strip_prefix('(').and_then(|t| t.split_once(')')) {
            match env.iter().find(|e| e.name == name) {
                Some(e) => out.push_str(&e.value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod expand_env_tests {
    use super::super::super::pod::EnvVar;
    use super::expand_env;

    #[test]
    fn expands_as_kubelet_does() {
        let env = vec![EnvVar {
            name: "TOKEN".into(),
            value: "s3cr3t".into(),
        }];
        assert_eq!(expand_env("--token=$(TOKEN)", &env), "--token=s3cr3t");
        assert_eq!(
            expand_env("$$(TOKEN) $(NOPE) $x $", &env),
            "$(TOKEN) $(NOPE) $x $"
        );
    }
}
