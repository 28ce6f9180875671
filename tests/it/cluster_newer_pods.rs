//! Issue #45's rows of the kubelet-1.35 and 1.36 lanes (`cluster_kubelets.rs`), each run direct
//! and through crisp with the tap attached:
//! - **a restart rule** (KEP-5307, beta and on by default from 1.35): an app with
//!   `restartPolicy: Never` and a rule restarting it on exit code 42 exits 42 once; kubelet
//!   re-creates it alone while its legacy sidecar runs. Through crisp the re-created app is
//!   neither refused nor held (its sidecar is ready): the tap's CreateContainer of attempt ≥ 1.
//! - **a pod restarted in place** (KEP-5532, `RestartAllContainersOnContainerExits`, beta and
//!   on by default in 1.36): the same app with a `RestartAllContainers` rule; kubelet kills and
//!   removes every container and starts the pod again in its sandbox (no new RunPodSandbox).
//!   Direct, the second app is created before its legacy sidecar (listed after it) is ready;
//!   through crisp the second start is ordered like the first: the app created after the
//!   sidecar's second instance turned ready.
//! - **streamed lists** (KEP-5825, `CRIListStreaming`, alpha in 1.36; the lane turns the gate
//!   on): kubelet's `Stream*` calls reach containerd 1.6 through crisp and come back with its
//!   own `Unimplemented`, on which kubelet falls back to the unary lists.
//! - **bytes in env** (cri-api v0.36.2, kubernetes#139132): a Secret that is not UTF-8 (ff fe
//!   41) in an env var; the container sees the same bytes direct and through crisp (on
//!   containerd 1.6, ef bf bd ef bf bd 41: the OCI spec is JSON, which cannot carry ff fe), and
//!   the tap decodes the CreateContainer (no `_undecodable`) with the value redacted.
//!
//! Times come from containerd's own records, read on its socket in the node (never through
//! crisp); a container kubelet removes is remembered as last seen.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cluster_kubelets::{ms, Runtime, Tap, READY_AFTER};
use crate::cluster_rollout::Cluster;
use k8s_cri::v1 as cri;

/// One container instance of a pod, as containerd records it (ns since the epoch; 0: not yet).
#[derive(Clone, Debug, Default)]
pub(crate) struct Instance {
    pub(crate) name: String,
    pub(crate) attempt: u32,
    pub(crate) created: i64,
    pub(crate) started: i64,
    pub(crate) finished: i64,
    pub(crate) exit_code: i32,
}

