//! Flow control of the client connection, for the bytes crisp sends on its own, and the
//! diverted streams' answers waiting for it.
//!
//! Settings and windows are negotiated end to end between client and runtime. Bytes crisp
//! writes to the client on a diverted stream use up the client's connection window without the
//! runtime knowing, so (a) crisp keeps that many bytes of the client's connection credits from
//! the runtime ("debt"), and (b) never relays runtime DATA beyond the window the client really
//! has left. Request bytes on a diverted stream never reach the runtime, so crisp returns their
//! connection credit to the client at once, and their stream credit as the observed path
//! consumes them.
//!
//! A diverted stream's answer reaches the core as commands ([`super::answers::Command`]); what the
//! client's windows do not allow yet waits here, per stream and in order, and goes out as
//! credit comes ([`Flow::flush`]). Each stream's task sends at most [`ANSWER_BUDGET`] bytes of
//! DATA ahead of what was written (`bridge.rs`), so what waits here stays bounded.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::proxy::http2::{self, IdMap, StreamId, DEFAULT_WINDOW, MAX_FRAME};

/// How many bytes of DATA a diverted stream's task may send ahead of what the core wrote to
/// the client: four frames. The core gives them back as it writes them
/// ([`super::core::Event::Credit`]).
pub(crate) const ANSWER_BUDGET: usize = 4 * MAX_FRAME;

/// A diverted stream's answer as the core keeps it: the client's window for it, and what
/// waits for that window.
#[derive(Default)]
pub(crate) struct Answer {
    window: i64,
    queue: VecDeque<Out>,
    /// DATA bytes in `queue`.
    queued: usize,
    /// Its response headers are queued.
    headers: bool,
    /// Its end (END_STREAM) is queued: the core takes nothing more of it.
    ended: bool,
    /// Its task ended ([`super::answers::Command::Finished`]): the stream closes once `queue` is
    /// written.
    finished: bool,
}

/// Which part of an answer a command carries: headers come first, once; DATA and trailers
/// after them; nothing after the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Headers,
    Body,
}

/// What a diverted stream sends next.
pub(crate) enum Out {
    /// Whole frames that need no window (a header block).
    Frames(Vec<u8>),
    /// Response DATA; `end`: the last of the stream.
    Data(Bytes, bool),
}

/// The client's windows as crisp may count on them.
pub(crate) struct Flow {
    /// How many DATA bytes the client will still accept on the connection.
    client_window: i64,
    /// Connection credits to keep from the runtime: bytes crisp sent the client on its own.
    debt: u64,
    /// The client's SETTINGS_INITIAL_WINDOW_SIZE, as far as crisp may rely on it for the
    /// diverted streams it sends on (see `unacked_windows`).
    client_initial_window: i64,
    /// The client's SETTINGS frames relayed to the runtime and not yet acknowledged by it, oldest
    /// first, with the INITIAL_WINDOW_SIZE each carried. A client (h2, for one) grows its streams'
    /// receive windows only when its SETTINGS are acknowledged, and the runtime's ACK reaches it
    /// through crisp: crisp's own DATA must not count on a larger window before that ACK went
    /// out, or the client sees more than it allowed (FLOW_CONTROL_ERROR). A smaller window is
    /// applied at once.
    unacked_windows: VecDeque<Option<i64>>,
    /// Diverted streams: the client's window for their answer, and what waits for it.
    diverted: IdMap<Answer>,
}

impl Default for Flow {
    fn default() -> Self {
        Flow {
            client_window: DEFAULT_WINDOW,
            debt: 0,
            client_initial_window: DEFAULT_WINDOW,
            unacked_windows: VecDeque::new(),
            diverted: IdMap::default(),
        }
    }
}

impl Flow {
    /// Takes `n` bytes of the client's connection window for a runtime DATA frame; false (and
    /// nothing taken) if the client has not that much left.
    pub(crate) fn take_for_runtime(&mut self, n: i64) -> bool {
        if self.client_window >= n {
            self.client_window -= n;
            true
        } else {
            false
        }
    }

    /// Takes up to `want` bytes (at most a frame) of both the connection's and `window` (a
    /// stream's) for crisp's own DATA on a diverted stream, counting them as debt; 0 when there
    /// is no window now.
    fn take_for_diverted(
        client_window: &mut i64,
        debt: &mut u64,
        window: &mut i64,
        want: usize,
    ) -> usize {
        let n = (*client_window)
            .min(*window)
            .min(MAX_FRAME as i64)
            .min(want as i64);
        if n <= 0 {
            return 0;
        }
        *client_window -= n;
        *debt += n as u64;
        *window -= n;
        n as usize
    }

    /// The client's connection WINDOW_UPDATE: pays crisp's debt first; returns what goes on to
    /// the runtime.
    pub(crate) fn connection_credit(&mut self, inc: u32) -> u32 {
        self.client_window += inc as i64;
        let keep = self.debt.min(inc as u64);
        self.debt -= keep;
        inc - keep as u32
    }

    /// The client's WINDOW_UPDATE on a diverted stream.
    pub(crate) fn stream_credit(&mut self, stream: StreamId, inc: u32) {
        if let Some(a) = self.diverted.get_mut(&stream) {
            a.window += inc as i64;
        }
    }

