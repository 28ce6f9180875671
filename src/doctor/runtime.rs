//! Check 2: the runtime's socket exists and answers CRI `Version`; the runtime client the
//! other checks share.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::DEFAULT_CONFIG_PATH;
use crate::cri::ApiVersion;
use crate::proxy::client::{ClientError, RuntimeClient, VersionResponse};
use crate::proxy::{RuntimePool, RuntimePoolOptions};

pub(super) fn client_for(path: &Path, timeout: Duration) -> RuntimeClient {
    let opts = RuntimePoolOptions {
        connect_timeout: timeout.min(Duration::from_secs(2)),
        ..Default::default()
    };
    RuntimeClient::new(
        Arc::new(RuntimePool::new(path.to_path_buf(), opts)),
        timeout,
    )
}

pub(super) fn describe(v: &VersionResponse) -> String {
    format!(
        "{} {} (CRI {})",
        v.runtime_name, v.runtime_version, v.runtime_api_version
    )
}

/// `Err(detail, fix)` unless `path` is an existing unix socket.
pub(super) fn socket_exists(
    path: &Path,
    what: &str,
    fix_missing: &str,
) -> Result<std::fs::Metadata, (String, String)> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => Ok(md),
        Ok(_) => Err((
            format!(
                "{} ({what}) exists but is not a unix socket",
                path.display()
            ),
            format!("remove {} and {fix_missing}", path.display()),
        )),
        Err(e) => Err((
            format!("{} ({what}): {e}", path.display()),
            fix_missing.to_string(),
        )),
    }
}

pub(super) async fn check_upstream(opts: &Options, upstream: &Path, r: &mut Report) {
    let path = under_root(&opts.root, upstream);
    let fix_missing = format!(
        "start the runtime (systemctl start containerd), or set `upstream` in {} to the runtime's socket",
        DEFAULT_CONFIG_PATH
    );
    if let Err((detail, fix)) = socket_exists(&path, "upstream, the runtime's socket", &fix_missing)
    {
        r.fail("upstream", detail, fix);
        return;
    }
    let client = client_for(&path, opts.timeout);
    let v1 = client.version(ApiVersion::V1).await;
    let v1alpha2 = client.version(ApiVersion::V1alpha2).await;
    let served = |res: &Result<VersionResponse, ClientError>| res.is_ok();
    let apis: Vec<&str> = [
        ("runtime.v1", served(&v1)),
        ("runtime.v1alpha2", served(&v1alpha2)),
    ]
    .iter()
    .filter(|(_, s)| *s)
    .map(|(n, _)| *n)
    .collect();
    match (&v1, &v1alpha2) {
        (Ok(v), _) => r.ok("upstream", format!("{} answers: {}; serves {}", path.display(), describe(v), apis.join(" and "))),
        (Err(_), Ok(v)) => r.warn(
            "upstream",
            format!("{} answers: {}; serves runtime.v1alpha2 only", path.display(), describe(v)),
            "kubelet 1.26+ requires runtime.v1: upgrade the runtime (containerd 1.6+) before upgrading kubelet",
        ),
        (Err(e), Err(_)) => r.fail(
            "upstream",
            format!("{} does not answer CRI Version: {e}", path.display()),
            "check the runtime: systemctl status containerd; journalctl -u containerd; for containerd, the `cri` plugin must not be disabled in /etc/containerd/config.toml",
        ),
    }
}
