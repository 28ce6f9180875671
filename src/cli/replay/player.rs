//! Plays a [`Plan`]: each call at its recorded offset (scaled), or as soon as what it waited for
//! in the recording has answered; a call that names an id waits for the replayed call that makes
//! it. Then stops and removes the sandboxes the replay made and did not remove itself.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use prost::Message;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::idmap::IdMap;
use super::prepare::{prepare, short_id, NotSent};
use super::report::{Cleanup, Outcome, Report, StreamRead};
use super::{Answer, Options, Pace, Plan, Step};
use crate::cri::api;
use crate::cri::Rpc;
use crate::tap::decode::decode;
use crate::tap::redact::Dir;

/// gRPC's Cancelled: the client ended the call.
const CANCELLED: i32 = 1;

/// What the calls share while they run.
#[derive(Default)]
struct State {
    ids: IdMap,
    outcomes: Vec<Option<Outcome>>,
    /// Sandboxes the replay made (new id, the path of the RunPodSandbox that made it).
    created: Vec<(String, String)>,
    removed: Vec<String>,
}

/// Replays `plan` on `runtime` until it ends or `interrupt` resolves, then cleans up (unless
/// `keep`), and reports.
pub async fn play(
    plan: &Plan,
    runtime: &super::Runtime,
    opts: &Options,
    interrupt: impl Future<Output = ()>,
) -> Report {
    let n = plan.steps.len();
    let state = Arc::new(Mutex::new(State {
        outcomes: vec![None; n],
        ..State::default()
    }));
    let fresh = fresh_suffix();
    let deps = dependencies(plan, opts.pace);
    let (done_tx, done_rx): (Vec<_>, Vec<_>) = (0..n).map(|_| watch::channel(false)).unzip();
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for (step, (done, deps)) in plan.steps.iter().zip(done_tx.into_iter().zip(deps)) {
        let step = step.clone();
        let waits: Vec<_> = deps.iter().map(|&d| done_rx[d].clone()).collect();
        let (state, runtime, fresh, pace, timeout) = (
            state.clone(),
            runtime.clone(),
            fresh.clone(),
            opts.pace,
            opts.timeout,
        );
        tasks.spawn(async move {
            if let Pace::Recorded(speed) = pace {
                tokio::time::sleep_until(start + step.offset.div_f64(speed)).await;
            }
            for mut w in waits {
                let _ = w.wait_for(|d| *d).await;
            }
            let outcome = run_step(&step, &state, &runtime, &fresh, (timeout, pace), start).await;
            state.lock().outcomes[step.index] = Some(outcome);
            let _ = done.send(true);
        });
    }
    let all = async { while tasks.join_next().await.is_some() {} };
    let interrupted = tokio::select! {
        _ = all => false,
        _ = interrupt => true,
    };
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let (created, removed, outcomes) = {
        let mut st = state.lock();
        (
            st.created.clone(),
            st.removed.clone(),
            std::mem::take(&mut st.outcomes),
        )
    };
    let mut cleanup = Vec::new();
    for (id, path) in created.iter().filter(|(id, _)| !removed.contains(id)) {
        if opts.keep {
            cleanup.push(Cleanup {
                sandbox: id.clone(),
                result: "kept (--keep)".to_string(),
            });
            continue;
        }
        cleanup.push(Cleanup {
            sandbox: id.clone(),
            result: remove_sandbox(&runtime.clone(), path, id, opts.timeout).await,
        });
    }
    Report::new(
        plan,
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::NotSent(NotSent::Interrupted)))
            .collect(),
        cleanup,
        interrupted,
        opts,
    )
}

/// The calls each call waits for: the ones that make the ids its request names; the calls on
/// the same container or sandbox that had answered before it started in the recording; a
/// retry, the refused call it stands in for; and, as fast as possible, every call that had
/// answered before it started in the recording.
fn dependencies(plan: &Plan, pace: Pace) -> Vec<Vec<usize>> {
    let producers: HashMap<String, usize> = plan
        .steps
        .iter()
        .filter_map(|s| s.recorded_product().map(|id| (id, s.index)))
        .collect();
    let mut all: Vec<Vec<usize>> = plan
        .steps
        .iter()
        .map(|s| {
            let mut deps = Vec::new();
            if let Some(req) = &s.request {
                named_ids(req, &mut |id| {
                    if let Some(&p) = producers.get(id) {
                        if p < s.index && !deps.contains(&p) {
                            deps.push(p);
                        }
                    }
                });
            }
            // What kubelet had seen answered about the same container (or, for a sandbox call,
            // the same sandbox) before it sent this call: a scaled replay never stops a
            // container whose start has not answered yet.
            for e in &plan.steps[..s.index] {
                if e.recorded_end() <= s.offset && same_object(e, s) && !deps.contains(&e.index) {
                    deps.push(e.index);
                }
            }
            if pace == Pace::AsFastAsPossible {
                for e in &plan.steps[..s.index] {
                    if e.recorded_end() <= s.offset && !deps.contains(&e.index) {
                        deps.push(e.index);
                    }
                }
            }
            deps
        })
        .collect();
    // A retry whose request stands in for a refused call's is the same request: it goes after
    // the refused one has answered, never racing it for the container's name.
    for s in &plan.steps {
        if let Some(retry) = s.borrowed {
            if !all[retry].contains(&s.index) {
                all[retry].push(s.index);
            }
        }
    }
    all
}

