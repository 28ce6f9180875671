//! crisp under test: the proxy in this process on a temp socket, or the daemon.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crisp::intercept::{Interceptor, Interceptors};
use crisp::proxy::{Proxy, ProxyOptions, RuntimePool, RuntimePoolOptions};

use super::*;

pub struct Crisp {
    pub path: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    _guard: Option<crisp::proxy::listener::SocketFileGuard>,
    _dir: tempfile::TempDir,
}

/// crisp as the daemon runs it (default chain: tap + ordering engine, admin socket), in a temp
/// dir; started once its admin socket listens (the daemon says so: nothing is polled).
pub struct Daemon {
    pub sock: PathBuf,
    pub admin: PathBuf,
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<()>,
    _guard: crisp::proxy::listener::SocketFileGuard,
}

impl Daemon {
    pub async fn start(upstream: &Path, tweak: impl FnOnce(&mut crisp::config::Config)) -> Daemon {
        init_logging();
        let dir = tempfile::Builder::new()
            .prefix("crisp-daemon")
            .tempdir()
            .unwrap();
        let sock = dir.path().join("crisp.sock");
        let (listener, guard) = crisp::proxy::listener::bind(&sock, 0o660).await.unwrap();
        let mut cfg = test_config(&sock, upstream, dir.path());
        tweak(&mut cfg);
        let admin = cfg.admin_socket();
        let (tx, rx) = oneshot::channel::<()>();
        let (ready_tx, ready) = oneshot::channel();
        let task = tokio::spawn(crisp::daemon::serve_on_notify(
            listener,
            cfg,
            async {
                let _ = rx.await;
            },
            ready_tx,
        ));
        within(PATIENCE, "the admin socket to listen", ready)
            .await
            .expect("the daemon ended before its admin socket was bound");
        Daemon {
            sock,
            admin,
            dir,
            stop: Some(tx),
            task,
            _guard: guard,
        }
    }

    /// Resolves the daemon's shutdown future and waits for it to finish.
    pub async fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        within(PATIENCE, "crisp to stop", &mut self.task)
            .await
            .unwrap();
    }
}

/// The daemon's default configuration, with every path inside `dir`.
pub fn test_config(listen: &Path, upstream: &Path, dir: &Path) -> crisp::config::Config {
    crisp::config::Config {
        listen: listen.to_path_buf(),
        upstream: upstream.to_path_buf(),
        state_dir: dir.join("state"),
        ..Default::default()
    }
}

fn crisp_socket() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("crisp-test")
        .tempdir()
        .unwrap();
    let path = dir.path().join("crisp.sock");
    (dir, path)
}

impl Crisp {
    /// Runs crisp as the daemon does (default configuration, its default interceptor chain) in
    /// front of `upstream`.
    pub async fn start(upstream: &Path) -> Crisp {
        init_logging();
        let (dir, path) = crisp_socket();
        let (listener, guard) = crisp::proxy::listener::bind(&path, 0o660).await.unwrap();
        let cfg = test_config(&path, upstream, dir.path());
        Crisp::spawn(dir, path, guard, |shutdown| {
            crisp::daemon::serve_on(listener, cfg, shutdown)
        })
    }

    /// Runs crisp with the given interceptors and options.
    pub async fn start_with(
        upstream: &Path,
        interceptors: Vec<Arc<dyn Interceptor>>,
        opts: ProxyOptions,
    ) -> Crisp {
        init_logging();
        let (dir, path) = crisp_socket();
        let (listener, guard) = crisp::proxy::listener::bind(&path, 0o660).await.unwrap();
        let upstream = Arc::new(RuntimePool::new(upstream, RuntimePoolOptions::default()));
        let proxy = Proxy::new(upstream, Interceptors::new(interceptors), opts);
        Crisp::spawn(dir, path, guard, |shutdown| {
            crisp::proxy::serve(listener, proxy, shutdown)
        })
    }

    /// crisp on `path` (in `dir`), served by `serve` on a task until the future it is given
    /// resolves: when the returned `Crisp` shuts down.
    fn spawn<F: Future<Output = ()> + Send + 'static>(
        dir: tempfile::TempDir,
        path: PathBuf,
        guard: crisp::proxy::listener::SocketFileGuard,
        serve: impl FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> F,
    ) -> Crisp {
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(Box::pin(async {
            let _ = rx.await;
        })));
        Crisp {
            path,
            shutdown: Some(tx),
            task: Some(task),
            _guard: Some(guard),
            _dir: dir,
        }
    }
}

impl Crisp {
    /// Resolves crisp's shutdown future; the returned task ends when `serve` returns.
    pub fn shutdown(&mut self) -> JoinHandle<()> {
        let _ = self.shutdown.take().expect("already shut down").send(());
        self.task.take().expect("already shut down")
    }
}

impl Drop for Crisp {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
