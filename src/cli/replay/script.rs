//! The runtime side of a recording, as a script (`crisp replay --as-runtime`): given a call a
//! peer (kubelet, crictl, the emulator) makes, which recorded call it is, and the recorded
//! answer to give. No I/O and no clock of its own: [`Script::answer`] takes the decoded request
//! and the time since the first call, and returns the reply and how long to wait before it
//! (`serve.rs` is the shell that reads and writes the calls).
//!
//! - **Matching.** A call matches a recorded call of the same method whose ids agree with it:
//!   `pod_sandbox_id` and `container_id` as sent (the recorded answers hand out the recorded ids,
//!   so a peer that learnt its ids from this script sends them back unchanged), the pod's
//!   namespace/name for a RunPodSandbox (not its uid: a peer makes a pod anew), the container's
//!   name for a CreateContainer, the image for an image call.
//! - **Mutating calls** are answered once each, in recorded order among the calls that agree: a
//!   refused CreateContainer and kubelet's retry of it get the refusal, then the success. A
//!   call beyond the recorded ones gets the last of them again, and the report says so.
//! - **Polling calls** (Version, Status, ImageFsInfo, List*, *Status, *Stats) repeat as a
//!   poller likes: each gets the latest recorded answer of its method (and ids) at the point
//!   reached — recorded before the first mutating call not yet answered after the furthest one
//!   answered; with a speed, also no later than the recorded time reached since then. Before any
//!   such answer, the first recorded one.
//! - **Calls not in the recording** are answered `Unimplemented`, with a message naming the
//!   method and ids, and listed in the report.
//! - **Streams** are answered with their recorded messages (each at its recorded offset ÷
//!   speed, at once without), then the recorded status; a message the recording lacks whole (no
//!   view, a cut view, no CRI types, a line the tap dropped) is counted, never invented.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::idmap::IdMap;
use super::prepare::short_id;
use super::{Plan, Step};
use crate::cri::{Route, Rpc, RpcKind};

/// gRPC codes the script answers with itself.
const UNIMPLEMENTED: i32 = 12;
const DEADLINE_EXCEEDED: i32 = 4;
/// Recorded calls that started this close together have no order a peer must keep.
const ORDER_SLACK: Duration = Duration::from_millis(20);

/// What a call names: the fields matching compares.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Identity {
    pub(crate) sandbox: Option<String>,
    pub(crate) container: Option<String>,
    /// A RunPodSandbox's `namespace/name`, a CreateContainer's container name, an image.
    pub(crate) name: Option<String>,
}

