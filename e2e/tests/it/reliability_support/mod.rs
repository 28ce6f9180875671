//! Shared by the `reliability_*` end-to-end scenarios (issue #8): a workload generator (pods
//! with 1–2 sidecars with exec/tcp/http readiness, some of them Jobs, a secret in every
//! container's env), the checks (ordering from containerd's own timestamps, kubelet's deadlines
//! from the emulator's journal, crisp's holds and tracking from its admin socket, its RSS from
//! /proc), kubelet-GC-like removal through crisp, a seeded RNG and a delaying socket splice.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use crisp_e2e::emulator::{CallMeta, CallRecord, EnvVar, Journal, Kubelet, PodPhase, PodSpec};
use crisp_e2e::harness::labelled_statuses;
use crisp_e2e::stack::{secs, Stack};
use k8s_cri::v1 as cri;

pub const S: i64 = 1_000_000_000;

// ---------------------------------------------------------------------------------------------
// Seeded randomness (printed, replayable with CRISP_SEED)

/// xorshift64*: tiny, deterministic, good enough to pick kill points and pod shapes.
pub struct Rng(u64);

impl Rng {
    /// From `CRISP_SEED` if set, else from the clock. Prints the seed so a failure replays.
    pub fn from_env(what: &str) -> Rng {
        let seed = std::env::var("CRISP_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{what}: CRISP_SEED={seed} (set it to replay this run)");
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }

    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// The workload

/// How a pod's sidecars say they are ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// hostNetwork, `exec:["test","-f","/tmp/ready"]`.
    Exec,
    /// hostNetwork, `tcp://:PORT` with a unique port per sidecar.
    Tcp,
    /// CNI pod, `http://:PORT/` on the pod IP.
    Http,
}

#[derive(Clone, Debug)]
pub struct Planned {
    pub spec: PodSpec,
    pub probe: Probe,
    pub job: bool,
    /// Sidecars in declared order, with the seconds each sleeps before it is ready.
    pub sidecars: Vec<(String, f64)>,
    pub app: String,
}

