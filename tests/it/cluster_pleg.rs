//! kubelet's own PLEG relist, direct and through crisp, on a node holding as many pods as its
//! kubelet admits (issue #47: "kubelet's PLEG relist duration direct vs through crisp";
//! docs/SUPPORT.md, "Node size"). The cluster lane's control plane and node
//! (cluster_rollout.rs), an upstream kubelet on containerd 1.6, and `CRISP_PLEG_PODS` pods (100
//! by default: kubelet admits 110 a node) of a Deployment, each a sandbox and a sleeping busybox.
//!
//! Then `CRISP_PLEG_ROUNDS` rounds (3), each a window on containerd's socket and a window on
//! crisp's, the order alternating round by round. Each window starts once the restarted kubelet
//! has relisted 15 times (after a restart it syncs every pod once, and its first relists share
//! the CPU with that) and lasts [`RELISTS`] relists. What each window reports comes from
//! kubelet's own metrics, read through the API server (`/api/v1/nodes/NODE/proxy/metrics`), and
//! from /proc in the node:
//! - `kubelet_pleg_relist_duration_seconds`: the relist's duration, from its ListPodSandbox to
//!   the end of the pod cache's update;
//! - `kubelet_pleg_relist_interval_seconds`: the time from one relist's start to the next;
//! - `kubelet_runtime_operations_duration_seconds` of `list_podsandbox` and `list_containers`:
//!   the two list calls as kubelet's CRI client timed them;
//! - kubelet's CPU, and crisp's (a release build, `CRISP_LANE_CRISP_BIN`), per relist.
//!
//! Then a burst: the Deployment scaled down by `CRISP_PLEG_BURST` (40) and that many
//! Linkerd-shaped pods (crisp orders `linkerd-proxy` before the app, readiness on :4191/ready,
//! served `READY_AFTER` after the proxy starts) created at once, through crisp and then direct:
//! until every one runs both containers, kubelet's relist, crisp's probe connects, and each
//! app's creation (containerd's `created_at`) after its proxy turned ready (its `started_at` +
//! `READY_AFTER`: the proxy's `sleep`, so the instant itself is a few ms early at most).
//!
//! Printed as `pleg|` rows. Asserted: every pod stays Running; kubelet relists once a second on
//! either socket; through crisp no burst app is created before its proxy is ready, and direct
//! at least one is (the lane tells the two apart); and on crisp's socket the relist's mean (min
//! over rounds) is at most what a relist costs direct (min over rounds) plus the larger of 1 ms
//! and half of it. crisp relays a list
//! without decoding it, so what it adds is a hop per call; a list call crisp held, or work
//! that grew with the list on its relay thread, would fail that bound.
//!
//!   CRISP_LANE_CRISP_BIN=target/release/crisp CRISP_KUBE_BIN_DIR=DIR cargo test -p crisp \
//!     --test it -- cluster_pleg:: --ignored --nocapture --test-threads 1     (hack/lanes.sh pleg)

use std::time::{Duration, Instant};

use crate::cluster_kubelets::{
    crisp_kill, crisp_start, in_node, journal_since, kubelet_on, node_now, Runtime, READY_AFTER,
};
use crate::cluster_observers::{cpu_secs, unit_cpu};
use crate::cluster_rollout::{
    join_with, kube_bin_dir, kubelet_config_for, kubelet_minor, run, secs, BridgeGuard, Cluster,
    NODE,
};
use crate::node_support::*;

const CONTAINERD: &str = "/run/containerd/containerd.sock";
const CRISP: &str = "/run/crisp/crisp.sock";
/// socat's socket in the node (socat itself runs on the host, on the node's /run).
const SOCAT: &str = "/run/lane-socat/socat.sock";
/// The relists a window lasts.
const RELISTS: f64 = 40.0;
/// The relists after kubelet's restart that a window leaves out.
const SETTLE: f64 = 15.0;

