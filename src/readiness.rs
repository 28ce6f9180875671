//! Readiness specs (`crisp.dev/ready.<container>` and node rules) and the probes crisp runs.
//! A new kind of readiness is one variant here: its parser, how it is shown ([`Display`], what
//! ListPods and the fuzz target use) and how it is probed ([`Readiness::probe`]) are all below.
//!
//! [`Display`]: std::fmt::Display

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

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
const MAX_SPEC_LEN: usize = 4096;

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

fn host_port(s: &str) -> Result<(Option<IpAddr>, u16), String> {
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

/// What a probe needs from whoever runs it (the ordering engine): the pod's address, a TCP
/// connection from the right place (the pod's network namespace, under the node-wide bounds),
/// and a way to run a command in the sidecar's container (the runtime's ExecSync).
pub(crate) trait ProbeEnv {
    /// The pod IP (loopback for hostNetwork pods); `None` while it cannot be known.
    fn pod_ip(&self) -> impl std::future::Future<Output = Option<IpAddr>> + Send;
    /// A TCP connection to `addr`, or why not.
    fn connect(
        &self,
        addr: SocketAddr,
    ) -> impl std::future::Future<Output = Result<TcpStream, String>> + Send;
    /// Runs `cmd` in the container; its exit code, or why it could not run. Only the exit code:
    /// a command's output never reaches crisp's logs or tap.
    fn exec(
        &self,
        cmd: &[String],
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<i32, String>> + Send;
}

/// Connects from crisp's own network namespace (tests, and probes of the node itself).
pub(crate) async fn connect_here(addr: SocketAddr) -> Result<TcpStream, String> {
    TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))
}

/// What one probe found: `Ok` when the sidecar is ready, else why not, in words an operator
/// reads in `crisp pods` and the tap ("connect 10.1.2.3:15021: connection refused").
pub(crate) type ProbeResult = Result<(), String>;

impl Readiness {
    /// One probe, bounded by `timeout`: whether the sidecar is ready now, and if not, why.
    pub(crate) async fn probe(&self, env: &impl ProbeEnv, timeout: Duration) -> ProbeResult {
        let addr = |host: Option<IpAddr>, port: u16| async move {
            let ip = match host {
                Some(h) => Some(h),
                None => env.pod_ip().await,
            };
            ip.map(|ip| SocketAddr::new(ip, port))
                .ok_or_else(|| "the pod IP is not known yet".to_string())
        };
        match self {
            Readiness::Running => Ok(()),
            Readiness::Tcp { host, port } => {
                probe_tcp_with(env, addr(*host, *port).await?, timeout).await
            }
            Readiness::Http { host, port, path } => {
                probe_http_with(env, addr(*host, *port).await?, path, timeout).await
            }
            Readiness::Exec { cmd } => match env.exec(cmd, timeout).await {
                Ok(0) => Ok(()),
                Ok(code) => Err(format!("exec exited {code}")),
                Err(e) => Err(format!("exec failed: {e}")),
            },
        }
    }
}

/// TCP connect probe from crisp's own network namespace.
#[cfg(test)]
async fn probe_tcp(addr: SocketAddr, timeout: Duration) -> ProbeResult {
    probe_tcp_with(&HostEnv, addr, timeout).await
}

/// TCP connect probe through `env`'s connector.
pub(crate) async fn probe_tcp_with(
    env: &impl ProbeEnv,
    addr: SocketAddr,
    timeout: Duration,
) -> ProbeResult {
    match tokio::time::timeout(timeout, env.connect(addr)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("connect {addr}: no answer within {timeout:?}")),
    }
}

/// Probes from crisp's own network namespace with no pod behind them: no pod IP, no exec.
#[cfg(test)]
struct HostEnv;

#[cfg(test)]
impl ProbeEnv for HostEnv {
    async fn pod_ip(&self) -> Option<IpAddr> {
        None
    }

    async fn connect(&self, addr: SocketAddr) -> Result<TcpStream, String> {
        connect_here(addr).await
    }

    async fn exec(&self, _cmd: &[String], _timeout: Duration) -> Result<i32, String> {
        Err("no container to run a command in".into())
    }
}

