//! Issue #21 item 5: crisp's metrics as a fleet uses them. A real Prometheus (Debian's
//! `prometheus`, on loopback, scrape and rule evaluation every 1 s) scrapes crisp's
//! `admin.metrics_tcp` while the kubelet emulator runs pods through kubelet's grpc-go transport,
//! crisp and a real containerd; every assertion is a PromQL result read from Prometheus' HTTP
//! API. The shipped alert rules (deploy/monitoring/crisp-alerts.yaml) are loaded into it, and
//! every metric name the rules and the Grafana dashboard use must be one Prometheus scraped
//! (and every counter a rule watches, served at 0 before its first event).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use crisp::metrics::HOLD_BUCKETS;
use crisp_e2e::emulator::PodSpec;
use crisp_e2e::stack::{Stack, StackOpts};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const STEP: Duration = Duration::from_secs(60);
/// How long the test keeps the app's CreateContainer held.
const HOLD: Duration = Duration::from_millis(3500);
/// Counters with a series per label value (method, code), which appear with their first call:
/// the rules use them only in ratios of rates, never alone in `increase()`.
const LABELLED_COUNTERS: [&str; 1] = ["crisp_cri_calls_total"];

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/monitoring")
        .join(file)
}

fn free_addr() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

/// A Prometheus server of its own: loopback only, a temporary TSDB, crisp as its one target.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr, rules: &Path) -> Result<Prometheus> {
        let dir = tempfile::Builder::new()
            .prefix("crisp-prometheus-")
            .tempdir()?;
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nrule_files:\n  - {rules:?}\nscrape_configs:\n  - job_name: crisp\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )?;
        let addr = free_addr()?;
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting prometheus (Debian's `prometheus`; hack/setup.sh installs it)")?;
        Ok(Prometheus { child, addr, dir })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET target` (HTTP/1.0: the body ends with the connection, never chunked).
    async fn get(&self, target: &str) -> Result<(u16, String)> {
        let mut s = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(self.addr),
        )
        .await??;
        s.write_all(format!("GET {target} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).as_bytes())
            .await?;
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await??;
        let text = String::from_utf8_lossy(&buf);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .context("no end of HTTP headers")?;
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .context("no HTTP status")?;
        Ok((code, body.to_string()))
    }

    /// An API call's `data`; an error if Prometheus did not answer `success`.
    async fn api(&self, target: &str) -> Result<Value> {
        let (code, body) = self.get(target).await?;
        let v: Value =
            serde_json::from_str(&body).with_context(|| format!("HTTP {code}: {body}"))?;
        ensure!(v["status"] == "success", "{target}: HTTP {code}: {body}");
        Ok(v["data"].clone())
    }

    /// An instant query: each sample's labels and value.
    async fn query(&self, promql: &str) -> Result<Vec<(Value, f64)>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(promql)))
            .await?;
        let mut out = Vec::new();
        for s in data["result"].as_array().cloned().unwrap_or_default() {
            let v = s["value"][1]
                .as_str()
                .and_then(|t| t.parse::<f64>().ok())
                .context("sample value")?;
            out.push((s["metric"].clone(), v));
        }
        Ok(out)
    }

    /// Polls `promql` until its first sample satisfies `ok`; returns that value.
    async fn await_value(
        &self,
        promql: &str,
        timeout: Duration,
        ok: impl Fn(f64) -> bool,
    ) -> Result<f64> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.query(promql).await;
            if let Ok(samples) = &last {
                if let Some((_, v)) = samples.first().filter(|(_, v)| ok(*v)) {
                    return Ok(*v);
                }
            }
            if Instant::now() > deadline {
                bail!("{promql}: no satisfying value within {timeout:?}; last answer {last:?}\n--- prometheus log ---\n{}", self.log_text());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn await_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !matches!(self.get("/-/ready").await, Ok((200, _))) {
            if Instant::now() > deadline {
                bail!(
                    "prometheus not ready within {timeout:?}:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", self.log_text());
        }
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The `crisp_*` metric names in a text (PromQL in rules or a dashboard).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crisp_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // Not a longer identifier that merely contains "crisp_".
        let standalone = rest[..i]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if standalone {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// Every panel's PromQL, with the dashboard's variables given values Prometheus accepts.
fn dashboard_queries() -> Result<Vec<(String, String)>> {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(monitoring(
        "crisp-dashboard.json",
    ))?)?;
    let mut out = Vec::new();
    for p in d["panels"].as_array().context("panels")? {
        for t in p["targets"].as_array().context("targets")? {
            let expr = t["expr"].as_str().context("expr")?;
            out.push((
                p["title"].as_str().unwrap_or("?").to_string(),
                expr.replace("$instance", ".*")
                    .replace("$__rate_interval", "1m"),
            ));
        }
    }
    Ok(out)
}

fn pod(yaml: &str) -> PodSpec {
    PodSpec::from_yaml(yaml).expect("test pod YAML").remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_reads_calls_holds_and_bad_annotations() -> Result<()> {
    let metrics = free_addr()?;
    let opts = StackOpts {
        crisp_config: format!("[admin]\nmetrics_tcp = \"{metrics}\"\n"),
        via_grpcgo: true,
        ..Default::default()
    };
    let mut st = Stack::start_with(opts, |_| {}).await?;
    ensure!(
        !st.bridges.is_empty(),
        "the emulator reaches crisp through grpc-go"
    );
    let prom = Prometheus::start(metrics, &monitoring("crisp-alerts.yaml"))?;
    prom.await_ready(Duration::from_secs(30)).await?;
    prom.await_value("up{job=\"crisp\"}", Duration::from_secs(30), |v| v == 1.0)
        .await
        .context("crisp's metrics_tcp scraped")?;

    // Before anything happened: every counter a rule watches is served at 0 already. A counter
    // that appeared only with its first event would start at 1, and `increase()`/`rate()` see
    // no rise in a series' first sample: the alert would miss the first failure.
    let rules_text = std::fs::read_to_string(monitoring("crisp-alerts.yaml"))?;
    let watched: Vec<String> = metric_names(&rules_text)
        .into_iter()
        .filter(|n| n.ends_with("_total") && !LABELLED_COUNTERS.contains(&n.as_str()))
        .collect();
    ensure!(
        watched
            .iter()
            .any(|n| n == "crisp_probe_netns_failures_total"),
        "{watched:?}"
    );
    for name in &watched {
        let samples = prom.query(name).await?;
        // One series, or one per label value crisp creates up front (`what` of
        // crisp_state_write_errors_total): each at 0.
        ensure!(
            !samples.is_empty() && samples.iter().all(|s| s.1 == 0.0),
            "{name} before any event: {samples:?} (expected its series at 0)"
        );
    }

    // A sidecar that is ready once the test listens on its port (hostNetwork: crisp probes
    // loopback), listed first: the app's CreateContainer is held until then.
    let port = free_addr()?.port();
    let yaml = format!(
        "name: held\nhostNetwork: true\nterminationGracePeriodSeconds: 5\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: \"tcp://:{port}\"\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n  - name: app\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n"
    );
    let uid = st.kubelet.add_pod(pod(&yaml))?;
    let journal = st.kubelet.journal();
    let held_since = {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(c) = journal
                .container_calls("CreateContainer", "app")
                .into_iter()
                .find(|c| !c.is_done())
            {
                break Instant::from_std(c.sent);
            }
            if Instant::now() > deadline {
                st.dump(&uid);
                bail!("the app's CreateContainer was never in flight");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // Holds in flight, while one is held.
    let in_flight = prom
        .await_value("crisp_holds_in_flight", Duration::from_secs(20), |v| {
            v >= 1.0
        })
        .await?;
    ensure!(
        journal
            .container_calls("CreateContainer", "app")
            .iter()
            .all(|c| !c.is_done()),
        "the hold ended before Prometheus saw it"
    );
    eprintln!("crisp_holds_in_flight = {in_flight} while the app is held");
    // The hold lasts HOLD (a chosen length, so that its bucket is known), then the sidecar
    // becomes ready.
    tokio::time::sleep_until(held_since + HOLD).await;
    let _ready = std::net::TcpListener::bind(("127.0.0.1", port))?;
    st.wait_all_running(&uid, STEP).await?;
    let create = journal
        .container_calls("CreateContainer", "app")
        .into_iter()
        .find(|c| c.is_ok())
        .context("the app's CreateContainer")?;
    let held = create.elapsed().as_secs_f64();

    // Call rate per method.
    let rates = prom
        .query("sum by (method) (rate(crisp_cri_calls_total[1m]))")
        .await?;
    eprintln!(
        "call rates: {:?}",
        rates
            .iter()
            .map(|(m, v)| format!("{}={v:.3}", m["method"].as_str().unwrap_or("?")))
            .collect::<Vec<_>>()
    );
    let create_rate = prom
        .await_value(
            "sum(rate(crisp_cri_calls_total{method=\"CreateContainer\"}[1m]))",
            Duration::from_secs(20),
            |v| v > 0.0,
        )
        .await?;
    eprintln!("CreateContainer rate {create_rate:.4}/s");

    // The hold-time quantile: one start hold of `held` s lies in the bucket (lo, hi] around it,
    // and histogram_quantile interpolates inside that bucket.
    let hi = HOLD_BUCKETS
        .iter()
        .copied()
        .find(|b| *b >= held)
        .context("hold above the last bucket")?;
    let lo = HOLD_BUCKETS
        .iter()
        .copied()
        .rev()
        .find(|b| *b < held)
        .unwrap_or(0.0);
    let q = "histogram_quantile(0.9, sum by (le) (increase(crisp_hold_seconds_bucket{gate=\"start\"}[2m])))";
    let p90 = prom
        .await_value(q, Duration::from_secs(20), |v| v.is_finite() && v > 0.0)
        .await?;
    eprintln!("app held {held:.3} s (kubelet's view); p90 start hold from Prometheus {p90:.3} s, bucket ({lo}, {hi}]");
    ensure!(
        (lo..=hi).contains(&p90),
        "p90 hold {p90} outside ({lo}, {hi}] around the {held:.3} s hold"
    );
    ensure!(
        held >= HOLD.as_secs_f64() - 0.1,
        "the app was held only {held:.3} s"
    );
    // The sidecar's tcp:// probe connected (every round of the hold, and once more when it was
    // ready), and no node-wide bound held a probe back.
    let connects = prom
        .await_value(
            "sum(crisp_probe_connects_total)",
            Duration::from_secs(20),
            |v| v >= 2.0,
        )
        .await?;
    let limited = prom
        .query("sum(crisp_probe_limited_total)")
        .await?
        .first()
        .map_or(f64::NAN, |s| s.1);
    eprintln!("crisp_probe_connects_total {connects}, crisp_probe_limited_total {limited}");
    ensure!(
        limited == 0.0,
        "probes held back by a bound on an idle node: {limited}"
    );

    // A malformed annotation is counted, and the shipped alert fires on it.
    let before = prom
        .query("sum(crisp_bad_annotations_total)")
        .await?
        .first()
        .map_or(0.0, |s| s.1);
    let bad = "name: bad\nhostNetwork: true\nterminationGracePeriodSeconds: 5\nannotations:\n  crisp.dev/start-timeout: soon\ncontainers:\n  - name: app\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n";
    let bad_uid = st.kubelet.add_pod(pod(bad))?;
    st.wait_all_running(&bad_uid, STEP).await?;
    let after = prom
        .await_value(
            "sum(crisp_bad_annotations_total)",
            Duration::from_secs(20),
            |v| v > before,
        )
        .await?;
    eprintln!("crisp_bad_annotations_total {before} -> {after}");
    prom.await_value(
        "ALERTS{alertname=\"CrispBadAnnotations\",alertstate=\"firing\"}",
        Duration::from_secs(20),
        |v| v == 1.0,
    )
    .await?;
    let firing = prom.query("ALERTS{alertstate=\"firing\"}").await?;
    let names: Vec<&str> = firing
        .iter()
        .filter_map(|(m, _)| m["alertname"].as_str())
        .collect();
    ensure!(
        names == ["CrispBadAnnotations"],
        "alerts firing on a healthy node: {names:?}"
    );

    // Every rule evaluates without error against real data.
    let rules = prom.api("/api/v1/rules").await?;
    let mut count = 0;
    for g in rules["groups"].as_array().context("groups")? {
        for r in g["rules"].as_array().context("rules")? {
            count += 1;
            ensure!(
                r["health"] == "ok",
                "rule {} unhealthy: {}",
                r["name"],
                r["lastError"]
            );
        }
    }
    // As many as deploy/monitoring/crisp-alerts.yaml has (9 since CrispStalled and CrispPanics).
    let shipped = include_str!("../../../deploy/monitoring/crisp-alerts.yaml")
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    ensure!(
        count == shipped,
        "{count} rules loaded, {shipped} in the file"
    );

    // The rules and the dashboard name only metrics crisp serves, and every panel's query runs.
    let scraped: BTreeSet<String> = prom
        .api("/api/v1/label/__name__/values")
        .await?
        .as_array()
        .context("names")?
        .iter()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    let dash_text = std::fs::read_to_string(monitoring("crisp-dashboard.json"))?;
    let used: BTreeSet<String> = metric_names(&rules_text)
        .into_iter()
        .chain(metric_names(&dash_text))
        .collect();
    let unknown: Vec<&String> = used.difference(&scraped).collect();
    ensure!(
        unknown.is_empty(),
        "names crisp does not serve: {unknown:?}\nscraped: {scraped:?}"
    );
    ensure!(
        used.len() >= 20,
        "only {} names found in the rules and dashboard: {used:?}",
        used.len()
    );
    for (title, expr) in dashboard_queries()? {
        prom.query(&expr)
            .await
            .with_context(|| format!("panel {title:?}: {expr}"))?;
    }

    // The runtime dies: crisp ends kubelet's calls UNAVAILABLE, and the shipped rule sees it
    // (pending: it fires only after 2 minutes of this).
    st.containerd.kill_hard()?;
    let t = Instant::now();
    prom.await_value(
        "ALERTS{alertname=\"CrispRuntimeUnreachable\",alertstate=\"pending\"}",
        STEP,
        |v| v == 1.0,
    )
    .await?;
    eprintln!(
        "CrispRuntimeUnreachable pending {:.1} s after containerd died",
        t.elapsed().as_secs_f64()
    );
    st.containerd.restart()?;
    Ok(())
}

#[test]
fn metric_names_are_found_whole() {
    let names = metric_names("sum(rate(crisp_cri_calls_total{x=\"y\"}[1m])) / my_crisp_thing + crisp_hold_seconds_bucket");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["crisp_cri_calls_total", "crisp_hold_seconds_bucket"]
    );
    assert_eq!(encode("a b{c=\"d\"}"), "a%20b%7Bc%3D%22d%22%7D");
}
