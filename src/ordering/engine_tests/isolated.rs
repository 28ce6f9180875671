//! Isolated pods (issue #35, `isolation.rs`): classified by their runtime handler, probed at the
//! pod IP from crisp's own namespace, and a readiness target on their loopback reported at once
//! with the pod's timeout policy applied then, not at the start timeout.

use super::*;

/// A pod of `handler` whose sidecar `proxy` is running and probed at `ready`, start timeout
/// 10 s; the pod IP `ip`.
fn isolated_pod(
    handler: &str,
    ready: &str,
    ip: &str,
    extra: &[(&str, &str)],
) -> (Fake, Arc<Engine>) {
    let mut extra = extra.to_vec();
    extra.push((annotations::START_TIMEOUT, "10s"));
    let (fake, engine) = fake_pod(&["proxy"], &extra);
    fake.script()
        .annotations
        .insert("crisp.dev/ready.proxy".into(), ready.into());
    fake.script().ip = Some(ip.into());
    fake.script().handler = handler.into();
    fake.add("proxy", Some(now()));
    (fake, engine)
}

/// An address of this host that is not loopback (the source of its default route), standing
/// in for an isolated pod's IP: reachable from crisp's namespace, not local in the sense of
/// `readiness::is_local`.
fn a_host_address() -> std::net::IpAddr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.connect("192.0.2.1:9")
        .expect("this test needs an IPv4 default route (a non-loopback address)");
    s.local_addr().unwrap().ip()
}

fn last_probe(engine: &Engine) -> crate::readiness::ProbeResult {
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    p.and_then(|p| p.last_probe("proxy")).unwrap().result
}

/// A loopback target in a Kata pod cannot be reached: under policy proceed the app goes at
/// once (main held it the whole 10 s), nothing on the node's loopback is connected to, and the
/// probe's result says why. A second app is not held either.
#[tokio::test(start_paused = true)]
async fn an_isolated_pods_loopback_target_falls_back_to_proceed_at_once() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let (fake, engine) = isolated_pod(
        "kata",
        &format!("http://127.0.0.1:{port}/ready"),
        "10.1.2.3",
        &[],
    );
    for app in ["app", "app2"] {
        let (v, held) = create_container(&engine, &fake, app).await;
        assert_forwarded_at_once(&v, held);
    }
    let why = last_probe(&engine).unwrap_err();
    assert!(
        why.contains("cannot be probed in an isolated pod (handler kata)"),
        "{why}"
    );
    assert_eq!(
        l.accept().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::WouldBlock),
        "crisp connected to the node's loopback"
    );
    assert_eq!(engine.metrics.probe_connects.get(), 0);
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    assert_eq!(
        p.unwrap().isolation().map(ToString::to_string).as_deref(),
        Some("isolated (handler kata)")
    );
}

/// Under policy fail the create is refused at once with the reason (kubelet shows it as the
/// container's waiting reason), not after the 10 s start timeout.
#[tokio::test(start_paused = true)]
async fn an_isolated_pods_loopback_target_under_policy_fail_is_refused_at_once() {
    let (fake, engine) = isolated_pod(
        "runsc",
        "tcp://[::1]:9901",
        "10.1.2.3",
        &[(annotations::TIMEOUT_POLICY, "fail")],
    );
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_eq!(held, Duration::ZERO);
    let message = refusal(&v);
    assert!(
        message.contains("[::1]:9901")
            && message.contains("cannot be probed in an isolated pod (handler runsc)"),
        "{message}"
    );
}

