//! crisp's integration tests, in one test binary: each module below was a test binary of its
//! own (a file directly in `tests/`), and each of those linked the whole crate and compiled the
//! shared helpers again. One binary links once.
//!
//! Modules of one binary run side by side under a plain `cargo test`; hack/test.sh runs the
//! binary once per module (`cargo test -p crisp --test it -- forwarding::`), so the tests that
//! bound times or load share the machine only with the tests of their own module, as before.
//! The tests that must be alone in their process stay binaries of their own: tests/relay_sigpipe.rs
//! (restores SIGPIPE's default action, which would kill this process on any peer's hang-up) and
//! tests/exec_probe_memory.rs (its global allocator counts the heap of the whole process).
//! docs/TESTING.md has the test policy.

// Shared helpers, all in tests/it/support/: `support` itself (its mod.rs is compiled into
// tests/tap_memory.rs and tests/exec_probe_memory.rs too) and the parts only this binary uses.
#[path = "support/daemon_bin.rs"]
mod daemon_bin;
#[path = "support/node.rs"]
mod node_support;
#[path = "support/prerequisites.rs"]
mod prerequisites;
mod support;
#[path = "support/systemd.rs"]
mod systemd_support;

// One module per former test binary.
mod cluster_kubelets;
mod cluster_newer_pods;
mod cluster_observers;
mod cluster_pleg;
mod cluster_rollout;
mod cluster_runtimes;
mod deploy_manifests;
mod docs;
mod faults;
mod forwarding;
mod glossary;
mod grpc_go_wire;
mod hold_spans;
mod install_doctor;
mod install_layouts;
mod interceptor;
mod job_marks;
mod layers;
mod lifecycle;
mod newer_kubelets;
mod node_systemd;
mod pcap;
mod probe_burst;
mod relay_thread;
mod release_artifacts;
mod reliability_admin;
mod reliability_sockets;
mod resilience;
mod signals;
mod streamed_lists;
mod systemd_activation;
mod systemd_units;
mod tap_admin;
mod tap_filters;
mod tap_latency;
mod tap_redaction;
mod timeline;
