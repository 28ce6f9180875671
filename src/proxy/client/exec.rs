//! ExecSync, the one call crisp reads by hand: its answer carries the command's output (up to
//! 16 MiB per stream from containerd), which tonic's client would hold whole before decoding
//! it. Here the answer streams past an [`ExitCodeReader`] that keeps the exit code alone. The
//! request carries the headers tonic writes for the unary calls (`application/grpc`,
//! `te: trailers`, `grpc-timeout` to the millisecond, crisp's user agent), and a non-OK status
//! is read as theirs is.

use std::time::Duration;

use http::{HeaderValue, Method, Request};
use http_body_util::BodyExt;
use prost::Message;

use super::{ClientError, RuntimeClient, USER_AGENT};
use crate::cri::varint::Varint;
use crate::cri::views;
use crate::cri::wire;
use crate::cri::ApiVersion;
use crate::proxy::body::ProxyBody;
use crate::status::{code_of, message_of, Status};

impl RuntimeClient {
    /// The ExecSync request, hand-built: the runtime told of `timeout`.
    fn exec_request(
        &self,
        version: ApiVersion,
        req: &views::ExecSyncRequest,
        timeout: Duration,
    ) -> Result<Request<ProxyBody>, ClientError> {
        let uri = format!(
            "http://localhost/runtime.{}.RuntimeService/{METHOD}",
            version.as_str()
        );
        let mut r = Request::builder().method(Method::POST).uri(uri);
        let h = r.headers_mut().expect("builder has no error yet");
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert(http::header::TE, HeaderValue::from_static("trailers"));
        h.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        if let Ok(v) = HeaderValue::from_str(&crate::status::grpc_timeout_ms(timeout)) {
            h.insert("grpc-timeout", v);
        }
        r.body(ProxyBody::buffered(wire::frame(&req.encode_to_vec()), None))
            .map_err(|e| ClientError::Malformed {
                method: METHOD,
                detail: e.to_string(),
            })
    }

    /// Runs `cmd` in a container; returns its exit code. Everything happens within `timeout`:
    /// the runtime is told so (`grpc-timeout` to the millisecond; the request's own `timeout`,
    /// which counts whole seconds and reads 0 as "none", is the whole seconds left, at least 1),
    /// and crisp stops waiting — cancelling the call — when it runs out. The answer is read as
    /// it arrives and only its exit code kept ([`ExitCodeReader`]): the command's output (up to
    /// 16 MiB per stream from containerd) streams past and is never held: this call is built and
    /// read by hand, not through tonic, whose client decodes only a whole buffered message.
    pub async fn exec_sync(
        &self,
        version: ApiVersion,
        id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<i32, ClientError> {
        let secs = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX).max(1);
        let req = views::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.to_vec(),
            timeout: secs,
        };
        // The command has `timeout`; the call, that and the runtime's own time to start the
        // command and report it (a busy or slow runtime takes seconds).
        let deadline = timeout.saturating_add(EXEC_RUNTIME_SLACK);
        let request = self.exec_request(version, &req, deadline)?;
        let fut = async {
            let resp = self.pool.send(request).await?;
            let (parts, body) = resp.into_parts();
            if let Some(c) = code_of(&parts.headers) {
                return Err(status_error(METHOD, c, &parts.headers));
            }
            let mut body = ProxyBody::RuntimePool(body);
            let mut reader = ExitCodeReader::default();
            let mut trailers = None;
            let mut total = 0usize;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| ClientError::Malformed {
                    method: METHOD,
                    detail: e.to_string(),
                })?;
                match frame.into_data() {
                    Ok(d) => {
                        total = total.saturating_add(d.len());
                        if total > EXEC_MAX_READ {
                            return Err(ClientError::Malformed {
                                method: METHOD,
                                detail: format!("answer larger than {EXEC_MAX_READ} bytes"),
                            });
                        }
                        reader.feed(&d).map_err(|e| ClientError::Malformed {
                            method: METHOD,
                            detail: e.to_string(),
                        })?;
                    }
                    Err(frame) => trailers = frame.into_trailers().ok(),
                }
            }
            let trailers = trailers.unwrap_or_default();
            match code_of(&trailers) {
                Some(0) => {}
                Some(c) => return Err(status_error(METHOD, c, &trailers)),
                None => {
                    return Err(ClientError::Malformed {
                        method: METHOD,
                        detail: "no grpc-status".into(),
                    })
                }
            }
            reader.finish().map_err(|e| ClientError::Malformed {
                method: METHOD,
                detail: e.to_string(),
            })
        };
        tokio::time::timeout(deadline, fut)
            .await
            .map_err(|_| ClientError::Timeout {
                method: METHOD,
                timeout: deadline,
            })?
    }
}