const RELIST: &str = "kubelet_pleg_relist_duration_seconds";
const INTERVAL: &str = "kubelet_pleg_relist_interval_seconds";
const RUNTIME_OPS: &str = "kubelet_runtime_operations_duration_seconds";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: a number")))
        .unwrap_or(default)
}

/// One histogram of a Prometheus text exposition: its series that carry `label` (every series
/// when `None`) summed.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Histogram {
    /// Cumulative counts by upper bound (`le`), in the order exposed.
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    pub(crate) fn parse(text: &str, name: &str, label: Option<&str>) -> Histogram {
        let mut h = Histogram::default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            if label.is_some_and(|l| !rest.contains(l)) {
                continue;
            }
            let Some((series, value)) = rest.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            if series.starts_with("_sum") {
                h.sum += v;
            } else if series.starts_with("_count") {
                h.count += v;
            } else if let Some(le) = series.strip_prefix("_bucket") {
                let le = le
                    .split_once("le=\"")
                    .and_then(|(_, r)| r.split_once('"'))
                    .map(|(b, _)| {
                        if b == "+Inf" {
                            f64::INFINITY
                        } else {
                            b.parse().unwrap_or(f64::NAN)
                        }
                    });
                let Some(le) = le.filter(|b| !b.is_nan()) else {
                    continue;
                };
                match h.buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, c)) => *c += v,
                    None => h.buckets.push((le, v)),
                }
            }
        }
        h
    }

    /// What was observed between `before` and this one.
    pub(crate) fn since(&self, before: &Histogram) -> Histogram {
        let at = |le: f64| {
            before
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, c)| *c)
        };
        Histogram {
            buckets: self.buckets.iter().map(|&(b, c)| (b, c - at(b))).collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    pub(crate) fn mean_ms(&self) -> f64 {
        if self.count > 0.0 {
            self.sum / self.count * 1e3
        } else {
            f64::NAN
        }
    }

    /// The smallest bucket bound, in ms, that holds the `q` quantile of the observations.
    pub(crate) fn at_most_ms(&self, q: f64) -> f64 {
        let want = q * self.count;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= want)
            .map_or(f64::INFINITY, |(b, _)| b * 1e3)
    }
}

/// kubelet's metrics, through the API server. kubelet's server starts after its first status
/// update, so a kubelet just restarted may refuse for a moment.
fn metrics(cluster: &Cluster) -> String {
    let path = format!("/api/v1/nodes/{NODE}/proxy/metrics");
    let mut text = String::new();
    cluster.wait("kubelet's metrics", Duration::from_secs(60), || {
        let o = cluster.kubectl(&["get", "--raw", &path]);
        let ok = o.ok();
        text = o.stdout;
        ok
    });
    text
}

fn relists(cluster: &Cluster) -> f64 {
    Histogram::parse(&metrics(cluster), RELIST, None).count
}

/// `socat UNIX-LISTEN,fork` on [`SOCAT`] in front of containerd's socket: a raw byte splice,
/// the floor of any proxy hop (one process a connection, forked). Killed with its children on
/// drop.
struct Socat {
    child: std::process::Child,
}

impl Socat {
    fn start(node: &Node) -> Socat {
        let listen = in_node(node, SOCAT);
        std::fs::create_dir_all(listen.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&listen);
        let child = std::process::Command::new("socat")
            .arg(format!("UNIX-LISTEN:{},fork", listen.display()))
            .arg(format!(
                "UNIX-CONNECT:{}",
                in_node(node, CONTAINERD).display()
            ))
            .spawn()
            .expect("socat (hack/setup.sh installs it)");
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&listen).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "socat never listened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Socat { child }
    }

    /// CPU seconds of socat and of the processes it forked, one a connection.
    fn cpu(&self) -> f64 {
        let pid = self.child.id();
        let stat = |p: &str| std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        cpu_secs(&stat(&pid.to_string()))
            + children
                .split_whitespace()
                .map(|c| cpu_secs(&stat(c)))
                .sum::<f64>()
    }
}

