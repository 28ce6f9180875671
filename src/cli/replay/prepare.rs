//! A recorded request made sendable: what the tap redacted stays redacted (a replay never
//! invents a secret), placeholders that are not the field's type are made so, ids are rewritten
//! ([`super::idmap`]), and the JSON is re-encoded with the CRI types as `crisp pcap` does
//! ([`crate::tap::decode::encode_json`]).

use std::fmt;

use serde_json::Value;

use super::idmap::{IdMap, Rewritten};
use super::Step;
use crate::cri::Rpc;
use crate::tap::decode::encode_json;
use crate::tap::redact::{Dir, REDACTED};

/// Deepest nesting walked.
const MAX_DEPTH: usize = 64;

/// A request ready to send.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) bytes: Vec<u8>,
    /// The request as sent (JSON, placeholders and all): what the player reads names from.
    pub(crate) json: Value,
    pub(crate) redacted: Vec<Redacted>,
    pub(crate) rewritten: Rewritten,
}

/// A field the recording has only redacted, and what the replay sent instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Redacted {
    /// `command`/`args`: sent empty, so the image's own entrypoint and command run.
    Command,
    /// Env values: sent as the text `<redacted>`.
    EnvValues(usize),
    /// Annotation values: sent as their placeholder `<redacted: N bytes>`.
    AnnotationValues(usize),
    /// PullImage's `auth`: sent without credentials.
    Auth,
    /// Fields the tap cut from a large message, or did not know: sent without them.
    Cut,
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redacted::Command => f.write_str("command/args (sent empty: the image's own ran)"),
            Redacted::EnvValues(n) => write!(f, "{n} env values (sent as \"{REDACTED}\")"),
            Redacted::AnnotationValues(n) => {
                write!(f, "{n} annotation values (sent as their placeholder)")
            }
            Redacted::Auth => f.write_str("registry auth (pulled without credentials)"),
            Redacted::Cut => f.write_str("fields the tap cut or did not know (sent without)"),
        }
    }
}

/// Why a call was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotSent {
    /// The recording has no request (recorded without `--full`).
    NotRecorded,
    /// Its request names ids no replayed call made.
    Unmapped(Vec<String>),
    /// A call that opens a streaming session (Exec, Attach, PortForward): its session is not
    /// on the CRI socket.
    Session,
    /// ExecSync's command was redacted: there is nothing to run.
    CommandRedacted,
    /// The recorded JSON is not the request's type, or the method has no CRI type.
    NotEncodable,
    /// Ctrl-C came first.
    Interrupted,
}

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotSent::NotRecorded => {
                f.write_str("request not recorded (record with `crisp tap --full`)")
            }
            NotSent::Unmapped(ids) => {
                let short: Vec<&str> = ids.iter().map(|i| short_id(i)).collect();
                write!(
                    f,
                    "names ids no replayed call made ({}): made before the recording, or by a call that failed now",
                    short.join(", ")
                )
            }
            NotSent::Session => f.write_str("streaming session: not replayed"),
            NotSent::CommandRedacted => f.write_str("the command was redacted: nothing to run"),
            NotSent::NotEncodable => {
                f.write_str("recorded request is not re-encodable (no CRI type, or cut)")
            }
            NotSent::Interrupted => f.write_str("interrupted before it was sent"),
        }
    }
}

/// A runtime's id (64 hex digits) by its first 12, as crictl shows it; anything else (a pod
/// uid) whole.
pub(crate) fn short_id(id: &str) -> &str {
    if id.len() >= 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        &id[..12]
    } else {
        id
    }
}

