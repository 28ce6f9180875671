//! The README is the front door: short enough to read, and every page it and docs/ link to
//! exists (a moved or renamed page fails here, not in a newcomer's browser). Every document and
//! section the code cites — `DESIGN.md §3.4`, `KUBELET-CRI §1.3`, `docs/CALLS.md`, `STYLE rule 4`
//! — is in the repository, under a heading with that number; and the CRI revision named in
//! proto/README.md is the one Cargo.lock pins.

use std::path::{Path, PathBuf};

const README_MAX_BYTES: u64 = 12 * 1024;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Relative link targets of a Markdown file: `](target)` and `](target#anchor)`.
fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target.to_string());
        }
        rest = &rest[end..];
    }
    out
}

fn markdown_pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let p = entry.expect("docs/ entry").path();
        if p.extension().is_some_and(|e| e == "md") {
            pages.push(p);
        }
    }
    pages
}

#[test]
fn readme_is_a_front_door_not_a_manual() {
    let size = std::fs::metadata(root().join("README.md"))
        .expect("README.md")
        .len();
    assert!(size <= README_MAX_BYTES, "README.md is {size} bytes; keep it under {README_MAX_BYTES} and move reference text into docs/");
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for page in markdown_pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        let dir = page.parent().unwrap_or(Path::new("."));
        for target in relative_links(&text) {
            if !dir.join(&target).exists() {
                broken.push(format!(
                    "{}: {target}",
                    page.strip_prefix(root()).unwrap_or(&page).display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_docs_page_is_reachable_from_the_readme() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let linked = relative_links(&readme);
    let orphans: Vec<String> = markdown_pages()
        .into_iter()
        .skip(1)
        .filter_map(|p| {
            p.file_name()
                .map(|n| format!("docs/{}", n.to_string_lossy()))
        })
        .filter(|p| !linked.contains(p))
        .collect();
    assert!(
        orphans.is_empty(),
        "docs pages no README link reaches: {orphans:?}"
    );
}

#[test]
fn link_scanner_finds_relative_links_only() {
    let md = "see [a](docs/A.md#x), [b](https://example.org/b) and [c](../C.md)";
    assert_eq!(
        relative_links(md),
        vec!["docs/A.md".to_string(), "../C.md".to_string()]
    );
}

// ---------------------------------------------------------------------------------------------
// Citations of documents and sections

/// Where code cites documents: every source file under these (`target/` skipped).
const CODE_DIRS: [&str; 10] = [
    "src",
    "tests",
    "e2e",
    "benches",
    "fuzz",
    "hack",
    "proto",
    "deploy",
    "systemd",
    "packaging",
];
const CODE_EXTENSIONS: [&str; 11] = [
    "rs", "sh", "py", "go", "proto", "toml", "yaml", "json", "service", "socket", "conf",
];
/// This file: its scanner tests hold citations that are meant not to resolve.
const SELF: &str = "tests/it/docs.rs";
/// Documents that may be cited as `NAME §N` without `.md`.
const SECTIONED: [&str; 3] = ["DESIGN", "KUBELET-CRI", "PRIOR-ART"];

/// One thing a line names: a document, a section of the document named last, or an RFC (whose
/// sections are not ours to check).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cite {
    /// A Markdown document, as written (`DESIGN.md`, `docs/CALLS.md`, `../SECURITY.md`).
    Doc(String),
    /// `STYLE rule N`: a rule of a style guide.
    StyleRule(String),
    Rfc,
    /// `§N.M` (a range `§3.4–3.5` gives both ends).
    Section(String),
    /// `§` followed by something that is not a section number.
    BadSection(String),
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '-' | '_' | '$')
}

/// A section number at the start of `s`: `3`, `6a`, `1.1a`, `3.4`; a trailing `.` is not part
/// of it. Returns the number and its length in bytes.
fn section_number(s: &str) -> Option<(String, usize)> {
    let b = s.as_bytes();
    let mut i = 0;
    loop {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            // Only a `.` followed by a digit continues a number.
            return None;
        }
        if i < b.len()
            && b[i].is_ascii_lowercase()
            && !(i + 1 < b.len() && b[i + 1].is_ascii_alphabetic())
        {
            i += 1;
        }
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            continue;
        }
        return Some((s[..i].to_string(), i));
    }
}

