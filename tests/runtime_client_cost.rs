//! What one of crisp's own unary runtime calls costs (issue #36: the unary calls moved from a
//! hand-built gRPC client onto tonic's): heap allocations and wall time per Version call,
//! against the in-process fake runtime over a unix socket. The fake's own allocations (it
//! records every call) are in the count too, the same before and after.
//!
//! A measurement, not a check: `cargo test --release --test runtime_client_cost -- --ignored
//! --nocapture` (numbers in BENCHMARKS.md).

#[path = "counting_alloc/mod.rs"]
mod counting_alloc;
#[path = "it/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use counting_alloc::Counting;
use crisp::cri::ApiVersion;
use crisp::proxy::client::RuntimeClient;
use crisp::proxy::{RuntimePool, RuntimePoolOptions};
use support::*;

#[global_allocator]
static ALLOC: Counting = Counting;

const CALLS: usize = 2000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (BENCHMARKS.md): allocations and time per unary call, printed"]
async fn allocations_and_time_per_unary_call() {
    let fake = Fake::start().await;
    let rc = RuntimeClient::new(
        Arc::new(RuntimePool::new(fake.path(), RuntimePoolOptions::default())),
        Duration::from_secs(5),
    );
    // The connection first, so that dialing is not counted. The fake echoes the request:
    // VersionRequest's field 1 reads as VersionResponse's.
    let v = rc.version(ApiVersion::V1).await.unwrap();
    assert_eq!(v.version, "v1");
    let mut took = Vec::with_capacity(CALLS);
    let mark = counting_alloc::mark();
    for _ in 0..CALLS {
        let started = Instant::now();
        let v = rc.version(ApiVersion::V1).await.unwrap();
        took.push(started.elapsed());
        assert_eq!(v.version, "v1");
    }
    let (allocs, peak) = (mark.allocs(), mark.peak_growth());
    took.sort();
    println!(
        "{CALLS} Version calls: {:.1} allocations per call (client, pool and fake runtime), \
         heap peak {peak} bytes over the mark, median {:?}, p90 {:?}",
        allocs as f64 / CALLS as f64,
        took[CALLS / 2],
        took[CALLS * 9 / 10]
    );
}
