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
use crisp::intercept::Interceptor;
use crisp::metrics::CallMetrics;
use crisp::proxy::ProxyOptions;
use crisp::tap::pb;

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
    let mut client = crisp::tap::client::connect(&crisp.admin).await.unwrap();
    let mut reading = client
        .tap(pb::TapRequest {
            full: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let reader = tokio::spawn(async move {
        let mut n = 0u64;
        while let Ok(Some(_)) = reading.message().await {
            n += 1;
        }
        n
    });
    let active = stats(&timed(&mut rt, N, ID).await);
    drop(client);
    reader.abort();

    // A client that attaches with --full and then stops reading.
    let mut client = crisp::tap::client::connect(&crisp.admin).await.unwrap();
    let mut stalled_stream = client
        .tap(pb::TapRequest {
            full: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
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
