//! How a relayed connection ends, and why its runtime connection did.

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

/// What a peer did that leaves the client connection unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("malformed HEADERS")]
    MalformedHeaders,
    #[error("malformed HEADERS from the runtime")]
    MalformedRuntimeHeaders,
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
