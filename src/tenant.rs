//! The one rule for text a pod author wrote (DESIGN.md §6a): annotation values of any origin,
//! labels, and the names they carry. Such text is
//! - **bounded where it enters**: a value longer than [`MAX_VALUE`] bytes is refused before
//!   anything parses it, and a list of names is at most [`MAX_NAMES`] distinct DNS-1123 labels
//!   ([`names`]), checked in one pass;
//! - **cut and escaped wherever it is printed**: [`text`] shows at most a given number of bytes,
//!   cut on a character boundary with the number of bytes left out, control characters, escape
//!   sequences and other non-printable characters escaped (`\u{1b}`, `\n`), so a log line, a
//!   refusal message or a view stays one line of known size whatever the pod says.
//!
//! A value that breaks a bound makes its annotation count as absent: the caller reports it as
//! the pod's one warning (`ordering::annotations::Warnings`) and counts it.

use std::collections::HashSet;
use std::fmt;

/// Most names one list may hold (`crisp.dev/sidecars`, `crisp.dev/init-containers`, a known
/// injector's status lists): more is a typo or an attack, not a pod.
pub(crate) const MAX_NAMES: usize = 64;
/// Longest container name: a DNS-1123 label, which Kubernetes requires of container names.
pub(crate) const MAX_NAME: usize = 63;
/// Longest annotation value crisp parses, in bytes; a longer one is refused unread. The largest
/// legitimate ones are a known injector's status (Istio's is about 300 bytes) and a list of 64
/// names of 63 bytes (about 4 KiB).
pub const MAX_VALUE: usize = 16 << 10;
/// Longest message crisp writes carrying tenant text (a refusal's gRPC message, which kubelet
/// copies into the pod's status and an Event), in bytes.
pub const MAX_MESSAGE: usize = 1024;
/// Longest log line crisp writes about one pod's annotations, in bytes.
pub const MAX_LOG_LINE: usize = 4 << 10;
/// Longest single tenant field (a name, a key, a value) inside a message, line or view, in bytes.
pub(crate) const MAX_FIELD: usize = 256;
/// Most names [`name_list`] shows before it says how many more there are.
const MAX_LISTED: usize = 8;
/// Smallest cap [`text`] honours: room for the cut marker.
const MIN_CAP: usize = 32;

/// `s` for printing: at most `max` bytes (at least 32), escaped. See [`Text`].
pub(crate) fn text(s: &str, max: usize) -> Text<'_> {
    Text {
        s,
        max: max.max(MIN_CAP),
    }
}

/// [`text`] as a `String`.
pub(crate) fn cut(s: &str, max: usize) -> String {
    text(s, max).to_string()
}

/// Tenant text as it may be printed: every character that is not printable — control
/// characters (ESC, so no terminal escape sequence; newlines, so one line), bidirectional
/// overrides, zero-width and other format characters — written as `char::escape_debug` writes
/// it; quotes and backslashes as they are (so text that is escaped already is shown unchanged).
/// When the escaped text is longer than the cap, it is cut on a character boundary and ends
/// with `…(+N bytes)`, N the bytes of `s` not shown; the whole is at most the cap. The work is
/// bounded by the cap, not by `s`.
#[derive(Clone, Copy)]
pub(crate) struct Text<'a> {
    s: &'a str,
    max: usize,
}

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if fits(self.s, self.max) {
            return self.s.chars().try_for_each(|c| write_char(f, c));
        }
        let room = self.max.saturating_sub(marker_len(self.s.len()));
        let (mut used, mut shown) = (0, 0);
        for c in self.s.chars() {
            let n = escaped_len(c);
            if used + n > room {
                break;
            }
            write_char(f, c)?;
            used += n;
            shown += c.len_utf8();
        }
        write!(f, "…(+{} bytes)", self.s.len() - shown)
    }
}

impl fmt::Debug for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// The escaped form of `s` is at most `max` bytes (reads at most `max + 1` characters).
fn fits(s: &str, max: usize) -> bool {
    let mut used = 0;
    for c in s.chars() {
        used += escaped_len(c);
        if used > max {
            return false;
        }
    }
    true
}