impl Drop for Socat {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = std::process::Command::new("pkill")
            .args(["-P", &pid])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One window's numbers.
#[derive(Debug)]
struct Window {
    lane: &'static str,
    secs: f64,
    relist: Histogram,
    interval: Histogram,
    sandboxes: Histogram,
    containers: Histogram,
    kubelet_cpu: f64,
    /// CPU seconds of crisp or socat over the window.
    proxy_cpu: f64,
}

impl Window {
    fn row(&self, minor: u32, round: usize) -> String {
        let n = self.relist.count;
        format!(
            "pleg| 1.{minor} round {round} {:6}: {n:3.0} relists in {:5.1} s; relist mean {:6.2} ms (p50 ≤ {} ms, p99 ≤ {} ms), interval mean {:7.1} ms; ListPodSandbox mean {:5.2} ms, ListContainers mean {:5.2} ms (kubelet's CRI client); CPU over the window ÷ relists: kubelet {:6.2} ms (all its work), proxy {:5.2} ms",
            self.lane,
            self.secs,
            self.relist.mean_ms(),
            self.relist.at_most_ms(0.5),
            self.relist.at_most_ms(0.99),
            self.interval.mean_ms(),
            self.sandboxes.mean_ms(),
            self.containers.mean_ms(),
            self.kubelet_cpu / n * 1e3,
            self.proxy_cpu / n * 1e3,
        )
    }
}

/// Moves kubelet onto `endpoint` and waits for its [`SETTLE`]th relist there.
fn settled_on(cluster: &Cluster, node: &Node, endpoint: &str) {
    kubelet_on(cluster, node, endpoint);
    let restarted = relists(cluster);
    cluster.wait(
        "kubelet's first relists after its restart",
        Duration::from_secs(60),
        || relists(cluster) >= restarted + SETTLE,
    );
}

/// Moves kubelet onto `endpoint`, lets it settle, then measures [`RELISTS`] relists; `proxy_cpu`
/// reads the CPU seconds of what serves that socket (0 for containerd's own).
fn window(
    cluster: &Cluster,
    node: &Node,
    lane: &'static str,
    endpoint: &str,
    proxy_cpu: &dyn Fn() -> f64,
) -> Window {
    settled_on(cluster, node, endpoint);
    let (m0, k0, c0, t) = (
        metrics(cluster),
        unit_cpu(node, "kubelet.service"),
        proxy_cpu(),
        Instant::now(),
    );
    let start = Histogram::parse(&m0, RELIST, None).count;
    // A relist a second: 40 relists in about 40 s, or kubelet is not relisting as it should.
    cluster.wait(
        &format!("{RELISTS} relists of kubelet on {endpoint}"),
        Duration::from_secs_f64(RELISTS * 2.0),
        || relists(cluster) >= start + RELISTS,
    );
    let (m1, k1, c1) = (
        metrics(cluster),
        unit_cpu(node, "kubelet.service"),
        proxy_cpu(),
    );
    let h = |text: &str, name: &str, label: Option<&str>| Histogram::parse(text, name, label);
    let delta = |name: &str, label: Option<&str>| h(&m1, name, label).since(&h(&m0, name, label));
    Window {
        lane,
        secs: t.elapsed().as_secs_f64(),
        relist: delta(RELIST, None),
        interval: delta(INTERVAL, None),
        sandboxes: delta(RUNTIME_OPS, Some("operation_type=\"list_podsandbox\"")),
        containers: delta(RUNTIME_OPS, Some("operation_type=\"list_containers\"")),
        kubelet_cpu: k1 - k0,
        proxy_cpu: c1 - c0,
    }
}

fn deployment(pods: usize) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: pleg
  namespace: default
spec:
  replicas: {pods}
  selector:
    matchLabels:
      app: pleg
  template:
    metadata:
      labels:
        app: pleg
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      enableServiceLinks: false
      containers:
      - name: sleeper
        image: crisp.test/busybox:latest
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 3600 & wait $!; done"]
        resources:
          requests:
            cpu: 1m
            memory: 4Mi
"#
    )
}

