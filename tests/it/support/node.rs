//! A real systemd node for tests/it/node_*.rs: Debian 12 booted by systemd-nspawn with systemd as
//! PID 1 and containerd as a systemd service, plus a stand-in kubelet unit.
//!
//! The root filesystem is built once by hack/node-rootfs.sh (debootstrap, cached under
//! /var/cache/crisp); each `Node` boots an overlay of it (the cache is never written) with its
//! own /var/lib/containerd on the host's filesystem (containerd's overlay snapshotter cannot
//! stack on the overlay root). Flags as found to work on these hosts: `-b --register=no
//! --keep-unit --capability=CAP_NET_ADMIN --system-call-filter=@keyring --console=pipe` (no
//! machinectl: the host has no systemd; no --volatile=overlay). Commands run inside through
//! `nsenter -t <node init> -a systemd-run --wait --pipe`, so they get the node's own seccomp
//! filter, capabilities and cgroup, like a unit would.
//!
//! The node's containerd is Debian's (1.6.20) unless `CRISP_LANE_CONTAINERD_BIN` names another
//! containerd binary (hack/containerd-versions.sh builds one): that binary and the
//! `containerd-shim-runc-v2` and `ctr` beside it are bound read-only over the rootfs's
//! /usr/bin ones, so Debian's containerd.service, the shim it starts and `ctr` all are that
//! build ([`containerd_binds`]).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// The crisp binary the lanes run: `CRISP_LANE_CRISP_BIN` (a release build, where a lane measures
/// crisp's CPU) or this test build's.
pub fn crisp_bin() -> std::path::PathBuf {
    std::env::var_os("CRISP_LANE_CRISP_BIN")
        .map_or_else(|| env!("CARGO_BIN_EXE_crisp").into(), Into::into)
}

/// Where hack/release.sh put the artifacts (hack/test.sh builds them into target/artifacts).
pub fn dist() -> PathBuf {
    let d = std::env::var_os("CRISP_DIST")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(REPO).join("target/artifacts"));
    assert!(d.join("SHA256SUMS").exists(), "no release artifacts in {}: run `hack/release.sh --out target/artifacts` (hack/test.sh does)", d.display());
    d
}

/// The one artifact in dist/ whose name starts with `prefix` and ends with `suffix`.
pub fn artifact(prefix: &str, suffix: &str) -> PathBuf {
    let d = dist();
    let mut found: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(prefix) && n.ends_with(suffix)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {prefix}*{suffix} in {}: {found:?}",
        d.display()
    );
    found.pop().unwrap()
}

pub fn grpcgo() -> PathBuf {
    let p = Path::new(REPO).join("target/grpcgo/crisp-grpcgo");
    assert!(
        p.exists(),
        "{} missing: run hack/build-grpcgo.sh (hack/test.sh does)",
        p.display()
    );
    p
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.code == 0
    }
    pub fn all(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn output(c: &mut Command) -> Out {
    let o = c.output().unwrap_or_else(|e| panic!("run {c:?}: {e}"));
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    }
}

/// Units whose failure does not concern the tests: they record the boot for `who`/`last`.
const IRRELEVANT_UNITS: &[&str] = &[
    "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service",
];

pub struct Node {
    dir: tempfile::TempDir,
    nspawn: Child,
    pub init: u32,
    pub boot_time: Duration,
}

impl Node {
    /// Boots a fresh node and waits until systemd reports it up.
    pub fn boot() -> Node {
        Node::boot_with(&[
            "--capability=CAP_NET_ADMIN",
            "--system-call-filter=@keyring",
        ])
    }

    /// Boots a node that can run a real kubelet and runc-started pods (the cluster lane,
    /// tests/it/cluster_rollout.rs): every capability, and the system calls runc and kubelet make
    /// (mount, keyring, privileged ones). TESTBED facts: without them runc's container init or
    /// kubelet's container manager fails inside the node.
    pub fn boot_for_kubelet() -> Node {
        Node::boot_with(&[
            "--capability=all",
            "--system-call-filter=@keyring @mount @privileged",
        ])
    }

