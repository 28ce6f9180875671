//! The one place that decides what of a CRI message crisp may show. Everything that prints or
//! stores a message — the tap's events, `crisp tap --output` files, the trace log — goes through
//! [`apply`] (on the decoded JSON) and never shows the content of a field it cannot name.
//!
//! Redacted by default (DESIGN.md §6, PRIOR-ART.md §5 "secrets in logs"):
//! - all of `PullImageRequest.auth` — which covers every field the CRI marks `debug_redact`
//!   ([`DEBUG_REDACT`]: AuthConfig's password, auth, identity_token, registry_token; kubernetes
//!   PR #133135). AuthConfig appears nowhere else in the CRI;
//! - env *values* of `CreateContainerRequest.config.envs` (keys stay: they say what is set);
//! - the verbose `info` maps of ContainerStatus, PodSandboxStatus, ImageStatus and Status
//!   responses: they embed the OCI spec (with env), image configs and the runtime's own config
//!   (containerd's includes registry credentials);
//! - ExecSync's stdout and stderr (replaced by their size): probes print what they like;
//! - the token part of Exec/Attach/PortForward streaming URLs (each is a capability);
//! - pod annotations that carry a whole manifest ([`carries_manifest`]): `kubectl apply` keeps
//!   the pod as applied, env values included, in `kubectl.kubernetes.io/last-applied-configuration`,
//!   and kubelet hands every pod annotation to the runtime (RunPodSandbox, CreateContainer and
//!   PullImage requests; PodSandboxStatus, ListPodSandbox and the pod stats responses). Other
//!   annotations — crisp's own `crisp.dev/*` among them — stay readable.
//!
//! Why this cannot be bypassed: rules are keyed by RPC, not by path, and v1alpha2 is decoded with
//! the v1 types (wire-identical), so both versions get the same rules; fields the typed decode
//! does not know (newer CRI fields, unknown methods, undecodable messages) are only ever shown
//! as field number, wire type and size — their content only with `--unredacted`.

use serde_json::Value;

use crate::cri::Rpc;

/// What replaces a redacted value.
pub const REDACTED: &str = "<redacted>";

/// Request or response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    Request,
    Response,
}

/// Fields the CRI's api.proto marks `[debug_redact = true]` (message, field, number), as of the
/// newest kubernetes cri-api. All sit in AuthConfig, which is only carried by
/// `PullImageRequest.auth` — redacted whole, so these are covered with room to spare; the list
/// is kept so a test can prove it.
pub const DEBUG_REDACT: &[(&str, &str, u32)] =
    &[("AuthConfig", "password", 2), ("AuthConfig", "auth", 3), ("AuthConfig", "identity_token", 5), ("AuthConfig", "registry_token", 6)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// The whole value (a message, a string) becomes `"<redacted>"`; an absent one stays null.
    Whole,
    /// Each value of a map becomes `"<redacted: N bytes>"`; keys stay.
    MapValues,
    /// A bytes field becomes `"<N bytes>"`.
    Size,
    /// A URL keeps everything up to its last `/`; the token after it is redacted.
    UrlToken,
    /// A map of annotations: values that carry a manifest become `"<redacted: N bytes>"`.
    Manifests,
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
    Rule { rpc: Rpc::PullImage, dir: Dir::Request, path: &["auth"], wire: &[2], how: How::Whole },
    Rule { rpc: Rpc::CreateContainer, dir: Dir::Request, path: &["config", "envs", "*", "value"], wire: &[2, 6, 2], how: How::Whole },
    Rule { rpc: Rpc::ContainerStatus, dir: Dir::Response, path: &["info"], wire: &[2], how: How::MapValues },
    Rule { rpc: Rpc::PodSandboxStatus, dir: Dir::Response, path: &["info"], wire: &[2], how: How::MapValues },
    Rule { rpc: Rpc::ImageStatus, dir: Dir::Response, path: &["info"], wire: &[2], how: How::MapValues },
    Rule { rpc: Rpc::Status, dir: Dir::Response, path: &["info"], wire: &[2], how: How::MapValues },
    Rule { rpc: Rpc::ExecSync, dir: Dir::Response, path: &["stdout"], wire: &[1], how: How::Size },
    Rule { rpc: Rpc::ExecSync, dir: Dir::Response, path: &["stderr"], wire: &[2], how: How::Size },
    Rule { rpc: Rpc::Exec, dir: Dir::Response, path: &["url"], wire: &[1], how: How::UrlToken },
    Rule { rpc: Rpc::Attach, dir: Dir::Response, path: &["url"], wire: &[1], how: How::UrlToken },
    Rule { rpc: Rpc::PortForward, dir: Dir::Response, path: &["url"], wire: &[1], how: How::UrlToken },
    Rule { rpc: Rpc::RunPodSandbox, dir: Dir::Request, path: &["config", "annotations"], wire: &[1, 7], how: How::Manifests },
    Rule { rpc: Rpc::CreateContainer, dir: Dir::Request, path: &["sandbox_config", "annotations"], wire: &[3, 7], how: How::Manifests },
    Rule { rpc: Rpc::PullImage, dir: Dir::Request, path: &["sandbox_config", "annotations"], wire: &[3, 7], how: How::Manifests },
    Rule { rpc: Rpc::PodSandboxStatus, dir: Dir::Response, path: &["status", "annotations"], wire: &[1, 8], how: How::Manifests },
    Rule { rpc: Rpc::ListPodSandbox, dir: Dir::Response, path: &["items", "*", "annotations"], wire: &[1, 6], how: How::Manifests },
    Rule { rpc: Rpc::PodSandboxStats, dir: Dir::Response, path: &["stats", "attributes", "annotations"], wire: &[1, 1, 4], how: How::Manifests },
    Rule { rpc: Rpc::ListPodSandboxStats, dir: Dir::Response, path: &["stats", "*", "attributes", "annotations"], wire: &[1, 1, 4], how: How::Manifests },
];

