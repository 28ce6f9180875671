//! The call journal: every CRI call the emulator sends, with timing, attribution and result.
//!
//! Tests assert kubelet-visible ordering from it (e.g. "postStart's ExecSync returned before the
//! next container's CreateContainer was sent"), the binary prints it as a timeline.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{broadcast, watch};

/// Who a call was made for; filled by the caller, shown in the journal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallMeta {
    /// `namespace/name` of the pod.
    pub pod: Option<String>,
    /// Pod UID.
    pub pod_uid: Option<String>,
    /// Container name (for container calls).
    pub container: Option<String>,
    /// Container ID the call targets, or the one CreateContainer returned.
    pub container_id: Option<String>,
    /// Sandbox ID the call targets, or the one RunPodSandbox returned.
    pub sandbox_id: Option<String>,
    /// Free-form request detail, e.g. `timeout=30` or `attempt=1`.
    pub detail: Option<String>,
}

impl CallMeta {
    /// Meta for a pod-level call.
    pub fn pod(namespace: &str, name: &str, uid: &str) -> CallMeta {
        CallMeta {
            pod: Some(format!("{namespace}/{name}")),
            pod_uid: Some(uid.to_string()),
            ..CallMeta::default()
        }
    }

    /// The same meta with a container name.
    pub fn with_container(mut self, name: &str) -> CallMeta {
        self.container = Some(name.to_string());
        self
    }

    /// The same meta with a container ID.
    pub fn with_container_id(mut self, id: &str) -> CallMeta {
        self.container_id = Some(id.to_string());
        self
    }

    /// The same meta with a sandbox ID.
    pub fn with_sandbox_id(mut self, id: &str) -> CallMeta {
        self.sandbox_id = Some(id.to_string());
        self
    }

    /// The same meta with a request detail.
    pub fn with_detail(mut self, detail: impl Into<String>) -> CallMeta {
        self.detail = Some(detail.into());
        self
    }
}

/// One CRI call.
#[derive(Clone, Debug)]
pub struct CallRecord {
    /// Order in which calls were *sent* (0-based).
    pub seq: u64,
    /// Method name without the service, e.g. `CreateContainer`.
    pub method: &'static str,
    /// Full gRPC path, e.g. `/runtime.v1.RuntimeService/CreateContainer`.
    pub path: String,
    /// Attribution.
    pub meta: CallMeta,
    /// The deadline kubelet would set (sent as `grpc-timeout`); `None` = no deadline.
    pub deadline: Option<Duration>,
    /// Monotonic time the call was sent.
    pub sent: Instant,
    /// Wall-clock time the call was sent.
    pub sent_wall: SystemTime,
    /// Monotonic time the call returned; `None` while in flight.
    pub done: Option<Instant>,
    /// gRPC status code; `Ok` on success. Meaningless while in flight.
    pub code: tonic::Code,
    /// gRPC status message (empty on success).
    pub message: String,
}

impl CallRecord {
    /// Whether the call has returned.
    pub fn is_done(&self) -> bool {
        self.done.is_some()
    }

    /// Whether it returned OK.
    pub fn is_ok(&self) -> bool {
        self.is_done() && self.code == tonic::Code::Ok
    }

    /// Wall-clock time the call returned (derived from the monotonic times).
    pub fn done_wall(&self) -> Option<SystemTime> {
        self.done
            .map(|d| self.sent_wall + d.saturating_duration_since(self.sent))
    }

    /// How long it took (so far, if still in flight).
    pub fn elapsed(&self) -> Duration {
        self.done
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(self.sent)
    }

    /// The periodic read-only calls kubelet makes (PLEG relist, GetPodStatus, runtime status,
    /// handshake): more than 95 % of the traffic, hidden from the default timeline. ImageStatus is
    /// not one of them: kubelet sends it only on the start path.
    pub fn is_polling(&self) -> bool {
        matches!(
            self.method,
            "Version"
                | "Status"
                | "ListPodSandbox"
                | "ListContainers"
                | "PodSandboxStatus"
                | "ContainerStatus"
                | "ListImages"
                | "ImageFsInfo"
        )
    }

    /// Whether this call is `method` for container `container`.
    pub fn is(&self, method: &str, container: &str) -> bool {
        self.method == method && self.meta.container.as_deref() == Some(container)
    }
}

/// A journal event, for live consumers such as the binary's timeline.
#[derive(Clone, Debug)]
pub enum JournalEvent {
    /// A call was sent.
    Sent(CallRecord),
    /// A call returned.
    Done(CallRecord),
    /// A kubelet-level note (phase change, sync error, …) for the timeline.
    Note {
        at: Instant,
        pod: Option<String>,
        text: String,
    },
}

/// Shared, append-only journal. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<JournalInner>,
}

struct JournalInner {
    start: Instant,
    start_wall: SystemTime,
    state: Mutex<JournalState>,
    events: broadcast::Sender<JournalEvent>,
    /// Bumped on every change, so waiters can re-check their predicate.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct JournalState {
    next_seq: u64,
    /// Every call by seq; in-flight ones have `done == None`.
    calls: BTreeMap<u64, CallRecord>,
}

impl fmt::Debug for Journal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journal")
            .field("calls", &self.lock().calls.len())
            .finish()
    }
}

impl Default for Journal {
    fn default() -> Self {
        Self::new()
    }
}

