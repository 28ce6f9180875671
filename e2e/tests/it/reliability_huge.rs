//! Issue #8, hostile pod: 200 containers, 100 of them declared sidecars (more than crisp's 64),
//! an absurd start timeout, a 50 KB timeout policy, a readiness spec of 1 MiB and a 2 MiB
//! unrelated annotation — 3 MiB of annotations that reach crisp in RunPodSandbox and again in
//! each of the 200 CreateContainers (600 MiB through crisp).
//!
//! - clear warnings: one log line per bad key, naming the pod, the key and why, each line short
//!   (the values are not echoed in full), logged once for the pod, not once per container;
//! - the pod is treated as if the bad keys were absent: it runs, unordered (no hold);
//! - bounded memory: crisp's RSS, sampled throughout, stays under a fixed bound;
//! - no stall: a normal pod with a sidecar added meanwhile starts — ordered — while the big pod
//!   is still starting.
//!
//! `CRISP_HUGE_CONTAINERS` (default 200) sets the container count (the sidecar list names at
//! least 100 either way, so smaller runs still exceed the 64 limit); `CRISP_HUGE_DIRECT=1` points
//! the kubelet at containerd directly (no crisp) for a baseline (the crisp checks are skipped).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::reliability_support::*;
use anyhow::{ensure, Result};
use crisp_e2e::emulator::{ContainerSpec, PodSpec};

