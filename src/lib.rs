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
//!                   Proxy::handle ── Route::from_path (cri/mod.rs): which RPC, which CRI version
//!                        │
//!          nobody interested? ──yes──▶ fast path: bodies spliced frame by frame
//!                        │no
//!                        ▼
//!             buffer unary request ──▶ Interceptors::on_request (intercept.rs)
//!                        │              may decode a copy (cri/views.rs), HOLD, or reject
//!                        ▼              (the ordering engine waits here; never List/Status)
//!                 Upstream::send (proxy/upstream.rs) ──h2/UDS──▶ containerd
//!                        │
//!             response: spliced, or buffered ▶ on_response (may patch one field)
//!                        ▼
//!                    back to kubelet, trailers and status untouched
//! ```
//!
//! Modules: [`config`] (TOML + flags, validated once), [`proxy`] (the forwarder), [`cri`]
//! (routing, decoded views, wire framing), [`intercept`] (the plug-in seam), [`status`] (crisp's
//! own gRPC errors), [`telemetry`] (logging), [`daemon`] (wiring it together).

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
