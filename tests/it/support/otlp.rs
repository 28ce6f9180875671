//! An OTLP/gRPC trace receiver built from the collector's own service definition
//! (`opentelemetry-proto`'s `TraceService`): every exported span, with the `service.name` of the
//! resource that sent it. `hold_spans.rs` takes crisp's spans from it; the kubelet lanes
//! (`cluster_kubelets.rs`) take kubelet's and crisp's from one receiver on the node's loopback.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::mpsc;

/// One exported span and the `service.name` of its resource (empty when it had none).
#[derive(Debug, Clone)]
pub struct Exported {
    pub service: String,
    pub span: Span,
}

struct Receiver(mpsc::UnboundedSender<Exported>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone());
            let service = match service {
                Some(Value::StringValue(s)) => s,
                _ => String::new(),
            };
            for ss in rs.scope_spans {
                for span in ss.spans {
                    let _ = self.0.send(Exported {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Serves the receiver on `l` (from the caller's tokio runtime): the spans as they arrive.
pub fn otlp_receiver(l: tokio::net::TcpListener) -> mpsc::UnboundedReceiver<Exported> {
    let (tx, rx) = mpsc::unbounded_channel();
    let incoming = futures_util::stream::unfold(l, |l| async move {
        let conn = l.accept().await.map(|(s, _)| s);
        Some((conn, l))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Receiver(tx)))
            .serve_with_incoming(incoming),
    );
    rx
}

/// A span attribute's value.
pub fn span_attr(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
}

/// Trace and span ids as W3C `traceparent` writes them.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
