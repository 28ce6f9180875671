//! Typed configuration: a TOML file (`--config`, default `/etc/crisp/config.toml` when present)
//! with command-line flags overriding it. Parsed and validated once at start; any unknown key or
//! bad value is an error naming the key (the binary exits 64, EX_USAGE).

pub mod injectors;
mod validate;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/crisp/config.toml";
pub const DEFAULT_LISTEN: &str = "/run/crisp/crisp.sock";
pub(crate) const DEFAULT_UPSTREAM: &str = "/run/containerd/containerd.sock";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/crisp";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: key `{key}`: {message}")]
    Invalid {
        path: String,
        key: String,
        message: String,
    },
}

/// The whole configuration, with defaults applied.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Socket kubelet connects to.
    pub listen: PathBuf,
    /// File mode of the listening socket, as an octal string ("0660").
    #[serde(deserialize_with = "de_mode")]
    pub listen_mode: u32,
    /// The runtime's socket.
    pub upstream: PathBuf,
    pub log: LogConfig,
    pub proxy: ProxyConfig,
    pub ordering: OrderingConfig,
    pub job: JobConfig,
    /// Where crisp keeps the little state that must survive its own restart (which sidecars it
    /// terminated in job mode).
    pub state_dir: PathBuf,
    /// Node-wide sidecar rules by container name, for pods without a `crisp.dev/sidecars`
    /// annotation (annotations win).
    pub sidecars: Vec<SidecarRule>,
    /// Known injectors, added to (or replacing, by name) the built-in table of
    /// `ordering/injectors.rs` (Istio, Linkerd, Vault agent).
    pub injectors: Vec<injectors::InjectorRule>,
    /// crisp's own admin socket: the debug tap, the pods it tracks, Prometheus metrics.
    pub admin: AdminConfig,
    /// When crisp counts itself as stuck (`src/watchdog.rs`).
    pub watchdog: WatchdogConfig,
    /// Where readiness probes run, by the pod's runtime handler (isolated pods).
    pub readiness: ReadinessConfig,
    /// Held calls as spans in kubelet's trace, over OTLP (`src/otel.rs`); off by default.
    pub tracing: TracingConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN.into(),
            listen_mode: 0o660,
            upstream: DEFAULT_UPSTREAM.into(),
            log: LogConfig::default(),
            proxy: ProxyConfig::default(),
            ordering: OrderingConfig::default(),
            job: JobConfig::default(),
            state_dir: DEFAULT_STATE_DIR.into(),
            sidecars: Vec::new(),
            injectors: Vec::new(),
            admin: AdminConfig::default(),
            watchdog: WatchdogConfig::default(),
            readiness: ReadinessConfig::default(),
            tracing: TracingConfig::default(),
        }
    }
}

/// `[tracing]`: a held (or refused) call that carries kubelet's W3C `traceparent` becomes a span,
/// a child of kubelet's, exported over OTLP/gRPC (DESIGN.md §6.1). Off unless an endpoint is
/// named here or in `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's OTLP/gRPC endpoint, `http://HOST:PORT` (e.g. `http://127.0.0.1:4317`).
    pub otlp_endpoint: Option<String>,
    /// How often queued spans are sent.
    #[serde(deserialize_with = "de_duration")]
    pub export_delay: Duration,
}

/// Bounds of `tracing.export_delay`.
pub(crate) const MIN_EXPORT_DELAY: Duration = Duration::from_millis(10);
pub(crate) const MAX_EXPORT_DELAY: Duration = Duration::from_secs(60);

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            export_delay: Duration::from_secs(5),
        }
    }
}

/// The watchdog's bounds (RELIABILITY.md, "crisp's own faults"). systemd's own interval is
/// `WatchdogSec=` in crisp.service; crisp reads it from the environment systemd sets.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchdogConfig {
    /// A relay thread working this long without waiting for its sockets is stuck: its
    /// connection is closed (kubelet reconnects); still stuck twice as long, crisp stops
    /// telling systemd it is alive.
    #[serde(deserialize_with = "de_duration")]
    pub(crate) relay_stall: Duration,
    /// The async runtime's heartbeat missing this long: crisp stops telling systemd it is alive.
    #[serde(deserialize_with = "de_duration")]
    pub(crate) runtime_stall: Duration,
}

impl Config {
    /// `watchdog.relay_stall` (crisp.service's `WatchdogSec=` is checked against it).
    pub fn watchdog_relay_stall(&self) -> Duration {
        self.watchdog.relay_stall
    }
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            relay_stall: Duration::from_secs(5),
            runtime_stall: Duration::from_secs(10),
        }
    }
}

