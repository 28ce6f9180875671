//! crisp's decoded views (`crisp::cri::views`) on arbitrary bytes, side by side with the full
//! CRI types (k8s-cri, prost). Beyond "no panic": for every valid CRI message, the view — a
//! subset of its fields with the same numbers and types — must decode too and agree on every
//! field crisp reads. A view that disagreed would make the engine act on a different pod,
//! container, state or time than kubelet sees.
#![no_main]

use crisp::cri::views as v;
use k8s_cri::v1 as cri;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// The view decodes arbitrary bytes without panicking; and whenever the bytes are a valid CRI
/// message, the view of that message (re-encoded canonically) decodes and agrees with it.
///
/// Raw malformed bytes are not compared: prost is lax about a *known* field with the wrong
/// wire type (a map field sent as a varint is read as a length, swallowing the next bytes) but
/// strict about skipped ones (a stray end-group tag), so the full type and a view may read
/// the same invalid bytes differently. Such bytes are invalid CRI that no runtime sends and
/// kubelet's Go decoder rejects; for crisp they only mean "forward unordered".
fn both<V: Message + Default, F: Message + Default>(data: &[u8], check: impl Fn(&V, &F)) {
    let _ = v::decode::<V>(data);
    let Ok(full) = F::decode(data) else { return };
    let canonical = full.encode_to_vec();
    let view = v::decode::<V>(&canonical[..]).unwrap_or_else(|e| {
        panic!(
            "a valid {} does not decode as its view {}: {e}",
            std::any::type_name::<F>(),
            std::any::type_name::<V>()
        )
    });
    check(&view, &full);
}

fn sandbox_md(a: &Option<v::PodSandboxMetadata>, b: &Option<cri::PodSandboxMetadata>) {
    let a = a.clone().unwrap_or_default();
    let b = b.clone().unwrap_or_default();
    assert_eq!(
        (a.name, a.uid, a.namespace, a.attempt),
        (b.name, b.uid, b.namespace, b.attempt)
    );
}

fn container_md(a: &Option<v::ContainerMetadata>, b: &Option<cri::ContainerMetadata>) {
    let a = a.clone().unwrap_or_default();
    let b = b.clone().unwrap_or_default();
    assert_eq!((a.name, a.attempt), (b.name, b.attempt));
}

fn sandbox_config(a: &v::PodSandboxConfig, b: &cri::PodSandboxConfig) {
    sandbox_md(&a.metadata, &b.metadata);
    assert_eq!(a.labels, b.labels);
    assert_eq!(a.annotations, b.annotations);
    let node = b
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .is_some_and(|n| n.network == cri::NamespaceMode::Node as i32);
    assert_eq!(a.host_network(), node);
}

fn container_status(a: &v::ContainerStatus, b: &cri::ContainerStatus) {
    assert_eq!(a.id, b.id);
    container_md(&a.metadata, &b.metadata);
    assert_eq!(
        (
            a.state,
            a.created_at,
            a.started_at,
            a.finished_at,
            a.exit_code
        ),
        (
            b.state,
            b.created_at,
            b.started_at,
            b.finished_at,
            b.exit_code
        )
    );
    assert_eq!(a.reason, b.reason);
    assert_eq!(a.labels, b.labels);
    assert_eq!(a.annotations, b.annotations);
}

/// A sandbox status (if any) and the container statuses that come with it.
fn sandbox_and_containers(
    a: &Option<v::PodSandboxStatus>,
    b: &Option<cri::PodSandboxStatus>,
    ac: &[v::ContainerStatus],
    bc: &[cri::ContainerStatus],
) {
    assert_eq!(a.is_some(), b.is_some());
    if let (Some(a), Some(b)) = (a, b) {
        sandbox_status(a, b);
    }
    assert_eq!(ac.len(), bc.len());
    for (a, b) in ac.iter().zip(bc) {
        container_status(a, b);
    }
}

fn sandbox_status(a: &v::PodSandboxStatus, b: &cri::PodSandboxStatus) {
    assert_eq!(a.id, b.id);
    sandbox_md(&a.metadata, &b.metadata);
    assert_eq!((a.state, a.created_at), (b.state, b.created_at));
    assert_eq!(
        a.network.as_ref().map(|n| n.ip.clone()).unwrap_or_default(),
        b.network.as_ref().map(|n| n.ip.clone()).unwrap_or_default()
    );
    let node = b
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network == cri::NamespaceMode::Node as i32);
    assert_eq!(a.host_network(), node);
    assert_eq!(a.labels, b.labels);
    assert_eq!(a.annotations, b.annotations);
}

