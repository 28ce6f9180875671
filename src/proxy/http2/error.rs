//! What a frame that cannot be read fails with, and the error code RFC 9113 gives it.

use super::{Kind, Reason};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// RFC 9113 gives this frame type a fixed (or minimum, or multiple-of) payload length.
    #[error("{kind:?} frame with a payload of {len} bytes")]
    BadLength { kind: Kind, len: usize },
    /// Longer than the receiver advertised in SETTINGS_MAX_FRAME_SIZE (RFC 9113 §4.2).
    #[error("{kind:?} frame of {len} bytes, over the {max} advertised")]
    TooLarge { kind: Kind, len: usize, max: u32 },
    /// Its Pad Length (and priority fields) leave no room for the content (RFC 9113 §6.1,
    /// §6.2): padding as long as the payload or longer.
    #[error("{kind:?} frame whose padding is as long as its payload")]
    BadPadding { kind: Kind },
}

impl FrameError {
    /// The error code a connection closed for this frame carries: FRAME_SIZE_ERROR for a
    /// length RFC 9113 §4.2 and §6 forbid, PROTOCOL_ERROR for bad padding (§6.1, §6.2).
    pub(crate) fn reason(self) -> Reason {
        match self {
            FrameError::BadLength { .. } | FrameError::TooLarge { .. } => Reason::FRAME_SIZE_ERROR,
            FrameError::BadPadding { .. } => Reason::PROTOCOL_ERROR,
        }
    }
}
