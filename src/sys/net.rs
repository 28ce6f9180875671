//! Whether an address is the node's own: a local-route lookup, done the way the kernel itself
//! decides it (issue #44).

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

/// Whether `ip` is an address of the network namespace the calling thread is in (crisp's: the
/// node's), by the kernel's own rule: binding a socket to it succeeds exactly when the local
/// routing table holds it (an address on any interface, an AnyIP route such as
/// `local 10.0.0.0/8 dev lo`, loopback), and fails with `EADDRNOTAVAIL` otherwise. Any other
/// answer (an IPv6 link-local address without its interface, a socket that cannot be made) and
/// a namespace where `ip_nonlocal_bind` lets any address be bound count as "the node's": the
/// caller refuses the address, which is the safe side.
pub(crate) fn is_node_address(ip: IpAddr) -> bool {
    if nonlocal_bind(ip.is_ipv6()) {
        return true;
    }
    match UdpSocket::bind(SocketAddr::new(ip, 0)) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() != Some(libc::EADDRNOTAVAIL),
    }
}

/// `net.ipv4.ip_nonlocal_bind` / `net.ipv6.ip_nonlocal_bind` in the calling thread's namespace;
/// unreadable counts as on.
fn nonlocal_bind(v6: bool) -> bool {
    let path = if v6 {
        "/proc/sys/net/ipv6/ip_nonlocal_bind"
    } else {
        "/proc/sys/net/ipv4/ip_nonlocal_bind"
    };
    read_flag(path).unwrap_or(true)
}

fn read_flag(path: &str) -> io::Result<bool> {
    Ok(std::fs::read_to_string(path)?.trim() != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_addresses_and_no_other() {
        assert!(is_node_address("127.0.0.1".parse().unwrap()));
        assert!(
            is_node_address("127.8.9.10".parse().unwrap()),
            "AnyIP: all of 127/8 is local"
        );
        // An address of this host that is not loopback: the source of its default route.
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        if s.connect("192.0.2.1:9").is_ok() {
            assert!(is_node_address(s.local_addr().unwrap().ip()));
        }
        // TEST-NET-3 is on no interface of a test machine.
        assert!(!is_node_address("203.0.113.77".parse().unwrap()));
    }
}
