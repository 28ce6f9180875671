//! Secrets never leave crisp: the real `crisp` binary runs at log level trace, two `crisp tap
//! --full` clients watch (JSON lines with a file sink, and the readable view), and a kubelet
//! pulls an image with registry credentials and creates a container with a secret env value —
//! over v1 and v1alpha2, plus a verbose ContainerStatus, an ExecSync whose output is secret, a
//! request carrying a field no CRI version has, and a pod whose last-applied-configuration
//! annotation holds an env value. No secret appears in the tap output, the file or
//! crisp's log; the env keys and everything else do.
//!
//! Issue #26: the messages are built as kubelet 1.26 sends them — RunPodSandbox with the pod's
//! annotations, the pod's annotations copied into the ImageSpec of ImageStatus and PullImage
//! (last-applied-configuration with an env value among them), CreateContainer with `$(SECRET)`
//! already expanded in `command` and `args`, an ExecSync whose `cmd` holds a secret.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1alpha2 as alpha;
use prost::Message;
use serde_json::Value;

use crate::support::*;

const SECRETS: &[&str] = &[
    "S3cret-registry-password",
    "S3cret-basic-auth",
    "S3cret-identity-token",
    "S3cret-registry-token",
    "S3cret-env-value",
    "S3cret-alpha-password",
    "S3cret-in-container-info",
    "S3cret-exec-stdout",
    "S3cret-in-an-unknown-field",
    "S3cret-in-last-applied",
    "S3cret-in-image-spec",
    "S3cret-in-a-pod-annotation",
    "S3cret-expanded-in-args",
    "S3cret-expanded-in-command",
    "S3cret-in-an-exec-cmd",
];

const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
const CALLS: u64 = 7;

fn crisp_bin() -> &'static str {
    env!("CARGO_BIN_EXE_crisp")
}

struct Proc {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    fn spawn(dir: &Path, name: &str, cmd: &mut Command) -> Proc {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Proc {
            child,
            stdout,
            stderr,
        }
    }

