//! Unit tests of the runtime manager's pure parts: `computePodActions`, error texts, helpers.

use super::*;

#[test]
fn go_durations() {
    assert_eq!(go_duration(Duration::from_secs(10)), "10s");
    assert_eq!(go_duration(Duration::from_secs(80)), "1m20s");
    assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
    assert_eq!(go_duration(Duration::from_millis(500)), "500ms");
}

#[test]
fn default_tag() {
    assert_eq!(apply_default_image_tag("busybox"), "busybox:latest");
    assert_eq!(
        apply_default_image_tag("reg:5000/busybox"),
        "reg:5000/busybox:latest"
    );
    assert_eq!(
        apply_default_image_tag("crisp.test/busybox:latest"),
        "crisp.test/busybox:latest"
    );
    assert_eq!(apply_default_image_tag("a/b@sha256:00"), "a/b@sha256:00");
}

#[test]
fn aggregate_like_k8s() {
    assert_eq!(aggregate(vec![]), None);
    assert_eq!(aggregate(vec!["a".into()]).as_deref(), Some("a"));
    assert_eq!(
        aggregate(vec!["a".into(), "b".into(), "a".into()]).as_deref(),
        Some("[a, b]")
    );
}

#[test]
fn sync_error_text() {
    let mut r = PodSyncResult::default();
    r.add(SyncResult::new(SyncAction::ConfigPodSandbox, "sb"));
    let mut s = SyncResult::new(SyncAction::StartContainer, "app");
    s.fail(ERR_RUN_CONTAINER, "boom");
    r.add(s);
    assert_eq!(
        r.error().as_deref(),
        Some(r#"failed to "StartContainer" for "app" with RunContainerError: "boom""#)
    );
}

// --- computePodActions (KUBELET-CRI §1.1, §1.4, §4.3) ---

fn ctx(policy: RestartPolicy, init: &[&str], containers: &[&str]) -> PodCtx {
    let mut p = PodSpec::of_true(policy, init, containers);
    p.host_network = true;
    PodCtx {
        spec: Arc::new(p),
        deletion_requested: false,
        deletion_grace: None,
        termination_requested: Arc::new(AtomicBool::new(false)),
        restored: false,
    }
}

fn sandbox(id: &str, ready: bool, attempt: u32, created: i64) -> cri::PodSandboxStatus {
    cri::PodSandboxStatus {
        id: id.into(),
        metadata: Some(cri::PodSandboxMetadata {
            name: "p".into(),
            uid: "uid".into(),
            namespace: "default".into(),
            attempt,
        }),
        state: if ready { 0 } else { 1 },
        created_at: created,
        linux: Some(cri::LinuxPodSandboxStatus {
            namespaces: Some(cri::Namespace {
                options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
            }),
        }),
        ..Default::default()
    }
}

fn cs(
    pod: &PodCtx,
    name: &str,
    id: &str,
    state: CriState,
    created: i64,
    exit: i32,
) -> RuntimeContainerStatus {
    RuntimeContainerStatus {
        started_at: created,
        finished_at: created + 1,
        exit_code: exit,
        image_ref: "ref".into(),
        hash: pod
            .spec
            .container(name)
            .map(|c| c.hash())
            .unwrap_or_default(),
        ..RuntimeContainerStatus::fixture(id, name, state, created)
    }
}

fn status(
    sandboxes: Vec<cri::PodSandboxStatus>,
    containers: Vec<RuntimeContainerStatus>,
) -> RuntimePodStatus {
    RuntimePodStatus {
        uid: "uid".into(),
        sandboxes,
        containers,
        ..RuntimePodStatus::default()
    }
}

#[test]
fn new_pod_creates_sandbox_and_starts_all_in_order() {
    let p = ctx(RestartPolicy::Always, &[], &["a", "b", "c"]);
    let a = compute_pod_actions(&p, &RuntimePodStatus::empty("uid"));
    assert!(a.create_sandbox && a.kill_pod);
    assert_eq!(a.attempt, 0);
    assert_eq!(a.containers_to_start, vec![0, 1, 2]);
}

#[test]
fn new_pod_with_init_containers_starts_only_the_first_init() {
    let p = ctx(RestartPolicy::Always, &["i1", "i2"], &["a"]);
    let a = compute_pod_actions(&p, &RuntimePodStatus::empty("uid"));
    assert_eq!(a.next_init_container, Some(0));
    assert!(a.containers_to_start.is_empty());

    // i1 exited 0 → i2 next; i2 running → nothing; i2 exited 0 → regular containers.
    let sb = || vec![sandbox("s", true, 0, 1)];
    let s = status(sb(), vec![cs(&p, "i1", "x1", CriState::Exited, 2, 0)]);
    assert_eq!(compute_pod_actions(&p, &s).next_init_container, Some(1));
    let s = status(
        sb(),
        vec![
            cs(&p, "i2", "x2", CriState::Running, 3, 0),
            cs(&p, "i1", "x1", CriState::Exited, 2, 0),
        ],
    );
    let a = compute_pod_actions(&p, &s);
    assert_eq!(
        (a.next_init_container, a.containers_to_start.len()),
        (None, 0)
    );
    let s = status(
        sb(),
        vec![
            cs(&p, "i2", "x2", CriState::Exited, 3, 0),
            cs(&p, "i1", "x1", CriState::Exited, 2, 0),
        ],
    );
    assert_eq!(compute_pod_actions(&p, &s).containers_to_start, vec![0]);
}

#[test]
fn failed_init_container_kills_a_never_pod_and_retries_otherwise() {
    let sb = || vec![sandbox("s", true, 0, 1)];
    let never = ctx(RestartPolicy::Never, &["i"], &["a"]);
    let s = status(sb(), vec![cs(&never, "i", "x", CriState::Exited, 2, 1)]);
    assert!(compute_pod_actions(&never, &s).kill_pod);
    let always = ctx(RestartPolicy::Always, &["i"], &["a"]);
    let s = status(sb(), vec![cs(&always, "i", "x", CriState::Exited, 2, 1)]);
    let a = compute_pod_actions(&always, &s);
    assert!(!a.kill_pod);
    assert_eq!(a.next_init_container, Some(0));
}

#[test]
fn created_container_is_restarted_without_kill_unknown_is_killed_first() {
    let p = ctx(RestartPolicy::Never, &[], &["a", "b"]);
    let s = status(
        vec![sandbox("s", true, 0, 1)],
        vec![
            cs(&p, "a", "ca", CriState::Created, 2, 0),
            cs(&p, "b", "cb", CriState::Unknown, 3, 0),
        ],
    );
    let a = compute_pod_actions(&p, &s);
    assert_eq!(
        a.containers_to_start,
        vec![0, 1],
        "CREATED and UNKNOWN restart even under Never"
    );
    assert_eq!(a.containers_to_kill.len(), 1);
    assert_eq!(
        a.containers_to_kill[0].0, "cb",
        "only the UNKNOWN one is killed"
    );
    assert!(!a.kill_pod);
}

#[test]
fn not_ready_sandbox_is_recreated_with_next_attempt() {
    let p = ctx(RestartPolicy::Always, &[], &["a"]);
    let s = status(
        vec![sandbox("s", false, 2, 1)],
        vec![cs(&p, "a", "ca", CriState::Exited, 2, 0)],
    );
    let a = compute_pod_actions(&p, &s);
    assert!(a.create_sandbox && a.kill_pod);
    assert_eq!((a.attempt, a.sandbox_id.as_str()), (3, "s"));
    assert_eq!(a.containers_to_start, vec![0]);
    // Never pod that already ran: no new sandbox.
    let n = ctx(RestartPolicy::Never, &[], &["a"]);
    let a = compute_pod_actions(
        &n,
        &status(
            vec![sandbox("s", false, 0, 1)],
            vec![cs(&n, "a", "ca", CriState::Exited, 2, 0)],
        ),
    );
    assert!(!a.create_sandbox, "{a:?}");
}

#[test]
fn everything_exited_under_never_kills_the_pod() {
    let p = ctx(RestartPolicy::Never, &[], &["a", "b"]);
    let s = status(
        vec![sandbox("s", true, 0, 1)],
        vec![
            cs(&p, "a", "ca", CriState::Exited, 2, 0),
            cs(&p, "b", "cb", CriState::Exited, 3, 1),
        ],
    );
    let a = compute_pod_actions(&p, &s);
    assert!(a.kill_pod && !a.create_sandbox);
    assert!(a.containers_to_start.is_empty());
    // With one still running: keep it, nothing to do.
    let s = status(
        vec![sandbox("s", true, 0, 1)],
        vec![
            cs(&p, "a", "ca", CriState::Exited, 2, 0),
            cs(&p, "b", "cb", CriState::Running, 3, 0),
        ],
    );
    assert_eq!(
        compute_pod_actions(&p, &s),
        PodActions {
            sandbox_id: "s".into(),
            ..PodActions::default()
        }
    );
}

#[test]
fn on_failure_restarts_only_failed_containers() {
    let p = ctx(RestartPolicy::OnFailure, &[], &["a", "b"]);
    let s = status(
        vec![sandbox("s", true, 0, 1)],
        vec![
            cs(&p, "a", "ca", CriState::Exited, 2, 0),
            cs(&p, "b", "cb", CriState::Exited, 3, 2),
        ],
    );
    assert_eq!(compute_pod_actions(&p, &s).containers_to_start, vec![1]);
}

#[test]
fn deleted_pod_starts_nothing() {
    let mut p = ctx(RestartPolicy::Always, &[], &["a"]);
    p.deletion_requested = true;
    let s = status(
        vec![sandbox("s", true, 0, 1)],
        vec![cs(&p, "a", "ca", CriState::Exited, 2, 0)],
    );
    let a = compute_pod_actions(&p, &s);
    assert!(a.containers_to_start.is_empty());
    assert!(a.kill_pod);
}
