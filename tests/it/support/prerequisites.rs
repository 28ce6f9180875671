//! What a test needs from the machine, checked where the test runs: a test that cannot run here
//! fails and says why, instead of passing without running (docs/TESTING.md, "The test policy").
//! CI runs as root after hack/setup.sh, so every test runs there.

use std::process::{Command, Stdio};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the calling test unless it runs as root; `why` says what it does that needs root.
#[track_caller]
pub fn require_root(why: &str) {
    assert!(
        is_root(),
        "this test needs root ({why}): run it as root, as CI does (`sudo hack/test.sh`)"
    );
}

/// Fails the calling test unless `tool` runs (`tool version_arg` exits 0).
#[track_caller]
pub fn require_tool(tool: &str, version_arg: &str) {
    let runs = Command::new(tool)
        .arg(version_arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        runs,
        "this test needs `{tool}`: install it with hack/setup.sh"
    );
}