/// Whether `e` acted on what `s` acts on: its container, or for a call on a sandbox, anything
/// in that sandbox. Two CreateContainers of one name in one sandbox act on the same container:
/// the later one is kubelet's retry of one that failed or that crisp refused, and the runtime
/// reserves the name, so the two must not race.
fn same_object(e: &Step, s: &Step) -> bool {
    if s.rpc == Some(Rpc::CreateContainer) && e.rpc == s.rpc {
        return e.pod_sandbox_id == s.pod_sandbox_id && e.target == s.target;
    }
    if !s.container_id.is_empty() {
        return e.container_id == s.container_id;
    }
    !s.pod_sandbox_id.is_empty() && e.pod_sandbox_id == s.pod_sandbox_id
}

/// Calls `f` with every string of `v` (ids are whole values).
fn named_ids(v: &Value, f: &mut dyn FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Object(m) => m.values().for_each(|x| named_ids(x, f)),
        Value::Array(items) => items.iter().for_each(|x| named_ids(x, f)),
        _ => {}
    }
}

/// A suffix for replayed pods' uids, new for each replay.
fn fresh_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "replay-{:08x}",
        (nanos as u64 ^ u64::from(std::process::id())) as u32
    )
}

async fn run_step(
    step: &Step,
    state: &Mutex<State>,
    runtime: &super::Runtime,
    fresh: &str,
    (timeout, pace): (Duration, Pace),
    start: Instant,
) -> Outcome {
    let prepared = prepare(step, &mut state.lock().ids, fresh);
    let p = match prepared {
        Ok(p) => p,
        Err(why) => return Outcome::NotSent(why),
    };
    let sent_at = start.elapsed();
    if step.streamed() {
        let window = stream_window(step, pace);
        let (now, messages, cancelled) = runtime.stream(&step.path, p.bytes, timeout, window).await;
        return Outcome::Sent {
            now,
            sent_at,
            redacted: p.redacted,
            rewritten: p.rewritten.pairs,
            note: None,
            stream: Some(StreamRead {
                messages,
                cancelled_after: window.filter(|_| cancelled),
            }),
        };
    }
    let (now, response) = runtime.call(&step.path, p.bytes, timeout).await;
    let mut st = state.lock();
    let note = learn(step, &p.json, &now, response.as_deref(), &mut st);
    Outcome::Sent {
        now,
        sent_at,
        redacted: p.redacted,
        rewritten: p.rewritten.pairs,
        note,
        stream: None,
    }
}

/// How long to read a recorded stream that did not end by itself before cancelling it: one
/// still open when the recording ended, or one its client cancelled, for its recorded duration
/// (÷ speed). `None`: it ended on the runtime's side; read it to its end.
pub(crate) fn stream_window(step: &Step, pace: Pace) -> Option<Duration> {
    let client_ended = step.open_at_end || step.recorded.code == Some(CANCELLED);
    let speed = match pace {
        Pace::Recorded(s) => s,
        Pace::AsFastAsPossible => 1.0,
    };
    client_ended.then(|| step.recorded.duration.div_f64(speed))
}