const METHOD: &str = "ExecSync";

/// Most bytes of an ExecSync answer crisp reads (all of them streamed past, none kept):
/// containerd caps each of stdout and stderr at 16 MiB; a longer answer is not a runtime's.
const EXEC_MAX_READ: usize = 64 << 20;
/// How long an ExecSync call may outlast the command's own timeout: the runtime's time to start
/// the command and report its exit (kubelet gives its own exec probes its 2 min request
/// timeout; crisp, a bounded 2 s, as before issue #26). A probe's slot is held at most
/// `probe_timeout` and this.
pub const EXEC_RUNTIME_SLACK: Duration = Duration::from_secs(2);

/// `ExecSyncResponse.exit_code` (api.proto: stdout = 1, stderr = 2, exit_code = 3).
const EXIT_CODE_FIELD: u64 = 3;

/// Why an ExecSync answer could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum ExecAnswerError {
    #[error("compressed message (crisp accepts none)")]
    Compressed,
    #[error("more than one message")]
    Trailing,
    #[error("no message")]
    Empty,
    #[error("the body ends inside the message")]
    Truncated,
    #[error("a field runs past the message's end")]
    Overrun,
    #[error("a varint longer than 10 bytes")]
    LongVarint,
    #[error("field number 0")]
    FieldZero,
    #[error("wire type {0} (groups are not in the CRI)")]
    WireType(u8),
    #[error("exit_code with wire type {0}")]
    ExitCodeType(u8),
}

/// Reads an ExecSync answer's gRPC body chunk by chunk as it arrives and keeps only the exit
/// code: the 5-byte message prefix, then the message's fields by tag. A varint field 3 is the
/// exit code; every other field (stdout, stderr, any unknown one) is skipped by its length
/// without a byte of it being stored. Between chunks it holds a fixed-size state — at most a
/// partial prefix or varint (10 bytes) — however the body is cut.
#[derive(Debug, Default)]
struct ExitCodeReader {
    state: ReadState,
    /// Bytes of the message not read yet (once its prefix is in).
    left: u64,
    exit_code: i32,
}

#[derive(Debug, Clone, Copy)]
enum ReadState {
    /// The message prefix, `got` bytes of it so far.
    Prefix {
        buf: [u8; wire::PREFIX_LEN],
        got: usize,
    },
    /// A varint being read.
    Varint { of: VarintOf, varint: Varint },
    /// Bytes of a field to pass over.
    Skip(u64),
    /// The message is complete.
    Done,
}

#[derive(Debug, Clone, Copy)]
enum VarintOf {
    Key,
    Value(u64),
    Len,
}

impl Default for ReadState {
    fn default() -> Self {
        ReadState::Prefix {
            buf: [0; wire::PREFIX_LEN],
            got: 0,
        }
    }
}

