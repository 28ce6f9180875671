//! Issue #26 item 4: crisp's own ExecSync (exec readiness probes, job-mode preStop hooks) keeps
//! only the exit code of the runtime's answer. The command's output — up to containerd's 16 MiB
//! per stream — streams past without being held, and the whole call ends inside its deadline.
//!
//! The heap is measured with a counting global allocator (this test binary's own), so the
//! bound is on what the process holds, not on what a helper reports about itself.

#[path = "counting_alloc/mod.rs"]
mod counting_alloc;
#[path = "it/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use counting_alloc::Counting;
use crisp::cri::ApiVersion;
use crisp::proxy::client::{ClientError, RuntimeClient};
use crisp::proxy::{RuntimePool, RuntimePoolOptions};
use prost::Message;
use support::*;

#[global_allocator]
static ALLOC: Counting = Counting;

const EXEC_SYNC: &str = "/runtime.v1.RuntimeService/ExecSync";

/// Most the heap may grow while crisp reads a 17 MiB answer: the upstream stream's HTTP/2
/// receive window (2 MiB) plus room for the connection's buffers.
const HEAP_GROWTH_MAX: usize = 4 << 20;

fn client(fake: &Fake) -> RuntimeClient {
    RuntimeClient::new(
        Arc::new(RuntimePool::new(fake.path(), RuntimePoolOptions::default())),
        Duration::from_secs(5),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_16_mib_exec_answer_is_not_held() {
    let fake = Fake::start().await;
    let rc = client(&fake);
    let cmd = vec!["cat".to_string(), "/ready".to_string()];
    // The connection and its buffers first, so they are not counted against the read.
    fake.reply_once(EXEC_SYNC, Reply::exec_sync(10, 0, 0));
    assert_eq!(
        within(
            PATIENCE,
            "a small exec",
            rc.exec_sync(ApiVersion::V1, "c1", &cmd, Duration::from_secs(5))
        )
        .await
        .unwrap(),
        0
    );

    fake.reply_once(EXEC_SYNC, Reply::exec_sync(16 << 20, 1 << 20, 7));
    let mark = counting_alloc::mark();
    let code = within(
        PATIENCE,
        "a 17 MiB exec answer",
        rc.exec_sync(ApiVersion::V1, "c1", &cmd, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let growth = mark.peak_growth();
    println!("heap growth while reading a 17 MiB ExecSync answer: {growth} bytes");
    assert_eq!(code, 7);
    assert!(
        growth < HEAP_GROWTH_MAX,
        "the heap grew by {growth} bytes while reading the answer"
    );
}

#[tokio::test]
async fn the_exec_call_ends_at_its_deadline() {
    let fake = Fake::start().await;
    let rc = client(&fake);
    fake.reply_once(EXEC_SYNC, Reply::Hold);
    let timeout = Duration::from_millis(2500);
    let started = tokio::time::Instant::now();
    let r = within(
        Duration::from_secs(6),
        "an exec the runtime never answers",
        rc.exec_sync(ApiVersion::V1, "c1", &["true".to_string()], timeout),
    )
    .await;
    assert!(matches!(r, Err(ClientError::Timeout { .. })), "{r:?}");
    let took = started.elapsed();
    // The command's timeout, and the runtime's bounded slack to start it and report.
    let deadline = timeout + crisp::proxy::client::EXEC_RUNTIME_SLACK;
    assert!(
        took < deadline + Duration::from_millis(900),
        "gave up after {took:?}, deadline {deadline:?}"
    );
    // The runtime sees the call cancelled, and was told the call's deadline to the millisecond
    // in grpc-timeout, and the command's in the request's whole seconds.
    let call = fake.last(EXEC_SYNC);
    call.expect_cancelled(PATIENCE).await;
    assert_eq!(
        call.headers.get("grpc-timeout").map(|v| v.as_bytes()),
        Some(&b"4500m"[..])
    );
    let req = k8s_cri::v1::ExecSyncRequest::decode(call.message()).unwrap();
    assert_eq!(req.timeout, 2);
}
