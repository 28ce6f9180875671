//! End-to-end support for crisp.
