//! `Readiness::parse` on arbitrary strings (the `crisp.dev/ready.<name>` annotation and node
//! rules). Beyond "no panic": accepted specs are sane (port ≠ 0, non-empty exec command, no
//! whitespace or control bytes in an HTTP path) and a spec rendered back by its `Display` (the
//! way ListPods shows it) parses to the same thing.
#![no_main]

use crisp::readiness::Readiness;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(r) = Readiness::parse(s) else { return };
    assert!(s.trim().len() <= 4096);
    match &r {
        Readiness::Running => {}
        Readiness::Tcp { port, .. } => assert_ne!(*port, 0),
        Readiness::Http { port, path, .. } => {
            assert_ne!(*port, 0);
            assert!(path.starts_with('/'), "{path:?}");
            assert!(
                !path
                    .bytes()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control()),
                "{path:?}"
            );
        }
        Readiness::Exec { cmd } => assert!(!cmd.is_empty() && !cmd[0].is_empty()),
    }
    let again = r.to_string();
    if again.len() <= 4096 {
        assert_eq!(
            Readiness::parse(&again).as_ref(),
            Ok(&r),
            "{s:?} → {r:?} → {again:?}"
        );
    }
});
