//! Issue #8, security: crisp's sockets are created with their final mode (CRI socket 0660, admin
//! socket 0600) — there is no moment in which a connection could be made while the file has a
//! looser mode. (Ordering chmod before listen is not enough on its own: the kernel checks a
//! client's permission on the file before it checks that the socket listens, so a connect that
//! passed the check on a 0777 file can complete just after listen. The hammer below caught that
//! once under load before crisp set its umask around bind.)
//!
//! What is proven, and how:
//! 1. The syscall order, deterministically: crisp's start is traced with strace; for both
//!    sockets, a umask that hides every bit outside the mode → `bind(path)` →
//!    `chmod(path, mode)` → `listen(fd)`, and nothing changes the mode after `listen`. (Fails,
//!    naming hack/setup.sh, if strace is not installed.)
//! 2. The effect, empirically: crisp is started with umask 000 (so a freshly bound socket file is
//!    0777) while threads whose filesystem uid is `nobody` connect to both paths in a tight loop,
//!    from before crisp starts until after it serves. Not one connect may succeed: before
//!    `listen` they are refused, after the chmod denied. The same hammer is first pointed at a
//!    deliberately wrong order (listen, then chmod 1 ms later) to show it does catch a window of
//!    that size. A window far shorter than one connect attempt (~µs) could escape (2) — which is
//!    why (1) exists.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::daemon_bin::{crisp, write_config};
use crate::prerequisites::{require_root, require_tool};

const NOBODY: u32 = 65534;

