//! crisp — CRI Sidecar Proxy.
//!
//! A gRPC proxy on the node's CRI socket, between an unmodified kubelet and the container
//! runtime. It forwards every call byte-exact and, for pods that declare sidecars, changes only
//! the *timing* of a few calls.
//!
//! ```text
//!  kubelet ──h2/UDS──▶ proxy::serve ─ accept; preface and runtime connection on tokio, then
//!                        │              a relay thread per connection (proxy/relay/pump.rs)
//!                        ▼
//!                   proxy::relay ── own runtime connection; frames copied through; request
//!                        │           header blocks decoded for Route::from_path (cri/mod.rs)
//!                        │           and written anew by crisp's HPACK encoder (proxy/http2);
//!                        │           the rules in a sans-I/O core (proxy/relay/core.rs)
//!          nobody interested? ──yes──▶ relayed frame by frame to the runtime
//!                        │no
//!                        ▼
//!   diverted (fields decoded once): Proxy::handle ── buffer unary request ──▶
//!                        │              Interceptors::on_request (intercept.rs): may decode
//!                        │              a copy (cri/views.rs), HOLD, or refuse
//!                        ▼              (the ordering engine waits here; never List/Status)
//!                 RuntimePool::send (proxy/runtime_pool.rs) ──h2/UDS──▶ containerd
//!                        │
//!             response: spliced, or buffered ▶ on_response (may patch one field)
//!                        ▼
//!      written back into kubelet's connection, trailers and status untouched
//! ```
//!
//! ## Layers
//!
//! Imports point down only (`tests/it/layers.rs` fails on one that runs back up); modules of one
//! layer do not import each other.
//!
//! - **7** [`daemon`]: wires it together: interceptor chain, proxy, admin socket, systemd.
//! - **6** [`admin`], [`doctor`], [`cli`]: crisp's admin API (tap, ListPods, metrics); node
//!   checks; what the binary's `tap`, `pods`, `timeline`, `pcap` and `replay` commands do (the
//!   admin client, what they print and write, the replay), which the daemon never runs.
//! - **5** [`ordering`], [`tap`]: the features: the ordering engine; the debug tap (it names
//!   calls through [`intercept::PodNames`] and receives the engine's live holds through
//!   [`hold_events::HoldSink`], never importing the engine).
//! - **4** [`proxy`]: the forwarder: relay, crisp's HTTP/2 client to the runtime, its runtime
//!   client.
//! - **3** [`intercept`], [`hold_events`], [`metrics`], [`otel`], [`telemetry`], [`watchdog`]:
//!   the plug-in seam (a panic in a hook ends that call only); the events of a held call, from
//!   the ordering engine to the tap; call metrics; held calls as spans in kubelet's trace;
//!   logging; liveness (relay threads' and the async runtime's progress, systemd's
//!   `WATCHDOG=1`).
//! - **2** [`config`]: TOML + flags, validated once; plain data (the known-injector table
//!   included).
//! - **1** [`cri`], [`status`], [`readiness`], [`netns`], [`systemd`], [`admin_api`]: routing,
//!   decoded views, wire framing and patches; crisp's gRPC errors; readiness specs, probes and
//!   their node-wide bounds; sockets made in a pod's network namespace; sd_notify and socket
//!   activation; the admin API's generated types (the admin socket, the tap and the admin
//!   client share them).
//! - **0** [`tenant`], [`sys`]: the one rule for text a pod author wrote (bounded where it
//!   enters, cut and escaped wherever it is printed); every OS call the standard library does
//!   not make, descriptors passed as `OwnedFd`/`BorrowedFd` (the crate's only `unsafe`).
//!
//! Above them all, the `crisp` binary (`src/bin/crisp/`, one file per subcommand) parses the
//! flags, prints and chooses the exit codes; the library returns values and typed errors.
//!
//! ## Visibility
//!
//! What the binary uses is `pub`: [`admin_api`], [`cli`], [`config`], [`daemon`], [`doctor`] and
//! [`telemetry`].
//! What only crisp's own tests (`tests/it/`, `e2e/`), the benchmark and the fuzz targets reach
//! is public only with the `test-util` feature, which those turn on through their dependency on
//! this crate (Cargo.toml): the other modules through the paired `cfg` declarations below, single items of
//! the binary's modules through `#[cfg_attr(feature = "test-util", visibility::make(pub))]`,
//! and items nothing but a test calls through `#[cfg(any(test, feature = "test-util"))]`.
//! Without the feature (the binary, the release artifacts) all of it is `pub(crate)`, and
//! `hack/lint.sh` denies the dead code that would hide behind the gate. Everything else is
//! `pub(crate)` or private. The reference is built for maintainers, private items included
//! (`hack/lint.sh` runs `cargo doc --document-private-items` with warnings denied), so a doc link
//! may name a private item.
#![allow(rustdoc::private_intra_doc_links)]
// `unsafe` lives in `sys` only, each block with the proof of its conditions (sys/mod.rs lists
// them); everything else is safe code over owned and borrowed descriptors.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

