//! `crisp replay` (issue #46, "Record and replay"): plays the kubelet side of a tap recording
//! (`crisp tap --full -o FILE`) against a CRI runtime — a containerd, or crisp in front of one —
//! and says where the answers now differ from the recorded ones.
//!
//! ```text
//!  recording ─▶ plan (this file): the calls of one pod or of the file, in start order, each
//!               with its recorded answer; polling calls only with `--all`
//!          ─▶ player.rs: each call at its recorded offset (÷ speed), concurrent calls stay
//!               concurrent; a call that names an id waits for the replayed call that made it
//!               ─▶ prepare.rs: the recorded request, redaction placeholders made sendable,
//!                  ids rewritten (idmap.rs), re-encoded with the CRI types (`decode::encode_json`,
//!                  as `crisp pcap` does)
//!               ─▶ runtime.rs: one unary call through tonic on the runtime's socket
//!          ─▶ report.rs: status, message class, duration and order, recorded against now;
//!               the ids rewritten; the fields that were redacted; what cleanup removed
//! ```
//!
//! `--as-runtime` plays the other side: `script.rs` matches each call a peer (kubelet, crictl,
//! the emulator) makes to a recorded call and gives its recorded answer, without I/O;
//! `serve.rs` is its gRPC server on a unix socket; `served.rs` its report.
//!
//! A replay creates real sandboxes and containers: the player stops and removes every sandbox
//! it made and the recording did not remove (unless `--keep`), at the end or on Ctrl-C. A
//! replayed pod gets a new uid (its names on the runtime are new), and its `log_directory` is
//! cleared (the runtime writes no container logs, so the recorded pod's log files are never
//! touched).

mod idmap;
mod player;
mod prepare;
mod report;
mod runtime;
mod script;
mod serve;
mod served;

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead};
use std::time::Duration;

use serde_json::Value;

use crate::cli::timeline;
use crate::cri::{Route, Rpc, RpcKind};

pub use player::play;
pub use report::Report;
pub use runtime::Runtime;
pub use script::{Script, ServedReport};
pub use serve::serve_script;

/// When calls are sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// At the recorded offsets divided by this factor (1.0: as recorded).
    Recorded(f64),
    /// Each call once every call that had answered when it started in the recording has
    /// answered now.
    AsFastAsPossible,
}

/// How to replay: the player's pace and bounds, which the report says too.
#[derive(Debug, Clone)]
pub struct Options {
    pub pace: Pace,
    /// Longest a call may take (its deadline on the runtime too).
    pub timeout: Duration,
    /// Leave what the replay created.
    pub keep: bool,
    /// A duration differs from the recorded one by more than this.
    pub tolerance: Duration,
}

/// One recorded call the replay may send.
#[derive(Debug, Clone, Default)]
pub struct Step {
    /// Position in the plan (start order).
    pub(crate) index: usize,
    pub(crate) call_id: u64,
    pub(crate) method: String,
    /// The gRPC path to call (the recorded one: v1 or v1alpha2).
    pub(crate) path: String,
    pub(crate) rpc: Option<Rpc>,
    pub(crate) polling: bool,
    /// What the call acts on: `pod`, a container's name, an image.
    pub(crate) target: String,
    /// Start since the first call of the plan.
    pub(crate) offset: Duration,
    pub(crate) recorded: Answer,
    /// The request as the tap decoded (and redacted) it; `None` when not recorded.
    pub(crate) request: Option<Value>,
    pub(crate) request_bytes: u64,
    /// The recording should have the request and does not: the tap never saw it (crisp
    /// refused the call before forwarding it), or the recording was made without `--full`.
    pub(crate) request_missing: bool,
    /// The request was not recorded and is the one of this later call: kubelet's retry of it.
    pub(crate) borrowed: Option<usize>,
    pub(crate) response: Option<Value>,
    pub(crate) response_bytes: u64,
    /// A streamed response's messages, as the call's line counts them.
    pub(crate) messages: Option<u64>,
    /// A streamed response's messages as their own lines recorded them, in stream order (the
    /// tap may have dropped some: `messages` counts them all).
    pub(crate) stream: Vec<StreamMessage>,
    /// A stream still open when the recording ended: its messages have no call line, so it has
    /// no status and its duration is its last message's offset.
    pub(crate) open_at_end: bool,
    /// The ids the tap named on the call's line.
    pub(crate) pod_sandbox_id: String,
    pub(crate) container_id: String,
}

