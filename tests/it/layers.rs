//! The layers of `src/` point one way (lib.rs lists them): a module imports only modules of
//! lower layers (and its own submodules). Reads every `crate::` path in `src/`; fails naming
//! the file and the import that runs back up. Below the layers, the modules of each folder
//! import each other without a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first. Modules of one layer do not import each other.
const LAYERS: &[&[&str]] = &[
    &["tenant", "sys"],
    &[
        "readiness",
        "netns",
        "status",
        "cri",
        "systemd",
        "admin_api",
    ],
    &["config"],
    &[
        "intercept",
        "hold_events",
        "metrics",
        "otel",
        "telemetry",
        "watchdog",
    ],
    &["proxy"],
    &["ordering", "tap"],
    &["admin", "doctor", "cli"],
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

/// Circles that work on another branch will remove (the relay-core rewrite of issue #48 removed
/// the last, `core -> held -> core`). A line here must still be a circle found, so it is
/// dropped when that work is merged.
const KNOWN_CIRCLES: &[&str] = &[];

/// The modules of one folder (`ordering/annotations.rs`, `proxy/relay/core.rs`, ...) import
/// each other without a circle (issues #36 and #48): a reader can start at the bottom of a
/// folder and meet only what they have read. An import from anywhere inside one child of a
/// folder (its file, its own folder, its inline modules) of anything inside another child is
/// an edge between the two; imports of the folder's own `mod.rs` are not. Paths are read as
/// rustc resolves them: `crate::`, `self::` and `super::` (from inline modules too), brace
/// groups included; comments are not read. Fails naming each circle.
#[test]
fn no_circles_in_any_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        if rel.starts_with("bin") {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        modules.push((module_of(rel), text));
    }
    let mut circles = circles(&modules);
    let mut stale = Vec::new();
    for known in KNOWN_CIRCLES {
        match circles.iter().position(|c| c == known) {
            Some(i) => {
                circles.remove(i);
            }
            None => stale.push(format!(
                "KNOWN_CIRCLES lists `{known}`, which is gone: drop it"
            )),
        }
    }
    circles.extend(stale);
    assert!(
        circles.is_empty(),
        "import circles between the modules of a folder:\n{}",
        circles.join("\n")
    );
}

/// The module a file of `src/` holds: `proxy/relay/core.rs` -> `[proxy, relay, core]`,
/// `proxy/mod.rs` -> `[proxy]`, `lib.rs` -> `[]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut m: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
        m.pop();
    }
    m
}

/// Each circle between the children of one folder, once: `src/<folder>: a -> b -> a`.
fn circles(modules: &[(Vec<String>, String)]) -> Vec<String> {
    let known: BTreeSet<&[String]> = modules.iter().map(|(m, _)| m.as_slice()).collect();
    // folder -> child -> the children it imports
    let mut folders: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (module, text) in modules {
        for path in imported_paths(module, text) {
            // The module the path names: its longest prefix that is a module of src/.
            let target = (0..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|p| known.contains(p))
                .unwrap_or(&[]);
            let shared = module
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            if shared < module.len() && shared < target.len() {
                folders
                    .entry(module[..shared].to_vec())
                    .or_default()
                    .entry(module[shared].clone())
                    .or_default()
                    .insert(target[shared].clone());
            }
        }
    }
    let mut out = Vec::new();
    for (folder, edges) in &folders {
        let name = ["src".to_string()]
            .iter()
            .chain(folder)
            .cloned()
            .collect::<Vec<_>>()
            .join("/");
        // A circle through `start` whose other members sort after it: each circle once.
        for start in edges.keys() {
            let mut stack = vec![vec![start.clone()]];
            while let Some(path) = stack.pop() {
                let at = path.last().unwrap();
                for next in edges.get(at).into_iter().flatten() {
                    if next == start {
                        out.push(format!("{name}: {} -> {start}", path.join(" -> ")));
                    } else if next > start && !path.contains(next) {
                        let mut p = path.clone();
                        p.push(next.clone());
                        stack.push(p);
                    }
                }
            }
        }
    }
    out
}