/// A free TCP port on loopback for a hostNetwork sidecar, below the ephemeral range (ports the
/// kernel hands to bind(0) and to outgoing connections — crisp's own probes among them — could
/// be taken again before the sidecar binds). Each call takes the next port that binds now.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let base = 20000 + (std::process::id() % 50) * 200;
    loop {
        let port = (base + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Plans pod `i` of a run: the probe kind cycles exec/tcp/http (http only with `cni`), 1 or 2
/// sidecars, every 4th pod is a Job, readiness delays are random (0.3–1.2 s). Every container
/// carries `secret` in its env.
pub fn plan(i: usize, rng: &mut Rng, cni: bool, secret: &str) -> Planned {
    let probe = match i % 3 {
        0 => Probe::Exec,
        1 => Probe::Tcp,
        _ if cni => Probe::Http,
        _ => Probe::Exec,
    };
    let n_sidecars = 1 + (rng.next() % 2) as usize;
    let job = i % 4 == 3;
    let mut ann = BTreeMap::new();
    let mut containers = Vec::new();
    let mut sidecars = Vec::new();
    for k in 0..n_sidecars {
        let name = format!("side{k}");
        let delay = rng.range(300, 1200) as f64 / 1000.0;
        let (ready, serve) = match probe {
            Probe::Exec => (
                r#"exec:["test","-f","/tmp/ready"]"#.to_string(),
                "touch /tmp/ready; sleep 3600 & wait".to_string(),
            ),
            Probe::Tcp => {
                let port = free_port();
                (
                    format!("tcp://:{port}"),
                    format!("mkdir -p /www; httpd -f -p 127.0.0.1:{port} -h /www & wait"),
                )
            }
            Probe::Http => {
                let port = 8080 + k;
                (format!("http://:{port}/"), format!("mkdir -p /www; echo ok > /www/index.html; httpd -f -p {port} -h /www & wait"))
            }
        };
        ann.insert(format!("crisp.dev/ready.{name}"), ready);
        containers.push(container(
            &name,
            &format!("trap 'exit 0' TERM; sleep {delay}; {serve}"),
            secret,
        ));
        sidecars.push((name, delay));
    }
    ann.insert(
        "crisp.dev/sidecars".into(),
        sidecars
            .iter()
            .map(|s| s.0.clone())
            .collect::<Vec<_>>()
            .join(", "),
    );
    let app = "app".to_string();
    let script = if job {
        "sleep 1; exit 0"
    } else {
        "trap 'sleep 0.5; exit 0' TERM; while true; do sleep 0.2; done"
    };
    containers.push(container(&app, script, secret));
    let mut spec = PodSpec::new(&format!("load-{i}"), containers);
    spec.annotations = ann;
    spec.host_network = probe != Probe::Http;
    spec.termination_grace_period_seconds = 10;
    if job {
        spec.labels.insert("job-name".into(), format!("load-{i}"));
        spec.restart_policy = crisp_e2e::emulator::RestartPolicy::Never;
    }
    Planned {
        spec,
        probe,
        job,
        sidecars,
        app,
    }
}

fn container(name: &str, script: &str, secret: &str) -> crisp_e2e::emulator::ContainerSpec {
    let mut c = crisp_e2e::emulator::ContainerSpec::sh(name, script);
    c.env.push(EnvVar {
        name: "SECRET_TOKEN".into(),
        value: secret.to_string(),
    });
    c
}

/// A per-run secret that must never show in any log line.
pub fn secret(rng: &mut Rng) -> String {
    format!("s3cr3t-{:016x}", rng.next())
}

/// Base64 (standard, padded) of `s`: the secret must not leak encoded either.
pub fn base64(s: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in s.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Waiting for what kubelet wants

/// Waits until every pod is where kubelet wants it after a start: all containers Running, or
/// for a Job pod, Succeeded.
pub async fn wait_up(
    kubelet: &Kubelet,
    pods: &[(String, Planned)],
    timeout: Duration,
) -> Result<()> {
    if let Some(uid) = wait_settled(kubelet, pods, timeout)
        .await?
        .into_iter()
        .next()
    {
        bail!("Job pod {uid} Failed: {:#?}", kubelet.pod(&uid));
    }
    Ok(())
}

/// Like [`wait_up`], but a Job pod may also end Failed; returns those pods' uids.
pub async fn wait_settled(
    kubelet: &Kubelet,
    pods: &[(String, Planned)],
    timeout: Duration,
) -> Result<Vec<String>> {
    let mut failed = Vec::new();
    for (uid, p) in pods {
        let r = if p.job {
            kubelet
                .wait_for(uid, timeout, |v| {
                    matches!(v.status.phase, PodPhase::Succeeded | PodPhase::Failed)
                })
                .await
                .map(|v| {
                    if v.status.phase == PodPhase::Failed {
                        failed.push(uid.clone());
                    }
                })
        } else {
            kubelet.wait_all_running(uid, timeout).await.map(|_| ())
        };
        r.with_context(|| format!("pod {} ({uid}) did not come up", p.spec.name))?;
    }
    Ok(failed)
}

pub async fn wait_terminated(
    kubelet: &Kubelet,
    pods: &[(String, Planned)],
    timeout: Duration,
) -> Result<()> {
    for (uid, p) in pods {
        kubelet
            .wait_terminated(uid, timeout)
            .await
            .with_context(|| format!("pod {} ({uid}) did not terminate", p.spec.name))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Ordering, from containerd's own timestamps

/// A CRI client straight to containerd (not through crisp): the runtime's own view.
pub async fn direct(
    containerd: &Path,
) -> Result<cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>> {
    Ok(cri::runtime_service_client::RuntimeServiceClient::new(
        crisp_e2e::emulator::connect_uds(containerd).await?,
    ))
}

/// Every instance of every container of pod `uid`, straight from containerd, by name.
pub async fn instances(
    containerd: &Path,
    uid: &str,
) -> Result<HashMap<String, Vec<cri::ContainerStatus>>> {
    let mut rt = direct(containerd).await?;
    let list = labelled_statuses(&mut rt, &[("io.kubernetes.pod.uid", uid)]).await?;
    let mut out: HashMap<String, Vec<cri::ContainerStatus>> = HashMap::new();
    for st in list {
        let name = st
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        out.entry(name).or_default().push(st);
    }
    for v in out.values_mut() {
        v.sort_by_key(|s| s.created_at);
    }
    Ok(out)
}

/// The instance of each container that ran (started_at ≠ 0); a name with more than one is a
/// duplicate (two copies of a container ran), a name with none never ran.
pub fn ran(
    all: &HashMap<String, Vec<cri::ContainerStatus>>,
    name: &str,
) -> Result<cri::ContainerStatus> {
    let ran: Vec<&cri::ContainerStatus> = all
        .get(name)
        .map(|v| v.iter().filter(|s| s.started_at != 0).collect())
        .unwrap_or_default();
    match ran.len() {
        1 => Ok(ran[0].clone()),
        0 => bail!("container {name} never ran"),
        n => bail!(
            "container {name} ran {n} times (instances: {:?})",
            ran.iter()
                .map(|s| format!(
                    "{} exit {} {:?} {:?}",
                    &s.id[..12.min(s.id.len())],
                    s.exit_code,
                    s.reason,
                    s.message
                ))
                .collect::<Vec<_>>()
        ),
    }
}

/// The one instance of `name` that ran, or a violation noted for the pod.
fn ran_or_note(
    all: &HashMap<String, Vec<cri::ContainerStatus>>,
    name: &str,
    p: &Planned,
    v: &mut Vec<String>,
) -> Option<cri::ContainerStatus> {
    ran(all, name)
        .map_err(|e| v.push(format!("{}: {e}", p.spec.name)))
        .ok()
}

/// Prints every pod's calls and the end of crisp's log (a failed wait).
pub fn dump_all(st: &Stack, pods: &[(String, Planned)]) {
    for (uid, _) in pods {
        dump_pod(&st.kubelet, uid);
    }
    eprintln!("--- crisp log tail ---\n{}", crisp_log_tail(st, 150));
}

/// Stop order for every pod (sidecars after the app, in reverse); dumps the pods' calls on a
/// violation. `what` names the phase in the error.
pub async fn ensure_stop_order(st: &Stack, pods: &[(String, Planned)], what: &str) -> Result<()> {
    let mut violations = Vec::new();
    for (uid, p) in pods {
        violations.extend(stop_violations(st.containerd.socket(), uid, p, false).await?);
    }
    if !violations.is_empty() {
        for (uid, _) in pods {
            dump_pod(&st.kubelet, uid);
        }
    }
    anyhow::ensure!(violations.is_empty(), "{what}:\n{}", violations.join("\n"));
    Ok(())
}

/// kubelet's GC removes the pods (through crisp); then nothing may stay held. Returns crisp's
/// metrics text for the caller's own checks.
pub async fn remove_and_settle(
    st: &Stack,
    admin: &Path,
    pods: &[(String, Planned)],
) -> Result<String> {
    let uids: Vec<String> = pods.iter().map(|(u, _)| u.clone()).collect();
    remove_pods(st.containerd.socket(), &st.kubelet, &uids).await?;
    wait_no_holds(admin, Duration::from_secs(10)).await?;
    metrics(admin).await
}

/// For runs in which crisp is killed mid-start: sidecars whose start was aborted are accepted,
/// and what follows them is held to crisp's start timeout.
pub struct AbortedOk<'a> {
    pub timeout: Duration,
    pub kubelet: &'a Kubelet,
    /// When each restarted crisp came up (wall clock, ns). A crisp that starts after a sidecar
    /// died cannot know whether an earlier crisp was refusing the apps already, so it counts
    /// their clock from that death by the runtime's record (DESIGN.md §3.4), which may be
    /// before their first CreateContainer.
    pub crisp_started: &'a [i64],
}

impl AbortedOk<'_> {
    /// When kubelet first sent CreateContainer for `name` in pod `uid` (wall clock, ns).
    fn first_create(&self, uid: &str, name: &str) -> Option<i64> {
        let calls = self
            .kubelet
            .journal()
            .filter(|r| r.meta.pod_uid.as_deref() == Some(uid) && r.is("CreateContainer", name));
        calls.iter().filter_map(|r| wall_ns(r.sent_wall)).min()
    }
}

/// What a run that breaks something on purpose may see without it counting as a violation.
#[derive(Default)]
pub struct Allow<'a> {
    /// crisp was killed mid-start.
    pub aborted: Option<AbortedOk<'a>>,
    /// containerd was killed.
    pub restamped: Option<Restamped<'a>>,
}

/// For runs in which containerd is SIGKILLed and restarted: a start the kill cut off between the
/// shim starting the process and containerd checkpointing the status is restamped on recovery
/// (containerd's CRI restart path sets `started_at` to the time it reloads a running container
/// it had not seen start). Such a process may have run since kubelet sent StartContainer, so its
/// readiness is counted from there: seen, a sidecar restamped 2 s late made an app that started
/// after it was really ready look 0.3 s early.
pub struct Restamped<'a> {
    /// When containerd was killed and when it answered again (wall clock, ns).
    pub outage: (i64, i64),
    pub kubelet: &'a Kubelet,
}

impl Restamped<'_> {
    /// The earliest moment the instance of `name` stamped `started_at` may really have started.
    fn earliest_start(&self, uid: &str, pod: &str, name: &str, started_at: i64) -> i64 {
        let (killed, back) = self.outage;
        if started_at < killed || started_at > back {
            return started_at;
        }
        let calls = self
            .kubelet
            .journal()
            .filter(|r| r.meta.pod_uid.as_deref() == Some(uid) && r.is("StartContainer", name));
        // The call the kill cut off: sent before it, not answered before it.
        let cut_off = |r: &&CallRecord| {
            r.done_wall()
                .and_then(wall_ns)
                .is_none_or(|done| done >= killed)
        };
        let sent = calls
            .iter()
            .filter(cut_off)
            .filter_map(|r| wall_ns(r.sent_wall))
            .filter(|&t| t < killed)
            .min();
        match sent {
            Some(t) => {
                eprintln!("{pod}: {name} was restamped by containerd's recovery; its readiness counts from StartContainer, {:.3} s earlier", secs(started_at - t));
                t.min(started_at)
            }
            None => started_at,
        }
    }
}

