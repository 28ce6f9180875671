use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
// The tests' own shared state: a poisoned lock there is a failed test.
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::*;

#[test]
fn readiness_is_shown_as_written() {
    for spec in [
        "running",
        "tcp://:15000",
        "http://127.0.0.1:15021/healthz/ready",
        "exec:[\"cat\",\"/ready\"]",
    ] {
        assert_eq!(Readiness::parse(spec).unwrap().to_string(), spec);
    }
}

#[test]
fn parses_every_form() {
    assert_eq!(Readiness::parse("running"), Ok(Readiness::Running));
    assert_eq!(
        Readiness::parse("tcp://:24224"),
        Ok(Readiness::Tcp {
            host: None,
            port: 24224
        })
    );
    assert_eq!(
        Readiness::parse("tcp://127.0.0.1:80"),
        Ok(Readiness::Tcp {
            host: Some([127, 0, 0, 1].into()),
            port: 80
        })
    );
    assert_eq!(
        Readiness::parse("http://:15021/healthz/ready"),
        Ok(Readiness::Http {
            host: None,
            port: 15021,
            path: "/healthz/ready".into()
        })
    );
    assert_eq!(
        Readiness::parse("http://[::1]:8080"),
        Ok(Readiness::Http {
            host: Some("::1".parse().unwrap()),
            port: 8080,
            path: "/".into()
        })
    );
    assert_eq!(
        Readiness::parse(r#"exec:["cat","/tmp/ready"]"#),
        Ok(Readiness::Exec {
            cmd: vec!["cat".into(), "/tmp/ready".into()]
        })
    );
}

#[test]
fn rejects_garbage_with_a_reason() {
    for bad in [
        "",
        "ready",
        "tcp://",
        "tcp://:0",
        "tcp://:99999",
        "tcp://host.example:80",
        "http://:80/a b",
        "exec:",
        "exec:[]",
        "exec:cat /x",
        "exec:[1,2]",
        "udp://:53",
    ] {
        let e = Readiness::parse(bad).unwrap_err();
        assert!(!e.is_empty(), "{bad}");
    }
    assert!(Readiness::parse(&format!("exec:[\"{}\"]", "a".repeat(5000))).is_err());
}

#[tokio::test]
async fn http_probe_reads_the_status_line() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        for status in ["200 OK", "503 Service Unavailable", "302 Found"] {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await
                .unwrap();
        }
    });
    let t = Duration::from_secs(2);
    assert_eq!(probe_http(addr, "/", t).await, Ok(()));
    assert_eq!(
        probe_http(addr, "/", t).await,
        Err(format!("GET http://{addr}/: status 503"))
    );
    assert_eq!(probe_http(addr, "/", t).await, Ok(()));
    server.await.unwrap();
    // Nothing listening any more: the reason says so.
    let e = probe_tcp(addr, t).await.unwrap_err();
    assert!(
        e.starts_with(&format!("connect {addr}: ")) && e.contains("refused"),
        "{e}"
    );
}

