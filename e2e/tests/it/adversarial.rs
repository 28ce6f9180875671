//! Issue #26 end to end: hostile pods beside an ordinary one on a real containerd, driven by the
//! kubelet emulator through grpc-go. "No pod author can make the node worse with crisp than
//! without it": the ordinary pod's start and stop stay within a small factor of a quiet node's,
//! crisp's memory and CPU stay bounded, no panic, no log line over a few KiB — and the hostile
//! pods themselves still start and stop.
//!
//! Each test prints its measurements (`eprintln!`) for the issue's closing note.

use std::time::{Duration, Instant};

use anyhow::Result;
use crisp_e2e::crisp::Usage;
use crisp_e2e::emulator::PodSpec;
use crisp_e2e::stack::{secs, Stack};
use crisp_e2e::tapcli::TapCli;

const STEP: Duration = Duration::from_secs(90);

/// No line of crisp's log may be longer than this, whatever a pod carries.
const MAX_LOG_LINE: usize = 4096;

fn pod(yaml: &str) -> PodSpec {
    PodSpec::from_yaml(yaml).expect("test pod YAML").remove(0)
}

/// A container that only sleeps; exits 0 on SIGTERM at once.
fn sleeper(name: &str) -> String {
    format!("  - name: {name}\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n")
}

/// An ordinary annotated pod: sidecar `proxy` (ready once it runs) before `app`.
fn ordinary(name: &str) -> String {
    format!("name: {name}\nhostNetwork: true\nterminationGracePeriodSeconds: 5\nannotations:\n  crisp.dev/sidecars: proxy\ncontainers:\n{}{}", sleeper("proxy"), sleeper("app"))
}

/// Adds `yaml` and waits until all its containers run: (uid, how long it took).
async fn timed_start(st: &Stack, yaml: &str) -> Result<(String, Duration)> {
    let t = Instant::now();
    let uid = st.run_pod(pod(yaml), STEP).await?;
    Ok((uid, t.elapsed()))
}

/// Deletes pod `uid` and waits until it terminated: how long it took.
async fn timed_stop(st: &Stack, uid: &str) -> Result<Duration> {
    let t = Instant::now();
    st.delete_pod(uid, None, STEP).await?;
    Ok(t.elapsed())
}

/// The checks every hostile scenario ends with: crisp never panicked and never wrote a line
/// longer than [`MAX_LOG_LINE`]; prints its usage since `before`.
fn node_is_healthy(st: &Stack, what: &str, before: Usage) -> Result<Usage> {
    let now = st.crisp.usage()?;
    let log = st.crisp.log_health();
    eprintln!(
        "{what}: crisp CPU {:.2} s, peak RSS {} KiB (RSS {} KiB), {} log lines, longest {} B",
        (now.cpu.saturating_sub(before.cpu)).as_secs_f64(),
        now.peak_rss_kib,
        now.rss_kib,
        log.lines,
        log.longest
    );
    assert!(log.panics.is_empty(), "crisp panicked: {:?}", log.panics);
    assert!(
        log.longest <= MAX_LOG_LINE,
        "a log line of {} B (cap {MAX_LOG_LINE})",
        log.longest
    );
    Ok(now)
}

