//! `Readiness::parse` on arbitrary strings (the `crisp.dev/ready.<name>` annotation and node
//! rules). Beyond "no panic": accepted specs are sane (port ≠ 0, non-empty exec command, no
//! whitespace or control bytes in an HTTP path) and a spec rendered back the way `crisp tap` /
//! ListPods shows it parses to the same thing.
#![no_main]

use crisp::ordering::readiness::Readiness;
use libfuzzer_sys::fuzz_target;

fn render(r: &Readiness) -> String {
    let host = |h: &Option<std::net::IpAddr>| match h {
        Some(std::net::IpAddr::V6(a)) => format!("[{a}]"),
        Some(a) => a.to_string(),
        None => String::new(),
    };
    match r {
        Readiness::Running => "running".into(),
        Readiness::Tcp { host: h, port } => format!("tcp://{}:{port}", host(h)),
        Readiness::Http { host: h, port, path } => format!("http://{}:{port}{path}", host(h)),
        Readiness::Exec { cmd } => format!("exec:{}", serde_json_like(cmd)),
    }
}

/// JSON array of strings without pulling serde_json into the fuzz crate: Debug of a Rust
/// string is not JSON, so build it by hand with JSON escapes.
fn serde_json_like(cmd: &[String]) -> String {
    let mut out = String::from("[");
    for (i, s) in cmd.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push(']');
    out
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let Ok(r) = Readiness::parse(s) else { return };
    assert!(s.trim().len() <= 4096);
    match &r {
        Readiness::Running => {}
        Readiness::Tcp { port, .. } => assert_ne!(*port, 0),
        Readiness::Http { port, path, .. } => {
            assert_ne!(*port, 0);
            assert!(path.starts_with('/'), "{path:?}");
            assert!(!path.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()), "{path:?}");
        }
        Readiness::Exec { cmd } => assert!(!cmd.is_empty() && !cmd[0].is_empty()),
    }
    let again = render(&r);
    if again.len() <= 4096 {
        assert_eq!(Readiness::parse(&again).as_ref(), Ok(&r), "{s:?} → {r:?} → {again:?}");
    }
});
