//! Emulator configuration: kubelet's flags and hard-coded constants, made tunable for tests.

use std::path::PathBuf;
use std::time::Duration;

use super::cri::ApiVersion;

/// Which kubelet minor version to emulate where 1.23, 1.26 and 1.27 differ (KUBELET-CRI §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KubeletVersion {
    /// 1.23.15: negotiates v1/v1alpha2, seccomp via `seccomp_profile_path`.
    V1_23,
    /// 1.26.15.
    V1_26,
    /// 1.27.7: terminal phase for deleted pods (`getPhase(…, podIsTerminal)`), `TerminatePod`
    /// forces a terminal phase.
    V1_27,
}

impl std::str::FromStr for KubeletVersion {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.trim_start_matches('v') {
            "1.23" => Ok(KubeletVersion::V1_23),
            "1.26" => Ok(KubeletVersion::V1_26),
            "1.27" => Ok(KubeletVersion::V1_27),
            other => {
                anyhow::bail!("unsupported kubelet version {other:?} (expected 1.23, 1.26 or 1.27)")
            }
        }
    }
}

impl KubeletVersion {
    /// The API negotiation this version performs.
    pub fn default_api(self) -> ApiVersion {
        match self {
            KubeletVersion::V1_23 => ApiVersion::Negotiate,
            KubeletVersion::V1_26 | KubeletVersion::V1_27 => ApiVersion::V1,
        }
    }
}

/// Everything tunable. [`KubeletConfig::new`] gives kubelet's defaults; [`KubeletConfig::fast`]
/// shrinks the periods for tests without changing any ordering.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// `--container-runtime-endpoint` (a unix socket path).
    pub endpoint: PathBuf,
    /// `--image-service-endpoint`; defaults to `endpoint`.
    pub image_endpoint: Option<PathBuf>,
    /// Behaviour differences by version.
    pub version: KubeletVersion,
    /// CRI API negotiation; `None` = what `version` does.
    pub api: Option<ApiVersion>,
    /// `--runtime-request-timeout` (`r.timeout`): 2 min (KUBELET-CRI §3.3).
    pub runtime_request_timeout: Duration,
    /// PLEG relist period: 1 s (KUBELET-CRI §4.1).
    pub relist_period: Duration,
    /// `updateRuntimeUp` → Status period: 5 s (KUBELET-CRI §4.1).
    pub runtime_status_period: Duration,
    /// The sync loop's `syncCh` ticker that delivers due work-queue entries: 1 s.
    pub sync_tick: Duration,
    /// Periodic resync after a successful sync (`--sync-frequency`): 1 min, jittered by
    /// `jitter_factor` (KUBELET-CRI §5).
    pub resync_interval: Duration,
    /// Requeue after a sync error (`backOffPeriod`): 10 s, jittered (KUBELET-CRI §1.3).
    pub error_backoff: Duration,
    /// Requeue when the error says "network is not ready": 1 s, jittered (KUBELET-CRI §1.3).
    pub network_not_ready_backoff: Duration,
    /// Pod-worker jitter factor (`workerBackOffPeriodJitterFactor` / resync): 0.5. 0 = no jitter.
    pub jitter_factor: f64,
    /// Crash-loop back-off start: 10 s, doubling (KUBELET-CRI §5). Also the image-pull back-off.
    pub crash_backoff_base: Duration,
    /// Crash-loop back-off cap (`MaxContainerBackOff`): 300 s.
    pub crash_backoff_max: Duration,
    /// Root of pod log directories (`/var/log/pods`); containerd writes container logs below it.
    pub pod_log_root: PathBuf,
    /// kubelet's root dir (`/var/lib/kubelet`). When set, containers get kubelet's termination-log
    /// mount and non-host-network pods an `/etc/hosts` mount, as kubelet does; `None` = no mounts.
    pub root_dir: Option<PathBuf>,
    /// Add `kubernetes.io/config.source: api` and `kubernetes.io/config.seen` to pod annotations,
    /// as kubelet's config layer does for API pods (KUBELET-CRI §2.1).
    pub config_annotations: bool,
    /// Container GC period (`ContainerGCPeriod`, 1 min). `None` (default) disables GC: kubelet's GC
    /// removes non-running containers of *every* pod it does not know, which is unsafe on a
    /// runtime shared with anything else.
    pub gc_period: Option<Duration>,
    /// The PLEG `ContainerDied` clean-up (`podContainerDeletor`) that removes older dead instances
    /// (keeps `--maximum-dead-containers-per-container` = 1; all of them once a deleted pod is
    /// terminated). Default on, as in kubelet; limited to the emulator's own pods.
    pub container_deletor: bool,
}

// === impl KubeletConfig ===

impl KubeletConfig {
    /// kubelet 1.26 defaults for `endpoint`.
    pub fn new(endpoint: impl Into<PathBuf>) -> KubeletConfig {
        KubeletConfig {
            endpoint: endpoint.into(),
            image_endpoint: None,
            version: KubeletVersion::V1_26,
            api: None,
            runtime_request_timeout: Duration::from_secs(120),
            relist_period: Duration::from_secs(1),
            runtime_status_period: Duration::from_secs(5),
            sync_tick: Duration::from_secs(1),
            resync_interval: Duration::from_secs(60),
            error_backoff: Duration::from_secs(10),
            network_not_ready_backoff: Duration::from_secs(1),
            jitter_factor: 0.5,
            crash_backoff_base: Duration::from_secs(10),
            crash_backoff_max: Duration::from_secs(300),
            pod_log_root: PathBuf::from("/var/log/pods"),
            root_dir: None,
            config_annotations: true,
            gc_period: None,
            container_deletor: true,
        }
    }

    /// Test defaults: relist 100 ms, sync tick 50 ms, resync 2 s, error back-off 500 ms, network
    /// back-off 100 ms, crash back-off 1 s…8 s, Status every 500 ms, runtime request timeout 30 s.
    /// Logs go under `log_root`.
    pub fn fast(endpoint: impl Into<PathBuf>, log_root: impl Into<PathBuf>) -> KubeletConfig {
        KubeletConfig {
            runtime_request_timeout: Duration::from_secs(30),
            relist_period: Duration::from_millis(100),
            runtime_status_period: Duration::from_millis(500),
            sync_tick: Duration::from_millis(50),
            resync_interval: Duration::from_secs(2),
            error_backoff: Duration::from_millis(500),
            network_not_ready_backoff: Duration::from_millis(100),
            crash_backoff_base: Duration::from_secs(1),
            crash_backoff_max: Duration::from_secs(8),
            pod_log_root: log_root.into(),
            ..KubeletConfig::new(endpoint)
        }
    }

    /// The API negotiation in effect.
    pub fn api(&self) -> ApiVersion {
        self.api.unwrap_or_else(|| self.version.default_api())
    }
}

/// Parses `1500ms`, `2s`, `1m`, `1h` or a bare number of seconds (may be fractional).
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => anyhow::bail!("invalid duration unit in {s:?} (use ms, s, m or h)"),
    };
    if !secs.is_finite() || secs < 0.0 {
        anyhow::bail!("invalid duration {s:?}");
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("1500ms").ok(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_duration("2").ok(), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        assert!(parse_duration("2 weeks").is_err());
    }
}
