//! Pod status at two levels, as kubelet keeps them:
//! - [`RuntimePodStatus`]: `kubecontainer.PodStatus`, what `GetPodStatus` read from the CRI;
//! - [`ApiPodStatus`]: `v1.PodStatus`, what the status manager would write to the API server,
//!   computed by `generateAPIPodStatus` / `convertToAPIContainerStatuses` / `getPhase`
//!   (KUBELET-CRI §4.3).

use std::collections::{BTreeMap, HashMap};

use k8s_cri::v1 as cri;

use super::config::KubeletVersion;
use super::pod::{ContainerSpec, PodSpec, RestartPolicy};

/// Label with the container name (KUBELET-CRI §2.2).
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Label with the pod name.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Label with the pod namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label with the pod UID.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Annotation with the container spec hash.
pub const ANNOTATION_HASH: &str = "io.kubernetes.container.hash";
/// Annotation with the restart count.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";

/// `kubecontainer.State` (CRI container state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CriState {
    /// CONTAINER_CREATED
    Created,
    /// CONTAINER_RUNNING
    Running,
    /// CONTAINER_EXITED
    Exited,
    /// CONTAINER_UNKNOWN (or an unknown enum value)
    Unknown,
}

impl CriState {
    /// From the CRI enum value.
    pub fn from_cri(state: i32) -> CriState {
        match cri::ContainerState::try_from(state) {
            Ok(cri::ContainerState::ContainerCreated) => CriState::Created,
            Ok(cri::ContainerState::ContainerRunning) => CriState::Running,
            Ok(cri::ContainerState::ContainerExited) => CriState::Exited,
            _ => CriState::Unknown,
        }
    }
}

/// `kubecontainer.Status`: one container instance as the CRI reported it (`toKubeContainerStatus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeContainerStatus {
    /// Container ID.
    pub id: String,
    /// From the `io.kubernetes.container.name` label.
    pub name: String,
    /// State.
    pub state: CriState,
    /// ns since the epoch.
    pub created_at: i64,
    /// ns since the epoch; 0 while CREATED.
    pub started_at: i64,
    /// ns since the epoch; 0 unless EXITED.
    pub finished_at: i64,
    /// Only meaningful when EXITED.
    pub exit_code: i32,
    /// Only set when EXITED (e.g. `Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Only set when EXITED.
    pub message: String,
    /// Image as the runtime reports it.
    pub image: String,
    /// Image ref.
    pub image_ref: String,
    /// From the hash annotation.
    pub hash: String,
    /// From the restartCount annotation (0 if absent or bad).
    pub restart_count: u32,
    /// All annotations the runtime returned.
    pub annotations: HashMap<String, String>,
}

#[cfg(test)]
impl RuntimeContainerStatus {
    /// A test's container `name` (`id`) of image `img`, in `state` since `created`, with nothing
    /// else set: each test sets what the code under test reads.
    pub(crate) fn fixture(id: &str, name: &str, state: CriState, created: i64) -> Self {
        RuntimeContainerStatus {
            id: id.into(),
            name: name.into(),
            state,
            created_at: created,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: "img".into(),
            image_ref: String::new(),
            hash: String::new(),
            restart_count: 0,
            annotations: Default::default(),
        }
    }
}

impl RuntimeContainerStatus {
    /// `toKubeContainerStatus`: only EXITED containers carry exit code, reason and finish time;
    /// only non-CREATED ones a start time (KUBELET-CRI §4.3).
    pub fn from_cri(s: &cri::ContainerStatus) -> RuntimeContainerStatus {
        let state = CriState::from_cri(s.state);
        let exited = state == CriState::Exited;
        RuntimeContainerStatus {
            id: s.id.clone(),
            name: s
                .labels
                .get(LABEL_CONTAINER_NAME)
                .cloned()
                .unwrap_or_default(),
            state,
            created_at: s.created_at,
            started_at: if state != CriState::Created {
                s.started_at
            } else {
                0
            },
            finished_at: if exited { s.finished_at } else { 0 },
            exit_code: if exited { s.exit_code } else { 0 },
            reason: if exited {
                s.reason.clone()
            } else {
                String::new()
            },
            message: if exited {
                s.message.clone()
            } else {
                String::new()
            },
            image: s
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .unwrap_or_default(),
            image_ref: s.image_ref.clone(),
            hash: s
                .annotations
                .get(ANNOTATION_HASH)
                .cloned()
                .unwrap_or_default(),
            restart_count: s
                .annotations
                .get(ANNOTATION_RESTART_COUNT)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            annotations: s.annotations.clone(),
        }
    }
}

