//! crisp's holds in kubelet's trace (DESIGN.md §6.1): a call crisp holds or refuses becomes one
//! span, a child of the span kubelet sent in its W3C `traceparent`, exported over OTLP/gRPC
//! when `[tracing] otlp_endpoint` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT`) names a collector. Off otherwise: no exporter, no thread.
//!
//! What it costs, and where:
//! - a relayed call: nothing. The relay never looks at `traceparent` ([`Call::trace`] is
//!   `None` there); kubelet's trace headers reach the runtime as they came, byte for byte.
//! - an observed call (one an interceptor buffers): one header lookup, and the W3C parse when
//!   kubelet sent `traceparent` ([`parent`]); the headers are forwarded unchanged either way.
//! - a held or refused call with a parent and tracing on: one span, handed to the SDK's batch
//!   processor, which queues it without waiting (a full queue drops it and counts nothing on
//!   the call's path) and exports from its own thread.
//!
//! [`Call::trace`]: crate::intercept::Call::trace

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};

use crate::config::{check_otlp_endpoint, TracingConfig};
use crate::tenant;

/// The environment variables that name the collector when the config does not (the OTLP
/// exporter's standard ones, the traces-only one first).
const ENDPOINT_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Longest `tracestate` crisp reads; a longer one is not read (the span's parent keeps its ids
/// and flags, without the vendors' state). W3C asks every vendor to pass on at least 512.
const MAX_TRACESTATE: usize = 512;

/// Longest refusal message in a span's status.
const MAX_STATUS: usize = 512;

/// How long an export may take before the exporter gives up on that batch.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// The endpoint (from the config or the environment) is not one crisp can export to.
    #[error("tracing endpoint {endpoint:?} from {origin}: {why}")]
    Endpoint {
        endpoint: String,
        origin: &'static str,
        why: String,
    },
    /// The OTLP exporter could not be built.
    #[error("cannot build the OTLP exporter for {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// kubelet's span, from the call's `traceparent` (and `tracestate`, when at most
/// [`MAX_TRACESTATE`] bytes and well-formed): `None` when there is none, more than one, or it is
/// not a W3C trace context (version `00`: exactly `00-<32 hex>-<16 hex>-<2 hex>`, lower-case,
/// ids not all zero; a later version is read as far as those fields, as W3C asks).
pub(crate) fn parent(headers: &http::HeaderMap) -> Option<SpanContext> {
    let mut all = headers.get_all("traceparent").iter();
    let (Some(tp), None) = (all.next(), all.next()) else {
        return None;
    };
    let (trace, span, flags) = traceparent(tp.as_bytes())?;
    let state = headers
        .get("tracestate")
        .filter(|v| v.len() <= MAX_TRACESTATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(trace, span, flags, true, state))
}

/// The ids and flags of a W3C `traceparent` value.
fn traceparent(v: &[u8]) -> Option<(TraceId, SpanId, TraceFlags)> {
    fn hex(s: &[u8]) -> Option<u128> {
        if !s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        u128::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok()
    }
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex(&v[0..2])?;
    let (trace, span, flags) = (hex(&v[3..35])?, hex(&v[36..52])?, hex(&v[53..55])?);
    let fits = match version {
        0 => v.len() == 55,
        0xff => false,
        _ => v.len() == 55 || v[55] == b'-',
    };
    if !fits || trace == 0 || span == 0 {
        return None;
    }
    Some((
        TraceId::from(trace),
        SpanId::from(span as u64),
        // Only the sampled bit has a meaning today.
        TraceFlags::new(flags as u8 & 1),
    ))
}

/// One hold (or refusal) as a span.
#[derive(Debug)]
pub(crate) struct HoldSpan<'a> {
    /// `CreateContainer`, `StopContainer`, `StopPodSandbox`.
    pub(crate) rpc: &'a str,
    pub(crate) call_id: u64,
    pub(crate) pod_namespace: &'a str,
    pub(crate) pod_name: &'a str,
    pub(crate) pod_sandbox_id: &'a str,
    /// The held container; empty for StopPodSandbox.
    pub(crate) container: &'a str,
    /// What the call waited for, in order: sidecars' names, `apps`, `runtime`.
    pub(crate) waited_for: &'a [String],
    /// Why it waited last (`not ready: connect …: refused`), bounded by the engine.
    pub(crate) reason: &'a str,
    /// How the hold ended (`crisp.hold.outcome`), in three words (`crisp.hold.verdict`), and
    /// whether kubelet got an error from crisp (the span's status); the engine's
    /// `hold_events::HoldOutcome` gives all three.
    pub(crate) outcome: &'a str,
    pub(crate) verdict: &'a str,
    pub(crate) failed: bool,
    /// The gRPC message kubelet got, for a refusal.
    pub(crate) message: &'a str,
    /// `proceed` or `fail` (CreateContainer); empty for stops.
    pub(crate) policy: &'a str,
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
}