/// The admin socket (DESIGN.md §6): crisp's own gRPC API (`proto/crisp/admin/v1`) and
/// `GET /metrics`, for root on the node. Never the CRI socket, never TCP unless asked.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub(crate) enabled: bool,
    /// Default: `admin.sock` next to `listen` (`/run/crisp/admin.sock` with the default
    /// `listen`), so that two crisps with different sockets never fight over one admin socket.
    pub(crate) socket: Option<PathBuf>,
    /// File mode of the admin socket, octal. The tap shows every pod's CRI traffic: root only.
    /// A mode with group or other bits is refused unless `allow_shared_mode` is set.
    #[serde(deserialize_with = "de_mode")]
    pub mode: u32,
    /// Opt-in to a group- or world-accessible `mode` (e.g. "0660" for a monitoring group):
    /// whoever can connect sees every pod's CRI calls (redacted) and every pod crisp tracks.
    /// crisp warns about it at start, and `crisp doctor` reports it.
    pub allow_shared_mode: bool,
    /// Group (a name, or a numeric gid) the admin socket is given right after it is bound, so
    /// that a monitoring group can use `crisp tap` with `mode = "0660"` without a chgrp after
    /// every start. A name no group has is a config error.
    pub group: Option<String>,
    /// Also serve `GET /metrics` (only that) over TCP on this address, e.g. "127.0.0.1:9478".
    pub metrics_tcp: Option<std::net::SocketAddr>,
    /// Events queued per tap client before crisp drops (and counts) events for that client.
    pub tap_queue: usize,
    /// Most taps open at once for one non-root peer uid (SO_PEERCRED); the next is refused
    /// RESOURCE_EXHAUSTED (issue #44). Root is bound by `max_taps` only.
    pub max_taps_per_uid: usize,
    /// Most taps open at once on the node, root's included.
    pub max_taps: usize,
    /// Most bytes queued for all tap clients together (each client may also queue at most
    /// 64 MiB); beyond it events are dropped for the client they would go to, and counted.
    pub tap_memory_bytes: usize,
}

/// Default bound on the bytes the tap queues for all its subscribers together
/// (`admin.tap_memory_bytes`): with `admin.max_taps` = 1024 taps of 64 MiB each, the
/// per-subscriber bound alone allows 64 GiB.
pub const DEFAULT_TAP_MEMORY: usize = 256 << 20;

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            enabled: true,
            socket: None,
            mode: 0o600,
            allow_shared_mode: false,
            metrics_tcp: None,
            tap_queue: 4096,
            max_taps_per_uid: 8,
            max_taps: 1024,
            group: None,
            tap_memory_bytes: DEFAULT_TAP_MEMORY,
        }
    }
}

impl AdminConfig {
    /// Whether `mode` gives the socket's group or others any permission.
    pub fn shared(&self) -> bool {
        self.mode & 0o077 != 0
    }

    /// The gid `group` names (a numeric gid is taken as it is), `None` when unset; or why it
    /// names none.
    pub fn group_id(&self) -> Result<Option<u32>, String> {
        let Some(group) = &self.group else {
            return Ok(None);
        };
        if let Ok(gid) = group.parse::<u32>() {
            return Ok(Some(gid));
        }
        match crate::sys::group_id(group) {
            Ok(Some(gid)) => Ok(Some(gid)),
            Ok(None) => Err(format!("no group named {group:?} on this node")),
            Err(e) => Err(format!("cannot look up group {group:?}: {e}")),
        }
    }
}

impl Config {
    /// Where the admin socket is (whether or not it is enabled).
    pub fn admin_socket(&self) -> PathBuf {
        match &self.admin.socket {
            Some(p) => p.clone(),
            None => self.listen.with_file_name("admin.sock"),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter: `info`, `debug`, `crisp=debug,h2=warn`, ...
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    #[serde(deserialize_with = "de_duration")]
    pub(crate) shutdown_grace: Duration,
    #[serde(deserialize_with = "de_duration")]
    pub(crate) upstream_connect_timeout: Duration,
    /// HTTP/2 connections to the runtime, used round-robin (more spread calls over cores).
    pub(crate) upstream_connections: usize,
    #[serde(deserialize_with = "de_duration")]
    pub(crate) keepalive_interval: Duration,
    #[serde(deserialize_with = "de_duration")]
    pub(crate) keepalive_timeout: Duration,
    #[serde(deserialize_with = "de_duration")]
    pub(crate) handshake_timeout: Duration,
    /// No longer used (it limited crisp's own HTTP/2 server, which is gone: every connection is
    /// relayed, and the runtime's own limit applies). Accepted so that old config files still
    /// start; crisp logs that it is ignored.
    pub(crate) max_concurrent_streams: u32,
    /// Largest message crisp buffers to look at (observed calls only; others are unlimited).
    pub(crate) max_observed_message_bytes: usize,
    /// No longer used: `false` selected crisp's own HTTP/2 server, which rejected the
    /// `:authority` grpc-go clients send (a socket path) and is gone. Accepted so that old config
    /// files still start; crisp logs that it is ignored.
    pub(crate) relay: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            shutdown_grace: Duration::from_secs(10),
            upstream_connect_timeout: Duration::from_secs(2),
            upstream_connections: 2,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            handshake_timeout: Duration::from_secs(10),
            max_concurrent_streams: 2048,
            relay: true,
            max_observed_message_bytes: 64 << 20,
        }
    }
}

