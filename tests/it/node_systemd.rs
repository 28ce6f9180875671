//! crisp's release artifacts on a real systemd node (tests/it/support/node.rs: Debian 12 booted by
//! systemd-nspawn, systemd as PID 1, containerd as a service, a stand-in kubelet that dials its
//! runtime endpoint with grpc-go's client):
//! - the .deb installs without touching kubelet; crisp-install points kubelet at crisp and
//!   `crisp doctor` reports OK; `systemctl restart crisp` under a grpc-go call loop through the
//!   socket-activated crisp loses no call; purging the package gives back every file byte for
//!   byte;
//! - the installer image, run by the node's own containerd as a privileged container with the
//!   node's root mounted (as the DaemonSet's pod), installs, is Ready, re-runs as a no-op and
//!   uninstalls byte for byte.
//!
//! Needs root, systemd-nspawn and debootstrap (hack/setup.sh), the artifacts of hack/release.sh
//! in target/artifacts and target/grpcgo/crisp-grpcgo (hack/test.sh makes both).

use std::time::{Duration, Instant};

use crate::node_support::*;

/// What the package, the installer and kubelet's rewiring may touch, and what must come back.
const TREES: &[&str] = &["/etc", "/usr", "/opt", "/var/lib", "/root"];

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Copies a release artifact into the node's /var/tmp (the node's /tmp is its own tmpfs).
fn put_artifact(node: &Node, file: &std::path::Path) -> String {
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    let p = format!("/var/tmp/{name}");
    node.put(&p, &std::fs::read(file).unwrap(), 0o644);
    p
}

fn doctor_ok(node: &Node, bin: &str) -> String {
    let d = node.run(&[bin, "doctor"]);
    assert!(
        d.ok() && d.stdout.contains("\n0 FAIL, 0 WARN, "),
        "crisp doctor on the node: {}",
        d.all()
    );
    d.stdout
}

/// grpc-go clients loop calls through crisp's socket while crisp.service restarts `restarts`
/// times: short-lived clients (two in flight; each process makes 500 calls on one connection,
/// then the next one dials anew), which may dial during a restart, and one paced client whose
/// connection stays open across every restart (a batch of 500 takes ~80 ms, so the short ones
/// alone were sometimes all between restarts). Neither may lose a call.
fn restart_under_load(node: &Node, restarts: usize) {
    let script = format!(
        "rm -f /run/crisp-load-stop; touch /run/crisp-load-started; /opt/kubelet-standin/crisp-grpcgo call --target /run/crisp/crisp.sock --method /runtime.v1.RuntimeService/Version --hex {VERSION_REQ_HEX} --timeout 10s --interval 5ms --duration 8s 2>&1 | tail -1 & end=$(($(date +%s) + 300)); while [ ! -e /run/crisp-load-stop ] && [ $(date +%s) -lt $end ]; do /opt/kubelet-standin/crisp-grpcgo call --target /run/crisp/crisp.sock --method /runtime.v1.RuntimeService/Version --hex {VERSION_REQ_HEX} --timeout 10s --count 500 --concurrency 2 2>&1 | tail -1; done; wait"
    );
    /// Ends the client loop however the scope below is left (a panic included), or the scope
    /// would wait for it forever.
    struct StopLoad<'a>(&'a Node);
    impl Drop for StopLoad<'_> {
        fn drop(&mut self) {
            self.0.nsenter(&["touch", "/run/crisp-load-stop"]);
        }
    }
    let (out, pids) = std::thread::scope(|s| {
        let h = s.spawn(|| node.sh(&script));
        let stop = StopLoad(node);
        node.wait_for("the first grpc-go calls", Duration::from_secs(20), |n| {
            n.exists("/run/crisp-load-started")
        });
        std::thread::sleep(Duration::from_millis(300));
        let mut pids = vec![node.prop("crisp.service", "MainPID")];
        for _ in 0..restarts {
            let o = node.nsenter(&["systemctl", "restart", "crisp.service"]);
            assert!(o.ok(), "systemctl restart crisp: {}", o.all());
            pids.push(node.prop("crisp.service", "MainPID"));
            std::thread::sleep(Duration::from_millis(300));
        }
        drop(stop);
        (h.join().unwrap(), pids)
    });
    let mut uniq = pids.clone();
    uniq.dedup();
    assert_eq!(
        uniq.len(),
        restarts + 1,
        "crisp really restarted each time: {pids:?}"
    );
    let (mut ok, mut failed, mut goaways) = (0u64, 0u64, 0u64);
    let field = |l: &str, k: &str| -> u64 {
        l.split(&format!("\"{k}\":"))
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    for l in out
        .stdout
        .lines()
        .filter(|l| l.contains("\"summary\":true"))
    {
        ok += field(l, "ok");
        failed += field(l, "failed");
        goaways += field(l, "goaway_recv");
    }
    assert!(
        failed == 0 && ok >= 1000,
        "grpc-go calls across `systemctl restart crisp`: {ok} ok, {failed} failed:\n{}",
        out.all()
    );
    assert!(
        goaways >= 1,
        "no connection was open across a restart (no GOAWAY seen): {}",
        out.all()
    );
    eprintln!("{restarts} restarts of crisp under grpc-go load: {ok} calls ok, 0 failed, {goaways} connections drained by GOAWAY");
}