/// HTTP/1.0 GET probe from crisp's own network namespace.
#[cfg(test)]
async fn probe_http(addr: SocketAddr, path: &str, timeout: Duration) -> ProbeResult {
    probe_http_with(&HostEnv, addr, path, timeout).await
}

/// HTTP/1.0 GET probe: ready on a 2xx or 3xx status line. Kept minimal on purpose — a probe
/// needs the status line only, and HTTP/1.0 makes the server close the connection. Nothing of
/// the answer but its status code is kept.
pub(crate) async fn probe_http_with(
    env: &impl ProbeEnv,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> ProbeResult {
    let fut = async {
        let mut s = env.connect(addr).await?;
        let req = format!(
            "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: crisp-probe\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            let r = s
                .read(&mut buf[n..])
                .await
                .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
            if r == 0 {
                break;
            }
            n += r;
        }
        let code: Option<u16> = std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|l| l.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok());
        match code {
            Some(c) if (200..400).contains(&c) => Ok(()),
            Some(c) => Err(format!("GET http://{addr}{path}: status {c}")),
            None => Err(format!("GET http://{addr}{path}: no HTTP status line")),
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "GET http://{addr}{path}: no answer within {timeout:?}"
        )),
    }
}

/// Loopback or unspecified (`0.0.0.0`, `::`; a connect to either reaches the local host): an
/// address that means "this network namespace", so only ever probed from inside the pod's.
pub fn is_local(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || ip.is_unspecified()
}

/// An IP network (`10.0.0.0/8`, `fd00::/8`), for the operator's `[ordering] probe_allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `ADDR/PREFIX` with the host bits zero, or a bare address (a /32 or /128).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let s = s.trim();
        if s.len() > 64 {
            return Err("longer than 64 bytes".into());
        }
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n)
                    if n <= max
                        && (p == "0" || !p.starts_with('0'))
                        && p.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    n
                }
                _ => return Err(format!("prefix {p:?} is not a number from 0 to {max}")),
            },
        };
        let c = Cidr { net, prefix };
        if c.masked(net) != net {
            return Err(format!(
                "{s} has host bits set (the network is {}/{prefix})",
                c.masked(net)
            ));
        }
        Ok(c)
    }

    /// Whether `ip` is in this network (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.net.is_ipv4() && self.masked(ip) == self.net
    }

    fn masked(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(a) => {
                let m = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(self.prefix))
                };
                IpAddr::V4(std::net::Ipv4Addr::from(u32::from(a) & m))
            }
            IpAddr::V6(a) => {
                let m = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(self.prefix))
                };
                IpAddr::V6(std::net::Ipv6Addr::from(u128::from(a) & m))
            }
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// The node-wide bounds on probing: at most `max_in_flight` probes at once, and TCP connects
/// (tcp:// and http:// probes) at `connects_per_second` (a token bucket holding a tenth of a
/// second's worth, so a burst of pods cannot open more than that at once). A probe that cannot
/// get its slot or its connect before its own deadline is simply "not ready" this round: it is
/// never queued beyond it, so the wait is bounded and no debt piles up.
///
/// Slots are shared fairly between pods (issue #26): one pod holds at most
/// `per_pod` of them (all but a quarter, at least one), and a freed slot goes to the
/// pods waiting in turn, each pod's own probes first come first served. So a pod whose
/// sidecars never get ready, however many probes it queues, cannot keep another pod's probe
/// waiting: that one takes a slot left free for others, or the next one freed. Connects need
/// no queue of their own: a probe connects only while it holds its slot.
///
/// The exec probes' limiter also paces each pod on its own ([`ProbeLimiter::per_pod_rate`],
/// issue #33): a pod takes at most that many turns a second (a quarter of a second's worth at
/// once), waited for before its probe asks for a slot, so one pod with many exec-probed
/// sidecars cannot spend the node's whole per-second budget and keeps no slot idle meanwhile.
pub(crate) struct ProbeLimiter {
    max_in_flight: usize,
    per_pod: usize,
    slots: Mutex<Slots>,
    rate: f64,
    burst: f64,
    bucket: Mutex<Bucket>,
    /// Each pod's own rate and burst; `None`: pods are paced only by the node's rate.
    pod_rate: Option<(f64, f64)>,
    pod_buckets: Mutex<PodBuckets>,
}

