//! Readiness specs (`crisp.dev/ready.<container>` and node rules) and the probes crisp runs.
//! A new kind of readiness is one variant here: its parser, how it is shown ([`Display`], what
//! ListPods and the fuzz target use) and how it is probed ([`Readiness::probe`]): `spec.rs` and
//! `probe.rs`. `cidr.rs` holds the addresses a probe may aim at, `reach.rs` what a probe from outside a pod's
//! network may aim at, `limiter.rs` the probes'
//! node-wide bounds, `bucket.rs` the token bucket they (and the ordering engine's runtime reads)
//! are paced by.
//!
//! [`Display`]: std::fmt::Display

mod bucket;
mod cidr;
mod limiter;
mod probe;
mod reach;
mod spec;

pub(crate) use bucket::TokenBucket;
pub use cidr::*;
pub(crate) use limiter::*;
pub(crate) use probe::*;
pub use reach::*;
pub use spec::*;

#[cfg(test)]
mod tests;
