//! End-to-end support for crisp.

pub mod crisp;
pub mod emulator;
pub mod fakert;
pub mod grpcgo;
pub mod harness;
pub mod picture;
pub mod raw;
pub mod stack;
pub mod tapcli;
