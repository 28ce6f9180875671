//! docs/ARCHITECTURE.md's glossary says which names were retired (issues #36 and #48, "one name
//! per idea"); this checks that none came back: not in the code of `src/` (its comments and the
//! text it logs or answers included), not in the docs (the repository's and docs/'s `*.md`,
//! the glossary itself aside). Case never hides a name: `UpstreamError`, `upstream_error` and
//! `UPSTREAM_ERROR` are one name, and "Upstream connection" is "upstream connection".
//!
//! Each cell of the table's "Retired" column is `—` or a list of backticked names, each maybe
//! followed by a note in parentheses; anything else fails here as a cell this test cannot
//! read. Each name takes one of these forms:
//!
//! - `path/file.rs` or `path/dir`: a file of `src/` that no longer exists, and that no code or
//!   doc names;
//! - `module::item` (the first segment lowercase): no item of that name is declared in that
//!   module's files (`fn`, `struct`, `enum`, `const`, `static`, `type`, `mod`, `trait`), and no
//!   code or doc writes `module::item`;
//! - `Type::name`: no `fn name` nor `name:` field in the files that declare or implement
//!   `Type`, and no code or doc writes `Type::name` (an enum's variant);
//! - `CompoundName` (a type, a constant or a `snake_name` of two words or more): the name, in
//!   any spelling, is no identifier or word of the code or the docs;
//! - `"a phrase"`: the words, in any case and however the lines break, are in no code, comment,
//!   logged or answered string, or doc.
//!
//! A name that can match nothing fails too: a single word (`tick`, `Upstream`) says too little
//! (other ideas and plain English keep it) and must be qualified, and a `module::` or `Type::`
//! must name a module or type that `src/` still has (`Windows::changed` after `Windows` went is
//! checked by nothing but its text: retire `relay::Windows` instead).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Hits of a retired name that work on another branch will remove (the relay-core rewrite of
/// issue #48 was the last). Each (name, file) here must still be a hit, so a line is dropped as
/// soon as that work lands.
const KNOWN: &[(&str, &str)] = &[];

/// What the test reads: paths relative to the repository, with their text.
struct Corpus {
    /// Every `.rs` file under `src/`.
    code: Vec<(String, String)>,
    /// The `*.md` of the repository's root and of docs/, the glossary's own table left out.
    docs: Vec<(String, String)>,
}

impl Corpus {
    fn read() -> Corpus {
        let mut code = Vec::new();
        files_under(&root().join("src"), "rs", true, &mut code);
        let mut docs = Vec::new();
        files_under(&root(), "md", false, &mut docs);
        files_under(&root().join("docs"), "md", false, &mut docs);
        for (path, text) in &mut docs {
            if path == "docs/ARCHITECTURE.md" {
                *text = without_glossary(text);
            }
        }
        Corpus { code, docs }
    }

    fn all(&self) -> impl Iterator<Item = &(String, String)> {
        self.code.iter().chain(&self.docs)
    }
}

fn files_under(dir: &Path, ext: &str, deep: bool, out: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if deep {
                files_under(&p, ext, deep, out);
            }
        } else if p.extension().is_some_and(|x| x == ext) {
            let text = std::fs::read_to_string(&p).expect("readable file");
            let rel = p.strip_prefix(root()).unwrap_or(&p).display().to_string();
            out.push((rel, text));
        }
    }
}