/// Makes `step`'s recorded request sendable against `ids`. A RunPodSandbox's pod gets a new uid
/// (put in `ids`, so the pod's later calls carry it too) and no log directory.
pub(crate) fn prepare(step: &Step, ids: &mut IdMap, fresh_uid: &str) -> Result<Prepared, NotSent> {
    let Some(rpc) = step.rpc else {
        return Err(NotSent::NotEncodable);
    };
    if matches!(rpc, Rpc::Exec | Rpc::Attach | Rpc::PortForward) {
        return Err(NotSent::Session);
    }
    let mut json = match &step.request {
        Some(v) => v.clone(),
        // An empty request is recorded by its size alone.
        None if step.request_bytes == 0 && !step.request_missing => {
            Value::Object(Default::default())
        }
        None => return Err(NotSent::NotRecorded),
    };
    let mut redacted = Vec::new();
    unredactable(&mut json, rpc, &mut redacted, 0)?;
    if rpc == Rpc::RunPodSandbox {
        if let Some(uid) = json
            .pointer("/config/metadata/uid")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty() && ids.get(u).is_none())
        {
            let uid = uid.to_string();
            ids.insert(&uid, &format!("{uid}-{fresh_uid}"));
        }
    }
    for pointer in ["/config/log_directory", "/sandbox_config/log_directory"] {
        if let Some(dir) = json.pointer_mut(pointer) {
            *dir = Value::String(String::new());
        }
    }
    let rewritten = ids.rewrite(&mut json);
    if !rewritten.unmapped.is_empty() {
        return Err(NotSent::Unmapped(rewritten.unmapped));
    }
    redacted.sort();
    redacted.dedup();
    let bytes = encode_json(rpc, Dir::Request, &json).ok_or(NotSent::NotEncodable)?;
    Ok(Prepared {
        bytes,
        json,
        redacted,
        rewritten,
    })
}