/// The pods' own token buckets. A full bucket carries nothing a new one would not (it starts
/// full), so full ones are dropped when the map grows: its size is bounded by the pods that
/// probed within the last quarter of a second or so, not by every pod the node ever ran.
struct PodBuckets {
    by_pod: HashMap<String, Bucket>,
    /// The map is swept of full buckets when it reaches this size (then twice what is left, at
    /// least [`POD_BUCKETS_SWEEP`]), so the sweeps cost O(1) a probe amortised.
    sweep_at: usize,
}

/// Fewest pods' buckets kept before the full ones are swept.
const POD_BUCKETS_SWEEP: usize = 256;

/// Who holds and who waits for the probe slots.
#[derive(Default)]
struct Slots {
    in_flight: usize,
    /// Slots held, by pod.
    held: HashMap<String, usize>,
    /// Probes waiting, by pod, oldest first.
    queues: HashMap<String, VecDeque<Arc<Waiter>>>,
    /// Pods with a probe waiting, in the order they are served: least recently served first.
    turn: VecDeque<String>,
    /// When each pod last took a slot (a count of slots taken, node-wide); a pod not in it
    /// has not taken one for [`SERVED_MEMORY`] slots, and goes before every pod that has.
    served: HashMap<String, u64>,
    /// Slots taken so far.
    seq: u64,
}

/// How many slots back [`Slots::served`] remembers who took them (its size is bounded by it).
const SERVED_MEMORY: u64 = 4096;

/// One probe waiting for a slot: `granted` is set (under the [`Slots`] lock) when a slot is
/// handed to it.
#[derive(Default)]
struct Waiter {
    granted: AtomicBool,
    notify: Notify,
}

impl Slots {
    fn may_take(&self, pod: &str, max: usize, per_pod: usize) -> bool {
        self.in_flight < max && self.held.get(pod).copied().unwrap_or(0) < per_pod
    }

    fn take(&mut self, pod: &str) {
        self.in_flight += 1;
        *self.held.entry(pod.to_string()).or_default() += 1;
        self.seq += 1;
        self.served.insert(pod.to_string(), self.seq);
        if self.served.len() as u64 > 2 * SERVED_MEMORY {
            let oldest = self.seq.saturating_sub(SERVED_MEMORY);
            self.served.retain(|_, at| *at > oldest);
        }
    }

    /// A pod's first waiting probe takes its place in the turn: behind the pods served less
    /// recently than it, before the others. A pod that has not probed for a while (a newly
    /// held pod, whose sidecar may well be ready) goes first; pods that probe again and again
    /// (never-ready sidecars) take turns behind it.
    fn join_turn(&mut self, pod: &str) {
        let at = |p: &str| self.served.get(p).copied().unwrap_or(0);
        let mine = at(pod);
        let place = self
            .turn
            .iter()
            .position(|p| at(p) > mine)
            .unwrap_or(self.turn.len());
        self.turn.insert(place, pod.to_string());
    }

    fn give_back(&mut self, pod: &str) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(n) = self.held.get_mut(pod) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(pod);
            }
        }
    }

    /// Hands free slots to waiting probes, one pod after the other.
    fn dispatch(&mut self, max: usize, per_pod: usize) {
        let mut passes = self.turn.len();
        while self.in_flight < max && passes > 0 {
            let Some(pod) = self.turn.pop_front() else {
                break;
            };
            if !self.may_take(&pod, max, per_pod) {
                self.turn.push_back(pod);
                passes -= 1;
                continue;
            }
            let queue = self.queues.get_mut(&pod);
            let (waiter, more) = match queue {
                Some(q) => (q.pop_front(), !q.is_empty()),
                None => (None, false),
            };
            if more {
                self.turn.push_back(pod.clone());
            } else {
                self.queues.remove(&pod);
            }
            if let Some(w) = waiter {
                self.take(&pod);
                w.granted.store(true, Ordering::Relaxed);
                w.notify.notify_one();
            }
            passes = self.turn.len();
        }
    }

    /// A waiter gives up: out of its pod's queue.
    fn forget(&mut self, pod: &str, waiter: &Arc<Waiter>) {
        if let Some(q) = self.queues.get_mut(pod) {
            q.retain(|w| !Arc::ptr_eq(w, waiter));
            if q.is_empty() {
                self.queues.remove(pod);
                self.turn.retain(|p| p != pod);
            }
        }
    }
}

