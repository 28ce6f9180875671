//! A bounded view of one gRPC message, built as its bytes pass (issue #33): what the tap and the
//! trace log show of a call, at a cost set by what they show, not by the message.
//!
//! A [`Skimmer`] is fed a body's bytes in whatever pieces they arrive and walks the top level of
//! the protobuf message behind the gRPC prefix. Each top-level field is either kept whole (while
//! the kept bytes stay within the budget) or *cut*: only its number, wire type and length — read
//! from the wire, never by decoding its content — are noted, and its bytes pass by unheld.
//! Fields named size-only (ExecSync's stdout and stderr: the tap shows their size, never their
//! content) are always cut. The kept fields are a valid protobuf message of their own, which the
//! tap decodes with the method's type; the cut ones it shows by size.

use bytes::{Bytes, BytesMut};

use super::varint::Varint;
use super::wire::PREFIX_LEN;

/// Most cut fields listed one by one; beyond it they are only counted.
pub const MAX_CUT_LISTED: usize = 64;

/// What to keep of a message.
#[derive(Debug, Clone, Copy)]
pub struct SkimSpec {
    /// Most bytes of whole top-level fields kept. A budget of 0 keeps nothing and lists no cut
    /// field either (they are only counted): a view for the message's size and items alone,
    /// which allocates nothing.
    pub budget: usize,
    /// Top-level field numbers never kept (shown by size only).
    pub size_only: &'static [u32],
    /// The top-level field whose occurrences are counted ([`Skim::items`]): a streamed list's
    /// repeated field (`containers` of a StreamContainersResponse), kept or cut alike.
    pub items: Option<u32>,
}

/// A top-level field shown by its size only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub number: u32,
    pub wire_type: u8,
    /// The field's payload length, from the wire.
    pub len: u64,
}

/// What a [`Skimmer`] saw of one message.
#[derive(Debug, Clone, Default)]
pub struct Skim {
    /// The message's length, from its gRPC prefix.
    pub len: u64,
    /// Compressed with a codec crisp does not decode: nothing of it was walked.
    pub compressed: bool,
    /// The top-level fields kept whole, in their order: a valid protobuf message.
    pub kept: Bytes,
    /// Fields cut, in order, at most [`MAX_CUT_LISTED`].
    pub cut: Vec<Cut>,
    /// Fields cut beyond those listed, and their bytes on the wire.
    pub cut_more: u64,
    pub cut_more_bytes: u64,
    /// Why the walk stopped before the message's end (a malformed message, a group, a body
    /// that ended early); the rest of the message is not shown.
    pub stopped: Option<&'static str>,
    /// Bytes after the first message (a unary body holds one).
    pub trailing: u64,
    /// Occurrences of the spec's `items` field at the top level, whether kept or cut: read
    /// from the keys on the wire, whatever the budget.
    pub items: u64,
}

impl Skim {
    /// Whether anything of the message is not in `kept`.
    #[cfg(any(test, feature = "test-util"))]
    pub fn truncated(&self) -> bool {
        !self.cut.is_empty() || self.cut_more > 0 || self.stopped.is_some() || self.compressed
    }

    /// Bytes this view holds in memory.
    pub fn weight(&self) -> usize {
        self.kept.len() + self.cut.len() * std::mem::size_of::<Cut>()
    }

    /// The view of a whole framed body (a buffered request).
    pub fn of_framed(spec: SkimSpec, framed: &[u8]) -> Option<Skim> {
        let mut s = Skimmer::new(spec);
        s.push(framed);
        s.finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the 5-byte gRPC prefix.
    Prefix,
    /// Reading a field's key (a varint).
    Key,
    /// Reading a varint value.
    Varint,
    /// Reading a fixed-size value of this many bytes.
    Fixed(usize),
    /// Reading a length-delimited field's length.
    Len,
    /// Copying this many more payload bytes into `kept`.
    Keep(u64),
    /// Passing over this many more payload bytes.
    Skip(u64),
    /// Passing over the rest of the message, unwalked.
    Rest,
    /// The message is over.
    After,
}

/// Builds a [`Skim`] from a body's bytes as they pass; holds at most the spec's budget.
#[derive(Debug)]
pub struct Skimmer {
    spec: SkimSpec,
    state: State,
    /// The prefix, or the current field's key and value/length bytes.
    hdr: [u8; 24],
    hdr_len: usize,
    /// Where the key ends in `hdr`.
    key_end: usize,
    /// The key, value or length being read (its bytes are in `hdr` too).
    varint: Varint,
    number: u32,
    wire_type: u8,
    /// Message bytes still to come after the prefix.
    left: u64,
    kept: BytesMut,
    skim: Skim,
    started: bool,
}

impl Skimmer {
    pub fn new(spec: SkimSpec) -> Skimmer {
        Skimmer {
            spec,
            state: State::Prefix,
            hdr: [0; 24],
            hdr_len: 0,
            key_end: 0,
            varint: Varint::default(),
            number: 0,
            wire_type: 0,
            left: 0,
            kept: BytesMut::new(),
            skim: Skim::default(),
            started: false,
        }
    }

