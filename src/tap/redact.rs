//! The one place that decides what of a CRI message crisp may show. Everything that prints or
//! stores a message — the tap's events, `crisp tap --output` files, the trace log — goes through
//! [`apply`] (on the decoded JSON) and never shows the content of a field it cannot name.
//!
//! Redacted by default (DESIGN.md §6, PRIOR-ART.md §5 "secrets in logs"):
//! - all of `PullImageRequest.auth` — which covers every field the CRI marks `debug_redact`
//!   (`DEBUG_REDACT`, compiled for tests: AuthConfig's password, auth, identity_token,
//!   registry_token; kubernetes PR #133135). AuthConfig appears nowhere else in the CRI;
//! - env *values* of `CreateContainerRequest.config.envs` (keys stay: they say what is set);
//! - the verbose `info` maps of ContainerStatus, PodSandboxStatus, ImageStatus and Status
//!   responses: they embed the OCI spec (with env), image configs and the runtime's own config
//!   (containerd's includes registry credentials);
//! - ExecSync's stdout and stderr (replaced by their size): probes print what they like;
//! - the token part of Exec/Attach/PortForward streaming URLs (each is a capability);
//! - by field name, in every message at any depth (`by_name`, issue #26): the values of every
//!   `annotations` map (shown as their size) but those crisp knows carry no secret
//!   ([`annotation_shown`]: `crisp.dev/*`, the known injectors' keys, kubelet's bookkeeping —
//!   never one that embeds a manifest). kubelet hands every pod annotation to the runtime
//!   (sandbox configs, the ImageSpec of PullImage/ImageStatus/RemoveImage/CreateContainer,
//!   statuses, lists, stats, container events), and `kubectl apply` keeps the pod as applied,
//!   env values included, in `kubectl.kubernetes.io/last-applied-configuration`;
//! - by field name too: `command`, `args` (kubelet expands `$(VAR)` in them with env values)
//!   and `cmd` (ExecSync, Exec), shown as their item count and size.
//!
//! Why this cannot be bypassed: rules are keyed by RPC, not by path, and v1alpha2 is decoded with
//! the v1 types (wire-identical), so both versions get the same rules; fields the typed decode
//! does not know (newer CRI fields, unknown methods, undecodable messages) are only ever shown
//! as field number, wire type and size — their content only with `--unredacted`.

use serde_json::Value;

use crate::cri::Rpc;

/// What replaces a redacted value.
pub(crate) const REDACTED: &str = "<redacted>";

/// Request or response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Dir {
    Request,
    Response,
}

/// Fields the CRI's api.proto marks `[debug_redact = true]` (message, field, number), as of the
/// newest kubernetes cri-api. All sit in AuthConfig, which is only carried by
/// `PullImageRequest.auth` — redacted whole, so these are covered with room to spare; the list
/// is kept so a test can prove it.
#[cfg(test)]
pub(crate) const DEBUG_REDACT: &[(&str, &str, u32)] = &[
    ("AuthConfig", "password", 2),
    ("AuthConfig", "auth", 3),
    ("AuthConfig", "identity_token", 5),
    ("AuthConfig", "registry_token", 6),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// The whole value (a message, a string) becomes `"<redacted>"`; an absent one stays null.
    Whole,
    /// Each value of a map becomes `"<redacted: N bytes>"`; keys stay.
    MapValues,
    /// A bytes field becomes `"<N bytes>"`.
    Size,
    /// A bytes field that usually holds text (an env value: `bytes` since cri-api v0.34.10,
    /// kubernetes#139132) becomes `"<redacted>"`; unredacted it is shown as text, the bytes
    /// that are not UTF-8 escaped (`\xff`).
    Text,
    /// A URL keeps everything up to its last `/`; the token after it is redacted.
    UrlToken,
}

struct Rule {
    rpc: Rpc,
    dir: Dir,
    /// JSON path (serde field names of k8s-cri's types); `*` = every element of a list.
    path: &'static [&'static str],
    /// The same path as protobuf field numbers (lists have no index): subtrees the unknown-field
    /// walk must not report from when redacting.
    wire: &'static [u32],
    how: How,
}

