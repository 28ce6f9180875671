//! Unit tests of the connection core, frame in / frame out.
