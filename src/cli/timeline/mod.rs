//! `crisp timeline`: one pod's CRI calls, from a recorded tap (`crisp tap -o calls.jsonl`), drawn
//! as a waterfall — in the terminal (text bars, 100 columns) and as a self-contained SVG file.
//!
//! ```text
//!  calls.jsonl ─ parse(): call events only (drop markers and event kinds crisp does not know
//!                are skipped) ─ group(): calls to pods by name, then by sandbox / container id,
//!                ImageStatus by image ─ Pod ─┬─ text(): one row per call,
//!                                            │          █ forwarded ░ held × failed
//!                                            ├─ svg(): the same rows; hover shows each call's
//!                                            │         details
//!                                            └─ sequence: kubelet, crisp and the runtime as
//!                                                      lanes, a hold as the gap between the
//!                                                      request and its forward, the hold's probe
//!                                                      rounds on crisp's lane (SVG, Mermaid)
//! ```
//!
//! A call's held part is drawn first: crisp holds a call before it forwards it (DESIGN.md §4),
//! so `held_ms` is the start of `duration_ms`. Pod and container names and grpc-messages are
//! tenant-influenced text: every string is cut to a bounded length, control characters are
//! replaced, and the SVG escapes all of it (no text ever becomes markup).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, BufRead};
use std::time::UNIX_EPOCH;

use serde_json::Value;

use crate::admin_api as pb;

mod sequence;
mod svg;
mod text;

pub use sequence::{mermaid, sequence_svg, MAX_SEQUENCE_CALLS};

pub use svg::{colour, svg};
#[cfg(test)]
use svg::{tick_step, xml_escape};
pub use text::text;

/// Longest name (pod, namespace, container, method, image) kept, in characters.
pub(crate) const MAX_NAME: usize = 96;
/// Longest text kept (a grpc-message, a hold's reason, a probe's result), in characters; not
/// to be confused with the tap's bound on a protobuf message, [`crate::tap::MAX_SHOWN_PROTOBUF_BYTES`].
pub(crate) const MAX_SHOWN_TEXT_CHARS: usize = 240;
/// Width of the terminal view.
pub const TEXT_WIDTH: usize = 100;
/// Most failed calls listed under the SVG chart.
const MAX_LISTED_FAILURES: usize = 20;

/// One finished CRI call, as the tap recorded it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Call {
    /// The tap's id of the call (0 when the recording has none): what its hold events name.
    pub(crate) call_id: u64,
    /// Start, in microseconds since the Unix epoch.
    pub(crate) start_us: i64,
    pub(crate) duration_us: i64,
    /// The part of `duration_us`, from its start, that crisp held the call.
    pub(crate) held_us: i64,
    pub(crate) method: String,
    /// `mutating`, `polling`, `streaming` or `unknown`.
    pub(crate) kind: String,
    pub(crate) pod_namespace: String,
    pub(crate) pod_name: String,
    pub(crate) pod_sandbox_id: String,
    pub(crate) container_name: String,
    pub(crate) container_id: String,
    pub(crate) image: String,
    /// `OK`, `FailedPrecondition`, ... (`None`: the client went away first).
    pub(crate) code_name: String,
    pub(crate) message: String,
}

impl Call {
    pub(crate) fn ok(&self) -> bool {
        self.code_name == "OK"
    }

    fn end_us(&self) -> i64 {
        self.start_us + self.duration_us
    }

    fn sandbox_call(&self) -> bool {
        self.method.ends_with("PodSandbox")
    }

    /// What the call acts on: `pod` for sandbox calls, else the container (name, or short id).
    pub(crate) fn target(&self) -> String {
        if self.sandbox_call() {
            "pod".to_string()
        } else if !self.container_name.is_empty() {
            self.container_name.clone()
        } else if !self.container_id.is_empty() {
            format!("id={}", fit(&self.container_id, 12))
        } else if !self.image.is_empty() {
            self.image.clone()
        } else {
            String::new()
        }
    }
}

/// A pod and its calls, in start order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pod {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub calls: Vec<Call>,
    /// The hold events of its calls (`crisp tap -o` records them beside the calls), in time
    /// order: what the sequence view draws on crisp's lane.
    pub holds: Vec<Hold>,
}

