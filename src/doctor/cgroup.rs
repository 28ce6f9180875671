//! Check 4b: the node's cgroup version against what kubelet does with it. kubelet 1.35 refuses
//! to start on cgroup v1 unless its config says `failCgroupV1: false` (KEP-5573: the option
//! exists since 1.31, default false; true from 1.35). The decision ([`cgroup_advice`]) is pure;
//! the reads are in [`check_cgroup`].

use std::path::Path;

use super::kubelet::{yaml_top_level, KUBELET_CONFIG};
use super::*;

/// The cgroup hierarchy kubelet sees (`IsCgroup2UnifiedMode`: `/sys/fs/cgroup` is cgroup2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cgroup {
    V1,
    V2,
}

/// First kubelet whose default is `failCgroupV1: true`.
const REFUSES_V1: (u32, u32) = (1, 35);

/// The cgroup version of the node under `root`: v2 when the root of `/sys/fs/cgroup` is the
/// unified hierarchy (it has `cgroup.controllers`), v1 (legacy or hybrid) when it holds v1
/// controllers, unknown otherwise.
pub(crate) fn cgroup_version(root: &Path) -> Option<Cgroup> {
    let fs = under_root(root, Path::new("/sys/fs/cgroup"));
    if fs.join("cgroup.controllers").exists() {
        Some(Cgroup::V2)
    } else if ["memory", "cpu", "pids", "systemd"]
        .iter()
        .any(|c| fs.join(c).is_dir())
    {
        Some(Cgroup::V1)
    } else {
        None
    }
}

/// `failCgroupV1` as kubelet's config file sets it (`None`: not set, or not a boolean).
pub(crate) fn fail_cgroup_v1(config: &str) -> Option<bool> {
    match yaml_top_level(config, "failCgroupV1")?.as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// What the cgroup version means for this kubelet: (level, detail, fix).
pub(crate) fn cgroup_advice(
    kubelet: Option<(u32, u32)>,
    cgroup: Option<Cgroup>,
    fail_v1: Option<bool>,
) -> (Level, String, Option<String>) {
    let fix_v1 = format!(
        "set `failCgroupV1: false` in {KUBELET_CONFIG} and restart kubelet (KEP-5573); better, move the node to cgroup v2 (systemd.unified_cgroup_hierarchy=1): cgroup v1 support is in maintenance and will be removed"
    );
    let Some(cgroup) = cgroup else {
        return (
            Level::Ok,
            "cgroup version unknown (no /sys/fs/cgroup hierarchy found); on cgroup v1, kubelet 1.35+ needs failCgroupV1: false".into(),
            None,
        );
    };
    if cgroup == Cgroup::V2 {
        return (
            Level::Ok,
            "cgroup v2: every kubelet crisp supports runs on it".into(),
            None,
        );
    }
    let refuses = match (fail_v1, kubelet) {
        (Some(fail), _) => Some(fail),
        (None, Some(v)) => Some(v >= REFUSES_V1),
        (None, None) => None,
    };
    let kubelet_is = kubelet.map_or("kubelet".to_string(), |(a, b)| format!("kubelet {a}.{b}"));
    match (refuses, fail_v1) {
        (Some(true), Some(true)) => (
            Level::Fail,
            format!("cgroup v1, and {KUBELET_CONFIG} sets failCgroupV1: true: {kubelet_is} will not start"),
            Some(fix_v1),
        ),
        (Some(true), _) => (
            Level::Fail,
            format!("cgroup v1: {kubelet_is} refuses to start on it by default (failCgroupV1 defaults to true from 1.35) and {KUBELET_CONFIG} does not set it"),
            Some(fix_v1),
        ),
        (Some(false), Some(false)) => (
            Level::Warn,
            format!("cgroup v1, with failCgroupV1: false: {kubelet_is} runs on it (crisp's 1.35 and 1.36 lanes run so), but cgroup v1 is deprecated"),
            Some("move the node to cgroup v2 (systemd.unified_cgroup_hierarchy=1) before kubelet drops cgroup v1".into()),
        ),
        (Some(false), _) => (
            Level::Ok,
            format!("cgroup v1: {kubelet_is} runs on it; kubelet 1.35+ will need failCgroupV1: false in {KUBELET_CONFIG}"),
            None,
        ),
        (None, _) => (
            Level::Warn,
            format!("cgroup v1 and kubelet's version unknown: kubelet 1.35+ refuses cgroup v1 unless {KUBELET_CONFIG} sets failCgroupV1: false"),
            Some(fix_v1),
        ),
    }
}

pub(super) fn check_cgroup(opts: &Options, kubelet: Option<(u32, u32)>, r: &mut Report) {
    let config = std::fs::read_to_string(under_root(&opts.root, Path::new(KUBELET_CONFIG)));
    let fail_v1 = config.ok().as_deref().and_then(fail_cgroup_v1);
    let (level, detail, fix) = cgroup_advice(kubelet, cgroup_version(&opts.root), fail_v1);
    r.push("cgroup", level, detail, fix);
}