/// What to do when a held start reaches its timeout (DESIGN.md §3.4).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutPolicy {
    /// Fail open: forward the call, log loudly, count it.
    #[default]
    Proceed,
    /// Answer with an error; kubelet retries on its next sync.
    Fail,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrderingConfig {
    /// Longest an app's CreateContainer is held waiting for sidecars. Must stay below kubelet's
    /// runtime-request-timeout (2 min, KUBELET-CRI.md §3.3).
    #[serde(deserialize_with = "de_duration")]
    pub(crate) start_timeout: Duration,
    pub(crate) timeout_policy: TimeoutPolicy,
    /// How often readiness probes run while a call is held.
    #[serde(deserialize_with = "de_duration")]
    pub(crate) probe_interval: Duration,
    /// Per-attempt timeout of one readiness probe.
    #[serde(deserialize_with = "de_duration")]
    pub(crate) probe_timeout: Duration,
    /// Recognise the built-in known injectors (Istio, Linkerd, Vault agent) from their own pod
    /// annotations. `false` opts the node out; `[[injectors]]` entries still apply.
    pub known_injectors: bool,
    /// Networks (CIDRs, or bare addresses) that a pod's own `crisp.dev/ready.*` annotation may
    /// name besides the pod's addresses. Empty: a pod may aim probes only at itself.
    #[serde(deserialize_with = "de_cidrs")]
    pub(crate) probe_allow: Vec<crate::readiness::Cidr>,
    /// Most readiness probes running at once on the node (TCP, HTTP and exec).
    pub max_probes_in_flight: usize,
    /// Most TCP connections per second that tcp:// and http:// probes may open, node-wide.
    pub probe_connects_per_second: u32,
    /// Most exec readiness probes (ExecSync: a process started in a container) running at once
    /// on the node; one pod holds at most all but a quarter of them. Separate from the TCP
    /// budget (issue #33).
    pub max_exec_probes_in_flight: usize,
    /// Most exec readiness probes started per second, node-wide.
    pub exec_probes_per_second: u32,
    /// Most exec readiness probes started per second for one pod (all its sidecars together;
    /// above `exec_probes_per_second` it is that). A pod with many exec-probed sidecars waits
    /// for its own turns instead of spending the node's (issue #33).
    pub exec_probes_per_pod_per_second: u32,
    /// Most runtime reads per second crisp makes for its held calls' repeated checks and its
    /// Job watchers, node-wide (a held call's first read and kubelet's own calls are never
    /// paced). With N calls held, each re-checks about every N / this many seconds.
    pub(crate) runtime_reads_per_second: u32,
    /// Most of those reads waiting for the runtime at once, node-wide.
    pub(crate) max_runtime_reads_in_flight: usize,
    /// A CreateContainer held this long ends as an informative refusal ("crisp: waiting for
    /// sidecar … not ready: …; held 30 s of 90 s"), which kubelet shows as the container's
    /// waiting reason and a Warning event, and retries 1–1.5 s later (KUBELET-CRI §1.3); the
    /// start timeout keeps counting from the first hold. `0s`: never (hold silently until the
    /// sidecar is ready or the start timeout). docs/CALLS.md has the measurements.
    #[serde(deserialize_with = "de_duration")]
    pub(crate) refuse_held_after: Duration,
}

/// Upper bounds of the probe limits: more would not be a bound.
pub const MAX_PROBES_IN_FLIGHT: usize = 4096;
pub const MAX_PROBE_CONNECTS_PER_SECOND: u32 = 100_000;
/// Upper bounds of the runtime read limits.
pub const MAX_RUNTIME_READS_PER_SECOND: u32 = 100_000;
pub const MAX_RUNTIME_READS_IN_FLIGHT: usize = 4096;
/// Most entries in `[ordering] probe_allow`.
pub const MAX_PROBE_ALLOW: usize = 256;