fn world_traversable_tempdir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("crisp-sockmode")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn wait_connectable(paths: &[PathBuf], limit: Duration) {
    let deadline = Instant::now() + limit;
    while !paths
        .iter()
        .all(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
    {
        assert!(
            Instant::now() < deadline,
            "crisp did not listen on {paths:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn stop(child: &mut std::process::Child) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}

// ---------------------------------------------------------------------------------------------
// 1. strace

#[test]
fn sockets_get_their_mode_between_bind_and_listen_strace() {
    require_root("traces crisp's start as CI runs it");
    require_tool("strace", "-V");
    let dir = world_traversable_tempdir();
    let cfg = write_config(dir.path());
    let trace = dir.path().join("strace.out");
    let log = dir.path().join("crisp.log");
    let mut c = crisp(&cfg, &log);
    let mut cmd = Command::new("strace");
    cmd.args([
        "-f",
        "-qq",
        "-e",
        "trace=bind,listen,chmod,fchmod,fchmodat,umask",
        "-o",
    ])
    .arg(&trace)
    .arg(c.get_program())
    .args(c.get_args());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let _ = &mut c;
    let mut child = cmd.spawn().unwrap();
    let (sock, admin) = (dir.path().join("crisp.sock"), dir.path().join("admin.sock"));
    wait_connectable(&[sock.clone(), admin.clone()], Duration::from_secs(20));
    // SIGTERM crisp itself (the traced process: the pid on the trace's lines), then strace ends.
    let text = std::fs::read_to_string(&trace).unwrap();
    let traced: i32 = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .expect("a pid in the trace");
    let crisp_pid = std::fs::read_to_string(format!("/proc/{traced}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(traced);
    unsafe { libc::kill(crisp_pid, libc::SIGTERM) };
    let _ = child.wait();
    let text = std::fs::read_to_string(&trace).unwrap();
    for (path, mode) in [(&sock, "0660"), (&admin, "0600")] {
        let p = path.display().to_string();
        let lines: Vec<&str> = text.lines().collect();
        let bind = lines
            .iter()
            .position(|l| {
                l.contains("bind(")
                    && l.contains(&format!("sun_path=\"{p}\""))
                    && l.trim_end().ends_with("= 0")
            })
            .unwrap_or_else(|| panic!("no bind of {p} in:\n{text}"));
        let fd: String = lines[bind]
            .split("bind(")
            .nth(1)
            .unwrap()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        // The umask in force at bind hides every bit the final mode lacks: the file is never
        // created looser than that mode (a connect that passed the permission check on a looser
        // file could otherwise still complete after listen).
        let want = !u32::from_str_radix(mode, 8).unwrap() & 0o777;
        let mask = lines[..bind]
            .iter()
            .rev()
            .find_map(|l| l.split("umask(").nth(1))
            .and_then(|r| u32::from_str_radix(r.split(')').next().unwrap_or(""), 8).ok())
            .unwrap_or_else(|| panic!("{p}: no umask before its bind:\n{text}"));
        assert_eq!(
            mask & want,
            want,
            "{p}: bound under umask {mask:04o}, which lets bits outside {mode} through"
        );
        let chmod = lines
            .iter()
            .enumerate()
            .skip(bind)
            .find(|(_, l)| {
                (l.contains("chmod(") || l.contains("chmodat(")) && l.contains(&format!("\"{p}\""))
            })
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no chmod of {p} after its bind:\n{text}"));
        assert!(
            lines[chmod].contains(mode) && lines[chmod].trim_end().ends_with("= 0"),
            "{p}: {}",
            lines[chmod]
        );
        let listen = lines
            .iter()
            .enumerate()
            .skip(bind)
            .find(|(_, l)| l.contains(&format!("listen({fd},")))
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no listen({fd}) for {p}:\n{text}"));
        assert!(
            bind < chmod && chmod < listen,
            "{p}: bind line {bind}, chmod line {chmod}, listen line {listen}:\n{text}"
        );
        let later = lines[listen..]
            .iter()
            .filter(|l| l.contains(&format!("\"{p}\"")) && l.contains("chmod"))
            .count();
        assert_eq!(later, 0, "{p}: its mode is changed after listen:\n{text}");
        eprintln!("{p}: umask {mask:04o} → bind → chmod {mode} → listen({fd}) (strace lines {bind}, {chmod}, {listen})");
    }
}

// ---------------------------------------------------------------------------------------------
// 2. A non-root connect hammer racing crisp's start

#[derive(Default)]
struct Tally {
    connected: AtomicU64,
    refused: AtomicU64,
    denied: AtomicU64,
    other: AtomicU64,
}

/// Threads with fsuid/fsgid `nobody` (which drops CAP_DAC_OVERRIDE for that thread only)
/// connecting to each path until `stop`.
fn hammer(
    paths: Vec<PathBuf>,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Vec<std::thread::JoinHandle<()>> {
    paths
        .into_iter()
        .map(|p| {
            let (stop, tally) = (stop.clone(), tally.clone());
            std::thread::spawn(move || {
                unsafe {
                    libc::setfsgid(NOBODY);
                    libc::setfsuid(NOBODY);
                }
                while !stop.load(Ordering::Relaxed) {
                    match std::os::unix::net::UnixStream::connect(&p) {
                        Ok(_) => {
                            eprintln!("connected as nobody to {}", p.display());
                            tally.connected.fetch_add(1, Ordering::Relaxed)
                        }
                        Err(e)
                            if matches!(
                                e.raw_os_error(),
                                Some(libc::ECONNREFUSED) | Some(libc::ENOENT)
                            ) =>
                        {
                            tally.refused.fetch_add(1, Ordering::Relaxed)
                        }
                        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                            tally.denied.fetch_add(1, Ordering::Relaxed)
                        }
                        Err(_) => tally.other.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect()
}

/// The control: bind (umask 000 → 0777), listen, and only `window` later chmod 0660 — the wrong
/// order. The hammer must catch it.
fn wrong_order_is_caught(dir: &Path, window: Duration) -> u64 {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join("wrong.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let threads = hammer(vec![path.clone()], stop.clone(), tally.clone());
    // The hammer is running once it has been refused (no socket yet).
    let t0 = Instant::now();
    while tally.refused.load(Ordering::Relaxed) == 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::yield_now();
    }
    let l = bind_under_umask_000(&path);
    std::thread::sleep(window);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    drop(l);
    tally.connected.load(Ordering::Relaxed)
}

/// Binds `path` with umask 000 (a 0777 socket file) on a thread of its own that first stops
/// sharing its umask with the process (`unshare(CLONE_FS)`): the umask is process-wide, and
/// the other tests of this binary create files and sockets meanwhile (crisp's own bind sets
/// and restores it under a lock this test cannot take).
fn bind_under_umask_000(path: &Path) -> std::os::unix::net::UnixListener {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_FS) only gives this thread its own copy of the umask, cwd and
        // root; umask cannot fail. The thread ends right after the bind.
        unsafe {
            assert_eq!(
                libc::unshare(libc::CLONE_FS),
                0,
                "unshare(CLONE_FS): {}",
                std::io::Error::last_os_error()
            );
            libc::umask(0);
        }
        std::os::unix::net::UnixListener::bind(&path).unwrap()
    })
    .join()
    .unwrap()
}

#[test]
fn no_non_root_connect_ever_succeeds_while_crisp_starts() {
    require_root("connects as nobody");
    let dir = world_traversable_tempdir();
    // On a loaded machine the hammer's threads may be off-CPU for a whole 1 ms window: a few
    // tries, each a fresh socket and twice the window (1, 2, … 32 ms; seen: 1 ms missed 5 times
    // in a row with both cores saturated by other processes).
    let (mut caught, mut tries, mut window) = (0, 0, Duration::from_millis(1));
    while caught == 0 && tries < 6 {
        caught = wrong_order_is_caught(&dir.path().join(format!("ctl{tries}")), window);
        tries += 1;
        if caught == 0 {
            window *= 2;
        }
    }
    assert!(caught > 0, "in 6 tries the hammer did not catch even a {window:?} window with a 0777 listening socket: it proves nothing");

    let cfg = write_config(dir.path());
    let (sock, admin) = (dir.path().join("crisp.sock"), dir.path().join("admin.sock"));
    let stop_flag = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut rounds = 0;
    let started = Instant::now();
    // Several starts of crisp, each raced from before its exec until after it serves.
    for round in 0..5 {
        let threads = hammer(
            vec![sock.clone(), admin.clone(), sock.clone(), admin.clone()],
            stop_flag.clone(),
            tally.clone(),
        );
        std::thread::sleep(Duration::from_millis(10));
        let log = dir.path().join(format!("crisp-{round}.log"));
        let mut c = crisp(&cfg, &log);
        unsafe {
            c.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
        let mut child = c.spawn().unwrap();
        wait_connectable(&[sock.clone(), admin.clone()], Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(20));
        stop_flag.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        stop_flag.store(false, Ordering::Relaxed);
        assert_eq!(
            std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
            0o660
        );
        assert_eq!(
            std::fs::metadata(&admin).unwrap().permissions().mode() & 0o777,
            0o600
        );
        stop(&mut child);
        rounds += 1;
    }
    let (ok, refused, denied, other) = (
        tally.connected.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.denied.load(Ordering::Relaxed),
        tally.other.load(Ordering::Relaxed),
    );
    eprintln!(
        "control: {caught} connects caught in a {window:?} window of the wrong order (try {tries}); crisp: {rounds} starts raced by 4 nobody threads for {:.1} s: {ok} connected, {refused} refused (not listening yet), {denied} denied (final mode), {other} other",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        ok, 0,
        "a non-root client connected to a crisp socket during start"
    );
    assert!(
        refused > 0 && denied > 0,
        "the hammer did not cover both sides of listen()"
    );
}