const RULES: &[Rule] = &[
    Rule {
        rpc: Rpc::PullImage,
        dir: Dir::Request,
        path: &["auth"],
        wire: &[2],
        how: How::Whole,
    },
    Rule {
        rpc: Rpc::CreateContainer,
        dir: Dir::Request,
        path: &["config", "envs", "*", "value"],
        wire: &[2, 6, 2],
        how: How::Text,
    },
    Rule {
        rpc: Rpc::ContainerStatus,
        dir: Dir::Response,
        path: &["info"],
        wire: &[2],
        how: How::MapValues,
    },
    Rule {
        rpc: Rpc::PodSandboxStatus,
        dir: Dir::Response,
        path: &["info"],
        wire: &[2],
        how: How::MapValues,
    },
    Rule {
        rpc: Rpc::ImageStatus,
        dir: Dir::Response,
        path: &["info"],
        wire: &[2],
        how: How::MapValues,
    },
    Rule {
        rpc: Rpc::Status,
        dir: Dir::Response,
        path: &["info"],
        wire: &[2],
        how: How::MapValues,
    },
    Rule {
        rpc: Rpc::ExecSync,
        dir: Dir::Response,
        path: &["stdout"],
        wire: &[1],
        how: How::Size,
    },
    Rule {
        rpc: Rpc::ExecSync,
        dir: Dir::Response,
        path: &["stderr"],
        wire: &[2],
        how: How::Size,
    },
    Rule {
        rpc: Rpc::Exec,
        dir: Dir::Response,
        path: &["url"],
        wire: &[1],
        how: How::UrlToken,
    },
    Rule {
        rpc: Rpc::Attach,
        dir: Dir::Response,
        path: &["url"],
        wire: &[1],
        how: How::UrlToken,
    },
    Rule {
        rpc: Rpc::PortForward,
        dir: Dir::Response,
        path: &["url"],
        wire: &[1],
        how: How::UrlToken,
    },
];

/// Annotation keys whose values crisp shows: keys crisp knows carry no secret. Every other
/// annotation's value, in every annotation map of every message, is shown as its size.
/// - crisp's own `crisp.dev/*` (the pod's ordering policy, what `crisp pods` shows anyway);
/// - the built-in known-injector keys crisp reads (config/injectors.rs: what was injected, never
///   how it is configured);
/// - kubelet's bookkeeping on containers and pods (numbers, paths, hashes, timestamps).
///   Not `io.kubernetes.container.preStopHandler` / `postStartHandler`: the pod's hook
///   commands, which kubelet expands like `command` and `args`.
const SHOWN_ANNOTATIONS: &[&str] = &[
    "sidecar.istio.io/status",
    "status.sidecar.istio.io/port",
    "linkerd.io/proxy-version",
    "config.linkerd.io/admin-port",
    "config.alpha.linkerd.io/proxy-enable-native-sidecar",
    "config.beta.linkerd.io/proxy-enable-native-sidecar",
    "vault.hashicorp.com/agent-inject-status",
    "vault.hashicorp.com/agent-pre-populate-only",
    "io.kubernetes.container.hash",
    "io.kubernetes.container.restartCount",
    "io.kubernetes.container.terminationMessagePath",
    "io.kubernetes.container.terminationMessagePolicy",
    "io.kubernetes.container.ports",
    "io.kubernetes.pod.terminationGracePeriod",
    "io.kubernetes.pod.deletionGracePeriod",
    "kubernetes.io/config.seen",
    "kubernetes.io/config.source",
    "kubernetes.io/config.hash",
];

/// Field names that, in any CRI message, hold what a pod author or kubelet put there from the
/// pod spec and may carry a secret: every `map<string, string> annotations` (kubelet copies
/// all pod annotations into sandbox configs, image specs and statuses), and the command lines
/// `command`/`args` (ContainerConfig: kubelet expands `$(VAR)` with env values, Secret-backed
/// ones included) and `cmd` (ExecSync, Exec). Matched by name at any depth of the decoded
/// message, not by path, so a message or field a future CRI adds under the same names is
/// covered the day it is decoded.
const ANNOTATIONS_FIELD: &str = "annotations";
const COMMAND_FIELDS: &[&str] = &["command", "args", "cmd"];

/// Whether an annotation's value is shown: a key crisp knows (crisp's own `crisp.dev/*` or one
/// of `SHOWN_ANNOTATIONS`) whose value does not embed a manifest.
fn annotation_shown(key: &str, value: &str) -> bool {
    (key.starts_with("crisp.dev/") || SHOWN_ANNOTATIONS.contains(&key))
        && !carries_manifest(key, value)
}

/// Annotations that tools fill with a whole object as applied (env values included).
const MANIFEST_ANNOTATIONS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    "kapp.k14s.io/original",
];

/// Whether an annotation's value may embed a manifest: one of the annotations tools keep a copy
/// of the applied object in, or any value shaped like a serialised Kubernetes object (a JSON
/// object naming its `apiVersion` and `kind`), whoever put it there.
fn carries_manifest(key: &str, value: &str) -> bool {
    MANIFEST_ANNOTATIONS.contains(&key)
        || (value.trim_start().starts_with('{')
            && value.contains("\"apiVersion\"")
            && value.contains("\"kind\""))
}

