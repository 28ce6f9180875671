//! What a relayed call's interceptors see of it as it passes ([`Interest::view`]): a bounded
//! copy of its request, a view of its answer and its grpc-message, built from the frames the
//! relay copies on anyway and handed on with the call's end ([`super::core::Event::Ended`]).
//! The call is never delayed for it: this is how a tap sees the polling calls without taking
//! them off the byte path (docs/TAP.md, "What a tap costs").
//!
//! [`Interest::view`]: crate::intercept::Interest::view

use bytes::{Bytes, BytesMut};

use crate::cri::skim::{Skim, SkimSpec, Skimmer};
use crate::intercept::MAX_VIEWED_REQUEST;

/// What the interceptors asked of a call that may be relayed: to hear of its end (`report`),
/// and to see it as it passes (`view`, [`Interest::view`](crate::intercept::Interest::view)).
#[derive(Debug, Default)]
pub(super) struct Asked {
    pub(super) report: bool,
    pub(super) view: Option<Box<Viewing>>,
}

/// A relayed call being viewed.
#[derive(Debug)]
pub(crate) struct Viewing {
    /// The request's body (gRPC-framed) so far; `None` once it grew past
    /// [`MAX_VIEWED_REQUEST`] (the view then has no request, never a part of one).
    request: Option<BytesMut>,
    /// The answer's view, as the interceptors asked for it (`None`: only the request).
    response: Option<Skimmer>,
    /// The answer's grpc-message (decoded and bounded as the observed path decodes it).
    message: Option<String>,
}

/// What a viewed call showed, handed on with its end.
#[derive(Debug, Default)]
pub struct Viewed {
    pub(crate) request: Option<Bytes>,
    pub(crate) response: Option<Skim>,
    pub(crate) message: Option<String>,
}

impl Viewing {
    /// A view whose answer is skimmed as `response` says (`None`: the request alone).
    pub(crate) fn new(response: Option<SkimSpec>) -> Viewing {
        Viewing {
            request: Some(BytesMut::new()),
            response: response.map(Skimmer::new),
            message: None,
        }
    }

    /// The next bytes of the request's body (a DATA frame's payload, padding removed).
    pub(crate) fn request(&mut self, data: &[u8]) {
        let Some(req) = &mut self.request else {
            return;
        };
        if req.len() + data.len() > MAX_VIEWED_REQUEST {
            self.request = None;
            return;
        }
        req.extend_from_slice(data);
    }

    /// The next bytes of the answer's body.
    pub(crate) fn response(&mut self, data: &[u8]) {
        if let Some(s) = &mut self.response {
            s.push(data);
        }
    }

    /// A grpc-message the answer carried (as sent: percent-encoded).
    pub(crate) fn message(&mut self, raw: &[u8]) {
        self.message = Some(crate::status::decode_message(raw));
    }

    pub(crate) fn finish(self) -> Viewed {
        Viewed {
            request: self.request.map(BytesMut::freeze),
            response: self.response.and_then(Skimmer::finish),
            message: self.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::wire;

    fn spec(budget: usize) -> SkimSpec {
        SkimSpec {
            budget,
            size_only: &[],
            items: None,
        }
    }

    /// The request is copied across DATA frames whole; the answer's view is the skimmer's,
    /// however its body was split; the message is decoded as the observed path decodes it.
    #[test]
    fn a_view_is_built_across_frames() {
        // ContainerStatusRequest { container_id: "abc" }
        let req = wire::frame(b"\x0a\x03abc");
        let resp = wire::frame(b"\x0a\x05hello\x12\x02hi");
        let mut v = Viewing::new(Some(spec(1024)));
        for part in req.chunks(2) {
            v.request(part);
        }
        for part in resp.chunks(3) {
            v.response(part);
        }
        v.message(b"not%20found");
        let seen = v.finish();
        assert_eq!(seen.request.as_deref(), Some(&req[..]));
        let skim = seen.response.expect("a response view");
        assert_eq!(skim.len, resp.len() as u64 - wire::PREFIX_LEN as u64);
        assert_eq!(&skim.kept[..], b"\x0a\x05hello\x12\x02hi");
        assert_eq!(seen.message.as_deref(), Some("not found"));
    }

    /// A request past the bound is not kept at all — never a prefix that would read as a
    /// whole, shorter message — and the copy stops growing at the bound.
    #[test]
    fn a_request_past_the_bound_is_dropped_not_cut() {
        let mut v = Viewing::new(None);
        let chunk = vec![0u8; 16 << 10];
        let mut fed = 0;
        while fed <= MAX_VIEWED_REQUEST {
            v.request(&chunk);
            fed += chunk.len();
            let held = v.request.as_ref().map_or(0, |r| r.len());
            assert!(held <= MAX_VIEWED_REQUEST, "{held}");
        }
        v.request(&chunk);
        let seen = v.finish();
        assert!(seen.request.is_none());
        assert!(seen.response.is_none(), "no view asked of the answer");
    }
}
