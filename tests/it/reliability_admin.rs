//! Issue #8: hostile clients on crisp's ADMIN socket (`crisp tap`, ListPods, `GET /metrics`)
//! do not affect other admin clients or CRI traffic. (The CRI socket's own hostile-client tests
//! are in tests/it/resilience.rs.)
//!
//! While 200 hostile connections are open — random bytes, connections that never send a byte
//! (half-open), HTTP/1.1 requests whose headers trickle in one byte per second (slow-loris),
//! HTTP/2 prefaces followed by half a frame, and tap subscribers that never read their stream —
//! every call of a well-behaved admin client (metrics over HTTP/1.1, gRPC Version and ListPods)
//! and of a kubelet-like CRI client is answered, each within 1 s.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_cri::v1::VersionRequest;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use crate::support::*;
use crisp::admin_api as pb;

/// Each good call must be answered within this, attack or not.
const PROMPT: Duration = Duration::from_secs(1);

async fn daemon(upstream: &Path) -> Daemon {
    Daemon::start(upstream, |_| {}).await
}

fn metrics_over_http1(admin: &Path) -> Result<String, String> {
    let mut s = std::os::unix::net::UnixStream::connect(admin).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(PROMPT))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: crisp\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    out.starts_with("HTTP/1.1 200")
        .then_some(out)
        .ok_or_else(|| "not a 200".into())
}

/// Good clients calling in a loop until stopped; counts answers, records the slowest and any
/// failure.
#[derive(Default)]
struct Good {
    answered: AtomicU64,
    slowest_us: AtomicU64,
    failure: std::sync::Mutex<Option<String>>,
}

impl Good {
    fn record(&self, what: &str, started: Instant, r: Result<(), String>) {
        let took = started.elapsed();
        self.slowest_us
            .fetch_max(took.as_micros() as u64, Ordering::Relaxed);
        match r {
            Ok(()) if took <= PROMPT => {
                self.answered.fetch_add(1, Ordering::Relaxed);
            }
            Ok(()) => {
                let _ = self
                    .failure
                    .lock()
                    .unwrap()
                    .get_or_insert(format!("{what} took {took:?}"));
            }
            Err(e) => {
                let _ = self
                    .failure
                    .lock()
                    .unwrap()
                    .get_or_insert(format!("{what} failed: {e}"));
            }
        }
    }
}