#[test]
fn cidrs_parse_strictly_and_match_both_families() {
    let c = Cidr::parse("10.0.0.0/8").unwrap();
    assert!(c.contains("10.255.1.2".parse().unwrap()) && !c.contains("11.0.0.1".parse().unwrap()));
    assert!(
        c.contains("::ffff:10.1.1.1".parse().unwrap()),
        "IPv4-mapped counts as IPv4"
    );
    assert!(!c.contains("fd00::1".parse().unwrap()));
    assert_eq!(
        Cidr::parse(" 192.0.2.7 ").unwrap().to_string(),
        "192.0.2.7/32"
    );
    assert!(Cidr::parse("0.0.0.0/0")
        .unwrap()
        .contains("8.8.8.8".parse().unwrap()));
    let v6 = Cidr::parse("fd00::/8").unwrap();
    assert!(v6.contains("fd12::1".parse().unwrap()) && !v6.contains("fe80::1".parse().unwrap()));
    assert_eq!(Cidr::parse("::/0").unwrap().to_string(), "::/0");
    for bad in [
        "",
        "10.0.0.0/",
        "10.0.0.0/33",
        "10.0.0.1/8",
        "10.0.0.0/+8",
        "10.0.0.0/008",
        "fd00::/129",
        "host/8",
        "10.0.0.0/8/8",
        &"1".repeat(80),
    ] {
        assert!(Cidr::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn local_means_loopback_or_unspecified() {
    for l in [
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "0.0.0.0",
        "::",
        "::ffff:127.0.0.1",
    ] {
        assert!(is_local(l.parse().unwrap()), "{l}");
    }
    for n in ["10.0.0.1", "169.254.169.254", "fe80::1", "::ffff:10.0.0.1"] {
        assert!(!is_local(n.parse().unwrap()), "{n}");
    }
}

/// The in-flight bound: a probe waits for a slot until its deadline, then reports why.
#[tokio::test(start_paused = true)]
async fn probes_in_flight_are_bounded() {
    let l = ProbeLimiter::new(2, 1000);
    let t = Instant::now();
    let a = l.slot("pod", t + Duration::from_secs(1)).await.unwrap();
    let _b = l.slot("pod", t + Duration::from_secs(1)).await.unwrap();
    assert_eq!(l.in_flight(), 2);
    let e = l.slot("pod", t + Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(
        Instant::now() - t,
        Duration::from_secs(1),
        "waited until its deadline, no longer"
    );
    assert!(e.contains("2 probes in flight"), "{e}");
    drop(a);
    assert!(l
        .slot("pod", Instant::now() + Duration::from_millis(1))
        .await
        .is_ok());
}

/// Issue #26: 300 probes of one pod whose sidecars never get ready (each holds its slot
/// for the whole 1 s probe timeout, then tries again) saturate the limiter; a probe of
/// another pod still gets its slot within one probe interval (50 ms).
#[tokio::test(start_paused = true)]
async fn a_pod_flooding_the_limiter_cannot_delay_another_pods_probe() {
    let l = Arc::new(ProbeLimiter::new(64, 1000));
    let t = Instant::now();
    let stop = t + Duration::from_secs(10);
    let mut flood = Vec::new();
    for _ in 0..300 {
        let l = l.clone();
        flood.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let deadline = Instant::now() + Duration::from_secs(1);
                if let Ok(_slot) = l.slot("never-ready", deadline).await {
                    tokio::time::sleep_until(deadline).await;
                }
            }
        }));
    }
    for round in 0..20 {
        tokio::time::sleep(Duration::from_millis(230)).await;
        let asked = Instant::now();
        let slot = l.slot("ready", asked + Duration::from_secs(1)).await;
        assert!(
            slot.is_ok() && Instant::now() - asked <= Duration::from_millis(50),
            "round {round}: {slot:?} after {:?}",
            Instant::now() - asked
        );
        assert_eq!(
            l.in_flight(),
            49,
            "the flooding pod holds its share (48 of 64), no more"
        );
    }
    for f in flood {
        f.await.unwrap();
    }
    assert_eq!(l.in_flight(), 0, "every slot given back");
}

