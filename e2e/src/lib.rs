//! End-to-end support for crisp.

pub mod crisp;
pub mod harness;
pub mod raw;