/// Item 1: `sidecar.istio.io/status` listing ~40,000 names (240 KB, inside the API's 256 KiB
/// limit for all of a pod's annotations) on three pods at once. Before the bound each sandbox
/// cost crisp seconds of CPU on a tokio worker and an ordinary pod's start waited behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_injector_status_beside_an_ordinary_pod() -> Result<()> {
    let st = Stack::start(false, "", |_| {}).await?;
    let (quiet_uid, quiet) = timed_start(&st, &ordinary("quiet")).await?;
    let quiet_stop = timed_stop(&st, &quiet_uid).await?;
    let before = st.crisp.usage()?;

    let names: Vec<String> = (0..40_000u32)
        .map(|i| format!("\"{}\"", base26(i)))
        .collect();
    let status = format!(
        "{{\"initContainers\":[],\"containers\":[{}]}}",
        names.join(",")
    );
    assert!(
        status.len() > 200_000 && status.len() < 256 * 1024,
        "{} B",
        status.len()
    );
    let mut hostile = Vec::new();
    for i in 0..3 {
        let yaml =
            format!("name: istio-{i}\nhostNetwork: true\nterminationGracePeriodSeconds: 5\nannotations:\n  sidecar.istio.io/status: '{status}'\ncontainers:\n{}", sleeper("app"));
        hostile.push(st.kubelet.add_pod(pod(&yaml))?);
    }
    let (busy_uid, busy) = timed_start(&st, &ordinary("busy")).await?;
    for uid in &hostile {
        st.wait_all_running(uid, STEP).await?;
    }
    let busy_stop = timed_stop(&st, &busy_uid).await?;
    eprintln!(
        "ordinary pod start: quiet {:.3} s, beside 3 oversized-status pods {:.3} s; stop: quiet {:.3} s, beside {:.3} s",
        quiet.as_secs_f64(),
        busy.as_secs_f64(),
        quiet_stop.as_secs_f64(),
        busy_stop.as_secs_f64()
    );
    // A small factor, with room for a loaded CI machine (3.4 s against 0.8 s was seen there,
    // with four test threads): on 4b4ce37 it was 25.9 s against 0.35 s.
    assert!(
        busy <= quiet * 5 + Duration::from_secs(2),
        "start {busy:?} beside the hostile pods, {quiet:?} on a quiet node"
    );
    assert!(
        busy_stop <= quiet_stop * 5 + Duration::from_secs(2),
        "stop {busy_stop:?} beside the hostile pods, {quiet_stop:?} quiet"
    );
    let after = node_is_healthy(&st, "oversized injector status", before)?;
    let cpu = after.cpu.saturating_sub(before.cpu);
    assert!(
        cpu < Duration::from_secs(2),
        "crisp spent {cpu:?} of CPU on three pods"
    );
    // The hostile pods are not treated as injected, and still stop.
    for uid in &hostile {
        st.delete_pod(uid, None, STEP).await?;
    }
    Ok(())
}

/// `a`, `b`, …, `z`, `ba`, … — distinct DNS-1123 names.
fn base26(mut i: u32) -> String {
    let mut s = Vec::new();
    loop {
        s.push(b'a' + (i % 26) as u8);
        i /= 26;
        if i == 0 {
            break;
        }
    }
    s.reverse();
    String::from_utf8(s).expect("ascii")
}

/// Item 2: terminationGracePeriodSeconds near 2^63. kubelet's own deadline wraps to an ordinary
/// one (emulated: `stop_deadline`), so the sidecar's StopContainer arrives; the stop gate's
/// arithmetic must not panic, or the pod could never be stopped. Without crisp containerd
/// stops such a pod at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_grace_period_pod_still_stops_in_order() -> Result<()> {
    let st = Stack::start(false, "", |_| {}).await?;
    let before = st.crisp.usage()?;
    let app = "  - name: app\n    command: [sh, -c, \"trap 'sleep 1; exit 0' TERM; while true; do sleep 0.1; done\"]\n";
    for (name, grace) in [
        ("max", i64::MAX),
        ("near", i64::MAX - 1),
        ("wraps-low", 9_223_372_036),
    ] {
        let yaml =
            format!("name: {name}\nhostNetwork: true\nterminationGracePeriodSeconds: {grace}\nannotations:\n  crisp.dev/sidecars: proxy\ncontainers:\n{}{app}", sleeper("proxy"));
        let (uid, _) = timed_start(&st, &yaml).await?;
        let took = timed_stop(&st, &uid).await?;
        let (proxy, app) = (
            st.status(&uid, "proxy").await?,
            st.status(&uid, "app").await?,
        );
        eprintln!(
            "grace {grace}: pod stopped in {:.3} s; app finished {:.3} s before its sidecar",
            took.as_secs_f64(),
            secs(proxy.finished_at - app.finished_at)
        );
        assert!(
            took < Duration::from_secs(30),
            "grace {grace}: the pod took {took:?} to stop"
        );
        assert!(
            app.finished_at <= proxy.finished_at,
            "grace {grace}: the sidecar finished before the app"
        );
    }
    node_is_healthy(&st, "extreme grace periods", before)?;
    Ok(())
}

