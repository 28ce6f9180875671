//! The README is the front door: short enough to read, and every page it and docs/ link to
//! exists (a moved or renamed page fails here, not in a newcomer's browser).

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
    let size = std::fs::metadata(root().join("README.md")).expect("README.md").len();
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
                broken.push(format!("{}: {target}", page.strip_prefix(root()).unwrap_or(&page).display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_docs_page_is_reachable_from_the_readme() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let linked = relative_links(&readme);
    let orphans: Vec<String> =
        markdown_pages().into_iter().skip(1).filter_map(|p| p.file_name().map(|n| format!("docs/{}", n.to_string_lossy()))).filter(|p| !linked.contains(p)).collect();
    assert!(orphans.is_empty(), "docs pages no README link reaches: {orphans:?}");
}

#[test]
fn link_scanner_finds_relative_links_only() {
    let md = "see [a](docs/A.md#x), [b](https://example.org/b) and [c](../C.md)";
    assert_eq!(relative_links(md), vec!["docs/A.md".to_string(), "../C.md".to_string()]);
}