fn without_glossary(text: &str) -> String {
    let mut keep = true;
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("## ") {
            keep = !line.starts_with("## Glossary");
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// One name of the Retired column, by its form (the module docs above).
#[derive(Debug, PartialEq)]
enum Retired {
    Path(String),
    Item { module: String, item: String },
    Member { owner: String, name: String },
    Word(String),
    Phrase(String),
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_ident_char) && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Two words or more: `FailFast`, `cut_text`, `MAX_STREAM_ID` (not `Upstream`, `tick`).
fn is_compound(s: &str) -> bool {
    let camel = s
        .as_bytes()
        .windows(2)
        .any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase());
    let snake = s.trim_matches('_').contains('_');
    camel || snake
}

fn parse_name(name: &str) -> Result<Retired, String> {
    if let Some(words) = name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        let plain = |c: char| c.is_alphanumeric() || " -'".contains(c);
        return if words.contains(' ') && words.chars().all(plain) {
            Ok(Retired::Phrase(words.to_lowercase()))
        } else {
            Err(format!(
                "`{name}`: a phrase is two words or more, letters only"
            ))
        };
    }
    if name.contains('/') {
        let path_char = |c: char| is_ident_char(c) || "/.-".contains(c);
        return if name.chars().all(path_char) && !name.starts_with('/') {
            Ok(Retired::Path(name.to_string()))
        } else {
            Err(format!("`{name}`: not a path under src/"))
        };
    }
    if let Some((owner, item)) = name.rsplit_once("::") {
        if !owner.split("::").all(is_ident) || !is_ident(item) {
            return Err(format!("`{name}`: not a path of identifiers"));
        }
        return Ok(if owner.starts_with(|c: char| c.is_ascii_lowercase()) {
            Retired::Item {
                module: owner.to_string(),
                item: item.to_string(),
            }
        } else if !owner.contains("::") {
            Retired::Member {
                owner: owner.to_string(),
                name: item.to_string(),
            }
        } else {
            return Err(format!("`{name}`: `Type::name` takes one type"));
        });
    }
    if !is_ident(name) {
        return Err(format!("`{name}`: not a name this test can look up"));
    }
    if !is_compound(name) {
        return Err(format!(
            "`{name}` is too vague to check (one word other ideas keep): qualify it \
             (`module::{name}`, `Type::{name}`)"
        ));
    }
    Ok(Retired::Word(name.to_string()))
}

/// The backticked names of one Retired cell; an error for anything else in it.
fn cell_names(cell: &str) -> Result<Vec<String>, String> {
    if cell == "—" {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    let mut rest = cell.trim();
    while !rest.is_empty() {
        let Some(after) = rest.strip_prefix('`') else {
            return Err(format!("cannot read {rest:?}: a name goes in backticks"));
        };
        let Some(end) = after.find('`') else {
            return Err(format!("cannot read {rest:?}: an unclosed backtick"));
        };
        names.push(after[..end].to_string());
        rest = after[end + 1..].trim_start();
        if rest.starts_with('(') {
            let mut depth = 0;
            let close = rest.char_indices().find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            });
            let Some((i, _)) = close else {
                return Err(format!("cannot read {rest:?}: an unclosed parenthesis"));
            };
            rest = rest[i + 1..].trim_start();
        }
        match rest.chars().next() {
            None => {}
            Some(',' | ';') => rest = rest[1..].trim_start(),
            Some(_) => {
                return Err(format!(
                    "cannot read {rest:?}: names are separated by `,` or `;`, notes go in \
                     parentheses"
                ))
            }
        }
    }
    if names.is_empty() {
        return Err("an empty cell: write `—`".to_string());
    }
    Ok(names)
}

/// The names of the glossary's Retired column, each with its row's name; every row read.
fn retired_names(architecture: &str) -> Result<Vec<(String, String)>, Vec<String>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut in_glossary = false;
    let mut header: Option<(usize, usize)> = None;
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
            header = Some((cells.len(), i));
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|c| c == '-' || c == ':'))
        {
            continue;
        }
        let Some((width, col)) = header else {
            problems.push(format!("a row before the header: {line}"));
            continue;
        };
        let row = cells[0].to_string();
        if cells.len() != width {
            problems.push(format!(
                "{row}: {} cells where the header has {width} (a `|` inside a cell?)",
                cells.len()
            ));
            continue;
        }
        match cell_names(cells[col]) {
            Ok(names) => out.extend(names.into_iter().map(|n| (row.clone(), n))),
            Err(e) => problems.push(format!("{row}: {e}")),
        }
    }
    if header.is_none() {
        problems.push("no glossary table with a Retired column".to_string());
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// `word` stands in `text` as a whole identifier, in any case.
fn has_word(text: &str, word: &str) -> bool {
    let (text, word) = (text.to_lowercase(), word.to_lowercase());
    text.match_indices(&word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)
    })
}