/// Issue #26: twelve pods whose sidecars never get ready, each probing again as soon as it
/// may, keep both slots busy; a newly held pod gets the next slot freed, not a place behind
/// every one of them (about 600 ms when pods joined the turn at its back).
#[tokio::test(start_paused = true)]
async fn a_newly_held_pod_goes_before_pods_that_probe_again_and_again() {
    let l = Arc::new(ProbeLimiter::new(2, 1000));
    let stop = Instant::now() + Duration::from_secs(6);
    let mut never = Vec::new();
    for i in 0..12 {
        let l = l.clone();
        never.push(tokio::spawn(async move {
            let pod = format!("never-{i}");
            while Instant::now() < stop {
                if let Ok(_slot) = l.slot(&pod, Instant::now() + Duration::from_secs(5)).await {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    // Every one of them has had a slot by then, and has been probing since.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for round in 0..10 {
        tokio::time::sleep(Duration::from_millis(370)).await;
        let asked = Instant::now();
        let slot = l
            .slot(&format!("ready-{round}"), asked + Duration::from_secs(5))
            .await;
        let waited = Instant::now() - asked;
        assert!(
            slot.is_ok() && waited <= Duration::from_millis(100),
            "round {round}: waited {waited:?}"
        );
    }
    for n in never {
        n.await.unwrap();
    }
}

/// Freed slots go to the waiting pods in turn, each pod's own probes in order; a probe
/// that gives up leaves its place, and a slot handed to none is given back.
#[tokio::test(start_paused = true)]
async fn freed_slots_go_round_the_waiting_pods() {
    let l = Arc::new(ProbeLimiter::new(1, 1000));
    let t = Instant::now();
    let first = l.slot("a", t + Duration::from_secs(1)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiting = Vec::new();
    for (i, pod) in ["a", "a", "a", "b", "c"].into_iter().enumerate() {
        let (l, order) = (l.clone(), order.clone());
        waiting.push(tokio::spawn(async move {
            let _slot = l.slot(pod, t + Duration::from_secs(60)).await.unwrap();
            order.lock().unwrap().push(format!("{pod}{i}"));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }));
        tokio::task::yield_now().await;
    }
    // One that gives up before its turn.
    assert!(l.slot("d", t + Duration::from_millis(5)).await.is_err());
    drop(first);
    for w in waiting {
        w.await.unwrap();
    }
    // b and c never held a slot: they go before a, which held the first one.
    assert_eq!(*order.lock().unwrap(), ["b3", "c4", "a0", "a1", "a2"]);
    assert_eq!(l.in_flight(), 0);
}

/// The connect rate: a tenth of a second's worth at once, then `rate` a second; one that
/// cannot have its token before its deadline fails at once and leaves no debt.
#[tokio::test(start_paused = true)]
async fn connects_per_second_are_bounded() {
    let l = ProbeLimiter::new(64, 100);
    let t = Instant::now();
    let far = t + Duration::from_secs(60);
    for _ in 0..10 {
        l.rate_turn(far).await.unwrap();
    }
    assert_eq!(Instant::now(), t, "the burst is free");
    // Too soon for a token: refused at once.
    let e = l
        .rate_turn(Instant::now() + Duration::from_millis(1))
        .await
        .unwrap_err();
    assert!(e.contains("100 connects per second"), "{e}");
    assert_eq!(Instant::now(), t);
    // One second of connects: 100 more, not one beyond.
    let mut n = 0;
    while l.rate_turn(t + Duration::from_secs(1)).await.is_ok() {
        n += 1;
    }
    assert_eq!(n, 100, "connects in the first second after the burst");
    assert!(Instant::now() <= t + Duration::from_secs(1));
}

/// Issue #33: a pod's own turns (the exec probes' per-pod rate): a quarter of a second's
/// worth at once, then `rate` a second in the order asked; one that cannot come before its deadline
/// is refused at once and leaves no debt; another pod's turns are its own. Kept buckets stay
/// bounded by the pods probing lately, not by every pod ever probed.
#[tokio::test(start_paused = true)]
async fn a_pods_own_turns_are_paced_and_bounded() {
    let l = ProbeLimiter::new(4, 50).per_pod_rate(20);
    let t = Instant::now();
    let far = t + Duration::from_secs(60);
    for _ in 0..5 {
        assert_eq!(l.pod_turn("a", far).await, Ok(Duration::ZERO));
    }
    let e = l
        .pod_turn("a", Instant::now() + Duration::from_millis(10))
        .await
        .unwrap_err();
    assert!(e.contains("per-pod probe limit: 20 a second"), "{e}");
    assert_eq!(l.pod_turn("b", far).await, Ok(Duration::ZERO), "b's own");
    assert_eq!(Instant::now(), t);
    let mut n = 0;
    while l.pod_turn("a", t + Duration::from_secs(1)).await.is_ok() {
        n += 1;
    }
    assert_eq!(n, 20, "a's turns in the first second after its burst");
    // 10,000 pods probing once each, 100 a second: only the last ones' buckets are kept.
    for i in 0..10_000 {
        l.pod_turn(&format!("pod-{i}"), Instant::now() + Duration::from_secs(1))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            l.pod_buckets() <= 2 * POD_BUCKETS_SWEEP,
            "{}",
            l.pod_buckets()
        );
    }
    // At or above the node's rate a pod's rate adds nothing: not kept.
    let l = ProbeLimiter::new(4, 50).per_pod_rate(50);
    for _ in 0..100 {
        assert_eq!(l.pod_turn("a", far).await, Ok(Duration::ZERO));
    }
    assert_eq!(l.pod_buckets(), 0);
}

/// A probe connects through its environment (the pod's namespace in the engine), never
/// straight from crisp's.
#[tokio::test]
async fn probes_connect_through_their_environment() {
    struct Refuse;
    impl ProbeEnv for Refuse {
        async fn pod_ip(&self) -> Option<IpAddr> {
            Some([127, 0, 0, 1].into())
        }
        async fn connect(&self, _: SocketAddr) -> Result<TcpStream, String> {
            Err("cannot enter the pod's network namespace: test".into())
        }
        async fn exec(&self, _: &[String], _: Duration) -> Result<i32, String> {
            Ok(0)
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = Duration::from_secs(1);
    for spec in [
        format!("tcp://127.0.0.1:{port}"),
        format!("http://:{port}/"),
    ] {
        let e = Readiness::parse(&spec)
            .unwrap()
            .probe(&Refuse, t)
            .await
            .unwrap_err();
        assert!(
            e.starts_with("cannot enter the pod's network namespace"),
            "{e}"
        );
    }
    l.set_nonblocking(true).unwrap();
    assert!(l.accept().is_err(), "nothing reached the listener");
}