    /// Feeds the next bytes of the body.
    pub fn push(&mut self, mut data: &[u8]) {
        if !data.is_empty() {
            self.started = true;
        }
        while !data.is_empty() {
            if self.state == State::After {
                self.skim.trailing += data.len() as u64;
                return;
            }
            if self.state == State::Prefix {
                let n = (PREFIX_LEN - self.hdr_len).min(data.len());
                self.hdr[self.hdr_len..self.hdr_len + n].copy_from_slice(&data[..n]);
                self.hdr_len += n;
                data = &data[n..];
                if self.hdr_len == PREFIX_LEN {
                    let h = &self.hdr;
                    self.skim.len = u64::from(u32::from_be_bytes([h[1], h[2], h[3], h[4]]));
                    self.skim.compressed = h[0] != 0;
                    self.left = self.skim.len;
                    self.hdr_len = 0;
                    self.state = if self.skim.compressed {
                        State::Rest
                    } else {
                        State::Key
                    };
                    self.settle();
                }
                continue;
            }
            // Inside the message: never past its end.
            let avail = data
                .len()
                .min(usize::try_from(self.left).unwrap_or(usize::MAX));
            let (now, _) = data.split_at(avail);
            let used = self.step(now);
            data = &data[used..];
            self.left -= used as u64;
            self.settle();
        }
    }

    /// At the message's end: done, or stopped mid-field.
    fn settle(&mut self) {
        if self.left > 0 || self.state == State::After {
            return;
        }
        match self.state {
            State::Key | State::Rest => {}
            State::Keep(0) | State::Skip(0) => {}
            _ => self.stop("the message ends inside a field"),
        }
        self.state = State::After;
    }

    fn stop(&mut self, why: &'static str) {
        if self.skim.stopped.is_none() {
            self.skim.stopped = Some(why);
        }
        self.state = State::Rest;
    }

    /// Consumes a prefix of `data` (all of it within the message); returns how much.
    fn step(&mut self, data: &[u8]) -> usize {
        match self.state {
            State::Prefix | State::After => unreachable!("handled by push"),
            State::Rest => data.len(),
            State::Keep(left) => {
                let n = data.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                self.kept.extend_from_slice(&data[..n]);
                self.state = State::Keep(left - n as u64);
                if left == n as u64 {
                    self.state = State::Key;
                }
                n
            }
            State::Skip(left) => {
                let n = data.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                self.state = State::Skip(left - n as u64);
                if left == n as u64 {
                    self.state = State::Key;
                }
                n
            }
            State::Key | State::Varint | State::Len => {
                let b = data[0];
                let value = match self.varint.push(b) {
                    Ok(value) if self.hdr_len < self.hdr.len() => value,
                    _ => {
                        self.stop("a varint longer than 10 bytes");
                        return 1;
                    }
                };
                self.hdr[self.hdr_len] = b;
                self.hdr_len += 1;
                if let Some(value) = value {
                    self.varint = Varint::default();
                    self.varint_done(value);
                }
                1
            }
            State::Fixed(need) => {
                let n = (need - (self.hdr_len - self.key_end)).min(data.len());
                self.hdr[self.hdr_len..self.hdr_len + n].copy_from_slice(&data[..n]);
                self.hdr_len += n;
                if self.hdr_len - self.key_end == need {
                    self.field_done(need as u64);
                }
                n
            }
        }
    }

