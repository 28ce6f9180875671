//! Addresses a probe may aim at: loopback and unspecified (the pod's own namespace) and the
//! operator's networks (`[ordering] probe_allow`).

use std::net::IpAddr;

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