/// What a replayed answer teaches: the ids the runtime made, the sandboxes made and removed.
/// A note for the report when an id was mapped by name.
fn learn(
    step: &Step,
    sent: &Value,
    now: &Answer,
    response: Option<&[u8]>,
    st: &mut State,
) -> Option<String> {
    let rpc = step.rpc?;
    let made = |key: &str| {
        let r = decode(Some(rpc), Dir::Response, response?, true);
        r.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let text = |pointer: &str| sent.pointer(pointer).and_then(Value::as_str).unwrap_or("");
    let ok = now.code == Some(0);
    match rpc {
        Rpc::RunPodSandbox if ok => {
            let id = made("pod_sandbox_id")?;
            if let Some(recorded) = step.recorded_product() {
                st.ids.insert(&recorded, &id);
            }
            st.created.push((id, step.path.clone()));
            None
        }
        Rpc::CreateContainer => {
            let sandbox = text("/pod_sandbox_id").to_string();
            let name = text("/config/metadata/name").to_string();
            let attempt = sent
                .pointer("/config/metadata/attempt")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let recorded = step.recorded_product();
            if ok {
                let id = made("container_id")?;
                st.ids.created_container(&sandbox, &name, attempt, &id);
                if let Some(r) = recorded {
                    st.ids.insert(&r, &id);
                }
                return None;
            }
            let r = recorded?;
            let earlier = st
                .ids
                .container_named(&sandbox, &name, attempt)?
                .to_string();
            st.ids.insert(&r, &earlier);
            Some(format!(
                "its container {} is the one an earlier replayed CreateContainer made under the same name",
                short_id(&earlier)
            ))
        }
        Rpc::RemovePodSandbox if ok => {
            st.removed.push(text("/pod_sandbox_id").to_string());
            None
        }
        _ => None,
    }
}

/// Stops and removes a sandbox the replay made (containerd removes its containers with it).
async fn remove_sandbox(
    runtime: &super::Runtime,
    run_path: &str,
    id: &str,
    timeout: Duration,
) -> String {
    let path = |method: &str| run_path.replace("RunPodSandbox", method);
    let stop = api::StopPodSandboxRequest {
        pod_sandbox_id: id.to_string(),
    };
    let (a, _) = runtime
        .call(&path("StopPodSandbox"), stop.encode_to_vec(), timeout)
        .await;
    if a.code != Some(0) {
        return format!("StopPodSandbox failed: {} {}", code(&a), a.message);
    }
    let remove = api::RemovePodSandboxRequest {
        pod_sandbox_id: id.to_string(),
    };
    let (a, _) = runtime
        .call(&path("RemovePodSandbox"), remove.encode_to_vec(), timeout)
        .await;
    if a.code != Some(0) {
        return format!("RemovePodSandbox failed: {} {}", code(&a), a.message);
    }
    "stopped and removed".to_string()
}

fn code(a: &Answer) -> &'static str {
    crate::metrics::code_name(a.code)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn step(index: usize, offset_ms: u64, rpc: Rpc, request: Value) -> Step {
        Step {
            index,
            method: rpc.name().to_string(),
            rpc: Some(rpc),
            offset: Duration::from_millis(offset_ms),
            recorded: Answer {
                code: Some(0),
                duration: Duration::from_millis(10),
                ..Answer::default()
            },
            request: Some(request),
            ..Step::default()
        }
    }

    /// A call waits for the replayed call that makes the id it names, a retry for the refused
    /// call it stands in for, and, as fast as possible, for what had answered before it.
    #[test]
    fn calls_wait_for_what_they_depend_on() {
        let mut run = step(0, 0, Rpc::RunPodSandbox, json!({}));
        run.pod_sandbox_id = "sb".into();
        let mut refused = step(
            1,
            300,
            Rpc::CreateContainer,
            json!({"pod_sandbox_id": "sb"}),
        );
        refused.recorded.code = Some(9);
        refused.borrowed = Some(2);
        (refused.pod_sandbox_id, refused.target) = ("sb".into(), "app".into());
        let mut retry = step(
            2,
            310,
            Rpc::CreateContainer,
            json!({"pod_sandbox_id": "sb"}),
        );
        retry.container_id = "ct".into();
        (retry.pod_sandbox_id, retry.target) = ("sb".into(), "app".into());
        let mut start = step(3, 320, Rpc::StartContainer, json!({"container_id": "ct"}));
        start.container_id = "ct".into();
        let mut stop = step(4, 900, Rpc::StopContainer, json!({"container_id": "ct"}));
        stop.container_id = "ct".into();
        let plan = Plan {
            steps: vec![run, refused, retry, start, stop],
            ..Plan::default()
        };
        let deps = dependencies(&plan, Pace::Recorded(1.0));
        assert_eq!(deps[1], vec![0]);
        assert_eq!(deps[2], vec![0, 1], "the retry goes after the refused call");
        assert_eq!(deps[3], vec![2]);
        assert_eq!(
            deps[4],
            vec![2, 3],
            "a stop after the start answered before it"
        );
        // Recorded with its own request (the tap records a refusal's since 2026-11-29): the
        // retry still waits for it, by the container's name.
        let mut plan = plan;
        plan.steps[1].borrowed = None;
        assert_eq!(
            dependencies(&plan, Pace::Recorded(1.0))[2],
            vec![0, 1],
            "a retry of the same name goes after the refused call"
        );
        plan.steps[1].target = "sidecar".into();
        assert_eq!(
            dependencies(&plan, Pace::Recorded(1.0))[2],
            vec![0],
            "another container's create does not hold it"
        );
        plan.steps[1].target = "app".into();
        let asap = dependencies(&plan, Pace::AsFastAsPossible);
        assert_eq!(
            asap[3],
            vec![2, 0, 1],
            "and after every call answered before it"
        );
    }
}
