//! Check 4: kubelet's configured runtime endpoint points at crisp, read from the files
//! `hack/install.sh` edits; kubelet's version and its native sidecars.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// Where kubelet reads its flags and config on a kubeadm-style node, lowest precedence first
/// (10-kubeadm.conf: `$KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS`; on the
/// command line the last flag wins, and flags win over the config file).
pub(crate) const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
const KUBEADM_FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
const EXTRA_ARGS_FILES: [&str; 2] = ["/etc/sysconfig/kubelet", "/etc/default/kubelet"];

/// A setting and the file that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Setting {
    pub(crate) value: String,
    pub(crate) file: PathBuf,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct KubeletSettings {
    pub(crate) runtime_endpoint: Option<Setting>,
    pub(crate) image_endpoint: Option<Setting>,
    /// `--container-runtime=...` (removed in kubelet 1.27).
    pub(crate) container_runtime: Option<Setting>,
    /// `--pod-infra-container-image=...` (removed in kubelet 1.35: the runtime's sandbox image
    /// decides).
    pub(crate) pod_infra_image: Option<Setting>,
    /// Files that exist, as node paths.
    pub(crate) files: Vec<PathBuf>,
}

/// The value of the last `name=...` assignment in an EnvironmentFile, unquoted.
pub(crate) fn env_file_var(text: &str, name: &str) -> Option<String> {
    let mut found = None;
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            continue;
        };
        if k.trim() != name {
            continue;
        }
        let v = v.trim();
        let unq = ['"', '\'']
            .iter()
            .find_map(|q| v.strip_prefix(*q).and_then(|x| x.strip_suffix(*q)));
        found = Some(unq.unwrap_or(v).to_string());
    }
    found
}

/// The last value of `--flag=v` / `--flag v` in a kubelet argument string.
pub(crate) fn flag_value(args: &str, flag: &str) -> Option<String> {
    let toks: Vec<&str> = args.split_whitespace().collect();
    let mut found = None;
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i];
        if let Some(v) = t.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_string());
        } else if t == flag && i + 1 < toks.len() {
            found = Some(toks[i + 1].to_string());
            i += 1;
        }
        i += 1;
    }
    found
}

/// A top-level `key: value` of a (kubeadm-written, block-style) YAML file, unquoted.
pub(crate) fn yaml_top_level(text: &str, key: &str) -> Option<String> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(key).and_then(|r| r.strip_prefix(':')) else {
            continue;
        };
        let mut v = rest.trim();
        if let Some(i) = v.find(" #") {
            v = v[..i].trim_end();
        }
        let unq = ['"', '\'']
            .iter()
            .find_map(|q| v.strip_prefix(*q).and_then(|x| x.strip_suffix(*q)));
        found = Some(unq.unwrap_or(v).to_string());
    }
    found
}

/// Reads kubelet's endpoint settings from the files `hack/install.sh` edits.
fn kubelet_settings(root: &Path) -> KubeletSettings {
    let mut s = KubeletSettings::default();
    let read = |p: &str| std::fs::read_to_string(under_root(root, Path::new(p))).ok();
    if let Some(text) = read(KUBELET_CONFIG) {
        s.files.push(KUBELET_CONFIG.into());
        let set = |v: Option<String>| {
            v.filter(|v| !v.is_empty()).map(|value| Setting {
                value,
                file: KUBELET_CONFIG.into(),
            })
        };
        s.runtime_endpoint = set(yaml_top_level(&text, "containerRuntimeEndpoint"));
        s.image_endpoint = set(yaml_top_level(&text, "imageServiceEndpoint"));
    }
    let mut args_files: Vec<(&str, &str)> = vec![(KUBEADM_FLAGS, "KUBELET_KUBEADM_ARGS")];
    args_files.extend(EXTRA_ARGS_FILES.iter().map(|f| (*f, "KUBELET_EXTRA_ARGS")));
    for (file, var) in args_files {
        let Some(text) = read(file) else { continue };
        s.files.push(file.into());
        let Some(args) = env_file_var(&text, var) else {
            continue;
        };
        let set = |flag: &str, slot: &mut Option<Setting>| {
            if let Some(value) = flag_value(&args, flag) {
                *slot = Some(Setting {
                    value,
                    file: file.into(),
                });
            }
        };
        set("--container-runtime-endpoint", &mut s.runtime_endpoint);
        set("--image-service-endpoint", &mut s.image_endpoint);
        set("--container-runtime", &mut s.container_runtime);
        set("--pod-infra-container-image", &mut s.pod_infra_image);
    }
    s
}

