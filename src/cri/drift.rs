//! The check that the views (`proto/crisp/cri/views.proto`) still say what the pinned CRI
//! `api.proto` says (proto/README.md): every field a view declares has, in each CRI message the
//! view stands for, the same name, number and type (an enum read as `int32`; a message field
//! checked the same way, recursively). Bumping the pinned api.proto to one that renumbers,
//! retypes or drops a field crisp reads fails [`views_match_the_pinned_api_proto`] with the
//! field named. A small parser of the proto3 subset both files use; test-only.

use std::collections::{BTreeMap, BTreeSet};

const API_PROTO: &str = include_str!("../../proto/k8s/cri-api/v1/api.proto");
const VIEWS_PROTO: &str = include_str!("../../proto/crisp/cri/views.proto");

#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    name: String,
    /// `string`, `int32`, a message or enum name, or `map<K,V>`.
    ty: String,
    number: u32,
    repeated: bool,
}

#[derive(Debug, Default)]
struct Proto {
    messages: BTreeMap<String, Vec<Field>>,
    enums: BTreeSet<String>,
    /// (message, field) marked `[debug_redact = true]`.
    debug_redact: Vec<(String, String, u32)>,
}

fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut cur = String::new();
        for ch in line.chars() {
            if ch.is_whitespace() || "{};=<>,[]()".contains(ch) {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                if !ch.is_whitespace() {
                    out.push(ch.to_string());
                }
            } else {
                cur.push(ch);
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }
    out
}

