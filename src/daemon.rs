//! Wires configuration, the listener, the upstream and the interceptors into a running proxy.

use std::future::Future;
use std::sync::Arc;

use std::time::Duration;

use crate::config::Config;
use crate::cri::client::RuntimeClient;
use crate::metrics::OrderingMetrics;
use crate::ordering::job::Terminated;
use crate::ordering::Engine;
use crate::intercept::{Interceptor, Interceptors};
use crate::proxy::{self, listener, Proxy, Upstream};

/// Builds the interceptor chain for a configuration.
pub fn interceptors(cfg: &Config, upstream: &Arc<Upstream>) -> Vec<Arc<dyn Interceptor>> {
    let client = RuntimeClient::new(upstream.clone(), Duration::from_secs(5));
    let terminated = Arc::new(Terminated::open(Some(cfg.state_dir.clone())));
    let engine = Engine::new(cfg, client, Arc::new(OrderingMetrics::default()), terminated);
    // Job pods whose sidecars crisp must end are found again after a restart.
    let recovering = engine.clone();
    tokio::spawn(async move { recovering.recover(crate::cri::ApiVersion::V1).await });
    vec![engine]
}

/// Binds `cfg.listen` and serves until `shutdown` resolves. Removes the socket file on return.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let (listener, _guard) = listener::bind(&cfg.listen, cfg.listen_mode).await?;
    tracing::info!(listen = %cfg.listen.display(), upstream = %cfg.upstream.display(), "crisp listening");
    serve_on(listener, cfg, shutdown).await;
    Ok(())
}

/// Serves on an already-bound listener (tests, socket activation).
pub async fn serve_on(listener: tokio::net::UnixListener, cfg: Config, shutdown: impl Future<Output = ()>) {
    let upstream = std::sync::Arc::new(Upstream::new(cfg.upstream.clone(), cfg.upstream_options()));
    let chain = interceptors(&cfg, &upstream);
    let proxy = Proxy::new(upstream, Interceptors::new(chain), cfg.proxy_options());
    proxy::serve(listener, proxy, shutdown).await;
}