fuzz_target!(|data: &[u8]| {
    both::<v::PodSandboxConfig, cri::PodSandboxConfig>(data, sandbox_config);
    both::<v::RunPodSandboxRequest, cri::RunPodSandboxRequest>(data, |a, b| {
        assert_eq!(a.runtime_handler, b.runtime_handler);
        assert_eq!(a.config.is_some(), b.config.is_some());
        if let (Some(a), Some(b)) = (&a.config, &b.config) {
            sandbox_config(a, b);
        }
    });
    both::<v::RunPodSandboxResponse, cri::RunPodSandboxResponse>(data, |a, b| {
        assert_eq!(a.pod_sandbox_id, b.pod_sandbox_id)
    });
    both::<v::PodSandboxIdRequest, cri::StopPodSandboxRequest>(data, |a, b| {
        assert_eq!(a.pod_sandbox_id, b.pod_sandbox_id)
    });
    both::<v::PodSandboxIdRequest, cri::PodSandboxStatusRequest>(data, |a, b| {
        assert_eq!(a.pod_sandbox_id, b.pod_sandbox_id)
    });
    both::<v::CreateContainerRequest, cri::CreateContainerRequest>(data, |a, b| {
        assert_eq!(a.pod_sandbox_id, b.pod_sandbox_id);
        assert_eq!(a.config.is_some(), b.config.is_some());
        if let (Some(a), Some(b)) = (&a.config, &b.config) {
            container_md(&a.metadata, &b.metadata);
            assert_eq!(a.labels, b.labels);
            assert_eq!(a.annotations, b.annotations);
        }
        assert_eq!(a.sandbox_config.is_some(), b.sandbox_config.is_some());
        if let (Some(a), Some(b)) = (&a.sandbox_config, &b.sandbox_config) {
            sandbox_config(a, b);
        }
    });
    both::<v::CreateContainerResponse, cri::CreateContainerResponse>(data, |a, b| {
        assert_eq!(a.container_id, b.container_id)
    });
    both::<v::ContainerIdRequest, cri::StopContainerRequest>(data, |a, b| {
        assert_eq!((&a.container_id, a.timeout), (&b.container_id, b.timeout))
    });
    both::<v::ContainerIdRequest, cri::ContainerStatusRequest>(data, |a, b| {
        assert_eq!(a.container_id, b.container_id)
    });
    both::<v::ContainerStatusResponse, cri::ContainerStatusResponse>(data, |a, b| {
        assert_eq!(a.status.is_some(), b.status.is_some());
        if let (Some(a), Some(b)) = (&a.status, &b.status) {
            container_status(a, b);
        }
    });
    both::<v::PodSandboxStatusResponse, cri::PodSandboxStatusResponse>(data, |a, b| {
        sandbox_and_containers(
            &a.status,
            &b.status,
            &a.containers_statuses,
            &b.containers_statuses,
        );
    });
    both::<v::ListContainersResponse, cri::ListContainersResponse>(data, |a, b| {
        assert_eq!(a.containers.len(), b.containers.len());
        for (a, b) in a.containers.iter().zip(&b.containers) {
            assert_eq!(
                (&a.id, &a.pod_sandbox_id, a.state, a.created_at),
                (&b.id, &b.pod_sandbox_id, b.state, b.created_at)
            );
            container_md(&a.metadata, &b.metadata);
            assert_eq!(a.labels, b.labels);
            assert_eq!(a.annotations, b.annotations);
        }
    });
    both::<v::ListPodSandboxResponse, cri::ListPodSandboxResponse>(data, |a, b| {
        assert_eq!(a.items.len(), b.items.len());
        for (a, b) in a.items.iter().zip(&b.items) {
            assert_eq!(
                (&a.id, a.state, a.created_at),
                (&b.id, b.state, b.created_at)
            );
            sandbox_md(&a.metadata, &b.metadata);
            assert_eq!(a.labels, b.labels);
            assert_eq!(a.annotations, b.annotations);
        }
    });
    both::<v::ExecSyncRequest, cri::ExecSyncRequest>(data, |a, b| {
        assert_eq!(
            (&a.container_id, &a.cmd, a.timeout),
            (&b.container_id, &b.cmd, b.timeout)
        )
    });
    both::<v::ExecSyncResponse, cri::ExecSyncResponse>(data, |a, b| {
        assert_eq!(a.exit_code, b.exit_code)
    });
    both::<v::ContainerEventResponse, cri::ContainerEventResponse>(data, |a, b| {
        assert_eq!(
            (&a.container_id, a.container_event_type),
            (&b.container_id, b.container_event_type)
        );
        sandbox_and_containers(
            &a.pod_sandbox_status,
            &b.pod_sandbox_status,
            &a.containers_statuses,
            &b.containers_statuses,
        );
    });
    both::<v::PullImageRequest, cri::PullImageRequest>(data, |a, b| {
        assert_eq!(
            a.image.as_ref().map(|i| i.image.clone()),
            b.image.as_ref().map(|i| i.image.clone())
        );
    });
});