// === impl Journal ===

impl Journal {
    /// An empty journal; relative times count from now.
    pub fn new() -> Journal {
        let (events, _) = broadcast::channel(4096);
        let (changed, _) = watch::channel(0);
        Journal {
            inner: Arc::new(JournalInner {
                start: Instant::now(),
                start_wall: SystemTime::now(),
                state: Mutex::new(JournalState::default()),
                events,
                changed,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, JournalState> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Monotonic time zero of the journal.
    pub fn start(&self) -> Instant {
        self.inner.start
    }

    /// Wall-clock time zero of the journal.
    pub fn start_wall(&self) -> SystemTime {
        self.inner.start_wall
    }

    /// Milliseconds from the journal's start to `t`.
    pub fn rel_ms(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.inner.start).as_secs_f64() * 1e3
    }

    /// Live events (calls sent/done, notes). Lagging receivers lose the oldest events.
    pub fn subscribe(&self) -> broadcast::Receiver<JournalEvent> {
        self.inner.events.subscribe()
    }

    pub(crate) fn begin(
        &self,
        method: &'static str,
        path: String,
        meta: CallMeta,
        deadline: Option<Duration>,
    ) -> u64 {
        let rec = {
            let mut st = self.lock();
            let seq = st.next_seq;
            st.next_seq += 1;
            let rec = CallRecord {
                seq,
                method,
                path,
                meta,
                deadline,
                sent: Instant::now(),
                sent_wall: SystemTime::now(),
                done: None,
                code: tonic::Code::Ok,
                message: String::new(),
            };
            st.calls.insert(seq, rec.clone());
            rec
        };
        let seq = rec.seq;
        let _ = self.inner.events.send(JournalEvent::Sent(rec));
        self.inner.changed.send_modify(|n| *n += 1);
        seq
    }

    pub(crate) fn finish(
        &self,
        seq: u64,
        code: tonic::Code,
        message: String,
        update: impl FnOnce(&mut CallMeta),
    ) {
        let rec = {
            let mut st = self.lock();
            let Some(rec) = st.calls.get_mut(&seq) else {
                return;
            };
            rec.done = Some(Instant::now());
            rec.code = code;
            rec.message = message;
            update(&mut rec.meta);
            rec.clone()
        };
        let _ = self.inner.events.send(JournalEvent::Done(rec));
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// Adds a kubelet-level note to the live event stream (not to the call list).
    pub fn note(&self, pod: Option<String>, text: impl Into<String>) {
        let _ = self.inner.events.send(JournalEvent::Note {
            at: Instant::now(),
            pod,
            text: text.into(),
        });
    }

    /// All calls so far (in flight included), in send order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.lock().calls.values().cloned().collect()
    }

    /// Calls matching `pred`, in send order. `pred` runs without the journal's lock held.
    pub fn filter(&self, mut pred: impl FnMut(&CallRecord) -> bool) -> Vec<CallRecord> {
        self.calls().into_iter().filter(|r| pred(r)).collect()
    }

    /// Calls of one method, in send order.
    pub fn method(&self, method: &str) -> Vec<CallRecord> {
        self.filter(|r| r.method == method)
    }

    /// Calls of one method for one container name, in send order.
    pub fn container_calls(&self, method: &str, container: &str) -> Vec<CallRecord> {
        self.filter(|r| r.is(method, container))
    }

    /// Calls for one pod UID, in send order.
    pub fn pod_calls(&self, uid: &str) -> Vec<CallRecord> {
        self.filter(|r| r.meta.pod_uid.as_deref() == Some(uid))
    }

    /// Waits until some call satisfies `pred` (checked against every call, finished or not) and
    /// returns the first such call in send order.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&CallRecord) -> bool,
    ) -> anyhow::Result<CallRecord> {
        let mut rx = self.inner.changed.subscribe();
        let fut = async {
            loop {
                // Evaluate outside the lock: the predicate may query the journal itself.
                let calls = self.calls();
                if let Some(r) = calls.into_iter().find(|r| pred(r)) {
                    return Ok(r);
                }
                // The sender lives in `self`, so this only fails if the journal is gone.
                rx.changed()
                    .await
                    .map_err(|_| anyhow::anyhow!("journal closed"))?;
            }
        };
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| anyhow::anyhow!("no matching CRI call within {timeout:?}"))?
    }

    /// One line per call: `+1234.5ms  CreateContainer  ns/pod  app  OK (3.1ms)`.
    pub fn format_record(&self, r: &CallRecord) -> String {
        let mut s = format!(
            "+{:>9.1}ms  {:<16} {:<24} {:<14}",
            self.rel_ms(r.sent),
            r.method,
            r.meta.pod.as_deref().unwrap_or("-"),
            r.meta.container.as_deref().unwrap_or("-"),
        );
        if let Some(d) = &r.meta.detail {
            s.push_str(&format!(" [{d}]"));
        }
        match r.done {
            None => s.push_str(" …in flight"),
            Some(done) => {
                let took = done.saturating_duration_since(r.sent).as_secs_f64() * 1e3;
                if r.code == tonic::Code::Ok {
                    s.push_str(&format!(" OK ({took:.1}ms)"));
                } else {
                    s.push_str(&format!(" {:?}: {} ({took:.1}ms)", r.code, r.message));
                }
            }
        }
        s
    }
}