fn start_good_clients(
    d: &Daemon,
    stop: Arc<AtomicBool>,
    good: Arc<Good>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    // HTTP/1.1 metrics, a new connection per call (Prometheus-like).
    {
        let (admin, stop, good) = (d.admin.clone(), stop.clone(), good.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let a = admin.clone();
                let r = tokio::task::spawn_blocking(move || metrics_over_http1(&a).map(|_| ()))
                    .await
                    .unwrap();
                good.record("GET /metrics", t, r);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    // gRPC admin client (crisp tap's), one connection.
    {
        let (admin, stop, good) = (d.admin.clone(), stop.clone(), good.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = crisp::cli::client::connect(&admin).await.unwrap();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = tokio::time::timeout(PROMPT * 2, async {
                    c.version(pb::VersionRequest {})
                        .await
                        .map_err(|e| e.to_string())?;
                    c.list_pods(pb::ListPodsRequest::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<(), String>(())
                })
                .await
                .unwrap_or_else(|_| Err("no answer".into()));
                good.record("admin gRPC Version+ListPods", t, r);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    // kubelet-like CRI client.
    {
        let (sock, stop, good) = (d.sock.clone(), stop, good);
        tasks.push(tokio::spawn(async move {
            let mut c = runtime_client(&sock).await;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = tokio::time::timeout(
                    PROMPT * 2,
                    c.version(VersionRequest {
                        version: "0.1.0".into(),
                    }),
                )
                .await
                .map_err(|_| "no answer".to_string())
                .and_then(|r| r.map(|_| ()).map_err(|e| e.to_string()));
                good.record("CRI Version", t, r);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_admin_clients_do_not_affect_other_admin_or_cri_clients() {
    use rand::RngCore;
    let fake = Fake::start().await;
    answer_version(&fake);
    let d = daemon(fake.path()).await;

    let stop = Arc::new(AtomicBool::new(false));
    let good = Arc::new(Good::default());
    let tasks = start_good_clients(&d, stop.clone(), good.clone());
    // Served before the attack.
    within(PATIENCE, "the good clients' first answers", async {
        while good.answered.load(Ordering::Relaxed) < 6 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // The attack.
    let mut garbage = Vec::new();
    for _ in 0..50 {
        let mut s = UnixStream::connect(&d.admin).await.unwrap();
        let mut junk = vec![0u8; 4096];
        rand::thread_rng().fill_bytes(&mut junk);
        let _ = s.write_all(&junk).await;
        garbage.push(s);
    }
    let mut half_open = Vec::new();
    for _ in 0..50 {
        half_open.push(UnixStream::connect(&d.admin).await.unwrap());
    }
    let mut loris = Vec::new();
    for _ in 0..50 {
        let mut s = UnixStream::connect(&d.admin).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: crisp\r\nX-Slow: ")
            .await
            .unwrap();
        loris.push(s);
    }
    let mut h2_partial = Vec::new();
    for _ in 0..30 {
        let mut s = UnixStream::connect(&d.admin).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        s.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
        // HEADERS for stream 1 announcing 64 bytes; 10 sent.
        s.write_all(&[0, 0, 64, 0x1, 0x5, 0, 0, 0, 1])
            .await
            .unwrap();
        s.write_all(&[0x83, 0x86, 0x84, 0x41, 0x8a, 0x08, 0x9d, 0x5c, 0x0b, 0x81])
            .await
            .unwrap();
        h2_partial.push(s);
    }
    // Tap subscribers that never read: their streams stall (flow control), crisp drops their
    // events and must not slow anything for it.
    let mut stalled_taps = Vec::new();
    for _ in 0..20 {
        let mut c = crisp::cli::client::connect(&d.admin).await.unwrap();
        let s = c
            .tap(pb::TapRequest {
                full: true,
                include_polling: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        stalled_taps.push((c, s));
    }
    let attack_started = Instant::now();
    let before = good.answered.load(Ordering::Relaxed);

    // A bounded observation window with the attack in place: slow-loris clients trickle one
    // header byte per second meanwhile; the good clients must be answered throughout.
    let window = Duration::from_secs(4);
    while attack_started.elapsed() < window {
        for s in loris.iter_mut() {
            let _ = s.write_all(b"x").await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let during = good.answered.load(Ordering::Relaxed) - before;

    // Garbage connections are closed by crisp (hyper rejects them).
    let mut closed_garbage = 0;
    for s in garbage.iter_mut() {
        if within(
            Duration::from_secs(5),
            "a garbage connection to be closed",
            read_until_closed(s),
        )
        .await
        .len()
            < 1 << 20
        {
            closed_garbage += 1;
        }
    }
    // Which stalled connections crisp has closed by itself (reported, not required).
    let still_open = |v: &[UnixStream]| {
        v.iter()
            .filter(|s| {
                let mut buf = [0u8; 1];
                matches!(s.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count()
    };
    let open_after = format!(
        "still open afterwards: {}/{} half-open, {}/{} slow-loris, {}/{} half-HTTP/2",
        still_open(&half_open),
        half_open.len(),
        still_open(&loris),
        loris.len(),
        still_open(&h2_partial),
        h2_partial.len()
    );

    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        within(PATIENCE, "a good client to stop", t).await.unwrap();
    }
    let failure = good.failure.lock().unwrap().clone();
    assert!(
        failure.is_none(),
        "a good client was affected by the attack: {failure:?}"
    );
    assert!(
        during >= 30,
        "only {during} good calls answered during the {window:?} attack"
    );
    assert_eq!(closed_garbage, garbage.len());
    let text = metrics_over_http1(&d.admin).unwrap();
    let dropped = text
        .lines()
        .find(|l| l.starts_with("crisp_tap_events_dropped_total"))
        .unwrap_or("")
        .to_string();
    eprintln!(
        "admin attack: {} garbage (all closed), {} half-open, {} slow-loris, {} half-HTTP/2, {} stalled taps; {during} good calls answered during {window:?} (slowest {:.1} ms); {open_after}; {dropped}",
        garbage.len(),
        half_open.len(),
        loris.len(),
        h2_partial.len(),
        stalled_taps.len(),
        good.slowest_us.load(Ordering::Relaxed) as f64 / 1e3,
    );
    drop((half_open, loris, h2_partial, stalled_taps));
}