/// Turns what the tap redacted into values of the field's type (never the secret: it was never
/// recorded), noting each; `Err` when the call cannot mean anything without it.
fn unredactable(
    v: &mut Value,
    rpc: Rpc,
    out: &mut Vec<Redacted>,
    depth: usize,
) -> Result<(), NotSent> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    match v {
        Value::Object(m) => {
            for key in ["_unknown_fields", "_truncated", "_note"] {
                if m.remove(key).is_some() {
                    out.push(Redacted::Cut);
                }
            }
            for (k, x) in m.iter_mut() {
                match (k.as_str(), &mut *x) {
                    ("command" | "args" | "cmd", Value::String(s))
                        if s.starts_with("<redacted") =>
                    {
                        if matches!(rpc, Rpc::ExecSync) {
                            return Err(NotSent::CommandRedacted);
                        }
                        *x = Value::Array(Vec::new());
                        out.push(Redacted::Command);
                    }
                    ("auth", Value::String(_)) if rpc == Rpc::PullImage => {
                        *x = Value::Null;
                        out.push(Redacted::Auth);
                    }
                    ("annotations", Value::Object(a)) => {
                        let n = a
                            .values()
                            .filter(|s| s.as_str().is_some_and(|s| s.starts_with("<redacted")))
                            .count();
                        if n > 0 {
                            out.push(Redacted::AnnotationValues(n));
                        }
                    }
                    ("envs", Value::Array(envs)) => {
                        let n = envs
                            .iter()
                            .filter(|e| e.get("value").and_then(Value::as_str) == Some(REDACTED))
                            .count();
                        if n > 0 {
                            out.push(Redacted::EnvValues(n));
                        }
                    }
                    _ => unredactable(x, rpc, out, depth + 1)?,
                }
            }
        }
        Value::Array(items) => {
            for x in items {
                unredactable(x, rpc, out, depth + 1)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn step(rpc: Rpc, request: Value) -> Step {
        Step {
            method: rpc.name().to_string(),
            path: format!("/runtime.v1.RuntimeService/{}", rpc.name()),
            rpc: Some(rpc),
            request: Some(request),
            request_bytes: 10,
            ..Step::default()
        }
    }

    /// A CreateContainer as `crisp tap --full` records it: command, env values and annotations
    /// redacted. It is sent with an empty command line and the placeholders, each noted.
    #[test]
    fn redacted_container_configs_are_sent_without_their_secrets() {
        let mut ids = IdMap::default();
        ids.insert("sb-old", "sb-new");
        let s = step(
            Rpc::CreateContainer,
            json!({
                "pod_sandbox_id": "sb-old",
                "config": {
                    "metadata": {"name": "app", "attempt": 0},
                    "image": {"image": "busybox", "annotations": {}},
                    "command": "<redacted: 3 items, 42 bytes>",
                    "args": [],
                    "envs": [{"key": "TOKEN", "value": "<redacted>"}],
                    "annotations": {"io.kubernetes.container.hash": "abc",
                                    "secret": "<redacted: 12 bytes>"},
                },
                "sandbox_config": {"log_directory": "/var/log/pods/x", "metadata": {"uid": "u"}},
            }),
        );
        let p = prepare(&s, &mut ids, "r1").expect("sendable");
        assert_eq!(
            p.redacted,
            vec![
                Redacted::Command,
                Redacted::EnvValues(1),
                Redacted::AnnotationValues(1)
            ]
        );
        assert_eq!(p.json["pod_sandbox_id"], "sb-new");
        assert_eq!(p.json["config"]["command"], json!([]));
        assert_eq!(p.json["sandbox_config"]["log_directory"], "");
        let back: crate::cri::api::CreateContainerRequest =
            prost::Message::decode(p.bytes.as_slice()).expect("protobuf");
        let config = back.config.expect("config");
        assert!(config.command.is_empty());
        assert_eq!(config.envs[0].value, REDACTED.as_bytes());
        assert_eq!(back.pod_sandbox_id, "sb-new");
    }

    /// A pod replayed gets a new uid and no log directory; its later calls carry the new uid.
    #[test]
    fn sandboxes_get_a_new_uid_and_no_log_directory() {
        let mut ids = IdMap::default();
        let s = step(
            Rpc::RunPodSandbox,
            json!({"config": {"metadata": {"name": "web", "namespace": "demo", "uid": "u1"},
                   "log_directory": "/var/log/pods/demo_web_u1",
                   "labels": {"io.kubernetes.pod.uid": "u1"}}}),
        );
        let p = prepare(&s, &mut ids, "r1").expect("sendable");
        assert_eq!(p.json["config"]["metadata"]["uid"], "u1-r1");
        assert_eq!(p.json["config"]["labels"]["io.kubernetes.pod.uid"], "u1-r1");
        assert_eq!(p.json["config"]["log_directory"], "");
        assert_eq!(ids.get("u1"), Some("u1-r1"));
    }

    /// Auth is never invented: a PullImage is sent without it. An ExecSync whose command is
    /// redacted, a call without a recorded request and a streaming call are not sent.
    #[test]
    fn what_cannot_be_replayed_says_why() {
        let mut ids = IdMap::default();
        let pull = step(
            Rpc::PullImage,
            json!({"image": {"image": "registry.example/app:1"}, "auth": "<redacted>"}),
        );
        let p = prepare(&pull, &mut ids, "r").expect("sendable");
        assert_eq!(p.redacted, vec![Redacted::Auth]);
        assert!(p.json["auth"].is_null());

        let exec = step(
            Rpc::ExecSync,
            json!({"container_id": "c", "cmd": "<redacted: 2 items, 9 bytes>"}),
        );
        assert_eq!(
            prepare(&exec, &mut ids, "r").unwrap_err(),
            NotSent::CommandRedacted
        );
        let mut bare = step(Rpc::StartContainer, json!({}));
        bare.request = None;
        assert_eq!(
            prepare(&bare, &mut ids, "r").unwrap_err(),
            NotSent::NotRecorded
        );
        bare.request_bytes = 0;
        assert!(prepare(&bare, &mut ids, "r").is_ok(), "an empty request");
        // Streamed calls are sent (issue #46); sessions are not.
        let events = step(Rpc::GetContainerEvents, json!({}));
        assert!(prepare(&events, &mut ids, "r").is_ok(), "a stream is sent");
        let mut list = step(Rpc::StreamContainers, json!({}));
        list.messages = Some(150);
        assert!(prepare(&list, &mut ids, "r").is_ok());
        let attach = step(Rpc::Attach, json!({"container_id": "c"}));
        assert_eq!(
            prepare(&attach, &mut ids, "r").unwrap_err(),
            NotSent::Session
        );
        let start = step(Rpc::StartContainer, json!({"container_id": "never-made"}));
        assert_eq!(
            prepare(&start, &mut ids, "r").unwrap_err(),
            NotSent::Unmapped(vec!["never-made".into()])
        );
    }
}
