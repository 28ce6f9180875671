//! Unit tests of `getPhase`, `convertToAPIContainerStatuses` and `TerminatePod` (KUBELET-CRI §4.3).

use super::*;
use crate::emulator::pod::{PodSpec, RestartPolicy};

fn pod(policy: RestartPolicy, init: &[&str], containers: &[&str]) -> PodSpec {
    PodSpec::of_true(policy, init, containers)
}

fn running(name: &str) -> ContainerStatusView {
    view(name, ContainerState::Running { started_at: 1 }, None)
}

fn terminated(name: &str, code: i32) -> ContainerStatusView {
    view(name, term(code), None)
}

fn waiting(name: &str, last: Option<ContainerState>) -> ContainerStatusView {
    view(
        name,
        ContainerState::Waiting {
            reason: "CrashLoopBackOff".into(),
            message: String::new(),
        },
        last,
    )
}

fn term(code: i32) -> ContainerState {
    ContainerState::Terminated {
        exit_code: code,
        reason: String::new(),
        message: String::new(),
        started_at: 1,
        finished_at: 2,
        container_id: "c".into(),
    }
}

fn view(name: &str, state: ContainerState, last: Option<ContainerState>) -> ContainerStatusView {
    ContainerStatusView {
        name: name.into(),
        state,
        last_state: last,
        restart_count: 0,
        container_id: Some("c".into()),
        image: String::new(),
        image_id: String::new(),
    }
}

/// The API status kubelet 1.26 computes for a pod that is not terminal.
fn status_on_1_26(
    p: &PodSpec,
    old: &ApiPodStatus,
    reasons: &ReasonCache,
    status: &RuntimePodStatus,
) -> ApiPodStatus {
    generate_api_pod_status(
        &inputs(p, old, reasons, false, KubeletVersion::V1_26),
        status,
    )
}

/// The runtime's view of pod "uid" with these containers.
fn runtime_status(containers: Vec<RuntimeContainerStatus>) -> RuntimePodStatus {
    RuntimePodStatus {
        uid: "uid".into(),
        containers,
        ..RuntimePodStatus::default()
    }
}

#[test]
fn phase_table() {
    use PodPhase::*;
    use RestartPolicy::*;
    // (policy, regular statuses, terminal?, expected)
    let cases: Vec<(RestartPolicy, Vec<ContainerStatusView>, bool, PodPhase)> = vec![
        (Always, vec![], false, Pending),
        (Always, vec![running("a")], false, Pending), // b unknown
        (Always, vec![running("a"), running("b")], false, Running),
        (
            Always,
            vec![running("a"), waiting("b", None)],
            false,
            Pending,
        ),
        (
            Always,
            vec![running("a"), waiting("b", Some(term(1)))],
            false,
            Running,
        ),
        (
            Always,
            vec![terminated("a", 0), terminated("b", 0)],
            false,
            Running,
        ),
        (
            Never,
            vec![terminated("a", 0), terminated("b", 0)],
            false,
            Succeeded,
        ),
        (
            Never,
            vec![terminated("a", 0), terminated("b", 1)],
            false,
            Failed,
        ),
        (
            OnFailure,
            vec![terminated("a", 0), terminated("b", 0)],
            false,
            Succeeded,
        ),
        (
            OnFailure,
            vec![terminated("a", 0), terminated("b", 1)],
            false,
            Running,
        ),
        // A running sidecar keeps a Never pod Running after the app exits (KUBELET-CRI §4.3).
        (
            Never,
            vec![terminated("a", 0), running("b")],
            false,
            Running,
        ),
        // 1.27 terminal branch.
        (
            Always,
            vec![terminated("a", 0), terminated("b", 0)],
            true,
            Succeeded,
        ),
        (
            Always,
            vec![terminated("a", 0), terminated("b", 137)],
            true,
            Failed,
        ),
        (
            OnFailure,
            vec![terminated("a", 0), terminated("b", 1)],
            true,
            Failed,
        ),
    ];
    for (i, (policy, statuses, terminal, want)) in cases.into_iter().enumerate() {
        let p = pod(policy, &[], &["a", "b"]);
        assert_eq!(get_phase(&p, &[], &statuses, terminal), want, "case {i}");
    }
}