/// Exports hold spans: the SDK's tracer provider with a batch processor and the OTLP/gRPC
/// exporter. One per daemon; [`HoldSpans::shutdown`] sends what is queued.
pub struct HoldSpans {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    endpoint: String,
}

impl std::fmt::Debug for HoldSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldSpans")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl HoldSpans {
    /// Tracing as configured: `Ok(None)` when no endpoint is named (the config's, else the
    /// environment's). Must run inside the tokio runtime (the exporter's channel lives there).
    pub fn from_config(cfg: &TracingConfig) -> Result<Option<HoldSpans>, OtelError> {
        let (endpoint, origin) = match &cfg.otlp_endpoint {
            Some(e) => (e.clone(), "the config's [tracing] otlp_endpoint"),
            None => match ENDPOINT_ENV.iter().find_map(|k| {
                std::env::var(k)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .map(|v| (v, *k))
            }) {
                Some((e, k)) => (e, k),
                None => return Ok(None),
            },
        };
        check_otlp_endpoint(&endpoint).map_err(|why| OtelError::Endpoint {
            endpoint: tenant::cut(&endpoint, 256),
            origin,
            why,
        })?;
        Self::start(&endpoint, cfg.export_delay).map(Some)
    }

    /// An exporter to `endpoint` (checked), batches sent every `delay`.
    fn start(endpoint: &str, delay: Duration) -> Result<HoldSpans, OtelError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|source| OtelError::Exporter {
                endpoint: endpoint.to_string(),
                source,
            })?;
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(delay)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name("crisp")
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("crisp");
        tracing::info!(endpoint, "exporting held calls' spans over OTLP");
        Ok(HoldSpans {
            provider,
            tracer,
            endpoint: endpoint.to_string(),
        })
    }

    /// Records `hold` as a child of kubelet's span `parent`. Never waits: the span is queued
    /// for the exporter's thread. A parent kubelet did not sample gives no span (the SDK's
    /// default sampler follows the parent).
    pub(crate) fn record(&self, parent: &SpanContext, hold: &HoldSpan<'_>) {
        let cx = Context::new().with_remote_span_context(parent.clone());
        let field = |s: &str| tenant::cut(s, tenant::MAX_FIELD);
        let mut attrs = vec![
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.method", hold.rpc.to_string()),
            KeyValue::new("crisp.call", hold.call_id as i64),
            KeyValue::new("k8s.namespace.name", field(hold.pod_namespace)),
            KeyValue::new("k8s.pod.name", field(hold.pod_name)),
            KeyValue::new("crisp.pod_sandbox_id", field(hold.pod_sandbox_id)),
            KeyValue::new(
                "crisp.hold.waited_for",
                tenant::name_list(hold.waited_for.iter().map(String::as_str)),
            ),
            KeyValue::new("crisp.hold.reason", field(hold.reason)),
            KeyValue::new("crisp.hold.verdict", hold.verdict.to_string()),
            KeyValue::new("crisp.hold.outcome", hold.outcome.to_string()),
            KeyValue::new(
                "crisp.hold.ms",
                hold.end
                    .duration_since(hold.start)
                    .unwrap_or_default()
                    .as_millis() as i64,
            ),
        ];
        if !hold.container.is_empty() {
            attrs.push(KeyValue::new("k8s.container.name", field(hold.container)));
        }
        if !hold.policy.is_empty() {
            attrs.push(KeyValue::new("crisp.hold.policy", hold.policy.to_string()));
        }
        let mut span = self
            .tracer
            .span_builder(format!("crisp hold {}", hold.rpc))
            .with_kind(SpanKind::Internal)
            .with_start_time(hold.start)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, &cx);
        // kubelet got an error from crisp: the span says so, with the message it got.
        if hold.failed {
            span.set_status(Status::error(tenant::cut(
                if hold.message.is_empty() {
                    hold.outcome
                } else {
                    hold.message
                },
                MAX_STATUS,
            )));
        }
        span.end_with_timestamp(hold.end);
    }

    /// Sends the spans queued so far (tests; the daemon's [`HoldSpans::shutdown`] does it too).
    /// Blocks the calling thread until the exporter answered or gave up.
    #[cfg(any(test, feature = "test-util"))]
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(error = %e, "exporting held calls' spans failed");
        }
    }

    /// Sends what is queued and stops the exporter's thread. Blocks the calling thread.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "stopping the span exporter");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(list: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in list {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parent_reads_w3c_trace_context() {
        let sc = parent(&headers(&[
            ("traceparent", TP),
            ("tracestate", "rojo=1,congo=t61"),
        ]))
        .expect("a valid traceparent");
        assert_eq!(
            format!("{:032x}", sc.trace_id()),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(format!("{:016x}", sc.span_id()), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        assert_eq!(sc.trace_state().header(), "rojo=1,congo=t61");
    }

    #[test]
    fn parent_refuses_what_is_not_a_trace_context() {
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "not a trace context at all",
        ] {
            assert!(
                parent(&headers(&[("traceparent", bad)])).is_none(),
                "{bad:?}"
            );
        }
        assert!(parent(&headers(&[("tracestate", "rojo=1")])).is_none());
        assert!(
            parent(&headers(&[("traceparent", TP), ("traceparent", TP)])).is_none(),
            "two parents: neither"
        );
        // A later version: its fields as far as version 00 has them.
        let later = format!("01{}-more", &TP[2..]);
        assert!(parent(&headers(&[("traceparent", &later)])).is_some());
        let unsampled = format!("{}-00", &TP[..52]);
        assert!(!parent(&headers(&[("traceparent", &unsampled)]))
            .unwrap()
            .is_sampled());
        assert!(parent(&http::HeaderMap::new()).is_none());
    }

    #[test]
    fn a_long_or_malformed_tracestate_is_not_read() {
        let long = format!("a={}", "x".repeat(MAX_TRACESTATE));
        for bad in [long.as_str(), "no equals sign", "UPPER=1"] {
            let sc = parent(&headers(&[("traceparent", TP), ("tracestate", bad)])).unwrap();
            assert_eq!(sc.trace_state().header(), "", "{bad}");
        }
    }

    #[test]
    fn endpoints() {
        for ok in [
            "http://127.0.0.1:4317",
            "http://collector.monitoring:4317/",
            "http://[::1]:4317",
        ] {
            assert_eq!(check_otlp_endpoint(ok), Ok(()), "{ok}");
        }
        for bad in [
            "https://127.0.0.1:4317",
            "127.0.0.1:4317",
            "unix:///run/otel.sock",
            "http://127.0.0.1:4317/v1/traces",
            "http://",
        ] {
            assert!(check_otlp_endpoint(bad).is_err(), "{bad}");
        }
        assert!(check_otlp_endpoint(&format!("http://{}", "a".repeat(3000))).is_err());
    }
}