/// Whether `c` is never shown raw, in any view: the one escape of every line view ([`text`])
/// and every JSON output ([`json`], [`json_pretty`]). These are the C0 controls, DEL and the C1
/// controls (U+009B is CSI: an escape sequence without ESC), the line and paragraph separators
/// U+2028/U+2029, the bidirectional controls (U+061C, U+200E/F, U+202A–U+202E, U+2066–U+2069),
/// and every other character `char::escape_debug` escapes (zero-width and other format
/// characters, unassigned code points, combining marks). Printable ASCII is never escaped here
/// (quotes and backslashes are JSON's to escape, and shown as they are in line views).
pub(crate) fn escaped(c: char) -> bool {
    match c {
        ' '..='~' => false,
        '\0'..='\x1f' | '\x7f'..='\u{9f}' => true,
        '\u{2028}' | '\u{2029}' => true,
        '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
            true
        }
        c => c.escape_debug().len() > 1,
    }
}

fn escaped_len(c: char) -> usize {
    if escaped(c) {
        c.escape_debug().len()
    } else {
        c.len_utf8()
    }
}

fn write_char(f: &mut fmt::Formatter<'_>, c: char) -> fmt::Result {
    if escaped(c) {
        write!(f, "{}", c.escape_debug())
    } else {
        fmt::Write::write_char(f, c)
    }
}

/// `v` as one line of JSON in which every character [`escaped`] says is never shown raw is a
/// `\uXXXX` escape (serde_json escapes only U+0000–U+001F, `"` and `\`): the `--json` views and
/// `--output` files. The same value parses back.
pub fn json(v: &serde_json::Value) -> String {
    json_escape(v.to_string())
}

/// [`json`], pretty-printed (`crisp tap --full`'s readable view).
pub(crate) fn json_pretty(v: &serde_json::Value) -> String {
    json_escape(serde_json::to_string_pretty(v).unwrap_or_default())
}

/// Rewrites serialized JSON: outside strings, serialized JSON is ASCII, and inside them serde
/// has escaped the C0 controls already, so every other character [`escaped`] says is never shown
/// raw can only be string content, and is written as `\uXXXX` (a UTF-16 pair past U+FFFF).
/// Text without a byte of 0x7F or above (most lines) is returned as it is, after two fast scans.
fn json_escape(s: String) -> String {
    use fmt::Write as _;
    if s.is_ascii() && !s.contains('\x7f') {
        return s;
    }
    let bytes = s.as_bytes();
    let (mut at, mut copied) = (0, 0);
    let mut out: Option<String> = None;
    // Only bytes of 0x7F and above can begin such a character: ASCII runs are skipped.
    while let Some(off) = bytes[at..].iter().position(|&b| b >= 0x7f) {
        let start = at + off;
        let Some(c) = s[start..].chars().next() else {
            break;
        };
        at = start + c.len_utf8();
        if escaped(c) {
            let o = out.get_or_insert_with(|| String::with_capacity(s.len() + 16));
            o.push_str(&s[copied..start]);
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(o, "\\u{unit:04x}");
            }
            copied = at;
        }
    }
    match out {
        None => s,
        Some(mut o) => {
            o.push_str(&s[copied..]);
            o
        }
    }
}

/// Bytes of `…(+N bytes)` for the largest N a string of `len` bytes can leave out.
fn marker_len(len: usize) -> usize {
    "…(+ bytes)".len() + len.checked_ilog10().unwrap_or(0) as usize + 1
}

/// Why a tenant value or list was refused. The offending name is kept cut and escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("{len} bytes, more than the {max} crisp reads")]
    TooLong { len: usize, max: usize },
    #[error("more than {MAX_NAMES} names")]
    TooMany,
    #[error("\"{0}\" is not a valid container name (a DNS-1123 label)")]
    NotAName(String),
    #[error("\"{0}\" is listed twice")]
    Twice(String),
    #[error("no container names")]
    Empty,
}

/// `v` if it is at most [`MAX_VALUE`] bytes: checked before any parse looks at it.
pub(crate) fn value(v: &str) -> Result<&str, Refused> {
    if v.len() > MAX_VALUE {
        return Err(Refused::TooLong {
            len: v.len(),
            max: MAX_VALUE,
        });
    }
    Ok(v)
}

/// Container names for a message or a log line (`app, web and 298 more`): the first
/// [`MAX_LISTED`], each through [`text`] at most one byte longer than a valid name, then how many
/// were left out. At most about 550 bytes however many containers a pod has; the names past the
/// first few are counted, not read.
pub(crate) fn name_list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    use fmt::Write as _;
    let mut out = String::new();
    let mut more = 0usize;
    for (i, name) in names.into_iter().enumerate() {
        if i >= MAX_LISTED {
            more += 1;
            continue;
        }
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}", text(name, MAX_NAME + 1));
    }
    if more > 0 {
        let _ = write!(out, " and {more} more");
    }
    out
}