// What the binary (`src/bin/crisp/`) uses.
pub mod admin_api;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod doctor;
pub mod telemetry;

// What only crisp's own tests, benchmarks and fuzz targets reach from outside the crate: `pub`
// with the `test-util` feature, `pub(crate)` without it (the binary and the release artifacts).
// Each is declared twice, under the two `cfg`s, and never through a macro: rustfmt follows plain
// `mod` declarations only (hack/lint.sh checks that rustfmt reaches every file under src/).
#[cfg(feature = "test-util")]
pub mod admin;
#[cfg(not(feature = "test-util"))]
pub(crate) mod admin;
#[cfg(feature = "test-util")]
pub mod cri;
#[cfg(not(feature = "test-util"))]
pub(crate) mod cri;
#[cfg(feature = "test-util")]
pub mod hold_events;
#[cfg(not(feature = "test-util"))]
pub(crate) mod hold_events;
#[cfg(feature = "test-util")]
pub mod intercept;
#[cfg(not(feature = "test-util"))]
pub(crate) mod intercept;
#[cfg(feature = "test-util")]
pub mod metrics;
#[cfg(not(feature = "test-util"))]
pub(crate) mod metrics;
#[cfg(feature = "test-util")]
pub mod netns;
#[cfg(not(feature = "test-util"))]
pub(crate) mod netns;
#[cfg(feature = "test-util")]
pub mod ordering;
#[cfg(not(feature = "test-util"))]
pub(crate) mod ordering;
#[cfg(feature = "test-util")]
pub mod otel;
#[cfg(not(feature = "test-util"))]
pub(crate) mod otel;
#[cfg(feature = "test-util")]
pub mod proxy;
#[cfg(not(feature = "test-util"))]
pub(crate) mod proxy;
#[cfg(feature = "test-util")]
pub mod readiness;
#[cfg(not(feature = "test-util"))]
pub(crate) mod readiness;
#[cfg(feature = "test-util")]
pub mod status;
#[cfg(not(feature = "test-util"))]
pub(crate) mod status;
#[cfg(feature = "test-util")]
#[allow(unsafe_code)]
pub mod sys;
#[cfg(not(feature = "test-util"))]
#[allow(unsafe_code)]
pub(crate) mod sys;
#[cfg(feature = "test-util")]
pub mod systemd;
#[cfg(not(feature = "test-util"))]
pub(crate) mod systemd;
#[cfg(feature = "test-util")]
pub mod tap;
#[cfg(not(feature = "test-util"))]
pub(crate) mod tap;
#[cfg(feature = "test-util")]
pub mod tenant;
#[cfg(not(feature = "test-util"))]
pub(crate) mod tenant;
#[cfg(feature = "test-util")]
pub mod watchdog;
#[cfg(not(feature = "test-util"))]
pub(crate) mod watchdog;