/// What one line cites, in order.
fn citations(line: &str) -> Vec<Cite> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < line.len() {
        let rest = &line[i..];
        let c = rest.chars().next().unwrap_or(' ');
        if let Some(after) = rest.strip_prefix('§') {
            let after_space = after.strip_prefix(' ').unwrap_or(after);
            let skipped = rest.len() - after_space.len();
            match section_number(after_space) {
                Some((n, len)) => {
                    out.push(Cite::Section(n));
                    i += skipped + len;
                    // `§3.4–3.5`, `§3.1-3.2`: the other end of a range.
                    let tail = &line[i..];
                    let dash = tail.strip_prefix('–').or_else(|| tail.strip_prefix('-'));
                    if let Some((n2, len2)) = dash.and_then(section_number) {
                        out.push(Cite::Section(n2));
                        i += tail.len() - dash.map_or(0, str::len) + len2;
                    }
                }
                None => {
                    let word: String = after_space
                        .chars()
                        .take_while(|c| !c.is_whitespace() && !matches!(c, ')' | ',' | ';' | '`'))
                        .collect();
                    out.push(Cite::BadSection(word));
                    i += skipped;
                }
            }
            continue;
        }
        let at_word_start = line[..i]
            .chars()
            .next_back()
            .is_none_or(|p| !is_path_char(p));
        if !at_word_start || !is_path_char(c) {
            i += c.len_utf8();
            continue;
        }
        let token: String = rest.chars().take_while(|&c| is_path_char(c)).collect();
        i += token.len();
        let word = token.trim_end_matches('.');
        let after = &line[i - (token.len() - word.len())..];
        let next_is_section = after.trim_start().starts_with('§');
        if word.ends_with(".md") && word.len() > 3 {
            out.push(Cite::Doc(word.to_string()));
        } else if SECTIONED.contains(&word) && next_is_section {
            out.push(Cite::Doc(format!("{word}.md")));
        } else if word == "STYLE" {
            if let Some(n) = after
                .strip_prefix(" rule ")
                .map(|r| {
                    r.chars()
                        .take_while(char::is_ascii_digit)
                        .collect::<String>()
                })
                .filter(|n| !n.is_empty())
            {
                out.push(Cite::StyleRule(n));
            }
        } else if word == "RFC"
            && after
                .strip_prefix(' ')
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        {
            out.push(Cite::Rfc);
        }
    }
    out
}

/// The numbers of a Markdown document's headings: `## 3. Start order` → `3`, `#### 1.1a Image` →
/// `1.1a`.
fn heading_numbers(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let h = l.trim_start_matches('#');
            if h.len() == l.len() || !h.starts_with(' ') {
                return None;
            }
            let h = h.trim_start().trim_start_matches('§');
            section_number(h).map(|(n, _)| n)
        })
        .collect()
}

