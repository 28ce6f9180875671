//! The engine's seam to the container runtime: the few reads and actions its rules need. In the
//! daemon it is [`RuntimeClient`] (crisp's own calls over the runtime pool's connections); unit tests
//! put a scripted runtime behind it and run the engine on paused time.

use std::time::Duration;

use crate::cri::views;
use crate::cri::ApiVersion;
use crate::intercept::BoxFuture;
use crate::proxy::client::{ClientError, RuntimeClient};

pub type Answer<'a, T> = BoxFuture<'a, Result<T, ClientError>>;

pub trait Runtime: Send + Sync {
    /// ListContainers filtered to one sandbox.
    fn list_containers<'a>(
        &'a self,
        version: ApiVersion,
        sandbox_id: &'a str,
    ) -> Answer<'a, Vec<views::Container>>;
    /// ListContainers of the whole node (the prune of Job-mode marks at start).
    fn list_all_containers(&self, version: ApiVersion) -> Answer<'_, Vec<views::Container>>;
    /// One container by id (ListContainers filtered by id); `None` when the runtime has none.
    fn container<'a>(
        &'a self,
        version: ApiVersion,
        id: &'a str,
    ) -> Answer<'a, Option<views::Container>>;
    fn list_pod_sandboxes(&self, version: ApiVersion) -> Answer<'_, Vec<views::PodSandbox>>;
    fn pod_sandbox_status<'a>(
        &'a self,
        version: ApiVersion,
        sandbox_id: &'a str,
    ) -> Answer<'a, views::PodSandboxStatusResponse>;
    /// PodSandboxStatus with `verbose`: with the runtime's `info` (where the sandbox's network
    /// namespace is). A runtime that has no verbose form answers the plain status.
    fn pod_sandbox_status_verbose<'a>(
        &'a self,
        version: ApiVersion,
        sandbox_id: &'a str,
    ) -> Answer<'a, views::PodSandboxStatusResponse> {
        self.pod_sandbox_status(version, sandbox_id)
    }
    fn container_status<'a>(
        &'a self,
        version: ApiVersion,
        id: &'a str,
    ) -> Answer<'a, views::ContainerStatusResponse>;
    /// ExecSync; the command's exit code.
    fn exec_sync<'a>(
        &'a self,
        version: ApiVersion,
        id: &'a str,
        cmd: &'a [String],
        timeout: Duration,
    ) -> Answer<'a, i32>;
    fn stop_container<'a>(
        &'a self,
        version: ApiVersion,
        id: &'a str,
        timeout_secs: i64,
    ) -> Answer<'a, ()>;
    fn stop_pod_sandbox<'a>(&'a self, version: ApiVersion, sandbox_id: &'a str) -> Answer<'a, ()>;
}

/// A [`Runtime`] method answered by the [`RuntimeClient`] method of the same name, arguments
/// passed through as they are: the daemon's engine talks to the runtime through crisp's own
/// client and nothing else.
macro_rules! forward_to_client {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        $(
            fn $name<'a>(&'a self, version: ApiVersion $(, $arg: $ty)*) -> Answer<'a, $out> {
                Box::pin(RuntimeClient::$name(self, version $(, $arg)*))
            }
        )*
    };
}

impl Runtime for RuntimeClient {
    forward_to_client! {
        fn list_containers(sandbox_id: &'a str) -> Vec<views::Container>;
        fn list_all_containers() -> Vec<views::Container>;
        fn container(id: &'a str) -> Option<views::Container>;
        fn list_pod_sandboxes() -> Vec<views::PodSandbox>;
        fn pod_sandbox_status(sandbox_id: &'a str) -> views::PodSandboxStatusResponse;
        fn pod_sandbox_status_verbose(sandbox_id: &'a str) -> views::PodSandboxStatusResponse;
        fn container_status(id: &'a str) -> views::ContainerStatusResponse;
        fn exec_sync(id: &'a str, cmd: &'a [String], timeout: Duration) -> i32;
        fn stop_container(id: &'a str, timeout_secs: i64) -> ();
        fn stop_pod_sandbox(sandbox_id: &'a str) -> ();
    }
}