/// crisp frozen (SIGSTOP: alive to systemd, serving nothing) under a paced grpc-go client, as
/// a wedged crisp would be: it stops sending WATCHDOG=1, systemd aborts and restarts it after
/// `WatchdogSec=`, and crisp.socket keeps the listening socket meanwhile. The one call in flight
/// on the frozen connection fails when the process dies (UNAVAILABLE, not its deadline); every
/// call after it succeeds on the new crisp.
fn freeze_under_load(node: &Node) {
    let pid = node.prop("crisp.service", "MainPID");
    let restarts = node.prop("crisp.service", "NRestarts");
    let script = format!(
        "rm -f /run/crisp-freeze-started; touch /run/crisp-freeze-started; /opt/kubelet-standin/crisp-grpcgo call --target /run/crisp/crisp.sock --method /runtime.v1.RuntimeService/Version --hex {VERSION_REQ_HEX} --timeout 60s --interval 5ms --duration 25s --errors 2>&1"
    );
    let (out, frozen_for) = std::thread::scope(|s| {
        let h = s.spawn(|| node.sh(&script));
        node.wait_for("the paced grpc-go client", Duration::from_secs(20), |n| {
            n.exists("/run/crisp-freeze-started")
        });
        // Calls flow through crisp before the freeze.
        std::thread::sleep(Duration::from_secs(1));
        let o = node.nsenter(&[
            "systemctl",
            "kill",
            "--signal=SIGSTOP",
            "--kill-whom=main",
            "crisp.service",
        ]);
        assert!(o.ok(), "SIGSTOP to crisp: {}", o.all());
        let t = Instant::now();
        node.wait_for(
            "systemd's watchdog to restart the frozen crisp",
            Duration::from_secs(40),
            |n| {
                let now = n.prop("crisp.service", "MainPID");
                now != pid && now != "0" && n.prop("crisp.service", "ActiveState") == "active"
            },
        );
        let frozen_for = t.elapsed();
        (h.join().unwrap(), frozen_for)
    });
    assert_ne!(
        node.prop("crisp.service", "NRestarts"),
        restarts,
        "restarted by systemd, not by the test"
    );
    let journal = node.nsenter(&["journalctl", "-u", "crisp.service", "--no-pager"]);
    assert!(
        journal.stdout.contains("Watchdog timeout"),
        "systemd's watchdog fired: {}",
        journal.all()
    );
    let summary = out
        .stdout
        .lines()
        .find(|l| l.contains("\"summary\":true"))
        .unwrap_or_else(|| panic!("no summary from the client: {}", out.all()));
    let num = |k: &str| -> u64 {
        summary
            .split(&format!("\"{k}\":"))
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let errors: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("\"code\":") && !l.contains("\"summary\""))
        .collect();
    assert!(
        num("failed") <= 1 && errors.iter().all(|e| !e.contains("DeadlineExceeded")),
        "at most the call in flight on the frozen connection fails, and not by its deadline: {}",
        out.all()
    );
    assert!(
        num("ok") >= 500,
        "calls before and after the freeze: {summary}"
    );
    eprintln!(
        "crisp frozen with SIGSTOP: restarted by systemd's watchdog after {}; grpc-go client: \
         {} ok, {} failed {:?}",
        secs(frozen_for),
        num("ok"),
        num("failed"),
        errors
    );
}

