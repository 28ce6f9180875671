//! Issue #26 through the engine: a pod's hostile text reaches crisp's log and kubelet bounded.

use std::sync::Mutex;

use super::*;
use crate::tenant::{MAX_LOG_LINE, MAX_MESSAGE};

/// What the engine logs while `f` runs, one entry per line (no time, no colours).
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logged {
    type Writer = Logged;
    fn make_writer(&'a self) -> Logged {
        self.clone()
    }
}

impl Logged {
    fn start() -> (Logged, tracing::subscriber::DefaultGuard) {
        let logged = Logged::default();
        let sub = tracing_subscriber::fmt()
            .with_writer(logged.clone())
            .with_ansi(false)
            .without_time()
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        (logged.clone(), tracing::subscriber::set_default(sub))
    }

    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn thousands_of_bad_keys_are_one_bounded_log_line_and_all_counted() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", Some(now()));
    let mut a = fake.script().annotations.clone();
    for i in 0..3_000 {
        a.insert(
            format!("{}x{i}\u{1b}[31m", annotations::READY_PREFIX),
            format!("\u{1b}]0;owned\u{7}{}", "v".repeat(1_000)),
        );
    }
    let (logged, _guard) = Logged::start();
    for _ in 0..3 {
        let (v, held) = run(
            &engine,
            &call("CreateContainer", KUBELET_DEADLINE),
            &create_in("pod", "app", &a),
        )
        .await;
        assert_forwarded_at_once(&v, held);
    }
    let lines = logged.lines();
    let warnings: Vec<&String> = lines.iter().filter(|l| l.contains("WARN")).collect();
    assert_eq!(
        warnings.len(),
        1,
        "one line per pod: {} lines",
        warnings.len()
    );
    assert!(
        warnings[0].contains("3000 malformed annotations ignored"),
        "{}",
        warnings[0]
    );
    assert_eq!(engine.metrics.bad_annotations.get(), 3_000, "each counted");
    let longest = lines.iter().map(String::len).max().unwrap_or(0);
    assert!(longest <= MAX_LOG_LINE + 256, "a {longest}-byte log line");
    assert!(
        !lines.iter().any(|l| l.chars().any(char::is_control)),
        "escaped"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_names_a_hostile_pod_escaped_and_bounded() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let a = fake.script().annotations.clone();
    let pod = format!("\u{1b}[2J\u{1b}[31mpod\n{}", "p".repeat(5_000));
    let (logged, _guard) = Logged::start();
    let (v, _) = run(
        &engine,
        &call("CreateContainer", KUBELET_DEADLINE),
        &create_in(&pod, "app", &a),
    )
    .await;
    let m = refusal(&v).to_string();
    assert!(m.len() <= MAX_MESSAGE, "{} bytes: {m}", m.len());
    assert!(!m.chars().any(char::is_control), "{m}");
    assert!(m.contains(r"of pod ns/\u{1b}[2J\u{1b}[31mpod\nppp"), "{m}");
    assert!(
        m.ends_with(r#"retry "app" (network is not ready until the pod's sidecars run)"#),
        "{m}"
    );
    let lines = logged.lines();
    assert!(!lines.is_empty());
    for l in lines {
        assert!(
            l.len() <= MAX_LOG_LINE && !l.chars().any(char::is_control),
            "{l}"
        );
    }
}

/// A container name Kubernetes cannot produce (only another CRI client could send it): not
/// ordered, and logged escaped.
#[tokio::test(start_paused = true)]
async fn a_container_name_that_is_no_dns_label_is_forwarded_unordered_and_logged_escaped() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let a = fake.script().annotations.clone();
    let container = format!("app\u{1b}]0;owned\u{7}\r{}", "c".repeat(5_000));
    let (logged, _guard) = Logged::start();
    let (v, held) = run(
        &engine,
        &call("CreateContainer", KUBELET_DEADLINE),
        &create_in("pod", &container, &a),
    )
    .await;
    assert_forwarded_at_once(&v, held);
    let lines = logged.lines();
    assert!(
        lines.iter().any(|l| l.contains("not a DNS-1123 label")),
        "{lines:?}"
    );
    for l in lines {
        assert!(
            l.len() <= MAX_LOG_LINE && !l.chars().any(char::is_control),
            "{l}"
        );
    }
}

/// A pod with hundreds of app containers: a held sidecar stop names the first few and counts
/// the rest, in its hold (the tap, `crisp pods`, kubelet's events) and in crisp's log alike.
#[tokio::test(start_paused = true)]
async fn a_held_stop_names_a_few_of_many_running_apps_and_counts_the_rest() {
    let (fake, engine, t0) = fake_running_pod(&["proxy"]);
    for i in 0..300 {
        fake.add(&format!("{}-{i:03}", "a".repeat(59)), Some(t0));
    }
    let (logged, _guard) = Logged::start();
    let eng = engine.clone();
    let id = id_of(&fake, "proxy");
    let stopping = tokio::spawn(async move {
        run(
            &eng,
            &call("StopContainer", KUBELET_DEADLINE),
            &stop(&id, 30),
        )
        .await
    });
    tokio::time::sleep(S).await;
    let (pod, _) = engine.lookup(Some(SANDBOX), None);
    let held = pod.expect("pod").held_calls();
    assert_eq!(held.len(), 1, "the sidecar's stop is held");
    let reason = &held[0].waiting.reason;
    assert!(reason.ends_with(" and 293 more"), "301 apps run: {reason}");
    assert!(reason.len() <= 600, "a {}-byte reason", reason.len());
    for name in std::iter::once("app".to_string())
        .chain((0..300).map(|i| format!("{}-{i:03}", "a".repeat(59))))
    {
        fake.set(&name, |c| c.exited = Some(at(t0, 2 * S)));
    }
    let (v, held_for) = stopping.await.unwrap();
    assert_held(held_for, 2 * S, 100 * MS);
    assert_eq!(
        forwarded_timeout(&v, 30),
        28,
        "what is left of the pod's grace"
    );
    let longest = logged.lines().iter().map(String::len).max().unwrap_or(0);
    assert!(longest <= 1024, "a {longest}-byte log line");
}