/// `kubecontainer.PodStatus`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimePodStatus {
    /// Pod UID.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// IPs of the newest sandbox, if it is READY.
    pub ips: Vec<String>,
    /// Sandbox statuses, newest first.
    pub sandboxes: Vec<cri::PodSandboxStatus>,
    /// Container statuses, newest first.
    pub containers: Vec<RuntimeContainerStatus>,
}

impl RuntimePodStatus {
    /// What the cache returns for a pod the runtime knows nothing about.
    pub fn empty(uid: &str) -> RuntimePodStatus {
        RuntimePodStatus {
            uid: uid.to_string(),
            ..RuntimePodStatus::default()
        }
    }

    /// `FindContainerStatusByName`: the newest instance with that name.
    pub fn find(&self, name: &str) -> Option<&RuntimeContainerStatus> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Whether any container instance is RUNNING.
    pub fn any_running(&self) -> bool {
        self.containers.iter().any(|c| c.state == CriState::Running)
    }
}

/// `v1.PodPhase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    /// Pending
    Pending,
    /// Running
    Running,
    /// Succeeded
    Succeeded,
    /// Failed
    Failed,
    /// Unknown
    Unknown,
}

impl PodPhase {
    /// Succeeded or Failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// `v1.ContainerState` (one of the three).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContainerState {
    /// Waiting, with kubelet's reason (`ContainerCreating`, `CrashLoopBackOff`, `RunContainerError`, …;
    /// empty for a CREATED container without a recorded start failure).
    Waiting {
        /// Reason.
        reason: String,
        /// Message.
        message: String,
    },
    /// Running.
    Running {
        /// ns since the epoch.
        started_at: i64,
    },
    /// Terminated.
    Terminated {
        /// Exit code.
        exit_code: i32,
        /// Reason.
        reason: String,
        /// Message.
        message: String,
        /// ns since the epoch.
        started_at: i64,
        /// ns since the epoch.
        finished_at: i64,
        /// Container ID (empty for a synthesized termination).
        container_id: String,
    },
}

impl ContainerState {
    fn waiting(reason: &str) -> ContainerState {
        ContainerState::Waiting {
            reason: reason.to_string(),
            message: String::new(),
        }
    }

    /// The state kubelet gives a container it can no longer find when the pod ends: it cannot
    /// know whether the container succeeded.
    fn unknown_at_termination() -> ContainerState {
        ContainerState::Terminated {
            exit_code: 137,
            reason: "ContainerStatusUnknown".into(),
            message: "The container could not be located when the pod was terminated".into(),
            started_at: 0,
            finished_at: 0,
            container_id: String::new(),
        }
    }

    /// Whether Running.
    pub fn is_running(&self) -> bool {
        matches!(self, ContainerState::Running { .. })
    }

    /// Whether Terminated.
    pub fn is_terminated(&self) -> bool {
        matches!(self, ContainerState::Terminated { .. })
    }

    /// Whether Waiting.
    pub fn is_waiting(&self) -> bool {
        matches!(self, ContainerState::Waiting { .. })
    }

    /// The exit code if Terminated.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            ContainerState::Terminated { exit_code, .. } => Some(*exit_code),
            _ => None,
        }
    }

    /// The reason of Waiting/Terminated.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ContainerState::Waiting { reason, .. } | ContainerState::Terminated { reason, .. } => {
                Some(reason)
            }
            ContainerState::Running { .. } => None,
        }
    }
}

/// `v1.ContainerStatus`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStatusView {
    /// Container name.
    pub name: String,
    /// Current state.
    pub state: ContainerState,
    /// `lastState`.
    pub last_state: Option<ContainerState>,
    /// `restartCount`.
    pub restart_count: u32,
    /// `containerID` without the `containerd://` prefix; `None` before the first create.
    pub container_id: Option<String>,
    /// Image.
    pub image: String,
    /// Image ref.
    pub image_id: String,
}