/// Wire paths under which nothing may be shown when redacting (not even unknown-field sizes).
pub(crate) fn redacted_wire_paths(rpc: Rpc, dir: Dir) -> impl Iterator<Item = &'static [u32]> {
    RULES
        .iter()
        .filter(move |r| r.rpc == rpc && r.dir == dir && r.how == How::Whole)
        .map(|r| r.wire)
}

/// Top-level fields of `rpc`'s message going `dir` that are only ever shown by their size: the
/// tap never keeps their content (ExecSync's output, issue #33), so not even `--unredacted`
/// shows it. The same fields as the [`How::Size`] rules (a test checks).
pub(crate) fn size_only(rpc: Rpc, dir: Dir) -> &'static [u32] {
    match (rpc, dir) {
        (Rpc::ExecSync, Dir::Response) => &[1, 2],
        _ => &[],
    }
}

/// How a top-level field cut from a view (shown by its size only) is shown under its own name:
/// the name and the value, when a rule names it; `None`, when it is only listed by number.
pub(crate) fn cut_field(
    rpc: Rpc,
    dir: Dir,
    number: u32,
    len: u64,
) -> Option<(&'static str, Value)> {
    let r = RULES
        .iter()
        .find(|r| r.rpc == rpc && r.dir == dir && r.wire == [number] && r.path.len() == 1)?;
    let shown = match r.how {
        How::Size => format!("<{len} bytes>"),
        How::Whole | How::Text | How::UrlToken => REDACTED.to_string(),
        How::MapValues => return None,
    };
    Some((r.path[0], Value::String(shown)))
}

/// Redacts a decoded message in place (`redact`), or only makes bytes fields readable
/// (`!redact`: an `--unredacted` root subscriber).
pub(crate) fn apply(rpc: Rpc, dir: Dir, v: &mut Value, redact: bool) {
    for r in RULES.iter().filter(|r| r.rpc == rpc && r.dir == dir) {
        visit(v, r.path, &mut |x| transform(x, r.how, redact));
    }
    if redact {
        by_name(v, 0);
    }
}

/// Deepest nesting [`by_name`] walks (CRI messages nest about 6 deep; the decoded JSON is
/// serde's, with no depth of its own beyond the message's).
const MAX_NAME_DEPTH: usize = 64;

/// Redacts, at any depth, every annotation map's values (but the ones crisp knows carry no
/// secret) and every command line, by field name (see [`ANNOTATIONS_FIELD`]).
fn by_name(v: &mut Value, depth: usize) {
    if depth > MAX_NAME_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                match (k.as_str(), &mut *x) {
                    (ANNOTATIONS_FIELD, Value::Object(ann)) => {
                        for (key, val) in ann.iter_mut() {
                            let shown = val.as_str().is_some_and(|s| annotation_shown(key, s));
                            if !shown {
                                let n = val.as_str().map(str::len).unwrap_or(0);
                                *val = Value::String(format!("<redacted: {n} bytes>"));
                            }
                        }
                    }
                    (name, Value::Array(items)) if COMMAND_FIELDS.contains(&name) => {
                        let bytes: usize = items
                            .iter()
                            .map(|i| i.as_str().map(str::len).unwrap_or(0))
                            .sum();
                        *x = Value::String(format!(
                            "<redacted: {} items, {bytes} bytes>",
                            items.len()
                        ));
                    }
                    _ => by_name(x, depth + 1),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|x| by_name(x, depth + 1)),
        _ => {}
    }
}

fn visit(v: &mut Value, path: &[&str], f: &mut dyn FnMut(&mut Value)) {
    let Some((head, rest)) = path.split_first() else {
        f(v);
        return;
    };
    match (head, v) {
        (&"*", Value::Array(items)) => items.iter_mut().for_each(|x| visit(x, rest, f)),
        (key, Value::Object(m)) => {
            if let Some(x) = m.get_mut(*key) {
                visit(x, rest, f);
            }
        }
        _ => {}
    }
}

