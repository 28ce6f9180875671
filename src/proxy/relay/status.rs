//! gRPC statuses on the relay's path: the code a relayed call ended with, and the endings crisp
//! itself gives calls.

use crate::status::code;

/// A gRPC status code. A newtype: the runtime may send any number, and it is reported as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code(pub i32);

impl Code {
    pub(crate) const CANCELLED: Code = Code(code::CANCELLED);
    pub(crate) const UNKNOWN: Code = Code(code::UNKNOWN);
    pub(crate) const UNAVAILABLE: Code = Code(code::UNAVAILABLE);

    /// A `grpc-status` value.
    pub(crate) fn parse(v: &[u8]) -> Option<Code> {
        // One or two digits, every code gRPC defines, without the general parse (run on
        // every relayed call's trailers).
        match *v {
            [d] if d.is_ascii_digit() => return Some(Code(i32::from(d - b'0'))),
            [t, u] if t.is_ascii_digit() && u.is_ascii_digit() => {
                return Some(Code(i32::from(t - b'0') * 10 + i32::from(u - b'0')))
            }
            _ => {}
        }
        std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i32>().ok())
            .map(Code)
    }
}

/// How a call ended, as the interceptors hear of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndStatus {
    pub(crate) code: Option<Code>,
    pub(crate) message: Option<String>,
}

impl EndStatus {
    /// The client reset the stream, or went away.
    pub(crate) fn cancelled() -> EndStatus {
        EndStatus {
            code: Some(Code::CANCELLED),
            message: None,
        }
    }

    /// The runtime answered: its `grpc-status` if it sent one that parses, else UNKNOWN. No
    /// grpc-message is decoded: a relayed call is one no interceptor asked to see in detail.
    pub(crate) fn answered(status: Option<Code>) -> EndStatus {
        EndStatus {
            code: status.or(Some(Code::UNKNOWN)),
            message: None,
        }
    }

    /// The runtime ended the stream with DATA, without trailers.
    pub(crate) fn without_status() -> EndStatus {
        EndStatus {
            code: None,
            message: None,
        }
    }

    /// The runtime connection ended under the call: crisp answers UNAVAILABLE with `msg`.
    pub(crate) fn runtime_gone(msg: &str) -> EndStatus {
        EndStatus {
            code: Some(Code::UNAVAILABLE),
            message: Some(msg.to_string()),
        }
    }

    /// The runtime's GOAWAY says it never processed the call: crisp refuses the stream, which
    /// gRPC clients retry transparently.
    pub(crate) fn refused(msg: &str) -> EndStatus {
        EndStatus {
            code: Some(Code::UNAVAILABLE),
            message: Some(format!("{msg} (refused, unprocessed)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Code;

    #[test]
    fn a_status_parses_as_the_general_integer_parse_does() {
        for v in [
            "0",
            "1",
            "9",
            "05",
            "10",
            "16",
            "99",
            "100",
            "-1",
            "+4",
            "",
            " 1",
            "1a",
            "a",
            "٣",
            "2147483647",
            "2147483648",
        ] {
            let general = v.parse::<i32>().ok().map(Code);
            assert_eq!(Code::parse(v.as_bytes()), general, "{v:?}");
        }
    }
}
