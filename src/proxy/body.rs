//! The one body type crisp sends in both directions: either the peer's body spliced through
//! frame by frame, or bytes crisp buffered (for an observed call) with their trailers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// What a body fails with: the runtime connection's error, or the relay's reason.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A forwarded body.
#[derive(Debug)]
pub enum ProxyBody {
    /// The runtime's response body, forwarded as it arrives (back-pressure comes from HTTP/2
    /// flow control).
    RuntimePool(hyper::body::Incoming),
    /// A request body arriving on a relayed connection, a diverted stream's (see
    /// [`super::relay`]).
    Channel(ChannelBody),
    /// Buffered data (one or more frames) followed by optional trailers.
    Buffered {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
}

impl Default for ProxyBody {
    fn default() -> Self {
        ProxyBody::empty()
    }
}

impl ProxyBody {
    pub(crate) fn empty() -> Self {
        ProxyBody::Buffered {
            data: None,
            trailers: None,
        }
    }

    pub(crate) fn buffered(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        let data = (!data.is_empty()).then_some(data);
        ProxyBody::Buffered { data, trailers }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut *self {
            ProxyBody::RuntimePool(inner) => Pin::new(inner).poll_frame(cx).map_err(BoxError::from),
            ProxyBody::Channel(inner) => Pin::new(inner).poll_frame(cx),
            ProxyBody::Buffered { data, trailers } => {
                if let Some(d) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::RuntimePool(inner) => inner.is_end_stream(),
            ProxyBody::Channel(inner) => inner.is_end_stream(),
            ProxyBody::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::RuntimePool(inner) => inner.size_hint(),
            ProxyBody::Channel(_) => SizeHint::default(),
            // Deliberately inexact: an exact hint makes hyper add a content-length header the
            // client never sent, and crisp forwards headers byte-exact.
            ProxyBody::Buffered { .. } => SizeHint::default(),
        }
    }
}

/// What a body fed through a channel receives: data, or trailers (which end it).
pub(crate) enum BodyPart {
    Data(Bytes),
    Trailers(HeaderMap),
}

/// A body fed through a channel; `consumed` hears of each data chunk as it is read (the relay
/// gives the client that much stream credit back).
pub struct ChannelBody {
    rx: tokio::sync::mpsc::UnboundedReceiver<BodyPart>,
    consumed: Box<dyn Fn(usize) + Send + Sync>,
    done: bool,
}

impl ChannelBody {
    pub(crate) fn new(
        rx: tokio::sync::mpsc::UnboundedReceiver<BodyPart>,
        consumed: Box<dyn Fn(usize) + Send + Sync>,
    ) -> ChannelBody {
        ChannelBody {
            rx,
            consumed,
            done: false,
        }
    }
}

impl std::fmt::Debug for ChannelBody {
    fn fmt(&self, fmt: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fmt.debug_struct("ChannelBody")
            .field("done", &self.done)
            .finish()
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(BodyPart::Trailers(t))) => {
                self.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Poll::Ready(Some(BodyPart::Data(b))) => {
                if !b.is_empty() {
                    (self.consumed)(b.len());
                }
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// Collects a body into (data, trailers), refusing more than `limit` bytes of data.
pub(crate) async fn collect(
    mut body: ProxyBody,
    limit: usize,
) -> Result<(Bytes, Option<HeaderMap>), CollectError> {
    use http_body_util::BodyExt;
    let mut first: Option<Bytes> = None;
    let mut rest: Option<bytes::BytesMut> = None;
    let mut trailers = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(CollectError::Peer)?;
        match frame.into_data() {
            Ok(d) => {
                total += d.len();
                if total > limit {
                    return Err(CollectError::TooLarge(limit));
                }
                // The common unary case is a single DATA frame: keep it without copying.
                match (&mut first, &mut rest) {
                    (None, _) => first = Some(d),
                    (Some(f), None) => {
                        let mut b = bytes::BytesMut::with_capacity(f.len() + d.len());
                        b.extend_from_slice(f);
                        b.extend_from_slice(&d);
                        rest = Some(b);
                    }
                    (Some(_), Some(b)) => b.extend_from_slice(&d),
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    let data = match rest {
        Some(b) => b.freeze(),
        None => first.unwrap_or_default(),
    };
    Ok((data, trailers))
}

/// What [`collect_within`] found: the whole body, or the part read when it went past the limit
/// and the rest of it, unread.
pub(crate) enum Collected {
    Whole(Bytes, Option<HeaderMap>),
    Over { head: Bytes, rest: ProxyBody },
}

/// Collects a body while it stays within `limit` bytes of data; past it, stops reading and hands
/// back what it read and the body, so that the rest streams on unheld.
pub(crate) async fn collect_within(
    mut body: ProxyBody,
    limit: usize,
) -> Result<Collected, BoxError> {
    use http_body_util::BodyExt;
    let mut data = bytes::BytesMut::new();
    let mut first: Option<Bytes> = None;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        match frame?.into_data() {
            Ok(d) => {
                let total = first.as_ref().map_or(0, Bytes::len) + data.len() + d.len();
                // The common unary case is a single DATA frame: keep it without copying.
                if first.is_none() && data.is_empty() {
                    first = Some(d);
                } else {
                    if let Some(f) = first.take() {
                        data.extend_from_slice(&f);
                    }
                    data.extend_from_slice(&d);
                }
                if total > limit {
                    let head = first.take().unwrap_or_else(|| data.split().freeze());
                    return Ok(Collected::Over { head, rest: body });
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    let data = first.unwrap_or_else(|| data.freeze());
    Ok(Collected::Whole(data, trailers))
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CollectError {
    #[error("peer body error: {0}")]
    Peer(BoxError),
    #[error("message larger than {0} bytes")]
    TooLarge(usize),
}