/// Wall-clock nanoseconds since the epoch.
pub fn wall_ns(t: std::time::SystemTime) -> Option<i64> {
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_nanos() as i64)
}

/// A sidecar none of whose instances ever started, at least one because its start was aborted
/// (`StartError`: crisp died mid-StartContainer, so containerd saw the call cancelled; the
/// others, if any, were created by a CreateContainer that crisp's death cut off after the
/// runtime had done it, and kubelet created a new one). Under restartPolicy Never kubelet never
/// retries it; crisp refuses the app until its start timeout, then lets it through (policy
/// proceed). Returns when it failed.
pub fn start_aborted(all: &HashMap<String, Vec<cri::ContainerStatus>>, name: &str) -> Option<i64> {
    let list = all.get(name)?;
    let never_started = list.iter().all(|s| s.started_at == 0);
    let aborted = list
        .iter()
        .filter(|s| s.reason == "StartError")
        .map(|s| s.finished_at)
        .max()?;
    never_started.then_some(aborted)
}

/// Start order: each sidecar started after the previous one was ready (its start + its sleep),
/// the app after the last one was ready; exactly one instance of each container ran. With
/// `allow.aborted`, a sidecar whose start was aborted is accepted if what follows it waited the
/// start timeout; with `allow.restamped`, a start containerd's recovery restamped counts from
/// kubelet's StartContainer. Returns the violations (empty = good).
pub async fn start_violations(
    containerd: &Path,
    uid: &str,
    p: &Planned,
    allow: Allow<'_>,
) -> Result<Vec<String>> {
    let Allow {
        aborted: aborted_ok,
        restamped,
    } = allow;
    // containerd stamps `started_at` when the shim's Start returns: the sidecar's process (and
    // its `sleep delay`) is already running by then, so it can be ready slightly *before*
    // started_at + delay. Seen: 42 ms on a loaded machine (chaos run with three crisp restarts).
    // A crisp that let an app through early would be off by the probe's whole delay (0.3-1.2 s).
    const STAMP_LAG_NS: i64 = 150_000_000;
    let all = instances(containerd, uid).await?;
    let mut v = Vec::new();
    let mut ready_at: Option<(String, i64)> = None;
    // After a sidecar whose start was aborted (dead), the containers behind it may go on only
    // once crisp's start timeout has run out for them: counted, as crisp counts it, from their
    // own first CreateContainer (the first refusal) — or from the sidecar's death, when a crisp
    // that started after it let them go (DESIGN.md §3.4: it cannot see an earlier crisp's
    // refusals).
    let mut dead: Option<(String, i64)> = None;
    let waited = |name: &str,
                  started_at: i64,
                  dead: &Option<(String, i64)>,
                  v: &mut Vec<String>| {
        let (Some((d, died)), Some(ok)) = (dead, &aborted_ok) else {
            return;
        };
        if let Some(first) = ok.first_create(uid, name) {
            let restarted_since = ok
                .crisp_started
                .iter()
                .any(|&t| t > *died && t < started_at);
            let from = if restarted_since {
                first.min(*died)
            } else {
                first
            };
            let at = from + ok.timeout.as_nanos() as i64;
            if started_at < at {
                v.push(format!("{}: {name} started {:.3} s before its start timeout ran out (counted from its first create, or from its sidecar's death for a crisp started since), with {d} dead", p.spec.name, secs(at - started_at)));
            }
        }
    };
    for (name, delay) in &p.sidecars {
        if let (Some(ok), Some(_)) = (&aborted_ok, start_aborted(&all, name)) {
            eprintln!("{}: {name}'s start was aborted; what follows may start {:?} after its first create", p.spec.name, ok.timeout);
            // When it died by the runtime's record, as crisp reads it: its newest instance's
            // exit, or its creation if it has none.
            let died = all[name]
                .iter()
                .max_by_key(|c| c.created_at)
                .map(|c| {
                    if c.finished_at > 0 {
                        c.finished_at
                    } else {
                        c.created_at
                    }
                })
                .unwrap_or(i64::MAX);
            dead = Some((name.clone(), died));
            continue;
        }
        let Some(s) = ran_or_note(&all, name, p, &mut v) else {
            continue;
        };
        waited(name, s.started_at, &dead, &mut v);
        if let Some((prev, at)) = &ready_at {
            if s.started_at < *at {
                v.push(format!(
                    "{}: {name} started {:.3} s before {prev} was ready",
                    p.spec.name,
                    secs(at - s.started_at)
                ));
            }
        }
        let began = restamped.as_ref().map_or(s.started_at, |r| {
            r.earliest_start(uid, &p.spec.name, name, s.started_at)
        });
        ready_at = Some((name.clone(), began + (*delay * 1e9) as i64 - STAMP_LAG_NS));
    }
    if aborted_ok.is_some() && start_aborted(&all, &p.app).is_some() {
        eprintln!("{}: the app's start was aborted", p.spec.name);
        return Ok(v);
    }
    match ran(&all, &p.app) {
        Ok(a) => {
            waited(&p.app, a.started_at, &dead, &mut v);
            if let Some((prev, at)) = &ready_at {
                if a.started_at < *at {
                    v.push(format!(
                        "{}: the app started {:.3} s before {prev} was ready",
                        p.spec.name,
                        secs(at - a.started_at)
                    ));
                }
            }
        }
        Err(e) => v.push(format!("{}: {e}", p.spec.name)),
    }
    Ok(v)
}

