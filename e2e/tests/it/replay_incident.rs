//! Issue #46, record and replay, on a recorded incident (a refusal): the README demo's pod
//! (e2e/pods/demo.yaml) runs through crisp on a real containerd while `crisp tap --full -o`
//! records it; crisp refuses the app's first CreateContainer (its sidecar is not ready) and holds
//! the next one. `crisp replay` then plays that recording straight against the same containerd,
//! where nothing holds or refuses: the report must show every call replayed, the refusal and the
//! hold as differences, the sandbox and container ids rewritten, and what it created removed.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use crisp_e2e::crisp::crisp_binary;
use serde_json::Value;

use super::timeline_demo::{demo_stack, record, run_demo_pod};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_a_refusal_against_containerd_reports_it_gone() -> Result<()> {
    let st = demo_stack().await?;
    let dir = tempfile::Builder::new().prefix("crisp-replay-").tempdir()?;
    let recording = dir.path().join("calls.jsonl");
    let tap = record(&st, &recording, true).await?;
    run_demo_pod(&st, &recording, tap).await?;
    let text = std::fs::read_to_string(&recording)?;
    let recorded: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mutating = recorded
        .iter()
        .filter(|v| v["kind"] == "mutating" && v["pod_name"] == "web")
        .count();
    let refusal_line = recorded
        .iter()
        .find(|v| v["method"] == "CreateContainer" && v["code_name"] == "FailedPrecondition")
        .context("the recording has crisp's refusal")?;
    ensure!(
        refusal_line["request"]["config"]["metadata"]["name"] == "app",
        "the refusal is recorded with the request kubelet sent: {refusal_line}"
    );

    // crisp's own upstream is refused without --yes: the node's kubelet would see the pod.
    let crisp_config = st.crisp.dir().join("config.toml");
    let refused = Command::new(crisp_binary()?)
        .arg("replay")
        .arg(&recording)
        .arg("--runtime")
        .arg(st.containerd.socket())
        .arg("--config")
        .arg(&crisp_config)
        .output()?;
    ensure!(
        refused.status.code() == Some(64)
            && String::from_utf8_lossy(&refused.stderr).contains("--yes"),
        "the node's runtime refused: {:?} {}",
        refused.status,
        String::from_utf8_lossy(&refused.stderr)
    );

    let (file, runtime) = (recording.clone(), st.containerd.socket().to_path_buf());
    let replay = move |args: &[&str]| -> Result<std::process::Output> {
        Ok(Command::new(crisp_binary()?)
            .arg("replay")
            .arg(&file)
            .args(["--pod", "demo/web", "--yes", "--runtime"])
            .arg(&runtime)
            .args(args)
            .output()?)
    };
    let with_json = replay.clone();
    let out = tokio::task::spawn_blocking(move || with_json(&["--speed", "2", "--json"])).await??;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{stderr}");
    ensure!(
        out.status.code() == Some(1),
        "differences exit 1: {:?}",
        out.status
    );
    let report: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stdout).into_owned())?;
    eprintln!("{}", serde_json::to_string_pretty(&report)?);
    let calls = report["calls"].as_array().context("calls")?;
    ensure!(
        calls.len() == mutating,
        "every mutating call of demo/web planned: {} of {mutating}",
        calls.len()
    );
    ensure!(
        report["summary"]["not_sent"] == 0 && report["summary"]["replayed"] == mutating,
        "every call replayed: {}",
        report["summary"]
    );
    let of = |method: &str, target: &str| -> Vec<&Value> {
        calls
            .iter()
            .filter(|c| c["method"] == method && c["target"] == target)
            .collect()
    };
    let kinds = |c: &Value| -> Vec<String> {
        c["differences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["kind"].as_str().map(str::to_string))
            .collect()
    };
    let creates = of("CreateContainer", "app");
    let refusal = creates
        .iter()
        .find(|c| c["recorded"]["code_name"] == "FailedPrecondition")
        .context("the refused CreateContainer")?;
    ensure!(
        refusal["now"]["code_name"] == "OK" && kinds(refusal).contains(&"status".to_string()),
        "the refusal is gone against containerd: {refusal}"
    );
    let held = creates
        .iter()
        .find(|c| c["recorded"]["held_ms"].as_f64().unwrap_or(0.0) > 1000.0)
        .context("the held CreateContainer")?;
    ensure!(
        kinds(held).contains(&"duration".to_string()),
        "the hold is gone: {held}"
    );
    // Ids: the sandbox and the containers are new; later calls carry the new ones.
    let run = of("RunPodSandbox", "pod");
    ensure!(run.len() == 1 && run[0]["now"]["code_name"] == "OK");
    let ids = report["ids"].as_array().context("ids")?;
    let recorded_sandbox = recorded
        .iter()
        .find(|v| v["method"] == "RunPodSandbox" && v["pod_name"] == "web")
        .and_then(|v| v["pod_sandbox_id"].as_str())
        .context("recorded sandbox")?;
    ensure!(
        ids.iter()
            .any(|p| p["recorded"] == recorded_sandbox && p["now"] != recorded_sandbox),
        "the sandbox id rewritten: {ids:?}"
    );
    for start in of("StartContainer", "app")
        .into_iter()
        .chain(of("StartContainer", "proxy"))
    {
        ensure!(
            start["now"]["code_name"] == "OK"
                && !start["ids_rewritten"]
                    .as_array()
                    .is_none_or(|a| a.is_empty()),
            "started with a rewritten id: {start}"
        );
    }
    ensure!(
        calls
            .iter()
            .any(|c| c["redacted"].as_array().is_some_and(|r| r
                .iter()
                .any(|x| x.as_str().is_some_and(|s| s.contains("command"))))),
        "the redacted command lines are reported"
    );
    // What the replay created is gone.
    let cleanup = report["cleanup"].as_array().context("cleanup")?;
    ensure!(
        cleanup.len() == 1 && cleanup[0]["result"] == "stopped and removed",
        "{cleanup:?}"
    );
    let mut rt = st.direct().await?;
    let left = rt
        .list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest::default())
        .await?
        .into_inner()
        .items;
    ensure!(
        !left.iter().any(|s| s
            .metadata
            .as_ref()
            .is_some_and(|m| m.uid.contains("-replay-"))),
        "a replayed sandbox was left"
    );

    // The readable report says the same.
    let readable = replay.clone();
    let out = tokio::task::spawn_blocking(move || readable(&["--speed", "2"])).await??;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{text}");
    ensure!(
        text.contains("status FailedPrecondition") && text.contains("ids rewritten"),
        "{text}"
    );

    // As fast as possible: each call once what answered before it in the recording has.
    let out =
        tokio::task::spawn_blocking(move || replay(&["--as-fast-as-possible", "--json"])).await??;
    let fast: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stdout).into_owned())?;
    ensure!(
        fast["summary"]["not_sent"] == 0 && fast["summary"]["replayed"] == mutating,
        "as fast as possible, every call replayed: {}",
        fast["summary"]
    );
    ensure!(
        fast["calls"].as_array().is_some_and(|c| c
            .iter()
            .any(|c| c["recorded"]["code_name"] == "FailedPrecondition"
                && c["now"]["code_name"] == "OK")),
        "the refusal is gone as fast as possible too"
    );
    Ok(())
}