#[test]
fn deb_on_a_systemd_node() {
    let t0 = Instant::now();
    let node = Node::boot();
    eprintln!("node booted in {}", secs(node.boot_time));
    node.add_kubelet_standin();
    let before = node.snapshot(TREES);
    let kubelet_files = node.snapshot(&[
        "/var/lib/kubelet",
        "/etc/default",
        "/etc/systemd/system/kubelet.service.d",
    ]);
    let deb = put_artifact(&node, &artifact("crisp_", "_amd64.deb"));

    // The package alone: crisp runs, kubelet is left as it was.
    let inv = node.prop("kubelet.service", "InvocationID");
    let t = Instant::now();
    let o = node.must(&["dpkg", "-i", &deb]);
    eprintln!("dpkg -i: {}", secs(t.elapsed()));
    assert!(o.stderr.contains("kubelet is unchanged"), "{}", o.all());
    for u in ["crisp.socket", "crisp.service"] {
        assert_eq!(
            node.prop(u, "ActiveState"),
            "active",
            "{u}: {}",
            node.nsenter(&["journalctl", "-u", u, "--no-pager", "-n", "30"])
                .stdout
        );
        assert_eq!(node.prop(u, "UnitFileState"), "enabled", "{u}");
    }
    let now = node.snapshot(&[
        "/var/lib/kubelet",
        "/etc/default",
        "/etc/systemd/system/kubelet.service.d",
    ]);
    assert!(
        now == kubelet_files,
        "the postinst changed kubelet's files:\n{}",
        diff(&kubelet_files, &now)
    );
    assert_eq!(
        node.prop("kubelet.service", "InvocationID"),
        inv,
        "the postinst restarted kubelet"
    );
    let d = node.run(&["crisp", "doctor"]);
    assert!(d.stdout.contains("kubelet bypasses crisp"), "{}", d.all());

    // Asked: kubelet now dials crisp, and crisp forwards to containerd.
    let t = Instant::now();
    let o = node.must(&["crisp-install"]);
    let install_time = t.elapsed();
    assert!(o.stdout.contains("restart kubelet.service"), "{}", o.all());
    let last = node.wait_kubelet_on("/run/crisp/crisp.sock", &inv);
    assert!(
        last.contains(CONTAINERD_HEX),
        "containerd answered through crisp: {last}"
    );
    let cmdline = node.read("/run/kubelet-standin/cmdline");
    assert!(
        cmdline.contains("--container-runtime-endpoint=unix:///run/crisp/crisp.sock"),
        "{cmdline}"
    );
    assert!(!cmdline.contains("containerd.sock"), "{cmdline}");
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--pod-infra-container-image=registry.k8s.io/pause:3.9"),
        "the other flags stay"
    );
    let report = doctor_ok(&node, "crisp");
    eprintln!(
        "crisp-install: {} (kubelet restarted)\n{report}",
        secs(install_time)
    );
    // Again: nothing to do, kubelet not restarted.
    let inv = node.prop("kubelet.service", "InvocationID");
    let o = node.must(&["crisp-install"]);
    assert!(o.stdout.contains("nothing changed"), "{}", o.all());
    assert_eq!(
        node.prop("kubelet.service", "InvocationID"),
        inv,
        "a second crisp-install restarted kubelet"
    );

    restart_under_load(&node, 3);
    freeze_under_load(&node);
    // kubelet stayed on crisp throughout and still is.
    assert_eq!(
        node.prop("kubelet.service", "InvocationID"),
        inv,
        "restarting crisp restarted kubelet"
    );
    node.wait_kubelet_on("/run/crisp/crisp.sock", "");

    // Removal points kubelet back at containerd first; purge leaves the node as it was.
    let t = Instant::now();
    node.must(&["dpkg", "--purge", "crisp"]);
    let rollback_time = t.elapsed();
    node.wait_kubelet_on("/run/containerd/containerd.sock", &inv);
    assert!(node
        .read("/run/kubelet-standin/cmdline")
        .contains("--container-runtime-endpoint=unix:///run/containerd/containerd.sock"));
    let after = node.snapshot(TREES);
    assert!(
        after == before,
        "dpkg --purge left the node different:\n{}",
        diff(&before, &after)
    );
    assert!(
        !node.exists("/run/crisp/crisp.sock"),
        "crisp.socket's file is gone"
    );
    eprintln!(
        "dpkg --purge (kubelet back on containerd): {}; whole test {}",
        secs(rollback_time),
        secs(t0.elapsed())
    );
}

