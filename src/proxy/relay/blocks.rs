//! Header blocks as one direction's frames bring them: a HEADERS frame, and the CONTINUATION
//! frames that follow until one carries END_HEADERS (RFC 9113 §6.10), decoded with that
//! direction's HPACK table.
//!
//! A sub-state of each direction ([`super::from_client::FromClient`],
//! [`super::from_runtime::FromRuntime`]): it keeps the part of a block that has arrived and says
//! when the block is whole ([`Blocks::next_checked`], [`Blocks::next_unchecked`]).

use crate::proxy::http2::{hpack, Flags, Head, Kind, StreamId};

use super::error::Violation;

/// A header block that has arrived whole, kept across its frames.
pub(super) struct Block {
    pub(super) stream: StreamId,
    /// The HEADERS frame ended the stream.
    pub(super) end_stream: bool,
    pub(super) block: Vec<u8>,
}

/// One direction's header blocks: its HPACK decoder and the block still arriving.
#[derive(Default)]
pub(super) struct Blocks {
    dec: hpack::Decoder,
    pending: Option<Block>,
}

impl Blocks {
    /// A block has begun and not ended: no other frame may come between its frames.
    pub(super) fn in_block(&self) -> bool {
        self.pending.is_some()
    }

    /// A HEADERS frame without END_HEADERS on `stream`: its `fragment` is kept until the block
    /// ends.
    pub(super) fn begin(&mut self, stream: StreamId, end_stream: bool, fragment: &[u8]) {
        self.pending = Some(Block {
            stream,
            end_stream,
            block: fragment.to_vec(),
        });
    }

    /// The client's next frame inside a block that has begun (`payload`, its payload): the
    /// block, once this frame ends it. A frame of another kind or stream, or a block over
    /// `max_block` bytes, is a connection error.
    pub(super) fn next_checked(
        &mut self,
        head: &Head,
        payload: &[u8],
        max_block: usize,
    ) -> Result<Option<Block>, Violation> {
        let Some(p) = self.pending.as_mut() else {
            return Ok(None);
        };
        if head.kind != Kind::Continuation || head.stream != p.stream {
            return Err(Violation::InterruptedBlock);
        }
        p.block.extend_from_slice(payload);
        if p.block.len() > max_block {
            return Err(Violation::BlockTooLarge);
        }
        Ok(self.end(head))
    }

    /// The runtime's CONTINUATION frame: the block, once this frame ends it. Not judged: the
    /// frames go on to the client as they are, who judges them; crisp only reads the block for
    /// the call's status.
    pub(super) fn next_unchecked(&mut self, head: &Head, payload: &[u8]) -> Option<Block> {
        self.pending.as_mut()?.block.extend_from_slice(payload);
        self.end(head)
    }

    fn end(&mut self, head: &Head) -> Option<Block> {
        if head.has(Flags::END_HEADERS) {
            self.pending.take()
        } else {
            None
        }
    }

    /// The block still arriving will never end (its sender is gone): whether there was one.
    pub(super) fn abandon(&mut self) -> bool {
        self.pending.take().is_some()
    }

    /// Decodes a whole block with this direction's table, `field` seeing each name and value.
    pub(super) fn decode(
        &mut self,
        block: &[u8],
        field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), hpack::HpackError> {
        self.dec.decode(block, field)
    }
}