impl Identity {
    /// The identity of a request (decoded JSON) of `rpc`.
    pub(crate) fn of_request(rpc: Option<Rpc>, request: &Value) -> Identity {
        let text = |pointer: &str| {
            request
                .pointer(pointer)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let name = match rpc {
            Some(Rpc::RunPodSandbox) => {
                match (
                    text("/config/metadata/namespace"),
                    text("/config/metadata/name"),
                ) {
                    (Some(ns), Some(n)) => Some(format!("{ns}/{n}")),
                    (None, n) => n,
                    (Some(ns), None) => Some(format!("{ns}/")),
                }
            }
            Some(Rpc::CreateContainer) => text("/config/metadata/name"),
            Some(Rpc::PullImage | Rpc::ImageStatus | Rpc::RemoveImage) => text("/image/image"),
            _ => None,
        };
        // A filter's `id` is a sandbox's in the sandbox lists, a container's in the others.
        let sandbox_list = matches!(rpc, Some(Rpc::ListPodSandbox | Rpc::ListPodSandboxStats));
        let filter_id = text("/filter/id");
        Identity {
            sandbox: text("/pod_sandbox_id")
                .or_else(|| text("/filter/pod_sandbox_id"))
                .or_else(|| filter_id.clone().filter(|_| sandbox_list)),
            container: text("/container_id").or(filter_id.filter(|_| !sandbox_list)),
            name,
        }
    }

    /// The identity of a recorded call: of its request, or, when the recording lacks it, of the
    /// ids the tap put on its line (not the id the call made).
    fn of_step(step: &Step) -> Identity {
        if let Some(request) = &step.request {
            return Identity::of_request(step.rpc, request);
        }
        let id = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Identity {
            sandbox: id(&step.pod_sandbox_id).filter(|_| step.rpc != Some(Rpc::RunPodSandbox)),
            container: id(&step.container_id).filter(|_| step.rpc != Some(Rpc::CreateContainer)),
            name: None,
        }
    }

    /// Whether a call naming `self` may be the recorded call naming `recorded`: every field both
    /// name is the same.
    fn agrees(&self, recorded: &Identity) -> bool {
        let same = |a: &Option<String>, b: &Option<String>| match (a, b) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        same(&self.sandbox, &recorded.sandbox)
            && same(&self.container, &recorded.container)
            && same(&self.name, &recorded.name)
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(s) = &self.sandbox {
            parts.push(format!("sandbox {}", short_id(s)));
        }
        if let Some(c) = &self.container {
            parts.push(format!("container {}", short_id(c)));
        }
        if let Some(n) = &self.name {
            parts.push(format!("{n:?}"));
        }
        if parts.is_empty() {
            f.write_str("no ids")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// Why a recorded message of a stream is not sent: the recording does not have it whole, and
/// the script never invents one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Unsent {
    /// Its decoded view is not in the recording (recorded without `--full`).
    NotRecorded,
    /// The tap cut its view (`_truncated`: larger than the tap shows).
    Cut,
    /// A method crisp has no CRI types for: nothing to encode it with.
    NoTypes,
    /// The call's line counts it, and the tap dropped its line (a slow tap client).
    Dropped,
}

impl std::fmt::Display for Unsent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unsent::NotRecorded => "its view is not recorded (record with `crisp tap --full`)",
            Unsent::Cut => "its view was cut by the tap",
            Unsent::NoTypes => "a method without CRI types",
            Unsent::Dropped => "its line was dropped by the tap",
        })
    }
}

/// A message of a streamed answer: when to send it, and what.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReplyMessage {
    /// Its place in the recorded stream.
    pub(crate) index: u64,
    /// Send it this long after the call came (its recorded offset ÷ speed; at once without).
    pub(crate) at: Duration,
    /// The recorded message (decoded JSON, placeholders and all).
    pub(crate) response: Value,
}

/// What to answer a call with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    /// gRPC status code.
    pub(crate) code: i32,
    pub(crate) message: String,
    /// The response message (decoded JSON, redaction placeholders and all) on OK; `None`: an
    /// empty message.
    pub(crate) response: Option<Value>,
    /// Wait this long before answering (the recorded duration ÷ speed): for a stream, before
    /// its status, its messages going out on their own times.
    pub(crate) delay: Duration,
    /// The recorded call answered (its plan index).
    pub(crate) step: Option<usize>,
    /// A streamed answer: its recorded messages that can be sent, in order (the others are
    /// counted in the report); `None`: a unary answer.
    pub(crate) stream: Option<Vec<ReplyMessage>>,
    /// The recorded stream was still open when the recording ended: after its messages it stays
    /// open, with no status, until the peer goes.
    pub(crate) open: bool,
}

/// A call no recorded call matched.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Unmatched {
    pub(crate) method: String,
    pub(crate) identity: Identity,
}

/// The recorded runtime side of a recording, answering calls.
#[derive(Debug)]
pub struct Script {
    steps: Vec<Step>,
    identities: Vec<Identity>,
    /// Times each recorded call was answered.
    answered: Vec<u32>,
    /// Mutating recorded calls, in the order their first answer was given.
    order: Vec<usize>,
    /// The furthest mutating recorded call answered, and when (the script's time).
    reached: Option<(usize, Duration)>,
    /// When the first call came.
    first: Option<Duration>,
    /// Answers delayed by their recorded duration ÷ this, and the polling point follows the
    /// recorded time at this rate; `None`: answered at once.
    speed: Option<f64>,
    unmatched: BTreeMap<Unmatched, u32>,
    /// Mutating calls beyond the recorded ones, answered again: recorded index → extra times.
    again: BTreeMap<usize, u32>,
    /// Recorded pod uid → the peer's, learnt from matched RunPodSandbox calls: answers carry
    /// the peer's (labels, metadata), so a peer that made its pod anew finds its pod in them.
    uids: IdMap,
    uid_pairs: Vec<(String, String)>,
    /// Streamed recorded calls answered: what was sent of their messages.
    streams: BTreeMap<usize, StreamServed>,
    pub(crate) scope: String,
}