#[test]
fn installer_image_run_by_the_nodes_containerd() {
    let t0 = Instant::now();
    let node = Node::boot();
    node.add_kubelet_standin();
    let before = node.snapshot(TREES);
    let image = put_artifact(&node, &artifact("crisp-installer-", ".oci.tar"));
    let o = node.must(&["ctr", "-n", "k8s.io", "images", "import", &image]);
    let name = o
        .stdout
        .split_whitespace()
        .find(|w| w.starts_with("crisp-installer:"))
        .unwrap_or_else(|| panic!("image name in {}", o.all()))
        .to_string();
    node.must(&["rm", &image]);
    // The image itself lives in /var/lib/containerd, which the snapshot leaves out.
    let imported = node.snapshot(TREES);
    assert!(
        imported == before,
        "importing the image changed the node's files:\n{}",
        diff(&before, &imported)
    );
    let before_image = before.clone();

    // As the DaemonSet's pod: privileged, a PID namespace of its own (no hostPID: systemd's
    // private socket refuses its systemctl, so the entrypoint goes over the node's D-Bus
    // system bus), host network, the node's / at /host with its submounts. Detached, like a
    // pod; readiness asked like kubelet's exec probe.
    let inv = node.prop("kubelet.service", "InvocationID");
    let ctr_run = |id: &str, mode: &str, detach: bool| {
        let mut args = vec![
            "ctr",
            "-n",
            "k8s.io",
            "run",
            "--rm",
            "--privileged",
            "--net-host",
            "--mount",
            "type=bind,src=/,dst=/host,options=rbind:rw",
        ];
        let env = format!("CRISP_MODE={mode}");
        args.extend(["--env", &env]);
        if detach {
            args.retain(|a| *a != "--rm");
            args.push("-d");
        } else {
            args.extend(["--env", "CRISP_ONESHOT=1"]);
        }
        args.extend([name.as_str(), id]);
        node.run(&args)
    };
    let t = Instant::now();
    let o = ctr_run("crisp-installer-1", "install", true);
    assert!(o.ok(), "{}", o.all());
    let ready = || {
        node.run(&[
            "ctr",
            "-n",
            "k8s.io",
            "task",
            "exec",
            "--exec-id",
            "probe",
            "crisp-installer-1",
            "/opt/crisp/entrypoint.sh",
            "ready",
        ])
        .ok()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "installer never Ready: {}",
            node.nsenter(&["journalctl", "--no-pager", "-n", "60"])
                .stdout
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let install_time = t.elapsed();
    let last = node.wait_kubelet_on("/run/crisp/crisp.sock", &inv);
    assert!(last.contains(CONTAINERD_HEX), "{last}");
    let report = doctor_ok(&node, "/usr/local/bin/crisp");
    eprintln!(
        "installer image: installed and Ready in {}\n{report}",
        secs(install_time)
    );
    // The bundle it copied to the node's /run is gone again.
    assert!(!node.exists("/run/crisp-installer"));
    // The pod's container survives kubelet's restart (it is containerd's): still running.
    let st = node.run(&["ctr", "-n", "k8s.io", "task", "ls"]);
    assert!(
        st.stdout
            .lines()
            .any(|l| l.starts_with("crisp-installer-1") && l.contains("RUNNING")),
        "{}",
        st.all()
    );
    // SIGTERM (a rollout replacing the pod) ends it cleanly.
    node.must(&["ctr", "-n", "k8s.io", "task", "kill", "crisp-installer-1"]);
    node.wait_for(
        "the installer to exit on SIGTERM",
        Duration::from_secs(20),
        |n| {
            n.run(&["ctr", "-n", "k8s.io", "task", "ls"])
                .stdout
                .lines()
                .any(|l| l.starts_with("crisp-installer-1") && l.contains("STOPPED"))
        },
    );
    let o = node.must(&["ctr", "-n", "k8s.io", "task", "delete", "crisp-installer-1"]);
    assert!(
        o.stdout.contains("exit status 0")
            || o.stdout.trim().is_empty()
            || o.stdout.contains("crisp-installer-1"),
        "{}",
        o.all()
    );
    node.must(&[
        "ctr",
        "-n",
        "k8s.io",
        "containers",
        "rm",
        "crisp-installer-1",
    ]);

    // Its own restart: the same install again changes nothing and leaves kubelet alone.
    let inv = node.prop("kubelet.service", "InvocationID");
    let o = ctr_run("crisp-installer-2", "install", false);
    assert!(
        o.ok() && o.stdout.contains("nothing changed"),
        "{}",
        o.all()
    );
    assert_eq!(
        node.prop("kubelet.service", "InvocationID"),
        inv,
        "a re-run restarted kubelet"
    );

    // Uninstall mode: kubelet back on containerd, every file as before.
    let t = Instant::now();
    let o = ctr_run("crisp-installer-3", "uninstall", false);
    let rollback_time = t.elapsed();
    assert!(o.ok(), "{}", o.all());
    node.wait_kubelet_on("/run/containerd/containerd.sock", &inv);
    let after = node.snapshot(TREES);
    assert!(
        after == before_image,
        "uninstall left the node different:\n{}",
        diff(&before_image, &after)
    );
    eprintln!(
        "installer image: uninstalled in {}; whole test {}",
        secs(rollback_time),
        secs(t0.elapsed())
    );
}

/// The lines only in one of two snapshots.
fn diff(a: &str, b: &str) -> String {
    let sa: std::collections::BTreeSet<&str> = a.lines().collect();
    let sb: std::collections::BTreeSet<&str> = b.lines().collect();
    let mut out = String::new();
    for l in sa.difference(&sb) {
        out += &format!("- {l}\n");
    }
    for l in sb.difference(&sa) {
        out += &format!("+ {l}\n");
    }
    out
}
