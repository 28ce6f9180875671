//! Runtime → client: what the core keeps to read the runtime's frames (`outbound.rs` acts on
//! it). A sub-state with its own fields, as [`super::flow::Flow`] is.

use crate::proxy::http2::{hpack, Head, StreamId};

use super::blocks::{Block, Blocks};

/// What the core keeps to read the runtime's frames.
#[derive(Default)]
pub(super) struct FromRuntime {
    /// Response header blocks spanning several frames (relayed as they come, decoded at the
    /// end): crisp's own frames must not be written in between.
    blocks: Blocks,
    /// SETTINGS_HEADER_TABLE_SIZE from the runtime, not yet applied to the other direction's
    /// [`crate::proxy::http2::Indexer`].
    table_size: Option<u32>,
    /// The runtime's next DATA frame waits for the client's window: the shell does not read
    /// the runtime until the client's credit comes ([`super::core::Core::runtime_waits`]).
    waits: bool,
}

impl FromRuntime {
    /// The runtime is in the middle of a header block.
    pub(super) fn in_block(&self) -> bool {
        self.blocks.in_block()
    }

    /// A HEADERS frame without END_HEADERS.
    pub(super) fn begin_block(&mut self, stream: StreamId, end_stream: bool, fragment: &[u8]) {
        self.blocks.begin(stream, end_stream, fragment);
    }

    /// A CONTINUATION frame: the block, once it ends.
    pub(super) fn continuation(&mut self, head: &Head, payload: &[u8]) -> Option<Block> {
        self.blocks.next_unchecked(head, payload)
    }

    /// The runtime is gone: whether it was in the middle of a header block, which will never
    /// end.
    pub(super) fn abandon_block(&mut self) -> bool {
        self.blocks.abandon()
    }

    /// Decodes a whole response header block with the runtime's table.
    pub(super) fn decode(
        &mut self,
        block: &[u8],
        field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), hpack::HpackError> {
        self.blocks.decode(block, field)
    }

    /// The runtime's SETTINGS_HEADER_TABLE_SIZE.
    pub(super) fn table_size(&mut self, size: u32) {
        self.table_size = Some(size);
    }

    /// The table size the runtime set since it was last taken.
    pub(super) fn take_table_size(&mut self) -> Option<u32> {
        self.table_size.take()
    }

    /// Whether the runtime's next DATA frame waits for the client's window.
    pub(super) fn waits(&self) -> bool {
        self.waits
    }

    /// The runtime's next DATA frame waits for the client's window (`true`), or may be tried
    /// again (`false`).
    pub(super) fn set_waits(&mut self, waits: bool) {
        self.waits = waits;
    }
}