    fn varint_done(&mut self, value: u64) {
        match self.state {
            State::Key => {
                let key = value;
                self.key_end = self.hdr_len;
                self.number = u32::try_from(key >> 3).unwrap_or(0);
                self.wire_type = (key & 7) as u8;
                if self.number == 0 {
                    return self.stop("field number 0");
                }
                if self.spec.items == Some(self.number) {
                    self.skim.items += 1;
                }
                self.state = match self.wire_type {
                    0 => State::Varint,
                    1 => State::Fixed(8),
                    5 => State::Fixed(4),
                    2 => State::Len,
                    _ => return self.stop("a group (wire types 3 and 4) is not walked"),
                };
            }
            State::Varint => self.field_done((self.hdr_len - self.key_end) as u64),
            State::Len => {
                let len = value;
                if len > self.left - 1 {
                    return self.stop("a field longer than the message");
                }
                let whole = self.hdr_len as u64 + len;
                if self.keeps(whole) {
                    self.kept.extend_from_slice(&self.hdr[..self.hdr_len]);
                    self.state = State::Keep(len);
                } else {
                    self.cut(len);
                    self.state = State::Skip(len);
                }
                self.hdr_len = 0;
                self.key_end = 0;
                // A zero-length field is over already.
                if len == 0 {
                    self.state = State::Key;
                }
            }
            _ => unreachable!("only varints end here"),
        }
    }

    /// A varint or fixed field, all of it in `hdr`.
    fn field_done(&mut self, len: u64) {
        if self.keeps(self.hdr_len as u64) {
            self.kept.extend_from_slice(&self.hdr[..self.hdr_len]);
        } else {
            self.cut(len);
        }
        self.hdr_len = 0;
        self.key_end = 0;
        self.state = State::Key;
    }

    fn keeps(&self, whole: u64) -> bool {
        !self.spec.size_only.contains(&self.number)
            && self.kept.len() as u64 + whole <= self.spec.budget as u64
    }

    fn cut(&mut self, len: u64) {
        if self.spec.budget > 0 && self.skim.cut.len() < MAX_CUT_LISTED {
            self.skim.cut.push(Cut {
                number: self.number,
                wire_type: self.wire_type,
                len,
            });
        } else {
            self.skim.cut_more += 1;
            self.skim.cut_more_bytes += len;
        }
    }

    /// The view; `None` when no byte came (a trailers-only answer).
    pub fn finish(mut self) -> Option<Skim> {
        if !self.started {
            return None;
        }
        if self.state != State::After {
            if self.state == State::Prefix {
                self.skim.stopped = Some("the body ends inside the gRPC prefix");
            } else if self.skim.stopped.is_none() {
                self.skim.stopped = Some("the body ends before the message does");
            }
        }
        self.skim.kept = self.kept.freeze();
        Some(self.skim)
    }
}

/// One message of a server stream as a [`StreamSkimmer`] saw it.
#[derive(Debug, Clone)]
pub struct StreamedMessage {
    /// Its place in the stream, from 0.
    pub index: u64,
    /// Its bytes on the wire, the gRPC prefix included.
    pub wire_len: u64,
    pub view: Skim,
}

/// Splits a server stream's body into its gRPC messages as the bytes pass, and builds a
/// [`Skim`] of each with the same spec: what a tap shows of a streamed call, message by
/// message. Holds one message's view at a time (at most the spec's budget), never a message.
#[derive(Debug)]
pub struct StreamSkimmer {
    spec: SkimSpec,
    current: Skimmer,
    /// Bytes of the current message's prefix seen so far (up to [`PREFIX_LEN`]).
    prefix: [u8; PREFIX_LEN],
    prefix_len: usize,
    /// Message bytes still to come after the prefix, once the prefix is read.
    left: Option<u64>,
    /// Bytes of the current message seen so far, its prefix included.
    seen: u64,
    next_index: u64,
}

impl StreamSkimmer {
    pub fn new(spec: SkimSpec) -> StreamSkimmer {
        StreamSkimmer {
            spec,
            current: Skimmer::new(spec),
            prefix: [0; PREFIX_LEN],
            prefix_len: 0,
            left: None,
            seen: 0,
            next_index: 0,
        }
    }

    /// Messages completed so far.
    #[cfg(test)]
    pub fn messages(&self) -> u64 {
        self.next_index
    }

