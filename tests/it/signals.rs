//! A SIGTERM is never lost and never kills crisp uncleanly, however early it comes: systemd may
//! stop a unit the moment its socket accepts connections. The real binary is started again and
//! again and sent SIGTERM as soon as its CRI socket accepts a connection; each time it must log
//! the request, exit 0 and remove its socket.
//!
//! (crisp used to install its handlers on the shutdown future's first poll, after binding: a
//! signal in between killed it by the default action, and one that tokio's reactor handled
//! between turning delivery on and subscribing reached no one, so crisp ran on until SIGKILL.)

use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

const STARTS: usize = 25;

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn start(dir: &Path, log: &Path) -> std::process::Child {
    crate::daemon_bin::crisp(&crate::daemon_bin::write_config(dir), log)
        .spawn()
        .unwrap()
}

#[test]
fn sigterm_the_moment_the_socket_accepts_stops_crisp_cleanly() {
    let dir = tempfile::Builder::new()
        .prefix("crisp-signals")
        .tempdir()
        .unwrap();
    let sock = dir.path().join("crisp.sock");
    for i in 0..STARTS {
        let log = dir.path().join(format!("crisp-{i}.log"));
        let mut child = start(dir.path(), &log);
        // No sleep: the signal goes out within microseconds of the first accepted connect.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(Instant::now() < deadline, "start {i}: crisp never listened");
            if let Some(st) = child.try_wait().unwrap() {
                panic!(
                    "start {i}: crisp exited before listening ({st}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::yield_now();
        }
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let st = wait_exit(&mut child, Duration::from_secs(15));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let st = st.unwrap_or_else(|| panic!("start {i}: crisp ignored a SIGTERM sent right after it listened (killed after 15 s):\n{text}"));
        assert!(
            st.success(),
            "start {i}: crisp did not exit cleanly on SIGTERM ({st}):\n{text}"
        );
        assert!(
            text.contains("shutdown requested"),
            "start {i}: no shutdown line:\n{text}"
        );
        assert!(!sock.exists(), "start {i}: socket left behind");
    }
}
