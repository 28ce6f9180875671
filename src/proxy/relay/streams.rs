//! The client's streams as the core records them: the highest one relayed, the ones crisp serves
//! itself (diverted), and those whose request body still goes to crisp's task. Every frame on a
//! stream that is not new is routed by this record ([`Streams::whose`]).
//!
//! It is the core's sub-state for that, as [`super::flow::Flow`] is for windows: its fields are
//! its own, and it answers with a decision ([`Whose`]) that the core acts on (`inbound.rs`).
//!
//! The record stays bounded on a connection that lives for weeks: once it holds more than
//! [`FORGET_AFTER`] diverted streams, the finished ones are forgotten, and every stream up to
//! the highest opened so far that is not relayed in flight is taken for ended, whichever way it
//! went. Its late frames are then dropped, never relayed: the runtime may take frames on a
//! stream it never opened for a connection error, and ignores them on one it closed (RFC 9113
//! §5.1).

use std::collections::HashSet;
use std::hash::BuildHasherDefault;

use crate::proxy::http2::{IdHasher, StreamId};

/// How many diverted streams the record holds before it forgets the finished ones, in one batch.
pub(super) const FORGET_AFTER: usize = 64;

/// Whose a frame on a stream that is not new is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Whose {
    /// A diverted stream whose request body is still open: the body goes to crisp's task.
    Body,
    /// A diverted stream, in flight or finished (or one forgotten below the cut that was not
    /// relayed): crisp's. Nothing of it reaches the runtime.
    Diverted,
    /// A stream relayed to the runtime (or opened by it): the runtime's.
    Relayed,
    /// A stream the client never opened: no one's.
    Unknown,
}

type IdSet = HashSet<StreamId, BuildHasherDefault<IdHasher>>;

/// The client's streams: see the module's documentation.
pub(super) struct Streams {
    /// Highest stream id sent to the runtime.
    max_relayed: StreamId,
    /// Streams this connection diverted above `forgotten_upto`.
    diverted: IdSet,
    /// Finished diverted streams up to this id were dropped from `diverted`.
    forgotten_upto: StreamId,
    /// Diverted streams whose request body is still open.
    bodies: IdSet,
}

impl Default for Streams {
    fn default() -> Streams {
        Streams {
            max_relayed: StreamId::CONNECTION,
            diverted: IdSet::default(),
            forgotten_upto: StreamId::CONNECTION,
            bodies: IdSet::default(),
        }
    }
}

impl Streams {
    /// Whose `stream`'s frames are; `in_flight`: whether the stream is relayed and has not
    /// ended (the core's record of relayed calls says so), asked only of a stream at or below
    /// the forgotten diverted ones — most frames are not, and skip that lookup.
    pub(super) fn whose(&self, stream: StreamId, in_flight: impl FnOnce() -> bool) -> Whose {
        if self.bodies.contains(&stream) {
            Whose::Body
        } else if self.diverted.contains(&stream) || (stream <= self.forgotten_upto && !in_flight())
        {
            Whose::Diverted
        } else if stream <= self.max_relayed {
            Whose::Relayed
        } else {
            Whose::Unknown
        }
    }

    /// `stream` was sent on to the runtime.
    pub(super) fn relayed(&mut self, stream: StreamId) {
        self.max_relayed = stream;
    }

    /// crisp serves `stream` itself from now on, its request body open (`body_open`) or not.
    /// `answering` says whether a diverted stream is still in flight, and `max_stream` is the
    /// highest stream opened: below it, the finished ones are forgotten once there are more
    /// than [`FORGET_AFTER`].
    pub(super) fn diverted(
        &mut self,
        stream: StreamId,
        body_open: bool,
        max_stream: StreamId,
        answering: impl Fn(StreamId) -> bool,
    ) {
        self.diverted.insert(stream);
        if body_open {
            self.bodies.insert(stream);
        }
        if self.diverted.len() > FORGET_AFTER {
            self.diverted.retain(|id| answering(*id));
            self.forgotten_upto = max_stream;
        }
    }

    /// A stream crisp answered at once (it could not route it): its late frames are crisp's to
    /// drop, as a diverted stream's.
    pub(super) fn answered_here(&mut self, stream: StreamId) {
        self.diverted.insert(stream);
    }

    /// `stream`'s request body ended (or was reset): whether it was open.
    pub(super) fn end_body(&mut self, stream: StreamId) -> bool {
        self.bodies.remove(&stream)
    }

    /// The diverted streams the record still holds, finished ones included.
    pub(super) fn diverted_ids(&self) -> impl Iterator<Item = StreamId> + '_ {
        self.diverted.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> StreamId {
        StreamId::new(n)
    }

    #[test]
    fn each_stream_is_someones() {
        let mut s = Streams::default();
        s.relayed(id(1));
        s.diverted(id(3), true, id(3), |_| true);
        s.diverted(id(5), false, id(5), |_| true);
        assert_eq!(s.whose(id(1), || true), Whose::Relayed);
        assert_eq!(s.whose(id(3), || false), Whose::Body);
        assert_eq!(s.whose(id(5), || false), Whose::Diverted);
        assert_eq!(s.whose(id(7), || false), Whose::Unknown);
        assert!(s.end_body(id(3)));
        assert!(!s.end_body(id(3)), "once");
        assert_eq!(s.whose(id(3), || false), Whose::Diverted);
    }

    #[test]
    fn finished_diverted_streams_are_forgotten_in_one_batch_and_stay_crisps() {
        let mut s = Streams::default();
        s.relayed(id(1));
        let n = FORGET_AFTER as u32 + 1;
        for k in 1..=n {
            // Stream 5 is still answering when the batch is cut.
            s.diverted(id(1 + 2 * k), false, id(1 + 2 * k), |i| i == id(5));
        }
        assert_eq!(s.diverted_ids().collect::<Vec<_>>(), [id(5)]);
        // Below the cut: crisp's, unless relayed and in flight.
        assert_eq!(s.whose(id(3), || false), Whose::Diverted);
        assert_eq!(s.whose(id(1), || true), Whose::Relayed);
        assert_eq!(s.whose(id(1), || false), Whose::Diverted);
        assert_eq!(s.whose(id(3 + 2 * n), || false), Whose::Unknown);
    }
}