impl Default for OrderingConfig {
    fn default() -> Self {
        OrderingConfig {
            start_timeout: Duration::from_secs(90),
            timeout_policy: TimeoutPolicy::Proceed,
            probe_interval: Duration::from_millis(50),
            probe_timeout: Duration::from_secs(1),
            known_injectors: true,
            probe_allow: Vec::new(),
            max_probes_in_flight: 64,
            probe_connects_per_second: 200,
            max_exec_probes_in_flight: 4,
            exec_probes_per_second: 50,
            exec_probes_per_pod_per_second: 20,
            runtime_reads_per_second: 100,
            max_runtime_reads_in_flight: 16,
            refuse_held_after: DEFAULT_REFUSE_HELD_AFTER,
        }
    }
}

// --- [readiness]: isolation-aware probing (issue #35; DESIGN.md §3.2, "Isolated pods") ---

/// `[readiness]`: how crisp reaches a pod's sidecars, by the pod's runtime handler.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReadinessConfig {
    /// Runtime handlers (RunPodSandbox's `runtime_handler`, a RuntimeClass's `handler`) expected
    /// to share the node's kernel and the sandbox's network namespace. Since issue #44 this is
    /// what `crisp pods` shows until the pod's network is known, not what decides where probes
    /// run: that is evidence (the sandbox's network namespace holds the pod IP: probed inside
    /// it, whatever the handler; otherwise only the pod's own IPs, from outside).
    pub shared_kernel_handlers: Vec<String>,
    /// Link-local or cloud-metadata networks (`readiness::GUARDED`) that a pod probed from
    /// outside its network (a VM-isolated pod) may still be probed at, because the operator's
    /// CNI really gives pods such addresses. Empty: never. The node's own addresses are never
    /// probed from outside, whatever this says.
    #[serde(deserialize_with = "de_cidrs")]
    pub(crate) outside_allow: Vec<crate::readiness::Cidr>,
}

/// Most entries of `[readiness] outside_allow`.
pub const MAX_OUTSIDE_ALLOW: usize = 64;

/// Most entries of `[readiness] shared_kernel_handlers`.
pub const MAX_SHARED_KERNEL_HANDLERS: usize = 64;

impl Default for ReadinessConfig {
    fn default() -> Self {
        ReadinessConfig {
            shared_kernel_handlers: ["", "runc", "crun"].map(String::from).to_vec(),
            outside_allow: Vec::new(),
        }
    }
}

impl ReadinessConfig {
    /// Each handler `""` or a DNS-1123 label (what Kubernetes accepts as a RuntimeClass
    /// handler), at most [`MAX_SHARED_KERNEL_HANDLERS`] of them.
    fn validate(&self) -> Result<(), String> {
        if self.shared_kernel_handlers.len() > MAX_SHARED_KERNEL_HANDLERS {
            return Err(format!("more than {MAX_SHARED_KERNEL_HANDLERS} handlers"));
        }
        if self.outside_allow.len() > MAX_OUTSIDE_ALLOW {
            return Err(format!(
                "outside_allow: more than {MAX_OUTSIDE_ALLOW} entries"
            ));
        }
        match self
            .shared_kernel_handlers
            .iter()
            .find(|h| !h.is_empty() && !crate::tenant::is_dns1123_label(h))
        {
            Some(bad) => Err(format!(
                "{} is not a runtime handler name (a DNS-1123 label, or \"\" for the runtime's default)",
                crate::tenant::text(bad, 64)
            )),
            None => Ok(()),
        }
    }
}

/// Job mode (DESIGN.md §5).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobConfig {
    /// Turn job mode off node-wide.
    pub(crate) enabled: bool,
    /// How often crisp looks at the app containers of Job pods that have sidecars.
    #[serde(deserialize_with = "de_duration")]
    pub(crate) poll_interval: Duration,
    /// With no `crisp.dev/restart-policy`, how long after an app's first non-zero exit crisp
    /// waits for kubelet to re-create it (OnFailure restarts the first crash at once) before
    /// treating the exit as final (Never).
    #[serde(deserialize_with = "de_duration")]
    pub(crate) restart_grace: Duration,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            enabled: true,
            poll_interval: Duration::from_millis(250),
            restart_grace: Duration::from_secs(5),
        }
    }
}

