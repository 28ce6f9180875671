//! The core's one way out to the client: the runtime's frames, relayed from the read buffer the
//! core owns (never copied), and crisp's own frames, in one order that the core chooses.
//!
//! The runtime's bytes are read into [`ToClient::runtime`]; the core checks its frames where
//! they lie and places each one in `order` (relayed, or skipped: the runtime's GOAWAY is crisp's).
//! crisp's own frames are encoded into `own` as they arise ("staged") and placed in `order` when
//! crisp may write them ([`super::core::Core::may_write_own`]: after the client's server preface,
//! never inside a header block the runtime is still sending). What is placed leaves, front first,
//! through [`ToClient::front`] and [`ToClient::advance`]: the shell writes a slice and says how
//! much of it went.
//!
//! Where a staged frame is placed is the ordering rule: a frame crisp stages while it handles
//! one of the runtime's frames goes after that frame (the client's SETTINGS ACK before any DATA
//! of crisp's that counts on the window it grants), and one staged before goes before it.

use std::collections::VecDeque;

use bytes::{Buf, BytesMut};

/// What the read buffer starts with, and shrinks back to after a large answer.
const READ_BUF: usize = 64 << 10;

/// One run of bytes for the client, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// The runtime's frames at the start of the read buffer, as they came.
    Runtime(usize),
    /// The runtime's bytes that do not go to the client (its GOAWAY).
    Skip(usize),
    /// crisp's own frames at the front of `own`.
    Own(usize),
}

/// The client's side of the core's output.
pub(super) struct ToClient {
    /// The runtime's bytes as read: `[..handled]` are placed in `order` (their frames checked),
    /// the rest not handled yet (a partial frame, or a DATA frame that waits for the client's
    /// window, and what follows it).
    runtime: BytesMut,
    handled: usize,
    /// Room to make in `runtime` for a frame that has only partly arrived.
    missing: usize,
    /// crisp's own frames: `[..head]` written, `[head..placed]` placed in `order`,
    /// `[placed..]` staged (waiting until crisp may write them).
    own: Vec<u8>,
    head: usize,
    placed: usize,
    order: VecDeque<Chunk>,
    /// Bytes of crisp's own frames written since the connection opened.
    own_written: u64,
}

impl Default for ToClient {
    fn default() -> Self {
        ToClient {
            runtime: BytesMut::with_capacity(READ_BUF),
            handled: 0,
            missing: 0,
            own: Vec::new(),
            head: 0,
            placed: 0,
            order: VecDeque::new(),
            own_written: 0,
        }
    }
}

impl ToClient {
    /// Where the shell reads the runtime's bytes to (appended after what is there).
    pub(super) fn read_buf(&mut self) -> &mut BytesMut {
        &mut self.runtime
    }

    /// The read buffer, out of `self` while its frames are handled (a frame's payload is read
    /// where it lies while the core changes); [`ToClient::put_runtime`] gives it back. Returns
    /// where the bytes not handled yet start.
    pub(super) fn take_runtime(&mut self) -> (BytesMut, usize) {
        (std::mem::take(&mut self.runtime), self.handled)
    }

    /// `missing`: room still missing for a frame that has only partly arrived. It is made once
    /// the bytes before the frame have left (else growing the buffer would copy them too).
    pub(super) fn put_runtime(&mut self, buf: BytesMut, missing: usize) {
        self.runtime = buf;
        self.missing = missing;
        self.reserve();
    }

    fn reserve(&mut self) {
        if self.missing > 0 && self.handled == 0 {
            self.runtime.reserve(self.missing);
            self.missing = 0;
        }
    }

    /// The next `len` bytes of the runtime's go to the client as they are.
    pub(super) fn relay_runtime(&mut self, len: usize) {
        self.handled += len;
        match self.order.back_mut() {
            Some(Chunk::Runtime(n)) => *n += len,
            _ => self.order.push_back(Chunk::Runtime(len)),
        }
    }

    /// The next `len` bytes of the runtime's are not for the client.
    pub(super) fn skip_runtime(&mut self, len: usize) {
        self.handled += len;
        self.order.push_back(Chunk::Skip(len));
    }

    /// Drops the runtime's bytes not handled yet (its connection is gone: they belong to calls
    /// that end now).
    pub(super) fn drop_unhandled(&mut self) {
        self.runtime.truncate(self.handled);
        self.missing = 0;
    }

    /// Where crisp's own frames are encoded: staged, behind everything placed.
    pub(super) fn own(&mut self) -> &mut Vec<u8> {
        &mut self.own
    }

    /// Stages `first` ahead of the frames already staged (crisp's SETTINGS, when crisp becomes
    /// the client's server).
    pub(super) fn stage_first(&mut self, first: &[u8]) {
        self.own
            .splice(self.placed..self.placed, first.iter().copied());
    }

    /// Whether crisp has frames staged, not yet placed.
    pub(super) fn staged(&self) -> bool {
        self.placed < self.own.len()
    }

    /// Places the staged frames in the order, after everything placed so far.
    pub(super) fn place_own(&mut self) {
        let n = self.own.len() - self.placed;
        if n == 0 {
            return;
        }
        self.placed = self.own.len();
        match self.order.back_mut() {
            Some(Chunk::Own(m)) => *m += n,
            _ => self.order.push_back(Chunk::Own(n)),
        }
    }

    /// The bytes of crisp's own frames written once everything staged now is: a frame just
    /// staged has reached the client when [`ToClient::own_written`] gets there.
    pub(super) fn own_mark(&self) -> u64 {
        self.own_written + (self.own.len() - self.head) as u64
    }

    /// Bytes of crisp's own frames written so far.
    pub(super) fn own_written(&self) -> u64 {
        self.own_written
    }

    /// The next bytes for the client, in order; None: nothing placed.
    pub(super) fn front(&mut self) -> Option<&[u8]> {
        while let Some(&Chunk::Skip(n)) = self.order.front() {
            self.order.pop_front();
            self.runtime.advance(n);
            self.handled -= n;
        }
        match *self.order.front()? {
            Chunk::Runtime(n) => Some(&self.runtime[..n]),
            Chunk::Own(n) => Some(&self.own[self.head..self.head + n]),
            Chunk::Skip(_) => unreachable!("skipped above"),
        }
    }

    /// Whether what [`ToClient::front`] gives is crisp's own (the fuzz driver's checks).
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn front_is_own(&self) -> bool {
        matches!(self.order.front(), Some(Chunk::Own(_)))
    }

    /// `n` bytes of what [`ToClient::front`] gave were written.
    pub(super) fn advance(&mut self, n: usize) {
        let Some(front) = self.order.front_mut() else {
            return;
        };
        let left = match front {
            Chunk::Runtime(len) => {
                let n = n.min(*len);
                self.runtime.advance(n);
                self.handled -= n;
                *len -= n;
                *len
            }
            Chunk::Own(len) => {
                let n = n.min(*len);
                self.head += n;
                self.own_written += n as u64;
                *len -= n;
                if self.head == self.placed {
                    self.own.drain(..self.head);
                    self.head = 0;
                    self.placed = 0;
                }
                *len
            }
            Chunk::Skip(len) => *len,
        };
        if left == 0 {
            self.order.pop_front();
        }
        if self.runtime.is_empty() && self.runtime.capacity() > 1 << 20 {
            // A large answer grew the buffer: back to the usual size.
            self.runtime = BytesMut::with_capacity(READ_BUF);
        }
        self.reserve();
    }

    /// Nothing placed or staged for the client.
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty() && !self.staged()
    }
}