/// Stop order: the app finished before every sidecar, sidecars finished in reverse declared
/// order (a sidecar whose start was aborted never ran and is skipped when `aborted_ok`).
/// Returns the violations.
pub async fn stop_violations(
    containerd: &Path,
    uid: &str,
    p: &Planned,
    aborted_ok: bool,
) -> Result<Vec<String>> {
    let all = instances(containerd, uid).await?;
    let mut v = Vec::new();
    let mut later: Option<(String, i64)> = match ran(&all, &p.app) {
        Ok(a) => Some((p.app.clone(), a.finished_at)),
        Err(_) if aborted_ok && start_aborted(&all, &p.app).is_some() => None,
        Err(e) => return Ok(vec![format!("{}: {e}", p.spec.name)]),
    };
    for (name, _) in p.sidecars.iter().rev() {
        if aborted_ok && start_aborted(&all, name).is_some() {
            continue;
        }
        let Some(s) = ran_or_note(&all, name, p, &mut v) else {
            continue;
        };
        if s.finished_at == 0 {
            v.push(format!("{}: {name} still runs", p.spec.name));
            continue;
        }
        if let Some((prev, at)) = &later {
            if s.finished_at <= *at {
                v.push(format!(
                    "{}: {name} finished {:.3} s before {prev}",
                    p.spec.name,
                    secs(at - s.finished_at)
                ));
            }
        }
        later = Some((name.clone(), s.finished_at));
    }
    Ok(v)
}