/// A probe slot, given back when dropped.
pub(crate) struct ProbeSlot<'a> {
    limiter: &'a ProbeLimiter,
    pod: String,
}

impl std::fmt::Debug for ProbeSlot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSlot").field("pod", &self.pod).finish()
    }
}

impl Drop for ProbeSlot<'_> {
    fn drop(&mut self) {
        self.limiter.release(&self.pod);
    }
}

/// A probe's place in its pod's queue while it waits: leaves the queue when the wait ends,
/// and gives back a slot handed to it just as it gave up.
struct Queued<'a> {
    limiter: &'a ProbeLimiter,
    pod: &'a str,
    waiter: Arc<Waiter>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let l = self.limiter;
        let mut s = l.lock_slots();
        if self.waiter.granted.swap(false, Ordering::Relaxed) {
            s.give_back(self.pod);
            s.dispatch(l.max_in_flight, l.per_pod);
        } else {
            s.forget(self.pod, &self.waiter);
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Refills the bucket to `now` at `rate` (capped at `burst`).
    fn refill(&mut self, now: Instant, rate: f64, burst: f64) {
        self.tokens = (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * rate)
            .min(burst);
        self.at = now;
    }

    /// Takes a token that is there, or will be by `deadline`, and says how long until it is;
    /// `None` (nothing taken) when it would come too late. Tokens go below zero for the turns
    /// already promised, so turns are handed out in the order they were asked for.
    fn reserve(&mut self, rate: f64, burst: f64, deadline: Instant) -> Option<Duration> {
        let now = Instant::now();
        self.refill(now, rate, burst);
        let wait = if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / rate)
        };
        if now + wait > deadline {
            return None;
        }
        self.tokens -= 1.0;
        Some(wait)
    }
}

impl ProbeLimiter {
    pub(crate) fn new(max_in_flight: usize, connects_per_second: u32) -> ProbeLimiter {
        let rate = f64::from(connects_per_second.max(1));
        let burst = (rate / 10.0).max(1.0);
        let max_in_flight = max_in_flight.max(1);
        ProbeLimiter {
            max_in_flight,
            per_pod: (max_in_flight - max_in_flight / 4).max(1),
            slots: Mutex::new(Slots::default()),
            rate,
            burst,
            bucket: Mutex::new(Bucket {
                tokens: burst,
                at: Instant::now(),
            }),
            pod_rate: None,
            pod_buckets: Mutex::new(PodBuckets {
                by_pod: HashMap::new(),
                sweep_at: POD_BUCKETS_SWEEP,
            }),
        }
    }

    /// Paces each pod to `per_second` turns (see [`ProbeLimiter::pod_turn`]), a quarter of a
    /// second's worth at once (kubelet creating a pod's few app containers one after the other
    /// probes its sidecars once per CreateContainer: five at the default rate wait for
    /// nothing). A pod's rate at or above the node's would add nothing: it is
    /// not kept, and pods are paced by the node's rate alone.
    pub(crate) fn per_pod_rate(mut self, per_second: u32) -> ProbeLimiter {
        let rate = f64::from(per_second.max(1));
        self.pod_rate = (rate < self.rate).then_some((rate, (rate / 4.0).max(1.0)));
        self
    }