/// Where a document named in `file` is: `None` when it is not in the repository. Absolute
/// paths under /usr and /etc are install destinations, and `$…` paths shell variables, not
/// citations (`Some` of nothing to check).
fn find_doc(file: &Path, name: &str) -> Option<Option<PathBuf>> {
    if name.starts_with('$') || name.starts_with("/usr/") || name.starts_with("/etc/") {
        return Some(None);
    }
    if name.starts_with('/') {
        return None;
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    let candidates = if name.contains('/') {
        vec![root().join(name), dir.join(name)]
    } else {
        vec![
            root().join(name),
            root().join("docs").join(name),
            root().join("proto").join(name),
            dir.join(name),
        ]
    };
    candidates.into_iter().find(|p| p.is_file()).map(Some)
}

/// Every citation in `file` that does not resolve, as `file:line: what — why`. In Markdown a
/// bare `§N` is a section of the page itself; in code, of a document the same file names.
fn unresolved_in(
    file: &Path,
    headings: &mut std::collections::HashMap<PathBuf, Vec<String>>,
) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    let rel = file
        .strip_prefix(root())
        .unwrap_or(file)
        .display()
        .to_string();
    let markdown = file.extension().is_some_and(|e| e == "md");
    let mut numbers = |p: &Path| -> Vec<String> {
        headings
            .entry(p.to_path_buf())
            .or_insert_with(|| heading_numbers(&std::fs::read_to_string(p).unwrap_or_default()))
            .clone()
    };
    let mut bad = Vec::new();
    // Bare sections: (line, number); checked once the whole file's documents are known.
    let mut bare = Vec::new();
    let mut file_docs: Vec<PathBuf> = if markdown {
        vec![file.to_path_buf()]
    } else {
        Vec::new()
    };
    let mut cites_rfc = false;
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        // The document later sections belong to: resolved (`Some(Some)`), not to check
        // (`Some(None)`: an RFC, an install path, a missing document already reported).
        let mut current: Option<Option<(String, PathBuf)>> = None;
        for cite in citations(line) {
            match cite {
                Cite::Doc(name) => match find_doc(file, &name) {
                    Some(Some(path)) => {
                        file_docs.push(path.clone());
                        current = Some(Some((name, path)));
                    }
                    Some(None) => current = Some(None),
                    None => {
                        bad.push(format!("{rel}:{n}: {name} — not in the repository"));
                        current = Some(None);
                    }
                },
                Cite::StyleRule(rule) => {
                    match find_doc(file, "STYLE.md") {
                        Some(Some(path)) if numbers(&path).contains(&rule) => {}
                        Some(Some(path)) => bad.push(format!(
                            "{rel}:{n}: STYLE rule {rule} — {} has no heading numbered {rule}",
                            path.strip_prefix(root()).unwrap_or(&path).display()
                        )),
                        _ => bad.push(format!(
                            "{rel}:{n}: STYLE rule {rule} — no STYLE.md in the repository"
                        )),
                    }
                    current = Some(None);
                }
                Cite::Rfc => {
                    cites_rfc = true;
                    current = Some(None);
                }
                Cite::Section(s) => match &current {
                    Some(Some((name, path))) if !numbers(path).contains(&s) => bad.push(format!(
                        "{rel}:{n}: {name} §{s} — {} has no heading numbered {s}",
                        path.strip_prefix(root()).unwrap_or(path).display()
                    )),
                    Some(_) => {}
                    None => bare.push((n, s)),
                },
                Cite::BadSection(w) => bad.push(format!("{rel}:{n}: §{w} — not a section number")),
            }
        }
    }
    file_docs.sort();
    file_docs.dedup();
    for (n, s) in bare {
        if file_docs.iter().any(|d| numbers(d).contains(&s)) {
            continue;
        }
        if file_docs.is_empty() && !cites_rfc {
            bad.push(format!("{rel}:{n}: §{s} — no document named in the file (write `DESIGN.md §{s}` or `KUBELET-CRI §{s}`)"));
        } else if !cites_rfc {
            let names: Vec<String> = file_docs
                .iter()
                .map(|d| d.strip_prefix(root()).unwrap_or(d).display().to_string())
                .collect();
            bad.push(format!(
                "{rel}:{n}: §{s} — no heading numbered {s} in the documents the file cites ({})",
                names.join(", ")
            ));
        }
    }
    bad
}

fn files_under(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let p = entry.path();
        let name = entry.file_name();
        if p.is_dir() {
            if name != "target" && !name.to_string_lossy().starts_with('.') {
                files_under(&p, keep, out);
            }
        } else if keep(&p) {
            out.push(p);
        }
    }
}