/// What a peer got of a recorded stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StreamServed {
    /// Times the call was answered.
    pub(crate) answers: u32,
    /// Messages sent (over all its answers).
    pub(crate) sent: u32,
    /// Recorded messages not sent, and why.
    pub(crate) unsent: Vec<(u64, Unsent)>,
    /// Messages the call's line counts that have no line (the tap dropped them).
    pub(crate) dropped: u64,
}

impl Script {
    /// The script of `plan` (every call of the recording, polling calls included).
    pub fn new(plan: Plan, speed: Option<f64>) -> Script {
        // crisp's snapshot at the recording's start comes first: a poller's answer before any
        // recorded one of its method.
        let mut steps: Vec<Step> = plan.snapshot.into_iter().chain(plan.steps).collect();
        for (i, s) in steps.iter_mut().enumerate() {
            s.index = i;
        }
        let identities = steps.iter().map(Identity::of_step).collect();
        let n = steps.len();
        Script {
            identities,
            answered: vec![0; n],
            order: Vec::new(),
            reached: None,
            first: None,
            speed,
            unmatched: BTreeMap::new(),
            again: BTreeMap::new(),
            uids: IdMap::default(),
            uid_pairs: Vec::new(),
            streams: BTreeMap::new(),
            scope: plan.scope,
            steps,
        }
    }

    /// Answers a call of gRPC `path` whose request decoded to `request`, `now` after some
    /// fixed instant (the shell's start).
    pub(crate) fn answer(&mut self, path: &str, request: &Value, now: Duration) -> Reply {
        let first = *self.first.get_or_insert(now);
        let route = Route::from_path(path);
        let method = path.rsplit('/').next().unwrap_or(path).to_string();
        let identity = Identity::of_request(route.rpc, request);
        let polling = route.rpc.is_some_and(|r| r.kind() == RpcKind::Polling);
        let chosen = if polling {
            self.polling_step(&method, &identity, now.saturating_sub(first))
        } else {
            self.mutating_step(&method, &identity)
        };
        let Some(index) = chosen else {
            *self
                .unmatched
                .entry(Unmatched {
                    method: method.clone(),
                    identity: identity.clone(),
                })
                .or_default() += 1;
            return Reply {
                code: UNIMPLEMENTED,
                message: format!(
                    "crisp replay --as-runtime: no recorded {method} call for {identity} \
                     (the recording does not have this call)"
                ),
                response: None,
                delay: Duration::ZERO,
                step: None,
                stream: None,
                open: false,
            };
        };
        self.answered[index] += 1;
        self.learn_uid(index, request);
        let step = &self.steps[index];
        if !step.polling {
            if self.answered[index] == 1 {
                self.order.push(index);
            } else {
                *self.again.entry(index).or_default() += 1;
            }
            if self.reached.is_none_or(|(r, _)| index >= r) {
                self.reached = Some((index, now.saturating_sub(first)));
            }
        }
        let delay = self
            .speed
            .map_or(Duration::ZERO, |s| step.recorded.duration.div_f64(s));
        let stream = self.stream_of(index);
        let step = &self.steps[index];
        let open = step.open_at_end;
        match step.recorded.code {
            Some(code) => {
                let mut response = (code == 0).then(|| step.response.clone()).flatten();
                if let Some(r) = response.as_mut().filter(|_| !self.uid_pairs.is_empty()) {
                    self.uids.rewrite(r);
                }
                Reply {
                    code,
                    message: step.recorded.message.clone(),
                    response,
                    delay,
                    step: Some(index),
                    stream,
                    open,
                }
            }
            // The recorded call was never answered (the client gave up first).
            None => Reply {
                code: DEADLINE_EXCEEDED,
                message: "crisp replay --as-runtime: the recorded call had no answer \
                          (its client gave up first)"
                    .to_string(),
                response: None,
                delay,
                step: Some(index),
                stream,
                open,
            },
        }
    }