/// `v1.PodStatus` (modelled subset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiPodStatus {
    /// Phase.
    pub phase: PodPhase,
    /// Init container statuses, in spec order.
    pub init_container_statuses: Vec<ContainerStatusView>,
    /// Container statuses, in spec order (the API sorts by name; spec order is handier in tests).
    pub container_statuses: Vec<ContainerStatusView>,
    /// Pod IPs (empty for host-network pods here; kubelet would report the host IP).
    pub pod_ips: Vec<String>,
}

impl ApiPodStatus {
    /// The status of a pod kubelet has not synced yet.
    pub fn pending() -> ApiPodStatus {
        ApiPodStatus {
            phase: PodPhase::Pending,
            init_container_statuses: Vec::new(),
            container_statuses: Vec::new(),
            pod_ips: Vec::new(),
        }
    }

    /// A regular or init container's status by name.
    pub fn container(&self, name: &str) -> Option<&ContainerStatusView> {
        self.container_statuses
            .iter()
            .chain(&self.init_container_statuses)
            .find(|c| c.name == name)
    }
}

/// A start failure remembered by `reasonCache` (reason, message).
pub type ReasonCache = BTreeMap<String, (String, String)>;

/// `ShouldContainerBeRestarted` (KUBELET-CRI §1.4, §4.3).
pub fn should_container_be_restarted(
    container: &ContainerSpec,
    pod: &PodSpec,
    deletion_requested: bool,
    status: &RuntimePodStatus,
) -> bool {
    // Once a pod has been marked deleted, it should not be restarted.
    if deletion_requested {
        return false;
    }
    let Some(s) = status.find(&container.name) else {
        return true;
    };
    match s.state {
        CriState::Running => false,
        // Always restart containers in the unknown or created state, whatever the policy.
        CriState::Unknown | CriState::Created => true,
        CriState::Exited => match pod.restart_policy {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => s.exit_code != 0,
            RestartPolicy::Always => true,
        },
    }
}

/// Input to [`generate_api_pod_status`] beyond the runtime status.
pub struct StatusInputs<'a> {
    /// The pod.
    pub pod: &'a PodSpec,
    /// Whether deletion was requested (the pod has a DeletionTimestamp).
    pub deletion_requested: bool,
    /// The status manager's previous status for this pod.
    pub old: &'a ApiPodStatus,
    /// Start failures of the last sync.
    pub reasons: &'a ReasonCache,
    /// 1.27's `podIsTerminal` argument; ignored before 1.27.
    pub pod_is_terminal: bool,
    /// Version semantics.
    pub version: KubeletVersion,
}

/// `generateAPIPodStatus`: container statuses, phase, and the terminal-phase stickiness of the
/// three-way merge (a Succeeded/Failed phase is never left again).
pub fn generate_api_pod_status(inp: &StatusInputs<'_>, status: &RuntimePodStatus) -> ApiPodStatus {
    let has_init = !inp.pod.init_containers.is_empty();
    let container_statuses = convert_to_api_container_statuses(
        inp,
        status,
        &inp.old.container_statuses,
        &inp.pod.containers,
        has_init,
        false,
    );
    let init_container_statuses = convert_to_api_container_statuses(
        inp,
        status,
        &inp.old.init_container_statuses,
        &inp.pod.init_containers,
        has_init,
        true,
    );
    let mut phase = get_phase(
        inp.pod,
        &init_container_statuses,
        &container_statuses,
        inp.pod_is_terminal && inp.version >= KubeletVersion::V1_27,
    );
    if !phase.is_terminal() && inp.old.phase.is_terminal() {
        phase = inp.old.phase;
    }
    ApiPodStatus {
        phase,
        init_container_statuses,
        container_statuses,
        pod_ips: status.ips.clone(),
    }
}

