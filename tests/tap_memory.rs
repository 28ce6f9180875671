//! Issue #33 item 1: the tap costs what it shows. An ExecSync answer of 16 MiB of stdout and
//! 16 MiB of stderr goes through crisp's observed path (a `--full --all` tap subscriber makes it
//! observed) and on to the client as it arrives; the tap shows the sizes of both streams from
//! their length prefixes and the exit code, and the heap of the whole process (crisp, the fake
//! runtime's prepared answer excluded, the client and the tap client) grows by a few MiB at
//! most — not by the answer, nor by a decode of it.
//!
//! The heap is measured with a counting global allocator (this test binary's own, in its own
//! process), as in `exec_probe_memory.rs`.

#[path = "counting_alloc/mod.rs"]
mod counting_alloc;
#[path = "it/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use counting_alloc::Counting;
use crisp::admin_api as pb;
use crisp::cri::ApiVersion;
use crisp::proxy::client::RuntimeClient;
use crisp::proxy::{RuntimePool, RuntimePoolOptions};
use support::*;

#[global_allocator]
static ALLOC: Counting = Counting;

const EXEC_SYNC: &str = "/runtime.v1.RuntimeService/ExecSync";
const MIB: usize = 1 << 20;

/// Most the heap may grow while a 32 MiB answer passes through crisp to the client with a tap
/// subscriber attached: the HTTP/2 windows of the two hops (2 MiB a stream: crisp's runtime
/// connection, the client's) and the connections' read buffers, whatever the answer's size —
/// measured at 13 to 23 MiB, against 1108 MiB before issue #33. The bound stays under the
/// answer itself (32 MiB), so a crisp that collected the answer whole, even undecoded, fails.
const HEAP_GROWTH_MAX: usize = 30 * MIB;
/// Most allocations for the call and its tap event: per DATA frame and per event, never per
/// byte of output.
const ALLOCS_MAX: usize = 20_000;

/// The next call event of the tap stream.
async fn next_call(s: &mut tonic::Streaming<pb::TapEvent>, limit: Duration) -> pb::CallEvent {
    loop {
        let ev = within(limit, "a tap event", s.message())
            .await
            .unwrap()
            .expect("the tap stream ended");
        if let Some(pb::tap_event::Event::Call(c)) = ev.event {
            return c;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_32_mib_exec_answer_through_a_full_tap_costs_what_the_tap_shows() {
    let fake = Fake::start().await;
    let d = Daemon::start(fake.path(), |_| {}).await;
    // kubelet's side: crisp's own streaming client, which keeps only the exit code of the answer
    // (exec_probe_memory.rs), so that what grows is crisp's.
    let rc = RuntimeClient::new(
        Arc::new(RuntimePool::new(&d.sock, RuntimePoolOptions::default())),
        Duration::from_secs(10),
    );
    let mut events = tap_events(
        &d.admin,
        pb::TapRequest {
            full: true,
            ..Default::default()
        },
    )
    .await;
    let cmd = vec!["cat".to_string(), "/ready".to_string()];

    // Connections, buffers and the tap's decoder tables first, so they are not counted.
    fake.reply_once(EXEC_SYNC, Reply::exec_sync(10, 3, 0));
    let code = within(
        PATIENCE,
        "a small exec",
        rc.exec_sync(ApiVersion::V1, "c1", &cmd, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    assert_eq!(code, 0);
    let small = next_call(&mut events, PATIENCE).await;
    assert_eq!(small.method, "ExecSync");

    fake.reply_once(EXEC_SYNC, Reply::exec_sync(16 * MIB, 16 * MIB, 7));
    let mark = counting_alloc::mark();
    let code = within(
        Duration::from_secs(60),
        "a 32 MiB exec answer",
        rc.exec_sync(ApiVersion::V1, "c1", &cmd, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    assert_eq!(code, 7, "the client got the whole answer");
    // Long enough for today's decode to finish, and be measured.
    let ev = next_call(&mut events, Duration::from_secs(300)).await;
    let growth = mark.peak_growth();
    let allocs = mark.allocs();
    println!(
        "a 16 MiB + 16 MiB ExecSync answer through crisp with a --full tap: heap grew by {growth} \
         bytes ({:.1} MiB), {allocs} allocations",
        growth as f64 / MIB as f64
    );

    // What the tap shows: the sizes from the wire, the exit code.
    assert_eq!(ev.method, "ExecSync");
    assert!(
        ev.response_bytes as usize > 32 * MIB,
        "{}",
        ev.response_bytes
    );
    let resp: serde_json::Value = serde_json::from_str(&ev.response_json).unwrap();
    assert_eq!(resp["stdout"], format!("<{} bytes>", 16 * MIB), "{resp}");
    assert_eq!(resp["stderr"], format!("<{} bytes>", 16 * MIB), "{resp}");
    assert_eq!(resp["exit_code"], 7, "{resp}");

    assert!(
        growth < HEAP_GROWTH_MAX,
        "the heap grew by {growth} bytes for a 32 MiB answer shown as two sizes"
    );
    assert!(allocs < ALLOCS_MAX, "{allocs} allocations");
}