    /// Feeds the next bytes of the body; `done` gets each message completed by them, in order.
    pub fn push(&mut self, mut data: &[u8], mut done: impl FnMut(StreamedMessage)) {
        while !data.is_empty() {
            let n = match self.left {
                None => {
                    let n = (PREFIX_LEN - self.prefix_len).min(data.len());
                    self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
                    self.prefix_len += n;
                    if self.prefix_len == PREFIX_LEN {
                        self.left = Some(self.declared());
                    }
                    n
                }
                Some(left) => {
                    let n = data.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    self.left = Some(left - n as u64);
                    n
                }
            };
            self.current.push(&data[..n]);
            self.seen += n as u64;
            data = &data[n..];
            if self.left == Some(0) {
                self.finish_message(&mut done);
            }
        }
    }

    /// The current message's length, from its prefix.
    fn declared(&self) -> u64 {
        let p = &self.prefix;
        u64::from(u32::from_be_bytes([p[1], p[2], p[3], p[4]]))
    }

    fn finish_message(&mut self, done: &mut impl FnMut(StreamedMessage)) {
        let skimmer = std::mem::replace(&mut self.current, Skimmer::new(self.spec));
        let wire_len = std::mem::take(&mut self.seen);
        self.prefix_len = 0;
        self.left = None;
        if let Some(view) = skimmer.finish() {
            let index = self.next_index;
            self.next_index += 1;
            done(StreamedMessage {
                index,
                wire_len,
                view,
            });
        }
    }