/// `name` is an identifier or word of `text` in any spelling: case and `_` aside.
fn has_spelling(text: &str, name: &str) -> bool {
    fn folded(s: &str) -> impl Iterator<Item = u8> + '_ {
        s.bytes()
            .filter(|&b| b != b'_')
            .map(|b| b.to_ascii_lowercase())
    }
    let n = folded(name).count();
    text.split(|c: char| !is_ident_char(c))
        .any(|w| w.len() >= n && folded(w).eq(folded(name)))
}

/// The words of `phrase` stand in `text`, whatever the case and the line breaks (comment
/// markers, quotes and Markdown emphasis between them aside).
fn has_phrase(text: &str, phrase: &str) -> bool {
    let words: Vec<String> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '-'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let want: Vec<&str> = phrase.split_whitespace().collect();
    words.windows(want.len()).any(|w| w == want.as_slice())
}

/// `name` is declared as an item in `text`.
fn declares(text: &str, name: &str) -> bool {
    declares_as(
        text,
        name,
        &[
            "fn", "struct", "enum", "const", "static", "type", "mod", "trait",
        ],
    )
}

/// `name` is declared in `text` with one of `keywords`.
fn declares_as(text: &str, name: &str, keywords: &[&str]) -> bool {
    keywords.iter().any(|kw| {
        text.match_indices(&format!("{kw} {name}")).any(|(i, m)| {
            let before = text[..i].chars().next_back();
            let after = text[i + m.len()..].chars().next();
            !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)
        })
    })
}

/// The files of `module` (its last segment): `<m>.rs` and everything under a folder `<m>/`.
fn in_module(path: &str, module: &str) -> bool {
    let m = module.rsplit("::").next().unwrap_or(module);
    let p = Path::new(path);
    p.file_stem().is_some_and(|s| s == m)
        || p.parent()
            .is_some_and(|d| d.ancestors().any(|a| a.file_name().is_some_and(|f| f == m)))
}

fn owns_type(text: &str, owner: &str) -> bool {
    declares_as(text, owner, &["struct", "enum", "trait", "type"])
}