/// One hold event of a recording: a phase of the wait of a call crisp held (docs/TAP.md,
/// "Holds, live").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hold {
    pub(crate) call_id: u64,
    /// When, in microseconds since the Unix epoch.
    pub(crate) time_us: i64,
    /// `start`, `update`, `end` or `refused`.
    pub(crate) phase: String,
    /// What the call waits on: a sidecar's name, `apps` or `runtime`.
    pub(crate) waiting_on: String,
    pub(crate) reason: String,
    /// The last probe's result (an exec probe's exit code, never its output).
    pub(crate) probe_result: String,
    /// How the hold ended (`end` and `refused` only): `forwarded`, `timed out (proceed)`, ...
    pub(crate) outcome: String,
}

impl Pod {
    /// `namespace/name`.
    pub(crate) fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn span(&self) -> (i64, i64) {
        let t0 = self.calls.iter().map(|c| c.start_us).min().unwrap_or(0);
        let t1 = self.calls.iter().map(Call::end_us).max().unwrap_or(t0);
        (t0, t1.max(t0 + 1))
    }
}

/// What [`parse`] read.
#[derive(Debug, Default)]
pub struct Parsed {
    pub calls: Vec<Call>,
    /// Lines that are no call event: drop markers and event kinds this version does not draw.
    pub skipped: usize,
    /// Lines that are not JSON (e.g. the last line of a recording cut short).
    pub malformed: usize,
    /// Hold events, given to their calls' pods by [`attach_holds`].
    pub holds: Vec<Hold>,
}

/// `s` fitted to `max` characters for the layout: control characters removed, cut with `…`
/// (the tenant rule, `tenant::cut`, has escaped it already where the text came from a pod).
pub(crate) fn fit(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .take(max)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.chars().nth(max).is_some() {
        out.pop();
        out.push('…');
    }
    out
}

/// A recorded field as the views keep it: escaped by the one rule for pod text
/// (`crate::tenant`: control, bidi and other format characters as `\u{..}`, the work bounded by
/// the cap), then cut to `max` characters for the layout.
fn clean(s: &str, max: usize) -> String {
    fit(&crate::tenant::cut(s, 4 * max), max)
}

fn text_field(v: &Value, key: &str, max: usize) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .map(|s| clean(s, max))
        .unwrap_or_default()
}

fn micros(v: &Value, key: &str) -> Option<i64> {
    let ms = v.get(key)?.as_f64()?;
    (ms.is_finite() && ms >= 0.0).then(|| (ms * 1e3).round().min(i64::MAX as f64 / 4.0) as i64)
}

/// One line of a tap recording as a call, or `None` for anything else. A call event has the
/// fields `crisp tap --json` writes for calls and one of the call kinds: another event kind
/// (drop markers, or events a newer crisp adds) is not mistaken for one.
pub fn call_of(v: &Value) -> Option<Call> {
    let kind = v.get("kind")?.as_str()?;
    // A snapshot line is crisp's own call at a recording's start, not kubelet's.
    if !matches!(kind, "mutating" | "polling" | "streaming" | "unknown")
        || v.get("event").is_some_and(|e| e != "call")
        || v.get("snapshot").is_some_and(|s| s == true)
    {
        return None;
    }
    // Fields only a finished call has.
    v.get("response_bytes")?;
    v.get("code_name")?;
    let method = v.get("method")?.as_str()?;
    let start_us = time_us(v)?;
    let duration_us = micros(v, "duration_ms")?;
    Some(Call {
        call_id: v.get("call_id").and_then(Value::as_u64).unwrap_or(0),
        start_us,
        duration_us,
        held_us: micros(v, "held_ms").unwrap_or(0).min(duration_us),
        method: clean(method, MAX_NAME),
        kind: kind.to_string(),
        pod_namespace: text_field(v, "pod_namespace", MAX_NAME),
        pod_name: text_field(v, "pod_name", MAX_NAME),
        pod_sandbox_id: text_field(v, "pod_sandbox_id", MAX_NAME),
        container_name: text_field(v, "container_name", MAX_NAME),
        container_id: text_field(v, "container_id", MAX_NAME),
        image: text_field(v, "image", MAX_NAME),
        code_name: text_field(v, "code_name", MAX_NAME),
        message: text_field(v, "message", MAX_SHOWN_TEXT_CHARS),
    })
}

/// The start of `v`'s `"time"`, in microseconds since the Unix epoch.
fn time_us(v: &Value) -> Option<i64> {
    let time = humantime::parse_rfc3339(v.get("time")?.as_str()?).ok()?;
    time.duration_since(UNIX_EPOCH)
        .ok()?
        .as_micros()
        .try_into()
        .ok()
}