    /// The messages of recorded call `index` to send, if it is a streamed call; those the
    /// recording lacks whole are counted as not sent.
    fn stream_of(&mut self, index: usize) -> Option<Vec<ReplyMessage>> {
        let step = &self.steps[index];
        if !step.streamed() {
            return None;
        }
        let mut send = Vec::new();
        let mut unsent = Vec::new();
        for m in &step.stream {
            let why = match &m.response {
                _ if step.rpc.is_none() => Some(Unsent::NoTypes),
                None => Some(Unsent::NotRecorded),
                Some(v) if v.get("_truncated").is_some() => Some(Unsent::Cut),
                Some(_) => None,
            };
            match (why, &m.response) {
                (None, Some(response)) => send.push(ReplyMessage {
                    index: m.index,
                    at: self.speed.map_or(Duration::ZERO, |s| m.offset.div_f64(s)),
                    response: response.clone(),
                }),
                (why, _) => unsent.push((m.index, why.unwrap_or(Unsent::NotRecorded))),
            }
        }
        let dropped = step
            .messages
            .unwrap_or(0)
            .saturating_sub(step.stream.len() as u64);
        let served = self.streams.entry(index).or_default();
        served.answers += 1;
        served.unsent = unsent;
        served.dropped = dropped;
        Some(send)
    }

    /// The shell sent a message of the stream answering recorded call `index`.
    pub(crate) fn message_sent(&mut self, index: usize) {
        self.streams.entry(index).or_default().sent += 1;
    }

    /// A matched RunPodSandbox whose pod the peer made under another uid: answers from now on
    /// name the peer's uid where the recording has the recorded one.
    fn learn_uid(&mut self, index: usize, request: &Value) {
        if self.steps[index].rpc != Some(Rpc::RunPodSandbox) {
            return;
        }
        let uid = |v: &Value| {
            v.pointer("/config/metadata/uid")
                .and_then(Value::as_str)
                .filter(|u| !u.is_empty())
                .map(str::to_string)
        };
        let recorded = self.steps[index].request.as_ref().and_then(uid);
        if let (Some(recorded), Some(peer)) = (recorded, uid(request)) {
            if recorded != peer && self.uids.get(&recorded).is_none() {
                self.uids.insert(&recorded, &peer);
                self.uid_pairs.push((recorded, peer));
            }
        }
    }

