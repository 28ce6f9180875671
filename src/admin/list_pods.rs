//! `ListPods` (what `crisp pods` shows): the ordering engine's pods, sidecars and held calls
//! as the admin API's messages.

use std::time::Duration;

use crate::admin_api as pb;
use crate::ordering::annotations::{Sidecar, Source};
use crate::ordering::decide::Snapshot;
use crate::ordering::holds::HeldCall;
use crate::ordering::{Engine, Pod};

/// How long ListPods waits for the runtime to list one pod's containers.
pub(super) const LIST_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) fn unix_nanos(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// ListPods' answer: the pods `want` names (`namespace/name`, `name`; `None`: every pod), each
/// with its containers as the runtime lists them now, sorted by namespace and name. Only the
/// pods asked for are read from the runtime: one pod's answer costs one read, not one per pod
/// of the node (issue #47).
pub(crate) async fn list_pods(engine: &Engine, want: Option<&str>) -> Vec<pb::Pod> {
    let mut pods = Vec::new();
    for (p, containers) in engine.pods() {
        if pb::pod_named(want, &p.namespace, &p.name) {
            pods.push(pod_to_proto(engine, &p, containers).await);
        }
    }
    pods.sort_by(|a, b| {
        (&a.namespace, &a.name, &a.pod_sandbox_id).cmp(&(&b.namespace, &b.name, &b.pod_sandbox_id))
    });
    pods
}

/// One pod as ListPods reports it: the engine's caches, its holds now, and its sidecars'
/// states as the runtime lists them (an admin call, never a CRI call's path).
pub(super) async fn pod_to_proto(
    engine: &Engine,
    p: &Pod,
    containers: std::collections::HashMap<String, String>,
) -> pb::Pod {
    let until = tokio::time::Instant::now() + LIST_TIMEOUT;
    let listed = match tokio::time::timeout_at(until, engine.list_pod_containers(p, until)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {LIST_TIMEOUT:?}")),
    };
    let snapshot = listed.as_ref().ok().map(|c| Snapshot::new(c));
    let sidecars = p
        .policy
        .gated()
        .iter()
        .map(|s| sidecar_to_proto(p, s, snapshot.as_ref()))
        .collect();
    let held = p.held_calls().iter().map(held_to_proto).collect();
    let (timeout, policy) = engine.start_policy(p);
    let (is_job, watched) = engine.job_state(p);
    let mut terminated: Vec<String> = containers
        .iter()
        .filter(|(id, _)| engine.terminated(id))
        .map(|(_, name)| name.clone())
        .collect();
    terminated.sort();
    pb::Pod {
        pod_sandbox_id: p.sandbox_id.clone(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        host_network: p.host_network,
        policy_source: match p.policy.source {
            Source::Annotation => "annotation",
            Source::NodeRules => "node-rules",
            Source::Injector => "injector",
            Source::OptOut => "opt-out",
        }
        .into(),
        sidecars,
        start_timeout_ms: p
            .policy
            .start_timeout
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        timeout_policy: p
            .policy
            .timeout_policy
            .map(|t| format!("{t:?}").to_lowercase())
            .unwrap_or_default(),
        job: p.policy.job.map(|j| j.to_string()).unwrap_or_default(),
        containers: {
            let mut c: Vec<pb::Container> = containers
                .into_iter()
                .map(|(id, name)| pb::Container { id, name })
                .collect();
            c.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
            c
        },
        held,
        refusals: p.refusals.load(std::sync::atomic::Ordering::Relaxed),
        effective_start_timeout_ms: timeout.as_millis() as u64,
        effective_timeout_policy: format!("{policy:?}").to_lowercase(),
        job_state: Some(pb::JobState {
            is_job,
            watched,
            terminated,
        }),
        runtime_error: listed.err().unwrap_or_default(),
        isolation: p.isolation().map(|i| i.to_string()).unwrap_or_default(),
    }
}

/// A sidecar of the pod as `crisp pods` shows it: its state in `snapshot` (`None`: the runtime
/// did not answer) and its last probe.
pub(super) fn sidecar_to_proto(p: &Pod, s: &Sidecar, snapshot: Option<&Snapshot>) -> pb::Sidecar {
    let (state, container_id) = match snapshot.map(|snap| snap.get(&s.name)) {
        None => (String::new(), String::new()),
        Some(None) => ("not created".to_string(), String::new()),
        Some(Some(c)) => (container_state(c.state).to_string(), c.id.clone()),
    };
    let last = p.last_probe(&s.name);
    pb::Sidecar {
        name: s.name.clone(),
        ready: s.ready.to_string(),
        required: s.required,
        state,
        container_id,
        last_probe_result: last
            .as_ref()
            .map(|l| match &l.result {
                Ok(()) => "ok".to_string(),
                Err(e) => e.clone(),
            })
            .unwrap_or_default(),
        last_probe_unix_nanos: last.map(|l| unix_nanos(l.at)).unwrap_or(0),
    }
}

/// A call held now, with what it waits for.
pub(super) fn held_to_proto(h: &HeldCall) -> pb::HeldCall {
    pb::HeldCall {
        call_id: h.call_id,
        method: h.method.clone(),
        container_name: h.container.clone(),
        since_unix_nanos: unix_nanos(h.since),
        waiting_on: h.waiting.on.clone(),
        reason: h.waiting.reason.clone(),
        probe: h.waiting.probe.clone(),
        probe_result: h.waiting.probe_result.clone(),
        held_ms: h.held_from.elapsed().as_millis() as u64,
        time_left_ms: h.time_left().as_millis() as u64,
        policy: h.policy.clone(),
    }
}

pub(super) fn container_state(s: i32) -> &'static str {
    use crate::cri::views::state;
    match s {
        state::CREATED => "created",
        state::RUNNING => "running",
        state::EXITED => "exited",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::ApiVersion;
    use crate::ordering::engine_tests::{pod_with, Fake, SANDBOX};
    use crate::ordering::now;

    /// Issue #47: `crisp pods NS/POD` on a node of 50 pods with sidecars lists that pod's
    /// containers only. The answer used to be every pod's, each read under the node-wide read
    /// limit and filtered by the client: one pod's view cost a read of every pod (at 2,500 pods
    /// and 100 reads a second, 25 s), and asking for each pod in turn the square of the node.
    #[tokio::test(start_paused = true)]
    async fn one_pod_s_listing_reads_that_pod_only() {
        let fake = Fake::default();
        let engine = pod_with(&fake, &["proxy"], &[], |_| {});
        fake.add("proxy", Some(now()));
        for i in 0..50 {
            let id = if i == 0 {
                SANDBOX.into()
            } else {
                format!("sb-{i}")
            };
            assert!(engine.pod_by_id(ApiVersion::V1, &id).await.is_some());
        }
        assert_eq!(engine.pods().len(), 50);
        let before = fake.script().lists;
        let one = list_pods(&engine, Some("ns/pod")).await;
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].name.as_str(), one[0].sidecars.len()), ("pod", 1));
        assert_eq!(
            one[0].sidecars[0].state, "running",
            "the pod's containers were read"
        );
        let reads = fake.script().lists - before;
        assert_eq!(reads, 1, "{reads} pods' containers read to show one");
        let by_name = list_pods(&engine, Some("sb-7")).await;
        assert_eq!(by_name.len(), 1);
        assert!(list_pods(&engine, Some("other/pod")).await.is_empty());
        let every = list_pods(&engine, None).await;
        assert_eq!(every.len(), 50);
        assert_eq!(fake.script().lists - before, 2 + 50);
    }
}
