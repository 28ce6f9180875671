//! docs/ARCHITECTURE.md's glossary says which names were retired (issue #36, "one name per
//! idea"); this checks that none came back into `src/`. Each name in the table's "Retired"
//! column is written so that a reader and this test can look it up:
//!
//! - `path/file.rs` or `path/dir`: a file of `src/` that no longer exists;
//! - `module::item` (the first segment lowercase): no item of that name is declared in that
//!   module's files (`fn`, `struct`, `enum`, `const`, `static`, `type`, `mod`, `trait`);
//! - `Type::name`: no `fn name` nor `name:` field in the files that declare or implement
//!   `Type`, and no `Type::name` anywhere (an enum's variant);
//! - `Name` (a type, a constant or a `snake_name`): the word appears nowhere in `src/`.
//!
//! A bare lowercase word (`tick`, `upstream`) says too little to be checked (other ideas may
//! keep it), and fails here asking to be qualified.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&p).expect("readable source");
            out.push((p, text));
        }
    }
}

/// The backticked names of the glossary's "Retired" column, with the row's name.
fn retired_names(architecture: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut in_glossary = false;
    let mut retired_col = None;
    for line in architecture.lines() {
        if line.starts_with("## ") {
            in_glossary = line.starts_with("## Glossary");
            continue;
        }
        if !in_glossary || !line.starts_with('|') {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if let Some(i) = cells.iter().position(|c| *c == "Retired") {
            retired_col = Some(i);
            continue;
        }
        let (Some(i), Some(row)) = (retired_col, cells.first()) else {
            continue;
        };
        let Some(cell) = cells.get(i) else { continue };
        for (k, piece) in cell.split('`').enumerate() {
            if k % 2 == 1 {
                out.push((row.to_string(), piece.to_string()));
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `word` stands in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// `name` is declared as an item in `text`.
fn declares(text: &str, name: &str) -> bool {
    [
        "fn", "struct", "enum", "const", "static", "type", "mod", "trait",
    ]
    .iter()
    .any(|kw| has_word(text, &format!("{kw} {name}")))
}

/// Whether the retired `name` is back in `files`; None when it was written too vaguely to say.
fn still_there(name: &str, files: &[(PathBuf, String)]) -> Option<Vec<String>> {
    let src = root().join("src");
    let rel = |p: &Path| p.strip_prefix(root()).unwrap_or(p).display().to_string();
    if name.contains('/') {
        let p = src.join(name);
        return Some(if p.exists() { vec![rel(&p)] } else { vec![] });
    }
    if let Some((owner, item)) = name.rsplit_once("::") {
        let first = owner.split("::").next().unwrap_or(owner);
        let mut hits = Vec::new();
        if first.starts_with(|c: char| c.is_ascii_lowercase()) {
            // A module path: its files are `<m>.rs` and everything under `<m>/`, wherever the
            // module's last segment names a file or folder of src/.
            let m = owner.rsplit("::").next().unwrap_or(owner);
            for (p, text) in files {
                let in_module = p.file_stem().is_some_and(|s| s == m)
                    || p.ancestors().any(|a| a.file_name().is_some_and(|f| f == m));
                if in_module && declares(text, item) {
                    hits.push(rel(p));
                }
            }
            if owner.split("::").count() == 1 || item.starts_with(char::is_lowercase) {
                let dir = src.join(owner.replace("::", "/"));
                for p in [dir.join(format!("{item}.rs")), dir.join(item)] {
                    if p.exists() {
                        hits.push(rel(&p));
                    }
                }
            }
        } else {
            for (p, text) in files {
                if text.contains(name) {
                    hits.push(format!("{} (`{name}`)", rel(p)));
                }
                let owns = declares(text, owner)
                    || has_word(text, &format!("impl {owner}"))
                    || text.contains(&format!("impl {owner}<"));
                let field = format!("{item}:");
                let is_field = text.lines().any(|l| {
                    let l = l.trim_start();
                    let l = l
                        .strip_prefix("pub(crate) ")
                        .or(l.strip_prefix("pub(super) "));
                    let l = l.map(|l| l.strip_prefix("pub ").unwrap_or(l));
                    l.is_some_and(|l| l.starts_with(&field))
                });
                if owns && (has_word(text, &format!("fn {item}")) || is_field) {
                    hits.push(rel(p));
                }
            }
        }
        return Some(hits);
    }
    if name.starts_with(|c: char| c.is_ascii_uppercase()) || name.contains('_') {
        let hits = files
            .iter()
            .filter(|(_, text)| has_word(text, name))
            .map(|(p, _)| rel(p))
            .collect();
        return Some(hits);
    }
    None
}

#[test]
fn no_retired_name_is_back_in_src() {
    let arch = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("ARCHITECTURE");
    let names = retired_names(&arch);
    assert!(
        names.len() >= 10,
        "the glossary's Retired column was not found or lost its names: {names:?}"
    );
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut problems = Vec::new();
    for (row, name) in &names {
        match still_there(name, &files) {
            None => problems.push(format!(
                "{row}: `{name}` is too vague to check: qualify it (`module::{name}`, \
                 `Type::{name}`)"
            )),
            Some(hits) if !hits.is_empty() => problems.push(format!(
                "{row}: retired `{name}` is back: {}",
                hits.join(", ")
            )),
            Some(_) => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The lookup finds each form when the name is there, and reads the table's column.
#[test]
fn the_retired_name_lookup_finds_each_form() {
    let files = vec![
        (
            root().join("src/proxy/relay/core.rs"),
            "pub(crate) struct Core {\n    pub(super) draining: bool,\n}\nimpl Core {\n    fn tick(&self) {}\n}"
                .to_string(),
        ),
        (
            root().join("src/proxy/relay/ping.rs"),
            "impl KeepAlive { pub(crate) fn tick(&self) {} }".to_string(),
        ),
        (root().join("src/status.rs"), "pub(crate) fn cut_text() {}".to_string()),
        (root().join("src/x.rs"), "let v = Verdict::Reject; let e = UpstreamError;".to_string()),
    ];
    let found = |n: &str| still_there(n, &files).expect("checkable").len();
    assert_eq!(found("Core::tick"), 1, "a method of the type");
    assert_eq!(found("Core::draining"), 1, "a field of the type");
    assert_eq!(found("Core::goaway_due"), 0);
    assert_eq!(found("KeepAlive::beat"), 0);
    assert_eq!(found("status::cut_text"), 1, "an item of the module");
    assert_eq!(found("tap::cut_text"), 0, "another module");
    assert_eq!(found("Verdict::Reject"), 1, "a variant, by its path");
    assert_eq!(found("UpstreamError"), 1, "a word");
    assert_eq!(found("UpstreamErrors"), 0, "whole words only");
    assert_eq!(found("proxy/relay/core.rs"), 1, "a file");
    assert!(
        still_there("tick", &files).is_none(),
        "a bare word is too vague"
    );
    let table = "## Glossary\n\n| Name | Means | Retired |\n|---|---|---|\n\
                 | **a** | x `not this` | `Old`, `m::old` |\n| **b** | y | — |\n## Next\n\
                 | **c** | z | `Later` |\n";
    assert_eq!(
        retired_names(table),
        [("**a**", "Old"), ("**a**", "m::old")]
            .map(|(r, n)| (r.to_string(), n.to_string()))
            .to_vec()
    );
}
