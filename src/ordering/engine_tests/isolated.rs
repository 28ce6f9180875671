//! Isolated pods (issues #35, #44, `isolation.rs`): a pod whose network crisp cannot enter is
//! probed at its own IPs only, from crisp's own namespace, never at an address of the node's;
//! a readiness target on its loopback is reported at once with the pod's timeout policy applied
//! then, not at the start timeout. Whether it is isolated is evidence (the sandbox's namespace
//! holds the pod IP), not its runtime handler's name.

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

/// Only loopback counts as the node's own address in this engine, so that an address of this
/// host can stand in for an isolated pod's IP that crisp reaches from its own namespace.
fn host_address_stands_in_for_a_pods(engine: &Engine) {
    let _ = engine.test_node_address.set(|ip| ip.is_loopback());
}

/// How the engine classified the test's pod (`isolated (handler …)`, `shared kernel (…)`).
fn isolation(engine: &Engine) -> Option<String> {
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    p.unwrap().isolation().map(|i| i.to_string())
}

/// Nothing connected to the node's listener (`accepts`), and the pod's isolation is `judged`.
fn assert_node_untouched(engine: &Engine, accepts: &std::sync::atomic::AtomicUsize, judged: &str) {
    assert_eq!(
        accepts.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "crisp connected to the node's listener"
    );
    assert_eq!(isolation(engine).as_deref(), Some(judged));
}