/// Item 4: exec readiness probes that print 16 MB before failing, on four pods at once. crisp
/// reads the exit code only; its memory must not grow with what the probes print.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_probes_with_huge_output_do_not_grow_crisp() -> Result<()> {
    let st = Stack::start(false, "[ordering]\nstart_timeout = \"4s\"\n", |_| {}).await?;
    let before = st.crisp.usage()?;
    let probe = r#"exec:[\"sh\",\"-c\",\"head -c 16000000 /dev/zero; test -f /tmp/ready\"]"#;
    let mut uids = Vec::new();
    for i in 0..4 {
        let yaml = format!(
            "name: loud-{i}\nhostNetwork: true\nterminationGracePeriodSeconds: 2\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: \"{probe}\"\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 2; touch /tmp/ready; sleep 3600 & wait\"]\n{}",
            sleeper("app")
        );
        uids.push(st.kubelet.add_pod(pod(&yaml))?);
    }
    for uid in &uids {
        st.wait_all_running(uid, STEP).await?;
    }
    let after = node_is_healthy(&st, "exec probes printing 16 MB", before)?;
    let grew = after.peak_rss_kib.saturating_sub(before.peak_rss_kib);
    assert!(
        grew < 32 * 1024,
        "crisp's peak RSS grew {grew} KiB while probes printed 16 MB each"
    );
    for uid in &uids {
        st.delete_pod(uid, None, STEP).await?;
    }
    Ok(())
}