fn code_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("build.rs")];
    let is_code = |p: &Path| {
        p.extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| CODE_EXTENSIONS.contains(&e))
    };
    for d in CODE_DIRS {
        files_under(&root().join(d), &is_code, &mut files);
    }
    files.retain(|p| !p.ends_with(SELF));
    // kubernetes/cri-api's api.proto, kept byte for byte as pinned (proto/README.md): its
    // citations are upstream's, not crisp's.
    files.retain(|p| !p.starts_with(root().join("proto/k8s")));
    files.sort();
    files
}

fn doc_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let is_md = |p: &Path| p.extension().is_some_and(|e| e == "md");
    for d in [root(), root().join("docs"), root().join("proto")] {
        if let Ok(entries) = std::fs::read_dir(&d) {
            files.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_file() && is_md(p)),
            );
        }
    }
    files.sort();
    files
}

fn unresolved(files: &[PathBuf]) -> Vec<String> {
    let mut headings = std::collections::HashMap::new();
    files
        .iter()
        .flat_map(|f| unresolved_in(f, &mut headings))
        .collect()
}

#[test]
fn every_document_and_section_the_code_cites_is_in_the_repo() {
    let files = code_files();
    assert!(
        files.len() > 100,
        "found only {} source files to scan",
        files.len()
    );
    let bad = unresolved(&files);
    assert!(bad.is_empty(), "{} citations in the code do not resolve to a document in the repository and a heading with that number:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn every_section_the_docs_cite_is_in_the_repo() {
    let bad = unresolved(&doc_files());
    assert!(
        bad.is_empty(),
        "{} citations in the docs do not resolve:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn citation_scanner_reads_every_form() {
    use Cite::*;
    let sec = |s: &str| Section(s.to_string());
    let doc = |s: &str| Doc(s.to_string());
    assert_eq!(
        citations("the rules of DESIGN.md §3–§4 (KUBELET-CRI §1.1a, §1.3)."),
        vec![
            doc("DESIGN.md"),
            sec("3"),
            sec("4"),
            doc("KUBELET-CRI.md"),
            sec("1.1a"),
            sec("1.3")
        ]
    );
    assert_eq!(
        citations("(§3.4–3.5) and §3.1-3.2, KUBELET-CRI §4.3. Then §1.1 a–f"),
        vec![
            sec("3.4"),
            sec("3.5"),
            sec("3.1"),
            sec("3.2"),
            doc("KUBELET-CRI.md"),
            sec("4.3"),
            sec("1.1")
        ]
    );
    assert_eq!(
        citations("DESIGN §6a, PRIOR-ART.md §5 \"secrets\", STYLE rule 6"),
        vec![
            doc("DESIGN.md"),
            sec("6a"),
            doc("PRIOR-ART.md"),
            sec("5"),
            StyleRule("6".into())
        ]
    );
    assert_eq!(
        citations("RFC 9113 §6.1/§6.2; see docs/CALLS.md and ../SECURITY.md."),
        vec![
            Rfc,
            sec("6.1"),
            sec("6.2"),
            doc("docs/CALLS.md"),
            doc("../SECURITY.md")
        ]
    );
    assert_eq!(
        citations("cite it as `KUBELET-CRI §x`; the DESIGN doc"),
        vec![doc("KUBELET-CRI.md"), BadSection("x".into())]
    );
    assert_eq!(
        heading_numbers(
            "# T\n## 3. Start order\n### 3.4 Timeout\n#### 1.1a Image\n## 6a. Tenant\n## Notes\n"
        ),
        vec!["3", "3.4", "1.1a", "6a"]
    );
}

#[test]
fn a_citation_without_its_document_or_heading_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("x.rs");
    std::fs::write(
        &file,
        "// DESIGN.md §3.4 and §99, KUBELET-CRI §1.1a, NOPE.md, STYLE rule 2\n",
    )
    .expect("write");
    let bad = unresolved(&[file]);
    assert!(bad.iter().any(|b| b.contains("§99")), "{bad:?}");
    assert!(bad.iter().any(|b| b.contains("NOPE.md")), "{bad:?}");
    assert!(bad.iter().any(|b| b.contains("STYLE rule 2")), "{bad:?}");
    assert!(
        !bad.iter()
            .any(|b| b.contains("§3.4") || b.contains("§1.1a")),
        "{bad:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The CRI revision

/// proto/README.md names the k8s-cri version and checksum that Cargo.lock pins: a bump of the
/// crate has to come with the page that says which api.proto it carries.
#[test]
fn the_cri_revision_proto_readme_names_is_the_one_cargo_lock_pins() {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).expect("Cargo.lock");
    let entry = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"k8s-cri\"\n"))
        .expect("k8s-cri in Cargo.lock");
    let field = |key: &str| {
        entry
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().trim_matches('"').to_string())
            .unwrap_or_default()
    };
    let (version, checksum) = (field("version = "), field("checksum = "));
    let readme = std::fs::read_to_string(root().join("proto/README.md")).expect("proto/README.md");
    assert!(
        readme.contains(&format!("**{version}**")),
        "Cargo.lock pins k8s-cri {version}; proto/README.md does not name it"
    );
    assert!(
        readme.contains(&checksum),
        "Cargo.lock's k8s-cri checksum {checksum} is not the one proto/README.md names"
    );
}