impl ExitCodeReader {
    /// Reads the next chunk of the body.
    fn feed(&mut self, mut data: &[u8]) -> Result<(), ExecAnswerError> {
        while let Some((&first, _)) = data.split_first() {
            match &mut self.state {
                ReadState::Done => return Err(ExecAnswerError::Trailing),
                ReadState::Prefix { buf, got } => {
                    let n = (wire::PREFIX_LEN - *got).min(data.len());
                    buf[*got..*got + n].copy_from_slice(&data[..n]);
                    *got += n;
                    data = &data[n..];
                    if *got == wire::PREFIX_LEN {
                        if buf[0] != 0 {
                            return Err(ExecAnswerError::Compressed);
                        }
                        self.left = u64::from(u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]));
                        self.next_field();
                    }
                }
                ReadState::Skip(n) => {
                    let k = (*n).min(data.len() as u64);
                    *n -= k;
                    self.left -= k;
                    // `k` is at most `data.len()`, a usize.
                    data = &data[k as usize..];
                    if *n == 0 {
                        self.next_field();
                    }
                }
                ReadState::Varint { of, varint } => {
                    data = &data[1..];
                    self.left = self.left.checked_sub(1).ok_or(ExecAnswerError::Overrun)?;
                    let of = *of;
                    let pushed = varint.push(first);
                    let Some(value) = pushed.map_err(|_| ExecAnswerError::LongVarint)? else {
                        continue;
                    };
                    match of {
                        VarintOf::Key => self.key(value)?,
                        VarintOf::Value(field) => {
                            if field == EXIT_CODE_FIELD {
                                // As protobuf reads an int32: the low 32 bits of the varint.
                                self.exit_code = value as i32;
                            }
                            self.next_field();
                        }
                        VarintOf::Len => self.skip(value)?,
                    }
                }
            }
        }
        Ok(())
    }

    /// The exit code, once the whole body has been fed.
    fn finish(self) -> Result<i32, ExecAnswerError> {
        match self.state {
            ReadState::Done => Ok(self.exit_code),
            ReadState::Prefix { got: 0, .. } => Err(ExecAnswerError::Empty),
            ReadState::Varint { .. } | ReadState::Skip(_) if self.left == 0 => {
                Err(ExecAnswerError::Overrun)
            }
            _ => Err(ExecAnswerError::Truncated),
        }
    }

    fn key(&mut self, key: u64) -> Result<(), ExecAnswerError> {
        let (field, wire_type) = (key >> 3, (key & 7) as u8);
        if field == 0 {
            return Err(ExecAnswerError::FieldZero);
        }
        if field == EXIT_CODE_FIELD && wire_type != 0 {
            return Err(ExecAnswerError::ExitCodeType(wire_type));
        }
        match wire_type {
            0 => {
                self.state = ReadState::Varint {
                    of: VarintOf::Value(field),
                    varint: Varint::default(),
                }
            }
            1 => self.skip(8)?,
            2 => {
                self.state = ReadState::Varint {
                    of: VarintOf::Len,
                    varint: Varint::default(),
                }
            }
            5 => self.skip(4)?,
            t => return Err(ExecAnswerError::WireType(t)),
        }
        Ok(())
    }

    fn skip(&mut self, n: u64) -> Result<(), ExecAnswerError> {
        if n > self.left {
            return Err(ExecAnswerError::Overrun);
        }
        if n == 0 {
            self.next_field();
        } else {
            self.state = ReadState::Skip(n);
        }
        Ok(())
    }

    fn next_field(&mut self) {
        self.state = if self.left == 0 {
            ReadState::Done
        } else {
            ReadState::Varint {
                of: VarintOf::Key,
                varint: Varint::default(),
            }
        };
    }
}