    /// At the body's end: the message cut short (the stream ended inside it), if any; its view
    /// says where it stopped.
    pub fn finish(self) -> Option<StreamedMessage> {
        let (index, wire_len) = (self.next_index, self.seen);
        self.current.finish().map(|view| StreamedMessage {
            index,
            wire_len,
            view,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::wire;
    use prost::Message;

    const SPEC: SkimSpec = SkimSpec {
        budget: 100,
        size_only: &[],
        items: None,
    };

    fn exec(stdout: usize, stderr: usize, code: i32) -> Bytes {
        wire::frame(
            &k8s_cri::v1::ExecSyncResponse {
                stdout: vec![b'x'; stdout],
                stderr: vec![b'y'; stderr],
                exit_code: code,
            }
            .encode_to_vec(),
        )
    }

    /// The same view whatever the pieces the body comes in.
    fn in_pieces(spec: SkimSpec, body: &[u8], piece: usize) -> Skim {
        let mut s = Skimmer::new(spec);
        for c in body.chunks(piece) {
            s.push(c);
        }
        s.finish().unwrap()
    }

    #[test]
    fn small_messages_are_kept_whole() {
        let body = exec(3, 2, 7);
        for piece in [1, 2, 3, 7, body.len()] {
            let s = in_pieces(SPEC, &body, piece);
            assert_eq!(&s.kept[..], &body[5..], "pieces of {piece}");
            assert!(!s.truncated());
            assert_eq!(s.len, body.len() as u64 - 5);
            assert_eq!(s.trailing, 0);
        }
    }

    #[test]
    fn big_fields_are_cut_and_the_later_small_ones_kept() {
        let body = exec(1000, 300, 7);
        for piece in [1, 5, 64, body.len()] {
            let s = in_pieces(SPEC, &body, piece);
            assert_eq!(
                s.cut,
                [
                    Cut {
                        number: 1,
                        wire_type: 2,
                        len: 1000
                    },
                    Cut {
                        number: 2,
                        wire_type: 2,
                        len: 300
                    }
                ]
            );
            let kept = k8s_cri::v1::ExecSyncResponse::decode(&s.kept[..]).unwrap();
            assert_eq!(kept.exit_code, 7);
            assert!(s.truncated());
        }
        // Size-only fields are cut however small.
        let spec = SkimSpec {
            budget: 100,
            size_only: &[1, 2],
            items: None,
        };
        let s = in_pieces(spec, &exec(1, 1, 0), 1);
        assert_eq!(s.cut.len(), 2);
        assert!(s.kept.is_empty(), "exit code 0 is not on the wire");
    }

    #[test]
    fn what_is_wrong_is_said_and_nothing_panics() {
        // Ends early.
        let body = exec(10, 0, 1);
        let s = in_pieces(SPEC, &body[..body.len() - 2], 3);
        assert_eq!(s.stopped, Some("the body ends before the message does"));
        // A field longer than the message.
        let s = in_pieces(SPEC, &[0, 0, 0, 0, 3, 0x0a, 0x7f, 0], 1);
        assert_eq!(s.stopped, Some("a field longer than the message"));
        // A group.
        let s = in_pieces(SPEC, &[0, 0, 0, 0, 2, 0x0b, 0x0c], 1);
        assert!(s.stopped.unwrap().contains("group"));
        // Compressed: not walked.
        let s = in_pieces(SPEC, &[1, 0, 0, 0, 2, 0x0b, 0x0c], 1);
        assert!(s.compressed && s.kept.is_empty() && s.stopped.is_none());
        // A second message.
        let mut two = body.to_vec();
        two.extend_from_slice(&body);
        assert_eq!(in_pieces(SPEC, &two, 4).trailing, body.len() as u64);
        // Many big fields: listed up to the bound, then counted.
        let mut msg = Vec::new();
        for _ in 0..100 {
            msg.extend_from_slice(&[0x0a, 0x7f]);
            msg.extend_from_slice(&[0; 0x7f]);
        }
        let s = in_pieces(SPEC, &wire::frame(&msg), 1000);
        assert_eq!(s.cut.len(), MAX_CUT_LISTED);
        assert_eq!(s.cut_more, 100 - MAX_CUT_LISTED as u64);
        assert_eq!(s.cut_more_bytes, (100 - MAX_CUT_LISTED as u64) * 0x7f);
        // No bytes: no view.
        assert!(Skimmer::new(SPEC).finish().is_none());
    }

    /// A streamed list's message: `n` items of field 1 of ~`size` bytes each.
    fn list_message(n: usize, size: usize) -> Bytes {
        let mut msg = Vec::new();
        for _ in 0..n {
            msg.push(0x0a);
            prost::encoding::encode_varint(size as u64, &mut msg);
            msg.extend(std::iter::repeat_n(7u8, size));
        }
        wire::frame(&msg)
    }

    #[test]
    fn a_stream_is_split_into_its_messages_whatever_the_pieces() {
        let spec = SkimSpec {
            budget: 100,
            size_only: &[],
            items: Some(1),
        };
        let msgs: Vec<Bytes> = (0..5).map(|i| list_message(i * 3, 40)).collect();
        let body: Vec<u8> = msgs.concat();
        for piece in [1, 2, 5, 7, 64, 1000, body.len()] {
            let mut s = StreamSkimmer::new(spec);
            let mut got = Vec::new();
            for c in body.chunks(piece) {
                s.push(c, |m| got.push(m));
            }
            assert!(s.finish().is_none(), "pieces of {piece}: nothing left over");
            assert_eq!(got.len(), 5, "pieces of {piece}");
            for (i, m) in got.iter().enumerate() {
                assert_eq!(m.index, i as u64);
                assert_eq!(m.wire_len, msgs[i].len() as u64, "pieces of {piece}");
                assert_eq!(m.view.items, i as u64 * 3, "pieces of {piece}");
                assert_eq!(m.view.len, msgs[i].len() as u64 - 5);
                assert!(m.view.stopped.is_none() && m.view.trailing == 0);
                // Two items of 42 bytes fit the budget of 100; the rest are cut.
                assert_eq!(m.view.kept.len(), (i * 3).min(2) * 42);
            }
        }
        // A stream that ends inside a message: that message, stopped.
        let mut s = StreamSkimmer::new(spec);
        s.push(&body[..body.len() - 3], |_| {});
        let last = s.finish().expect("the cut message");
        assert_eq!(last.index, 4);
        assert_eq!(
            last.view.stopped,
            Some("the body ends before the message does")
        );
    }

    /// The view of each message holds at most the budget, however big the messages; with a
    /// budget of 0 it holds nothing and lists nothing (sizes and items only).
    #[test]
    fn a_streamed_message_view_is_bounded_by_the_budget() {
        let big = list_message(100, 1000);
        for (budget, most) in [(0, 0), (4096, 4096)] {
            let spec = SkimSpec {
                budget,
                size_only: &[],
                items: Some(1),
            };
            let mut s = StreamSkimmer::new(spec);
            let mut n = 0;
            for _ in 0..150 {
                s.push(&big, |m| {
                    n += 1;
                    assert_eq!(m.view.items, 100);
                    assert!(m.view.kept.len() <= most, "{}", m.view.kept.len());
                    assert!(m.view.weight() <= most + MAX_CUT_LISTED * 16);
                    if budget == 0 {
                        assert!(m.view.cut.is_empty() && m.view.cut.capacity() == 0);
                        assert_eq!(m.view.cut_more, 100);
                    }
                });
            }
            assert_eq!((n, s.messages()), (150, 150));
        }
    }
}