/// Index just past the `}` closing the block whose `{` is at `open`.
fn skip_block(t: &[String], open: usize) -> usize {
    let mut depth = 0;
    for (i, x) in t.iter().enumerate().skip(open) {
        match x.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    t.len()
}

fn parse(text: &str) -> Proto {
    let t = tokens(text);
    let mut p = Proto::default();
    // Open blocks: a message's name, or None for a oneof (whose fields are the message's).
    let mut stack: Vec<Option<String>> = Vec::new();
    let mut i = 0;
    while i < t.len() {
        match t[i].as_str() {
            "syntax" | "package" | "import" | "option" | "reserved" => {
                while i < t.len() && t[i] != ";" {
                    i += 1;
                }
                i += 1;
            }
            "service" => i = skip_block(&t, i + 2),
            "enum" => {
                p.enums.insert(t[i + 1].clone());
                i = skip_block(&t, i + 2);
            }
            "message" => {
                stack.push(Some(t[i + 1].clone()));
                p.messages.entry(t[i + 1].clone()).or_default();
                i += 3;
            }
            "oneof" => {
                stack.push(None);
                i += 3;
            }
            "}" => {
                stack.pop();
                i += 1;
            }
            ";" => i += 1,
            _ => {
                let msg = stack
                    .iter()
                    .rev()
                    .find_map(Clone::clone)
                    .unwrap_or_default();
                let mut j = i;
                let repeated = matches!(t[j].as_str(), "repeated");
                if matches!(t[j].as_str(), "repeated" | "optional") {
                    j += 1;
                }
                let ty = if t[j] == "map" {
                    // map < K , V >
                    let ty = format!("map<{},{}>", t[j + 2], t[j + 4]);
                    j += 6;
                    ty
                } else {
                    j += 1;
                    t[j - 1].clone()
                };
                let name = t[j].clone();
                let number = t[j + 2].parse().unwrap_or(0);
                j += 3;
                if t.get(j).is_some_and(|x| x == "[") {
                    if t.get(j + 1).is_some_and(|x| x == "debug_redact") {
                        p.debug_redact.push((msg.clone(), name.clone(), number));
                    }
                    while t[j] != "]" {
                        j += 1;
                    }
                    j += 1;
                }
                p.messages.entry(msg).or_default().push(Field {
                    name,
                    ty,
                    number,
                    repeated,
                });
                i = j;
            }
        }
    }
    p
}

/// The CRI messages each view stands for, when not the one of its own name. (view field, CRI
/// message) pairs in `only` are fields that exist in that message alone.
const STANDS_FOR: &[(&str, &[&str])] = &[
    (
        "PodSandboxIdRequest",
        &[
            "StopPodSandboxRequest",
            "RemovePodSandboxRequest",
            "PodSandboxStatusRequest",
            "PodSandboxStatsRequest",
            "PortForwardRequest",
            "UpdatePodSandboxResourcesRequest",
        ],
    ),
    (
        "ContainerIdRequest",
        &[
            "StartContainerRequest",
            "StopContainerRequest",
            "RemoveContainerRequest",
            "ContainerStatusRequest",
            "UpdateContainerResourcesRequest",
            "ReopenContainerLogRequest",
            "ExecSyncRequest",
            "ExecRequest",
            "AttachRequest",
            "ContainerStatsRequest",
            "CheckpointContainerRequest",
        ],
    ),
    // crisp's own ListContainers reads a StreamContainers answer with the same views.
    (
        "ListContainersRequest",
        &["ListContainersRequest", "StreamContainersRequest"],
    ),
    (
        "ListContainersResponse",
        &["ListContainersResponse", "StreamContainersResponse"],
    ),
];
const ONLY: &[(&str, &str, &str)] = &[("ContainerIdRequest", "timeout", "StopContainerRequest")];

/// Every difference between the views and `api`, as lines naming the field; and the views
/// checked.
fn differences(views: &Proto, api: &Proto) -> (Vec<String>, BTreeSet<String>) {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for view in views.messages.keys() {
        let targets: Vec<&str> = match STANDS_FOR.iter().find(|(v, _)| v == view) {
            Some((_, t)) => t.to_vec(),
            None if api.messages.contains_key(view) => vec![view.as_str()],
            // Checked where a view that has it as a field is (PodIp is api.proto's PodIP).
            None => continue,
        };
        for target in targets {
            compare(views, api, view, target, &mut seen, &mut out);
        }
    }
    (out, seen)
}

fn compare(
    views: &Proto,
    api: &Proto,
    view: &str,
    target: &str,
    seen: &mut BTreeSet<String>,
    out: &mut Vec<String>,
) {
    seen.insert(view.to_string());
    let Some(theirs) = api.messages.get(target) else {
        out.push(format!(
            "{target} (for view {view}): no such message in api.proto"
        ));
        return;
    };
    for f in &views.messages[view] {
        if ONLY
            .iter()
            .any(|(v, n, m)| *v == view && *n == f.name && *m != target)
        {
            continue;
        }
        let here = format!("{target}.{} (view {view})", f.name);
        let Some(a) = theirs.iter().find(|a| a.name == f.name) else {
            out.push(format!("{here}: not in api.proto"));
            continue;
        };
        if a.number != f.number {
            out.push(format!(
                "{here}: number {} in api.proto, {} in the view",
                a.number, f.number
            ));
        }
        if a.repeated != f.repeated {
            out.push(format!("{here}: repeated differs"));
        }
        if views.messages.contains_key(&f.ty) {
            if api.messages.contains_key(&a.ty) {
                compare(views, api, &f.ty, &a.ty, seen, out);
            } else {
                out.push(format!(
                    "{here}: a message in the view, {} in api.proto",
                    a.ty
                ));
            }
        } else {
            let same = a.ty == f.ty || (f.ty == "int32" && api.enums.contains(&a.ty));
            if !same {
                out.push(format!(
                    "{here}: type {} in api.proto, {} in the view",
                    a.ty, f.ty
                ));
            }
        }
    }
}

#[test]
fn views_match_the_pinned_api_proto() {
    let views = parse(VIEWS_PROTO);
    let api = parse(API_PROTO);
    assert!(api.messages.len() > 150, "{} messages", api.messages.len());
    let (diffs, seen) = differences(&views, &api);
    assert!(
        diffs.is_empty(),
        "views.proto against api.proto:\n{}",
        diffs.join("\n")
    );
    let unchecked: Vec<_> = views
        .messages
        .keys()
        .filter(|v| !seen.contains(*v))
        .collect();
    assert!(unchecked.is_empty(), "views never compared: {unchecked:?}");
}

/// The check sees what a newer api.proto could change: a field renumbered, retyped, made
/// repeated, or gone, at the top or nested.
#[test]
fn a_changed_field_crisp_reads_is_caught() {
    let views = parse(VIEWS_PROTO);
    let change = |from: &str, to: &str, within: &str| {
        let start = [" {", "{"]
            .iter()
            .find_map(|b| API_PROTO.find(&format!("message {within}{b}")))
            .unwrap();
        let at = start + API_PROTO[start..].find(from).unwrap();
        let text = format!("{}{to}{}", &API_PROTO[..at], &API_PROTO[at + from.len()..]);
        differences(&views, &parse(&text)).0
    };
    let d = change(
        "uint32 attempt = 2;",
        "uint32 attempt = 7;",
        "ContainerMetadata",
    );
    assert!(
        d.iter()
            .any(|d| d.starts_with("ContainerMetadata.attempt") && d.contains("number 7")),
        "{d:?}"
    );
    let d = change(
        "string container_id = 1;",
        "bytes container_id = 1;",
        "StopContainerRequest",
    );
    assert!(d.iter().any(|d| d.contains("type bytes")), "{d:?}");
    let d = change(
        "int64 timeout = 2;",
        "int64 grace = 2;",
        "StopContainerRequest",
    );
    assert!(
        d.iter()
            .any(|d| d.contains("StopContainerRequest.timeout") && d.contains("not in")),
        "{d:?}"
    );
    let d = change("string ip = 1;", "repeated string ip = 1;", "PodIP");
    assert!(
        d.iter()
            .any(|d| d.starts_with("PodIP.ip") && d.contains("repeated")),
        "{d:?}"
    );
    let d = change(
        "ContainerState state = 6;",
        "string state = 6;",
        "Container",
    );
    assert!(d.iter().any(|d| d.starts_with("Container.state")), "{d:?}");
    let d = change(
        "repeated Container containers = 1;",
        "repeated Container containers = 2;",
        "StreamContainersResponse",
    );
    assert!(
        d.iter()
            .any(|d| d.starts_with("StreamContainersResponse.containers")),
        "{d:?}"
    );
}

/// The (message, field, number) the pinned api.proto marks `[debug_redact = true]`: the tap's
/// redaction must list them (`tap::redact`'s test; the tap imports the CRI, not the reverse).
pub(crate) fn debug_redact_fields() -> Vec<(String, String, u32)> {
    parse(API_PROTO).debug_redact
}

/// The pinned api.proto has what issue #45 needs: `KeyValue.value` as bytes, the six streamed
/// lists.
#[test]
fn the_pinned_api_proto_has_bytes_env_values_and_streamed_lists() {
    let api = parse(API_PROTO);
    let value = api.messages["KeyValue"]
        .iter()
        .find(|f| f.name == "value")
        .unwrap();
    assert_eq!((value.ty.as_str(), value.number), ("bytes", 2));
    for m in [
        "StreamPodSandboxesResponse",
        "StreamContainersResponse",
        "StreamContainerStatsResponse",
        "StreamPodSandboxStatsResponse",
        "StreamPodSandboxMetricsResponse",
        "StreamImagesResponse",
    ] {
        assert!(api.messages.contains_key(m), "{m}");
    }
}
