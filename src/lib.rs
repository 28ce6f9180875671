//! crisp — CRI Sidecar Proxy.
//!
//! A gRPC proxy on the node's CRI socket, between an unmodified kubelet and the container
//! runtime. It forwards every call byte-exact and, for pods that declare sidecars, changes only
//! the *timing* of a few calls.
//!
//! ```text
//!  kubelet ──h2/UDS──▶ proxy::serve ─ accept, one task per connection (listener.rs)
//!                        │
//!                        ▼
//!                   proxy::relay ── own runtime connection; frames copied through; request
//!                        │           header blocks decoded for Route::from_path (cri/mod.rs)
//!                        │           and re-encoded statelessly (proxy/frames.rs)
//!          nobody interested? ──yes──▶ relayed frame by frame to the runtime
//!                        │no
//!                        ▼
//!   diverted: Proxy::handle ── buffer unary request ──▶ Interceptors::on_request (intercept.rs)
//!                        │              may decode a copy (cri/views.rs), HOLD, or reject
//!                        ▼              (the ordering engine waits here; never List/Status)
//!                 Upstream::send (proxy/upstream.rs) ──h2/UDS──▶ containerd
//!                        │
//!             response: spliced, or buffered ▶ on_response (may patch one field)
//!                        ▼
//!      written back into kubelet's connection, trailers and status untouched
//! ```
//!
//! Modules: [`config`] (TOML + flags, validated once), [`proxy`] (the forwarder), [`cri`]
//! (routing, decoded views, wire framing), [`intercept`] (the plug-in seam), [`status`] (crisp's
//! own gRPC errors), [`telemetry`] (logging), [`daemon`] (wiring it together).

pub mod admin;
pub mod config;
pub mod cri;
pub mod daemon;
pub mod doctor;
pub mod intercept;
pub mod metrics;
pub mod ordering;
pub mod proxy;
pub mod status;
pub mod systemd;
pub mod tap;
pub mod telemetry;
