//! `crisp pods`: what the ordering engine knows and holds now, from the admin API's ListPods —
//! one command on the node that answers "why is this pod not starting?". The views are
//! [`crisp::cli::pods`]'s.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use crisp::admin_api as pb;
use crisp::cli::{client, pods};

use super::exit;
use super::tap::AdminSocketArgs;

/// Show the pods crisp orders: their sidecars in start order (readiness, state, last probe),
/// the calls held now (waiting on what, time left) and refusals so far.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PodsArgs {
    /// Only this pod: `namespace/name`, or `name` in any namespace.
    #[arg(value_name = "NAMESPACE/POD")]
    pub pod: Option<String>,
    /// Print JSON (one object, `{"pods": [...]}`) instead of the readable view.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub admin: AdminSocketArgs,
}

/// Runs `crisp pods`.
pub fn run(args: PodsArgs) -> ExitCode {
    let Some(result) = super::block_on("pods", list(&args)) else {
        return ExitCode::FAILURE;
    };
    match result {
        Ok(text) => {
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{text}");
            ExitCode::SUCCESS
        }
        Err((code, msg)) => {
            eprintln!("crisp pods: {msg}");
            ExitCode::from(code)
        }
    }
}

/// The view to print, or the exit code and message to fail with.
async fn list(args: &PodsArgs) -> Result<String, (u8, String)> {
    let socket = args.admin.path().map_err(|e| (exit::USAGE, e))?;
    reachable(&socket)?;
    let mut admin = client::connect(&socket).await.map_err(|e| {
        (
            exit::UNAVAILABLE,
            format!("cannot connect to {}: {e}", socket.display()),
        )
    })?;
    let resp = admin
        .list_pods(pb::ListPodsRequest {
            pod: args.pod.clone().unwrap_or_default(),
        })
        .await
        .map_err(|s| {
            (
                exit::UNAVAILABLE,
                format!("ListPods: {}: {}", s.code(), s.message()),
            )
        })?
        .into_inner();
    let chosen: Vec<pb::Pod> = resp
        .pods
        .into_iter()
        .filter(|p| pods::selected(args.pod.as_deref(), p))
        .collect();
    if let Some(want) = &args.pod {
        if chosen.is_empty() {
            return Err((
                1,
                format!(
                    "crisp knows no pod {want} (it tracks pods from their RunPodSandbox or first gated call)"
                ),
            ));
        }
    }
    Ok(pods::view(&chosen, args.json, SystemTime::now()))
}

/// The admin socket exists and this user may open it; else a message naming the path and the fix.
fn reachable(socket: &Path) -> Result<(), (u8, String)> {
    match std::os::unix::net::UnixStream::connect(socket) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err((
            exit::UNAVAILABLE,
            format!(
                "no admin socket at {}: is crisp running on this node? (`systemctl status crisp`; or pass --admin-socket PATH / -c CONFIG if `admin.socket` is set elsewhere)",
                socket.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err((
            exit::NOPERM,
            format!(
                "cannot open the admin socket {}: permission denied — it is root-only (mode 0600, `admin.mode`): run `sudo crisp pods`",
                socket.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Err((
            exit::UNAVAILABLE,
            format!(
                "nothing listens on the admin socket {}: crisp is not running (a stale socket file)",
                socket.display()
            ),
        )),
        Err(e) => Err((
            exit::UNAVAILABLE,
            format!("cannot connect to the admin socket {}: {e}", socket.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EX_UNAVAILABLE: u8 = exit::UNAVAILABLE;

    #[test]
    fn absent_socket_names_the_path_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let (code, msg) = reachable(&path).unwrap_err();
        assert_eq!(code, EX_UNAVAILABLE);
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains("is crisp running"),
            "{msg}"
        );
    }
}