fn transform(v: &mut Value, how: How, redact: bool) {
    if v.is_null() {
        return;
    }
    if !redact {
        // Unredacted: bytes are shown as text instead of a list of numbers (lossy for output,
        // escaped for a value that says what a container was given).
        match (how, bytes_of(v)) {
            (How::Size, Some(b)) => *v = Value::String(String::from_utf8_lossy(&b).into_owned()),
            (How::Text, Some(b)) => {
                *v = Value::String(match String::from_utf8(b) {
                    Ok(s) => s,
                    Err(e) => e.into_bytes().escape_ascii().to_string(),
                })
            }
            _ => {}
        }
        return;
    }
    match how {
        How::Whole | How::Text => *v = Value::String(REDACTED.into()),
        How::MapValues => {
            if let Value::Object(m) = v {
                for x in m.values_mut() {
                    let n = x.as_str().map(str::len).unwrap_or(0);
                    *x = Value::String(format!("<redacted: {n} bytes>"));
                }
            } else {
                *v = Value::String(REDACTED.into());
            }
        }
        How::Size => {
            let n = bytes_of(v).map(|b| b.len()).unwrap_or(0);
            *v = Value::String(format!("<{n} bytes>"));
        }
        How::UrlToken => match v.as_str().and_then(|s| s.rfind('/').map(|i| &s[..=i])) {
            Some(prefix) => *v = Value::String(format!("{prefix}{REDACTED}")),
            None => *v = Value::String(REDACTED.into()),
        },
    }
}