/// A DNS-1123 label: 1–63 lowercase letters, digits and `-`, not starting or ending with `-`.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A list of container names as crisp accepts it from a pod: at most [`MAX_NAMES`], each a
/// DNS-1123 label, no name twice; in the order given. One pass, and it stops at the first name
/// past the cap: the work is bounded by [`MAX_NAMES`] whatever the list's length.
pub(crate) fn names<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Vec<String>, Refused> {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut out = Vec::new();
    for name in items {
        if out.len() == MAX_NAMES {
            return Err(Refused::TooMany);
        }
        if !is_dns1123_label(name) {
            return Err(Refused::NotAName(cut(name, MAX_NAME + 1)));
        }
        if !seen.insert(name) {
            return Err(Refused::Twice(name.to_string()));
        }
        out.push(name.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_list_shows_the_first_names_and_counts_the_rest() {
        assert_eq!(name_list([]), "");
        assert_eq!(name_list(["app"]), "app");
        assert_eq!(name_list(["app", "web"]), "app, web");
        let many: Vec<String> = (0..300)
            .map(|i| format!("{}-{i:03}", "a".repeat(59)))
            .collect();
        let list = name_list(many.iter().map(String::as_str));
        assert!(list.starts_with(&many[0]), "{list}");
        assert!(list.contains(&many[7]), "{list}");
        assert!(!list.contains(&many[8]), "{list}");
        assert!(list.ends_with(" and 292 more"), "{list}");
        assert!(list.len() <= 600, "{} bytes", list.len());
        // Not names Kubernetes would accept: still one line, cut and escaped.
        let odd = ["x".repeat(10_000), "a\nb\u{1b}[2J".to_string()];
        let list = name_list(odd.iter().map(String::as_str));
        assert!(list.len() <= 2 * 64 + 2, "{} bytes: {list}", list.len());
        assert!(!list.contains('\n') && !list.contains('\u{1b}'), "{list}");
    }

    #[test]
    fn short_printable_text_is_unchanged() {
        for s in [
            "",
            "istio-proxy",
            "default/web",
            "é ü 中文 🙂",
            r#"quotes " ' and \ stay"#,
        ] {
            assert_eq!(text(s, 256).to_string(), s);
        }
    }

    #[test]
    fn control_and_format_characters_are_escaped() {
        let hostile =
            "a\u{1b}[31mred\u{1b}[0m\nnext\r\t\u{0}\u{7f}\u{9b}31m\u{202e}evil\u{200b}\u{2028}";
        let shown = text(hostile, 1024).to_string();
        assert_eq!(
            shown,
            r"a\u{1b}[31mred\u{1b}[0m\nnext\r\t\0\u{7f}\u{9b}31m\u{202e}evil\u{200b}\u{2028}"
        );
        assert!(
            shown.chars().all(|c| !c.is_control() && c.is_ascii()),
            "{shown}"
        );
    }

    #[test]
    fn escaping_twice_changes_nothing() {
        let once = cut("x\u{1b}y\n\"z\"\\", 256);
        assert_eq!(cut(&once, 256), once);
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary_within_the_cap() {
        for max in [32, 33, 100, 255, 256, 1024] {
            for s in [
                "x".repeat(100_000),
                "é".repeat(50_000),
                "\u{1b}".repeat(40_000),
                "🙂a".repeat(9_000),
            ] {
                let shown = text(&s, max).to_string();
                assert!(shown.len() <= max, "{max}: {} bytes: {shown}", shown.len());
                let (kept, marker) = shown.rsplit_once('…').expect("a cut is marked");
                let left: usize = marker
                    .trim_start_matches("(+")
                    .trim_end_matches(" bytes)")
                    .parse()
                    .unwrap();
                // What is shown, unescaped, plus what is left out is the whole.
                let unescaped = kept.replace(r"\u{1b}", "\u{1b}");
                assert_eq!(unescaped.len() + left, s.len(), "{max}: {shown}");
                assert!(s.starts_with(&unescaped));
            }
        }
        assert_eq!(
            text(&"a".repeat(40), 32).to_string(),
            format!("{}…(+22 bytes)", "a".repeat(18))
        );
        // Exactly at the cap: not cut.
        assert_eq!(text(&"a".repeat(32), 32).to_string(), "a".repeat(32));
        // A cap below the marker's room is raised to it.
        assert!(text(&"a".repeat(100), 0).to_string().len() <= MIN_CAP);
    }

    #[test]
    fn values_longer_than_the_cap_are_refused_unread() {
        assert_eq!(value("x"), Ok("x"));
        assert_eq!(value(&"x".repeat(MAX_VALUE)).map(str::len), Ok(MAX_VALUE));
        assert_eq!(
            value(&"x".repeat(MAX_VALUE + 1)),
            Err(Refused::TooLong {
                len: MAX_VALUE + 1,
                max: MAX_VALUE
            })
        );
    }

    #[test]
    fn names_follow_the_sidecars_rule() {
        assert_eq!(
            names(["a", "b-1"]),
            Ok(vec!["a".to_string(), "b-1".to_string()])
        );
        assert_eq!(names([]), Ok(vec![]));
        assert_eq!(names(["a", "a"]), Err(Refused::Twice("a".into())));
        for bad in ["", "A", "a_b", "-a", "a-", &"a".repeat(64), "a\u{1b}[2J"] {
            assert!(matches!(names([bad]), Err(Refused::NotAName(_))), "{bad:?}");
        }
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| format!("n{i}")).collect();
        assert_eq!(
            names(many.iter().map(String::as_str).take(MAX_NAMES)).map(|v| v.len()),
            Ok(MAX_NAMES)
        );
        assert_eq!(
            names(many.iter().map(String::as_str)),
            Err(Refused::TooMany)
        );
    }

    #[test]
    fn a_refused_name_is_shown_cut_and_escaped() {
        let e = names(["ok", &format!("\u{1b}]0;owned\u{7}{}", "x".repeat(10_000))])
            .unwrap_err()
            .to_string();
        assert!(e.len() < 200, "{e}");
        assert!(
            e.starts_with(r#""\u{1b}]0;owned\u{7}xx"#) && e.contains("…(+"),
            "{e}"
        );
    }

    #[test]
    fn names_stop_at_the_cap_whatever_the_lists_length() {
        // A long list: refused after MAX_NAMES + 1 items are looked at.
        let list: Vec<String> = (0..10_000).map(|i| format!("n{i}")).collect();
        let mut looked = 0;
        assert_eq!(
            names(list.iter().map(String::as_str).inspect(|_| looked += 1)),
            Err(Refused::TooMany)
        );
        assert_eq!(looked, MAX_NAMES + 1);
    }

    /// Issue #33: one escape for every view. Each character a terminal obeys is escaped by the
    /// line views' `text` and, as `\uXXXX`, by `json`; both round-trip what they do not escape.
    #[test]
    fn line_views_and_json_escape_the_same_characters() {
        let obeyed = [
            '\0',
            '\u{1b}',
            '\n',
            '\u{7f}',
            '\u{80}',
            '\u{85}',
            '\u{9b}',
            '\u{9f}',
            '\u{2028}',
            '\u{2029}',
            '\u{61c}',
            '\u{200e}',
            '\u{200f}',
            '\u{202a}',
            '\u{202e}',
            '\u{2066}',
            '\u{2069}',
            '\u{200b}',
            '\u{feff}',
            '\u{e0001}',
        ];
        for c in obeyed {
            assert!(escaped(c), "{c:?}");
            let s = format!("a{c}b");
            let line = text(&s, 256).to_string();
            assert!(!line.contains(c) && line.is_ascii(), "{c:?}: {line}");
            let j = json(&serde_json::Value::String(s.clone()));
            assert!(!j.contains(c) && j.is_ascii(), "{c:?}: {j}");
            assert_eq!(serde_json::from_str::<String>(&j).unwrap(), s);
        }
        for c in ['a', ' ', '~', '"', '\\', '\'', 'é', '中', '🙂'] {
            assert!(!escaped(c), "{c:?}");
        }
        let plain = serde_json::json!({"k": "é 中 🙂 \" \\", "n": [1, 2]});
        assert_eq!(json(&plain), plain.to_string());
        let pretty = json_pretty(&serde_json::json!({"k": "\u{9b}", "l": [1]}));
        assert_eq!(
            pretty,
            "{\n  \"k\": \"\\u009b\",\n  \"l\": [\n    1\n  ]\n}"
        );
    }
}
