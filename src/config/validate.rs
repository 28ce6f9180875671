//! The checks of a loaded config that serde cannot express: ranges, cross-field rules, and the
//! names and filters an operator writes.

use std::collections::BTreeMap;

use super::{
    check_otlp_endpoint, injectors, validate_filter, Config, ConfigError, MAX_EXPORT_DELAY,
    MAX_PROBES_IN_FLIGHT, MAX_PROBE_ALLOW, MAX_PROBE_CONNECTS_PER_SECOND,
    MAX_RUNTIME_READS_IN_FLIGHT, MAX_RUNTIME_READS_PER_SECOND, MAX_START_TIMEOUT,
    MAX_WATCHDOG_STALL, MIN_EXPORT_DELAY, MIN_REFUSE_HELD_AFTER, MIN_WATCHDOG_STALL,
};

impl Config {
    /// Cross-field checks that serde cannot express.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| ConfigError::Invalid {
            path: origin.into(),
            key: key.into(),
            message,
        };
        if self.ordering.start_timeout > MAX_START_TIMEOUT {
            return Err(bad(
                "ordering.start_timeout",
                format!(
                    "{:?} is too long: holds must end before kubelet's 2 min deadline (max {:?})",
                    self.ordering.start_timeout, MAX_START_TIMEOUT
                ),
            ));
        }
        if !self.ordering.refuse_held_after.is_zero()
            && self.ordering.refuse_held_after < MIN_REFUSE_HELD_AFTER
        {
            return Err(bad(
                "ordering.refuse_held_after",
                format!(
                    "{:?} is too short: each refusal costs kubelet a 1–1.5 s retry (min {:?}; \"0s\" turns it off)",
                    self.ordering.refuse_held_after,
                    MIN_REFUSE_HELD_AFTER
                ),
            ));
        }
        for (key, d) in [
            ("watchdog.relay_stall", self.watchdog.relay_stall),
            ("watchdog.runtime_stall", self.watchdog.runtime_stall),
        ] {
            if d < MIN_WATCHDOG_STALL || d > MAX_WATCHDOG_STALL {
                return Err(bad(
                    key,
                    format!(
                        "{d:?} is out of range ({MIN_WATCHDOG_STALL:?}..={MAX_WATCHDOG_STALL:?}): \
                         shorter misjudges a busy node, longer lets kubelet's calls wait for \
                         their 2 min deadline"
                    ),
                ));
            }
        }
        if let Some(e) = &self.tracing.otlp_endpoint {
            check_otlp_endpoint(e).map_err(|why| bad("tracing.otlp_endpoint", why))?;
        }
        let delay = self.tracing.export_delay;
        if !(MIN_EXPORT_DELAY..=MAX_EXPORT_DELAY).contains(&delay) {
            return Err(bad(
                "tracing.export_delay",
                format!("{delay:?} is out of range ({MIN_EXPORT_DELAY:?}..={MAX_EXPORT_DELAY:?})"),
            ));
        }
        if self.ordering.probe_interval.is_zero() {
            return Err(bad(
                "ordering.probe_interval",
                "must be greater than 0".into(),
            ));
        }
        if self.ordering.probe_timeout.is_zero() {
            return Err(bad(
                "ordering.probe_timeout",
                "must be greater than 0".into(),
            ));
        }
        if !(1..=MAX_PROBES_IN_FLIGHT).contains(&self.ordering.max_probes_in_flight) {
            return Err(bad(
                "ordering.max_probes_in_flight",
                format!("must be between 1 and {MAX_PROBES_IN_FLIGHT}"),
            ));
        }
        if !(1..=MAX_PROBE_CONNECTS_PER_SECOND).contains(&self.ordering.probe_connects_per_second) {
            return Err(bad(
                "ordering.probe_connects_per_second",
                format!("must be between 1 and {MAX_PROBE_CONNECTS_PER_SECOND}"),
            ));
        }
        if !(1..=MAX_PROBES_IN_FLIGHT).contains(&self.ordering.max_exec_probes_in_flight) {
            return Err(bad(
                "ordering.max_exec_probes_in_flight",
                format!("must be between 1 and {MAX_PROBES_IN_FLIGHT}"),
            ));
        }
        if !(1..=MAX_PROBE_CONNECTS_PER_SECOND).contains(&self.ordering.exec_probes_per_second) {
            return Err(bad(
                "ordering.exec_probes_per_second",
                format!("must be between 1 and {MAX_PROBE_CONNECTS_PER_SECOND}"),
            ));
        }
        if !(1..=MAX_PROBE_CONNECTS_PER_SECOND)
            .contains(&self.ordering.exec_probes_per_pod_per_second)
        {
            return Err(bad(
                "ordering.exec_probes_per_pod_per_second",
                format!("must be between 1 and {MAX_PROBE_CONNECTS_PER_SECOND}"),
            ));
        }
        if !(1..=MAX_RUNTIME_READS_PER_SECOND).contains(&self.ordering.runtime_reads_per_second) {
            return Err(bad(
                "ordering.runtime_reads_per_second",
                format!("must be between 1 and {MAX_RUNTIME_READS_PER_SECOND}"),
            ));
        }
        if !(1..=MAX_RUNTIME_READS_IN_FLIGHT).contains(&self.ordering.max_runtime_reads_in_flight) {
            return Err(bad(
                "ordering.max_runtime_reads_in_flight",
                format!("must be between 1 and {MAX_RUNTIME_READS_IN_FLIGHT}"),
            ));
        }
        if self.ordering.probe_allow.len() > MAX_PROBE_ALLOW {
            return Err(bad(
                "ordering.probe_allow",
                format!("more than {MAX_PROBE_ALLOW} networks"),
            ));
        }
        self.readiness
            .validate()
            .map_err(|m| bad("readiness.shared_kernel_handlers", m))?;
        if self.job.poll_interval.is_zero() {
            return Err(bad("job.poll_interval", "must be greater than 0".into()));
        }
        if !(1..=64).contains(&self.proxy.upstream_connections) {
            return Err(bad(
                "proxy.upstream_connections",
                "must be between 1 and 64".into(),
            ));
        }
        if self.proxy.max_concurrent_streams == 0 {
            return Err(bad(
                "proxy.max_concurrent_streams",
                "must be greater than 0".into(),
            ));
        }
        if self.listen == self.upstream {
            return Err(bad(
                "listen",
                "must differ from `upstream` (crisp would forward to itself)".into(),
            ));
        }
        let mut seen = BTreeMap::new();
        for (i, rule) in self.sidecars.iter().enumerate() {
            if rule.name.is_empty() {
                return Err(bad(
                    &format!("sidecars[{i}].name"),
                    "must not be empty".into(),
                ));
            }
            if let Err(m) = crate::readiness::Readiness::parse(&rule.ready) {
                return Err(bad(&format!("sidecars[{i}].ready"), m));
            }
            if let Some(j) = seen.insert(rule.name.clone(), i) {
                return Err(bad(
                    &format!("sidecars[{i}].name"),
                    format!("`{}` already declared in sidecars[{j}]", rule.name),
                ));
            }
        }
        let mut names = BTreeMap::new();
        for (i, rule) in self.injectors.iter().enumerate() {
            injectors::validate(rule).map_err(|(k, m)| bad(&format!("injectors[{i}].{k}"), m))?;
            if let Some(j) = names.insert(rule.name.clone(), i) {
                return Err(bad(
                    &format!("injectors[{i}].name"),
                    format!("`{}` already declared in injectors[{j}]", rule.name),
                ));
            }
        }
        if self.admin.enabled {
            let admin = self.admin_socket();
            if admin == self.listen || admin == self.upstream {
                return Err(bad(
                    "admin.socket",
                    format!(
                        "{} is already `listen` or `upstream`; the admin socket needs its own path",
                        admin.display()
                    ),
                ));
            }
            if self.admin.shared() && !self.admin.allow_shared_mode {
                return Err(bad(
                    "admin.mode",
                    format!(
                        "{:04o} lets the socket's group or everyone connect, and whoever connects \
                         sees every pod's CRI calls and the pods crisp tracks; use \"0600\", or \
                         set admin.allow_shared_mode = true to allow it",
                        self.admin.mode
                    ),
                ));
            }
            if self.admin.max_taps_per_uid == 0 || self.admin.max_taps_per_uid > 65_536 {
                return Err(bad(
                    "admin.max_taps_per_uid",
                    "must be from 1 to 65536".into(),
                ));
            }
            if self.admin.max_taps == 0 || self.admin.max_taps > 65_536 {
                return Err(bad("admin.max_taps", "must be from 1 to 65536".into()));
            }
            if self.admin.tap_queue == 0 {
                return Err(bad("admin.tap_queue", "must be greater than 0".into()));
            }
            if self.admin.tap_memory_bytes < 1 << 20 {
                return Err(bad(
                    "admin.tap_memory_bytes",
                    format!(
                        "{} is too small: at least 1048576 (1 MiB)",
                        self.admin.tap_memory_bytes
                    ),
                ));
            }
            self.admin.group_id().map_err(|m| bad("admin.group", m))?;
        }
        validate_filter(&self.log.level).map_err(|m| bad("log.level", m))?;
        Ok(())
    }
}
