//! crisp under systemd: socket activation (LISTEN_FDS) and readiness notification (sd_notify),
//! exercised on the real `crisp` binary with a fake CRI runtime behind it.
//!
//! - through `systemd-socket-activate` (systemd's own tool): crisp serves on the inherited
//!   socket, tells READY, and leaves the socket file alone on exit;
//! - with the test holding the listening socket the way PID 1 does for crisp.socket: crisp is
//!   SIGKILLed and restarted while clients keep calling, and no call sent while it was down is
//!   lost (they wait in the listen backlog; none is refused);
//! - READY=1 arrives only once crisp's socket accepts connections (path and abstract
//!   NOTIFY_SOCKET), never when it cannot listen, and STOPPING=1 on SIGTERM.
//! - variables leaked from a parent are ignored; malformed ones, or an inherited fd that is not a
//!   listening socket, are a clear error and crisp does not bind a socket of its own.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::systemd_support::*;

const T: Duration = Duration::from_secs(20);

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("crisp-sd")
        .tempdir_in("/tmp")
        .unwrap()
}

fn exe_of(pid: i32) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_on_a_socket_from_systemd_socket_activate() {
    ensure_tool("systemd-socket-activate", "systemd");
    let dir = tempdir();
    let rt = fake_runtime(&dir.path().join("runtime.sock"), false).await;
    let sock = dir.path().join("crisp.sock");
    let notify = Notify::at_path(&dir.path().join("notify.sock"));
    let cfg = test_config(dir.path());

    let mut c = Command::new("systemd-socket-activate");
    c.arg("--listen").arg(&sock).arg("--fdname=crisp");
    c.arg("--setenv")
        .arg(format!("NOTIFY_SOCKET={}", notify.env))
        .arg("--setenv=RUST_LOG=info");
    c.arg(CRISP)
        .arg("--config")
        .arg(&cfg)
        .arg("--listen")
        .arg(&sock)
        .arg("--upstream")
        .arg(&rt.path);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn systemd-socket-activate");
    let lines = stderr_lines(&mut child);
    let mut proc = Proc {
        child,
        log: dir.path().join("none"),
    };
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    loop {
        let l = lines
            .recv_timeout(T)
            .expect("systemd-socket-activate never said it is listening");
        log.lock().unwrap().push(l.clone());
        if l.starts_with("Listening on") {
            break;
        }
    }
    {
        let log = log.clone();
        std::thread::spawn(move || {
            while let Ok(l) = lines.recv() {
                log.lock().unwrap().push(l);
            }
        });
    }
    let crisp_exe = std::fs::canonicalize(CRISP).unwrap();
    assert_ne!(
        exe_of(proc.pid()),
        crisp_exe,
        "crisp must not run before the first connection"
    );

    // The first connection makes systemd-socket-activate exec crisp (same pid) with fd 3.
    let v = version(&sock).await.unwrap_or_else(|e| {
        panic!(
            "call through the activated crisp: {e}\n{}",
            log.lock().unwrap().join("\n")
        )
    });
    assert_eq!(v.runtime_name, "fake-runtime");
    let ready = notify.wait_for("READY=1", T).await;
    assert!(
        ready.lines().any(|l| l.starts_with("STATUS=")),
        "READY comes with a STATUS: {ready:?}"
    );
    assert_eq!(
        exe_of(proc.pid()),
        crisp_exe,
        "crisp runs as the activated process (LISTEN_PID matched)"
    );
    for _ in 0..5 {
        assert_eq!(version(&sock).await.unwrap().runtime_api_version, "v1");
    }
    assert_eq!(
        rt.calls.load(Ordering::SeqCst),
        6,
        "every call reached the runtime"
    );

    proc.signal(libc::SIGTERM);
    notify.wait_for("STOPPING=1", T).await;
    let st = proc.wait_exit(T);
    let text = log.lock().unwrap().join("\n");
    assert!(st.success(), "crisp exits 0 on SIGTERM: {st:?}\n{text}");
    assert!(
        text.contains("serving on the socket inherited from systemd"),
        "crisp says where it serves:\n{text}"
    );
    let md = std::fs::symlink_metadata(&sock)
        .expect("the socket file belongs to systemd: crisp must not remove it");
    assert!(md.file_type().is_socket());
}

/// One client loop's record of one call.
#[derive(Debug)]
struct Outcome {
    connect_error: Option<String>,
    result: Result<String, String>,
}