/// Bounds of `watchdog.relay_stall` and `watchdog.runtime_stall`.
pub const MIN_WATCHDOG_STALL: Duration = Duration::from_millis(100);
pub const MAX_WATCHDOG_STALL: Duration = Duration::from_secs(60);

/// Longest hold crisp accepts from config or annotation: kubelet's deadline is 2 min.
pub const MAX_START_TIMEOUT: Duration = Duration::from_secs(115);
/// `ordering.refuse_held_after` by default: healthy sidecars are ready long before, so only a
/// stuck pod pays the 1–1.5 s retry; its operator sees why within 30 s (docs/CALLS.md).
pub(crate) const DEFAULT_REFUSE_HELD_AFTER: Duration = Duration::from_secs(30);
/// Shortest `ordering.refuse_held_after`: below it a pod spends more time in kubelet's retry
/// pause than held.
pub const MIN_REFUSE_HELD_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SidecarRule {
    /// Container name that marks a sidecar on any pod (e.g. `istio-proxy`).
    pub name: String,
    /// Readiness spec, same forms as the `crisp.dev/ready.<name>` annotation.
    #[serde(default = "default_ready")]
    pub ready: String,
}

fn default_ready() -> String {
    "running".into()
}

impl Config {
    /// Loads `path` (if given, it must exist; if not, the default path is used when present).
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Config::from_toml(&text, &path.display().to_string()),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                Ok(Config::default())
            }
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::new(text);
        let cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid {
                path: origin.to_string(),
                key,
                message: e.into_inner().message().trim().to_string(),
            }
        })?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// The known-injector table this node uses.
    pub(crate) fn injector_table(&self) -> Vec<injectors::InjectorRule> {
        injectors::table(self.ordering.known_injectors, &self.injectors)
    }
}

/// Parses `90s`, `100ms`, `2m`, `1h`, `1m30s`, `250us`. A bare number is rejected: units matter.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "invalid duration {s:?} (expected e.g. \"90s\", \"100ms\", \"2m\")"
            ));
        }
        let num: f64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid number in duration {s:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "h" => num * 3600.0,
            "m" => num * 60.0,
            "s" => num,
            "ms" => num / 1e3,
            "us" | "µs" => num / 1e6,
            "ns" => num / 1e9,
            "" => return Err(format!("duration {s:?} needs a unit (h, m, s, ms, us, ns)")),
            u => return Err(format!("unknown unit {u:?} in duration {s:?}")),
        };
        rest = &rest[unit_len..];
        if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
            return Err(format!("duration {s:?} out of range"));
        }
        total += Duration::from_secs_f64(secs);
    }
    Ok(total)
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

fn de_cidrs<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<crate::readiness::Cidr>, D::Error> {
    let list = Vec::<String>::deserialize(d)?;
    parse_cidrs(&list).map_err(serde::de::Error::custom)
}

/// `[ordering] probe_allow`: every entry a network (`10.0.0.0/8`, `fd00::/8`) or an address.
pub fn parse_cidrs(list: &[String]) -> Result<Vec<crate::readiness::Cidr>, String> {
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            crate::readiness::Cidr::parse(s).map_err(|e| {
                format!(
                    "entry {i} ({:?}): {e}",
                    s.chars().take(64).collect::<String>()
                )
            })
        })
        .collect()
}

fn de_mode<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let s = String::deserialize(d)?;
    parse_mode(&s).map_err(serde::de::Error::custom)
}

pub fn parse_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("invalid octal mode {s:?} (e.g. \"0660\")"))?;
    if m > 0o777 {
        return Err(format!("mode {s:?} out of range"));
    }
    Ok(m)
}

/// Whether `endpoint` is an OTLP/gRPC endpoint crisp can export to: `http://HOST[:PORT][/]`,
/// at most 2 KiB. `https` is refused: crisp's exporter is built without TLS (a node-local
/// collector or agent forwards further).
pub(crate) fn check_otlp_endpoint(endpoint: &str) -> Result<(), String> {
    if endpoint.len() > 2048 {
        return Err(format!("{} bytes long (at most 2048)", endpoint.len()));
    }
    let uri: http::Uri = endpoint.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(
                "https is not supported: crisp exports without TLS; point it at a node-local \
                 collector (http://127.0.0.1:4317)"
                    .into(),
            )
        }
        _ => return Err("must start with http://".into()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("no host".into());
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("an OTLP/gRPC endpoint has no path (http://HOST:4317)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// A `tracing` filter directive (`info`, `info,crisp=debug`, ...) that the logger will accept.
pub fn validate_filter(filter: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(|_| ())
        .map_err(|e| format!("invalid log filter {filter:?}: {e}"))
}