#[test]
fn init_container_phases() {
    let never = pod(RestartPolicy::Never, &["i"], &["a"]);
    let always = pod(RestartPolicy::Always, &["i"], &["a"]);
    let a_waiting = [view(
        "a",
        ContainerState::Waiting {
            reason: "PodInitializing".into(),
            message: String::new(),
        },
        None,
    )];
    // Failed init under Never → Failed.
    assert_eq!(
        get_phase(&never, &[terminated("i", 1)], &a_waiting, false),
        PodPhase::Failed
    );
    // Failed init under Always → Pending (it will be retried).
    assert_eq!(
        get_phase(&always, &[terminated("i", 1)], &a_waiting, false),
        PodPhase::Pending
    );
    // Init running → Pending.
    assert_eq!(
        get_phase(&always, &[running("i")], &a_waiting, false),
        PodPhase::Pending
    );
    // Waiting with a failed last termination counts as failed.
    assert_eq!(
        get_phase(&never, &[waiting("i", Some(term(2)))], &a_waiting, false),
        PodPhase::Failed
    );
    // Init done, app running → Running.
    assert_eq!(
        get_phase(&always, &[terminated("i", 0)], &[running("a")], false),
        PodPhase::Running
    );
}

fn rcs(
    name: &str,
    id: &str,
    state: CriState,
    created: i64,
    exit: i32,
    restart: u32,
) -> RuntimeContainerStatus {
    RuntimeContainerStatus {
        started_at: if state == CriState::Created {
            0
        } else {
            created + 1
        },
        finished_at: if state == CriState::Exited {
            created + 2
        } else {
            0
        },
        exit_code: exit,
        reason: if state == CriState::Exited {
            "Error".into()
        } else {
            String::new()
        },
        image_ref: "sha256:1".into(),
        restart_count: restart,
        ..RuntimeContainerStatus::fixture(id, name, state, created)
    }
}

fn inputs<'a>(
    p: &'a PodSpec,
    old: &'a ApiPodStatus,
    reasons: &'a ReasonCache,
    terminal: bool,
    version: KubeletVersion,
) -> StatusInputs<'a> {
    StatusInputs {
        pod: p,
        deletion_requested: false,
        old,
        reasons,
        pod_is_terminal: terminal,
        version,
    }
}

#[test]
fn newest_instance_is_state_previous_is_last_state() {
    let p = pod(RestartPolicy::Always, &[], &["a"]);
    let status = runtime_status(vec![
        rcs("a", "new", CriState::Running, 20, 0, 1),
        rcs("a", "old", CriState::Exited, 10, 3, 0),
    ]);
    let old = ApiPodStatus::pending();
    let reasons = ReasonCache::new();
    let s = status_on_1_26(&p, &old, &reasons, &status);
    let a = s.container("a").expect("a");
    assert!(a.state.is_running());
    assert_eq!(a.restart_count, 1);
    assert_eq!(
        a.last_state.as_ref().and_then(ContainerState::exit_code),
        Some(3)
    );
    assert_eq!(s.phase, PodPhase::Running);
}

#[test]
fn no_runtime_status_is_container_creating_and_reason_cache_shows() {
    let p = pod(RestartPolicy::Always, &[], &["a"]);
    let old = ApiPodStatus::pending();
    let mut reasons = ReasonCache::new();
    let status = RuntimePodStatus::empty("uid");
    let s = status_on_1_26(&p, &old, &reasons, &status);
    assert_eq!(
        s.container("a").and_then(|c| c.state.reason()),
        Some("ContainerCreating")
    );
    assert_eq!(s.phase, PodPhase::Pending);

    // A CREATED container whose start failed: Waiting with the recorded reason.
    reasons.insert("a".into(), ("RunContainerError".into(), "boom".into()));
    let status = runtime_status(vec![rcs("a", "x", CriState::Created, 5, 0, 0)]);
    let s = status_on_1_26(&p, &old, &reasons, &status);
    assert_eq!(
        s.container("a").and_then(|c| c.state.reason()),
        Some("RunContainerError")
    );
}

