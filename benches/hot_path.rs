//! Micro-benchmarks of crisp's per-call hot path: routing a path, reading grpc-timeout, the
//! interest check, decoding the views the engine reads, and the job-mode wire patch.
//! Run: `cargo bench --bench hot_path`.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use crisp::cri::patch::{completed_fragment, patch_embedded};
use crisp::cri::views;
use crisp::cri::Route;
use crisp::status::parse_grpc_timeout;
use k8s_cri::v1 as cri;
use prost::Message;

fn create_container_request() -> Vec<u8> {
    let annotations: std::collections::HashMap<String, String> = (0..20).map(|i| (format!("example.com/key-{i}"), "v".repeat(40))).collect();
    cri::CreateContainerRequest {
        pod_sandbox_id: "a".repeat(64),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: 0 }),
            image: Some(cri::ImageSpec { image: "sha256:".to_string() + &"b".repeat(64), ..Default::default() }),
            command: vec!["/app".into(), "--serve".into()],
            envs: (0..30).map(|i| cri::KeyValue { key: format!("ENV_{i}"), value: "x".repeat(30) }).collect(),
            labels: [("io.kubernetes.container.name".to_string(), "app".to_string())].into(),
            annotations: annotations.clone(),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata { name: "web-0".into(), uid: "u".repeat(36), namespace: "default".into(), attempt: 0 }),
            annotations,
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

fn sandbox_status_response(n: usize) -> Vec<u8> {
    cri::PodSandboxStatusResponse {
        status: Some(cri::PodSandboxStatus { id: "sb".into(), ..Default::default() }),
        containers_statuses: (0..n)
            .map(|i| cri::ContainerStatus { id: format!("{i:064x}"), exit_code: 143, reason: "Error".into(), ..Default::default() })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn bench(c: &mut Criterion) {
    c.bench_function("route_from_path", |b| b.iter(|| Route::from_path(black_box("/runtime.v1.RuntimeService/ListContainers"))));
    c.bench_function("route_unknown_path", |b| b.iter(|| Route::from_path(black_box("/grpc.health.v1.Health/Check"))));
    c.bench_function("parse_grpc_timeout", |b| b.iter(|| parse_grpc_timeout(black_box(b"119999m"))));
    let req = create_container_request();
    c.bench_function("decode_create_container_view", |b| b.iter(|| views::decode::<views::CreateContainerRequest>(black_box(&req)).map(|r| r.pod_sandbox_id.len())));
    c.bench_function("decode_create_container_full_prost", |b| b.iter(|| cri::CreateContainerRequest::decode(black_box(&req[..])).map(|r| r.pod_sandbox_id.len())));
    let resp = sandbox_status_response(10);
    let target = format!("{:064x}", 7);
    c.bench_function("patch_sandbox_status_10_containers", |b| {
        b.iter(|| patch_embedded(black_box(&resp), 3, &completed_fragment(), |id| id == target))
    });
    c.bench_function("walk_sandbox_status_no_match", |b| b.iter(|| patch_embedded(black_box(&resp), 3, &completed_fragment(), |_| false)));
    let _ = Instant::now();
}

criterion_group!(benches, bench);
criterion_main!(benches);