/// The Deployment's pods that are Running.
fn running(cluster: &Cluster) -> usize {
    phases(cluster, "pleg")
        .iter()
        .filter(|p| *p == "Running")
        .count()
}

/// A Linkerd-shaped pod (crisp's injector table: `linkerd-proxy` first, ready on :4191/ready):
/// its proxy serves that path `READY_AFTER` after it starts; through crisp the app's
/// CreateContainer waits for it.
fn burst_pod(i: usize) -> String {
    let proxy = format!(
        "trap 'exit 0' TERM; sleep {}; mkdir -p /www; echo ok >/www/ready; httpd -p 4191 -h /www; while true; do sleep 3600 & wait $!; done",
        READY_AFTER.as_secs()
    );
    let app = "trap 'exit 0' TERM; while true; do sleep 3600 & wait $!; done";
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: burst-{i}
  namespace: default
  labels:
    app: burst
  annotations:
    linkerd.io/proxy-version: "stable-2.14.10"
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  enableServiceLinks: false
  containers:
  - name: linkerd-proxy
    image: crisp.test/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {proxy:?}]
  - name: app
    image: crisp.test/busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {app:?}]
"#
    )
}

/// Pods of label `app=NAME` in the default namespace, by phase.
fn phases(cluster: &Cluster, app: &str) -> Vec<String> {
    cluster
        .jsonpath(
            &["pods", "-n", "default", "-l", &format!("app={app}")],
            "{range .items[*]}{.status.phase}{\"\\n\"}{end}",
        )
        .lines()
        .map(str::to_string)
        .collect()
}