/// crisp's RSS must stay under this while it forwards the big pod (MiB).
const RSS_LIMIT_MIB: u64 = 96;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_pod_gets_clear_warnings_bounded_memory_and_stalls_nobody() -> Result<()> {
    let n = env_usize("CRISP_HUGE_CONTAINERS", 200);
    let direct = std::env::var_os("CRISP_HUGE_DIRECT").is_some();
    let ctrd_sock = std::sync::Arc::new(std::sync::Mutex::new(None));
    let c2 = ctrd_sock.clone();
    let st = custom_stack(
        false,
        "",
        None,
        move |c| {
            *c2.lock().unwrap() = Some(c.to_path_buf());
            Ok(None)
        },
        |c| {
            c.runtime_request_timeout = std::time::Duration::from_secs(60);
            if direct {
                c.endpoint = ctrd_sock.lock().unwrap().clone().unwrap();
            }
        },
    )
    .await?;
    let pid = st.crisp.pid().expect("crisp runs");
    let rss0 = rss_kib(pid).unwrap_or(0);

    let sidecars: Vec<String> = (0..n / 2).map(|i| format!("side-{i:03}")).collect();
    let mut containers: Vec<ContainerSpec> = sidecars
        .iter()
        .map(|s| ContainerSpec::sh(s, "trap 'exit 0' TERM; sleep 3600 & wait"))
        .collect();
    containers.extend((0..n - n / 2).map(|i| {
        ContainerSpec::sh(
            &format!("app-{i:03}"),
            "trap 'exit 0' TERM; sleep 3600 & wait",
        )
    }));
    let mut big = PodSpec::new("huge", containers);
    big.host_network = true;
    big.termination_grace_period_seconds = 5;
    let mut ann = BTreeMap::new();
    // The list always names more than crisp's 64 sidecars, whatever `CRISP_HUGE_CONTAINERS`
    // says: below 130 containers it is padded with names of containers the pod does not have
    // (the whole list is rejected either way, so they are never looked for).
    let listed: Vec<String> = (0..(n / 2).max(100))
        .map(|i| format!("side-{i:03}"))
        .collect();
    ann.insert("crisp.dev/sidecars".to_string(), listed.join(","));
    ann.insert("crisp.dev/start-timeout".to_string(), "9999h".to_string());
    ann.insert(
        "crisp.dev/timeout-policy".to_string(),
        "maybe".repeat(10_000),
    );
    ann.insert(
        "crisp.dev/ready.side-001".to_string(),
        format!("exec:[\"{}\"]", "x".repeat(1 << 20)),
    );
    ann.insert("example.com/blob".to_string(), "y".repeat(2 << 20));
    big.annotations = ann;

    // crisp's RSS, sampled every 100 ms while the test runs.
    let peak = Arc::new(AtomicU64::new(rss0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some(r) = rss_kib(pid) {
                    peak.fetch_max(r, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let t0 = Instant::now();
    let big_uid = st.kubelet.add_pod(big)?;
    // Once the big pod is creating containers, a normal pod arrives.
    st.kubelet
        .journal()
        .wait_for(Duration::from_secs(120), |r| {
            r.meta.pod_uid.as_deref() == Some(&big_uid) && r.is("StartContainer", "side-005")
        })
        .await?;
    let mut rng = Rng::from_env("huge");
    let normal = plan(0, &mut rng, false, "unused");
    let t1 = Instant::now();
    let normal_uid = st.kubelet.add_pod(normal.spec.clone())?;
    st.kubelet
        .wait_all_running(&normal_uid, Duration::from_secs(60))
        .await?;
    let normal_up = t1.elapsed();
    let big_started = st
        .kubelet
        .journal()
        .filter(|r| {
            r.meta.pod_uid.as_deref() == Some(&big_uid) && r.method == "StartContainer" && r.is_ok()
        })
        .len();
    let violations = start_violations(
        st.containerd.socket(),
        &normal_uid,
        &normal,
        Allow::default(),
    )
    .await?;
    ensure!(
        direct || violations.is_empty(),
        "the normal pod's order: {violations:?}"
    );
    eprintln!("normal pod running {:.1} s after it was added, while the big pod had started {big_started}/{n} containers", normal_up.as_secs_f64());
    ensure!(
        big_started < n,
        "the big pod finished first: the normal pod did not start *meanwhile*"
    );
    ensure!(
        normal_up < Duration::from_secs(20),
        "the normal pod took {normal_up:?} to start next to the big one"
    );

    st.kubelet
        .wait_all_running(&big_uid, Duration::from_secs(600))
        .await?;
    let big_up = t0.elapsed();
    let rss_up = rss_kib(pid).unwrap_or(0);

    // Warnings: once per bad key, short lines naming pod, key and reason.
    let log = if direct {
        String::new()
    } else {
        st.crisp.log_text()
    };
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("annotation crisp.dev/"))
        .collect();
    for w in &warnings {
        eprintln!("{}", &w[..w.len().min(300)]);
    }
    for (key, why) in [
        ("crisp.dev/sidecars", "more than 64 sidecars"),
        (
            "crisp.dev/start-timeout",
            "holds must end before kubelet's 2 min deadline",
        ),
        ("crisp.dev/timeout-policy", "expected `proceed` or `fail`"),
    ] {
        let hits: Vec<&&str> = warnings
            .iter()
            .filter(|l| l.contains(&format!("annotation {key}=")))
            .collect();
        if direct {
            break;
        }
        ensure!(
            hits.len() == 1,
            "{} warning line(s) for {key} (want exactly 1)",
            hits.len()
        );
        ensure!(
            hits[0].contains(why),
            "the warning for {key} does not say why ({why}): {}",
            &hits[0][..hits[0].len().min(400)]
        );
        ensure!(
            hits[0].contains("pod_name=huge") || hits[0].contains("pod_name=\"huge\""),
            "the warning does not name the pod: {}",
            &hits[0][..hits[0].len().min(400)]
        );
    }
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    ensure!(
        longest < 4096,
        "a {longest}-byte line in crisp's log: huge values echoed"
    );
    ensure!(
        !log.lines()
            .any(|l| l.contains("holding CreateContainer") && l.contains("pod_name=\"huge\"")),
        "the pod with a rejected sidecar list was held"
    );
    let bad = gauge(&admin_socket(&st), "crisp_bad_annotations_total")
        .await
        .unwrap_or(0.0);

    // Only the normal pod is deleted. Deleting the big one means 200 concurrent StopContainers
    // in one pod, which this containerd does not finish within kubelet's deadline even without
    // crisp in the path (measured: every one hit its 65 s deadline, direct and through crisp;
    // re-measured direct on 2026-11-22: 600 StopContainers over 3 kill attempts in 300 s, 0
    // answered, each cut at 65 s, then StopPodSandbox at 60 s) — a runtime limit, not crisp's;
    // the harness tears the pod down with containerd.
    st.kubelet.delete_pod(&normal_uid, Some(5))?;
    st.kubelet
        .wait_terminated(&normal_uid, Duration::from_secs(60))
        .await?;
    let violations = stop_violations(st.containerd.socket(), &normal_uid, &normal, false).await?;
    ensure!(
        direct || violations.is_empty(),
        "the normal pod's stop order: {violations:?}"
    );
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    let peak = peak.load(Ordering::Relaxed);
    let late = deadline_violations(st.kubelet.journal());
    ensure!(
        late.is_empty(),
        "calls outlived kubelet's deadline:\n{}",
        late.join("\n")
    );
    eprintln!(
        "huge pod: {n} containers up in {:.1} s; {} warnings ({bad} bad annotations counted); crisp RSS {rss0} KiB before, {rss_up} KiB with it running, peak {peak} KiB; longest log line {longest} B",
        big_up.as_secs_f64(),
        warnings.len()
    );
    ensure!(
        peak < RSS_LIMIT_MIB << 10,
        "crisp's RSS peaked at {peak} KiB (limit {RSS_LIMIT_MIB} MiB)"
    );
    Ok(())
}