/// Annotations that tools fill with a whole object as applied (env values included).
const MANIFEST_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration", "kapp.k14s.io/original"];

/// Whether an annotation's value may embed a manifest: one of the annotations tools keep a copy
/// of the applied object in, or any value shaped like a serialised Kubernetes object (a JSON
/// object naming its `apiVersion` and `kind`), whoever put it there.
pub fn carries_manifest(key: &str, value: &str) -> bool {
    MANIFEST_ANNOTATIONS.contains(&key) || (value.trim_start().starts_with('{') && value.contains("\"apiVersion\"") && value.contains("\"kind\""))
}

/// Wire paths under which nothing may be shown when redacting (not even unknown-field sizes).
pub fn redacted_wire_paths(rpc: Rpc, dir: Dir) -> impl Iterator<Item = &'static [u32]> {
    RULES.iter().filter(move |r| r.rpc == rpc && r.dir == dir && r.how == How::Whole).map(|r| r.wire)
}

/// Redacts a decoded message in place (`redact`), or only makes bytes fields readable
/// (`!redact`: an `--unredacted` root subscriber).
pub fn apply(rpc: Rpc, dir: Dir, v: &mut Value, redact: bool) {
    for r in RULES.iter().filter(|r| r.rpc == rpc && r.dir == dir) {
        visit(v, r.path, &mut |x| transform(x, r.how, redact));
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
        // Unredacted: bytes are shown as text (lossy) instead of a list of numbers.
        if how == How::Size {
            if let Some(b) = bytes_of(v) {
                *v = Value::String(String::from_utf8_lossy(&b).into_owned());
            }
        }
        return;
    }
    match how {
        How::Whole => *v = Value::String(REDACTED.into()),
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
        How::Manifests => {
            if let Value::Object(m) = v {
                for (k, x) in m.iter_mut() {
                    if let Some(n) = x.as_str().filter(|s| carries_manifest(k, s)).map(str::len) {
                        *x = Value::String(format!("<redacted: {n} bytes>"));
                    }
                }
            } else {
                *v = Value::String(REDACTED.into());
            }
        }
    }
}

/// A serde-serialised `Vec<u8>` (a list of numbers) back as bytes.
fn bytes_of(v: &Value) -> Option<Vec<u8>> {
    v.as_array()?.iter().map(|x| x.as_u64().and_then(|n| u8::try_from(n).ok())).collect()
}