/// Where the retired `name` is back in `corpus`; an error when it can match nothing.
fn still_there(name: &Retired, corpus: &Corpus) -> Result<Vec<String>, String> {
    let mut hits = Vec::new();
    match name {
        Retired::Path(path) => {
            let file = format!("src/{path}");
            for (p, text) in corpus.all() {
                if *p == file || p.starts_with(&format!("{file}/")) {
                    hits.push(p.clone());
                }
                let lower = text.to_lowercase();
                let named = lower.match_indices(&path.to_lowercase()).any(|(i, m)| {
                    let before = lower[..i].chars().next_back();
                    let after = lower[i + m.len()..].chars().next();
                    !before.is_some_and(|c| is_ident_char(c) || c == '.')
                        && !after.is_some_and(is_ident_char)
                });
                if named {
                    hits.push(format!("{p} (`{path}`)"));
                }
            }
        }
        Retired::Item { module, item } => {
            let mut module_seen = false;
            let written = format!("{module}::{item}");
            for (p, text) in &corpus.code {
                if in_module(p, module) {
                    module_seen = true;
                    if declares(text, item) {
                        hits.push(p.clone());
                    }
                }
            }
            if !module_seen {
                return Err(format!(
                    "`{written}` can match nothing: src/ has no module `{module}`"
                ));
            }
            let sub = format!("src/{}/{item}", module.replace("::", "/"));
            for (p, text) in corpus.all() {
                if *p == format!("{sub}.rs") || p.starts_with(&format!("{sub}/")) {
                    hits.push(p.clone());
                }
                if has_word(text, &written) {
                    hits.push(format!("{p} (`{written}`)"));
                }
            }
        }
        Retired::Member { owner, name: item } => {
            let written = format!("{owner}::{item}");
            if !corpus.code.iter().any(|(_, text)| owns_type(text, owner)) {
                return Err(format!(
                    "`{written}` can match nothing: src/ declares no type `{owner}` (retire \
                     the type itself, `module::{owner}`)"
                ));
            }
            for (p, text) in corpus.all() {
                if has_word(text, &written) {
                    hits.push(format!("{p} (`{written}`)"));
                }
            }
            for (p, text) in &corpus.code {
                let owns = owns_type(text, owner)
                    || has_word(text, &format!("impl {owner}"))
                    || text.contains(&format!("impl {owner}<"));
                let field = format!("{item}:");
                let is_field = text.lines().any(|l| {
                    let l = l.trim_start();
                    let l = l
                        .strip_prefix("pub(crate) ")
                        .or(l.strip_prefix("pub(super) "))
                        .or(l.strip_prefix("pub "))
                        .unwrap_or(l);
                    l.starts_with(&field)
                });
                if owns && (declares(text, item) || is_field) {
                    hits.push(p.clone());
                }
            }
        }
        Retired::Word(word) => {
            for (p, text) in corpus.all() {
                if has_spelling(text, word) {
                    hits.push(p.clone());
                }
            }
        }
        Retired::Phrase(words) => {
            for (p, text) in corpus.all() {
                if has_phrase(text, words) {
                    hits.push(p.clone());
                }
            }
        }
    }
    hits.dedup();
    Ok(hits)
}