/// Item 7: the probe limiter shared fairly. Many pods whose sidecars are never ready (nothing
/// listens on their port: each probe is refused at once, and retried every probe interval)
/// saturate a small node budget of connects; an ordinary pod whose sidecar is ready must still
/// be released promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_ready_sidecars_do_not_delay_a_ready_pod() -> Result<()> {
    let cfg = "[ordering]\nprobe_connects_per_second = 10\nmax_probes_in_flight = 2\nstart_timeout = \"60s\"\n";
    let st = Stack::start(false, cfg, |_| {}).await?;
    let ready_pod = |name: &str, port: u16| {
        format!(
            "name: {name}\nhostNetwork: true\nterminationGracePeriodSeconds: 2\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: \"tcp://127.0.0.1:{port}\"\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; mkdir -p /www; httpd -f -p {port} -h /www & wait\"]\n{}",
            sleeper("app")
        )
    };
    // Min-of-N: each bound compares the best of SAMPLES starts, so one start slowed by the
    // machine (a 0.652 s sample against a 0.638 s bound once failed CI) does not decide it, while
    // an unfair limiter, which delays every start beside the hostile pods, still fails.
    const SAMPLES: u16 = 3;
    let mut ready = Vec::new();
    let mut quiet = Vec::new();
    for i in 0..SAMPLES {
        let (uid, _) = timed_start(&st, &ready_pod(&format!("quiet-{i}"), 18_081 + i)).await?;
        quiet.push(st.start_gap(&uid, "proxy", "app").await?);
        ready.push(uid);
    }
    let before = st.crisp.usage()?;

    let mut hostile = Vec::new();
    for i in 0..12 {
        let yaml = format!("name: never-{i}\nhostNetwork: true\nterminationGracePeriodSeconds: 2\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: \"tcp://127.0.0.1:1\"\ncontainers:\n{}{}", sleeper("proxy"), sleeper("app"));
        hostile.push(st.kubelet.add_pod(pod(&yaml))?);
    }
    // Until every hostile pod's app is held, probing.
    let tap = TapCli::start(&st, &["--json"])?;
    let held = std::sync::Mutex::new(std::collections::HashSet::new());
    tap.wait_for(STEP, "a hold on every never-ready pod", |v| {
        let mut held = held.lock().expect("not poisoned");
        if v["hold"] == "start" && v["container_name"] == "app" {
            held.insert(v["pod_name"].as_str().unwrap_or_default().to_string());
        }
        held.iter().filter(|p| p.starts_with("never-")).count() >= 12
    })?;
    let mut busy = Vec::new();
    for i in 0..SAMPLES {
        let (uid, _) = timed_start(&st, &ready_pod(&format!("busy-{i}"), 18_091 + i)).await?;
        busy.push(st.start_gap(&uid, "proxy", "app").await?);
        ready.push(uid);
    }
    let (quiet_gap, busy_gap) = (
        *quiet.iter().min().expect("samples"),
        *busy.iter().min().expect("samples"),
    );
    let show = |v: &[i64]| {
        v.iter()
            .map(|g| format!("{:.3}", secs(*g)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!(
        "ready pods: app started after its sidecar, on a quiet node {} s (min {:.3}), beside 12 never-ready pods {} s (min {:.3})",
        show(&quiet),
        secs(quiet_gap),
        show(&busy),
        secs(busy_gap)
    );
    // The issue's target: released within a few probe rounds of a quiet node's release, not
    // after every never-ready pod's turn. Before the limiter was fair the ready pod waited
    // 1.23 s (0.10 s quiet): 12 pods' probes at 10 connects/s. Fair, busy − quiet measured
    // 0.22–0.28 s alone and 0.51 s once beside other heavy work on the machine; 0.7 s keeps
    // both clear of the unfair 1.1 s.
    assert!(
        busy_gap <= quiet_gap + 700_000_000,
        "the ready pods waited at best {:.3} s beside never-ready pods ({:.3} s at best quiet)",
        secs(busy_gap),
        secs(quiet_gap)
    );
    node_is_healthy(&st, "12 never-ready pods", before)?;
    for uid in hostile.iter().chain(ready.iter()) {
        st.delete_pod(uid, None, STEP).await?;
    }
    Ok(())
}

/// Item 5, as a real kubelet sends it: the pod's annotations (kubectl's last-applied
/// configuration, which carries env values) copied into every ImageSpec, and an env value
/// expanded into the container's args by `$(VAR)`. `crisp tap --full --json` shows neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tap_full_shows_no_env_value_kubelet_copied() -> Result<()> {
    const SECRET: &str = "hunter2-s3cr3t-token";
    let st = Stack::start(false, "", |_| {}).await?;
    let tap = TapCli::start(&st, &["--full", "--json", "--all"])?;
    let applied = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","spec":{{"containers":[{{"name":"app","env":[{{"name":"TOKEN","value":"{SECRET}"}}]}}]}}}}"#
    );
    let yaml = format!(
        "name: leaky\nhostNetwork: true\nterminationGracePeriodSeconds: 2\nannotations:\n  kubectl.kubernetes.io/last-applied-configuration: '{applied}'\ncontainers:\n  - name: app\n    command: [sh, -c]\n    args: [\"trap 'exit 0' TERM; echo --token=$(TOKEN) >/dev/null; sleep 3600 & wait\"]\n    env:\n      - name: TOKEN\n        value: {SECRET}\n"
    );
    let uid = st.run_pod(pod(&yaml), STEP).await?;
    st.delete_pod(&uid, None, STEP).await?;
    let lines = tap.drain(Duration::from_secs(2), Duration::from_secs(5));
    let methods: std::collections::BTreeSet<String> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["method"].as_str().map(str::to_string))
        .collect();
    eprintln!("tap: {} records, methods {methods:?}", lines.len());
    // The image is present, so kubelet sends ImageStatus (with the ImageSpec) and no PullImage.
    for m in ["ImageStatus", "CreateContainer", "RunPodSandbox"] {
        assert!(
            methods.iter().any(|x| x.ends_with(m)),
            "the tap recorded no {m}: {methods:?}"
        );
    }
    let leaks: Vec<&String> = lines.iter().filter(|l| l.contains(SECRET)).collect();
    assert!(
        leaks.is_empty(),
        "the env value is in {} tap record(s), e.g. {}",
        leaks.len(),
        leaks[0].chars().take(400).collect::<String>()
    );
    Ok(())
}