    /// `boot` with these nspawn flags for capabilities and the system-call filter.
    pub fn boot_with(security: &[&str]) -> Node {
        let rootfs = output(Command::new("bash").arg(Path::new(REPO).join("hack/node-rootfs.sh")));
        assert!(rootfs.ok(), "hack/node-rootfs.sh: {}", rootfs.all());
        let lower = rootfs.stdout.trim().to_string();
        let dir = tempfile::Builder::new()
            .prefix("crisp-node")
            .tempdir_in("/var/tmp")
            .unwrap();
        for d in ["upper", "work", "root", "containerd"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let root = dir.path().join("root");
        let opts = format!(
            "lowerdir={lower},upperdir={},workdir={}",
            dir.path().join("upper").display(),
            dir.path().join("work").display()
        );
        let m = output(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &opts])
                .arg(&root),
        );
        assert!(m.ok(), "mount overlay: {}", m.all());
        let t0 = Instant::now();
        let console = std::fs::File::create(dir.path().join("console.log")).unwrap();
        let nspawn = Command::new("systemd-nspawn")
            .arg("-D")
            .arg(&root)
            .args(["-b", "--register=no", "--keep-unit", "--console=pipe"])
            .args(security)
            .args(containerd_binds())
            .arg(format!(
                "--bind={}:/var/lib/containerd",
                dir.path().join("containerd").display()
            ))
            .stdin(Stdio::null())
            .stdout(console.try_clone().unwrap())
            .stderr(console)
            .spawn()
            .expect("systemd-nspawn (Debian systemd-container; hack/setup.sh installs it)");
        let mut node = Node {
            dir,
            nspawn,
            init: 0,
            boot_time: Duration::ZERO,
        };
        // The node's PID 1 is nspawn's child once it has exec'd systemd: nspawn's first children
        // are short-lived helpers (an nsenter into one of those fails once it has exited).
        let deadline = Instant::now() + Duration::from_secs(60);
        while node.init == 0 {
            assert!(
                Instant::now() < deadline,
                "systemd-nspawn started no init: {}",
                node.console()
            );
            if let Ok(Some(st)) = node.nspawn.try_wait() {
                panic!("systemd-nspawn exited ({st}): {}", node.console());
            }
            let kids = output(
                Command::new("pgrep")
                    .arg("-P")
                    .arg(node.nspawn.id().to_string()),
            );
            let is_init = |pid: &u32| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "systemd")
            };
            node.init = kids
                .stdout
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .find(is_init)
                .unwrap_or(0);
            std::thread::sleep(Duration::from_millis(20));
        }
        // `is-system-running --wait` returns once boot is over: "running", or "degraded" if a
        // unit failed (named in the panic).
        loop {
            let s = node.nsenter(&["systemctl", "is-system-running", "--wait"]);
            match s.stdout.trim() {
                "running" => break,
                "degraded" => {
                    // A unit that only records the boot (utmp) fails now and then in a container
                    // on a loaded host; it has nothing to do with containerd, kubelet or crisp.
                    // So does any other boot unit whose process systemd could not put in its
                    // cgroup (status 219/CGROUP: two nodes booting side by side on this host,
                    // seen for systemd-tmpfiles-setup and systemd-user-sessions). Anything else
                    // failing, or the node's containerd, kubelet or crisp failing at all, is the
                    // node's or crisp's fault.
                    let failed = node.nsenter(&[
                        "systemctl",
                        "--failed",
                        "--plain",
                        "--no-legend",
                        "--no-pager",
                    ]);
                    let units: Vec<String> = failed
                        .stdout
                        .lines()
                        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                        .collect();
                    let tolerated = |u: &str| {
                        IRRELEVANT_UNITS.contains(&u)
                            || (!["containerd", "kubelet", "crisp"]
                                .iter()
                                .any(|ours| u.starts_with(ours))
                                && node
                                    .nsenter(&[
                                        "systemctl",
                                        "show",
                                        "-p",
                                        "ExecMainStatus",
                                        "--value",
                                        u,
                                    ])
                                    .stdout
                                    .trim()
                                    == "219")
                    };
                    if units.is_empty() || units.iter().any(|u| !tolerated(u)) {
                        let journals: Vec<String> = units
                            .iter()
                            .map(|u| {
                                let j = node.nsenter(&[
                                    "journalctl",
                                    "-b",
                                    "-u",
                                    u,
                                    "--no-pager",
                                    "-n",
                                    "30",
                                ]);
                                format!("--- journalctl -u {u}\n{}", j.all())
                            })
                            .collect();
                        panic!(
                            "node degraded: {}\n{}",
                            node.nsenter(&["systemctl", "--failed", "--no-pager"]).all(),
                            journals.join("\n")
                        );
                    }
                    eprintln!("node: boot ended degraded by {units:?} only; carrying on");
                    break;
                }
                _ if Instant::now() > deadline => {
                    panic!("node did not boot: {} {}", s.all(), node.console())
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        node.boot_time = t0.elapsed();
        node
    }

    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("console.log")).unwrap_or_default()
    }

    /// The node's / as seen from the host.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// A path inside the node, as seen from the host.
    pub fn path(&self, p: &str) -> PathBuf {
        self.root().join(p.trim_start_matches('/'))
    }

    /// Writes a file into the node (parents created).
    pub fn put(&self, p: &str, content: &[u8], mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A file's content inside the node ("" if missing). Through the node's mount namespace:
    /// its /run and /tmp are its own tmpfs mounts, not in the overlay.
    pub fn read(&self, p: &str) -> String {
        self.nsenter(&["cat", p]).stdout
    }

    /// Whether a path exists inside the node (any /run or /tmp mount included).
    pub fn exists(&self, p: &str) -> bool {
        self.nsenter(&["test", "-e", p]).ok()
    }

    /// Plain nsenter into every namespace of the node (for systemctl; bypasses the node's
    /// seccomp and capabilities, so real work goes through `run`).
    pub fn nsenter(&self, args: &[&str]) -> Out {
        output(
            Command::new("nsenter")
                .arg("-t")
                .arg(self.init.to_string())
                .arg("-a")
                .arg("--")
                .args(args),
        )
    }

    /// Runs a command inside the node as a transient systemd service, waiting for it.
    pub fn run(&self, args: &[&str]) -> Out {
        self.run_env(&[], args)
    }

    pub fn run_env(&self, env: &[(&str, &str)], args: &[&str]) -> Out {
        let mut c = Command::new("nsenter");
        c.arg("-t").arg(self.init.to_string()).arg("-a").arg("--");
        c.args([
            "systemd-run",
            "--wait",
            "--pipe",
            "--quiet",
            "--collect",
            "--service-type=exec",
        ]);
        for (k, v) in env {
            c.arg(format!("--setenv={k}={v}"));
        }
        c.arg("--").args(args);
        output(c.stdin(Stdio::null()))
    }

    /// `run`, asserting success.
    pub fn must(&self, args: &[&str]) -> Out {
        let o = self.run(args);
        assert!(o.ok(), "in the node: {args:?}: {}", o.all());
        o
    }

    /// `sh -c SCRIPT` inside the node.
    pub fn sh(&self, script: &str) -> Out {
        self.run(&["/bin/sh", "-c", script])
    }

    /// A unit's property, e.g. `prop("kubelet.service", "InvocationID")`.
    pub fn prop(&self, unit: &str, key: &str) -> String {
        self.nsenter(&["systemctl", "show", "-P", key, unit])
            .stdout
            .trim()
            .to_string()
    }

    /// Waits until `f` holds (checked every 100 ms) or panics with `what`.
    pub fn wait_for(&self, what: &str, timeout: Duration, mut f: impl FnMut(&Node) -> bool) {
        let deadline = Instant::now() + timeout;
        while !f(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every file, link and directory under the node's `trees`: type, mode, owner, and for
    /// files content hash and mtime, for links the target. Directory mtimes are left out
    /// (adding and removing a file changes them).
    pub fn snapshot(&self, trees: &[&str]) -> String {
        let script = format!(
            "find {} -xdev \\( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/lib/systemd/random-seed -o -path /var/lib/systemd/timers -o -path /var/lib/systemd/catalog -o -path /var/lib/containerd \\) -prune -o \\( -type d -printf '%p d %m %U:%G\\n' \\) -o \\( -type l -printf '%p l %l\\n' \\) -o \\( -type f -printf '%p f %m %U:%G %T@ ' -exec sha256sum {{}} \\; \\) | LC_ALL=C sort",
            trees.join(" ")
        );
        let o = self.sh(&script);
        assert!(o.ok(), "snapshot: {}", o.all());
        o.stdout
    }

    /// Installs the stand-in kubelet: a kubeadm-style kubelet.service (unit, 10-kubeadm.conf
    /// drop-in, kubeadm-flags.env, config.yaml) whose /usr/bin/kubelet records its command line
    /// and dials its runtime endpoint with grpc-go's client every 200 ms, as kubelet would.
    /// Enabled and started; returns once it reached the runtime.
    pub fn add_kubelet_standin(&self) {
        let grpcgo = std::fs::read(grpcgo()).unwrap();
        self.put("/opt/kubelet-standin/crisp-grpcgo", &grpcgo, 0o755);
        self.put("/usr/bin/kubelet", KUBELET_STANDIN.as_bytes(), 0o755);
        self.put(
            "/lib/systemd/system/kubelet.service",
            KUBELET_UNIT.as_bytes(),
            0o644,
        );
        self.put(
            "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
            KUBEADM_DROPIN.as_bytes(),
            0o644,
        );
        self.put(
            "/var/lib/kubelet/kubeadm-flags.env",
            KUBEADM_FLAGS.as_bytes(),
            0o644,
        );
        self.put(
            "/var/lib/kubelet/config.yaml",
            KUBELET_CONFIG.as_bytes(),
            0o644,
        );
        self.put("/etc/default/kubelet", b"KUBELET_EXTRA_ARGS=\n", 0o644);
        let o = self.nsenter(&["systemctl", "daemon-reload"]);
        assert!(o.ok(), "{}", o.all());
        let o = self.nsenter(&["systemctl", "enable", "--now", "kubelet.service"]);
        assert!(o.ok(), "{}", o.all());
        self.wait_kubelet_on("/run/containerd/containerd.sock", "");
    }

    /// This build's crisp, as the node's /usr/local/bin/crisp.
    pub fn put_crisp(&self) {
        self.put(
            "/usr/local/bin/crisp",
            &std::fs::read(crisp_bin()).unwrap(),
            0o755,
        );
    }

    /// The running kubelet's command line (its `/proc/PID/cmdline`, NULs as spaces).
    pub fn kubelet_cmdline(&self) -> String {
        self.nsenter(&[
            "sh",
            "-c",
            "tr '\\0' ' ' </proc/$(systemctl show -P MainPID kubelet)/cmdline",
        ])
        .stdout
    }

    /// Starts crisp in the node as transient unit `unit` (no Restart=: started again only by the
    /// test) on kubelet's socket `/run/crisp/crisp.sock`, in front of `upstream`.
    pub fn start_crisp(&self, unit: &str, upstream: &str) {
        let _ = self.nsenter(&["systemctl", "reset-failed", unit]);
        self.run_crisp_unit(unit, upstream, &[]);
    }

    /// `systemd-run` of this build's crisp on `/run/crisp/crisp.sock` in front of `upstream`, as
    /// `unit`, with `extra` systemd-run options.
    fn run_crisp_unit(&self, unit: &str, upstream: &str, extra: &[&str]) {
        let mut args = vec!["systemd-run", "--unit", unit, "--service-type=exec"];
        args.extend_from_slice(extra);
        args.extend([
            "--",
            "/usr/local/bin/crisp",
            "--listen",
            "/run/crisp/crisp.sock",
            "--upstream",
            upstream,
            "--log-level",
            "info",
        ]);
        let o = self.nsenter(&args);
        assert!(o.ok(), "start crisp: {}", o.all());
    }

    /// Starts crisp as the .deb deploys it (systemd/crisp.socket): systemd holds the listening
    /// socket `/run/crisp/crisp.sock` in a transient `unit.socket`, so kubelet's dials while
    /// crisp is down wait in the backlog for the next crisp instead of being refused; the
    /// service is started now, and again by each later call after a kill. No start limit: a
    /// kill storm restarts it a hundred times a minute.
    pub fn start_crisp_activated(&self, unit: &str, upstream: &str) {
        let (socket, service) = (format!("{unit}.socket"), format!("{unit}.service"));
        let _ = self.nsenter(&["systemctl", "reset-failed", &service]);
        if self.prop(&socket, "ActiveState") != "active" {
            self.run_crisp_unit(
                unit,
                upstream,
                &[
                    "--socket-property=ListenStream=/run/crisp/crisp.sock",
                    "--socket-property=Backlog=1024",
                    "--property=StartLimitIntervalSec=0",
                ],
            );
        }
        let o = self.nsenter(&["systemctl", "start", &service]);
        assert!(o.ok(), "start crisp: {}", o.all());
    }

    /// SIGKILLs crisp started by [`Node::start_crisp_activated`]; returns once that process is
    /// gone. Its state is no sign of that: kubelet's next dial re-activates the service at once.
    pub fn kill_crisp_activated(&self, unit: &str) {
        let service = format!("{unit}.service");
        let pid = self.prop(&service, "MainPID");
        let o = self.nsenter(&["systemctl", "kill", "--signal=KILL", &service]);
        assert!(o.ok(), "kill crisp: {}", o.all());
        self.wait_for("crisp killed", Duration::from_secs(10), |n| {
            n.prop(&service, "MainPID") != pid
        });
    }

    /// The last `lines` lines of `unit`'s journal.
    pub fn journal(&self, unit: &str, lines: usize) -> String {
        let lines = lines.to_string();
        self.nsenter(&["journalctl", "-u", unit, "-n", &lines, "--no-pager"])
            .stdout
    }

    /// Waits until each of `socks` (paths inside the node, reached through its init's root)
    /// accepts a connection, for at most 30 s (then panics with `unit`'s journal): how long that
    /// took.
    pub fn wait_accepting(&self, unit: &str, socks: &[&str]) -> Duration {
        let socks: Vec<String> = socks
            .iter()
            .map(|p| format!("/proc/{}/root{p}", self.init))
            .collect();
        let t = Instant::now();
        while socks
            .iter()
            .any(|sock| std::os::unix::net::UnixStream::connect(sock).is_err())
        {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "crisp's sockets never accepted: {}",
                self.journal(unit, 30)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        t.elapsed()
    }

    /// SIGKILLs the crisp of `unit` ([`Node::start_crisp`]) and waits until the unit has no
    /// process left.
    pub fn kill_crisp(&self, unit: &str) {
        let o = self.nsenter(&["systemctl", "kill", "--signal=KILL", unit]);
        assert!(o.ok(), "kill crisp: {}", o.all());
        self.wait_for("crisp gone", Duration::from_secs(10), |n| {
            let s = n.prop(&format!("{unit}.service"), "ActiveState");
            s != "active" && s != "deactivating"
        });
    }

    /// Waits until the stand-in kubelet's last CRI call, made by an invocation other than
    /// `not_invocation` ("" for any), went to `endpoint` and succeeded; returns that line.
    pub fn wait_kubelet_on(&self, endpoint: &str, not_invocation: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let inv = self.prop("kubelet.service", "InvocationID");
            let last = self.read("/run/kubelet-standin/last");
            if inv != not_invocation && last.starts_with(&format!("ok {inv} {endpoint} ")) {
                return last;
            }
            assert!(
                Instant::now() < deadline,
                "stand-in kubelet never reached {endpoint} in a new invocation (last call: {last:?}; {})",
                self.journal("kubelet", 20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The containerd binary the node runs instead of Debian's, from `CRISP_LANE_CONTAINERD_BIN`
/// (None: Debian's). Panics naming what is missing when the variable is set but the binary or
/// its shim and `ctr` are not beside it.
pub fn lane_containerd() -> Option<PathBuf> {
    let bin = PathBuf::from(std::env::var_os("CRISP_LANE_CONTAINERD_BIN")?);
    for b in ["containerd", "containerd-shim-runc-v2", "ctr"] {
        let p = bin.with_file_name(b);
        assert!(
            p.is_file(),
            "CRISP_LANE_CONTAINERD_BIN={}: no {} (hack/containerd-versions.sh SRC TAG OUT builds \
             OUT/bin/containerd with its shim and ctr)",
            bin.display(),
            p.display()
        );
    }
    Some(bin)
}

/// nspawn's `--bind-ro` flags that put [`lane_containerd`]'s three binaries over the rootfs's
/// /usr/bin ones (none without it).
pub fn containerd_binds() -> Vec<String> {
    let Some(bin) = lane_containerd() else {
        return Vec::new();
    };
    ["containerd", "containerd-shim-runc-v2", "ctr"]
        .iter()
        .map(|b| format!("--bind-ro={}:/usr/bin/{b}", bin.with_file_name(b).display()))
        .collect()
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.init != 0 {
            // SIGRTMIN+4 asks systemd for a poweroff.
            unsafe { libc::kill(self.init as i32, libc::SIGRTMIN() + 4) };
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
        let _ = Command::new("umount").arg("-l").arg(self.root()).status();
    }
}

/// Hex of a CRI VersionRequest{version: "v1"}.
pub const VERSION_REQ_HEX: &str = "0a027631";
/// "containerd" in hex: containerd's VersionResponse carries it as runtime_name.
pub const CONTAINERD_HEX: &str = "636f6e7461696e657264";

const KUBELET_STANDIN: &str = r#"#!/bin/bash
# kubelet stand-in (tests/it/support/node.rs): answers --version like kubelet 1.26, records its command
# line, and dials its --container-runtime-endpoint with grpc-go's client (RuntimeService/Version)
# every 200 ms, writing each result to /run/kubelet-standin/last.
if [[ "${1:-}" == --version ]]; then echo "Kubernetes v1.26.15"; exit 0; fi
state=/run/kubelet-standin
mkdir -p "$state"
printf '%s\n' "$*" >"$state/cmdline"
ep=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --container-runtime-endpoint=*) ep="${args[i]#*=}" ;;
    --container-runtime-endpoint) ep="${args[i + 1]}" ;;
  esac
done
[[ -n "$ep" ]] || { echo "no --container-runtime-endpoint" >&2; exit 1; }
target="${ep#unix://}"
while :; do
  if out="$(/opt/kubelet-standin/crisp-grpcgo call --target "$target" --method /runtime.v1.RuntimeService/Version --hex 0a027631 --timeout 5s 2>&1)"; then
    r=ok
  else
    r=failed
  fi
  printf '%s %s %s %s\n' "$r" "$INVOCATION_ID" "$target" "$(head -1 <<<"$out")" >"$state/last.tmp"
  mv -f "$state/last.tmp" "$state/last"
  sleep 0.2
done
"#;

const KUBELET_UNIT: &str = "[Unit]\nDescription=kubelet stand-in (crisp tests)\nWants=network-online.target\nAfter=network-online.target\n\n[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\nRestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n";

pub const KUBEADM_DROPIN: &str = r#"# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"#;

const KUBEADM_FLAGS: &str = "KUBELET_KUBEADM_ARGS=\"--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.9\"\n";

const KUBELET_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nclusterDNS:\n- 10.96.0.10\n";