#[test]
fn no_retired_name_is_back() {
    let arch = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("ARCHITECTURE");
    let names = match retired_names(&arch) {
        Ok(names) => names,
        Err(problems) => panic!(
            "the glossary has rows this test cannot read:\n{}",
            problems.join("\n")
        ),
    };
    assert!(
        names.len() >= 10,
        "the glossary's Retired column lost its names: {names:?}"
    );
    let corpus = Corpus::read();
    let mut problems = Vec::new();
    let mut known_used = Vec::new();
    for (row, name) in &names {
        let hits = parse_name(name).and_then(|n| still_there(&n, &corpus));
        match hits {
            Err(e) => problems.push(format!("{row}: {e}")),
            Ok(hits) => {
                let hits: Vec<String> = hits
                    .into_iter()
                    .filter(|h| {
                        let file = h.split(' ').next().unwrap_or(h);
                        let known = KNOWN.contains(&(name.as_str(), file));
                        if known {
                            known_used.push((name.as_str(), file.to_string()));
                        }
                        !known
                    })
                    .collect();
                if !hits.is_empty() {
                    problems.push(format!(
                        "{row}: retired `{name}` is back: {}",
                        hits.join(", ")
                    ));
                }
            }
        }
    }
    for (name, file) in KNOWN {
        if !known_used.iter().any(|(n, f)| n == name && f == file) {
            problems.push(format!(
                "KNOWN lists `{name}` in {file}, which no longer has it: drop the line"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn corpus(code: &[(&str, &str)], docs: &[(&str, &str)]) -> Corpus {
    let own = |files: &[(&str, &str)]| {
        files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    };
    Corpus {
        code: own(code),
        docs: own(docs),
    }
}

/// The lookup finds each form when the name is there, in any case, and in docs too.
#[test]
fn the_retired_name_lookup_finds_each_form() {
    let files = corpus(
        &[
            (
                "src/proxy/relay/core.rs",
                "pub(crate) struct Core {\n    pub(super) draining: bool,\n}\nimpl Core {\n    fn tick(&self) {}\n}",
            ),
            (
                "src/proxy/relay/ping.rs",
                "pub(crate) struct KeepAlive;\nimpl KeepAlive { pub(crate) fn tick(&self) {} }",
            ),
            ("src/status.rs", "pub(crate) fn cut_text() {}"),
            ("src/tap/mod.rs", "pub(crate) fn cut() {}"),
            (
                "src/x.rs",
                "pub enum Verdict { Refuse }\nlet e = upstream_error;\n\
                 tracing::info!(\"Upstream\n    connection closed\");",
            ),
        ],
        &[("a page of docs/", "`Core::goaway_due` was **renamed**; see `FAIL_FAST`.")],
    );
    let found = |n: &str| {
        still_there(&parse_name(n).expect("a name"), &files)
            .expect("checkable")
            .len()
    };
    assert_eq!(found("Core::tick"), 1, "a method of the type");
    assert_eq!(found("Core::draining"), 1, "a field of the type");
    assert_eq!(found("Core::goaway_due"), 1, "written in a doc");
    assert_eq!(found("Core::check_held"), 0);
    assert_eq!(found("KeepAlive::beat"), 0);
    assert_eq!(found("status::cut_text"), 1, "an item of the module");
    assert_eq!(found("tap::cut_text"), 0, "another module");
    assert_eq!(found("Verdict::Reject"), 0);
    assert_eq!(found("UpstreamError"), 1, "a word, in another spelling");
    assert_eq!(found("UpstreamErrors"), 0, "whole words only");
    assert_eq!(found("FailFast"), 1, "in a doc, in another spelling");
    assert_eq!(found("proxy/relay/core.rs"), 1, "a file");
    assert_eq!(
        found("\"upstream connection\""),
        1,
        "a phrase across lines, any case"
    );
    assert_eq!(found("\"connection upstream\""), 0);
    let vague = |n: &str| parse_name(n).is_err();
    assert!(
        vague("tick") && vague("Upstream"),
        "a single word is too vague"
    );
    assert!(vague("Check::Waiting(String)"), "not a path of identifiers");
    assert!(vague("\"upstream\""), "a phrase is two words or more");
    let nothing = |n: &str| still_there(&parse_name(n).expect("a name"), &files).is_err();
    assert!(nothing("Windows::changed"), "a type src/ no longer has");
    assert!(nothing("timeline::cut"), "a module src/ no longer has");
    assert!(!nothing("Verdict::Reject"));
}

/// Every row is read, and a cell with anything but backticked names and notes fails.
#[test]
fn the_glossary_reader_reads_every_row_or_says_which() {
    let table = "## Glossary\n\n| Name | Means | Retired |\n|---|---|---|\n\
                 | **a** | x `not this` | `Old`, `m::old` (once `m::older`, now new); `Last` |\n\
                 | **b** | y | — |\n## Next\n| **c** | z | `Later` |\n";
    assert_eq!(
        retired_names(table).expect("readable"),
        [("**a**", "Old"), ("**a**", "m::old"), ("**a**", "Last")]
            .map(|(r, n)| (r.to_string(), n.to_string()))
            .to_vec()
    );
    for cell in [
        "a bare u32 stream id; `MAX_STREAM_ID`",
        "`Old` told apart by its text",
        "`Old` (unclosed",
        "",
    ] {
        let table = format!(
            "## Glossary\n| Name | Means | Retired |\n|---|---|---|\n| **a** | x | {cell} |\n"
        );
        assert!(retired_names(&table).is_err(), "{cell:?} read as names");
    }
    let split =
        "## Glossary\n| Name | Means | Retired |\n|---|---|---|\n| **a** | x | y | `Old` |\n";
    assert!(retired_names(split).is_err(), "a row with a cell too many");
    assert!(retired_names("## Glossary\nno table\n").is_err());
}