/// Exactly one RUNNING instance per container name (for pods kubelet wants running).
pub async fn duplicate_running(containerd: &Path, uid: &str, p: &Planned) -> Result<Vec<String>> {
    let all = instances(containerd, uid).await?;
    let mut v = Vec::new();
    for (name, list) in &all {
        let running = list
            .iter()
            .filter(|s| s.state == cri::ContainerState::ContainerRunning as i32)
            .count();
        let want = if p.job { 0 } else { 1 };
        if running != want {
            v.push(format!(
                "{}: {running} running instance(s) of {name} (want {want})",
                p.spec.name
            ));
        }
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// kubelet's deadlines, from the journal

/// Calls that outlived the deadline kubelet gave them (or hit it).
pub fn deadline_violations(j: &Journal) -> Vec<String> {
    j.filter(|r| match (r.deadline, r.done) {
        (Some(d), Some(done)) => {
            done.duration_since(r.sent) >= d || r.code == tonic::Code::DeadlineExceeded
        }
        _ => r.code == tonic::Code::DeadlineExceeded && r.done.is_some(),
    })
    .iter()
    .map(|r| j.format_record(r))
    .collect()
}

/// Ordering calls (the ones crisp may hold) still in flight.
pub fn stuck_calls(j: &Journal, older_than: Duration) -> Vec<String> {
    j.filter(|r| {
        r.done.is_none()
            && matches!(
                r.method,
                "CreateContainer" | "StopContainer" | "StopPodSandbox" | "StartContainer"
            )
            && r.sent.elapsed() > older_than
    })
    .iter()
    .map(|r| j.format_record(r))
    .collect()
}

/// No call outlived kubelet's deadline, and none crisp may hold is still in flight 5 s on.
pub fn ensure_calls_ended(j: &Journal) -> Result<()> {
    let late = deadline_violations(j);
    ensure!(
        late.is_empty(),
        "calls outlived kubelet's deadline:\n{}",
        late.join("\n")
    );
    let stuck = stuck_calls(j, Duration::from_secs(5));
    ensure!(
        stuck.is_empty(),
        "calls still in flight:\n{}",
        stuck.join("\n")
    );
    Ok(())
}

pub fn count(j: &Journal, pred: impl FnMut(&CallRecord) -> bool) -> usize {
    j.filter(pred).len()
}

// ---------------------------------------------------------------------------------------------
// crisp's admin socket: metrics (HTTP/1.1 on a unix socket) and ListPods

pub fn admin_socket(st: &Stack) -> PathBuf {
    st.crisp.dir().join("admin.sock")
}

/// `GET /metrics` over the admin socket.
pub async fn metrics(admin: &Path) -> Result<String> {
    let admin = admin.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<String> {
        let mut s = std::os::unix::net::UnixStream::connect(&admin)
            .with_context(|| format!("connect {}", admin.display()))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: crisp\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        if !out.starts_with("HTTP/1.1 200") {
            bail!("GET /metrics: {}", out.lines().next().unwrap_or(""));
        }
        Ok(out)
    })
    .await?
}

/// One unlabelled sample of `name` from the metrics text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|r| r.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

pub async fn gauge(admin: &Path, name: &str) -> Result<f64> {
    let t = metrics(admin).await?;
    sample(&t, name).with_context(|| format!("no {name} in /metrics"))
}

/// Waits until crisp holds nothing (`crisp_holds_in_flight` 0). Holds end on their own (each
/// is bounded by kubelet's deadline); this polls the gauge until then.
pub async fn wait_no_holds(admin: &Path, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let n = gauge(admin, "crisp_holds_in_flight").await?;
        if n == 0.0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("crisp still holds {n} call(s) after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pods crisp's engine tracks (admin ListPods).
pub async fn tracked_pods(admin: &Path) -> Result<Vec<crisp::admin_api::Pod>> {
    let mut c = crisp::cli::client::connect(admin).await?;
    Ok(c.list_pods(crisp::admin_api::ListPodsRequest::default())
        .await?
        .into_inner()
        .pods)
}

/// crisp's resident memory, KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

// ---------------------------------------------------------------------------------------------
// Removal, as kubelet's container GC does it (through crisp, so its caches see the Removes)

/// RemoveContainer for every container of the pods, then StopPodSandbox + RemovePodSandbox
/// for their sandboxes, all through crisp via the kubelet's own CRI client (journaled).
pub async fn remove_pods(containerd: &Path, kubelet: &Kubelet, uids: &[String]) -> Result<()> {
    let mut rt = direct(containerd).await?;
    for uid in uids {
        let sel: HashMap<String, String> =
            [("io.kubernetes.pod.uid".to_string(), uid.clone())].into();
        let cs = rt
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    label_selector: sel.clone(),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .containers;
        for c in cs {
            let meta = CallMeta {
                pod_uid: Some(uid.clone()),
                ..Default::default()
            };
            let mut r = kubelet.cri().remove_container(&c.id, meta.clone()).await;
            // A StartContainer cut off by crisp's death (containerd saw the call cancelled) can
            // leave containerd 1.6 with a container CRI reports exited (StartError) but whose
            // task it never reaps: "cannot delete running task", for as long as we waited (20 s
            // measured). A kubelet dying mid-call leaves the same. Cleaned up as an operator
            // would, with ctr; any other refusal fails the test.
            if matches!(&r, Err(e) if e.message().contains("cannot delete running task")) {
                let st = rt
                    .container_status(cri::ContainerStatusRequest {
                        container_id: c.id.clone(),
                        verbose: false,
                    })
                    .await?
                    .into_inner()
                    .status
                    .unwrap_or_default();
                if st.reason == "StartError" {
                    eprintln!(
                        "{}: containerd kept the task of {} whose start was aborted; killing it with ctr",
                        &c.id[..12],
                        st.metadata.as_ref().map_or("?", |m| m.name.as_str())
                    );
                    let ctr = |args: &[&str]| {
                        std::process::Command::new("ctr")
                            .args([
                                "--address",
                                &containerd.display().to_string(),
                                "-n",
                                "k8s.io",
                                "tasks",
                            ])
                            .args(args)
                            .output()
                    };
                    let out = ctr(&["kill", "-s", "SIGKILL", &c.id])?;
                    anyhow::ensure!(
                        out.status.success(),
                        "ctr tasks kill {}: {}",
                        c.id,
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let t0 = Instant::now();
                    loop {
                        // The killed task is deleted once its process has exited.
                        let _ = ctr(&["delete", &c.id]);
                        r = kubelet.cri().remove_container(&c.id, meta.clone()).await;
                        if r.is_ok() || t0.elapsed() > Duration::from_secs(10) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            if let Err(e) = r {
                dump_pod(kubelet, uid);
                let name = c
                    .metadata
                    .as_ref()
                    .map(|m| format!("{} attempt {}", m.name, m.attempt))
                    .unwrap_or_default();
                bail!(
                    "RemoveContainer {} ({name}, state {}, created {}): {e}",
                    c.id,
                    c.state,
                    c.created_at
                );
            }
        }
        let sbs = rt
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter {
                    label_selector: sel,
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .items;
        for sb in sbs {
            let meta = CallMeta {
                pod_uid: Some(uid.clone()),
                ..Default::default()
            };
            kubelet
                .cri()
                .stop_pod_sandbox(&sb.id, meta.clone())
                .await
                .with_context(|| format!("StopPodSandbox {}", sb.id))?;
            kubelet
                .cri()
                .remove_pod_sandbox(&sb.id, meta)
                .await
                .with_context(|| format!("RemovePodSandbox {}", sb.id))?;
        }
    }
    Ok(())
}

/// Job-mode marks left in crisp's state dir (one file per sidecar it terminated).
pub fn terminated_marks(state_dir: &Path) -> usize {
    std::fs::read_dir(state_dir.join("terminated"))
        .map(|d| d.count())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// A slow runtime: a byte splice that delays every chunk the runtime sends

/// Listens on `listen` and splices each connection to `upstream`; bytes from the upstream are
/// delivered `delay` after they arrived (in order), bytes to it at once.
pub struct SlowSplice {
    pub path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SlowSplice {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowSplice {
    pub fn start(listen: &Path, upstream: &Path, delay: Duration) -> Result<SlowSplice> {
        let l = tokio::net::UnixListener::bind(listen)?;
        let upstream = upstream.to_path_buf();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = l.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::UnixStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                        let _ = tokio::io::AsyncWriteExt::shutdown(&mut sw).await;
                    });
                    let (tx, mut rx) =
                        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
                    let reader = tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            match tokio::io::AsyncReadExt::read(&mut sr, &mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if tx
                                        .send((
                                            tokio::time::Instant::now() + delay,
                                            buf[..n].to_vec(),
                                        ))
                                        .is_err()
                                    {
                                        break;
                                    }
                                }
                            }
                        }
                    });
                    while let Some((due, chunk)) = rx.recv().await {
                        tokio::time::sleep_until(due).await;
                        if tokio::io::AsyncWriteExt::write_all(&mut cw, &chunk)
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    let _ = tokio::io::AsyncWriteExt::shutdown(&mut cw).await;
                    reader.abort();
                    up.abort();
                });
            }
        });
        Ok(SlowSplice {
            path: listen.to_path_buf(),
            task,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// A stack with a custom crisp (log level, upstream)

/// Like `Stack::start`, but crisp forwards to `upstream(containerd socket)` (e.g. a slow
/// splice in front of containerd) and logs at `log_level`. The kubelet reaches its endpoint
/// through grpc-go, as in `Stack::start`.
pub async fn custom_stack(
    cni: bool,
    crisp_config: &str,
    log_level: Option<&str>,
    upstream: impl FnOnce(&Path) -> Result<Option<PathBuf>>,
    tune: impl FnOnce(&mut crisp_e2e::emulator::KubeletConfig),
) -> Result<Stack> {
    use crisp_e2e::crisp::{Crisp, CrispOpts};
    use crisp_e2e::harness::{Containerd, ContainerdOpts};
    crisp_e2e::harness::require_root();
    let containerd = Containerd::start_async(ContainerdOpts { cni })
        .await
        .context("starting containerd")?;
    let up = upstream(containerd.socket())?.unwrap_or_else(|| containerd.socket().to_path_buf());
    let crisp = Crisp::start(
        &up,
        CrispOpts {
            extra_config: crisp_config.to_string(),
            log_level: log_level.map(str::to_string),
        },
    )?;
    // kubelet's grpc-go transport in front of whatever endpoint the kubelet was given.
    let grpcgo = crisp_e2e::grpcgo::via_grpcgo_default().then(Default::default);
    Stack::around(containerd, crisp, grpcgo, tune).await
}

/// Lines of crisp's log containing `needle`.
pub fn log_lines(st: &Stack, needle: &str) -> Vec<String> {
    st.crisp
        .log_text()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// Prints a failing pod's calls.
pub fn dump_pod(kubelet: &Kubelet, uid: &str) {
    let j = kubelet.journal();
    for r in j.pod_calls(uid).iter().filter(|r| !r.is_polling()) {
        eprintln!("{}", j.format_record(r));
    }
}

pub fn crisp_log_tail(st: &Stack, lines: usize) -> String {
    let t = st.crisp.log_text();
    let all: Vec<&str> = t.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