/// A counter of crisp's own metrics (its admin socket in the node).
fn crisp_counter(node: &Node, name: &str) -> f64 {
    let sock = in_node(node, "/run/crisp/admin.sock");
    let o = run(std::process::Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(&sock)
        .arg("http://crisp/metrics"));
    o.stdout
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// When the proxy of container `id` turned ready: the modification time of the file it writes
/// just before its httpd serves it (ns since the epoch), read in the node through the
/// container's process.
fn ready_ns(node: &Node, rt: &Runtime, id: &str) -> i64 {
    let info = rt.rt.block_on(async {
        let mut c = crate::support::runtime_client(&rt.sock).await;
        c.container_status(k8s_cri::v1::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        })
        .await
        .expect("ContainerStatus")
        .into_inner()
        .info
    });
    let pid = info
        .get("info")
        .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
        .and_then(|v| v["pid"].as_u64())
        .unwrap_or_else(|| panic!("no pid in the verbose status of {id}"));
    // Direct, kubelet runs the app before the proxy is ready: the file may not be there yet.
    let file = format!("/proc/{pid}/root/www/ready");
    let t = Instant::now();
    loop {
        let o = node.nsenter(&["stat", "-c", "%.9Y", &file]);
        if o.ok() {
            return epoch_ns(o.stdout.trim());
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the proxy's ready file: {}",
            o.all()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `SECONDS.FRACTION` (stat's `%.9Y`, journalctl's `-o short-unix`) as ns.
fn epoch_ns(t: &str) -> i64 {
    let (secs, frac) = t.split_once('.').unwrap_or((t, "0"));
    let digits = format!("{frac:0<9}");
    secs.parse::<i64>().expect("seconds") * 1_000_000_000
        + digits[..9].parse::<i64>().expect("fraction")
}

/// When crisp forwarded each burst pod's held CreateContainer ("sidecars ready; forwarding
/// CreateContainer" in its journal, which names the pod), by pod index.
fn forwarded_ns(node: &Node, since: &str, n: usize) -> Vec<Option<i64>> {
    let o = node.nsenter(&[
        "journalctl",
        "-u",
        "crisp-lane",
        "--since",
        since,
        "-o",
        "short-unix",
        "--no-pager",
    ]);
    let mut at = vec![None; n];
    for line in o
        .stdout
        .lines()
        .filter(|l| l.contains("forwarding CreateContainer"))
    {
        let Some(i) = pod_index(line) else { continue };
        if i < n && at[i].is_none() {
            at[i] = line.split_whitespace().next().map(epoch_ns);
        }
    }
    at
}

/// The `i` of the first `burst-i` a line names.
fn pod_index(line: &str) -> Option<usize> {
    let rest = &line[line.find("burst-")? + "burst-".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// One burst's numbers.
struct Burst {
    lane: &'static str,
    secs: f64,
    relist: Histogram,
    /// Per pod: the app's creation (containerd's `created_at`) after its proxy turned ready, ms.
    after_ready_ms: Vec<f64>,
    /// Per pod, through crisp: its hold's end (crisp forwarding the app's CreateContainer)
    /// after its proxy turned ready, ms.
    released_ms: Vec<f64>,
    probe_connects: f64,
}

/// `n` Linkerd-shaped pods created at once with kubelet on `endpoint`, beside the Deployment
/// scaled down to leave them room: until every one runs both containers, kubelet's relist and
/// each app's creation after its proxy turned ready. The pods are deleted after.
fn burst(
    cluster: &Cluster,
    node: &Node,
    rt: &Runtime,
    lane: &'static str,
    endpoint: &str,
    n: usize,
) -> Burst {
    settled_on(cluster, node, endpoint);
    let (m0, p0, t) = (
        metrics(cluster),
        crisp_counter(node, "crisp_probe_connects_total"),
        Instant::now(),
    );
    let since = node_now(node);
    let yaml: Vec<String> = (0..n).map(burst_pod).collect();
    cluster.apply(&yaml.join("---\n"));
    let both_running = |pod: &str| {
        let times = rt.pod_times(pod);
        ["linkerd-proxy", "app"]
            .iter()
            .all(|c| times.get(*c).is_some_and(|t| t.started > 0))
    };
    let mut done = vec![false; n];
    cluster.wait(
        &format!("{n} burst pods running both containers"),
        Duration::from_secs(120 + 6 * n as u64),
        || {
            for (i, d) in done.iter_mut().enumerate() {
                *d = *d || both_running(&format!("burst-{i}"));
            }
            done.iter().all(|d| *d)
        },
    );
    let secs = t.elapsed().as_secs_f64();
    let m1 = metrics(cluster);
    let probe_connects = crisp_counter(node, "crisp_probe_connects_total") - p0;
    let forwarded = if endpoint == CRISP {
        forwarded_ns(node, &since, n)
    } else {
        vec![None; n]
    };
    let (mut after_ready_ms, mut released_ms) = (Vec::new(), Vec::new());
    for (i, fwd) in forwarded.iter().enumerate() {
        let pod = format!("burst-{i}");
        let ids = rt.containers(&pod);
        let ready = ready_ns(node, rt, &ids["linkerd-proxy"].0);
        let created = rt.times(&ids["app"].0).expect("the app's status").created;
        after_ready_ms.push((created - ready) as f64 / 1e6);
        if let Some(f) = fwd {
            released_ms.push((f - ready) as f64 / 1e6);
        }
    }
    let o = cluster.kubectl(&[
        "delete",
        "pods",
        "-n",
        "default",
        "-l",
        "app=burst",
        "--wait=true",
    ]);
    assert!(o.ok(), "delete the burst's pods: {}", o.all());
    Burst {
        lane,
        secs,
        relist: Histogram::parse(&m1, RELIST, None).since(&Histogram::parse(&m0, RELIST, None)),
        after_ready_ms,
        released_ms,
        probe_connects,
    }
}

/// The `q` quantile of `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

fn min_of(ws: &[&Window], f: impl Fn(&Window) -> f64) -> f64 {
    ws.iter().map(|w| f(w)).fold(f64::INFINITY, f64::min)
}

#[test]
#[ignore = "needs Kubernetes binaries and root: CRISP_KUBE_BIN_DIR=... (hack/lanes.sh pleg)"]
fn kubelets_relist_direct_and_through_crisp_on_a_full_node() {
    let pods = env_or("CRISP_PLEG_PODS", 100);
    let rounds = env_or("CRISP_PLEG_ROUNDS", 3);
    let bins = kube_bin_dir();
    let minor = kubelet_minor(&bins);
    let _bridge = BridgeGuard;
    let cluster = Cluster::up(&bins);
    let (node, joined) = join_with(&cluster, &bins, &kubelet_config_for(minor));
    eprintln!(
        "kubelet joined, node Ready in {}: {}",
        secs(joined),
        cluster.versions()
    );

    let t = Instant::now();
    cluster.apply(&deployment(pods));
    let took = cluster.wait(
        &format!("{pods} pods Running"),
        Duration::from_secs(120 + 6 * pods as u64),
        || running(&cluster) == pods,
    );
    eprintln!(
        "pleg| 1.{minor}: {pods} pods Running in {} ({:.0} ms a pod, {} since the Deployment)",
        secs(took),
        took.as_secs_f64() * 1e3 / pods as f64,
        secs(t.elapsed())
    );

    node.put_crisp();
    crisp_start(&node, CONTAINERD);
    let socat = Socat::start(&node);
    let since = node_now(&node);
    let crisp_cpu = || unit_cpu(&node, "crisp-lane.service");
    let socat_cpu = || socat.cpu();
    let none = || 0.0;
    let lanes: [(&'static str, &str, &dyn Fn() -> f64); 3] = [
        ("direct", CONTAINERD, &none),
        ("socat", SOCAT, &socat_cpu),
        ("crisp", CRISP, &crisp_cpu),
    ];
    let mut windows = Vec::new();
    for round in 0..rounds {
        // Each lane first, second and third in turn.
        for k in 0..lanes.len() {
            let (lane, endpoint, cpu) = lanes[(round + k) % lanes.len()];
            let w = window(&cluster, &node, lane, endpoint, cpu);
            eprintln!("{}", w.row(minor, round + 1));
            windows.push(w);
            assert_eq!(
                running(&cluster),
                pods,
                "pods not Running after the {lane} window"
            );
        }
    }

    // A burst of ordered pods beside the rest, through crisp and then direct.
    let n = env_or("CRISP_PLEG_BURST", 40).min(pods);
    let mut bursts = Vec::new();
    if n > 0 {
        let left = pods - n;
        cluster.must(&[
            "scale",
            "deployment/pleg",
            "-n",
            "default",
            &format!("--replicas={left}"),
        ]);
        cluster.wait(
            &format!("the Deployment down to {left} pods"),
            Duration::from_secs(180),
            || phases(&cluster, "pleg").len() == left,
        );
        let rt = Runtime::new(&node);
        for (lane, endpoint) in [("crisp", CRISP), ("direct", CONTAINERD)] {
            let b = burst(&cluster, &node, &rt, lane, endpoint, n);
            eprintln!(
                "pleg| 1.{minor} burst of {n} Linkerd-shaped pods beside {left}, {:6}: all running in {:5.1} s; relist mean {:6.2} ms (p99 ≤ {} ms) over {:.0} relists; app created after its proxy turned ready: p50 {:7.1} ms, p99 {:7.1} ms, min {:7.1} ms, max {:7.1} ms; {}; crisp's probe connects {:.0} ({:.1} a second)",
                b.lane,
                b.secs,
                b.relist.mean_ms(),
                b.relist.at_most_ms(0.99),
                b.relist.count,
                quantile(&b.after_ready_ms, 0.5),
                quantile(&b.after_ready_ms, 0.99),
                quantile(&b.after_ready_ms, 0.0),
                quantile(&b.after_ready_ms, 1.0),
                if b.released_ms.is_empty() {
                    "no hold".to_string()
                } else {
                    format!(
                        "crisp forwarded it (its journal) for {} of {n}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms after ready",
                        b.released_ms.len(),
                        quantile(&b.released_ms, 0.5),
                        quantile(&b.released_ms, 0.99),
                        quantile(&b.released_ms, 1.0)
                    )
                },
                b.probe_connects,
                b.probe_connects / b.secs,
            );
            bursts.push(b);
        }
    }
    let journal = journal_since(&node, "kubelet", &since);
    kubelet_on(&cluster, &node, CONTAINERD);
    crisp_kill(&node);

    let lane = |name: &str| -> Vec<&Window> { windows.iter().filter(|w| w.lane == name).collect() };
    let (direct, socat_w, crisp) = (lane("direct"), lane("socat"), lane("crisp"));
    let d = min_of(&direct, |w| w.relist.mean_ms());
    let so = min_of(&socat_w, |w| w.relist.mean_ms());
    let c = min_of(&crisp, |w| w.relist.mean_ms());
    let per = |ws: &[&Window], f: fn(&Window) -> f64| min_of(ws, f);
    let lists = |ws: &[&Window]| {
        format!(
            "ListPodSandbox {:.2} ms, ListContainers {:.2} ms",
            per(ws, |w| w.sandboxes.mean_ms()),
            per(ws, |w| w.containers.mean_ms())
        )
    };
    eprintln!(
        "pleg| 1.{minor}, {pods} pods, min over {rounds} rounds: relist mean direct {d:.2} ms, socat {so:.2} ms (+{:.2}), crisp {c:.2} ms (+{:.2}: {:.2}× direct, {:.2}× socat's added); direct {}, socat {}, crisp {}; CPU ÷ relists: socat {:.2} ms, crisp {:.2} ms",
        so - d,
        c - d,
        c / d,
        (c - d) / (so - d),
        lists(&direct),
        lists(&socat_w),
        lists(&crisp),
        per(&socat_w, |w| w.proxy_cpu / w.relist.count * 1e3),
        per(&crisp, |w| w.proxy_cpu / w.relist.count * 1e3),
    );

    for w in &windows {
        // One relist a second, each starting a second after the last one's start at most
        // (kubelet's relist period), with room for a slow one.
        assert!(
            w.interval.mean_ms() < 1500.0,
            "kubelet on {} relisted every {:.0} ms on average",
            w.lane,
            w.interval.mean_ms()
        );
    }
    // kubelet says "PLEG is not healthy: pleg has yet to be successful" until its first relist
    // after a start; "pleg was last seen active ..." means relists stopped.
    let unhealthy: Vec<&str> = journal
        .lines()
        .filter(|l| l.contains("PLEG is not healthy") && !l.contains("yet to be successful"))
        .collect();
    assert!(
        unhealthy.is_empty(),
        "kubelet found its PLEG unhealthy: {unhealthy:?}"
    );
    for b in &bursts {
        let first = quantile(&b.after_ready_ms, 0.0);
        if b.lane == "crisp" {
            // Ordered: no app created before its proxy served its readiness path.
            assert!(
                first >= 0.0,
                "through crisp an app was created {:.0} ms before its proxy was ready",
                -first
            );
            assert_eq!(
                b.released_ms.len(),
                b.after_ready_ms.len(),
                "holds crisp's journal does not show forwarded"
            );
            let early = quantile(&b.released_ms, 0.0);
            assert!(
                early >= 0.0,
                "crisp forwarded an app {:.0} ms before its proxy was ready",
                -early
            );
        } else {
            // kubelet alone waits for nothing: the lane can tell the two apart.
            assert!(
                first < 0.0,
                "direct, no app was created before its proxy was ready"
            );
        }
    }
    assert!(
        c <= d + (0.5 * d).max(1.0),
        "kubelet's relist through crisp: {c:.2} ms against {d:.2} ms direct (min over {rounds} rounds)"
    );
}

#[test]
fn histograms_are_read_from_kubelets_text_and_subtracted() {
    let before = "# HELP kubelet_pleg_relist_duration_seconds x\n\
        # TYPE kubelet_pleg_relist_duration_seconds histogram\n\
        kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"} 10\n\
        kubelet_pleg_relist_duration_seconds_bucket{le=\"0.01\"} 18\n\
        kubelet_pleg_relist_duration_seconds_bucket{le=\"+Inf\"} 20\n\
        kubelet_pleg_relist_duration_seconds_sum 0.12\n\
        kubelet_pleg_relist_duration_seconds_count 20\n\
        kubelet_pleg_relist_interval_seconds_count 99\n";
    let after = before
        .replace("\"0.005\"} 10", "\"0.005\"} 30")
        .replace("\"0.01\"} 18", "\"0.01\"} 58")
        .replace("\"+Inf\"} 20", "\"+Inf\"} 60")
        .replace("_sum 0.12", "_sum 0.52")
        .replace("_count 20", "_count 60");
    let d = Histogram::parse(&after, RELIST, None).since(&Histogram::parse(before, RELIST, None));
    assert_eq!(d.count, 40.0);
    assert!((d.mean_ms() - 10.0).abs() < 1e-9, "{}", d.mean_ms());
    assert_eq!(d.at_most_ms(0.5), 5.0);
    assert_eq!(d.at_most_ms(0.99), 10.0);
    assert_eq!(Histogram::default().at_most_ms(0.5), f64::INFINITY);
    // The interval's series are not the duration's.
    assert_eq!(Histogram::parse(before, INTERVAL, None).count, 99.0);

    // Series of one label summed, the others left out.
    let ops = "kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"list_containers\",le=\"0.005\"} 3\n\
        kubelet_runtime_operations_duration_seconds_bucket{operation_type=\"list_containers\",le=\"+Inf\"} 4\n\
        kubelet_runtime_operations_duration_seconds_sum{operation_type=\"list_containers\"} 0.008\n\
        kubelet_runtime_operations_duration_seconds_count{operation_type=\"list_containers\"} 4\n\
        kubelet_runtime_operations_duration_seconds_sum{operation_type=\"version\"} 9\n\
        kubelet_runtime_operations_duration_seconds_count{operation_type=\"version\"} 9\n";
    let h = Histogram::parse(ops, RUNTIME_OPS, Some("operation_type=\"list_containers\""));
    assert_eq!((h.count, h.mean_ms()), (4.0, 2.0));
    assert_eq!(h.at_most_ms(0.5), 5.0);
    assert_eq!(Histogram::parse(ops, RUNTIME_OPS, None).count, 13.0);
}

#[test]
fn instants_and_pod_names_are_read_from_stat_and_journal_lines() {
    assert_eq!(epoch_ns("1764478000.123456789"), 1_764_478_000_123_456_789);
    // journalctl -o short-unix: microseconds
    assert_eq!(epoch_ns("1764478000.123456"), 1_764_478_000_123_456_000);
    assert_eq!(epoch_ns("1764478000"), 1_764_478_000_000_000_000);
    let line = "1764478000.123456 crisp-node crisp[81]: INFO pod=default/burst-12: sidecars ready; forwarding CreateContainer container_name=app";
    assert_eq!(pod_index(line), Some(12));
    assert_eq!(pod_index("no pod here"), None);
    assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.0), 1.0);
    assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
    assert_eq!(quantile(&[3.0, 1.0, 2.0], 1.0), 3.0);
}
