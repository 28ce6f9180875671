//! What the `crisp` binary's commands that read the tap do, as a library: the admin client
//! (`client.rs`: `crisp tap`, `crisp pods`, `crisp timeline --live`), the lines, views and
//! files they print (`view.rs`, `pods.rs`, `timeline/`, `pcap.rs`; `output.rs` opens the files
//! they write), and `crisp replay` (`replay/`). The daemon never runs any of it: its half of the
//! tap, the interceptor and the subscribers' queues, is `tap/`; the decoding and redaction of a
//! message are the tap's (`tap::decode`, `tap::redact`), shared with these.

pub mod client;
pub mod output;
pub mod pcap;
pub mod pods;
pub mod replay;
pub mod timeline;
pub mod view;
