//! The `progress` check: a live crisp's watchdog says its relay threads and runtime turn
//! (`/healthz` on the admin socket).

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::config::Config;

/// Whether the running crisp makes progress (its watchdog's verdict, `GET /healthz` on the
/// admin socket). A crisp can answer a new connection while an old one, kubelet's, is stuck:
/// this asks crisp itself. Skipped when crisp's socket already failed its check.
pub(super) async fn check_progress(opts: &Options, cfg: &Config, listen: &Path, r: &mut Report) {
    if r.checks
        .iter()
        .any(|c| c.name == "crisp-socket" && c.level == Level::Fail)
    {
        return;
    }
    let admin = cfg
        .admin
        .socket
        .clone()
        .unwrap_or_else(|| listen.with_file_name("admin.sock"));
    let path = under_root(&opts.root, &admin);
    if !cfg.admin.enabled {
        return r.ok(
            "progress",
            "not checked: the admin socket is disabled ([admin] enabled = false)",
        );
    }
    if !path.exists() {
        // The admin-socket check has said so already.
        return;
    }
    match tokio::time::timeout(Duration::from_secs(3), healthz(&path)).await {
        Ok(Ok((200, body))) => r.ok(
            "progress",
            format!("crisp's relay threads and async runtime make progress ({body})"),
        ),
        Ok(Ok((code, body))) => r.fail(
            "progress",
            format!(
                "crisp is stuck (HTTP {code} from {}): {body}",
                path.display()
            ),
            "systemd restarts it after WatchdogSec; until then see journalctl -u crisp and \
             curl --unix-socket ADMIN_SOCKET http://x/debug/connections (a bug: report both)"
                .replace("ADMIN_SOCKET", &path.display().to_string()),
        ),
        Ok(Err(e)) => r.warn(
            "progress",
            format!("cannot ask crisp on {}: {e}", path.display()),
            "run crisp doctor as root; check [admin] in the config and journalctl -u crisp",
        ),
        Err(_) => r.fail(
            "progress",
            format!(
                "crisp's admin socket {} did not answer in 3 s",
                path.display()
            ),
            "crisp may be wedged: systemd restarts it after WatchdogSec; journalctl -u crisp",
        ),
    }
}

/// `GET /healthz` on the admin socket: the status and the first line of the body.
pub(super) async fn healthz(path: &Path) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    let io = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get("/healthz")
        .header(http::header::HOST, "crisp")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    Ok((code, text.lines().next().unwrap_or("").trim().to_string()))
}
