//! Micro-benchmarks of crisp's per-call hot path: routing a path, reading grpc-timeout, the
//! interest check, decoding the views the engine reads, the job-mode wire patch, the tap's skim
//! of a message as it passes, the relay's request-header decode and re-encode, the Huffman
//! decode of a request's :path, what the tap costs a relayed call when nobody is tapping, and
//! what a call costs in metrics.
//! Run: `cargo bench --bench hot_path`.

use std::hint::black_box;
use std::time::Instant;

use crisp::cri::patch::{completed_fragment, patch_embedded};
use crisp::cri::skim::{Skim, SkimSpec, Skimmer};
use crisp::cri::tags::pod_sandbox_status_response::CONTAINERS_STATUSES;
use crisp::cri::views;
use crisp::cri::Route;
use crisp::intercept::{Call, Interceptor, Outcome};
use crisp::status::parse_grpc_timeout;
use criterion::{criterion_group, criterion_main, Criterion};
use k8s_cri::v1 as cri;
use prometheus_client::metrics::{counter::Counter, family::Family, histogram::Histogram};
use prost::Message;

fn create_container_request() -> Vec<u8> {
    let annotations: std::collections::HashMap<String, String> = (0..20)
        .map(|i| (format!("example.com/key-{i}"), "v".repeat(40)))
        .collect();
    cri::CreateContainerRequest {
        pod_sandbox_id: "a".repeat(64),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: "sha256:".to_string() + &"b".repeat(64),
                ..Default::default()
            }),
            command: vec!["/app".into(), "--serve".into()],
            envs: (0..30)
                .map(|i| cri::KeyValue {
                    key: format!("ENV_{i}"),
                    value: "x".repeat(30),
                })
                .collect(),
            labels: [(
                "io.kubernetes.container.name".to_string(),
                "app".to_string(),
            )]
            .into(),
            annotations: annotations.clone(),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "web-0".into(),
                uid: "u".repeat(36),
                namespace: "default".into(),
                attempt: 0,
            }),
            annotations,
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

