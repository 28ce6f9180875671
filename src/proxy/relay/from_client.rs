//! Client → runtime: what the core keeps to read the client's header blocks and write them anew
//! for the runtime (`inbound.rs` acts on it). A sub-state with its own fields, as
//! [`super::flow::Flow`] is; which stream is whose is [`super::streams::Streams`]'.

use http::uri::PathAndQuery;

use super::blocks::{Block, Blocks};
use super::error::Violation;
use super::fields::{FieldList, PathCache};
use super::LOG;
use crate::cri::Route;
use crate::proxy::http2::{self, Head, Indexer, StreamId};
use crate::status::parse_grpc_timeout;

/// Largest header block crisp accepts from the client (the runtime's limit is usually far
/// lower).
pub(crate) const MAX_HEADER_BLOCK: usize = 1 << 20;
/// Largest header list (names and values, decoded) crisp accepts: grpc-go's server default. A
/// block of 1 MiB that refers again and again to one large table entry decodes to gigabytes.
pub(crate) const MAX_HEADER_LIST: usize = 16 << 20;
/// The largest re-encoding buffer kept from one header block to the next.
const KEEP_BLOCK_BUFFER: usize = 64 << 10;

/// What a request header block says that the core routes by.
pub(super) struct Request {
    /// Its `:path`, with its route; `None` without one.
    pub(super) path: Option<(Route, PathAndQuery)>,
    /// Its `grpc-timeout`.
    pub(super) timeout: Option<std::time::Duration>,
}

/// What the core keeps to read the client's header blocks.
pub(super) struct FromClient {
    blocks: Blocks,
    /// The re-encoded request header block, reused from call to call.
    enc: Vec<u8>,
    /// The fields of the request header block being handled.
    fields: FieldList,
    /// The runtime connection's HPACK table, which crisp alone writes to.
    indexer: Indexer,
    /// Paths this client used, with their routes: no copy or re-validation per call.
    paths: PathCache,
    /// The SETTINGS_MAX_FRAME_SIZE the client was told: the runtime's, relayed (the largest it
    /// advertised), or the default when crisp is the server. A longer frame closes the
    /// connection with FRAME_SIZE_ERROR (RFC 9113 §4.2).
    max_frame: u32,
}

impl Default for FromClient {
    fn default() -> FromClient {
        FromClient {
            blocks: Blocks::default(),
            enc: Vec::with_capacity(512),
            fields: FieldList::default(),
            indexer: Indexer::default(),
            paths: PathCache::default(),
            max_frame: http2::MAX_FRAME as u32,
        }
    }
}

impl FromClient {
    /// The largest frame the client may send.
    pub(super) fn max_frame(&self) -> u32 {
        self.max_frame
    }

    /// The runtime advertised frames of up to `max` bytes (a valid size): the client, told so,
    /// may send them.
    pub(super) fn runtime_max_frame(&mut self, max: u32) {
        self.max_frame = self.max_frame.max(max);
    }

    /// The runtime's SETTINGS_HEADER_TABLE_SIZE: the bound of the table crisp writes to.
    pub(super) fn runtime_table_size(&mut self, size: u32) {
        self.indexer.peer_table_size(size);
    }

    /// The client is in the middle of a header block: its next frame must continue it.
    pub(super) fn in_block(&self) -> bool {
        self.blocks.in_block()
    }

    /// A HEADERS frame without END_HEADERS.
    pub(super) fn begin_block(&mut self, stream: StreamId, end_stream: bool, fragment: &[u8]) {
        self.blocks.begin(stream, end_stream, fragment);
    }

    /// The client's next frame inside a block: the block, once it ends; a frame that breaks
    /// the block, or a block over [`MAX_HEADER_BLOCK`], is a violation.
    pub(super) fn continuation(
        &mut self,
        head: &Head,
        payload: &[u8],
    ) -> Result<Option<Block>, Violation> {
        self.blocks.next_checked(head, payload, MAX_HEADER_BLOCK)
    }

    /// Decodes a whole request header block into [`FromClient::fields`]: what it says that
    /// routes the call.
    pub(super) fn decode_request(&mut self, raw: &[u8]) -> Result<Request, Violation> {
        let mut path = None;
        let mut timeout = None;
        let paths = &mut self.paths;
        let fields = &mut self.fields;
        fields.clear();
        let mut too_large = false;
        let decoded = self.blocks.decode(raw, |n, v| {
            match n {
                b":path" => path = Some(paths.get(v)),
                b"grpc-timeout" => timeout = parse_grpc_timeout(v),
                _ => {}
            }
            too_large |= fields.size() + n.len() + v.len() > MAX_HEADER_LIST;
            if !too_large {
                fields.push(n, v);
            }
        });
        if too_large {
            tracing::debug!(
                target: LOG,
                max_bytes = MAX_HEADER_LIST,
                "client sent a header block that decodes to more than crisp accepts"
            );
            return Err(Violation::ListTooLarge);
        }
        if let Err(e) = decoded {
            tracing::debug!(
                target: LOG,
                error = %e,
                "client sent a header block crisp cannot decode"
            );
            return Err(Violation::UndecodableBlock);
        }
        Ok(Request { path, timeout })
    }

    /// The fields of the block just decoded.
    pub(super) fn fields(&self) -> &FieldList {
        &self.fields
    }

    /// The fields of the block just decoded, for a sub-state to take (by swapping: no copy).
    pub(super) fn fields_mut(&mut self) -> &mut FieldList {
        &mut self.fields
    }

    /// Encodes `fields` (those of the block just decoded when `None`) into `block` for the
    /// runtime, through crisp's table of the runtime connection.
    pub(super) fn encode(&mut self, fields: Option<&FieldList>, block: &mut Vec<u8>) {
        let fields = fields.unwrap_or(&self.fields);
        self.indexer.begin(block);
        for (n, v) in fields.iter() {
            self.indexer.field(block, n, v);
        }
    }

    /// Encodes the fields of the block just decoded into `block` as literals that leave the
    /// runtime's table alone (size updates crisp owes it go first).
    pub(super) fn encode_literal(&mut self, block: &mut Vec<u8>) {
        self.indexer.begin(block);
        for (n, v) in self.fields.iter() {
            http2::encode_field(block, n, v);
        }
    }

    /// The buffer header blocks are re-encoded into, empty: given back with
    /// [`FromClient::keep_block_buffer`].
    pub(super) fn block_buffer(&mut self) -> Vec<u8> {
        let mut block = std::mem::take(&mut self.enc);
        block.clear();
        block
    }

    /// Keeps `block` for the next header block, unless a huge block grew it.
    pub(super) fn keep_block_buffer(&mut self, block: Vec<u8>) {
        if block.capacity() <= KEEP_BLOCK_BUFFER && self.enc.capacity() < block.capacity() {
            self.enc = block;
        }
    }
}
