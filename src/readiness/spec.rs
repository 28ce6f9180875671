//! A readiness spec as written (`crisp.dev/ready.<container>`, node rules): the variants,
//! their parser and how they are shown.

use std::net::IpAddr;

/// How crisp decides that a running sidecar is ready (DESIGN.md §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The container runs (kubelet already ran its postStart before moving on, KUBELET-CRI §1.2).
    Running,
    /// A TCP connect succeeds. `host` None = the pod IP (loopback for hostNetwork pods).
    Tcp { host: Option<IpAddr>, port: u16 },
    /// An HTTP GET answers 2xx or 3xx.
    Http {
        host: Option<IpAddr>,
        port: u16,
        path: String,
    },
    /// A command run in the container through the runtime's ExecSync exits 0.
    Exec { cmd: Vec<String> },
}

/// Written back as a spec [`Readiness::parse`] reads (the admin API's ListPods shows it).
impl std::fmt::Display for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = |h: &Option<IpAddr>| match h {
            Some(IpAddr::V6(a)) => format!("[{a}]"),
            Some(a) => a.to_string(),
            None => String::new(),
        };
        match self {
            Readiness::Running => f.write_str("running"),
            Readiness::Tcp { host: h, port } => write!(f, "tcp://{}:{port}", host(h)),
            Readiness::Http {
                host: h,
                port,
                path,
            } => write!(f, "http://{}:{port}{path}", host(h)),
            Readiness::Exec { cmd } => {
                write!(f, "exec:{}", serde_json::to_string(cmd).unwrap_or_default())
            }
        }
    }
}

/// Longest readiness spec accepted; anything longer is almost certainly a mistake.
pub(super) const MAX_SPEC_LEN: usize = 4096;

impl Readiness {
    pub fn parse(spec: &str) -> Result<Readiness, String> {
        let s = spec.trim();
        if s.len() > MAX_SPEC_LEN {
            return Err(format!("longer than {MAX_SPEC_LEN} bytes"));
        }
        if s == "running" {
            return Ok(Readiness::Running);
        }
        if let Some(rest) = s.strip_prefix("tcp://") {
            let (host, port) = host_port(rest)?;
            return Ok(Readiness::Tcp { host, port });
        }
        if let Some(rest) = s.strip_prefix("http://") {
            let (hp, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            if path
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
            {
                return Err("the HTTP path contains whitespace or control characters".into());
            }
            let (host, port) = host_port(hp)?;
            return Ok(Readiness::Http {
                host,
                port,
                path: path.to_string(),
            });
        }
        if let Some(rest) = s.strip_prefix("exec:") {
            let cmd: Vec<String> = serde_json::from_str(rest.trim()).map_err(|e| {
                format!(
                    "exec: expects a JSON array of strings, e.g. exec:[\"cat\",\"/ready\"] ({e})"
                )
            })?;
            if cmd.is_empty() || cmd[0].is_empty() {
                return Err("exec: command is empty".into());
            }
            return Ok(Readiness::Exec { cmd });
        }
        Err("expected `running`, `tcp://[host]:port`, `http://[host]:port/path` or `exec:[\"cmd\",...]`".into())
    }
}

pub(super) fn host_port(s: &str) -> Result<(Option<IpAddr>, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']').ok_or("unclosed [ in IPv6 host")?;
        let port = rest[end + 1..].strip_prefix(':').ok_or("missing :port")?;
        (&rest[..end], port)
    } else {
        s.rsplit_once(':').ok_or("missing :port")?
    };
    let port: u16 = port.parse().map_err(|_| format!("invalid port {port:?}"))?;
    if port == 0 {
        return Err("port 0".into());
    }
    let host = match host {
        "" => None,
        "localhost" => Some(IpAddr::from([127, 0, 0, 1])),
        h => Some(
            h.parse::<IpAddr>()
                .map_err(|_| format!("host {h:?} must be an IP address or empty (the pod IP)"))?,
        ),
    };
    Ok((host, port))
}