/// An isolated pod's IP is probed from crisp's own namespace (here the "pod IP" is an address
/// of this host, where a listener waits): ready at once, and the sandbox's network namespace
/// is never looked for. Main looked for it first (this runtime reveals none: counted in
/// `crisp_probe_netns_failures_total` and warned about), then connected from the node's.
#[tokio::test]
async fn an_isolated_pods_ip_is_probed_from_crisps_namespace() {
    let ip = a_host_address();
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (fake, engine) = isolated_pod("kata-qemu", &format!("tcp://:{port}"), &ip.to_string(), &[]);
    let t0 = std::time::Instant::now();
    let (v, _) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "held {:?}",
        t0.elapsed()
    );
    assert_eq!(last_probe(&engine), Ok(()));
    let (_accepted, peer) = l.accept().await.unwrap();
    assert_eq!(peer.ip(), ip, "from crisp's own namespace");
    assert_eq!(
        engine.metrics.probe_netns_failures.get(),
        0,
        "the sandbox's namespace was looked for"
    );
}

/// A refused connect at an isolated pod's IP says what crisp cannot tell apart: a sidecar still
/// starting, or one listening only on its loopback.
#[tokio::test]
async fn a_refused_probe_of_an_isolated_pod_says_what_crisp_cannot_tell() {
    let ip = a_host_address();
    let port = {
        let l = std::net::TcpListener::bind((ip, 0)).unwrap();
        l.local_addr().unwrap().port()
    };
    let (fake, engine) = isolated_pod(
        "kata",
        &format!("tcp://:{port}"),
        &ip.to_string(),
        &[(annotations::START_TIMEOUT, "1s")],
    );
    let _ = create_container(&engine, &fake, "app").await;
    let why = last_probe(&engine).unwrap_err();
    assert!(
        why.contains("refused") && why.ends_with(super::super::isolation::REFUSED_HINT),
        "{why}"
    );
}

/// Shared-kernel handlers (the default list: `""`, `runc`, `crun`) are probed as before: a
/// loopback target inside the pod's namespace, which this fake runtime does not reveal — so
/// the probe fails with that reason and the app waits out its timeout, as on main.
#[tokio::test(start_paused = true)]
async fn shared_kernel_pods_are_probed_as_before() {
    for handler in ["", "runc", "crun"] {
        let (fake, engine) = isolated_pod(handler, "tcp://127.0.0.1:9901", "10.1.2.3", &[]);
        let (v, held) = create_container(&engine, &fake, "app").await;
        assert_forward(&v);
        assert_held(held, 10 * S, 100 * MS);
        let why = last_probe(&engine).unwrap_err();
        assert!(
            why.starts_with("cannot enter the pod's network namespace"),
            "{handler:?}: {why}"
        );
        let (p, _) = engine.lookup(Some(SANDBOX), None);
        assert!(
            !p.unwrap().isolation().unwrap().is_isolated(),
            "{handler:?}"
        );
    }
}

/// The handler RunPodSandbox names classifies the pod before anything is probed (the runtime's
/// status is not asked), and the operator's list decides: here `kata` is listed as shared.
#[tokio::test(start_paused = true)]
async fn run_pod_sandbox_classifies_by_the_operators_list() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.readiness.shared_kernel_handlers = vec!["kata".into()];
    });
    for (sandbox, handler, isolated) in [
        ("sb-kata", "kata", false),
        ("sb-runc", "runc", true),
        ("sb-default", "", true),
    ] {
        let req = views::RunPodSandboxRequest {
            config: Some(views::PodSandboxConfig {
                metadata: Some(views::PodSandboxMetadata {
                    name: sandbox.into(),
                    namespace: "ns".into(),
                    uid: sandbox.into(),
                    attempt: 0,
                }),
                annotations: fake.script().annotations.clone(),
                ..Default::default()
            }),
            runtime_handler: handler.into(),
        }
        .encode_to_vec();
        let resp = views::RunPodSandboxResponse {
            pod_sandbox_id: sandbox.into(),
        }
        .encode_to_vec();
        let _ = engine.on_response(&call("RunPodSandbox", None), &req, Some(&resp), 0);
        let (p, _) = engine.lookup(Some(sandbox), None);
        assert_eq!(
            p.unwrap().isolation().map(|i| i.is_isolated()),
            Some(isolated),
            "{handler:?}"
        );
    }
}