// ---------------------------------------------------------------------------------------------
// Citations of test files

/// The paths of crisp's own tests a line names (`tests/it/forwarding.rs`, `e2e/tests/it/`,
/// `tests/it/node_*.rs`), up to the first character that cannot be in one (`::`, a space).
fn cited_test_paths(line: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut from = 0;
    while let Some(i) = line[from..].find("tests/") {
        let at = from + i;
        from = at + "tests/".len();
        let start = if line[..at].ends_with("e2e/") {
            at - "e2e/".len()
        } else {
            at
        };
        // Part of a longer path (another project's `src/tests/...`, `benches/tests/`) or word.
        if line[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        {
            continue;
        }
        let len = line[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_./*".contains(c)))
            .unwrap_or(line.len() - start);
        paths.push(
            line[start..start + len]
                .trim_end_matches(['.', '/'])
                .to_string(),
        );
    }
    paths
}

/// `path` exists; with a `*`, some entry of its directory starts with what comes before it.
fn cited_path_exists(path: &str) -> bool {
    let Some((before, _)) = path.split_once('*') else {
        return root().join(path).exists();
    };
    let (dir, prefix) = before.rsplit_once('/').unwrap_or(("", before));
    std::fs::read_dir(root().join(dir)).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
    })
}

#[test]
fn every_test_file_the_repo_cites_exists() {
    let mut bad = Vec::new();
    for f in doc_files().into_iter().chain(code_files()) {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let rel = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
        for (n, line) in text.lines().enumerate() {
            for p in cited_test_paths(line) {
                if !cited_path_exists(&p) {
                    bad.push(format!("{rel}:{}: {p}", n + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} cited test files are not in the repository (moved? tests/it/, e2e/tests/it/):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn test_path_scanner_reads_paths_not_words() {
    assert_eq!(
        cited_test_paths("see `tests/it/forwarding.rs::big` and e2e/tests/it/observe.rs."),
        ["tests/it/forwarding.rs", "e2e/tests/it/observe.rs"]
    );
    assert_eq!(
        cited_test_paths("(tests/it/support/), tests/"),
        ["tests/it/support", "tests"]
    );
    assert_eq!(
        cited_test_paths("tests/it/node_*.rs boot"),
        ["tests/it/node_*.rs"]
    );
    assert!(cited_test_paths("app/integration/src/tests/shutdown.rs, h2-tests/").is_empty());
}