fn sandbox_status_response(n: usize) -> Vec<u8> {
    cri::PodSandboxStatusResponse {
        status: Some(cri::PodSandboxStatus {
            id: "sb".into(),
            ..Default::default()
        }),
        containers_statuses: (0..n)
            .map(|i| cri::ContainerStatus {
                id: format!("{i:064x}"),
                exit_code: 143,
                reason: "Error".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn list_containers_response(n: usize) -> Vec<u8> {
    cri::ListContainersResponse {
        containers: (0..n)
            .map(|i| cri::Container {
                id: format!("{i:064x}"),
                pod_sandbox_id: "a".repeat(64),
                metadata: Some(cri::ContainerMetadata {
                    name: format!("c-{i}"),
                    attempt: 1,
                }),
                image_ref: "sha256:".to_string() + &"b".repeat(64),
                state: cri::ContainerState::ContainerRunning as i32,
                created_at: 1_700_000_000_000_000_000 + i as i64,
                labels: [("io.kubernetes.container.name".to_string(), format!("c-{i}"))].into(),
                ..Default::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

fn bench(c: &mut Criterion) {
    c.bench_function("route_from_path", |b| {
        b.iter(|| Route::from_path(black_box("/runtime.v1.RuntimeService/ListContainers")))
    });
    c.bench_function("route_unknown_path", |b| {
        b.iter(|| Route::from_path(black_box("/grpc.health.v1.Health/Check")))
    });
    c.bench_function("parse_grpc_timeout", |b| {
        b.iter(|| parse_grpc_timeout(black_box(b"119999m")))
    });
    let req = create_container_request();
    c.bench_function("decode_create_container_view", |b| {
        b.iter(|| {
            views::decode::<views::CreateContainerRequest>(black_box(&req))
                .map(|r| r.pod_sandbox_id.len())
        })
    });
    c.bench_function("decode_create_container_full_prost", |b| {
        b.iter(|| {
            cri::CreateContainerRequest::decode(black_box(&req[..])).map(|r| r.pod_sandbox_id.len())
        })
    });
    let resp = sandbox_status_response(10);
    let target = format!("{:064x}", 7);
    c.bench_function("patch_sandbox_status_10_containers", |b| {
        b.iter(|| {
            patch_embedded(
                black_box(&resp),
                CONTAINERS_STATUSES,
                &completed_fragment(),
                |id| id == target,
            )
        })
    });
    c.bench_function("walk_sandbox_status_no_match", |b| {
        b.iter(|| {
            patch_embedded(
                black_box(&resp),
                CONTAINERS_STATUSES,
                &completed_fragment(),
                |_| false,
            )
        })
    });

    // The tap's view of a message as its bytes pass (cri/skim.rs): a ListContainers answer of
    // 100 containers skimmed whole with the tap's 64 KiB budget, and an ExecSync answer with
    // 1 MiB of stdout (size only, as the tap shows it) in h2-sized 16 KiB pieces.
    let list = crisp::cri::wire::frame(&list_containers_response(100));
    c.bench_function("skim_list_containers_100", |b| {
        b.iter(|| {
            let spec = SkimSpec {
                budget: 64 << 10,
                size_only: &[],
                items: None,
            };
            Skim::of_framed(spec, black_box(&list)).map(|s| s.kept.len())
        })
    });
    let exec = crisp::cri::wire::frame(
        &cri::ExecSyncResponse {
            stdout: vec![b'x'; 1 << 20],
            stderr: b"warn".to_vec(),
            exit_code: 1,
        }
        .encode_to_vec(),
    );
    c.bench_function("skim_exec_sync_1mib_in_16k_pieces", |b| {
        b.iter(|| {
            let mut s = Skimmer::new(SkimSpec {
                budget: 64 << 10,
                size_only: &[1, 2],
                items: None,
            });
            for piece in black_box(&exec).chunks(16 << 10) {
                s.push(piece);
            }
            s.finish().map(|s| s.cut.len())
        })
    });

    // The relay's per-call header work: decode kubelet's request header block (its encoder has
    // indexed everything but grpc-timeout by now) and re-encode it statelessly.
    let mut enc = httlib_hpack::Encoder::with_dynamic_size(4096);
    let fields = |t: &str| {
        vec![
            (b":method".to_vec(), b"POST".to_vec(), 0x4 | 0x10),
            (b":scheme".to_vec(), b"http".to_vec(), 0x4 | 0x10),
            (
                b":path".to_vec(),
                b"/runtime.v1.RuntimeService/ListContainers".to_vec(),
                0x4 | 0x10 | 0x2,
            ),
            (
                b":authority".to_vec(),
                b"localhost".to_vec(),
                0x4 | 0x10 | 0x2,
            ),
            (
                b"content-type".to_vec(),
                b"application/grpc".to_vec(),
                0x4 | 0x10 | 0x2,
            ),
            (
                b"user-agent".to_vec(),
                b"grpc-go/1.51.0".to_vec(),
                0x4 | 0x10 | 0x2,
            ),
            (b"te".to_vec(), b"trailers".to_vec(), 0x4 | 0x10 | 0x2),
            (b"grpc-timeout".to_vec(), t.as_bytes().to_vec(), 0x2),
        ]
    };
    let mut first = Vec::new();
    for f in fields("1999000u") {
        enc.encode(f, &mut first).unwrap();
    }
    let mut steady = Vec::new();
    for f in fields("1998977u") {
        enc.encode(f, &mut steady).unwrap();
    }
    let mut dec = crisp::proxy::http2::hpack::Decoder::default();
    dec.decode(&first, |_, _| {}).unwrap();
    let mut out = Vec::with_capacity(512);
    c.bench_function("relay_request_headers_decode_and_reencode", |b| {
        b.iter(|| {
            out.clear();
            dec.decode(black_box(&steady), |n, v| {
                crisp::proxy::http2::encode_field(&mut out, n, v)
            })
            .unwrap();
            out.len()
        })
    });

    // The same with loona-hpack (a maintained HPACK crate) in place of crisp's decoder: what
    // the crate would cost per call (issue #16). Both decoders have seen the first block.
    let mut loona = loona_hpack::Decoder::new();
    loona.decode_with_cb(&first, |_, _| {}).unwrap();
    c.bench_function(
        "relay_request_headers_decode_and_reencode_loona_hpack",
        |b| {
            b.iter(|| {
                out.clear();
                loona
                    .decode_with_cb(black_box(&steady), |n, v| {
                        crisp::proxy::http2::encode_field(&mut out, &n, &v)
                    })
                    .unwrap();
                out.len()
            })
        },
    );
    // The same with httlib-hpack, a fast decoder (its Huffman decoding reads a static table),
    // the honest comparison: loona-hpack above builds a table per Huffman string. httlib's API
    // consumes its input and returns owned fields, so the copy of the block is part of its cost.
    let mut httlib = httlib_hpack::Decoder::with_dynamic_size(4096);
    httlib.decode(&mut first.clone(), &mut Vec::new()).unwrap();
    let mut decoded = Vec::with_capacity(16);
    c.bench_function(
        "relay_request_headers_decode_and_reencode_httlib_hpack",
        |b| {
            b.iter(|| {
                out.clear();
                decoded.clear();
                httlib
                    .decode(&mut black_box(&steady).clone(), &mut decoded)
                    .unwrap();
                for (n, v, _) in &decoded {
                    crisp::proxy::http2::encode_field(&mut out, n, v);
                }
                out.len()
            })
        },
    );
    // A first request on a connection: every field a literal (Huffman-coded by grpc-go's
    // encoder), each added to the table; a fresh decoder per iteration for both.
    c.bench_function("first_request_headers_decode_crisp", |b| {
        b.iter(|| {
            let mut d = crisp::proxy::http2::hpack::Decoder::default();
            out.clear();
            d.decode(black_box(&first), |n, v| {
                crisp::proxy::http2::encode_field(&mut out, n, v)
            })
            .unwrap();
            out.len()
        })
    });
    c.bench_function("first_request_headers_decode_httlib_hpack", |b| {
        b.iter(|| {
            let mut d = httlib_hpack::Decoder::with_dynamic_size(4096);
            out.clear();
            let mut fields = Vec::with_capacity(16);
            d.decode(&mut black_box(&first).clone(), &mut fields)
                .unwrap();
            for (n, v, _) in &fields {
                crisp::proxy::http2::encode_field(&mut out, n, v);
            }
            out.len()
        })
    });
    c.bench_function("first_request_headers_decode_loona_hpack", |b| {
        b.iter(|| {
            let mut d = loona_hpack::Decoder::new();
            out.clear();
            d.decode_with_cb(black_box(&first), |n, v| {
                crisp::proxy::http2::encode_field(&mut out, &n, &v)
            })
            .unwrap();
            out.len()
        })
    });

    // The Huffman literal h2 clients send as :path on every request: crisp's decoder and
    // httlib-huffman's (which crisp used before) on the same bytes.
    let mut path = Vec::new();
    httlib_huffman::encode(b"/runtime.v1.RuntimeService/ListContainers", &mut path).unwrap();
    let mut text = Vec::with_capacity(64);
    c.bench_function("huffman_decode_path_crisp", |b| {
        b.iter(|| {
            text.clear();
            crisp::proxy::http2::huffman::decode(black_box(&path), &mut text).unwrap();
            text.len()
        })
    });
    c.bench_function("huffman_decode_path_httlib", |b| {
        b.iter(|| {
            text.clear();
            httlib_huffman::decode(
                black_box(&path),
                &mut text,
                httlib_huffman::DecoderSpeed::FourBits,
            )
            .unwrap();
            text.len()
        })
    });

    // The tap with no client attached: what every relayed call pays it (its interest check when
    // the stream opens, its metrics when the stream ends).
    let tap = crisp::tap::Tap::new(
        std::sync::Arc::new(crisp::metrics::CallMetrics::default()),
        None,
    );
    let call = Call {
        route: Route::from_path("/runtime.v1.RuntimeService/ContainerStatus"),
        path: http::uri::PathAndQuery::from_static("/runtime.v1.RuntimeService/ContainerStatus"),
        received: Instant::now(),
        deadline: None,
        id: 1,
        trace: None,
    };
    let outcome = Outcome {
        code: Some(0),
        duration: std::time::Duration::from_micros(180),
        held: std::time::Duration::ZERO,
        request: None,
        response: None,
        message: None,
        streamed: None,
    };
    c.bench_function("tap_no_client_interest_and_complete", |b| {
        b.iter(|| {
            let i = tap.interest(black_box(&call));
            tap.on_complete(black_box(&call), black_box(&outcome));
            i
        })
    });

    // What one forwarded call costs in metrics alone: its latency histogram, its status counter
    // and the completed-calls count (`CallMetrics::observe`, from the tap's on_complete).
    let calls = crisp::metrics::CallMetrics::default();
    let rpc = Some(crisp::cri::Rpc::ContainerStatus);
    c.bench_function("metrics_call_observe", |b| {
        b.iter(|| {
            calls.observe(
                black_box(rpc),
                black_box(Some(0)),
                black_box(std::time::Duration::from_micros(180)),
            )
        })
    });
    // The same through prometheus-client's labelled families looked up on every call (a read
    // lock and a hash of the labels per metric), which `CallMetrics` avoids by resolving each
    // method's and status's handles once.
    type Label = (&'static str, &'static str);
    let durations: Family<[Label; 1], Histogram, fn() -> Histogram> =
        Family::new_with_constructor(|| Histogram::new(crisp::metrics::CALL_BUCKETS));
    let codes: Family<[Label; 2], Counter> = Family::default();
    let completed = std::sync::atomic::AtomicU64::new(0);
    c.bench_function("metrics_call_observe_family_lookup", |b| {
        b.iter(|| {
            let method = black_box("ContainerStatus");
            durations
                .get_or_create(&[("method", method)])
                .observe(black_box(std::time::Duration::from_micros(180)).as_secs_f64());
            codes
                .get_or_create(&[
                    ("method", method),
                    ("code", crisp::metrics::code_name(black_box(Some(0)))),
                ])
                .inc();
            completed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        })
    });
    // A call the ordering engine holds: the in-flight gauge up and down, and the hold histogram.
    let ordering = crisp::metrics::OrderingMetrics::default();
    c.bench_function("metrics_hold_gauge_and_histogram", |b| {
        b.iter(|| {
            let g = crisp::metrics::GaugeGuard::new(&ordering.holds_in_flight);
            ordering
                .start_holds
                .observe(black_box(std::time::Duration::from_millis(300)).as_secs_f64());
            drop(g);
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