/// Rust source as tokens: identifiers, `::`, and single punctuation; comments, strings and
/// character literals left out.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i += 2;
        } else if c == 'r' && matches!(next, Some('"' | '#')) {
            // A raw string: r"..", r#".."#.
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push("r".to_string());
                i += 1;
                continue;
            }
            i += 2 + hashes;
            while i < chars.len()
                && !(chars[i] == '"'
                    && chars[i + 1..].iter().take(hashes).all(|&c| c == '#')
                    && chars.len() >= i + 1 + hashes)
            {
                i += 1;
            }
            i += 1 + hashes;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// Every path of `text` that starts `crate::`, `self::` or `super::`, made absolute (segments
/// from the crate root), brace groups expanded. `module` is the file's module; `super::` and
/// `self::` count from the inline module (`mod tests { .. }`) they are written in.
fn imported_paths(module: &[String], text: &str) -> Vec<Vec<String>> {
    let toks = tokens(text);
    let mut out = Vec::new();
    // The inline modules open at this point, with the brace depth each opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        match t {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if toks.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push((toks[i + 1].clone(), depth));
                depth += 1;
                i += 3;
                continue;
            }
            "crate" | "self" | "super" if toks.get(i + 1).is_some_and(|t| t == "::") => {
                if i > 0 && toks[i - 1] == "::" {
                    i += 1;
                    continue;
                }
                let mut here: Vec<String> = module.to_vec();
                here.extend(inline.iter().map(|(n, _)| n.clone()));
                let mut base = if t == "crate" { Vec::new() } else { here };
                let mut j = i;
                if t == "crate" || t == "self" {
                    j += 2;
                }
                while toks.get(j).is_some_and(|t| t == "super")
                    && toks.get(j + 1).is_some_and(|t| t == "::")
                {
                    base.pop();
                    j += 2;
                }
                i = tree(&toks, j, base, &mut out);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Reads a use tree (or a plain path) at `toks[i]` under `prefix` into `out`; returns the
/// index after it.
fn tree(
    toks: &[String],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match toks.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                while toks.get(i).is_some_and(|t| t != "}") {
                    if toks[i] == "," {
                        i += 1;
                        continue;
                    }
                    i = tree(toks, i, prefix.clone(), out);
                }
                return i + 1;
            }
            Some("self") => {
                out.push(prefix);
                return i + 1;
            }
            Some(t) if t.starts_with(|c: char| c.is_alphanumeric() || c == '_') => {
                prefix.push(t.to_string());
                if toks.get(i + 1).is_some_and(|t| t == "::") {
                    i += 2;
                } else {
                    out.push(prefix);
                    // Skip `as name`.
                    if toks.get(i + 1).is_some_and(|t| t == "as") {
                        return i + 3;
                    }
                    return i + 1;
                }
            }
            _ => {
                // `*`, or the end of a path.
                out.push(prefix);
                return i + 1;
            }
        }
    }
}

/// The check finds a circle in a folder below a room, through `super::`, `crate::` paths,
/// brace groups and inline modules, and ignores comments, strings and the folder's own items.
#[test]
fn circles_are_found_at_any_depth() {
    let m = |p: &str| {
        p.split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let modules = vec![
        (m("a"), "pub(crate) struct Shared;".to_string()),
        (m("a/b"), String::new()),
        (
            m("a/b/x"),
            "use super::{y::Y, super::Shared};\n// use super::z;\nlet s = \"super::z\";"
                .to_string(),
        ),
        (
            m("a/b/y"),
            "pub(crate) fn f() -> crate::a::b::z::Z { todo!() }".to_string(),
        ),
        (
            m("a/b/z"),
            "mod tests {\n    use super::super::x::X;\n}\nfn g() {}".to_string(),
        ),
        (m("a/c"), "use crate::a::b::x;".to_string()),
    ];
    assert_eq!(circles(&modules), ["src/a/b: x -> y -> z -> x"]);
    let mut without = modules.clone();
    without[4].1 = "fn g() { let c = '{'; }".to_string();
    assert!(circles(&without).is_empty(), "{:?}", circles(&without));
}
