//! Flow control of the client connection, for the bytes crisp sends on its own.
//!
//! Settings and windows are negotiated end to end between client and runtime. Bytes crisp
//! writes to the client on a diverted stream use up the client's connection window without the
//! runtime knowing, so (a) crisp keeps that many bytes of the client's connection credits from
//! the runtime ("debt"), and (b) never relays runtime DATA beyond the window the client really
//! has left. Request bytes on a diverted stream never reach the runtime, so crisp returns their
//! connection credit to the client at once, and their stream credit as the observed path
//! consumes them.

use std::collections::VecDeque;

use parking_lot::{Mutex, MutexGuard};

use crate::proxy::http2::{IdMap, StreamId, DEFAULT_WINDOW, MAX_FRAME};

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
    /// Diverted streams: the client's window for their response.
    diverted: IdMap<i64>,
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

    /// Takes up to `want` bytes (at most a frame) of both the connection's and `stream`'s window
    /// for crisp's own DATA on a diverted stream, counting them as debt; None when the stream is
    /// gone, 0 when there is no window now.
    pub(crate) fn take_for_diverted(&mut self, stream: StreamId, want: usize) -> Option<usize> {
        let sw = *self.diverted.get(&stream)?;
        let n = self
            .client_window
            .min(sw)
            .min(MAX_FRAME as i64)
            .min(want as i64);
        if n <= 0 {
            return Some(0);
        }
        self.client_window -= n;
        self.debt += n as u64;
        *self.diverted.get_mut(&stream).expect("checked") -= n;
        Some(n as usize)
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
        if let Some(w) = self.diverted.get_mut(&stream) {
            *w += inc as i64;
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
        for w in self.diverted.values_mut() {
            *w += delta;
        }
        delta != 0
    }

    /// crisp starts answering `stream` itself.
    pub(crate) fn open_diverted(&mut self, stream: StreamId) {
        self.diverted.insert(stream, self.client_initial_window);
    }

    /// The diverted stream ended (answered, or reset by the client).
    pub(crate) fn close_diverted(&mut self, stream: StreamId) {
        self.diverted.remove(&stream);
    }

    pub(crate) fn is_diverted(&self, stream: StreamId) -> bool {
        self.diverted.contains_key(&stream)
    }

    pub(crate) fn any_diverted(&self) -> bool {
        !self.diverted.is_empty()
    }

    /// For tests: (connection window, debt, a diverted stream's window).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn windows(&self, stream: StreamId) -> (i64, u64, Option<i64>) {
        (
            self.client_window,
            self.debt,
            self.diverted.get(&stream).copied(),
        )
    }
}

/// The flow-control state, shared by the relay thread and diverted streams' tasks.
pub(crate) struct Windows {
    flow: Mutex<Flow>,
    /// Called when the client's window grew (or a stream ended): waiting senders re-check.
    changed: Box<dyn Fn() + Send + Sync>,
}

impl Windows {
    pub(crate) fn new(changed: Box<dyn Fn() + Send + Sync>) -> Windows {
        Windows {
            flow: Mutex::new(Flow::default()),
            changed,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Flow> {
        self.flow.lock()
    }

    pub(crate) fn notify(&self) {
        (self.changed)();
    }
}
