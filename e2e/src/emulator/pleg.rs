//! The generic PLEG (`pleg/generic.go`): relist, diff, inspect changed pods into the cache, and
//! emit `ContainerStarted` / `ContainerDied` events (KUBELET-CRI §4.1).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use super::runtime::RunningPod;
use super::status::CriState;

/// `plegContainerState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlegState {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

/// `PodLifeCycleEventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlegEventType {
    /// A container (or sandbox) became running.
    ContainerStarted,
    /// A container (or sandbox) exited or vanished while not exited.
    ContainerDied,
    /// Gone after having been reported dead.
    ContainerRemoved,
    /// CREATED/UNKNOWN: refreshes the cache only, never dispatched.
    ContainerChanged,
}

/// `PodLifecycleEvent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlegEvent {
    /// Pod UID.
    pub uid: String,
    /// Event type.
    pub kind: PlegEventType,
    /// Container or sandbox ID.
    pub id: String,
}

#[derive(Default)]
struct PodRecord {
    old: Option<RunningPod>,
    current: Option<RunningPod>,
}

/// The PLEG's memory between relists.
#[derive(Default)]
pub struct Pleg {
    records: BTreeMap<String, PodRecord>,
    /// Pods whose inspection failed; retried on the next relist.
    to_reinspect: BTreeMap<String, RunningPod>,
}

/// `convertState`: CREATED counts as unknown; sandboxes READY → running, NOTREADY → exited.
fn states(pod: Option<&RunningPod>) -> HashMap<String, PlegState> {
    let mut m = HashMap::new();
    let Some(p) = pod else { return m };
    for (id, _, st) in &p.containers {
        let s = match st {
            CriState::Running => PlegState::Running,
            CriState::Exited => PlegState::Exited,
            CriState::Created | CriState::Unknown => PlegState::Unknown,
        };
        m.insert(id.clone(), s);
    }
    for (id, ready) in &p.sandboxes {
        m.insert(
            id.clone(),
            if *ready {
                PlegState::Running
            } else {
                PlegState::Exited
            },
        );
    }
    m
}

/// `generateEvents`.
fn generate_events(uid: &str, id: &str, old: PlegState, new: PlegState) -> Vec<PlegEvent> {
    if old == new {
        return Vec::new();
    }
    let ev = |kind| PlegEvent {
        uid: uid.to_string(),
        kind,
        id: id.to_string(),
    };
    match new {
        PlegState::Running => vec![ev(PlegEventType::ContainerStarted)],
        PlegState::Exited => vec![ev(PlegEventType::ContainerDied)],
        PlegState::Unknown => vec![ev(PlegEventType::ContainerChanged)],
        PlegState::NonExistent => match old {
            PlegState::Exited => vec![ev(PlegEventType::ContainerRemoved)],
            _ => vec![
                ev(PlegEventType::ContainerDied),
                ev(PlegEventType::ContainerRemoved),
            ],
        },
    }
}

/// What one relist wants done: inspect these pods (uid → pod, `None` = gone), then emit events.
pub struct RelistPlan {
    /// Pods with events, in UID order, with their events.
    pub changed: Vec<(String, Option<RunningPod>, Vec<PlegEvent>)>,
    /// Pods to re-inspect because their last inspection failed.
    pub reinspect: Vec<(String, RunningPod)>,
    /// The relist's start time (for `UpdateTime`).
    pub timestamp: Instant,
}

// === impl Pleg ===

impl Pleg {
    /// `setCurrent` + `computeEvents` for every pod: the first half of `Relist`.
    pub fn plan(&mut self, pods: Vec<RunningPod>, timestamp: Instant) -> RelistPlan {
        for r in self.records.values_mut() {
            r.current = None;
        }
        for p in pods {
            let uid = p.uid.clone();
            self.records.entry(uid).or_default().current = Some(p);
        }
        let mut changed = Vec::new();
        for (uid, r) in &self.records {
            let old = states(r.old.as_ref());
            let new = states(r.current.as_ref());
            let ids: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            let mut events = Vec::new();
            for id in ids {
                let o = old.get(id).copied().unwrap_or(PlegState::NonExistent);
                let n = new.get(id).copied().unwrap_or(PlegState::NonExistent);
                events.extend(generate_events(uid, id, o, n));
            }
            if !events.is_empty() {
                changed.push((uid.clone(), r.current.clone(), events));
            }
        }
        let reinspect = self
            .to_reinspect
            .iter()
            .filter(|(uid, _)| !changed.iter().any(|(u, _, _)| u == *uid))
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect();
        RelistPlan {
            changed,
            reinspect,
            timestamp,
        }
    }