/// One line of a tap recording as a hold event (a `"hold"` key naming a known phase and the
/// call's id), or `None`.
pub fn hold_of(v: &Value) -> Option<Hold> {
    let phase = v.get("hold")?.as_str()?;
    if !matches!(phase, "start" | "update" | "end" | "refused") {
        return None;
    }
    Some(Hold {
        call_id: v.get("call_id")?.as_u64()?,
        time_us: time_us(v)?,
        phase: phase.to_string(),
        waiting_on: text_field(v, "waiting_on", MAX_NAME),
        reason: text_field(v, "reason", MAX_SHOWN_TEXT_CHARS),
        probe_result: text_field(v, "probe_result", MAX_SHOWN_TEXT_CHARS),
        outcome: text_field(v, "outcome", MAX_NAME),
    })
}

/// Gives each hold event to the pod whose call it names (by the tap's call id), in time order;
/// events of calls no pod has are dropped.
pub fn attach_holds(pods: &mut [Pod], holds: Vec<Hold>) {
    let mut by_call: HashMap<u64, usize> = HashMap::new();
    for (i, p) in pods.iter().enumerate() {
        for c in p.calls.iter().filter(|c| c.call_id != 0) {
            by_call.insert(c.call_id, i);
        }
    }
    for h in holds {
        if let Some(&i) = by_call.get(&h.call_id) {
            pods[i].holds.push(h);
        }
    }
    for p in pods {
        p.holds.sort_by_key(|h| h.time_us);
    }
}

/// Reads a tap recording: JSON lines, one event each.
pub fn parse(input: impl BufRead) -> io::Result<Parsed> {
    let mut out = Parsed::default();
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(&line) {
            Ok(v) => match (call_of(&v), hold_of(&v)) {
                (Some(c), _) => out.calls.push(c),
                (None, Some(h)) => out.holds.push(h),
                (None, None) => out.skipped += 1,
            },
            Err(_) => out.malformed += 1,
        }
    }
    Ok(out)
}

/// Sorts calls into pods. A call without pod names is given to the pod whose sandbox or
/// container id it names (the tap names what the engine knows; a call after the engine forgot
/// a pod has ids only); an ImageStatus call (no pod in its request) to the pod that pulls or
/// creates a container from that image next, within the pod's lifetime. Polling calls other
/// than ImageStatus are left out unless `all`.
pub fn group(calls: Vec<Call>, all: bool) -> Vec<Pod> {
    let mut pods: Vec<Pod> = Vec::new();
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    let mut by_sandbox: HashMap<String, usize> = HashMap::new();
    let mut by_container: HashMap<String, (usize, String)> = HashMap::new();
    let mut orphans = Vec::new();
    for c in calls {
        if c.kind == "polling" && !all && c.method != "ImageStatus" {
            continue;
        }
        if c.pod_name.is_empty() {
            orphans.push(c);
            continue;
        }
        let key = (c.pod_namespace.clone(), c.pod_name.clone());
        let i = *index.entry(key).or_insert_with(|| {
            pods.push(Pod {
                namespace: c.pod_namespace.clone(),
                name: c.pod_name.clone(),
                calls: Vec::new(),
                holds: Vec::new(),
            });
            pods.len() - 1
        });
        if !c.pod_sandbox_id.is_empty() {
            by_sandbox.insert(c.pod_sandbox_id.clone(), i);
        }
        if !c.container_id.is_empty() {
            by_container.insert(c.container_id.clone(), (i, c.container_name.clone()));
        }
        pods[i].calls.push(c);
    }
    let mut images = Vec::new();
    for mut c in orphans {
        if let Some((i, name)) = by_container.get(&c.container_id) {
            if c.container_name.is_empty() {
                c.container_name = name.clone();
            }
            pods[*i].calls.push(c);
        } else if let Some(i) = by_sandbox.get(&c.pod_sandbox_id) {
            pods[*i].calls.push(c);
        } else if c.method == "ImageStatus" && !c.image.is_empty() {
            images.push(c);
        }
    }
    for p in &mut pods {
        p.calls.sort_by_key(|c| c.start_us);
    }
    for mut c in images {
        if let Some((i, name)) = image_user(&pods, &c) {
            c.container_name = name;
            pods[i].calls.push(c);
        }
    }
    for p in &mut pods {
        p.calls.sort_by_key(|c| c.start_us);
    }
    pods
}

/// How soon after an ImageStatus kubelet creates the container whose image it checked
/// (`EnsureImageExists` runs right before CreateContainer in kubelet's start loop).
const IMAGE_TO_CREATE_US: i64 = 1_000_000;

