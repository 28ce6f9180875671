//! Issue #8, slow runtime: a byte splice between crisp and containerd delivers every chunk the
//! runtime sends `DELAY` late, so every answer crisp gets — to kubelet's calls and to its own
//! probes and lookups — takes seconds. kubelet's runtime-request-timeout is cut to 8 s.
//!
//! - a pod whose sidecar never turns ready: crisp holds the app's CreateContainer, gives up in
//!   time for the forwarded call to still finish before kubelet's deadline (policy proceed), and
//!   the app starts on that first attempt;
//! - a pod whose sidecar turns ready after 2 s: the order holds (containerd's timestamps);
//! - deletion: sidecars stop after the apps;
//! - no call — of any method — outlives the deadline kubelet gave it, none is left in flight.

use std::time::{Duration, Instant};

use crate::reliability_support::*;
use anyhow::{ensure, Result};
use crisp_e2e::emulator::PodSpec;

/// How late each chunk from the runtime arrives (`CRISP_SLOW_DELAY_MS`).
fn delay() -> Duration {
    Duration::from_millis(env_usize("CRISP_SLOW_DELAY_MS", 1500) as u64)
}
const TIMEOUT: Duration = Duration::from_secs(8);
const UP: Duration = Duration::from_secs(240);

fn pod(yaml: &str) -> PodSpec {
    PodSpec::from_yaml(yaml).expect("test pod YAML").remove(0)
}

const APP: &str = "  - name: app\n    command: [sh, -c, \"trap 'sleep 0.5; exit 0' TERM; while true; do sleep 0.2; done\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_respect_kubelets_deadline_when_the_runtime_is_slow() -> Result<()> {
    let sock_dir = tempfile::Builder::new().prefix("crisp-slow-").tempdir()?;
    let mut splice = None;
    let st = custom_stack(
        false,
        // crisp's own start timeout is longer than kubelet's deadline: the deadline must bound it.
        "[ordering]\nstart_timeout = \"60s\"\n",
        None,
        |containerd| {
            let s = SlowSplice::start(&sock_dir.path().join("slow.sock"), containerd, delay())?;
            let p = s.path.clone();
            splice = Some(s);
            Ok(Some(p))
        },
        |c| c.runtime_request_timeout = TIMEOUT,
    )
    .await?;
    let admin = admin_socket(&st);

    // Never ready.
    let stuck = pod(&format!(
        "name: never-ready\nhostNetwork: true\nterminationGracePeriodSeconds: 10\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: 'exec:[\"false\"]'\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n{APP}"
    ));
    // Ready 2 s after it starts.
    let ok = pod(&format!(
        "name: slow-ready\nhostNetwork: true\nterminationGracePeriodSeconds: 10\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: 'exec:[\"test\",\"-f\",\"/tmp/ready\"]'\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 2; touch /tmp/ready; sleep 3600 & wait\"]\n{APP}"
    ));
    let t0 = Instant::now();
    let stuck_uid = st.kubelet.add_pod(stuck)?;
    let ok_uid = st.kubelet.add_pod(ok)?;
    for uid in [&stuck_uid, &ok_uid] {
        if let Err(e) = st.kubelet.wait_all_running(uid, UP).await {
            dump_pod(&st.kubelet, uid);
            eprintln!("--- crisp log tail ---\n{}", crisp_log_tail(&st, 100));
            return Err(e);
        }
    }
    eprintln!(
        "both pods running after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let j = st.kubelet.journal();
    for uid in [&stuck_uid, &ok_uid] {
        for r in j
            .pod_calls(uid)
            .iter()
            .filter(|r| r.method == "CreateContainer" && r.meta.container.as_deref() == Some("app"))
        {
            eprintln!("{}", j.format_record(r));
        }
    }
    // The never-ready pod's app went through on its first CreateContainer, held and released
    // before the deadline.
    let creates = j.filter(|r| {
        r.meta.pod_uid.as_deref() == Some(&stuck_uid) && r.is("CreateContainer", "app")
    });
    ensure!(
        creates.first().is_some_and(|c| c.is_ok()),
        "the held app's first CreateContainer failed: {:?}",
        creates.first().map(|c| j.format_record(c))
    );
    let held = creates[0].elapsed();
    ensure!(
        held >= TIMEOUT / 2,
        "the app's CreateContainer took {held:?}: it was not held"
    );
    ensure!(
        log_lines(&st, "starting the app anyway (policy proceed)").len() == 1,
        "no proceed after the hold"
    );

    let mut violations = Vec::new();
    let (stuck_plan, ok_plan) = (
        planned(&st, &stuck_uid, "never-ready"),
        planned(&st, &ok_uid, "slow-ready"),
    );
    violations.extend(
        start_violations(st.containerd.socket(), &ok_uid, &ok_plan, Allow::default()).await?,
    );
    for uid in [&stuck_uid, &ok_uid] {
        st.kubelet.delete_pod(uid, Some(10))?;
    }
    for uid in [&stuck_uid, &ok_uid] {
        st.kubelet.wait_terminated(uid, UP).await?;
    }
    violations
        .extend(stop_violations(st.containerd.socket(), &stuck_uid, &stuck_plan, false).await?);
    violations.extend(stop_violations(st.containerd.socket(), &ok_uid, &ok_plan, false).await?);
    ensure!(
        violations.is_empty(),
        "ordering:\n{}",
        violations.join("\n")
    );

    let late = deadline_violations(j);
    ensure!(
        late.is_empty(),
        "calls outlived kubelet's deadline:\n{}",
        late.join("\n")
    );
    let stuck_calls = stuck_calls(j, Duration::from_secs(10));
    ensure!(
        stuck_calls.is_empty(),
        "calls still in flight:\n{}",
        stuck_calls.join("\n")
    );
    wait_no_holds(&admin, Duration::from_secs(10)).await?;
    let slowest = j
        .filter(|r| r.done.is_some())
        .iter()
        .map(|r| r.elapsed())
        .max()
        .unwrap_or_default();
    eprintln!("slow runtime ({:?} per answer): {} calls, slowest {slowest:?} (kubelet deadline {TIMEOUT:?}), app held {held:?}, 0 late, 0 violations", delay(), j.calls().len());
    drop(splice);
    Ok(())
}

/// The shape the ordering checks need, for a pod with one sidecar `proxy` and an `app`.
fn planned(st: &crisp_e2e::stack::Stack, uid: &str, name: &str) -> Planned {
    let spec = PodSpec::new(
        name,
        vec![crisp_e2e::emulator::ContainerSpec::sh("app", "true")],
    );
    let _ = (st, uid);
    let delay = if name == "slow-ready" { 2.0 } else { 0.0 };
    Planned {
        spec,
        probe: Probe::Exec,
        job: false,
        sidecars: vec![("proxy".into(), delay)],
        app: "app".into(),
    }
}
