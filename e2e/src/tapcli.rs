//! `crisp tap` and `crisp pods` (the real binary) on a [`Stack`]'s admin socket, for tests that
//! read what an operator would see.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::crisp::crisp_binary;
use crate::stack::Stack;

/// `crisp tap` (the real binary) on the stack's admin socket: its stdout lines.
pub struct TapCli {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl TapCli {
    pub fn start(st: &Stack, args: &[&str]) -> Result<TapCli> {
        let admin = st.crisp.dir().join("admin.sock");
        let mut child = Command::new(crisp_binary()?)
            .arg("tap")
            .arg("--admin-socket")
            .arg(&admin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().context("stdout")?;
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        // The subscription is live once it says so on stderr.
        let mut err = BufReader::new(child.stderr.take().context("stderr")?);
        let mut first = String::new();
        err.read_line(&mut first)?;
        if !first.contains("attached") {
            bail!("crisp tap did not attach: {first}");
        }
        Ok(TapCli { child, lines })
    }

    /// The first JSON line `pred` accepts, within `timeout`.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let v: Value =
                        serde_json::from_str(&l).with_context(|| format!("not JSON: {l}"))?;
                    if pred(&v) {
                        return Ok(v);
                    }
                    seen.push(l);
                }
                Err(_) => bail!(
                    "crisp tap printed no {what} within {timeout:?}; it printed:\n{}",
                    seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for TapCli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TapCli {
    /// The lines printed until `quiet` passes without one, or `max` in all.
    pub fn drain(&self, quiet: Duration, max: Duration) -> Vec<String> {
        let end = Instant::now() + max;
        let mut out = Vec::new();
        while let Ok(l) = self
            .lines
            .recv_timeout(quiet.min(end.saturating_duration_since(Instant::now())))
        {
            out.push(l);
        }
        out
    }
}

/// `crisp pods --json` (the real binary).
pub fn crisp_pods(st: &Stack, pod: &str) -> Result<Value> {
    let admin = st.crisp.dir().join("admin.sock");
    let out = Command::new(crisp_binary()?)
        .arg("pods")
        .arg("--json")
        .arg("--admin-socket")
        .arg(&admin)
        .arg(pod)
        .output()
        .context("crisp pods")?;
    if !out.status.success() {
        bail!(
            "crisp pods failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}