    /// A turn of `pod`'s own rate, waited for until `deadline` at most: `Ok` with how long it
    /// waited (zero for a pod within its burst), or why not, at once, when the turn would come
    /// after the deadline (nothing is taken then, so a probe that gives up leaves no debt). A
    /// limiter without a per-pod rate always answers `Ok(0)`.
    pub(crate) async fn pod_turn(&self, pod: &str, deadline: Instant) -> Result<Duration, String> {
        let Some((rate, burst)) = self.pod_rate else {
            return Ok(Duration::ZERO);
        };
        let wait = {
            let mut buckets = self.pod_buckets.lock();
            let now = Instant::now();
            if !buckets.by_pod.contains_key(pod) && buckets.by_pod.len() >= buckets.sweep_at {
                buckets.by_pod.retain(|_, b| {
                    b.refill(now, rate, burst);
                    b.tokens < burst
                });
                buckets.sweep_at = (2 * buckets.by_pod.len()).max(POD_BUCKETS_SWEEP);
            }
            let bucket = buckets.by_pod.entry(pod.to_string()).or_insert(Bucket {
                tokens: burst,
                at: now,
            });
            bucket.reserve(rate, burst, deadline).ok_or_else(|| {
                format!("per-pod probe limit: {rate} a second")
            })?
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(wait)
    }

    /// Pods with a bucket kept (full ones are swept as the map grows).
    #[cfg(test)]
    pub(crate) fn pod_buckets(&self) -> usize {
        self.pod_buckets.lock().by_pod.len()
    }

    fn lock_slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock()
    }