/// Every container of `pod` containerd lists now, by id, with its status.
fn list(rt: &Runtime, pod: &str) -> BTreeMap<String, Instance> {
    rt.rt.block_on(async {
        let mut c = crate::support::runtime_client(&rt.sock).await;
        let filter = cri::ContainerFilter {
            label_selector: [("io.kubernetes.pod.name".to_string(), pod.to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let Ok(list) = c
            .list_containers(cri::ListContainersRequest {
                filter: Some(filter),
            })
            .await
        else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for ct in list.into_inner().containers {
            let Ok(status) = c
                .container_status(cri::ContainerStatusRequest {
                    container_id: ct.id.clone(),
                    verbose: false,
                })
                .await
            else {
                continue;
            };
            let Some(s) = status.into_inner().status else {
                continue;
            };
            let md = s.metadata.unwrap_or_default();
            out.insert(
                ct.id,
                Instance {
                    name: md.name,
                    attempt: md.attempt,
                    created: s.created_at,
                    started: s.started_at,
                    finished: s.finished_at,
                    exit_code: s.exit_code,
                },
            );
        }
        out
    })
}

/// Every instance of `pod`'s containers seen so far, kept after kubelet removes them.
struct Seen(BTreeMap<String, Instance>);

impl Seen {
    fn update(&mut self, rt: &Runtime, pod: &str) {
        for (id, i) in list(rt, pod) {
            self.0.insert(id, i);
        }
    }

    /// `name`'s instances, oldest first.
    fn of(&self, name: &str) -> Vec<Instance> {
        let mut v: Vec<Instance> = self
            .0
            .values()
            .filter(|i| i.name == name)
            .cloned()
            .collect();
        v.sort_by_key(|i| i.created);
        v
    }
}

const SHARED: &str = "    volumeMounts:\n    - name: shared\n      mountPath: /shared\n";

/// A pod whose app (listed first) exits 42 once, a second after it starts, and whose `action`
/// rule restarts it on that code; its legacy sidecar `proxy` turns ready READY_AFTER after it
/// starts. The marker lives in an emptyDir, which an in-place restart keeps.
fn rule_pod(name: &str, action: &str) -> String {
    let app = format!(
        "if [ ! -e /shared/once ]; then touch /shared/once; sleep 1; exit 42; fi; {}",
        super::cluster_kubelets::APP
    );
    let proxy = format!(
        "trap 'exit 0' TERM; sleep {}; touch /tmp/ready; while true; do sleep 1 & wait $!; done",
        READY_AFTER.as_secs()
    );
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  annotations:\n    crisp.dev/sidecars: \"proxy\"\n    crisp.dev/ready.proxy: 'exec:[\"test\",\"-e\",\"/tmp/ready\"]'\nspec:\n  automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 15\n  volumes:\n  - name: shared\n    emptyDir: {{}}\n  containers:\n  - name: app\n    image: crisp.test/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {app:?}]\n    restartPolicy: Never\n    restartPolicyRules:\n    - action: {action}\n      exitCodes:\n        operator: In\n        values: [42]\n{SHARED}  - name: proxy\n    image: crisp.test/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {proxy:?}]\n"
    )
}

/// What a rule pod showed: the app's two instances, the sidecar's instances, the sandbox ids
/// before and after.
pub(crate) struct RuleRun {
    pub(crate) apps: Vec<Instance>,
    pub(crate) proxies: Vec<Instance>,
    pub(crate) sandboxes: (String, String),
}

/// Applies a rule pod and watches it (every 100 ms) until its app's second instance has run
/// for READY_AFTER plus a second (and, with `in_place`, the sidecar's second instance exists),
/// then deletes it.
fn run_rule_pod(cluster: &Cluster, rt: &Runtime, name: &str, action: &str) -> RuleRun {
    let in_place = action == "RestartAllContainers";
    cluster.apply(&rule_pod(name, action));
    let mut seen = Seen(BTreeMap::new());
    let mut first_sandbox = String::new();
    let t = Instant::now();
    loop {
        seen.update(rt, name);
        if first_sandbox.is_empty() {
            first_sandbox = rt.sandbox_id(name);
        }
        let apps = seen.of("app");
        let proxies = seen.of("proxy");
        let settled = apps.len() >= 2
            && apps[1].started > 0
            && (!in_place || proxies.len() >= 2)
            && ms(apps[1].started, wall_ns()) > (READY_AFTER.as_millis() + 1000) as f64;
        if settled {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "{name}: the app never ran a second time ({action}): apps {apps:?}, proxies {proxies:?}\n{}",
            cluster.jsonpath(&["pod", name], "{.status}")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let second_sandbox = rt.sandbox_id(name);
    let o = cluster.kubectl(&["delete", "pod", name, "--wait=false"]);
    assert!(o.ok(), "delete {name}: {}", o.all());
    cluster.wait(
        &format!("pod {name} gone"),
        Duration::from_secs(120),
        || {
            cluster
                .kubectl(&["get", "pod", name, "--ignore-not-found", "-o", "name"])
                .stdout
                .trim()
                .is_empty()
        },
    );
    RuleRun {
        apps: seen.of("app"),
        proxies: seen.of("proxy"),
        sandboxes: (first_sandbox, second_sandbox),
    }
}

fn wall_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The non-UTF-8 Secret and the pod that prints its env var's bytes, then sleeps.
const BINARY_ENV: &str = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: lane-binary\n  namespace: default\ndata:\n  v: //5B\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: binenv\n  namespace: default\nspec:\n  automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: crisp.test/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"printf %s \\\"$BIN\\\" | od -An -tx1; exec sleep 3600\"]\n    env:\n    - name: BIN\n      valueFrom:\n        secretKeyRef:\n          name: lane-binary\n          key: v\n";

/// The bytes the container printed for its env var (`od -An -tx1` of its value), after the
/// pod ran; deletes the pod.
fn run_binary_env(cluster: &Cluster) -> String {
    cluster.apply(BINARY_ENV);
    cluster.wait("binenv Running", Duration::from_secs(120), || {
        cluster.jsonpath(&["pod", "binenv"], "{.status.phase}") == "Running"
    });
    let mut logs = String::new();
    cluster.wait("binenv's output", Duration::from_secs(30), || {
        logs = cluster.kubectl(&["logs", "binenv"]).stdout;
        !logs.trim().is_empty()
    });
    let _ = cluster.kubectl(&["delete", "pod", "binenv", "--wait=false"]);
    cluster.wait("pod binenv gone", Duration::from_secs(120), || {
        cluster
            .kubectl(&["get", "pod", "binenv", "--ignore-not-found", "-o", "name"])
            .stdout
            .trim()
            .is_empty()
    });
    logs.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the rows showed on one path (direct or through crisp), for the comparison.
#[derive(Default)]
pub(crate) struct Rows {
    /// Restart rule: the app's exit → its re-creation (ms).
    pub(crate) rule_recreate_ms: Option<f64>,
    /// In place: the sidecar's second start → the app's second creation (ms).
    pub(crate) in_place_create_ms: Option<f64>,
    pub(crate) env_bytes: Option<String>,
}

/// The rows kubelet 1.`minor` has, on the path `via` ("direct" or "crisp"). Through crisp
/// (`tap` given) each is also checked in the tap.
pub(crate) fn run(
    cluster: &Cluster,
    rt: &Runtime,
    minor: u32,
    via: &str,
    tap: Option<&Tap>,
) -> Rows {
    let mut rows = Rows::default();
    if minor >= 35 {
        let name = format!("rule-{via}");
        let r = run_rule_pod(cluster, rt, &name, "Restart");
        let (a1, a2) = (&r.apps[0], &r.apps[1]);
        assert_eq!(
            a1.exit_code, 42,
            "{name}: the app's first exit: {:?}",
            r.apps
        );
        assert_eq!(
            r.proxies.len(),
            1,
            "{name}: a restart rule re-created the sidecar too: {:?}",
            r.proxies
        );
        let gap = ms(a1.finished, a2.created);
        eprintln!(
            "rule| 1.{minor} {via:6} app exited 42 → re-created {gap:.0} ms later (attempt {}), sidecar started → first app created {:.0} ms, sandbox kept: {}",
            a2.attempt,
            ms(r.proxies[0].started, a1.created),
            r.sandboxes.0 == r.sandboxes.1
        );
        if let Some(tap) = tap {
            // Its sidecar is ready: the re-created app is neither refused nor held.
            let again: Vec<serde_json::Value> = tap
                .lines()
                .into_iter()
                .filter(|l| {
                    l["pod_name"] == name.as_str()
                        && l["method"] == "CreateContainer"
                        && l["request"]["config"]["metadata"]["name"] == "app"
                        && l["request"]["config"]["metadata"]["attempt"].as_u64() >= Some(1)
                })
                .collect();
            assert!(
                !again.is_empty(),
                "{name}: no re-created app's CreateContainer in the tap"
            );
            for l in &again {
                assert!(
                    l["code"] == 0 && l["held_ms"].as_f64().unwrap_or(0.0) < 1000.0,
                    "{name}: crisp refused or held the app a restart rule re-created: {l}"
                );
            }
            eprintln!(
                "rule| 1.{minor} crisp  the re-created app's CreateContainer: {} call(s), held at most {:.1} ms, none refused",
                again.len(),
                again.iter().filter_map(|l| l["held_ms"].as_f64()).fold(0.0, f64::max)
            );
        }
        rows.rule_recreate_ms = Some(gap);
    }
    if minor >= 36 {
        let name = format!("inplace-{via}");
        let r = run_rule_pod(cluster, rt, &name, "RestartAllContainers");
        assert_eq!(
            r.sandboxes.0, r.sandboxes.1,
            "{name}: kubelet made a new sandbox: not an in-place restart"
        );
        let (a2, p2) = (&r.apps[1], &r.proxies[1]);
        let gap = ms(p2.started, a2.created);
        let kill = match (r.apps[0].finished, r.proxies[0].finished) {
            (a, p) if a > 0 && p > 0 => format!(
                "first sidecar finished {:.0} ms after the first app",
                ms(a, p)
            ),
            _ => "the first instances were removed before they were read".to_string(),
        };
        eprintln!(
            "inplace| 1.{minor} {via:6} same sandbox; second sidecar started → second app created {gap:.0} ms (ready after {} ms); {kill}",
            READY_AFTER.as_millis()
        );
        if let Some(tap) = tap {
            // kubelet kills the others one by one, in reverse order, with no grace
            // (`kuberuntime_manager.go`, ContainersToReset, 1.36.3), raised to its 2 s minimum
            // (`killContainer`): a StopContainer with timeout 2, where the pod's deletion at the
            // end carries what is left of its 15 s grace (13 s, say). crisp stays out of that
            // kill.
            let stops: Vec<f64> = tap
                .lines()
                .iter()
                .filter(|l| l["pod_name"] == name.as_str() && l["method"] == "StopContainer")
                // Calls only (a hold event has no request).
                .filter(|l| {
                    l.get("hold").is_none()
                        && l["request"]["timeout"].as_i64().is_some_and(|t| t <= 2)
                })
                .filter_map(|l| l["held_ms"].as_f64())
                .collect();
            let longest = stops.iter().copied().fold(0.0, f64::max);
            // The pod's container calls and holds as the tap showed them, for the log.
            let seen: Vec<String> = tap
                .lines()
                .iter()
                .filter(|l| {
                    l["pod_name"] == name.as_str()
                        && l["method"]
                            .as_str()
                            .is_some_and(|m| m.ends_with("Container"))
                })
                .map(|l| {
                    format!(
                        "{} {} {} {}{} held {} ms code {} {}",
                        l["time"].as_str().unwrap_or(""),
                        l["method"].as_str().unwrap_or(""),
                        l["container_name"].as_str().unwrap_or(""),
                        l.get("hold")
                            .map_or(String::new(), |h| format!("hold {h} ")),
                        l["request"]["timeout"]
                            .as_i64()
                            .map_or(String::new(), |t| format!("timeout {t} s")),
                        l["held_ms"],
                        l["code"],
                        l["message"].as_str().unwrap_or("")
                    )
                })
                .collect();
            eprintln!(
                "inplace| 1.{minor} crisp  the tap on {name}:\n  {}",
                seen.join("\n  ")
            );
            eprintln!(
                "inplace| 1.{minor} crisp  the restart's kill: {} StopContainer call(s) (timeout 2 s), held at most {longest:.1} ms",
                stops.len()
            );
            assert!(
                !stops.is_empty(),
                "{name}: no StopContainer of the restart's kill in the tap"
            );
            assert!(
                longest < 1000.0,
                "{name}: crisp held a stop of the in-place restart {longest:.0} ms"
            );
            assert!(
                gap >= READY_AFTER.as_millis() as f64 - 100.0,
                "{name}: after the in-place restart the app was created {gap:.0} ms after its sidecar started, before it was ready: apps {:?} proxies {:?}",
                r.apps,
                r.proxies
            );
        }
        rows.in_place_create_ms = Some(gap);

        let bytes = run_binary_env(cluster);
        eprintln!("env| 1.{minor} {via:6} the container's env var, as od prints it: {bytes}");
        // The OCI spec runc reads is JSON, which has no string for the bytes ff fe: containerd
        // 1.6 writes them as U+FFFD (ef bf bd) each, direct and through crisp alike (1.36.3
        // on containerd 1.6.20, 2026-11-29). What matters here is that the value arrives, and
        // the same through crisp (compared by the caller).
        assert!(
            bytes.ends_with("41") && bytes.split(' ').count() >= 3,
            "{via}: the non-UTF-8 env value reached the container as {bytes:?}"
        );
        if let Some(tap) = tap {
            let creates: Vec<serde_json::Value> = tap
                .lines()
                .into_iter()
                .filter(|l| l["pod_name"] == "binenv" && l["method"] == "CreateContainer")
                .collect();
            assert!(!creates.is_empty(), "binenv: no CreateContainer in the tap");
            for l in &creates {
                let text = l.to_string();
                assert!(
                    l["request"].get("_undecodable").is_none(),
                    "the tap could not decode a CreateContainer with bytes in env: {text}"
                );
                let env = &l["request"]["config"]["envs"];
                assert!(
                    env.as_array()
                        .is_some_and(|e| e.iter().any(|kv| kv["key"] == "BIN")),
                    "binenv's env in the tap: {env}"
                );
                assert!(
                    !text.contains("//5B")
                        && !text.contains("\\u00ff")
                        && !text.contains('\u{fffd}'),
                    "the env value in the tap: {text}"
                );
            }
            eprintln!(
                "env| 1.{minor} crisp  the tap decoded {} CreateContainer(s) with bytes in env, value redacted",
                creates.len()
            );
        }
        rows.env_bytes = Some(bytes);
    }
    rows
}

/// Streamed lists through crisp (kubelet 1.36 with `CRIListStreaming` on): every `Stream*` call
/// kubelet made came back with containerd's own answer.
pub(crate) fn streamed_lists(tap: &Tap, minor: u32) {
    let lines = tap.lines();
    let streams: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| {
            l["method"]
                .as_str()
                .is_some_and(|m| m.starts_with("Stream"))
        })
        .collect();
    let mut by: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for l in &streams {
        let e = by
            .entry(l["method"].as_str().unwrap_or("").to_string())
            .or_default();
        e.0 += 1;
        e.1 = format!("code {} {}", l["code"], l["message"].as_str().unwrap_or(""));
    }
    eprintln!("streams| 1.{minor}: kubelet's streamed lists through crisp: {by:?}");
    assert!(
        !streams.is_empty(),
        "kubelet 1.{minor} with CRIListStreaming made no Stream* call through crisp"
    );
    for l in &streams {
        // containerd 1.6 and 2.3 have none of them: their own Unimplemented, relayed — grpc-go's
        // "unknown method X" from 1.6, whose cri-api has no such method; from 2.3.4, whose
        // cri-api has them, the generated stub's "method X not implemented".
        let m = l["message"].as_str().unwrap_or("");
        let method = l["method"].as_str().unwrap_or("");
        assert!(
            l["code"] == 0
                || m.contains(&format!("unknown method {method}"))
                || m == format!("method {method} not implemented"),
            "a Stream* call answered by someone else than containerd: {l}"
        );
    }
}
