//! crisp's end-to-end tests (a private containerd + runc, driven by the kubelet emulator), in
//! one test binary: each module below was a test binary of its own (a file directly in
//! `e2e/tests/`), and each of those linked crisp and the harness again.
//!
//! Modules of one binary run side by side under a plain `cargo test`; hack/test.sh runs the
//! binary once per module (`cargo test -p crisp-e2e --test it -- observe::`), so the load and
//! timing tests (reliability_*, adversarial, soak_grpcgo) share the machine only with the tests
//! of their own module, as before. docs/TESTING.md has the test policy.

// Shared helpers of the reliability modules.
mod reliability_support;

// One module per former test binary.
mod adversarial;
// The emulator's own tests (no crisp in the path).
mod emulator;
mod exec_flood;
mod grpcgo_peers;
mod harness_smoke;
mod jobs;
mod native_sidecars;
mod observe;
mod ordering;
mod pods;
mod probe_isolated;
mod probe_netns;
mod prometheus;
mod reliability_crisp_chaos;
mod reliability_faults;
mod reliability_huge;
mod reliability_intents;
mod reliability_load;
mod reliability_slow;
mod replay_as_runtime;
mod replay_incident;
mod soak_grpcgo;
mod tap_snapshot;
mod timeline_demo;
mod transparency;