/// The runtime's non-OK status, its message read as every grpc-message crisp reads
/// ([`crate::status::message_of`]: percent-decoded, bounded).
fn status_error(method: &'static str, code: i32, h: &http::HeaderMap) -> ClientError {
    ClientError::Status {
        method,
        status: Status::new(code, message_of(h).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `runtime.v1.ExecSyncResponse` as the runtime encodes it (fields in number order).
    #[derive(Clone, PartialEq, Message)]
    struct FullExecSyncResponse {
        #[prost(bytes = "vec", tag = "1")]
        stdout: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        stderr: Vec<u8>,
        #[prost(int32, tag = "3")]
        exit_code: i32,
    }

    fn read(chunks: &[&[u8]]) -> Result<i32, ExecAnswerError> {
        let mut r = ExitCodeReader::default();
        for c in chunks {
            r.feed(c)?;
        }
        r.finish()
    }

    #[test]
    fn exit_code_survives_every_cut_of_the_body() {
        for exit_code in [0, 1, 137, -1, i32::MIN, i32::MAX] {
            let msg = FullExecSyncResponse {
                stdout: b"ready\n".repeat(40),
                stderr: b"warn".to_vec(),
                exit_code,
            };
            let mut msg = msg.encode_to_vec();
            // Fields the view does not know are passed over too: fixed64 9, fixed32 10, varint 11.
            msg.extend_from_slice(&[
                (9 << 3) | 1,
                1,
                2,
                3,
                4,
                5,
                6,
                7,
                8,
                (10 << 3) | 5,
                1,
                2,
                3,
                4,
                11 << 3,
                0xff,
                0x01,
            ]);
            let body = wire::frame(&msg);
            assert_eq!(read(&[&body]), Ok(exit_code));
            for cut in 0..=body.len() {
                assert_eq!(
                    read(&[&body[..cut], &body[cut..]]),
                    Ok(exit_code),
                    "cut at {cut}"
                );
            }
            // One byte per chunk: the smallest chunks a body can come in.
            let bytes: Vec<&[u8]> = body.chunks(1).collect();
            assert_eq!(read(&bytes), Ok(exit_code));
        }
    }

    /// A 16 MiB stdout (containerd's cap) streams past in h2-sized chunks while the reader holds
    /// nothing but its fixed-size state.
    #[test]
    fn large_output_is_passed_over_not_held() {
        let msg = FullExecSyncResponse {
            stdout: vec![b'x'; 16 << 20],
            stderr: vec![b'y'; 1 << 20],
            exit_code: 3,
        }
        .encode_to_vec();
        let body = wire::frame(&msg);
        let mut r = ExitCodeReader::default();
        for c in body.chunks(16 << 10) {
            r.feed(c).unwrap();
        }
        assert_eq!(r.finish(), Ok(3));
        assert!(
            std::mem::size_of::<ExitCodeReader>() <= 64,
            "{}",
            std::mem::size_of::<ExitCodeReader>()
        );
    }

    #[test]
    fn malformed_answers_are_refused() {
        let ok = wire::frame(
            &FullExecSyncResponse {
                exit_code: 2,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(read(&[]), Err(ExecAnswerError::Empty));
        assert_eq!(
            read(&[&ok[..ok.len() - 1]]),
            Err(ExecAnswerError::Truncated)
        );
        assert_eq!(read(&[&ok[..3]]), Err(ExecAnswerError::Truncated));
        assert_eq!(read(&[&ok, &ok]), Err(ExecAnswerError::Trailing));
        let mut compressed = ok.to_vec();
        compressed[0] = 1;
        assert_eq!(read(&[&compressed]), Err(ExecAnswerError::Compressed));
        // A length past the message's end, however large (no allocation follows it).
        assert_eq!(
            read(&[&wire::frame(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f])]),
            Err(ExecAnswerError::Overrun)
        );
        assert_eq!(
            read(&[&wire::frame(&[0x0a, 5, 1])]),
            Err(ExecAnswerError::Overrun)
        );
        assert_eq!(
            read(&[&wire::frame(&[0x18])]),
            Err(ExecAnswerError::Overrun)
        );
        assert_eq!(
            read(&[&wire::frame(&[
                0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
            ])]),
            Err(ExecAnswerError::LongVarint)
        );
        assert_eq!(
            read(&[&wire::frame(&[0x00, 0x01])]),
            Err(ExecAnswerError::FieldZero)
        );
        assert_eq!(
            read(&[&wire::frame(&[0x0b])]),
            Err(ExecAnswerError::WireType(3))
        );
        assert_eq!(
            read(&[&wire::frame(&[0x1a, 0x00])]),
            Err(ExecAnswerError::ExitCodeType(2))
        );
        // An empty message is the default answer: exit code 0.
        assert_eq!(read(&[&wire::frame(&[])]), Ok(0));
    }
}
