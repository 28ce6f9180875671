//! Runs the real `crisp` binary in front of a runtime socket, as a separate process (so tests
//! can SIGKILL and restart it like an operator or a crash would).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Options for one crisp instance; `extra_config` is appended to the generated TOML.
#[derive(Debug, Clone, Default)]
pub struct CrispOpts {
    pub extra_config: String,
    /// tracing filter (default `info,crisp=debug`).
    pub log_level: Option<String>,
}

pub struct Crisp {
    dir: tempfile::TempDir,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// The crisp binary built next to the running test binary (`target/<profile>/crisp`).
pub fn crisp_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CRISP_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    // target/debug/deps/<test> → target/debug/crisp
    for dir in exe.ancestors().skip(1).take(3) {
        let cand = dir.join("crisp");
        if cand.is_file() {
            return Ok(cand);
        }
    }
    bail!("crisp binary not found next to {} — run `cargo build --workspace` first (hack/test.sh does)", exe.display())
}

impl Crisp {
    /// Starts crisp listening on a fresh socket, forwarding to `upstream`; returns once the
    /// socket accepts connections.
    pub fn start(upstream: &Path, opts: CrispOpts) -> Result<Crisp> {
        let dir = tempfile::Builder::new().prefix("crisp-e2e-").tempdir()?;
        let socket = dir.path().join("crisp.sock");
        let config = dir.path().join("config.toml");
        let log = dir.path().join("crisp.log");
        let text = format!(
            "listen = {:?}\nupstream = {:?}\nstate_dir = {:?}\n[log]\nlevel = {:?}\n{}\n",
            socket,
            upstream,
            dir.path().join("state"),
            opts.log_level.as_deref().unwrap_or("info,crisp=debug"),
            // `CRISP_E2E_CONFIG` (TOML) is appended to every e2e crisp's config, for A/B runs,
            // e.g. CRISP_E2E_CONFIG=$'[proxy]\nrelay = false'.
            opts.extra_config + "\n" + &std::env::var("CRISP_E2E_CONFIG").unwrap_or_default()
        );
        std::fs::write(&config, text)?;
        let mut c = Crisp {
            dir,
            socket,
            config,
            log,
            child: None,
        };
        c.spawn()?;
        Ok(c)
    }

    fn spawn(&mut self) -> Result<()> {
        let bin = crisp_binary()?;
        let log = File::options().create(true).append(true).open(&self.log)?;
        let child = Command::new(&bin)
            .arg("--config")
            .arg(&self.config)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        // The CRI socket is bound before crisp starts serving; the admin socket (tap, metrics)
        // is bound in its own task just after. Tests use both at once: wait for both, unless
        // this crisp's config turns the admin socket off.
        let admin = self.socket.with_file_name("admin.sock");
        let want_admin = !std::fs::read_to_string(&self.config)
            .unwrap_or_default()
            .contains("enabled = false");
        loop {
            let up = |p: &Path| std::os::unix::net::UnixStream::connect(p).is_ok();
            if up(&self.socket) && (!want_admin || up(&admin)) {
                return Ok(());
            }
            if let Some(ch) = self.child.as_mut() {
                if let Some(st) = ch.try_wait()? {
                    bail!("crisp exited with {st} during start:\n{}", self.log_text());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "crisp did not listen on {} within 10 s:\n{}",
                    self.socket.display(),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// crisp's CPU time so far (user + system) and its peak and current resident memory, from
    /// `/proc/<pid>/{stat,status}`.
    pub fn usage(&self) -> Result<Usage> {
        let pid = self.pid().context("crisp is not running")?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command name (which may hold spaces) start at state: utime and
        // stime are the 12th and 13th of them.
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .context("malformed /proc/<pid>/stat")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields
            .get(11)
            .zip(fields.get(12))
            .and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?))
            .context("no utime/stime")?;
        // USER_HZ: the unit of /proc's times is fixed at 100 per second in Linux's user ABI.
        let hz = 100;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok(Usage {
            cpu: Duration::from_millis(ticks * 1000 / hz),
            peak_rss_kib: kib("VmHWM:"),
            rss_kib: kib("VmRSS:"),
        })
    }

    /// What crisp's log says about its health: the longest line (bytes) and every line that
    /// reports a panic.
    pub fn log_health(&self) -> LogHealth {
        let text = self.log_text();
        let longest = text.lines().map(str::len).max().unwrap_or(0);
        let panics = text
            .lines()
            .filter(|l| l.contains("panicked"))
            .map(|l| l.chars().take(300).collect())
            .collect();
        LogHealth {
            lines: text.lines().count(),
            longest,
            panics,
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// Starts crisp again on the same socket, config and state directory.
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.spawn()
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        let Some(mut c) = self.child.take() else {
            bail!("not running")
        };
        let pid = c.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                c.kill()?;
                bail!("crisp did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Crisp {
    fn drop(&mut self) {
        let _ = self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- crisp log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// [`Crisp::usage`].
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub cpu: Duration,
    pub peak_rss_kib: u64,
    pub rss_kib: u64,
}

/// [`Crisp::log_health`].
#[derive(Debug, Clone)]
pub struct LogHealth {
    pub lines: usize,
    /// Bytes in the longest line.
    pub longest: usize,
    /// Lines that report a panic (cut to 300 chars).
    pub panics: Vec<String>,
}