#[test]
fn crash_loop_waiting_keeps_last_termination_and_pod_running() {
    let p = pod(RestartPolicy::Always, &[], &["a"]);
    let old = ApiPodStatus::pending();
    let mut reasons = ReasonCache::new();
    reasons.insert(
        "a".into(),
        ("CrashLoopBackOff".into(), "back-off 10s".into()),
    );
    let status = runtime_status(vec![rcs("a", "x", CriState::Exited, 5, 1, 2)]);
    let s = status_on_1_26(&p, &old, &reasons, &status);
    let a = s.container("a").expect("a");
    assert_eq!(a.state.reason(), Some("CrashLoopBackOff"));
    assert_eq!(
        a.last_state.as_ref().and_then(ContainerState::exit_code),
        Some(1)
    );
    assert_eq!(s.phase, PodPhase::Running);
}

#[test]
fn terminal_phase_is_sticky() {
    let p = pod(RestartPolicy::Never, &[], &["a"]);
    let mut old = ApiPodStatus::pending();
    old.phase = PodPhase::Succeeded;
    let reasons = ReasonCache::new();
    // Runtime forgot the container (GC'd): getPhase alone would say Pending.
    let s = status_on_1_26(&p, &old, &reasons, &RuntimePodStatus::empty("uid"));
    assert_eq!(s.phase, PodPhase::Succeeded);
}

#[test]
fn deleted_always_pod_phase_by_version() {
    let p = pod(RestartPolicy::Always, &[], &["app", "sidecar"]);
    let status = runtime_status(vec![
        rcs("app", "1", CriState::Exited, 5, 0, 0),
        rcs("sidecar", "2", CriState::Exited, 4, 137, 0),
    ]);
    let old = ApiPodStatus::pending();
    let reasons = ReasonCache::new();
    let mut inp = inputs(&p, &old, &reasons, true, KubeletVersion::V1_26);
    inp.deletion_requested = true;
    assert_eq!(
        generate_api_pod_status(&inp, &status).phase,
        PodPhase::Running,
        "1.26: no terminal branch"
    );
    inp.version = KubeletVersion::V1_27;
    assert_eq!(
        generate_api_pod_status(&inp, &status).phase,
        PodPhase::Failed,
        "1.27: sidecar 137 fails the pod"
    );
}

#[test]
fn terminate_pod_forces_terminal_phase_from_1_27() {
    let mut s = ApiPodStatus::pending();
    s.phase = PodPhase::Running;
    s.container_statuses = vec![running("a")];
    let mut s26 = s.clone();
    terminate_pod_status(&mut s26, KubeletVersion::V1_26);
    assert_eq!(s26.phase, PodPhase::Running);
    assert_eq!(s26.container_statuses[0].state.exit_code(), Some(137));
    terminate_pod_status(&mut s, KubeletVersion::V1_27);
    assert_eq!(s.phase, PodPhase::Failed);
}

#[test]
fn should_restart_rules() {
    let mut p = pod(RestartPolicy::Never, &[], &["a"]);
    let c = p.containers[0].clone();
    let st = |s: CriState, code: i32| runtime_status(vec![rcs("a", "x", s, 1, code, 0)]);
    assert!(should_container_be_restarted(
        &c,
        &p,
        false,
        &RuntimePodStatus::empty("uid")
    ));
    // (policy, deletion requested, state, exit code, restarted). CREATED is restarted even
    // under Never (KUBELET-CRI §1.4).
    let cases = [
        (RestartPolicy::Never, false, CriState::Created, 0, true),
        (RestartPolicy::Never, false, CriState::Exited, 1, false),
        (RestartPolicy::Never, true, CriState::Created, 0, false),
        (RestartPolicy::OnFailure, false, CriState::Exited, 1, true),
        (RestartPolicy::OnFailure, false, CriState::Exited, 0, false),
        (RestartPolicy::Always, false, CriState::Exited, 0, true),
        (RestartPolicy::Always, false, CriState::Running, 0, false),
    ];
    for (policy, deleting, state, code, restarted) in cases {
        p.restart_policy = policy;
        assert_eq!(
            should_container_be_restarted(&c, &p, deleting, &st(state, code)),
            restarted,
            "{policy:?}, deletion requested {deleting}, {state:?} exit {code}"
        );
    }
}