    fn out(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    fn err(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    async fn wait_stderr(&self, needle: &str) {
        within(PATIENCE, &format!("{needle:?} on stderr"), async {
            while !self.err().contains(needle) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if std::time::Instant::now() > deadline {
                let (out, err) = (self.out(), self.err());
                let tail = |s: &str| {
                    s.chars()
                        .rev()
                        .take(4000)
                        .collect::<String>()
                        .chars()
                        .rev()
                        .collect::<String>()
                };
                panic!(
                    "{} did not exit within {PATIENCE:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.stdout.display(),
                    tail(&out),
                    tail(&err)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn auth(password: &str) -> cri::AuthConfig {
    cri::AuthConfig {
        username: "robot".into(),
        password: password.into(),
        auth: "S3cret-basic-auth".into(),
        server_address: "registry.example".into(),
        identity_token: "S3cret-identity-token".into(),
        registry_token: "S3cret-registry-token".into(),
    }
}

fn script(fake: &Fake) {
    fake.script("/runtime.v1.ImageService/PullImage", |_| {
        Reply::unary(
            &cri::PullImageResponse {
                image_ref: "sha256:1111".into(),
            }
            .encode_to_vec(),
        )
    });
    fake.script("/runtime.v1alpha2.ImageService/PullImage", |_| {
        Reply::unary(
            &cri::PullImageResponse {
                image_ref: "sha256:2222".into(),
            }
            .encode_to_vec(),
        )
    });
    fake.script("/runtime.v1.RuntimeService/RunPodSandbox", |_| {
        Reply::unary(
            &cri::RunPodSandboxResponse {
                pod_sandbox_id: "sb-1".into(),
            }
            .encode_to_vec(),
        )
    });
    fake.script("/runtime.v1.ImageService/ImageStatus", |_| {
        Reply::unary(&cri::ImageStatusResponse::default().encode_to_vec())
    });
    fake.script(CREATE, |_| {
        Reply::unary(
            &cri::CreateContainerResponse {
                container_id: "ctr-1".into(),
            }
            .encode_to_vec(),
        )
    });
    fake.script("/runtime.v1.RuntimeService/ContainerStatus", |_| {
        let st = cri::ContainerStatus {
            id: "ctr-1".into(),
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        let info = [(
            "info".to_string(),
            r#"{"runtimeSpec":{"process":{"env":["DB_PASSWORD=S3cret-in-container-info"]}}}"#
                .to_string(),
        )]
        .into();
        Reply::unary(
            &cri::ContainerStatusResponse {
                status: Some(st),
                info,
            }
            .encode_to_vec(),
        )
    });
    fake.script("/runtime.v1.RuntimeService/ExecSync", |_| {
        Reply::unary(
            &cri::ExecSyncResponse {
                stdout: b"S3cret-exec-stdout\n".to_vec(),
                stderr: Vec::new(),
                exit_code: 0,
            }
            .encode_to_vec(),
        )
    });
}

async fn kubelet(sock: &Path) {
    let ch = channel(sock).await;
    // A pod created with `kubectl apply`: its last-applied-configuration annotation holds the
    // pod as applied, env values included, and kubelet passes every pod annotation on.
    let applied = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"app","env":[{"name":"DB_PASSWORD","value":"S3cret-in-last-applied"}]}]}}"#;
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "web".into(),
            namespace: "shop".into(),
            uid: "u1".into(),
            attempt: 0,
        }),
        annotations: [
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                applied.to_string(),
            ),
            ("team".to_string(), "checkout".to_string()),
            (
                "example.com/webhook-token".to_string(),
                "S3cret-in-a-pod-annotation".to_string(),
            ),
            // kubelet's own bookkeeping annotation: no secret, shown.
            (
                "kubernetes.io/config.seen".to_string(),
                "2026-11-26T22:00:00.123456789Z".to_string(),
            ),
        ]
        .into(),
        ..Default::default()
    };
    let mut rt = cri::runtime_service_client::RuntimeServiceClient::new(ch.clone());
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(sandbox.clone()),
        runtime_handler: String::new(),
    })
    .await
    .unwrap();
    // kubelet 1.26 copies every pod annotation into the ImageSpec of ImageStatus and PullImage.
    let mut image_annotations = sandbox.annotations.clone();
    image_annotations.insert(
        "kubectl.kubernetes.io/last-applied-configuration".into(),
        r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"env":[{"name":"API_KEY","value":"S3cret-in-image-spec"}]}]}}"#.into(),
    );
    let image = Some(cri::ImageSpec {
        image: "registry.example/shop/web:1.0".into(),
        annotations: image_annotations,
        ..Default::default()
    });
    let mut images = cri::image_service_client::ImageServiceClient::new(ch.clone());
    images
        .image_status(cri::ImageStatusRequest {
            image: image.clone(),
            verbose: false,
        })
        .await
        .unwrap();
    images
        .pull_image(cri::PullImageRequest {
            image: image.clone(),
            auth: Some(auth("S3cret-registry-password")),
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .unwrap();
    // v1alpha2 kubelets (1.20–1.25) send the same thing on another path.
    let mut alpha_images = alpha::image_service_client::ImageServiceClient::new(ch.clone());
    alpha_images
        .pull_image(alpha::PullImageRequest {
            image: Some(alpha::ImageSpec {
                image: "registry.example/shop/old:0.9".into(),
                ..Default::default()
            }),
            auth: Some(alpha::AuthConfig {
                username: "robot".into(),
                password: "S3cret-alpha-password".into(),
                ..Default::default()
            }),
            sandbox_config: None,
        })
        .await
        .unwrap();
    // CreateContainer with a secret env value — and a field no CRI version has (999) that
    // carries a secret too: sent raw, since typed clients cannot.
    let create = cri::CreateContainerRequest {
        pod_sandbox_id: "sb-1".into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            image,
            // kubelet expands `$(TOKEN)` and `$(PASSWORD)` with the env values before sending.
            command: vec![
                "/bin/web".into(),
                "--token=S3cret-expanded-in-command".into(),
            ],
            args: vec!["--password".into(), "S3cret-expanded-in-args".into()],
            envs: vec![
                cri::KeyValue {
                    key: "DB_PASSWORD".into(),
                    value: "S3cret-env-value".into(),
                },
                cri::KeyValue {
                    key: "LOG_LEVEL".into(),
                    value: "debug".into(),
                },
            ],
            ..Default::default()
        }),
        sandbox_config: Some(sandbox),
    };
    let mut msg = create.encode_to_vec();
    pb_bytes(&mut msg, 999, b"S3cret-in-an-unknown-field");
    let resp = Raw::connect(sock)
        .await
        .call(&RawRequest::grpc(CREATE, &msg))
        .await
        .unwrap();
    assert_eq!(resp.grpc_status(), Some("0"));
    rt.container_status(cri::ContainerStatusRequest {
        container_id: "ctr-1".into(),
        verbose: true,
    })
    .await
    .unwrap();
    rt.exec_sync(cri::ExecSyncRequest {
        container_id: "ctr-1".into(),
        cmd: vec![
            "sh".into(),
            "-c".into(),
            "test \"$TOKEN\" = S3cret-in-an-exec-cmd".into(),
        ],
        timeout: 1,
    })
    .await
    .unwrap();
}