    /// The recorded calls of `method` a call naming `identity` may be.
    fn candidates<'a>(
        &'a self,
        method: &'a str,
        identity: &'a Identity,
    ) -> impl Iterator<Item = usize> + 'a {
        self.steps
            .iter()
            .filter(move |s| s.method == method && identity.agrees(&self.identities[s.index]))
            .map(|s| s.index)
    }

    /// The first recorded call not answered yet; past the last, the last again.
    fn mutating_step(&self, method: &str, identity: &Identity) -> Option<usize> {
        let mut last = None;
        for i in self.candidates(method, identity) {
            if self.answered[i] == 0 {
                return Some(i);
            }
            last = Some(i);
        }
        last
    }

    /// The latest recorded answer at the point reached (see the module doc); before any, the
    /// first. A status of a container the recording never asked about is not another's.
    fn polling_step(&self, method: &str, identity: &Identity, elapsed: Duration) -> Option<usize> {
        let frontier = self.frontier();
        let limit = match (self.speed, self.reached) {
            (Some(speed), Some((r, at))) => {
                Some(self.steps[r].recorded_end() + (elapsed.saturating_sub(at)).mul_f64(speed))
            }
            (Some(speed), None) => Some(elapsed.mul_f64(speed)),
            (None, _) => None,
        };
        let pick = |all: Vec<usize>| -> Option<usize> {
            let first = *all.first()?;
            let before = all
                .iter()
                .copied()
                .rfind(|&i| i < frontier && limit.is_none_or(|l| self.steps[i].offset <= l));
            Some(before.unwrap_or(first))
        };
        pick(self.candidates(method, identity).collect())
    }

    /// The index of the first mutating recorded call not answered after the furthest one
    /// answered: polling answers are taken from before it.
    fn frontier(&self) -> usize {
        let from = self.reached.map_or(0, |(r, _)| r + 1);
        self.steps[from.min(self.steps.len())..]
            .iter()
            .find(|s| !s.polling && self.answered[s.index] == 0)
            .map_or(self.steps.len(), |s| s.index)
    }

    /// What the peer did against the recording so far.
    pub fn report(&self) -> ServedReport {
        let mutating: Vec<&Step> = self.steps.iter().filter(|s| !s.polling).collect();
        let not_asked = mutating
            .iter()
            .filter(|s| self.answered[s.index] == 0)
            .map(|s| s.index)
            .collect();
        // A call asked before one recorded before it (calls that started together in the
        // recording, like kubelet's parallel stops, have no order to keep).
        let mut order = Vec::new();
        for (pos, &i) in self.order.iter().enumerate() {
            let later = self.order[pos + 1..]
                .iter()
                .find(|&&j| j < i && self.steps[i].offset >= self.steps[j].offset + ORDER_SLACK);
            if let Some(&j) = later {
                order.push((i, j));
            }
        }
        let mut polling: BTreeMap<String, (u32, usize)> = BTreeMap::new();
        for s in self.steps.iter().filter(|s| s.polling) {
            let e = polling.entry(s.method.clone()).or_default();
            e.0 += self.answered[s.index];
            e.1 += 1;
        }
        ServedReport {
            scope: self.scope.clone(),
            recorded: self.steps.len(),
            mutating: mutating.len(),
            answered: self.order.clone(),
            not_asked,
            order,
            again: self.again.clone().into_iter().collect(),
            unmatched: self.unmatched.clone().into_iter().collect(),
            polling,
            redacted: self
                .steps
                .iter()
                .filter(|s| self.answered[s.index] > 0)
                .filter(|s| s.response.as_ref().is_some_and(has_placeholder))
                .map(|s| s.index)
                .collect(),
            empty: self
                .steps
                .iter()
                .filter(|s| self.answered[s.index] > 0 && s.recorded.code == Some(0))
                .filter(|s| s.response.is_none() && s.response_bytes > 0 && !s.streamed())
                .map(|s| s.index)
                .collect(),
            uids: self.uid_pairs.clone(),
            streams: self.streams.clone().into_iter().collect(),
            steps: self.steps.clone(),
        }
    }
}

/// Whether a recorded message holds a redaction placeholder (`<redacted…>`): the recording
/// never had the value, and the answer keeps the placeholder.
pub(crate) fn has_placeholder(v: &Value) -> bool {
    match v {
        Value::String(s) => s.starts_with("<redacted"),
        Value::Object(m) => {
            m.contains_key("_truncated")
                || m.contains_key("_unknown_fields")
                || m.values().any(has_placeholder)
        }
        Value::Array(items) => items.iter().any(has_placeholder),
        _ => false,
    }
}

/// What `crisp replay --as-runtime` served, against the recording.
#[derive(Debug, Clone)]
pub struct ServedReport {
    pub(crate) scope: String,
    pub(crate) recorded: usize,
    pub(crate) mutating: usize,
    /// Mutating recorded calls answered, in the order of their first answer.
    pub(crate) answered: Vec<usize>,
    /// Mutating recorded calls the peer never made.
    pub(crate) not_asked: Vec<usize>,
    /// (answered, recorded before it but answered after it).
    pub(crate) order: Vec<(usize, usize)>,
    /// Mutating calls made more often than recorded: (recorded call, extra times).
    pub(crate) again: Vec<(usize, u32)>,
    pub(crate) unmatched: Vec<(Unmatched, u32)>,
    /// Per polling method: (calls answered, recorded answers).
    pub(crate) polling: BTreeMap<String, (u32, usize)>,
    /// Answered recorded calls whose answer kept redaction placeholders.
    pub(crate) redacted: Vec<usize>,
    /// Answered recorded calls whose response the recording lacks: answered with an empty one.
    pub(crate) empty: Vec<usize>,
    /// Pod uids in the answers: (recorded, the peer's).
    pub(crate) uids: Vec<(String, String)>,
    /// Streamed recorded calls answered, and what their peer got of their messages.
    pub(crate) streams: Vec<(usize, StreamServed)>,
    pub(crate) steps: Vec<Step>,
}

#[cfg(test)]
mod tests;