/// `convertToAPIContainerStatuses` (kubelet_pods.go), for regular or init containers.
fn convert_to_api_container_statuses(
    inp: &StatusInputs<'_>,
    status: &RuntimePodStatus,
    previous: &[ContainerStatusView],
    containers: &[ContainerSpec],
    has_init: bool,
    is_init: bool,
) -> Vec<ContainerStatusView> {
    let old: HashMap<&str, &ContainerStatusView> =
        previous.iter().map(|s| (s.name.as_str(), s)).collect();
    let default_reason = if has_init {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };

    // Every container starts in the default waiting state, seeded from its old status.
    let mut statuses: BTreeMap<&str, ContainerStatusView> = BTreeMap::new();
    for c in containers {
        let mut s = ContainerStatusView {
            name: c.name.clone(),
            state: ContainerState::waiting(default_reason),
            last_state: None,
            restart_count: 0,
            container_id: None,
            image: c.image.clone(),
            image_id: String::new(),
        };
        if let Some(o) = old.get(c.name.as_str()) {
            if o.state.is_terminated() {
                s = (*o).clone();
            } else {
                s.restart_count = o.restart_count;
                s.last_state = o.last_state.clone();
            }
        }
        statuses.insert(c.name.as_str(), s);
    }

    // A container that was Running and has vanished from the runtime is shown as stopped.
    for c in containers {
        if status.containers.iter().any(|s| s.name == c.name) {
            continue;
        }
        let Some(o) = old.get(c.name.as_str()) else {
            continue;
        };
        if o.state.is_terminated() || !o.state.is_running() {
            continue;
        }
        let Some(s) = statuses.get_mut(c.name.as_str()) else {
            continue;
        };
        let is_default =
            matches!(&s.state, ContainerState::Waiting { reason, .. } if reason == default_reason);
        if !is_default || matches!(s.last_state, Some(ContainerState::Terminated { .. })) {
            continue;
        }
        s.last_state = Some(ContainerState::Terminated {
            exit_code: 137,
            reason: "ContainerStatusUnknown".into(),
            message: "The container could not be located when the pod was deleted.  The container used to be Running".into(),
            started_at: 0,
            finished_at: 0,
            container_id: String::new(),
        });
        if !inp.deletion_requested {
            s.restart_count += 1;
        }
    }

    // The newest instance is the state, the one before it the last state (statuses are newest first).
    let mut seen: HashMap<&str, u32> = HashMap::new();
    for cs in &status.containers {
        let Some(slot) = statuses.get_mut(cs.name.as_str()) else {
            continue;
        };
        let n = seen.entry(cs.name.as_str()).or_insert(0);
        if *n >= 2 {
            continue;
        }
        let converted = convert_container_status(cs, old.get(cs.name.as_str()).copied());
        if *n == 0 {
            *slot = converted;
        } else {
            slot.last_state = Some(converted.state);
        }
        *n += 1;
    }

    // Containers that the next sync will (re)start are Waiting, with the reason of the last failure.
    for c in containers {
        if is_init {
            if let Some(s) = status.find(&c.name) {
                if s.state == CriState::Exited && s.exit_code == 0 {
                    continue;
                }
            }
        }
        if !should_container_be_restarted(c, inp.pod, inp.deletion_requested, status) {
            continue;
        }
        let Some((reason, message)) = inp.reasons.get(&c.name) else {
            continue;
        };
        let Some(s) = statuses.get_mut(c.name.as_str()) else {
            continue;
        };
        if s.state.is_terminated() {
            s.last_state = Some(s.state.clone());
        }
        s.state = ContainerState::Waiting {
            reason: reason.clone(),
            message: message.clone(),
        };
    }

    containers
        .iter()
        .filter_map(|c| statuses.remove(c.name.as_str()))
        .collect()
}

fn convert_container_status(
    cs: &RuntimeContainerStatus,
    old: Option<&ContainerStatusView>,
) -> ContainerStatusView {
    let mut s = ContainerStatusView {
        name: cs.name.clone(),
        state: ContainerState::waiting(""),
        last_state: None,
        restart_count: cs.restart_count,
        container_id: Some(cs.id.clone()),
        image: cs.image.clone(),
        image_id: cs.image_ref.clone(),
    };
    s.state = match cs.state {
        CriState::Running => ContainerState::Running {
            started_at: cs.started_at,
        },
        // Created but not running: "waiting to be running", no reason.
        CriState::Created => ContainerState::waiting(""),
        CriState::Exited => ContainerState::Terminated {
            exit_code: cs.exit_code,
            reason: cs.reason.clone(),
            message: cs.message.clone(),
            started_at: cs.started_at,
            finished_at: cs.finished_at,
            container_id: cs.id.clone(),
        },
        CriState::Unknown => match old {
            Some(o) if o.state.is_running() => {
                s.restart_count = o.restart_count + 1;
                ContainerState::unknown_at_termination()
            }
            _ => ContainerState::waiting(""),
        },
    };
    s
}

