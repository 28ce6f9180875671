//! The admin socket's HTTP side: `/healthz`, `/debug/connections`, `/metrics`, and the mux
//! that sends gRPC to the service.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tonic::codegen::Service;

use crate::admin_api::admin_server::AdminServer;

use super::*;

/// `GET /healthz`: `ok`, or 503 with why crisp is not making progress; either with the age of
/// the verdict. A verdict older than the supervisor's rounds allow is no verdict: 503 too (the
/// supervisor itself is not running).
pub(super) async fn healthz(state: &AdminState) -> Response<Body> {
    let Some(w) = &state.watchdog else {
        return plain(StatusCode::OK, "ok (no watchdog)\n".into());
    };
    let (verdict, age) = w.verdict_aged(std::time::Instant::now());
    let age_s = age.as_secs_f64();
    if age >= w.stale_after() {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no verdict for {age_s:.3}s: the watchdog's supervisor is not running (verdict \
                 age {age_s:.3}s)\n"
            ),
        );
    }
    match verdict {
        Ok(()) => plain(StatusCode::OK, format!("ok (verdict age {age_s:.3}s)\n")),
        Err(why) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{why} (verdict age {age_s:.3}s)\n"),
        ),
    }
}

/// `GET /debug/connections`: every kubelet connection crisp relays, one line each, then its
/// streams in flight — what its relay thread answered within 200 ms, or that it did not.
pub(super) async fn connections(state: &AdminState) -> Response<Body> {
    use std::fmt::Write;
    let Some(w) = &state.watchdog else {
        return plain(StatusCode::NOT_FOUND, "no watchdog\n".into());
    };
    let mut out = String::new();
    for c in w.connections(Duration::from_millis(200)).await {
        let _ = write!(
            out,
            "connection {} age {:.3}s {} for {:.3}s{}",
            c.id,
            c.age.as_secs_f64(),
            if c.waiting { "waiting" } else { "working" },
            c.for_.as_secs_f64(),
            if c.closed { " CLOSED-BY-WATCHDOG" } else { "" },
        );
        match c.report {
            None => out.push_str(" (its thread did not answer within 200 ms)\n"),
            Some(r) => {
                let _ = writeln!(
                    out,
                    " streams {} queued-to-client {} B queued-to-runtime {} B{}{}",
                    r.streams.len(),
                    r.queued_to_client,
                    r.queued_to_runtime,
                    if r.degraded { " degraded" } else { "" },
                    if r.going_away { " going-away" } else { "" },
                );
                for (id, route, age) in r.streams {
                    let _ = writeln!(out, "  stream {id} {route} age {:.3}s", age.as_secs_f64());
                }
            }
        }
    }
    if out.is_empty() {
        out.push_str("no connections\n");
    }
    plain(StatusCode::OK, out)
}

pub(super) type Body = tonic::body::Body;

pub(super) fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Body::new(Full::new(Bytes::from(text))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

pub(super) async fn handle(
    mut req: Request<Incoming>,
    state: Arc<AdminState>,
    grpc: Option<AdminServer<AdminService>>,
    peer: Peer,
) -> Result<Response<Body>, Infallible> {
    if req.uri().path() == "/metrics" {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return Ok(plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET /metrics\n".into(),
            ));
        }
        let mut r = plain(StatusCode::OK, render_metrics(&state));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        );
        return Ok(r);
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => return Ok(healthz(&state).await),
        (&Method::GET, "/debug/connections") if grpc.is_some() => {
            return Ok(connections(&state).await)
        }
        _ => {}
    }
    let is_grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    match grpc {
        Some(mut svc) if is_grpc => {
            req.extensions_mut().insert(peer);
            svc.call(req).await
        }
        // gRPC over the metrics-only TCP listener: a proper gRPC error, not an HTTP one.
        None if is_grpc => {
            let mut r = Response::new(Body::empty());
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert(
                "grpc-status",
                HeaderValue::from(tonic::Code::Unimplemented as i32),
            );
            h.insert(
                "grpc-message",
                HeaderValue::from_static("crisp serves its admin API on the admin socket only"),
            );
            Ok(r)
        }
        _ => Ok(plain(
            StatusCode::NOT_FOUND,
            "crisp admin: GET /metrics, /healthz, /debug/connections, or the gRPC service \
             crisp.admin.v1.Admin\n"
                .into(),
        )),
    }
}
