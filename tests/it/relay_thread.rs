//! Relayed calls do not depend on crisp's async runtime: each client connection is relayed by a
//! thread of its own blocking in poll(2) (BENCHMARKS.md, issue #20). While every worker of
//! crisp's tokio runtime is busy (a slow interceptor, a blocking bug, a flood of tap clients),
//! kubelet's relayed calls on an open connection — PLEG's lists, status calls — still go through.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::support::*;
use k8s_cri::v1::VersionRequest;

const WORKERS: usize = 2;

#[test]
fn relayed_calls_go_through_while_every_tokio_worker_of_crisp_is_blocked() {
    // The fake runtime and the client on one runtime, crisp on another, as in the daemon.
    let peers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let crisp_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap();
    let fake = peers.block_on(async {
        let fake = Fake::start().await;
        answer_version(&fake);
        fake
    });
    let crisp = crisp_rt.block_on(Crisp::start(fake.path()));
    let mut client = peers.block_on(runtime_client(&crisp.path));
    let version = |client: &mut RuntimeClient| {
        peers.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(3),
                client.version(VersionRequest {
                    version: "0.1.0".into(),
                }),
            )
            .await
        })
    };
    // The connection is open and relayed.
    version(&mut client)
        .expect("Version before the stall")
        .expect("Version before the stall");

    // Block every worker of crisp's runtime until released.
    let blocked = Arc::new(AtomicUsize::new(0));
    let mut release = Vec::new();
    for _ in 0..WORKERS {
        let (tx, rx) = mpsc::channel::<()>();
        release.push(tx);
        let blocked = blocked.clone();
        crisp_rt.spawn(async move {
            blocked.fetch_add(1, Ordering::SeqCst);
            let _ = rx.recv();
        });
    }
    let since = Instant::now();
    while blocked.load(Ordering::SeqCst) < WORKERS {
        assert!(
            since.elapsed() < PATIENCE,
            "crisp's workers never picked up the blocking tasks"
        );
        std::thread::yield_now();
    }

    let start = Instant::now();
    let mut answered = 0;
    for _ in 0..20 {
        match version(&mut client) {
            Ok(Ok(_)) => answered += 1,
            Ok(Err(status)) => {
                panic!("a relayed call failed while crisp's runtime was blocked: {status}")
            }
            Err(_) => break,
        }
    }
    let took = start.elapsed();
    drop(release);
    assert_eq!(answered, 20, "relayed calls waited for crisp's blocked async runtime ({answered} of 20 answered, then one took over 3 s)");
    assert!(
        took < Duration::from_secs(2),
        "20 relayed calls took {took:?} while crisp's runtime was blocked"
    );
    drop(client);
    drop(crisp);
    drop(fake);
}