    /// `podRecords.update`: the pod was inspected; its current state becomes the old one.
    pub fn update(&mut self, uid: &str) {
        let Some(r) = self.records.get_mut(uid) else {
            return;
        };
        match r.current.take() {
            None => {
                self.records.remove(uid);
            }
            Some(c) => r.old = Some(c),
        }
        self.to_reinspect.remove(uid);
    }

    /// The inspection of `uid` failed: keep its old record so the change is seen again, and
    /// re-inspect it on the next relist.
    pub fn inspection_failed(&mut self, uid: &str, pod: RunningPod) {
        self.to_reinspect.insert(uid.to_string(), pod);
    }

    /// A re-inspection succeeded.
    pub fn reinspected(&mut self, uid: &str) {
        self.to_reinspect.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: &[(&str, CriState)], sandboxes: &[(&str, bool)]) -> RunningPod {
        RunningPod {
            uid: "u".into(),
            name: "p".into(),
            namespace: "ns".into(),
            containers: containers
                .iter()
                .map(|(i, s)| (i.to_string(), "c".to_string(), *s))
                .collect(),
            sandboxes: sandboxes.iter().map(|(i, r)| (i.to_string(), *r)).collect(),
        }
    }

    fn kinds(plan: &RelistPlan) -> Vec<(String, PlegEventType)> {
        plan.changed
            .iter()
            .flat_map(|(_, _, evs)| evs.iter().map(|e| (e.id.clone(), e.kind)))
            .collect()
    }

    #[test]
    fn created_is_changed_running_is_started_exited_is_died() {
        let mut p = Pleg::default();
        let t = Instant::now();
        let plan = p.plan(vec![pod(&[("c1", CriState::Created)], &[("s", true)])], t);
        assert_eq!(
            kinds(&plan),
            vec![
                ("c1".into(), PlegEventType::ContainerChanged),
                ("s".into(), PlegEventType::ContainerStarted)
            ]
        );
        p.update("u");
        let plan = p.plan(vec![pod(&[("c1", CriState::Running)], &[("s", true)])], t);
        assert_eq!(
            kinds(&plan),
            vec![("c1".into(), PlegEventType::ContainerStarted)]
        );
        p.update("u");
        let plan = p.plan(vec![pod(&[("c1", CriState::Exited)], &[("s", true)])], t);
        assert_eq!(
            kinds(&plan),
            vec![("c1".into(), PlegEventType::ContainerDied)]
        );
        p.update("u");
        let plan = p.plan(vec![], t);
        assert_eq!(
            kinds(&plan),
            vec![
                ("c1".into(), PlegEventType::ContainerRemoved),
                ("s".into(), PlegEventType::ContainerDied),
                ("s".into(), PlegEventType::ContainerRemoved)
            ]
        );
        assert!(plan.changed[0].1.is_none(), "pod gone → cache delete");
    }

    #[test]
    fn failed_inspection_repeats_events() {
        let mut p = Pleg::default();
        let t = Instant::now();
        let plan = p.plan(vec![pod(&[("c1", CriState::Running)], &[])], t);
        assert_eq!(plan.changed.len(), 1);
        p.inspection_failed("u", pod(&[("c1", CriState::Running)], &[]));
        let plan = p.plan(vec![pod(&[("c1", CriState::Running)], &[])], t);
        assert_eq!(
            kinds(&plan),
            vec![("c1".into(), PlegEventType::ContainerStarted)]
        );
    }
}