/// A serde-serialised `Vec<u8>` (a list of numbers) back as bytes.
fn bytes_of(v: &Value) -> Option<Vec<u8>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|n| u8::try_from(n).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The injector keys shown are exactly those the built-in injector table reads
    /// (config/injectors.rs): a key added there is shown here, and nothing else of a mesh is.
    #[test]
    fn shown_injector_keys_are_the_injector_tables() {
        use std::collections::BTreeSet;
        let table: BTreeSet<String> = crate::config::injectors::builtin()
            .into_iter()
            .flat_map(|r| {
                let ports = r.sidecars.into_iter().filter_map(|s| s.port_annotation);
                r.when
                    .into_iter()
                    .chain(r.unless.into_keys())
                    .chain(r.status)
                    .chain(ports)
            })
            .collect();
        let kubelet_or_crisp = ["io.kubernetes.", "kubernetes.io/", "crisp.dev/"];
        let shown: BTreeSet<String> = SHOWN_ANNOTATIONS
            .iter()
            .filter(|k| !kubelet_or_crisp.iter().any(|p| k.starts_with(p)))
            .map(|k| k.to_string())
            .collect();
        assert_eq!(shown, table);
    }

    #[test]
    fn whole_and_nested_list_paths() {
        let mut v =
            json!({"auth": {"username": "u", "password": "p"}, "image": {"image": "busybox"}});
        apply(Rpc::PullImage, Dir::Request, &mut v, true);
        assert_eq!(v, json!({"auth": REDACTED, "image": {"image": "busybox"}}));
        // An absent auth stays visibly absent.
        let mut v = json!({"auth": null});
        apply(Rpc::PullImage, Dir::Request, &mut v, true);
        assert_eq!(v, json!({"auth": null}));
        let mut v =
            json!({"config": {"envs": [{"key": "A", "value": "s1"}, {"key": "B", "value": "s2"}]}});
        apply(Rpc::CreateContainer, Dir::Request, &mut v, true);
        assert_eq!(
            v,
            json!(
                {"config": {"envs": [{"key": "A", "value": REDACTED}, {"key": "B", "value": REDACTED}]}}
            )
        );
        // Rules are per direction: a response with the same shape is not touched.
        let mut v = json!({"auth": "x"});
        apply(Rpc::PullImage, Dir::Response, &mut v, true);
        assert_eq!(v, json!({"auth": "x"}));
    }

    #[test]
    fn size_only_fields_are_the_size_rules() {
        for r in RULES {
            let single = r.wire.len() == 1;
            assert_eq!(
                r.how == How::Size && single,
                size_only(r.rpc, r.dir).contains(&r.wire[0]),
                "{:?} {:?}",
                r.rpc,
                r.path
            );
        }
    }

    #[test]
    fn maps_bytes_and_urls() {
        let mut v = json!({"info": {"info": "{\"env\":[\"A=secret\"]}"}});
        apply(Rpc::ContainerStatus, Dir::Response, &mut v, true);
        assert_eq!(v, json!({"info": {"info": "<redacted: 20 bytes>"}}));
        let mut v = json!({"stdout": [104, 105], "stderr": [], "exit_code": 0});
        apply(Rpc::ExecSync, Dir::Response, &mut v.clone(), false);
        apply(Rpc::ExecSync, Dir::Response, &mut v, true);
        assert_eq!(
            v,
            json!({"stdout": "<2 bytes>", "stderr": "<0 bytes>", "exit_code": 0})
        );
        let mut v = json!({"stdout": [104, 105]});
        apply(Rpc::ExecSync, Dir::Response, &mut v, false);
        assert_eq!(v, json!({"stdout": "hi"}));
        let mut v = json!({"url": "http://127.0.0.1:35000/exec/AbCdEf"});
        apply(Rpc::Exec, Dir::Response, &mut v, true);
        assert_eq!(v, json!({"url": "http://127.0.0.1:35000/exec/<redacted>"}));
    }

    #[test]
    fn annotations_carrying_a_manifest_are_redacted_and_the_others_kept() {
        let applied = r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"env":[{"name":"DB_PASSWORD","value":"s3cret"}]}]}}"#;
        let annotations = json!({
            "kubectl.kubernetes.io/last-applied-configuration": applied,
            "example.com/copy": format!("  {applied}"),
            "kapp.k14s.io/original": "not json at all",
            "crisp.dev/sidecars": "proxy",
            "example.com/config": "{\"kind\": \"of\"}",
        });
        let n = applied.len();
        let want = json!({
            "kubectl.kubernetes.io/last-applied-configuration": format!("<redacted: {n} bytes>"),
            "example.com/copy": format!("<redacted: {} bytes>", n + 2),
            "kapp.k14s.io/original": "<redacted: 15 bytes>",
            "crisp.dev/sidecars": "proxy",
            "example.com/config": "<redacted: 14 bytes>",
        });
        for (rpc, dir, path) in [
            (Rpc::RunPodSandbox, Dir::Request, vec!["config"]),
            (Rpc::CreateContainer, Dir::Request, vec!["sandbox_config"]),
            (Rpc::PullImage, Dir::Request, vec!["sandbox_config"]),
            (Rpc::PodSandboxStatus, Dir::Response, vec!["status"]),
        ] {
            let mut v = json!({ path[0]: { "annotations": annotations.clone() } });
            apply(rpc, dir, &mut v, true);
            assert_eq!(v[path[0]]["annotations"], want, "{rpc:?}");
            // Unredacted (a root `--unredacted` subscriber) sees them as they are.
            let mut v = json!({ path[0]: { "annotations": annotations.clone() } });
            apply(rpc, dir, &mut v, false);
            assert_eq!(v[path[0]]["annotations"], annotations, "{rpc:?}");
        }
        let mut v = json!(
            {"items": [{"id": "a", "annotations": annotations.clone()}, {"id": "b", "annotations": {}}]}
        );
        apply(Rpc::ListPodSandbox, Dir::Response, &mut v, true);
        assert_eq!(v["items"][0]["annotations"], want);
        assert_eq!(v["items"][1]["annotations"], json!({}));
        let mut v =
            json!({"stats": {"attributes": {"id": "a", "annotations": annotations.clone()}}});
        apply(Rpc::PodSandboxStats, Dir::Response, &mut v, true);
        assert_eq!(v["stats"]["attributes"]["annotations"], want);
        let mut v =
            json!({"stats": [{"attributes": {"id": "a", "annotations": annotations.clone()}}]});
        apply(Rpc::ListPodSandboxStats, Dir::Response, &mut v, true);
        assert_eq!(v["stats"][0]["attributes"]["annotations"], want);
    }

    #[test]
    fn command_lines_show_their_count_and_size() {
        let mut v = json!(
            {"config": {"command": ["/bin/app", "--token=abc"], "args": [], "working_dir": "/srv"}}
        );
        apply(Rpc::CreateContainer, Dir::Request, &mut v, true);
        assert_eq!(
            v,
            json!(
                {"config": {"command": "<redacted: 2 items, 19 bytes>", "args": "<redacted: 0 items, 0 bytes>", "working_dir": "/srv"}}
            )
        );
        // An allowed key whose value embeds a manifest is still redacted.
        let manifest = r#"{"apiVersion":"v1","kind":"Secret"}"#;
        let mut v = json!({"annotations": {"crisp.dev/sidecars": manifest}});
        apply(Rpc::RunPodSandbox, Dir::Request, &mut v, true);
        assert_eq!(
            v,
            json!(
                {"annotations": {"crisp.dev/sidecars": format!("<redacted: {} bytes>", manifest.len())}}
            )
        );
    }
    /// The fields api.proto marks `debug_redact` are the ones the tap's redaction lists.
    #[test]
    fn debug_redact_fields_are_the_ones_the_tap_knows() {
        let listed: Vec<(String, String, u32)> = DEBUG_REDACT
            .iter()
            .map(|(m, f, n)| (m.to_string(), f.to_string(), *n))
            .collect();
        assert_eq!(crate::cri::drift::debug_redact_fields(), listed);
    }
}