fn assert_no_secrets(what: &str, text: &str) {
    for s in SECRETS {
        assert!(
            !text.contains(s),
            "{what} contains the secret {s:?}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_appear_nowhere_while_everything_else_does() {
    let fake = Fake::start().await;
    script(&fake);
    let dir = tempfile::Builder::new()
        .prefix("crisp-tap-redact")
        .tempdir()
        .unwrap();
    let sock = dir.path().join("crisp.sock");
    let admin = dir.path().join("admin.sock");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "listen = {:?}\nupstream = {:?}\nstate_dir = {:?}\n[log]\nlevel = \"trace\"\n",
            sock,
            fake.path(),
            dir.path().join("state")
        ),
    )
    .unwrap();

    let mut daemon = Proc::spawn(
        dir.path(),
        "crisp",
        Command::new(crisp_bin())
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "trace"),
    );
    within(PATIENCE, "crisp's sockets", async {
        while std::os::unix::net::UnixStream::connect(&sock).is_err()
            || std::os::unix::net::UnixStream::connect(&admin).is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    let file = dir.path().join("recorded.jsonl");
    let count = CALLS.to_string();
    let mut json_tap = Proc::spawn(
        dir.path(),
        "tap-json",
        Command::new(crisp_bin())
            .args([
                "tap",
                "--full",
                "--json",
                "--all",
                "--count",
                &count,
                "--admin-socket",
            ])
            .arg(&admin)
            .arg("--output")
            .arg(&file),
    );
    let mut text_tap = Proc::spawn(
        dir.path(),
        "tap-text",
        Command::new(crisp_bin())
            .args([
                "tap",
                "--full",
                "--all",
                "--count",
                &count,
                "--admin-socket",
            ])
            .arg(&admin),
    );
    json_tap.wait_stderr("attached").await;
    text_tap.wait_stderr("attached").await;

    kubelet(&sock).await;
    assert!(json_tap.wait_exit().await.success(), "{}", json_tap.err());
    assert!(text_tap.wait_exit().await.success(), "{}", text_tap.err());
    // Stop crisp so its log is complete.
    let pid = daemon.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(daemon.wait_exit().await.success(), "{}", daemon.err());

    let json_out = json_tap.out();
    let recorded = std::fs::read_to_string(&file).unwrap();
    let text_out = text_tap.out();
    let log = daemon.err();
    // The log really is at trace level and really shows the messages (redacted).
    assert!(log.contains("TRACE"), "crisp did not log at trace level");
    assert!(
        log.contains("crisp::tap::messages") && log.contains("DB_PASSWORD"),
        "crisp's trace log has no message lines"
    );

    assert_no_secrets("crisp tap --json", &json_out);
    assert_no_secrets("crisp tap --output file", &recorded);
    assert_no_secrets("crisp tap (readable)", &text_out);
    assert_no_secrets("crisp's trace log", &log);
    // The runtime did get the request secrets (the responses carry the others): the test is not
    // vacuous.
    let upstream: Vec<u8> = fake.calls().iter().flat_map(|c| c.body.to_vec()).collect();
    for s in SECRETS
        .iter()
        .filter(|s| !s.contains("info") && !s.contains("stdout"))
    {
        assert!(
            upstream.windows(s.len()).any(|w| w == s.as_bytes()),
            "{s} never reached the runtime"
        );
    }

    // JSON lines parse, the file holds the same events, and everything but the secrets is there.
    let lines: Vec<Value> = json_out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let file_lines: Vec<Value> = recorded
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, file_lines);
    // `--output` opens with the runtime's snapshot (issue #46): crisp's own four calls, which
    // `--count` does not count, checked for secrets with the rest above.
    let snapshot = lines.iter().filter(|l| l["snapshot"] == true).count();
    assert_eq!(snapshot, 4, "{json_out}");
    assert_eq!(lines.len(), CALLS as usize + snapshot);
    let by = |m: &str, v: &str| {
        lines
            .iter()
            .find(|l| l["method"] == m && l["cri_version"] == v)
            .unwrap_or_else(|| panic!("no {v} {m} event in {json_out}"))
            .clone()
    };

    let pull = by("PullImage", "v1");
    assert_eq!(pull["request"]["auth"], "<redacted>");
    assert_eq!(
        pull["request"]["image"]["image"],
        "registry.example/shop/web:1.0"
    );
    assert_eq!(pull["response"]["image_ref"], "sha256:1111");
    assert_eq!(
        (pull["pod_namespace"].as_str(), pull["pod_name"].as_str()),
        (Some("shop"), Some("web"))
    );

    let alpha_pull = by("PullImage", "v1alpha2");
    assert_eq!(
        alpha_pull["path"],
        "/runtime.v1alpha2.ImageService/PullImage"
    );
    assert_eq!(alpha_pull["request"]["auth"], "<redacted>");
    assert_eq!(
        alpha_pull["request"]["image"]["image"],
        "registry.example/shop/old:0.9"
    );

    let create = by("CreateContainer", "v1");
    let envs = &create["request"]["config"]["envs"];
    assert_eq!(envs[0]["key"], "DB_PASSWORD");
    assert_eq!(envs[0]["value"], "<redacted>");
    assert_eq!(envs[1]["key"], "LOG_LEVEL");
    assert_eq!(envs[1]["value"], "<redacted>");
    assert_eq!(create["request"]["config"]["metadata"]["name"], "app");
    let annotations = &create["request"]["sandbox_config"]["annotations"];
    assert!(
        annotations["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .unwrap()
            .starts_with("<redacted: "),
        "{annotations}"
    );
    // Values of annotations crisp does not know are shown as their size; kubelet's bookkeeping as it is.
    assert_eq!(annotations["team"], "<redacted: 8 bytes>");
    assert_eq!(
        annotations["kubernetes.io/config.seen"],
        "2026-11-26T22:00:00.123456789Z"
    );
    let config = &create["request"]["config"];
    assert_eq!(
        (config["command"].as_str(), config["args"].as_str()),
        (
            Some("<redacted: 2 items, 42 bytes>"),
            Some("<redacted: 2 items, 33 bytes>")
        )
    );
    assert!(
        config["image"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .unwrap()
            .starts_with("<redacted: ")
    );
    assert_eq!(config["image"]["image"], "registry.example/shop/web:1.0");
    let sandbox = by("RunPodSandbox", "v1");
    assert_eq!(sandbox["request"]["config"]["metadata"]["name"], "web");
    assert_eq!(
        sandbox["request"]["config"]["annotations"]["kubernetes.io/config.seen"],
        "2026-11-26T22:00:00.123456789Z"
    );
    let image_status = by("ImageStatus", "v1");
    assert_eq!(
        image_status["request"]["image"]["image"],
        "registry.example/shop/web:1.0"
    );
    assert_eq!(
        image_status["request"]["image"]["annotations"]["team"],
        "<redacted: 8 bytes>"
    );
    assert_eq!(create["container_id"], "ctr-1");
    assert_eq!(create["container_name"], "app");
    // The unknown field is shown — number, wire type, size — not its content.
    assert_eq!(
        create["request"]["_unknown_fields"][0],
        serde_json::json!({"field": 999, "wire_type": "len", "bytes": 26})
    );

    let status = by("ContainerStatus", "v1");
    assert_eq!(status["response"]["status"]["id"], "ctr-1");
    assert!(status["response"]["info"]["info"]
        .as_str()
        .unwrap()
        .starts_with("<redacted"));
    let exec = by("ExecSync", "v1");
    assert_eq!(exec["response"]["stdout"], "<19 bytes>");
    assert_eq!(exec["request"]["cmd"], "<redacted: 3 items, 41 bytes>");
    assert_eq!(exec["request"]["container_id"], "ctr-1");

    for needle in [
        "PullImage",
        "CreateContainer shop/web app",
        "DB_PASSWORD",
        "LOG_LEVEL",
        "registry.example/shop/web:1.0",
        "v1alpha2 PullImage",
    ] {
        assert!(
            text_out.contains(needle),
            "readable view lacks {needle:?}:\n{text_out}"
        );
    }
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the recorded file must be private");
}