    /// A probe slot for a probe of `pod` (its sandbox id), waited for until `deadline` at most.
    pub(crate) async fn slot(&self, pod: &str, deadline: Instant) -> Result<ProbeSlot<'_>, String> {
        let waiter = {
            let mut s = self.lock_slots();
            // Nobody of this pod is queued before it, and any other pod's queued probe waits
            // for its own pod's share: taking a free slot passes nobody.
            if !s.queues.contains_key(pod) && s.may_take(pod, self.max_in_flight, self.per_pod) {
                s.take(pod);
                return Ok(ProbeSlot {
                    limiter: self,
                    pod: pod.to_string(),
                });
            }
            let w = Arc::new(Waiter::default());
            if !s.queues.contains_key(pod) {
                s.join_turn(pod);
            }
            s.queues
                .entry(pod.to_string())
                .or_default()
                .push_back(w.clone());
            w
        };
        let queued = Queued {
            limiter: self,
            pod,
            waiter,
        };
        let _ = tokio::time::timeout_at(deadline, async {
            while !queued.waiter.granted.load(Ordering::Relaxed) {
                queued.waiter.notify.notified().await;
            }
        })
        .await;
        // Handed a slot (maybe just as the deadline passed): it is this probe's now, and the
        // queue guard must not give it back. Not handed one: the guard leaves the queue.
        let won = {
            let _s = self.lock_slots();
            queued.waiter.granted.swap(false, Ordering::Relaxed)
        };
        drop(queued);
        if won {
            Ok(ProbeSlot {
                limiter: self,
                pod: pod.to_string(),
            })
        } else {
            Err(format!(
                "node-wide probe limit: {} probes in flight",
                self.max_in_flight
            ))
        }
    }

    fn release(&self, pod: &str) {
        let mut s = self.lock_slots();
        s.give_back(pod);
        s.dispatch(self.max_in_flight, self.per_pod);
    }

    /// Probes running now.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.lock_slots().in_flight
    }

    /// Leave to open one connection, waited for until `deadline` at most. A token is taken only
    /// when it will be there in time, so a probe that gives up leaves no debt behind.
    pub(crate) async fn connect(&self, deadline: Instant) -> Result<(), String> {
        let wait = self
            .bucket
            .lock()
            .reserve(self.rate, self.burst, deadline)
            .ok_or_else(|| {
                format!(
                    "node-wide probe limit: {} connects per second",
                    self.rate
                )
            })?;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // The tests' own shared state: a poisoned lock there is a failed test.
    use std::sync::Mutex;

    #[test]
    fn readiness_is_shown_as_written() {
        for spec in [
            "running",
            "tcp://:15000",
            "http://127.0.0.1:15021/healthz/ready",
            "exec:[\"cat\",\"/ready\"]",
        ] {
            assert_eq!(Readiness::parse(spec).unwrap().to_string(), spec);
        }
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(Readiness::parse("running"), Ok(Readiness::Running));
        assert_eq!(
            Readiness::parse("tcp://:24224"),
            Ok(Readiness::Tcp {
                host: None,
                port: 24224
            })
        );
        assert_eq!(
            Readiness::parse("tcp://127.0.0.1:80"),
            Ok(Readiness::Tcp {
                host: Some([127, 0, 0, 1].into()),
                port: 80
            })
        );
        assert_eq!(
            Readiness::parse("http://:15021/healthz/ready"),
            Ok(Readiness::Http {
                host: None,
                port: 15021,
                path: "/healthz/ready".into()
            })
        );
        assert_eq!(
            Readiness::parse("http://[::1]:8080"),
            Ok(Readiness::Http {
                host: Some("::1".parse().unwrap()),
                port: 8080,
                path: "/".into()
            })
        );
        assert_eq!(
            Readiness::parse(r#"exec:["cat","/tmp/ready"]"#),
            Ok(Readiness::Exec {
                cmd: vec!["cat".into(), "/tmp/ready".into()]
            })
        );
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        for bad in [
            "",
            "ready",
            "tcp://",
            "tcp://:0",
            "tcp://:99999",
            "tcp://host.example:80",
            "http://:80/a b",
            "exec:",
            "exec:[]",
            "exec:cat /x",
            "exec:[1,2]",
            "udp://:53",
        ] {
            let e = Readiness::parse(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(Readiness::parse(&format!("exec:[\"{}\"]", "a".repeat(5000))).is_err());
    }

    #[tokio::test]
    async fn http_probe_reads_the_status_line() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable", "302 Found"] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
            }
        });
        let t = Duration::from_secs(2);
        assert_eq!(probe_http(addr, "/", t).await, Ok(()));
        assert_eq!(
            probe_http(addr, "/", t).await,
            Err(format!("GET http://{addr}/: status 503"))
        );
        assert_eq!(probe_http(addr, "/", t).await, Ok(()));
        server.await.unwrap();
        // Nothing listening any more: the reason says so.
        let e = probe_tcp(addr, t).await.unwrap_err();
        assert!(
            e.starts_with(&format!("connect {addr}: ")) && e.contains("refused"),
            "{e}"
        );
    }

    #[test]
    fn cidrs_parse_strictly_and_match_both_families() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(
            c.contains("10.255.1.2".parse().unwrap()) && !c.contains("11.0.0.1".parse().unwrap())
        );
        assert!(
            c.contains("::ffff:10.1.1.1".parse().unwrap()),
            "IPv4-mapped counts as IPv4"
        );
        assert!(!c.contains("fd00::1".parse().unwrap()));
        assert_eq!(
            Cidr::parse(" 192.0.2.7 ").unwrap().to_string(),
            "192.0.2.7/32"
        );
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(
            v6.contains("fd12::1".parse().unwrap()) && !v6.contains("fe80::1".parse().unwrap())
        );
        assert_eq!(Cidr::parse("::/0").unwrap().to_string(), "::/0");
        for bad in [
            "",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.1/8",
            "10.0.0.0/+8",
            "10.0.0.0/008",
            "fd00::/129",
            "host/8",
            "10.0.0.0/8/8",
            &"1".repeat(80),
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn local_means_loopback_or_unspecified() {
        for l in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "0.0.0.0",
            "::",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_local(l.parse().unwrap()), "{l}");
        }
        for n in ["10.0.0.1", "169.254.169.254", "fe80::1", "::ffff:10.0.0.1"] {
            assert!(!is_local(n.parse().unwrap()), "{n}");
        }
    }

    /// The in-flight bound: a probe waits for a slot until its deadline, then reports why.
    #[tokio::test(start_paused = true)]
    async fn probes_in_flight_are_bounded() {
        let l = ProbeLimiter::new(2, 1000);
        let t = Instant::now();
        let a = l.slot("pod", t + Duration::from_secs(1)).await.unwrap();
        let _b = l.slot("pod", t + Duration::from_secs(1)).await.unwrap();
        assert_eq!(l.in_flight(), 2);
        let e = l.slot("pod", t + Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(
            Instant::now() - t,
            Duration::from_secs(1),
            "waited until its deadline, no longer"
        );
        assert!(e.contains("2 probes in flight"), "{e}");
        drop(a);
        assert!(l
            .slot("pod", Instant::now() + Duration::from_millis(1))
            .await
            .is_ok());
    }

    /// Issue #26: 300 probes of one pod whose sidecars never get ready (each holds its slot
    /// for the whole 1 s probe timeout, then tries again) saturate the limiter; a probe of
    /// another pod still gets its slot within one probe interval (50 ms).
    #[tokio::test(start_paused = true)]
    async fn a_pod_flooding_the_limiter_cannot_delay_another_pods_probe() {
        let l = Arc::new(ProbeLimiter::new(64, 1000));
        let t = Instant::now();
        let stop = t + Duration::from_secs(10);
        let mut flood = Vec::new();
        for _ in 0..300 {
            let l = l.clone();
            flood.push(tokio::spawn(async move {
                while Instant::now() < stop {
                    let deadline = Instant::now() + Duration::from_secs(1);
                    if let Ok(_slot) = l.slot("never-ready", deadline).await {
                        tokio::time::sleep_until(deadline).await;
                    }
                }
            }));
        }
        for round in 0..20 {
            tokio::time::sleep(Duration::from_millis(230)).await;
            let asked = Instant::now();
            let slot = l.slot("ready", asked + Duration::from_secs(1)).await;
            assert!(
                slot.is_ok() && Instant::now() - asked <= Duration::from_millis(50),
                "round {round}: {slot:?} after {:?}",
                Instant::now() - asked
            );
            assert_eq!(
                l.in_flight(),
                49,
                "the flooding pod holds its share (48 of 64), no more"
            );
        }
        for f in flood {
            f.await.unwrap();
        }
        assert_eq!(l.in_flight(), 0, "every slot given back");
    }

    /// Issue #26: twelve pods whose sidecars never get ready, each probing again as soon as it
    /// may, keep both slots busy; a newly held pod gets the next slot freed, not a place behind
    /// every one of them (about 600 ms when pods joined the turn at its back).
    #[tokio::test(start_paused = true)]
    async fn a_newly_held_pod_goes_before_pods_that_probe_again_and_again() {
        let l = Arc::new(ProbeLimiter::new(2, 1000));
        let stop = Instant::now() + Duration::from_secs(6);
        let mut never = Vec::new();
        for i in 0..12 {
            let l = l.clone();
            never.push(tokio::spawn(async move {
                let pod = format!("never-{i}");
                while Instant::now() < stop {
                    if let Ok(_slot) = l.slot(&pod, Instant::now() + Duration::from_secs(5)).await {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }));
        }
        // Every one of them has had a slot by then, and has been probing since.
        tokio::time::sleep(Duration::from_secs(1)).await;
        for round in 0..10 {
            tokio::time::sleep(Duration::from_millis(370)).await;
            let asked = Instant::now();
            let slot = l
                .slot(&format!("ready-{round}"), asked + Duration::from_secs(5))
                .await;
            let waited = Instant::now() - asked;
            assert!(
                slot.is_ok() && waited <= Duration::from_millis(100),
                "round {round}: waited {waited:?}"
            );
        }
        for n in never {
            n.await.unwrap();
        }
    }

    /// Freed slots go to the waiting pods in turn, each pod's own probes in order; a probe
    /// that gives up leaves its place, and a slot handed to none is given back.
    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_round_the_waiting_pods() {
        let l = Arc::new(ProbeLimiter::new(1, 1000));
        let t = Instant::now();
        let first = l.slot("a", t + Duration::from_secs(1)).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for (i, pod) in ["a", "a", "a", "b", "c"].into_iter().enumerate() {
            let (l, order) = (l.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _slot = l.slot(pod, t + Duration::from_secs(60)).await.unwrap();
                order.lock().unwrap().push(format!("{pod}{i}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }));
            tokio::task::yield_now().await;
        }
        // One that gives up before its turn.
        assert!(l.slot("d", t + Duration::from_millis(5)).await.is_err());
        drop(first);
        for w in waiting {
            w.await.unwrap();
        }
        // b and c never held a slot: they go before a, which held the first one.
        assert_eq!(*order.lock().unwrap(), ["b3", "c4", "a0", "a1", "a2"]);
        assert_eq!(l.in_flight(), 0);
    }

    /// The connect rate: a tenth of a second's worth at once, then `rate` a second; one that
    /// cannot have its token before its deadline fails at once and leaves no debt.
    #[tokio::test(start_paused = true)]
    async fn connects_per_second_are_bounded() {
        let l = ProbeLimiter::new(64, 100);
        let t = Instant::now();
        let far = t + Duration::from_secs(60);
        for _ in 0..10 {
            l.connect(far).await.unwrap();
        }
        assert_eq!(Instant::now(), t, "the burst is free");
        // Too soon for a token: refused at once.
        let e = l
            .connect(Instant::now() + Duration::from_millis(1))
            .await
            .unwrap_err();
        assert!(e.contains("100 connects per second"), "{e}");
        assert_eq!(Instant::now(), t);
        // One second of connects: 100 more, not one beyond.
        let mut n = 0;
        while l.connect(t + Duration::from_secs(1)).await.is_ok() {
            n += 1;
        }
        assert_eq!(n, 100, "connects in the first second after the burst");
        assert!(Instant::now() <= t + Duration::from_secs(1));
    }

    /// Issue #33: a pod's own turns (the exec probes' per-pod rate): a quarter of a second's
    /// worth at once, then `rate` a second in the order asked; one that cannot come before its deadline
    /// is refused at once and leaves no debt; another pod's turns are its own. Kept buckets stay
    /// bounded by the pods probing lately, not by every pod ever probed.
    #[tokio::test(start_paused = true)]
    async fn a_pods_own_turns_are_paced_and_bounded() {
        let l = ProbeLimiter::new(4, 50).per_pod_rate(20);
        let t = Instant::now();
        let far = t + Duration::from_secs(60);
        for _ in 0..5 {
            assert_eq!(l.pod_turn("a", far).await, Ok(Duration::ZERO));
        }
        let e = l
            .pod_turn("a", Instant::now() + Duration::from_millis(10))
            .await
            .unwrap_err();
        assert!(e.contains("per-pod probe limit: 20 a second"), "{e}");
        assert_eq!(l.pod_turn("b", far).await, Ok(Duration::ZERO), "b's own");
        assert_eq!(Instant::now(), t);
        let mut n = 0;
        while l.pod_turn("a", t + Duration::from_secs(1)).await.is_ok() {
            n += 1;
        }
        assert_eq!(n, 20, "a's turns in the first second after its burst");
        // 10,000 pods probing once each, 100 a second: only the last ones' buckets are kept.
        for i in 0..10_000 {
            l.pod_turn(&format!("pod-{i}"), Instant::now() + Duration::from_secs(1)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert!(l.pod_buckets() <= 2 * POD_BUCKETS_SWEEP, "{}", l.pod_buckets());
        }
        // At or above the node's rate a pod's rate adds nothing: not kept.
        let l = ProbeLimiter::new(4, 50).per_pod_rate(50);
        for _ in 0..100 {
            assert_eq!(l.pod_turn("a", far).await, Ok(Duration::ZERO));
        }
        assert_eq!(l.pod_buckets(), 0);
    }

    /// A probe connects through its environment (the pod's namespace in the engine), never
    /// straight from crisp's.
    #[tokio::test]
    async fn probes_connect_through_their_environment() {
        struct Refuse;
        impl ProbeEnv for Refuse {
            async fn pod_ip(&self) -> Option<IpAddr> {
                Some([127, 0, 0, 1].into())
            }
            async fn connect(&self, _: SocketAddr) -> Result<TcpStream, String> {
                Err("cannot enter the pod's network namespace: test".into())
            }
            async fn exec(&self, _: &[String], _: Duration) -> Result<i32, String> {
                Ok(0)
            }
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = Duration::from_secs(1);
        for spec in [
            format!("tcp://127.0.0.1:{port}"),
            format!("http://:{port}/"),
        ] {
            let e = Readiness::parse(&spec)
                .unwrap()
                .probe(&Refuse, t)
                .await
                .unwrap_err();
            assert!(
                e.starts_with("cannot enter the pod's network namespace"),
                "{e}"
            );
        }
        l.set_nonblocking(true).unwrap();
        assert!(l.accept().is_err(), "nothing reached the listener");
    }
}
