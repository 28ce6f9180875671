//! How a relayed connection ends, and why its runtime connection did.

use crate::proxy::http2::{FrameError, Reason};

/// Why the relay closes a client connection.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The client's socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error from the client: {0}")]
    Protocol(Violation),
    #[error("client stopped answering keep-alive pings")]
    KeepAlive,
}

/// What a peer did that leaves the client connection unusable. [`Violation::reason`] is the
/// one mapping to the error code of the GOAWAY that closes it ([`super::core::Core`]'s
/// `protocol_error` writes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A frame of the client's that cannot be read: over the advertised frame size, or padding
    /// that does not fit.
    #[error("{0}")]
    Frame(FrameError),
    /// A frame of the runtime's that crisp cannot read (the client would fail on it too).
    #[error("from the runtime: {0}")]
    RuntimeFrame(FrameError),
    #[error("CONTINUATION without HEADERS")]
    StrayContinuation,
    #[error("header block interrupted")]
    InterruptedBlock,
    #[error("header block too large")]
    BlockTooLarge,
    #[error("header list too large")]
    ListTooLarge,
    #[error("undecodable header block")]
    UndecodableBlock,
    /// The client holds part of a header block that will never end.
    #[error("runtime connection failed inside a header block")]
    RuntimeGoneInBlock,
}

impl Violation {
    /// The error code of the GOAWAY that closes the client's connection for this violation
    /// (RFC 9113 §4.2, §5.4.1, §6.2, §6.10, §4.3).
    pub(crate) fn reason(self) -> Reason {
        match self {
            Violation::Frame(e) => e.reason(),
            // A header block crisp could not decode, or dropped undecoded, leaves the
            // connection's HPACK decoding context unknown (RFC 9113 §4.3).
            Violation::BlockTooLarge | Violation::ListTooLarge | Violation::UndecodableBlock => {
                Reason::COMPRESSION_ERROR
            }
            Violation::StrayContinuation | Violation::InterruptedBlock => Reason::PROTOCOL_ERROR,
            // The runtime's side failed: not the client's doing.
            Violation::RuntimeFrame(_) | Violation::RuntimeGoneInBlock => Reason::INTERNAL_ERROR,
        }
    }

    /// The GOAWAY's debug data: what crisp tells the client, no tenant text.
    pub(crate) fn debug_data(self) -> &'static [u8] {
        match self {
            Violation::Frame(FrameError::TooLarge { .. }) => {
                b"crisp: frame larger than SETTINGS_MAX_FRAME_SIZE"
            }
            Violation::Frame(_) => b"crisp: malformed frame",
            Violation::StrayContinuation => b"crisp: CONTINUATION without HEADERS",
            Violation::InterruptedBlock => b"crisp: header block interrupted",
            Violation::BlockTooLarge => b"crisp: header block too large",
            Violation::ListTooLarge => b"crisp: header list too large",
            Violation::UndecodableBlock => b"crisp: bad header block",
            Violation::RuntimeFrame(_) | Violation::RuntimeGoneInBlock => {
                b"crisp: runtime connection failed"
            }
        }
    }
}

impl From<Violation> for RelayError {
    fn from(v: Violation) -> RelayError {
        RelayError::Protocol(v)
    }
}

/// Why the runtime connection ended.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeFailure {
    /// The runtime closed it (end of file).
    #[error("connection closed")]
    Closed,
    /// Reading from it failed.
    #[error("{0}")]
    Read(std::io::Error),
    /// Writing to it failed.
    #[error("{0}")]
    Write(std::io::Error),
}

impl RuntimeFailure {
    pub(crate) fn writing(&self) -> bool {
        matches!(self, RuntimeFailure::Write(_))
    }
}
