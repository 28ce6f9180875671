//! The kubelet emulator's own tests: that it drives a real containerd in kubelet's call order
//! (start, stop, restart, requeue, the API versions), with no crisp in the path. crisp's
//! scenarios, which rely on it, are the other modules.

mod api;
mod requeue;
mod restart;
mod start;
mod stop;