/// One message of a streamed response, as its line (`"event": "message"`) recorded it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamMessage {
    /// Its place in the stream (0: the first).
    pub(crate) index: u64,
    /// When it came, since the call began.
    pub(crate) offset: Duration,
    /// Its size on the wire.
    pub(crate) bytes: u64,
    /// The tap's decoded view of it (`--full`; maybe cut: `_truncated`); `None`: not recorded.
    pub(crate) response: Option<Value>,
}

impl StreamMessage {
    /// A message line of a recording: its call's id, and the message.
    fn of_line(v: &mut Value) -> Option<(u64, StreamMessage)> {
        if v.get("event").and_then(Value::as_str) != Some("message") {
            return None;
        }
        let call_id = v.get("call_id").and_then(Value::as_u64)?;
        let offset = v
            .get("since_start_ms")
            .and_then(Value::as_f64)
            .filter(|m| m.is_finite() && *m >= 0.0)
            .map_or(Duration::ZERO, |m| {
                Duration::from_secs_f64(m.min(1e12) / 1e3)
            });
        let response = match v.get_mut("response").map(Value::take) {
            Some(o @ Value::Object(_)) => Some(o),
            _ => None,
        };
        let message = StreamMessage {
            index: v.get("stream_message").and_then(Value::as_u64).unwrap_or(0),
            offset,
            bytes: v.get("bytes").and_then(Value::as_u64).unwrap_or(0),
            response,
        };
        Some((call_id, message))
    }
}

/// How a call was answered: recorded, or now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    /// gRPC status; `None`: no answer (kubelet gave up, or the replay's deadline passed).
    pub(crate) code: Option<i32>,
    pub(crate) message: String,
    pub(crate) duration: Duration,
    /// The part of `duration` crisp held the call (recorded through crisp only).
    pub(crate) held: Duration,
}

impl Step {
    /// The end of the recorded call, since the plan's first call.
    pub(crate) fn recorded_end(&self) -> Duration {
        self.offset + self.recorded.duration
    }

    /// Whether the call's answer is a stream: a server-streaming method, or one crisp does not
    /// know whose messages the tap recorded one by one.
    pub(crate) fn streamed(&self) -> bool {
        match self.rpc {
            Some(rpc) => rpc.kind() == RpcKind::Streaming,
            None => self.messages.is_some() || !self.stream.is_empty(),
        }
    }

    /// A streamed response's messages as recorded: as its call's line counts them, or its
    /// message lines.
    pub(crate) fn recorded_messages(&self) -> u64 {
        self.messages.unwrap_or(0).max(self.stream.len() as u64)
    }

    /// The id the recorded call made: a RunPodSandbox's sandbox, a CreateContainer's container.
    pub(crate) fn recorded_product(&self) -> Option<String> {
        let (key, line) = match self.rpc? {
            Rpc::RunPodSandbox => ("pod_sandbox_id", &self.pod_sandbox_id),
            Rpc::CreateContainer => ("container_id", &self.container_id),
            _ => return None,
        };
        if self.recorded.code != Some(0) {
            return None;
        }
        let id = self
            .response
            .as_ref()
            .and_then(|r| r.get(key))
            .and_then(Value::as_str)
            .unwrap_or(line);
        (!id.is_empty()).then(|| id.to_string())
    }
}

/// The calls to replay.
#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// What was chosen: `namespace/name`, or every call of the file.
    pub scope: String,
    /// Polling calls left out (no `--all`).
    pub polling_left_out: usize,
    /// Lines that are not JSON (a recording cut short).
    pub malformed: usize,
    /// crisp's own answers from the runtime at the recording's start (lines marked
    /// `"snapshot": true`: Version, RuntimeConfig, Status, ImageFsInfo, asked by crisp, not by
    /// kubelet). Never replayed; `--as-runtime` answers pollers with them before any recorded
    /// answer of their method, so a peer's handshake is answered in a recording begun after
    /// kubelet's.
    pub snapshot: Vec<Step>,
}

impl Plan {
    /// How many of the calls make sandboxes: what the replay will create.
    pub fn sandboxes(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| s.rpc == Some(Rpc::RunPodSandbox))
            .count()
    }

    /// How many calls are not polling calls.
    pub fn mutating(&self) -> usize {
        self.steps.iter().filter(|s| !s.polling).count()
    }

    /// How many calls have no recorded request (a recording without `--full`).
    pub fn without_request(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| s.request.is_none() && (s.request_missing || s.request_bytes > 0))
            .count()
    }

    /// The recorded span, first start to last end.
    pub fn span(&self) -> Duration {
        self.steps
            .iter()
            .map(Step::recorded_end)
            .max()
            .unwrap_or_default()
    }
}