/// The pod (and container name, if a CreateContainer says) whose next call after `c` uses
/// `c`'s image, while the pod exists. kubelet 1.2x creates containers from the image *id* that
/// ImageStatus returned (which the tap does not read without `--full`): a CreateContainer with
/// an image id that starts within [`IMAGE_TO_CREATE_US`] counts as a use too.
fn image_user(pods: &[Pod], c: &Call) -> Option<(usize, String)> {
    let uses = |u: &Call| {
        u.start_us >= c.start_us
            && match u.method.as_str() {
                "PullImage" => u.image == c.image,
                "CreateContainer" => {
                    u.image == c.image
                        || (u.image.starts_with("sha256:")
                            && u.start_us - c.start_us <= IMAGE_TO_CREATE_US)
                }
                _ => false,
            }
    };
    let mut best: Option<(i64, usize, String)> = None;
    for (i, p) in pods.iter().enumerate() {
        let (t0, t1) = p.span();
        if c.start_us < t0 || c.start_us > t1 {
            continue;
        }
        if let Some(u) = p.calls.iter().find(|u| uses(u)) {
            let gap = u.start_us - c.start_us;
            if best.as_ref().is_none_or(|b| gap < b.0) {
                let name = p
                    .calls
                    .iter()
                    .find(|x| uses(x) && x.method == "CreateContainer")
                    .map(|x| x.container_name.clone());
                best = Some((gap, i, name.unwrap_or_default()));
            }
        }
    }
    best.map(|(_, i, n)| (i, n))
}

/// Picks the pods `want` names (`namespace/name`, or a unique `name`).
pub fn select<'a>(pods: &'a [Pod], want: &str) -> Result<&'a Pod, String> {
    let hits: Vec<&Pod> = match want.split_once('/') {
        Some((ns, name)) => pods
            .iter()
            .filter(|p| p.namespace == ns && p.name == name)
            .collect(),
        None => pods.iter().filter(|p| p.name == want).collect(),
    };
    match hits.as_slice() {
        [p] => Ok(p),
        [] => Err(format!(
            "no pod {want:?} in the recording; it has: {}",
            list(pods)
        )),
        _ => Err(format!(
            "{want:?} names several pods ({}); use namespace/name",
            hits.iter().map(|p| p.id()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// The pods, as `namespace/name (N calls)`, for a message that asks to choose one.
pub fn list(pods: &[Pod]) -> String {
    if pods.is_empty() {
        return "no pods".to_string();
    }
    pods.iter()
        .map(|p| format!("{} ({} calls)", p.id(), p.calls.len()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `420µs`, `5.2ms`, `123ms`, `3.21s`.
pub(crate) fn dur(us: i64) -> String {
    match us {
        ..=999 => format!("{us}µs"),
        1_000..=9_999 => format!("{:.1}ms", us as f64 / 1e3),
        10_000..=999_999 => format!("{:.0}ms", us as f64 / 1e3),
        _ => format!("{:.2}s", us as f64 / 1e6),
    }
}

/// The right-hand note of a row: duration, a failure's status, and held time. The status comes
/// before the hold so that a row cut to the terminal's width keeps what went wrong.
fn note(c: &Call) -> String {
    let mut s = dur(c.duration_us);
    if !c.ok() {
        let _ = write!(
            s,
            " {}",
            if c.code_name.is_empty() {
                "?"
            } else {
                &c.code_name
            }
        );
    }
    // Every call spends some µs in crisp, a refused one ~1 ms deciding (more on a loaded
    // machine): only holds worth waiting for are named.
    if c.held_us >= 10_000 {
        let _ = write!(s, " held {}", dur(c.held_us));
    }
    s
}

fn header(pod: &Pod) -> String {
    let (t0, t1) = pod.span();
    let start = UNIX_EPOCH + std::time::Duration::from_micros(t0.max(0) as u64);
    let held = pod.calls.iter().filter(|c| c.held_us >= 10_000).count();
    let failed = pod.calls.iter().filter(|c| !c.ok()).count();
    format!(
        "{} — {} calls over {} from {} · {held} held · {failed} failed or refused",
        fit(&pod.id(), 2 * MAX_NAME),
        pod.calls.len(),
        dur(t1 - t0),
        humantime::format_rfc3339_millis(start)
    )
}

/// The tap request of `crisp timeline --live`: the sandbox, container and image calls of every
/// pod (or every call with `all`). No pod filter: ImageStatus names no pod, so the pod is chosen
/// afterwards, as from a recording.
pub fn live_request(all: bool) -> pb::TapRequest {
    let methods = if all {
        Vec::new()
    } else {
        ["*PodSandbox", "*Container", "ImageStatus", "PullImage"]
            .map(String::from)
            .to_vec()
    };
    pb::TapRequest {
        methods,
        include_polling: all,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
