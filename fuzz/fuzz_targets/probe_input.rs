//! The parsing issue #19 added for probes, on arbitrary input. The first byte picks the parser:
//! - `[ordering] probe_allow` CIDR lists (one entry a line): no panic; an accepted network
//!   shows back as itself and contains its own address;
//! - the verbose PodSandboxStatus `info` JSON (`netns::candidates`): no panic; every path tried
//!   is absolute (a spec path or `/proc/PID/ns/net`), at most two;
//! - a readiness spec from a pod annotation against the address rule (`tenant_may_aim`): no
//!   panic; what passes names the pod IP, a local host, a pod address or an allowed network.
#![no_main]

use std::net::IpAddr;

use crisp::config::parse_cidrs;
use crisp::netns;
use crisp::ordering::annotations::tenant_may_aim;
use crisp::readiness::{is_local, Cidr, Readiness};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(s) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 3 {
        0 => {
            let list: Vec<String> = s.lines().map(str::to_string).collect();
            if let Ok(cidrs) = parse_cidrs(&list) {
                for c in cidrs {
                    let shown = c.to_string();
                    assert_eq!(Cidr::parse(&shown), Ok(c), "{shown}");
                    let net: IpAddr = shown.split('/').next().unwrap().parse().unwrap();
                    assert!(c.contains(net), "{shown}");
                }
            }
        }
        1 => {
            if let Ok(paths) = netns::candidates(s) {
                assert!(paths.len() <= 2, "{paths:?}");
                for p in paths {
                    assert!(p.is_absolute(), "{p:?}");
                }
            }
        }
        _ => {
            let pod: [IpAddr; 2] = [[10, 1, 2, 3].into(), "fd00::3".parse().unwrap()];
            let allow = [Cidr::parse("192.168.0.0/16").unwrap()];
            let Ok(r) = Readiness::parse(s) else { return };
            if tenant_may_aim(&r, &pod, &allow).is_ok() {
                if let Readiness::Tcp { host: Some(h), .. }
                | Readiness::Http { host: Some(h), .. } = r
                {
                    let h = h.to_canonical();
                    assert!(
                        is_local(h) || pod.contains(&h) || allow[0].contains(h),
                        "{s:?} passed"
                    );
                }
            }
        }
    }
});
