//! The layers of `src/` point one way (lib.rs lists them): a module imports only modules of
//! lower layers (and its own submodules). Reads every `crate::` path in `src/`; fails naming
//! the file and the import that runs back up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first. Modules of one layer do not import each other.
const LAYERS: &[&[&str]] = &[
    &["tenant", "sys"],
    &["readiness", "netns", "status", "cri", "systemd"],
    &["config"],
    &["intercept", "metrics", "otel", "telemetry", "watchdog"],
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

/// The submodules of one room (a top-level module's folder: `ordering/annotations.rs`,
/// `tap/redact.rs`, ...) import each other without a circle (issue #36 item 5): a reader can
/// start at the bottom of a room and meet only what they have read. Edges are `crate::<room>::x`
/// and `super::x` paths (brace groups included) naming a sibling; items of the room's own
/// `mod.rs` are not a sibling. Fails naming each circle.
#[test]
fn no_circles_inside_a_room() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // room -> sibling -> the siblings it imports
    type Edges = BTreeMap<String, BTreeSet<String>>;
    let mut rooms: BTreeMap<String, Edges> = BTreeMap::new();
    let parts = |f: &Path| -> Vec<String> {
        let rel = f.strip_prefix(&src).unwrap();
        rel.iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect()
    };
    for f in &files {
        let p = parts(f);
        if p.len() >= 2 && p[0] != "bin" {
            let sub = p[1].trim_end_matches(".rs").to_string();
            if sub != "mod" {
                rooms
                    .entry(p[0].clone())
                    .or_default()
                    .entry(sub)
                    .or_default();
            }
        }
    }
    for f in &files {
        let p = parts(f);
        let Some(edges) = rooms.get_mut(p[0].as_str()).filter(|_| p.len() >= 2) else {
            continue;
        };
        let own = p[1].trim_end_matches(".rs").to_string();
        if own == "mod" {
            continue;
        }
        // `super::` from src/room/x.rs is the room; from src/room/x/y.rs it is x itself. One
        // `super::` more reaches the room from an inline module (`mod tests { .. }`).
        let depth = p.len() - 2 - usize::from(p.last().unwrap() == "mod.rs");
        let sup = "super::".repeat(depth + 1);
        let sup_inline = "super::".repeat(depth + 2);
        let crate_room = format!("crate::{}::", p[0]);
        let text: String = std::fs::read_to_string(f)
            .unwrap()
            .lines()
            .map(|l| l.split("//").next().unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        let mut named = BTreeSet::new();
        for prefix in [crate_room.as_str(), sup.as_str(), sup_inline.as_str()] {
            let mut rest = text.as_str();
            while let Some(i) = rest.find(prefix) {
                // `super::super::x` seen as `super::x` from one level down is not ours.
                let before = &rest[..i];
                rest = &rest[i + prefix.len()..];
                if prefix != crate_room && (before.ends_with("::") || before.ends_with("super")) {
                    continue;
                }
                let group = if let Some(inner) = rest.strip_prefix('{') {
                    &inner[..inner.find('}').unwrap_or(inner.len())]
                } else {
                    rest
                };
                let items: Vec<&str> = if rest.starts_with('{') {
                    group.split(',').collect()
                } else {
                    vec![group]
                };
                for item in items {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    named.insert(name);
                }
            }
        }
        let siblings: BTreeSet<String> = edges.keys().cloned().collect();
        let out = edges.get_mut(&own).unwrap();
        out.extend(
            named
                .into_iter()
                .filter(|n| *n != own && siblings.contains(n)),
        );
    }
    let mut circles = Vec::new();
    for (room, edges) in &rooms {
        // A circle through `start` whose other members sort after it: each circle once.
        for start in edges.keys() {
            let mut stack = vec![(start.clone(), vec![start.clone()])];
            while let Some((at, path)) = stack.pop() {
                for next in &edges[&at] {
                    if next == start {
                        circles.push(format!("{room}: {} -> {start}", path.join(" -> ")));
                    } else if next > start && !path.contains(next) {
                        let mut p = path.clone();
                        p.push(next.clone());
                        stack.push((next.clone(), p));
                    }
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles inside rooms:\n{}",
        circles.join("\n")
    );
}