/// A pod with sidecar `proxy` (held up to 1 s) on a node whose operator allowed `network` in
/// `probe_allow`, its config `tune`d further.
fn allowing(fake: &Fake, network: &str, tune: impl FnOnce(&mut Config)) -> Arc<Engine> {
    pod_with(
        fake,
        &["proxy"],
        &[(annotations::START_TIMEOUT, "1s")],
        |c| {
            c.ordering.probe_allow = vec![crate::readiness::Cidr::parse(network).unwrap()];
            tune(c);
        },
    )
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
    assert_eq!(
        isolation(&engine).as_deref(),
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
/// of this host, where a listener waits, and only loopback counts as the node's): ready at
/// once. The sandbox's namespace is looked for (issue #44: evidence first); this runtime
/// reveals none, which for a handler not in the shared-kernel list is not counted in
/// `crisp_probe_netns_failures_total`.
#[tokio::test]
async fn an_isolated_pods_ip_is_probed_from_crisps_namespace() {
    let ip = a_host_address();
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (fake, engine) = isolated_pod("kata-qemu", &format!("tcp://:{port}"), &ip.to_string(), &[]);
    host_address_stands_in_for_a_pods(&engine);
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
        "counted as a CNI pod whose namespace is missing"
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
    host_address_stands_in_for_a_pods(&engine);
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

/// Counts the connections a listener on the node accepts, in the background.
fn count_accepts(l: std::net::TcpListener) -> Arc<std::sync::atomic::AtomicUsize> {
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = n.clone();
    l.set_nonblocking(true).unwrap();
    let l = tokio::net::TcpListener::from_std(l).unwrap();
    tokio::spawn(async move {
        while let Ok((_s, _)) = l.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    n
}

/// A pod of `handler` at an address of the node, its sidecar probed at `tcp://:PORT` where a
/// listener on the node waits, start timeout 1 s: the fake, the engine, and how many connections
/// the listener accepted.
fn pod_at_a_node_listener(
    handler: &str,
) -> (Fake, Arc<Engine>, Arc<std::sync::atomic::AtomicUsize>) {
    let ip = a_host_address();
    let l = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let accepts = count_accepts(l);
    let (fake, engine) = isolated_pod(
        handler,
        &format!("tcp://:{port}"),
        &ip.to_string(),
        &[(annotations::START_TIMEOUT, "1s")],
    );
    (fake, engine, accepts)
}

/// Issue #44, adversarial: a `kata` pod whose CNI let it "live at" the node's own address,
/// probed at `tcp://:PORT` where a listener on the node waits. crisp cannot enter the pod's
/// network (this runtime reveals no namespace), so it would probe from the node's: it refuses,
/// the listener gets nothing, and the probe's result says why. On bde328c crisp connected to
/// the node's listener and judged the sidecar ready.
#[tokio::test]
async fn a_kata_pod_at_the_nodes_address_reaches_nothing() {
    let (fake, engine, accepts) = pod_at_a_node_listener("kata");
    let _ = create_container(&engine, &fake, "app").await;
    let why = last_probe(&engine).unwrap_err();
    assert!(
        why.contains("not probed from outside the pod's network")
            && why.contains("an address of the node itself"),
        "{why}"
    );
    assert_eq!(accepts.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(engine.metrics.probe_connects.get(), 0);
}

/// Issue #44, adversarial: an isolated pod's annotation aimed at an address the operator put in
/// `probe_allow` (a Service, the node) would be reached with the node's source address, past the
/// pod's NetworkPolicy: treated as a bad annotation (warned, counted, as if absent), never
/// connected to. On bde328c crisp connected to it from the node's namespace.
#[tokio::test]
async fn an_isolated_pods_probe_allow_target_is_never_reached() {
    let target = a_host_address();
    let l = std::net::TcpListener::bind((target, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let accepts = count_accepts(l);
    let fake = Fake::default();
    let engine = allowing(&fake, &target.to_string(), |_| {});
    host_address_stands_in_for_a_pods(&engine);
    fake.script().annotations.insert(
        "crisp.dev/ready.proxy".into(),
        format!("http://{target}:{port}/metrics"),
    );
    fake.script().ip = Some("10.1.2.3".into());
    fake.script().handler = "kata".into();
    fake.add("proxy", Some(now()));
    let _ = create_container(&engine, &fake, "app").await;
    assert_eq!(accepts.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(engine.metrics.bad_annotations.get(), 1);
    assert_eq!(engine.metrics.probe_connects.get(), 0);
}

/// A network namespace of the test's own (`ip netns add`), removed when dropped, with `addr`
/// on its loopback device: a pod's network where the pod IP lives.
pub(super) struct TestNetns(String);

impl TestNetns {
    pub(super) fn new(addr: std::net::IpAddr) -> TestNetns {
        assert_eq!(
            crate::sys::effective_uid(),
            0,
            "this test creates a network namespace: it needs root (CI runs as root)"
        );
        let name = format!("crisp-test-{}-{}", std::process::id(), port_seed());
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        };
        ip(&["netns", "add", &name]);
        let ns = TestNetns(name);
        let a = format!("{addr}/32");
        ip(&["-n", &ns.0, "addr", "add", &a, "dev", "lo"]);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ns
    }

    pub(super) fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    /// A runtime's verbose PodSandboxStatus `info` (containerd's shape) naming this namespace as
    /// the sandbox's network namespace.
    pub(super) fn runtime_info(&self) -> String {
        format!(
            r#"{{"runtimeSpec":{{"linux":{{"namespaces":[{{"type":"network","path":"{}"}}]}}}}}}"#,
            self.path()
        )
    }
}

fn port_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, SeqCst)
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

/// Issue #44, adversarial: a runc-based pod under a handler not in `shared_kernel_handlers`
/// (the GPU operator's `nvidia`), its pod IP the node's own address. Its sandbox's namespace
/// holds that address, so crisp probes inside it, whatever the handler: the sidecar listening
/// there is found ready, and the node's listener on the same address and port gets nothing.
/// On bde328c the handler's name made it "isolated": probed from the node's namespace, the
/// node's listener was connected to.
#[tokio::test]
async fn a_runc_pod_under_another_handler_is_probed_inside_its_namespace() {
    let ip = a_host_address();
    let netns = TestNetns::new(ip);
    // The sidecar: listening inside the pod's namespace at the pod IP.
    let ns = crate::netns::NetNs::open(std::path::Path::new(&netns.path())).unwrap();
    let inside = ns.socket(ip.is_ipv6()).await.unwrap();
    inside.bind(std::net::SocketAddr::new(ip, 0)).unwrap();
    let port = inside.local_addr().unwrap().port();
    let inside = inside.listen(16).unwrap();
    // The node: listening at the same address and port in crisp's namespace.
    let accepts = count_accepts(std::net::TcpListener::bind((ip, port)).unwrap());
    let (fake, engine) = isolated_pod("nvidia", &format!("tcp://:{port}"), &ip.to_string(), &[]);
    fake.script().info = Some(netns.runtime_info());
    let (v, _) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_eq!(last_probe(&engine), Ok(()));
    // The probe's connection is in the sidecar's backlog already (bounded: never a hang).
    tokio::time::timeout(Duration::from_secs(5), inside.accept())
        .await
        .expect("the sidecar inside the pod's namespace was never connected to")
        .unwrap();
    assert_node_untouched(&engine, &accepts, "shared kernel (handler nvidia)");
}

/// The same `nvidia` pod, when the namespace the runtime names does not hold the pod IP (a VM
/// owns it, as hack/isolated-runc arranges): isolated by the evidence, and its IP being the
/// node's address, nothing is probed.
#[tokio::test]
async fn a_namespace_without_the_pod_ip_makes_the_pod_isolated() {
    let netns = TestNetns::new("192.0.2.200".parse().unwrap());
    let (fake, engine, accepts) = pod_at_a_node_listener("nvidia");
    fake.script().info = Some(netns.runtime_info());
    let _ = create_container(&engine, &fake, "app").await;
    let why = last_probe(&engine).unwrap_err();
    assert!(why.contains("an address of the node itself"), "{why}");
    assert_node_untouched(&engine, &accepts, "isolated (handler nvidia)");
}

/// A network the operator allowed in `probe_allow` is probed from inside the pod's namespace,
/// with the pod's own address (what the pod itself could reach).
#[tokio::test]
async fn an_allowed_network_is_probed_from_inside_the_pods_namespace() {
    let netns = TestNetns::new("10.1.2.3".parse().unwrap());
    let fake = Fake::default();
    let engine = allowing(&fake, "192.0.2.0/24", |c| {
        c.ordering.probe_timeout = Duration::from_millis(50);
    });
    fake.script()
        .annotations
        .insert("crisp.dev/ready.proxy".into(), "tcp://192.0.2.1:1".into());
    fake.script().ip = Some("10.1.2.3".into());
    fake.script().info = Some(netns.runtime_info());
    fake.add("proxy", Some(now()));
    let _ = create_container(&engine, &fake, "app").await;
    assert_eq!(engine.metrics.bad_annotations.get(), 0);
    assert!(engine.metrics.probe_connects.get() > 0, "not probed");
    // Inside the pod's namespace (only loopback there, no route to 192.0.2.1).
    let why = last_probe(&engine).unwrap_err();
    assert!(why.contains("192.0.2.1:1"), "{why}");
}

/// Issue #44: `crisp pods`' reads of each pod's containers go through the node-wide
/// runtime-read limit. At 1 read a second (a burst of 1), five reads from an empty bucket take
/// about 5 s; on bde328c they all went to the runtime at once (elapsed 0).
#[tokio::test(start_paused = true)]
async fn crisp_pods_reads_take_the_node_wide_read_limit() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.runtime_reads_per_second = 1;
    });
    fake.add("proxy", Some(now()));
    let (v, _) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    let p = p.unwrap();
    // Empty the bucket, whatever the create's own reads left in it.
    let _ = engine
        .list_pod_containers(&p, tokio::time::Instant::now() + Duration::from_secs(2))
        .await;
    fake.script().lists = 0;
    let t0 = tokio::time::Instant::now();
    let until = t0 + Duration::from_secs(60);
    let reads = (0..5).map(|_| engine.list_pod_containers(&p, until));
    for r in futures_util::future::join_all(reads).await {
        r.unwrap();
    }
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(6),
        "{took:?}"
    );
    assert_eq!(fake.script().lists, 5);
    // A read that cannot have a turn before its end is refused, not queued.
    let why = engine
        .list_pod_containers(&p, tokio::time::Instant::now())
        .await
        .unwrap_err();
    assert!(why.contains("runtime-read limit"), "{why}");
}
