//! The tap costs CRI calls (almost) nothing: with no tap client attached the tap interceptor only
//! counts metrics, and a tap client that stops reading neither blocks nor slows calls — it
//! misses events instead, and is told exactly how many when it reads again.
//!
//! These are measurements with generous bounds (a shared CI machine is noisy); run with
//! `--nocapture` to see the numbers.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;

use crate::support::*;
use crisp::admin_api as pb;
use crisp::intercept::Interceptor;
use crisp::metrics::CallMetrics;
use crisp::proxy::ProxyOptions;

async fn daemon(upstream: &Path, tap_queue: usize) -> Daemon {
    Daemon::start(upstream, |c| c.admin.tap_queue = tap_queue).await
}

/// Latencies of `n` sequential StartContainer calls (a mutating call: shown by the tap) whose
/// container ids are `id_len` bytes long (the fake echoes them back).
async fn timed(rt: &mut RuntimeClient, n: usize, id_len: usize) -> Vec<Duration> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{i:0>id_len$}");
        let t = Instant::now();
        rt.start_container(cri::StartContainerRequest { container_id: id })
            .await
            .unwrap();
        v.push(t.elapsed());
    }
    v
}

#[derive(Debug, Clone, Copy)]
struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(v: &[Duration]) -> Stats {
    let mut s = v.to_vec();
    s.sort();
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    Stats {
        p50: at(0.5),
        p99: at(0.99),
        mean: s.iter().sum::<Duration>() / s.len() as u32,
    }
}

fn show(name: &str, s: Stats) -> String {
    format!(
        "{name:<34} p50 {:>7.1}µs  p99 {:>8.1}µs  mean {:>7.1}µs",
        s.p50.as_secs_f64() * 1e6,
        s.p99.as_secs_f64() * 1e6,
        s.mean.as_secs_f64() * 1e6
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tap_client_does_not_slow_calls_and_is_told_what_it_missed() {
    const N: usize = 2000;
    const QUEUE: usize = 64;
    // ~12 KB per --full event, so that 2000 of them overflow the queue, the stream buffer and
    // the HTTP/2 and socket buffers between crisp and the stalled client.
    const ID: usize = 4096;
    let fake = Fake::start().await;
    let crisp = daemon(fake.path(), QUEUE).await;
    let mut rt = runtime_client(&crisp.sock).await;
    timed(&mut rt, 300, ID).await; // warm-up

    let base = stats(&timed(&mut rt, N, ID).await);

    // A client that reads everything (and decodes, --full).
    let full = pb::TapRequest {
        full: true,
        ..Default::default()
    };
    let mut reading = tap_events(&crisp.admin, full.clone()).await;
    let reader = tokio::spawn(async move {
        let mut n = 0u64;
        while let Ok(Some(_)) = reading.message().await {
            n += 1;
        }
        n
    });
    let active = stats(&timed(&mut rt, N, ID).await);
    reader.abort();

    // A client that attaches with --full and then stops reading.
    let mut stalled_stream = tap_events(&crisp.admin, full).await;
    let stalled = stats(&timed(&mut rt, N, ID).await);

    // It resumes: every call is either delivered or counted as missed, and it is told so.
    let (mut calls, mut missed, mut markers) = (0u64, 0u64, 0u64);
    let mut last_total = 0;
    loop {
        match tokio::time::timeout(Duration::from_millis(500), stalled_stream.message()).await {
            Err(_) => break,
            Ok(m) => match m.unwrap().and_then(|e| e.event) {
                Some(pb::tap_event::Event::Call(c)) => {
                    assert_eq!(c.method, "StartContainer");
                    assert!(
                        c.request_json.contains("container_id"),
                        "--full events carry the decoded request"
                    );
                    calls += 1;
                }
                Some(pb::tap_event::Event::Dropped(d)) => {
                    missed += d.count;
                    markers += 1;
                    last_total = d.total;
                }
                Some(pb::tap_event::Event::Hold(h)) => panic!("no call is held here: {h:?}"),
                Some(pb::tap_event::Event::Message(m)) => panic!("no call streams here: {m:?}"),
                None => panic!("stream ended"),
            },
        }
    }
    drop(stalled_stream);
    let after = stats(&timed(&mut rt, N, ID).await);

    eprintln!("\n--- CRI call latency through crisp ({N} sequential StartContainer calls each, {ID}-byte ids) ---");
    eprintln!("{}", show("no tap client", base));
    eprintln!("{}", show("one tap client reading (--full)", active));
    eprintln!("{}", show("one tap client stalled (--full)", stalled));
    eprintln!("{}", show("no tap client again", after));
    eprintln!("stalled client: {calls} events delivered, {missed} reported missed in {markers} marker(s), queue {QUEUE}");

    assert_eq!(
        calls + missed,
        N as u64,
        "every event is delivered or reported missed"
    );
    assert!(
        missed > 0 && markers > 0,
        "a {QUEUE}-event queue cannot hold {N} events"
    );
    assert_eq!(last_total, missed);
    // Generous: a stalled client must not make calls slower than a reading one (by more than
    // noise), nor block them.
    let bound = |s: Stats| s.p50.mul_f64(2.0) + Duration::from_micros(500);
    assert!(
        stalled.p50 <= bound(active).max(bound(base)),
        "stalled {stalled:?} vs active {active:?} / none {base:?}"
    );
    assert!(
        stalled.p99 < Duration::from_millis(100),
        "a call waited on the stalled client: {stalled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tap_with_no_client_costs_next_to_nothing() {
    const ROUNDS: usize = 8;
    const PER_ROUND: usize = 400;
    let fake = Fake::start().await;
    let plain = Crisp::start_with(fake.path(), vec![], ProxyOptions::default()).await;
    let tap = crisp::tap::Tap::new(Arc::new(CallMetrics::default()), None);
    let tapped = Crisp::start_with(
        fake.path(),
        vec![tap.clone() as Arc<dyn Interceptor>],
        ProxyOptions::default(),
    )
    .await;
    let mut a = runtime_client(&plain.path).await;
    let mut b = runtime_client(&tapped.path).await;
    timed(&mut a, 300, 16).await;
    timed(&mut b, 300, 16).await;
    // Interleaved rounds, so machine noise hits both alike.
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        without.extend(timed(&mut a, PER_ROUND, 16).await);
        with.extend(timed(&mut b, PER_ROUND, 16).await);
    }
    let (w0, w1) = (stats(&without), stats(&with));
    let n = ROUNDS * PER_ROUND;
    eprintln!("\n--- tap interceptor with no client attached ({n} calls each, interleaved) ---");
    eprintln!("{}", show("chain: [] (spliced fast path)", w0));
    eprintln!("{}", show("chain: [tap] (metrics only)", w1));
    eprintln!(
        "added: p50 {:+.1}µs, mean {:+.1}µs per call",
        (w1.p50.as_secs_f64() - w0.p50.as_secs_f64()) * 1e6,
        (w1.mean.as_secs_f64() - w0.mean.as_secs_f64()) * 1e6
    );
    // The tap counted every call it saw.
    assert_eq!(
        tap.metrics()
            .count(Some(crisp::cri::Rpc::StartContainer), Some(0)),
        (300 + n) as u64
    );
    assert_eq!(tap.metrics().in_flight(), 0);
    assert!(
        w1.p50 <= w0.p50.mul_f64(1.5) + Duration::from_micros(100),
        "tap overhead too high: {w1:?} vs {w0:?}"
    );
}

/// Mean latency of `n` sequential Version calls (kubelet's most frequent kind of call: a small
/// polling one).
async fn version_calls(rt: &mut RuntimeClient, n: usize) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        rt.version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .unwrap();
    }
    t.elapsed() / n as u32
}

