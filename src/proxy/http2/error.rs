//! What a frame that cannot be read fails with.

use super::Kind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// RFC 9113 gives this frame type a fixed (or minimum, or multiple-of) payload length.
    #[error("{kind:?} frame with a payload of {len} bytes")]
    BadLength { kind: Kind, len: usize },
}