/// `unix:///a/b` and `/a/b` → the path; anything else (tcp://, npipe://) → None.
pub(crate) fn endpoint_path(endpoint: &str) -> Option<PathBuf> {
    let p = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    p.starts_with('/').then(|| PathBuf::from(p))
}

/// kubelet's version as (major, minor), from `kubelet --version` ("Kubernetes v1.27.3").
pub(crate) fn parse_kubelet_version(s: &str) -> Option<(u32, u32)> {
    let v = s.split_whitespace().last()?.trim_start_matches('v');
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.trim_end_matches('+').parse().ok()?;
    Some((major, minor))
}

/// Where kubelet's binary is looked for under `--root` (on `/`, `kubelet` on PATH first).
const KUBELET_BINS: [&str; 3] = [
    "/usr/bin/kubelet",
    "/usr/local/bin/kubelet",
    "/opt/bin/kubelet",
];

/// kubelet's version, from running `kubelet --version`.
pub(super) fn kubelet_version(root: &Path) -> Option<(u32, u32)> {
    let run = |bin: &Path| -> Option<(u32, u32)> {
        let out = Command::new(bin).arg("--version").output().ok()?;
        parse_kubelet_version(&String::from_utf8_lossy(&out.stdout))
    };
    if root == Path::new("/") {
        if let Some(v) = run(Path::new("kubelet")) {
            return Some(v);
        }
    }
    KUBELET_BINS
        .iter()
        .map(|b| under_root(root, Path::new(b)))
        .filter(|b| b.exists())
        .find_map(|b| run(&b))
}

/// Newest kubelet minor crisp's lanes have run (docs/SUPPORT.md).
pub(crate) const NEWEST_TRIED: u32 = 36;

/// What kubelet `version` means for crisp (docs/SUPPORT.md): (level, detail, fix).
pub(crate) fn version_advice(version: Option<(u32, u32)>) -> (Level, String, Option<String>) {
    let Some((major, minor)) = version else {
        // Not a problem with the installation (kubelet may run from elsewhere): reported, not
        // warned about.
        return (
            Level::Ok,
            format!("kubelet's version is unknown (no kubelet binary found to run `kubelet --version`); crisp orders sidecars for kubelet 1.20–1.{NEWEST_TRIED} (docs/SUPPORT.md), and from 1.29 on native sidecars need no crisp"),
            None,
        );
    };
    let v = format!("{major}.{minor}");
    let native = format!("kubelet {v} has native sidecars (KEP-753, on by default since 1.29): a pod that declares its sidecars as init containers with restartPolicy: Always needs no crisp; crisp still orders legacy sidecars on it");
    let move_native = "move sidecars to native ones (Istio and Linkerd have a native-sidecar mode) and uninstall crisp with hack/uninstall.sh — or keep it for pods you cannot change, and for `crisp tap`";
    match (major, minor) {
        (1, m) if m < 20 => (Level::Warn, format!("kubelet {v}: older than crisp supports (1.20–1.{NEWEST_TRIED})"), Some("upgrade kubelet to 1.20 or later".into())),
        (1, m) if m <= 27 => (Level::Ok, format!("kubelet {v} has no native sidecars: crisp orders sidecars, stops them last and ends Job sidecars"), None),
        (1, 28) => (Level::Ok, format!("kubelet {v}: native sidecars are alpha (feature gate SidecarContainers, off by default); crisp orders legacy sidecars and leaves native ones (init containers with restartPolicy: Always) to kubelet"), None),
        (1, m) if m <= 34 => (Level::Warn, native, Some(move_native.into())),
        (1, m) if m <= NEWEST_TRIED => (
            Level::Warn,
            format!("{native}. From 1.35 kubelet refuses cgroup v1 unless failCgroupV1: false (see the cgroup check) and has no --pod-infra-container-image"),
            Some(move_native.into()),
        ),
        _ => (
            Level::Warn,
            format!("kubelet {v} is newer than crisp has been tried with (1.{NEWEST_TRIED}); 1.37 makes the runtime's RuntimeConfig mandatory (KEP-4033: containerd 1.6 and 1.7 cannot answer it), restores pods whose containers crisp never saw created (CheckpointPod/RestorePod, KEP-5823) and adds container stop signals (KEP-4960)"),
            Some("read docs/SUPPORT.md (\"Kubelet 1.37 and later\") before upgrading; run containerd 2.x or CRI-O, which answer RuntimeConfig".into()),
        ),
    }
}

