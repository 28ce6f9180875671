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

impl Runtime for RuntimeClient {
    fn list_containers<'a>(
        &'a self,
        version: ApiVersion,
        sandbox_id: &'a str,
    ) -> Answer<'a, Vec<views::Container>> {
        Box::pin(RuntimeClient::list_containers(self, version, sandbox_id))
    }

    fn list_all_containers(&self, version: ApiVersion) -> Answer<'_, Vec<views::Container>> {
        Box::pin(RuntimeClient::list_all_containers(self, version))
    }

    fn container<'a>(
        &'a self,
        version: ApiVersion,
        id: &'a str,
    ) -> Answer<'a, Option<views::Container>> {
        Box::pin(RuntimeClient::container(self, version, id))
    }

    fn list_pod_sandboxes(&self, version: ApiVersion) -> Answer<'_, Vec<views::PodSandbox>> {
        Box::pin(RuntimeClient::list_pod_sandboxes(self, version))
    }

    fn pod_sandbox_status<'a>(
        &'a self,
        version: ApiVersion,
        sandbox_id: &'a str,
    ) -> Answer<'a, views::PodSandboxStatusResponse> {
        Box::pin(RuntimeClient::pod_sandbox_status(self, version, sandbox_id))
    }

    fn pod_sandbox_status_verbose<'a>(
        &'a self,
        version: ApiVersion,
        sandbox_id: &'a str,
    ) -> Answer<'a, views::PodSandboxStatusResponse> {
        Box::pin(RuntimeClient::pod_sandbox_status_verbose(
            self, version, sandbox_id,
        ))
    }

    fn container_status<'a>(
        &'a self,
        version: ApiVersion,
        id: &'a str,
    ) -> Answer<'a, views::ContainerStatusResponse> {
        Box::pin(RuntimeClient::container_status(self, version, id))
    }

    fn exec_sync<'a>(
        &'a self,
        version: ApiVersion,
        id: &'a str,
        cmd: &'a [String],
        timeout: Duration,
    ) -> Answer<'a, i32> {
        Box::pin(RuntimeClient::exec_sync(self, version, id, cmd, timeout))
    }

    fn stop_container<'a>(
        &'a self,
        version: ApiVersion,
        id: &'a str,
        timeout_secs: i64,
    ) -> Answer<'a, ()> {
        Box::pin(RuntimeClient::stop_container(
            self,
            version,
            id,
            timeout_secs,
        ))
    }

    fn stop_pod_sandbox<'a>(&'a self, version: ApiVersion, sandbox_id: &'a str) -> Answer<'a, ()> {
        Box::pin(RuntimeClient::stop_pod_sandbox(self, version, sandbox_id))
    }
}