/// Why a recording cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("reading the recording: {0}")]
    Read(#[from] io::Error),
    #[error("{0}")]
    Pod(String),
    #[error("no call in the recording (record with `crisp tap --full -o FILE`)")]
    Empty,
}

/// Reads a recording (JSON lines of `crisp tap --json`/`-o`) and chooses the calls to replay:
/// those of `pod` (`namespace/name`, or a unique `name`; chosen as `crisp timeline --pod` does,
/// ImageStatus calls included), or every call; polling calls only if `all`.
pub fn plan(input: impl BufRead, pod: Option<&str>, all: bool) -> Result<Plan, PlanError> {
    let mut lines: Vec<(timeline::Call, Value)> = Vec::new();
    let mut streams: HashMap<u64, Vec<StreamMessage>> = HashMap::new();
    // The first message line of each stream: what a stream with no call line is known by.
    let mut heads: HashMap<u64, Value> = HashMap::new();
    let mut malformed = 0;
    let mut snapshot = Vec::new();
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let Ok(mut v) = serde_json::from_str::<Value>(&line) else {
            malformed += 1;
            continue;
        };
        if v.get("snapshot").and_then(Value::as_bool) == Some(true) {
            snapshot.extend(snapshot_step(v));
            continue;
        }
        if let Some((call_id, message)) = StreamMessage::of_line(&mut v) {
            streams.entry(call_id).or_default().push(message);
            heads.entry(call_id).or_insert(v);
            continue;
        }
        if let Some(mut c) = timeline::call_of(&v) {
            // The line's own number names the call (older recordings have no call ids).
            c.call_id = lines.len() as u64;
            lines.push((c, v));
        }
    }
    // Streams still open when the recording ended have messages and no call line.
    let closed: HashSet<u64> = lines
        .iter()
        .filter_map(|(_, v)| v.get("call_id").and_then(Value::as_u64))
        .collect();
    let mut open: Vec<(u64, Value)> = heads
        .into_iter()
        .filter(|(id, _)| !closed.contains(id))
        .collect();
    open.sort_by_key(|(id, _)| *id);
    for (id, head) in open {
        let line = open_stream_line(&head, &streams[&id]);
        if let Some(mut c) = line.as_ref().and_then(timeline::call_of) {
            c.call_id = lines.len() as u64;
            lines.extend(line.map(|v| (c, v)));
        }
    }
    let (chosen, scope): (Option<HashSet<u64>>, String) = match pod {
        Some(want) => {
            let pods = timeline::group(lines.iter().map(|(c, _)| c.clone()).collect(), true);
            let p = timeline::select(&pods, want).map_err(PlanError::Pod)?;
            (Some(p.calls.iter().map(|c| c.call_id).collect()), p.id())
        }
        None => (None, "every call".to_string()),
    };
    let mut steps = Vec::new();
    let mut polling_left_out = 0;
    for (c, v) in lines {
        if chosen.as_ref().is_some_and(|set| !set.contains(&c.call_id)) {
            continue;
        }
        if c.kind == "polling" && !all {
            polling_left_out += 1;
            continue;
        }
        let mut s = step(&c, v);
        if s.call_id != 0 {
            s.stream = streams.remove(&s.call_id).unwrap_or_default();
            s.stream.sort_by_key(|m| m.index);
        }
        steps.push(s);
    }
    if steps.is_empty() {
        return Err(PlanError::Empty);
    }
    steps.sort_by_key(|s| s.offset);
    let t0 = steps[0].offset;
    for (i, s) in steps.iter_mut().enumerate() {
        s.index = i;
        s.offset -= t0;
    }
    borrow_retries(&mut steps);
    Ok(Plan {
        steps,
        scope,
        polling_left_out,
        malformed,
        snapshot,
    })
}

/// Fills the requests the recording lacks from kubelet's retries. A call crisp refused never
/// reached the tap's request view (the engine answered it before forwarding): the recording has
/// its status but not its request. kubelet sends the same request again (a CreateContainer
/// refused is retried with the same config and attempt), so the next call of the same method on
/// the same sandbox and target stands for it, and the report says so.
fn borrow_retries(steps: &mut [Step]) {
    let full = steps.iter().any(|s| s.request.is_some());
    for i in 0..steps.len() {
        let s = &steps[i];
        // Without --full an answered call with 0 request bytes had an empty request.
        let never_seen = s.recorded.code != Some(0) && s.response_bytes == 0;
        if s.request.is_some() || !(full || never_seen || s.request_bytes > 0) {
            continue;
        }
        let retry = steps[i + 1..].iter().find(|r| {
            r.request.is_some()
                && r.method == s.method
                && r.target == s.target
                && !r.pod_sandbox_id.is_empty()
                && r.pod_sandbox_id == s.pod_sandbox_id
        });
        let (request, borrowed) = match retry {
            Some(r) => (r.request.clone(), Some(r.index)),
            None => (None, None),
        };
        let s = &mut steps[i];
        s.request_missing = true;
        s.request = request;
        s.borrowed = borrowed;
    }
}

