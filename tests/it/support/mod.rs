//! Shared code of crisp's integration tests: a fake CRI runtime that records exactly what arrives
//! and answers exactly what a test scripts, a harness that runs crisp on a temp socket, and raw
//! HTTP/2 and tonic clients.
//!
//! One file per part: `grpc.rs` (framing and protobuf by hand), `fake_runtime.rs`,
//! `under_test.rs` (crisp in this process, or its daemon), `clients.rs` (tonic and raw h2),
//! `otlp.rs` (an OTLP/gRPC trace receiver).
//!
//! The fake is a raw hyper HTTP/2 server (not tonic): it never parses, normalises or adds anything
//! (no `date`, no `content-length`), so a test can compare what a client sends/gets through crisp
//! with what it sends/gets talking to the fake directly.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

mod clients;
mod fake_runtime;
mod grpc;
mod otlp;
mod under_test;

// Each test binary that includes this module uses a part of it.
#[allow(unused_imports)]
pub use clients::*;
pub use fake_runtime::*;
pub use grpc::*;
#[allow(unused_imports)]
pub use otlp::*;
#[allow(unused_imports)]
pub use under_test::*;

/// Upper bound for anything a test awaits; a test that hits it has failed.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Awaits `fut`, failing the test with `what` if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?} waiting for: {what}"),
    }
}

/// Logs to the test output when `CRISP_TEST_LOG` is set (e.g. `CRISP_TEST_LOG=debug`).
pub fn init_logging() {
    if let Ok(filter) = std::env::var("CRISP_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
}
