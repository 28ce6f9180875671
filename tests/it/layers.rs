//! The layers of `src/` point one way (lib.rs lists them): a module imports only modules of
//! lower layers (and its own submodules). Reads every `crate::` path in `src/`; fails naming
//! the file and the import that runs back up.

use std::path::{Path, PathBuf};

/// Bottom first. Modules of one layer do not import each other.
const LAYERS: &[&[&str]] = &[
    &["tenant", "sys"],
    &["readiness", "netns", "status", "cri", "systemd"],
    &["config"],
    &["intercept", "metrics", "telemetry", "watchdog"],
    &["proxy"],
    &["ordering", "tap"],
    &["admin", "doctor"],
    &["daemon"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_module_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        let top = rel.split(['/', '.']).next().unwrap().to_string();
        // The binary (src/bin/crisp/) sits above every layer and names the library `crisp::`.
        if top == "lib" || top == "bin" {
            continue;
        }
        let Some(own) = layer_of(&top) else {
            violations.push(format!(
                "src/{rel}: module `{top}` has no layer in tests/it/layers.rs (and lib.rs)"
            ));
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            let mut rest = line;
            while let Some(i) = rest.find("crate::") {
                let after = &rest[i + 7..];
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &after[name.len()..];
                if name == top {
                    continue;
                }
                match layer_of(&name) {
                    Some(l) if l < own => {}
                    Some(l) => violations.push(format!(
                        "src/{rel}:{}: `{top}` (layer {own}) imports `crate::{name}` (layer {l})",
                        n + 1
                    )),
                    None => {}
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports that run back up:\n{}",
        violations.join("\n")
    );
}