/// A snapshot line (crisp's own call at the recording's start) as a polling step before every
/// recorded call (offset zero), or `None` if it is not a call line.
fn snapshot_step(mut v: Value) -> Option<Step> {
    if let Some(m) = v.as_object_mut() {
        m.remove("snapshot");
    }
    let c = timeline::call_of(&v)?;
    let mut s = step(&c, v);
    s.offset = Duration::ZERO;
    s.polling = true;
    Some(s)
}

/// The call line a stream still open when the recording ended would have had: from its first
/// message line (the call's start is that message's time less its offset) and its messages,
/// with no status, marked `open_at_end`.
fn open_stream_line(head: &Value, messages: &[StreamMessage]) -> Option<Value> {
    let time = humantime::parse_rfc3339(head.get("time")?.as_str()?).ok()?;
    let since = head
        .get("since_start_ms")
        .and_then(Value::as_f64)
        .filter(|m| m.is_finite() && *m >= 0.0)
        .map_or(Duration::ZERO, |m| {
            Duration::from_secs_f64(m.min(1e12) / 1e3)
        });
    let start = time.checked_sub(since)?;
    let last = messages.iter().map(|m| m.offset).max().unwrap_or_default();
    let text = |k: &str| head.get(k).cloned().unwrap_or(Value::Null);
    Some(serde_json::json!({
        "call_id": text("call_id"),
        "time": humantime::format_rfc3339_micros(start).to_string(),
        "cri_version": text("cri_version"),
        "method": text("method"),
        "path": text("path"),
        "kind": text("kind"),
        "duration_ms": last.as_secs_f64() * 1e3,
        "response_bytes": messages.iter().map(|m| m.bytes).sum::<u64>(),
        "code_name": "",
        "messages": messages.len(),
        "open_at_end": true,
    }))
}

/// One call line as a step; `offset` is its start since the Unix epoch until [`plan`] makes it
/// relative.
fn step(c: &timeline::Call, mut v: Value) -> Step {
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let path = match text("path") {
        p if p.starts_with('/') => p,
        _ => format!("/runtime.v1.RuntimeService/{}", c.method),
    };
    let rpc = Route::from_path(&path).rpc;
    let ms = |k: &str| {
        v.get(k)
            .and_then(Value::as_f64)
            .filter(|m| m.is_finite() && *m >= 0.0)
            .map_or(Duration::ZERO, |m| {
                Duration::from_secs_f64(m.min(1e12) / 1e3)
            })
    };
    let recorded = Answer {
        code: v.get("code").and_then(Value::as_i64).map(|c| c as i32),
        message: text("message"),
        duration: ms("duration_ms"),
        held: ms("held_ms"),
    };
    let object = |v: &mut Value, k: &str| match v.get_mut(k).map(Value::take) {
        Some(o @ Value::Object(_)) => Some(o),
        _ => None,
    };
    let open_at_end = v.get("open_at_end").and_then(Value::as_bool) == Some(true);
    let mut request = object(&mut v, "request");
    // An open stream's line is not the tap's: its request is not recorded. GetContainerEvents'
    // request has no fields, so it is known anyway.
    let request_missing = open_at_end && rpc != Some(Rpc::GetContainerEvents);
    if open_at_end && !request_missing {
        request = Some(Value::Object(Default::default()));
    }
    Step {
        index: 0,
        call_id: v.get("call_id").and_then(Value::as_u64).unwrap_or(0),
        method: c.method.clone(),
        polling: rpc.map_or(c.kind == "polling", |r| r.kind() == RpcKind::Polling),
        target: c.target(),
        offset: Duration::from_micros(c.start_us.max(0) as u64),
        recorded,
        request_bytes: v.get("request_bytes").and_then(Value::as_u64).unwrap_or(0),
        pod_sandbox_id: c.pod_sandbox_id.clone(),
        container_id: c.container_id.clone(),
        response_bytes: v.get("response_bytes").and_then(Value::as_u64).unwrap_or(0),
        messages: v.get("messages").and_then(Value::as_u64),
        stream: Vec::new(),
        open_at_end,
        request,
        response: object(&mut v, "response"),
        request_missing,
        borrowed: None,
        path,
        rpc,
    }
}

#[cfg(test)]
mod tests;