/// Issue #44: what 1,000 idle taps cost a CRI call. They want every call (polling included) and
/// never read, so their queues fill, then all queues together reach `admin.tap_memory_bytes`,
/// and every call is offered to each of them (and dropped) on the tap's fan-out thread, not
/// on the relay thread. Min-of-N interleaved samples against a crisp without taps, on the same
/// fake runtime. A measurement (the numbers are in BENCHMARKS.md): run as root with
/// `cargo test --release --test it -- --ignored --nocapture a_thousand_idle_taps`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run as root with --ignored --nocapture"]
async fn a_thousand_idle_taps_add_next_to_nothing_to_a_call() {
    crate::prerequisites::require_root("1,000 taps for one uid: only root is bound by max_taps");
    const TAPS: usize = 1000;
    // Taps per admin connection: hyper serves 200 streams at once per connection.
    const PER_CONNECTION: usize = 50;
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 200;
    let fake = Fake::start().await;
    let plain = Daemon::start(fake.path(), |_| {}).await;
    let tapped = Daemon::start(fake.path(), |c| c.admin.max_taps = 2 * TAPS).await;
    let mut a = runtime_client(&plain.sock).await;
    let mut b = runtime_client(&tapped.sock).await;
    let (mut clients, mut idle) = (Vec::new(), Vec::new());
    for _ in 0..TAPS / PER_CONNECTION {
        let mut client = crisp::cli::client::connect(&tapped.admin).await.unwrap();
        for _ in 0..PER_CONNECTION {
            let stream = client
                .tap(pb::TapRequest {
                    include_polling: true,
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|e| panic!("tap {} of {TAPS}: {e}", idle.len() + 1))
                .into_inner();
            idle.push(stream);
        }
        clients.push(client);
    }
    version_calls(&mut a, 500).await;
    version_calls(&mut b, 500).await;
    // Interleaved rounds, so machine noise hits both alike; the smallest round mean of each is
    // what the call costs when nothing else interferes.
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        without.push(version_calls(&mut a, PER_ROUND).await);
        with.push(version_calls(&mut b, PER_ROUND).await);
    }
    let min = |v: &[Duration]| v.iter().min().copied().unwrap();
    let median = |v: &[Duration]| {
        let mut s = v.to_vec();
        s.sort();
        s[s.len() / 2]
    };
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (min0, min1) = (min(&without), min(&with));
    let (med0, med1) = (median(&without), median(&with));
    eprintln!(
        "\n--- Version calls through crisp, {ROUNDS} interleaved rounds of {PER_ROUND} each ---"
    );
    eprintln!(
        "no tap              min round mean {:>7.1}µs  median round mean {:>7.1}µs",
        us(min0),
        us(med0)
    );
    eprintln!(
        "{TAPS} idle taps     min round mean {:>7.1}µs  median round mean {:>7.1}µs",
        us(min1),
        us(med1)
    );
    eprintln!(
        "added: {:+.1}µs per call (min), {:+.1}µs (median)",
        us(min1) - us(min0),
        us(med1) - us(med0)
    );
    // The taps were attached and offered the calls all along: the first one holds them.
    match idle[0].message().await.unwrap().and_then(|e| e.event) {
        Some(pb::tap_event::Event::Call(c)) => assert_eq!(c.method, "Version"),
        other => panic!("the idle tap was not offered the calls: {other:?}"),
    }
    assert!(
        min1 <= min0.mul_f64(2.0) + Duration::from_micros(200),
        "1,000 idle taps slowed calls: {min1:?} vs {min0:?}"
    );
    drop(idle);
    drop(clients);
}
