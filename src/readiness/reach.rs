//! What a probe from *outside* a pod may aim at (issue #44): a pod whose network crisp cannot
//! enter (a VM or a user-space kernel owns it, or the runtime names no namespace where the pod
//! IP lives) is probed from crisp's own network namespace, with the node's source address and
//! past every NetworkPolicy. Such a probe may only reach what kubelet's own probe of the pod
//! would: one of the pod's own IPs, as the runtime reports them — never an operator's
//! `probe_allow` network (that is for probes that leave the pod's own namespace with the pod's
//! address) — and, because a CNI may let a pod choose its address, never an address that is the
//! node's own (a local route: the node's interfaces, its AnyIP ranges), never loopback,
//! unspecified, multicast or broadcast, and never a link-local or cloud-metadata address unless
//! the operator named it in `[readiness] outside_allow`.
//!
//! The decision is sans-I/O: whether the address is the node's is looked up by the caller
//! (`sys::net::is_node_address`) and passed in.

use std::net::IpAddr;

use super::Cidr;

/// Why an outside probe of an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OutsideRefusal {
    #[error("it is not one of the pod's own IPs (a pod probed from outside its network may be probed only at its IPs, never at [ordering] probe_allow networks)")]
    NotThePods,
    #[error("it is loopback, unspecified, multicast or broadcast")]
    NotUnicast,
    #[error("it is an address of the node itself (the pod's runtime reports the node's address as the pod's)")]
    NodeAddress,
    #[error("it is link-local or a cloud metadata address, which [readiness] outside_allow does not name")]
    LinkLocalOrMetadata,
}

/// Link-local networks and the cloud metadata services' well-known addresses: refused as
/// targets of outside probes unless `[readiness] outside_allow` names them.
pub const GUARDED: &[&str] = &[
    "169.254.0.0/16", // IPv4 link-local: AWS, GCP, Azure, OpenStack metadata at .169.254
    "fe80::/10",      // IPv6 link-local
    "100.100.100.200", // Alibaba Cloud metadata
    "168.63.129.16",  // Azure WireServer
    "fd00:ec2::254",  // AWS metadata over IPv6
    "fd00:ec2::23",   // AWS DNS over IPv6
];

fn guarded(ip: IpAddr) -> bool {
    GUARDED
        .iter()
        .filter_map(|c| Cidr::parse(c).ok())
        .any(|c| c.contains(ip))
}

/// Whether an outside probe may connect to `ip`: one of `pod_ips`, not loopback or otherwise
/// not a single host, not the node's own address (`node_address`, looked up by the caller), and
/// not link-local or metadata unless `allow` names it. Checked in this order, so the reason is
/// the first rule the address breaks.
pub fn outside_target(
    ip: IpAddr,
    pod_ips: &[IpAddr],
    node_address: bool,
    allow: &[Cidr],
) -> Result<(), OutsideRefusal> {
    let ip = ip.to_canonical();
    if !pod_ips.iter().any(|p| p.to_canonical() == ip) {
        return Err(OutsideRefusal::NotThePods);
    }
    let not_unicast = match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()
        }
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified() || v6.is_multicast(),
    };
    if not_unicast {
        return Err(OutsideRefusal::NotUnicast);
    }
    if node_address {
        return Err(OutsideRefusal::NodeAddress);
    }
    if guarded(ip) && !allow.iter().any(|c| c.contains(ip)) {
        return Err(OutsideRefusal::LinkLocalOrMetadata);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter().map(|c| Cidr::parse(c).unwrap()).collect()
    }

    #[test]
    fn only_the_pods_own_ips() {
        let pod = [ip("10.1.2.3"), ip("fd00::3")];
        assert_eq!(outside_target(ip("10.1.2.3"), &pod, false, &[]), Ok(()));
        assert_eq!(outside_target(ip("fd00::3"), &pod, false, &[]), Ok(()));
        // An IPv4-mapped IPv6 form of the pod's address is the pod's address.
        assert_eq!(
            outside_target(ip("::ffff:10.1.2.3"), &pod, false, &[]),
            Ok(())
        );
        // probe_allow is not consulted: a network the operator allowed for in-pod probes is
        // still not the pod's.
        for other in ["10.1.2.4", "10.96.0.10", "192.0.2.1"] {
            assert_eq!(
                outside_target(ip(other), &pod, false, &cidrs(&["10.0.0.0/8"])),
                Err(OutsideRefusal::NotThePods),
                "{other}"
            );
        }
        assert_eq!(
            outside_target(ip("10.1.2.3"), &[], false, &[]),
            Err(OutsideRefusal::NotThePods)
        );
    }

    /// A pod that "lives at" loopback, the node's address or a metadata address (a CNI that
    /// lets the pod choose it): refused, whatever else holds.
    #[test]
    fn a_pod_ip_that_is_not_a_pods_is_refused() {
        for bad in [
            "127.0.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "224.0.0.1",
            "255.255.255.255",
            "ff02::1",
        ] {
            assert_eq!(
                outside_target(ip(bad), &[ip(bad)], false, &cidrs(&["0.0.0.0/0", "::/0"])),
                Err(OutsideRefusal::NotUnicast),
                "{bad}"
            );
        }
        // The node's own address: never, even if the operator "allowed" everything.
        assert_eq!(
            outside_target(
                ip("192.0.2.7"),
                &[ip("192.0.2.7")],
                true,
                &cidrs(&["0.0.0.0/0"])
            ),
            Err(OutsideRefusal::NodeAddress)
        );
        for meta in [
            "169.254.169.254",
            "169.254.170.2",
            "fe80::1",
            "100.100.100.200",
            "168.63.129.16",
            "fd00:ec2::254",
        ] {
            assert_eq!(
                outside_target(ip(meta), &[ip(meta)], false, &[]),
                Err(OutsideRefusal::LinkLocalOrMetadata),
                "{meta}"
            );
        }
        // ... unless the operator names it.
        assert_eq!(
            outside_target(
                ip("169.254.10.5"),
                &[ip("169.254.10.5")],
                false,
                &cidrs(&["169.254.10.0/24"])
            ),
            Ok(())
        );
        assert_eq!(
            outside_target(
                ip("169.254.169.254"),
                &[ip("169.254.169.254")],
                false,
                &cidrs(&["169.254.10.0/24"])
            ),
            Err(OutsideRefusal::LinkLocalOrMetadata)
        );
        // Its neighbours are ordinary pod addresses.
        assert_eq!(
            outside_target(ip("100.100.100.201"), &[ip("100.100.100.201")], false, &[]),
            Ok(())
        );
    }

    #[test]
    fn every_guarded_entry_parses() {
        for c in GUARDED {
            Cidr::parse(c).unwrap();
        }
    }
}
