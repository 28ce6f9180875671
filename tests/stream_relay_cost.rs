//! What a streamed list's messages cost crisp's relay thread (issue #45): its CPU time and its
//! heap allocations per message of a StreamContainers answer (100 KB messages), with no tap
//! client, with idle tap clients (subscribed, not showing streams), and with a tap client that
//! shows the stream message by message (the call is then served by the observed path and the
//! relay thread only writes its answer). Per message = (cost of a 160-message stream − cost of
//! a 10-message one) / 150, each the minimum of `ROUNDS` runs.
//!
//! The relay thread is found by its name (`crisp-relay`) in /proc/self/task; its CPU time is
//! the first field of its `schedstat` (ns), its allocations are counted by this binary's global
//! allocator per thread id. A measurement, not a check: `cargo test --test stream_relay_cost
//! -- --ignored --nocapture` (numbers in RELIABILITY.md).

#[path = "it/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crisp::admin_api as pb;
use http_body::Frame;
use prost::Message;
use support::*;

/// Allocations by thread id (modulo the table's size: the test's threads are few).
static BY_THREAD: [AtomicU64; 4096] = [const { AtomicU64::new(0) }; 4096];

struct PerThread;

fn count() {
    // SAFETY: gettid has no preconditions and allocates nothing.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as usize;
    BY_THREAD[tid % BY_THREAD.len()].fetch_add(1, Relaxed);
}

// SAFETY: every call goes to the system allocator unchanged; only counted.
unsafe impl GlobalAlloc for PerThread {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: PerThread = PerThread;

const STREAM: &str = "/runtime.v1.RuntimeService/StreamContainers";
const ROUNDS: usize = 5;

/// The relay threads' CPU time (ns) and allocations so far.
fn relay_threads() -> (u64, u64) {
    let (mut cpu, mut allocs) = (0, 0);
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() != "crisp-relay" {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
        cpu += stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let tid: usize = e.file_name().to_string_lossy().parse().unwrap();
        allocs += BY_THREAD[tid % BY_THREAD.len()].load(Relaxed);
    }
    (cpu, allocs)
}

/// A message of ~100 KB: 100 containers of ~1 KB.
fn chunk(i: usize) -> Vec<u8> {
    k8s_cri::v1::ListContainersResponse {
        containers: (0..100)
            .map(|j| k8s_cri::v1::Container {
                id: format!("{:064x}", i * 100 + j),
                labels: [("io.kubernetes.container.name".to_string(), "x".repeat(900))].into(),
                ..Default::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

/// One StreamContainers call of `n` messages through `sock` (one connection: one relay thread),
/// read whole; returns the relay thread's CPU ns and allocations for it.
async fn one_stream(
    raw: &mut Raw,
    replies: &Replies,
    msgs: &[bytes::Bytes],
    n: usize,
) -> (u64, u64) {
    let (reply, tx) = Reply::channel(grpc_headers());
    replies.lock().unwrap().push_back(reply);
    let before = relay_threads();
    let fut = raw.start(&RawRequest::grpc(STREAM, &[])).await.unwrap();
    let resp = within(PATIENCE, "headers", fut).await.unwrap();
    for m in &msgs[..n] {
        tx.send(Frame::data(m.clone())).unwrap();
    }
    tx.send(Frame::trailers(ok_trailers())).unwrap();
    drop(tx);
    let mut body = resp.into_body();
    let mut got = 0;
    while let Some(c) = within(PATIENCE, "data", body.data()).await {
        let c = c.unwrap();
        let _ = body.flow_control().release_capacity(c.len());
        got += c.len();
    }
    let _ = within(PATIENCE, "trailers", body.trailers()).await;
    assert_eq!(got, msgs[..n].iter().map(|m| m.len()).sum::<usize>());
    // The relay thread's last writes and its bookkeeping of the call's end.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = relay_threads();
    (after.0 - before.0, after.1 - before.1)
}

type Replies = std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Reply>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: the relay thread's CPU time and allocations per streamed message"]
async fn relay_thread_cost_per_streamed_message() {
    let msgs: Vec<bytes::Bytes> = (0..160).map(|i| grpc_frame(&chunk(i))).collect();
    let fake = Fake::start().await;
    let replies: Replies = Default::default();
    let q = replies.clone();
    fake.script(STREAM, move |_| {
        q.lock().unwrap().pop_front().unwrap_or_else(|| {
            Reply::TrailersOnly(header_map(&[
                ("content-type", b"application/grpc"),
                ("grpc-status", b"12"),
            ]))
        })
    });
    let daemon = Daemon::start(fake.path(), |_| {}).await;
    let mut raw = Raw::connect(&daemon.sock).await;
    // Warm the connection (and the relay thread's buffers) first.
    one_stream(&mut raw, &replies, &msgs, 10).await;

    let measure = async |what: &str, raw: &mut Raw| {
        let (mut small, mut big) = ((u64::MAX, u64::MAX), (u64::MAX, u64::MAX));
        for _ in 0..ROUNDS {
            let s = one_stream(raw, &replies, &msgs, 10).await;
            let b = one_stream(raw, &replies, &msgs, 160).await;
            small = (small.0.min(s.0), small.1.min(s.1));
            big = (big.0.min(b.0), big.1.min(b.1));
        }
        let cpu = big.0.saturating_sub(small.0) as f64 / 150.0;
        let allocs = big.1 as f64 / 160.0;
        let allocs_marginal = (big.1 as f64 - small.1 as f64) / 150.0;
        eprintln!(
            "{what}: relay thread per message: {:.1} µs CPU, {allocs_marginal:.2} allocations \
             (a 10-message call: {:.0} µs, {} allocations; 160: {:.0} µs, {} allocations, \
             {allocs:.2} per message)",
            cpu / 1e3,
            small.0 as f64 / 1e3,
            small.1,
            big.0 as f64 / 1e3,
            big.1,
        );
    };
    measure("no tap client", &mut raw).await;

    let mut admin = crisp::cli::client::connect(&daemon.admin).await.unwrap();
    let mut idle = Vec::new();
    for _ in 0..8 {
        let req = pb::TapRequest {
            methods: vec!["CreateContainer".into()],
            ..Default::default()
        };
        idle.push(admin.tap(req).await.unwrap().into_inner());
    }
    measure("8 idle tap clients (not showing streams)", &mut raw).await;

    let req = pb::TapRequest {
        include_polling: true,
        ..Default::default()
    };
    let mut shown = admin.tap(req).await.unwrap().into_inner();
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = shown.message().await {} });
    measure(
        "a tap client showing the stream message by message (the observed path serves it)",
        &mut raw,
    )
    .await;
    drain.abort();
}