/// What the kubelet's version means for crisp (docs/SUPPORT.md).
pub(super) fn check_kubelet_version(version: Option<(u32, u32)>, r: &mut Report) {
    let (level, detail, fix) = version_advice(version);
    r.push("kubelet-version", level, detail, fix);
}

pub(super) fn check_kubelet(opts: &Options, listen: &Path, upstream: &Path, r: &mut Report) {
    let s = kubelet_settings(&opts.root);
    let crisp = format!("unix://{}", listen.display());
    let install = "run hack/install.sh (it edits the file that sets the endpoint, keeps a backup and restarts kubelet)";
    if s.files.is_empty() {
        r.warn(
            "kubelet",
            format!(
                "no kubelet configuration found under {} (looked for {KUBELET_CONFIG}, {KUBEADM_FLAGS}, {})",
                opts.root.display(),
                EXTRA_ARGS_FILES.join(", ")
            ),
            format!(
                "not a kubeadm-style node? start kubelet with --container-runtime-endpoint={crisp} (or containerRuntimeEndpoint: {crisp} in its config file)"
            ),
        );
        return;
    }
    match &s.runtime_endpoint {
        Some(set) if endpoint_path(&set.value).as_deref() == Some(listen) => r.ok("kubelet", format!("runtime endpoint {} (set in {}) is crisp", set.value, set.file.display())),
        Some(set) if endpoint_path(&set.value).as_deref() == Some(upstream) => {
            r.fail("kubelet", format!("runtime endpoint {} (set in {}) is the runtime itself: kubelet bypasses crisp", set.value, set.file.display()), install)
        }
        Some(set) => r.fail("kubelet", format!("runtime endpoint {} (set in {}) is not crisp ({crisp})", set.value, set.file.display()), format!("point it at {crisp}: {install}")),
        None => r.fail("kubelet", "no runtime endpoint configured: kubelet uses its default (containerd's socket), bypassing crisp", install),
    }
    if let Some(set) = &s.image_endpoint {
        if endpoint_path(&set.value).as_deref() != Some(listen) {
            r.warn(
                "kubelet",
                format!(
                    "image endpoint {} (set in {}) is not crisp: image calls bypass crisp and are not tapped",
                    set.value,
                    set.file.display()
                ),
                format!(
                    "set it to {crisp} or remove it (it defaults to the runtime endpoint): {install}"
                ),
            );
        }
    }
    if let Some(set) = &s.pod_infra_image {
        match kubelet_version(&opts.root) {
            Some(v) if v >= (1, 35) => r.fail(
                "kubelet",
                format!(
                    "--pod-infra-container-image (in {}) was removed in kubelet 1.35; this kubelet is {}.{} and will not start (\"unknown flag\")",
                    set.file.display(),
                    v.0,
                    v.1
                ),
                format!(
                    "remove the flag from {}: the runtime's sandbox image decides (containerd's sandbox image, CRI-O's pause_image)",
                    set.file.display()
                ),
            ),
            // Still accepted: say what the upgrade will need, without a warning on a node that
            // works as it is.
            Some(v) => r.ok(
                "kubelet",
                format!(
                    "--pod-infra-container-image (in {}) is accepted by kubelet {}.{}; kubelet 1.35 and later refuse to start with it: remove it before upgrading",
                    set.file.display(),
                    v.0,
                    v.1
                ),
            ),
            None => r.warn(
                "kubelet",
                format!(
                    "--pod-infra-container-image (in {}) is ignored, and kubelet 1.35 and later refuse to start with it",
                    set.file.display()
                ),
                format!(
                    "remove the flag from {} before upgrading kubelet to 1.35",
                    set.file.display()
                ),
            ),
        }
    }
    if let Some(set) = &s.container_runtime {
        if let Some(v) = kubelet_version(&opts.root).filter(|v| *v >= (1, 27)) {
            r.fail(
                "kubelet",
                format!(
                    "--container-runtime={} (in {}) was removed in kubelet 1.27; this kubelet is {}.{} and will not start",
                    set.value,
                    set.file.display(),
                    v.0,
                    v.1
                ),
                format!("remove the flag from {}: hack/install.sh does it", set.file.display()),
            );
        }
    }
}