/// A message as one redacted JSON line for a log, cut at `max` bytes: the only way crisp puts a
/// message in its log (DESIGN.md §6: never Debug-print a CRI message).
pub fn for_log(rpc: Option<Rpc>, dir: Dir, msg: &[u8], max: usize) -> String {
    let v = super::decode::decode(rpc, dir, msg, true);
    let mut s = v.to_string();
    crate::status::cut_text(&mut s, max);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_and_nested_list_paths() {
        let mut v = json!({"auth": {"username": "u", "password": "p"}, "image": {"image": "busybox"}});
        apply(Rpc::PullImage, Dir::Request, &mut v, true);
        assert_eq!(v, json!({"auth": REDACTED, "image": {"image": "busybox"}}));
        // An absent auth stays visibly absent.
        let mut v = json!({"auth": null});
        apply(Rpc::PullImage, Dir::Request, &mut v, true);
        assert_eq!(v, json!({"auth": null}));
        let mut v = json!({"config": {"envs": [{"key": "A", "value": "s1"}, {"key": "B", "value": "s2"}]}});
        apply(Rpc::CreateContainer, Dir::Request, &mut v, true);
        assert_eq!(v, json!({"config": {"envs": [{"key": "A", "value": REDACTED}, {"key": "B", "value": REDACTED}]}}));
        // Rules are per direction: a response with the same shape is not touched.
        let mut v = json!({"auth": "x"});
        apply(Rpc::PullImage, Dir::Response, &mut v, true);
        assert_eq!(v, json!({"auth": "x"}));
    }

    #[test]
    fn maps_bytes_and_urls() {
        let mut v = json!({"info": {"info": "{\"env\":[\"A=secret\"]}"}});
        apply(Rpc::ContainerStatus, Dir::Response, &mut v, true);
        assert_eq!(v, json!({"info": {"info": "<redacted: 20 bytes>"}}));
        let mut v = json!({"stdout": [104, 105], "stderr": [], "exit_code": 0});
        apply(Rpc::ExecSync, Dir::Response, &mut v.clone(), false);
        apply(Rpc::ExecSync, Dir::Response, &mut v, true);
        assert_eq!(v, json!({"stdout": "<2 bytes>", "stderr": "<0 bytes>", "exit_code": 0}));
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
            "example.com/config": "{\"kind\": \"of\"}",
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
        let mut v = json!({"items": [{"id": "a", "annotations": annotations.clone()}, {"id": "b", "annotations": {}}]});
        apply(Rpc::ListPodSandbox, Dir::Response, &mut v, true);
        assert_eq!(v["items"][0]["annotations"], want);
        assert_eq!(v["items"][1]["annotations"], json!({}));
        let mut v = json!({"stats": {"attributes": {"id": "a", "annotations": annotations.clone()}}});
        apply(Rpc::PodSandboxStats, Dir::Response, &mut v, true);
        assert_eq!(v["stats"]["attributes"]["annotations"], want);
        let mut v = json!({"stats": [{"attributes": {"id": "a", "annotations": annotations.clone()}}]});
        apply(Rpc::ListPodSandboxStats, Dir::Response, &mut v, true);
        assert_eq!(v["stats"][0]["attributes"]["annotations"], want);
    }

    /// The JSON paths above are k8s-cri's serde names: a typed decode of a real message must put
    /// the annotations where the rules look for them.
    #[test]
    fn manifest_rules_match_the_decoded_messages() {
        use k8s_cri::v1 as c;
        let applied = r#"{"apiVersion":"v1","kind":"Pod","spec":{"env":"S3cret"}}"#;
        let ann: std::collections::HashMap<String, String> = [("kubectl.kubernetes.io/last-applied-configuration".to_string(), applied.to_string())].into();
        let config = c::PodSandboxConfig { annotations: ann.clone(), ..Default::default() };
        let attrs = c::PodSandboxAttributes { id: "a".into(), annotations: ann.clone(), ..Default::default() };
        let stats = c::PodSandboxStats { attributes: Some(attrs), ..Default::default() };
        let msgs: Vec<(Rpc, Dir, Vec<u8>)> = vec![
            (Rpc::RunPodSandbox, Dir::Request, prost::Message::encode_to_vec(&c::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() })),
            (Rpc::CreateContainer, Dir::Request, prost::Message::encode_to_vec(&c::CreateContainerRequest { sandbox_config: Some(config.clone()), ..Default::default() })),
            (Rpc::PullImage, Dir::Request, prost::Message::encode_to_vec(&c::PullImageRequest { sandbox_config: Some(config), ..Default::default() })),
            (
                Rpc::PodSandboxStatus,
                Dir::Response,
                prost::Message::encode_to_vec(&c::PodSandboxStatusResponse {
                    status: Some(c::PodSandboxStatus { annotations: ann.clone(), ..Default::default() }),
                    ..Default::default()
                }),
            ),
            (
                Rpc::ListPodSandbox,
                Dir::Response,
                prost::Message::encode_to_vec(&c::ListPodSandboxResponse { items: vec![c::PodSandbox { annotations: ann, ..Default::default() }] }),
            ),
            (Rpc::PodSandboxStats, Dir::Response, prost::Message::encode_to_vec(&c::PodSandboxStatsResponse { stats: Some(stats.clone()) })),
            (Rpc::ListPodSandboxStats, Dir::Response, prost::Message::encode_to_vec(&c::ListPodSandboxStatsResponse { stats: vec![stats] })),
        ];
        for (rpc, dir, msg) in msgs {
            let shown = super::super::decode::decode(Some(rpc), dir, &msg, true).to_string();
            assert!(!shown.contains("S3cret") && shown.contains("<redacted: "), "{rpc:?}: {shown}");
            let raw = super::super::decode::decode(Some(rpc), dir, &msg, false).to_string();
            assert!(raw.contains("S3cret"), "{rpc:?} unredacted: {raw}");
        }
    }

    #[test]
    fn log_lines_are_cut_on_a_char_boundary() {
        let msg = prost::Message::encode_to_vec(&k8s_cri::v1::VersionRequest { version: "ééééé".into() });
        let s = for_log(Some(Rpc::Version), Dir::Request, &msg, 15);
        assert!(s.ends_with('…'), "{s}");
        assert!(s.len() <= 15 + '…'.len_utf8());
    }
}