/// What `getPhase` looks at in one container's status; both of its loops (init containers,
/// then regular ones) ask the same questions of it.
enum Seen {
    /// No status yet.
    Missing,
    Running,
    /// Terminated with this exit code.
    Terminated(i32),
    /// Waiting (to be restarted) after a run that exited with this code.
    WaitingAfterExit(i32),
    /// Waiting, never run.
    Waiting,
}

fn phase_input(list: &[ContainerStatusView], name: &str) -> Seen {
    let Some(s) = list.iter().find(|s| s.name == name) else {
        return Seen::Missing;
    };
    match (&s.state, &s.last_state) {
        (ContainerState::Running { .. }, _) => Seen::Running,
        (ContainerState::Terminated { exit_code, .. }, _) => Seen::Terminated(*exit_code),
        (ContainerState::Waiting { .. }, Some(ContainerState::Terminated { exit_code, .. })) => {
            Seen::WaitingAfterExit(*exit_code)
        }
        (ContainerState::Waiting { .. }, _) => Seen::Waiting,
    }
}

/// `getPhase` (kubelet_pods.go; KUBELET-CRI §4.3). `pod_is_terminal` is 1.27's extra branch: after
/// termination, all containers stopped → Succeeded if every exit code is 0, else Failed, whatever
/// the restart policy. Pass `false` to get 1.23/1.26 behaviour.
pub fn get_phase(
    pod: &PodSpec,
    init: &[ContainerStatusView],
    regular: &[ContainerStatusView],
    pod_is_terminal: bool,
) -> PodPhase {
    let mut pending_initialization = 0;
    let mut failed_initialization = 0;
    for c in &pod.init_containers {
        match phase_input(init, &c.name) {
            Seen::Missing | Seen::Running | Seen::Waiting => pending_initialization += 1,
            Seen::Terminated(code) | Seen::WaitingAfterExit(code) => {
                if code != 0 {
                    failed_initialization += 1;
                }
            }
        }
    }

    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in &pod.containers {
        match phase_input(regular, &c.name) {
            Seen::Missing => unknown += 1,
            Seen::Running => running += 1,
            Seen::Terminated(code) => {
                stopped += 1;
                if code == 0 {
                    succeeded += 1;
                }
            }
            Seen::WaitingAfterExit(_) => stopped += 1,
            Seen::Waiting => waiting += 1,
        }
    }

    if failed_initialization > 0 && pod.restart_policy == RestartPolicy::Never {
        return PodPhase::Failed;
    }
    if pending_initialization > 0 || waiting > 0 {
        // One or more containers has not been started.
        return PodPhase::Pending;
    }
    if running > 0 && unknown == 0 {
        // All containers have been started, and at least one is running.
        return PodPhase::Running;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        // 1.27: the pod is terminal, so its containers won't be restarted regardless of policy.
        if pod_is_terminal {
            return if stopped == succeeded {
                PodPhase::Succeeded
            } else {
                PodPhase::Failed
            };
        }
        if pod.restart_policy == RestartPolicy::Always {
            // All containers are in the process of restarting.
            return PodPhase::Running;
        }
        if stopped == succeeded {
            return PodPhase::Succeeded;
        }
        if pod.restart_policy == RestartPolicy::Never {
            return PodPhase::Failed;
        }
        // OnFailure with at least one failure: restarting.
        return PodPhase::Running;
    }
    PodPhase::Pending
}

/// The status manager's `TerminatePod`: containers without a terminated state get a synthetic
/// one (kubelet cannot know whether they succeeded), and from 1.27 a non-terminal phase becomes
/// Failed.
pub fn terminate_pod_status(status: &mut ApiPodStatus, version: KubeletVersion) {
    for s in status
        .container_statuses
        .iter_mut()
        .chain(status.init_container_statuses.iter_mut())
    {
        if !s.state.is_terminated() {
            s.state = ContainerState::unknown_at_termination();
        }
    }
    if version >= KubeletVersion::V1_27 && !status.phase.is_terminal() {
        status.phase = PodPhase::Failed;
    }
}

#[cfg(test)]
mod tests;
