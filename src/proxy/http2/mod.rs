//! The pieces of HTTP/2 (RFC 9113) and HPACK (RFC 7541) the relay needs, as types: the frame
//! header ([`Head`], [`Kind`], [`Flags`]), error codes ([`Reason`]), one reader/writer per frame
//! type crisp reads or writes itself, and HPACK — a decoder ([`hpack`]), crisp's encoder for its
//! runtime connection ([`Indexer`]), a stateless encoder ([`encode_field`]) and the Huffman code.
//!
//! This layer knows nothing of the relay: it imports nothing from it, and holds no connection
//! state but the HPACK tables.

mod data;
mod error;
mod go_away;
mod hasher;
mod head;
mod headers;
pub mod hpack;
pub mod huffman;
mod indexer;
mod ping;
mod reason;
mod rst_stream;
mod settings;
mod stateless;
mod stream_id;
mod window_update;

pub use data::{data, data_payload};
pub use error::FrameError;
pub use go_away::GoAway;
pub(crate) use hasher::{IdHasher, IdMap};
pub use head::{
    complete_at, Flags, Head, Kind, DEFAULT_WINDOW, HEADER_LEN, MAX_FRAME, MAX_FRAME_LIMIT, PREFACE,
};
pub use headers::{header_fragment, headers};
pub use indexer::Indexer;
pub use ping::Ping;
pub use reason::Reason;
pub(crate) use rst_stream::RstStream;
pub use settings::Settings;
pub use stateless::encode_field;
pub use stream_id::StreamId;
// The prefix-integer encoder, for tests that write HPACK blocks by hand.
#[cfg(feature = "test-util")]
pub use stateless::put_int;
pub use window_update::WindowUpdate;