/// One call on a fresh connection, never retried.
async fn call_once(sock: &Path, connected: Option<tokio::sync::oneshot::Sender<()>>) -> Outcome {
    match tokio::net::UnixStream::connect(sock).await {
        Err(e) => Outcome {
            connect_error: Some(e.to_string()),
            result: Err("not connected".into()),
        },
        Ok(s) => {
            if let Some(c) = connected {
                let _ = c.send(());
            }
            let r = match tokio::time::timeout(Duration::from_secs(60), version_over(s, "v1")).await
            {
                Ok(r) => r.map(|v| v.runtime_name),
                Err(_) => Err("no answer within 60s".into()),
            };
            Outcome {
                connect_error: None,
                result: r,
            }
        }
    }
}

/// The `n`th crisp of a test (its log `crisp-{n}.log`), serving on the socket the test holds as
/// systemd would, in front of the runtime at `upstream`, telling `notify` when it is ready.
fn on_listener(
    dir: &Path,
    n: usize,
    sock: &Path,
    upstream: &Path,
    listener: &std::os::unix::net::UnixListener,
    notify: &Notify,
) -> Proc {
    let log = dir.join(format!("crisp-{n}.log"));
    let mut c = crisp_between(dir, sock, upstream, &log);
    c.env("NOTIFY_SOCKET", &notify.env);
    spawn(with_listen_fd(c, listener.as_raw_fd(), &log), &log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_an_inherited_socket_loses_no_call_sent_while_down() {
    const LOOPS: usize = 4;
    const CYCLES: usize = 3;
    const WHILE_DOWN: usize = 8;
    let dir = tempdir();
    let rt = fake_runtime(&dir.path().join("runtime.sock"), false).await;
    let sock = dir.path().join("crisp.sock");
    // The test plays PID 1 with crisp.socket: it owns the listening socket for the whole test.
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o660)).unwrap();
    let notify = Notify::at_path(&dir.path().join("notify.sock"));
    let start = |n: usize| on_listener(dir.path(), n, &sock, &rt.path, &listener, &notify);

    let mut crisp = start(0);
    notify.wait_for("READY=1", T).await;

    // Clients that keep calling throughout, each call on a fresh connection.
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let (ok_tx, ok_rx) = tokio::sync::watch::channel(0usize);
    let ok_tx = Arc::new(ok_tx);
    let mut clients = Vec::new();
    for _ in 0..LOOPS {
        let (stop, outcomes, ok_tx, sock) =
            (stop.clone(), outcomes.clone(), ok_tx.clone(), sock.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let o = call_once(&sock, None).await;
                let (ok, refused) = (o.result.is_ok(), o.connect_error.is_some());
                outcomes.lock().unwrap().push(o);
                if ok {
                    ok_tx.send_modify(|n| *n += 1);
                }
                if refused {
                    break; // already a failure; do not spin on it
                }
            }
        }));
    }

    let mut pids = vec![crisp.pid()];
    let mut sent_while_down = Vec::new();
    for cycle in 1..=CYCLES {
        let want = *ok_rx.borrow() + 20;
        tokio::time::timeout(T, ok_rx.clone().wait_for(|n| *n >= want))
            .await
            .expect("calls are served")
            .unwrap();
        crisp.signal(libc::SIGKILL);
        tokio::task::block_in_place(|| crisp.wait_exit(T));
        // crisp is dead and reaped: nothing can accept. Calls sent now must wait in the backlog.
        let mut connected = Vec::new();
        for _ in 0..WHILE_DOWN {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sock = sock.clone();
            sent_while_down.push(tokio::spawn(
                async move { call_once(&sock, Some(tx)).await },
            ));
            connected.push(rx);
        }
        for rx in connected {
            // A refused connect drops the sender: the outcome says why.
            let _ = tokio::time::timeout(T, rx)
                .await
                .expect("connect returns at once while crisp is down");
        }
        crisp = start(cycle);
        pids.push(crisp.pid());
        notify.wait_for("READY=1", T).await;
    }
    let want = *ok_rx.borrow() + 20;
    tokio::time::timeout(T, ok_rx.clone().wait_for(|n| *n >= want))
        .await
        .expect("calls are served after the last restart")
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        tokio::time::timeout(Duration::from_secs(70), c)
            .await
            .expect("client loop ends")
            .unwrap();
    }
    let mut down_outcomes = Vec::new();
    for t in sent_while_down {
        down_outcomes.push(
            tokio::time::timeout(Duration::from_secs(70), t)
                .await
                .expect("call sent while down ends")
                .unwrap(),
        );
    }

    let lost: Vec<_> = down_outcomes
        .iter()
        .filter(|o| o.result.as_deref() != Ok("fake-runtime"))
        .collect();
    assert!(
        lost.is_empty(),
        "calls sent while crisp was down were lost: {lost:?}\nlast crisp log:\n{}",
        crisp.log_text()
    );
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let refused: Vec<_> = outcomes
        .iter()
        .filter_map(|o| o.connect_error.as_ref())
        .collect();
    assert!(
        refused.is_empty(),
        "connections were refused while crisp restarted: {refused:?}"
    );
    // Only a call that crisp had already accepted when it was SIGKILLed can fail.
    let failed_in_flight = outcomes.iter().filter(|o| o.result.is_err()).count();
    assert!(
        failed_in_flight <= LOOPS * CYCLES,
        "{failed_in_flight} failures for {CYCLES} kills of {LOOPS} sequential clients"
    );
    eprintln!(
        "{} continuous calls ({failed_in_flight} in flight at a SIGKILL failed), {} calls sent while crisp was down: all answered; crisp pids {pids:?}",
        outcomes.len(),
        down_outcomes.len()
    );
    pids.dedup();
    assert_eq!(pids.len(), CYCLES + 1, "each restart is a new process");

    crisp.signal(libc::SIGTERM);
    notify.wait_for("STOPPING=1", T).await;
    assert!(tokio::task::block_in_place(|| crisp.wait_exit(T)).success());
    assert!(sock.exists(), "crisp must not remove a socket it inherited");
    drop(listener);
}