    /// A client SETTINGS frame with its INITIAL_WINDOW_SIZE (if it carried one). `relayed`: it
    /// goes on to the runtime, whose ACK reaches the client through crisp, so a larger window
    /// waits for [`Flow::settings_acked`]; otherwise crisp acknowledges it itself, at once.
    /// True when the streams' windows changed.
    pub(crate) fn client_settings(&mut self, window: Option<i64>, relayed: bool) -> bool {
        if relayed {
            self.unacked_windows.push_back(window);
        }
        match window {
            Some(v) if !relayed || v < self.client_initial_window => self.set_initial_window(v),
            _ => false,
        }
    }

    /// The runtime acknowledged the client's oldest SETTINGS (the ACK is on its way to the
    /// client, ahead of any DATA of crisp's). True when the streams' windows changed.
    pub(crate) fn settings_acked(&mut self) -> bool {
        let Some(Some(v)) = self.unacked_windows.pop_front() else {
            return false;
        };
        // A smaller window still waiting for its ACK caps it.
        let v = self
            .unacked_windows
            .iter()
            .flatten()
            .fold(v, |m, &w| m.min(w));
        self.set_initial_window(v)
    }

    /// Every diverted stream's window moves by the difference (RFC 9113 §6.9.2).
    fn set_initial_window(&mut self, v: i64) -> bool {
        let delta = v - self.client_initial_window;
        self.client_initial_window = v;
        for a in self.diverted.values_mut() {
            a.window += delta;
        }
        delta != 0
    }

    /// crisp starts answering `stream` itself.
    pub(crate) fn open_diverted(&mut self, stream: StreamId) {
        self.diverted.insert(
            stream,
            Answer {
                window: self.client_initial_window,
                ..Answer::default()
            },
        );
    }

    /// The diverted stream ends now (reset by the client or by its task): what waits of it is
    /// dropped. False if it had ended already.
    pub(crate) fn close_diverted(&mut self, stream: StreamId) -> bool {
        self.diverted.remove(&stream).is_some()
    }

    /// Queues `out`, the `part` of `stream`'s answer (`end`: its last), behind what the stream
    /// already waits to send; false (dropped) if the stream has ended, its answer has, or the
    /// part is out of order (headers once and first).
    pub(crate) fn push(&mut self, stream: StreamId, part: Part, out: Out, end: bool) -> bool {
        let Some(a) = self.diverted.get_mut(&stream) else {
            return false;
        };
        if a.ended || a.headers != (part == Part::Body) {
            return false;
        }
        a.headers = true;
        a.ended = end;
        if let Out::Data(b, _) = &out {
            a.queued += b.len();
        }
        a.queue.push_back(out);
        true
    }

    /// Whether `stream`'s answer is under way and has not ended.
    pub(crate) fn answer_open(&self, stream: StreamId) -> bool {
        self.diverted.get(&stream).is_some_and(|a| !a.ended)
    }

    /// The stream's task ended: the stream closes once what it queued is written.
    pub(crate) fn finish(&mut self, stream: StreamId) {
        if let Some(a) = self.diverted.get_mut(&stream) {
            a.finished = true;
            if a.queue.is_empty() {
                self.diverted.remove(&stream);
            }
        }
    }

    /// Writes to `out` what the diverted streams may send now, stream after stream, each in
    /// its order; `written(stream, n)` hears of the DATA bytes of each stream written. Streams
    /// whose task ended and whose answer is all out close.
    pub(crate) fn flush(&mut self, out: &mut Vec<u8>, mut written: impl FnMut(StreamId, usize)) {
        if self.diverted.is_empty() {
            return;
        }
        let mut done = Vec::new();
        let (client_window, debt) = (&mut self.client_window, &mut self.debt);
        for (&stream, a) in self.diverted.iter_mut() {
            let mut sent = 0;
            while let Some(front) = a.queue.front_mut() {
                match front {
                    Out::Frames(f) => out.extend_from_slice(f),
                    Out::Data(b, end) if b.is_empty() => {
                        if *end {
                            http2::data(out, stream, &[], true);
                        }
                    }
                    Out::Data(b, end) => {
                        let n =
                            Flow::take_for_diverted(client_window, debt, &mut a.window, b.len());
                        if n == 0 {
                            break;
                        }
                        let chunk = b.split_to(n);
                        http2::data(out, stream, &chunk, *end && b.is_empty());
                        a.queued -= n;
                        sent += n;
                        if !b.is_empty() {
                            continue;
                        }
                    }
                }
                a.queue.pop_front();
            }
            if sent > 0 {
                written(stream, sent);
            }
            if a.finished && a.queue.is_empty() {
                done.push(stream);
            }
        }
        for s in done {
            self.diverted.remove(&s);
        }
    }

    /// Diverted streams whose answers crisp still serves.
    pub(crate) fn diverted_len(&self) -> usize {
        self.diverted.len()
    }

    pub(crate) fn is_diverted(&self, stream: StreamId) -> bool {
        self.diverted.contains_key(&stream)
    }

    pub(crate) fn any_diverted(&self) -> bool {
        !self.diverted.is_empty()
    }

    /// DATA bytes a diverted stream has waiting for the client's window.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn queued(&self, stream: StreamId) -> usize {
        self.diverted.get(&stream).map_or(0, |a| a.queued)
    }

    /// For tests: (connection window, debt, a diverted stream's window).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn windows(&self, stream: StreamId) -> (i64, u64, Option<i64>) {
        (
            self.client_window,
            self.debt,
            self.diverted.get(&stream).map(|a| a.window),
        )
    }
}