async fn ready_then_stopping(notify: Notify) {
    let dir = tempdir();
    let rt = fake_runtime(&dir.path().join("runtime.sock"), false).await;
    let sock = dir.path().join("run").join("crisp.sock");
    let log = dir.path().join("crisp.log");
    let mut c = crisp_between(dir.path(), &sock, &rt.path, &log);
    c.env("NOTIFY_SOCKET", &notify.env);
    let mut p = spawn(c, &log);

    let first = notify.recv(T).await;
    // This very moment: crisp claims readiness, so its socket must accept a connection now.
    let conn = std::os::unix::net::UnixStream::connect(&sock);
    assert!(
        first.lines().any(|l| l == "READY=1"),
        "the first notification is READY=1: {first:?}"
    );
    conn.unwrap_or_else(|e| {
        panic!(
            "READY=1 was sent but {} does not accept connections: {e}\n{}",
            sock.display(),
            p.log_text()
        )
    });
    assert!(
        first.lines().any(|l| l.starts_with("STATUS=serving")),
        "{first:?}"
    );
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    assert_eq!(version(&sock).await.unwrap().runtime_name, "fake-runtime");

    p.signal(libc::SIGTERM);
    let m = notify.wait_for("STOPPING=1", T).await;
    assert!(m.lines().any(|l| l.starts_with("STATUS=")), "{m:?}");
    let st = tokio::task::block_in_place(|| p.wait_exit(T));
    assert!(st.success(), "{st:?}\n{}", p.log_text());
    assert!(
        !sock.exists(),
        "a socket crisp bound itself is removed on exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_once_listening_and_stopping_on_sigterm() {
    let dir = tempdir();
    ready_then_stopping(Notify::at_path(&dir.path().join("notify.sock"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_over_an_abstract_notify_socket() {
    let name = format!(
        "crisp-test-notify-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    );
    ready_then_stopping(Notify::abstract_named(&name)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ready_when_crisp_cannot_listen() {
    let dir = tempdir();
    let notify = Notify::at_path(&dir.path().join("notify.sock"));
    let sock = dir.path().join("crisp.sock");
    // Somebody else serves the path: crisp refuses to replace a live socket and exits.
    let _other = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let log = dir.path().join("crisp.log");
    let mut c = crisp_command(
        dir.path(),
        &[
            "--listen",
            &sock.display().to_string(),
            "--upstream",
            "/nonexistent.sock",
        ],
        &log,
    );
    c.env("NOTIFY_SOCKET", &notify.env);
    let mut p = spawn(c, &log);
    let st = tokio::task::block_in_place(|| p.wait_exit(T));
    assert!(!st.success());
    assert!(p.log_text().contains("already serving"), "{}", p.log_text());
    let mut buf = [0u8; 512];
    match notify.sock.try_recv(&mut buf) {
        Ok(n) => panic!(
            "crisp notified {:?} although it never listened",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
    }
}

/// crisp started with /dev/null passed as its socket-activation fd (and `env` on top): it must
/// exit with an error, not fall back to binding its socket. Its log.
fn refused_activation(env: &[(&str, &str)]) -> String {
    let dir = tempdir();
    let devnull = std::fs::File::open("/dev/null").unwrap();
    let log = dir.path().join("crisp.log");
    let c = crisp_command(
        dir.path(),
        &[
            "--listen",
            &dir.path().join("crisp.sock").display().to_string(),
        ],
        &log,
    );
    let mut c = with_listen_fd(c, devnull.as_raw_fd(), &log);
    c.envs(env.iter().copied());
    let mut p = spawn(c, &log);
    let st = p.wait_exit(T);
    assert!(!st.success());
    assert!(
        !dir.path().join("crisp.sock").exists(),
        "crisp must not fall back to binding"
    );
    p.log_text()
}

#[test]
fn an_inherited_fd_that_is_not_a_listening_socket_is_a_clear_error() {
    let text = refused_activation(&[]);
    assert!(
        text.contains("inherited fd 3 (crisp) is not a socket"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_fds_meant_for_another_process_are_ignored() {
    let dir = tempdir();
    let rt = fake_runtime(&dir.path().join("runtime.sock"), false).await;
    let sock = dir.path().join("crisp.sock");
    let notify = Notify::at_path(&dir.path().join("notify.sock"));
    let log = dir.path().join("crisp.log");
    let mut c = crisp_between(dir.path(), &sock, &rt.path, &log);
    // Leaked from a parent (pid 1 is never crisp here), all three as systemd sets them:
    // sd_listen_fds(3) semantics say ignore, names included.
    c.env("LISTEN_PID", "1")
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "crisp")
        .env("NOTIFY_SOCKET", &notify.env);
    let p = spawn(c, &log);
    notify.wait_for("READY=1", T).await;
    assert_eq!(version(&sock).await.unwrap().runtime_name, "fake-runtime");
    assert!(!p.log_text().contains("inherited"), "{}", p.log_text());
    assert!(Path::new(&sock).exists());
}

#[test]
fn a_malformed_listen_fds_is_a_clear_error() {
    let text = refused_activation(&[("LISTEN_FDS", "two")]);
    assert!(
        text.contains("socket activation: LISTEN_PID=")
            && text.contains(r#"LISTEN_FDS="two": invalid LISTEN_FDS"#),
        "{text}"
    );
}

/// `crisp-grpcgo`: hack/build-grpcgo.sh builds it once (cached in target/grpcgo) and prints its
/// path.
fn grpcgo_client() -> std::path::PathBuf {
    let built = Command::new("bash")
        .arg(Path::new(REPO).join("hack/build-grpcgo.sh"))
        .stdin(Stdio::null())
        .output()
        .expect("running hack/build-grpcgo.sh");
    assert!(
        built.status.success(),
        "hack/build-grpcgo.sh (needs golang-go and golang-google-grpc-dev): {}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&built.stdout).trim())
}

/// A grpc-go client's calls (`crisp-grpcgo call`, kubelet's client library): `method` with
/// `hex`, `count` calls four at a time on one connection (each worker starts its next call as
/// the last one is answered); its JSON summary line.
fn grpcgo_calls(
    bin: &Path,
    sock: &Path,
    method: &str,
    hex: &str,
    count: u32,
) -> (String, serde_json::Value) {
    let out = Command::new(bin)
        .args(["call", "--target"])
        .arg(sock)
        .args(["--method", method, "--hex", hex, "--timeout", "60s"])
        // kubelet's socket-path :authority is relayed as is (grpc_go_wire::), and the fake
        // runtime's h2 server refuses it (containerd does not): the authority other clients send.
        .args(["--authority", "localhost"])
        .args([
            "--concurrency",
            "4",
            "--count",
            &count.to_string(),
            "--errors",
        ])
        .output()
        .unwrap();
    let text = output_text(&out);
    let summary = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["summary"] == true)
        .unwrap_or_else(|| panic!("no summary from crisp-grpcgo: {text}"));
    (text, summary)
}

/// kubernetes#126440 (docs/SUPPORT.md): kubelets 1.29.0–1.29.8, 1.30.0–1.30.4 and 1.31.0 can leave
/// an init container stuck for good after one StartContainer fails with "error reading from
/// server: EOF", what a proxy dying under a call produces. A crisp upgrade the way crisp.service
/// does it (SIGTERM, then the new binary on the socket systemd kept) must fail no such call:
/// grpc-go clients keep StartContainer and CreateContainer calls (800 ms each at the runtime, 40
/// each, four at a time: 8 s of calls) in flight across the restart; the calls in flight at
/// SIGTERM finish on the old crisp, the client moves to the new one after GOAWAY, and not one
/// call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_on_the_kept_socket_fails_no_start_or_create_container_in_flight() {
    let dir = tempdir();
    let rt = slow_start_runtime(&dir.path().join("runtime.sock"), Duration::from_millis(800)).await;
    let sock = dir.path().join("crisp.sock");
    // The test plays PID 1 with crisp.socket: it owns the listening socket for the whole test.
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let notify = Notify::at_path(&dir.path().join("notify.sock"));
    let start = |n: usize| on_listener(dir.path(), n, &sock, &rt.path, &listener, &notify);
    let mut old = start(0);
    notify.wait_for("READY=1", T).await;

    let bin = grpcgo_client();
    let (s, b) = (sock.clone(), bin.clone());
    let starts = tokio::task::spawn_blocking(move || {
        grpcgo_calls(
            &b,
            &s,
            "/runtime.v1.RuntimeService/StartContainer",
            "0a026331",
            40,
        )
    });
    let s = sock.clone();
    // CreateContainerRequest { pod_sandbox_id: "sb" }
    let creates = tokio::task::spawn_blocking(move || {
        grpcgo_calls(
            &bin,
            &s,
            "/runtime.v1.RuntimeService/CreateContainer",
            "0a027362",
            40,
        )
    });
    // Both clients' calls are flowing: eight answered, and the next ones at the runtime (not in
    // the gap between two rounds, where a SIGTERM would find nothing in flight).
    let t = std::time::Instant::now();
    while rt.calls.lock().unwrap().len() < 8 || rt.in_flight.load(Ordering::SeqCst) == 0 {
        assert!(
            t.elapsed() < T,
            "the grpc-go calls never reached the runtime"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let term_at = std::time::Instant::now();
    old.signal(libc::SIGTERM);
    let status = tokio::task::block_in_place(|| old.wait_exit(T));
    assert!(status.success(), "{status}: {}", old.log_text());
    let mut new = start(1);
    notify.wait_for("READY=1", T).await;
    let up_at = std::time::Instant::now();

    let mut failures = Vec::new();
    let mut lines = Vec::new();
    for (what, h) in [("StartContainer", starts), ("CreateContainer", creates)] {
        let (text, summary) = h.await.unwrap();
        let (ok, failed, goaways) = (
            summary["ok"].as_u64().unwrap_or(0),
            summary["failed"].as_u64().unwrap_or(0),
            summary["wire"]["goaway_recv"].as_u64().unwrap_or(0),
        );
        if failed > 0 || text.contains("EOF") || text.contains("Unavailable") {
            failures.push(format!("{what}: {text}"));
        }
        assert!(
            goaways >= 1,
            "{what}: the client's connection was never drained by GOAWAY: {text}"
        );
        lines.push(format!(
            "{what}: {ok} ok, {failed} failed, {goaways} GOAWAY"
        ));
    }
    let calls = rt.calls.lock().unwrap().clone();
    let in_flight = calls
        .iter()
        .filter(|(a, b)| *a < term_at && *b > term_at)
        .count();
    let after = calls.iter().filter(|(a, _)| *a > up_at).count();
    assert!(
        failures.is_empty(),
        "calls failed across the upgrade:\n{}\n--- old crisp\n{}\n--- new crisp\n{}",
        failures.join("\n"),
        old.log_text(),
        new.log_text()
    );
    assert!(
        in_flight >= 1,
        "no call was in flight at SIGTERM: the test proved nothing ({}; {} calls: {:?}; SIGTERM at {:?}, new crisp up at {:?})\n--- old crisp\n{}",
        lines.join("; "),
        calls.len(),
        calls
            .iter()
            .map(|(a, b)| (a.duration_since(t), b.duration_since(t)))
            .collect::<Vec<_>>(),
        term_at.duration_since(t),
        up_at.duration_since(t),
        old.log_text()
    );
    assert!(
        after >= 1,
        "no call reached the runtime through the new crisp"
    );
    eprintln!(
        "upgrade on the kept socket: {}; {in_flight} calls in flight at the runtime at SIGTERM, {after} through the new crisp",
        lines.join("; ")
    );
    new.signal(libc::SIGTERM);
    assert!(tokio::task::block_in_place(|| new.wait_exit(T)).success());
    drop(listener);
}
