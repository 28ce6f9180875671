//! The SVG view of a pod's calls: the same rows as the text, each call's details on hover;
//! every string escaped, so no recorded text ever becomes markup.

use std::fmt::Write as _;

use super::{dur, fit, header, note, Call, Pod, MAX_LISTED_FAILURES};

/// Text for XML: `&<>"'` escaped; characters XML 1.0 cannot carry at all replaced.
pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(' '),
            c if c.is_control() || matches!(c, '\u{FFFE}' | '\u{FFFF}') => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// Colours of the SVG (tests look for them in the rendered picture).
pub mod colour {
    /// The forwarded part of a call that succeeded.
    #[cfg_attr(feature = "test-util", visibility::make(pub))]
    pub(crate) const FORWARDED: &str = "#3b78c4";
    /// The part of a call crisp held.
    #[cfg_attr(feature = "test-util", visibility::make(pub))]
    pub(crate) const HELD: &str = "#f0a030";
    /// The forwarded part of a call that failed or that crisp refused.
    #[cfg_attr(feature = "test-util", visibility::make(pub))]
    pub(crate) const FAILED: &str = "#d0342c";
}

const SVG_WIDTH: f64 = 1100.0;
const LABEL_X: f64 = 10.0;
const BAR_X: f64 = 330.0;
const BAR_W: f64 = 600.0;
const ROW_H: f64 = 20.0;
const TOP: f64 = 78.0;

/// A round tick step (1, 2 or 5 × 10^k µs) giving at most 8 ticks over `span` µs.
pub(super) fn tick_step(span: i64) -> i64 {
    let mut step = 1i64;
    loop {
        for m in [1, 2, 5] {
            if span / (step * m) <= 8 {
                return step * m;
            }
        }
        step *= 10;
    }
}

/// The SVG view: self-contained (no scripts, no external fonts, styles or images); every
/// call's details in its `<title>` (shown on hover by browsers); failed calls' messages listed
/// under the chart.
pub fn svg(pod: &Pod) -> String {
    let (t0, t1) = pod.span();
    let span = (t1 - t0) as f64;
    let x = |t: i64| BAR_X + (t - t0) as f64 / span * BAR_W;
    let failures: Vec<&Call> = pod
        .calls
        .iter()
        .filter(|c| !c.ok())
        .take(MAX_LISTED_FAILURES)
        .collect();
    let chart_bottom = TOP + pod.calls.len() as f64 * ROW_H;
    let height = chart_bottom
        + 30.0
        + if failures.is_empty() {
            0.0
        } else {
            24.0 + failures.len() as f64 * 16.0
        };
    let mut s = String::with_capacity(4096 + pod.calls.len() * 600);
    let _ = write!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{height}" viewBox="0 0 {SVG_WIDTH} {height}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="12">
<title>crisp timeline: {title}</title>
<rect x="0" y="0" width="{SVG_WIDTH}" height="{height}" fill="#ffffff"/>
<text x="{LABEL_X}" y="22" font-size="15" font-weight="bold">{head}</text>
<rect x="{LABEL_X}" y="34" width="14" height="10" fill="{fwd}"/><text x="30" y="43">forwarded to the runtime</text>
<rect x="230" y="34" width="14" height="10" fill="{held}"/><text x="250" y="43">held by crisp</text>
<rect x="380" y="34" width="14" height="10" fill="{failed}"/><text x="400" y="43">failed or refused</text>
"##,
        title = xml_escape(&pod.id()),
        head = xml_escape(&header(pod)),
        fwd = colour::FORWARDED,
        held = colour::HELD,
        failed = colour::FAILED,
    );
    let step = tick_step(t1 - t0);
    let mut t = 0i64;
    while t <= t1 - t0 {
        let tx = x(t0 + t);
        let _ = writeln!(
            s,
            r##"<line x1="{tx:.1}" y1="{y1}" x2="{tx:.1}" y2="{chart_bottom}" stroke="#d8d8d8"/><text x="{tx:.1}" y="{ty}" text-anchor="middle" fill="#555555">{label}</text>"##,
            y1 = TOP - 6.0,
            ty = TOP - 10.0,
            label = if t == 0 { "0".to_string() } else { dur(t) },
        );
        t += step;
    }
    for (i, c) in pod.calls.iter().enumerate() {
        let y = TOP + i as f64 * ROW_H;
        let (xs, xh, xe) = (x(c.start_us), x(c.start_us + c.held_us), x(c.end_us()));
        let fill = if c.ok() {
            colour::FORWARDED
        } else {
            colour::FAILED
        };
        let mut details = format!(
            "{} {} at +{}: {}",
            c.method,
            c.target(),
            dur(c.start_us - t0),
            dur(c.duration_us)
        );
        if c.held_us > 0 {
            let _ = write!(details, ", held {}", dur(c.held_us));
        }
        let _ = write!(details, ", {}", c.code_name);
        if !c.message.is_empty() {
            let _ = write!(details, ": {}", c.message);
        }
        let _ = writeln!(s, "<g><title>{}</title>", xml_escape(&details));
        if i % 2 == 1 {
            let _ = writeln!(
                s,
                r##"<rect x="0" y="{y}" width="{SVG_WIDTH}" height="{ROW_H}" fill="#000000" fill-opacity="0.04"/>"##
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{LABEL_X}" y="{ty}">{method}</text><text x="150" y="{ty}" fill="#333333">{target}</text>"##,
            ty = y + 14.0,
            method = xml_escape(&fit(&c.method, 18)),
            target = xml_escape(&fit(&c.target(), 24)),
        );
        // At least 2 px, so that a sub-millisecond call in a minute-long timeline still shows.
        let (bar_y, bar_h) = (y + 4.0, ROW_H - 8.0);
        if xh > xs {
            let _ = writeln!(
                s,
                r#"<rect x="{xs:.2}" y="{bar_y}" width="{:.2}" height="{bar_h}" fill="{}"/>"#,
                xh - xs,
                colour::HELD
            );
        }
        // The forwarded part (or a failure) is always at least 2 px wide.
        let w = (xe - xh).max(2.0);
        let _ = writeln!(
            s,
            r#"<rect x="{xh:.2}" y="{bar_y}" width="{w:.2}" height="{bar_h}" fill="{fill}"/>"#
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{}" fill="#333333">{}</text></g>"##,
            (xe.max(xs + 2.0) + 6.0).min(BAR_X + BAR_W + 6.0),
            y + 14.0,
            xml_escape(&note(c))
        );
    }
    if !failures.is_empty() {
        let y = chart_bottom + 30.0;
        let _ = writeln!(
            s,
            r#"<text x="{LABEL_X}" y="{y}" font-weight="bold">Failed or refused calls</text>"#
        );
        for (i, c) in failures.iter().enumerate() {
            let line = format!(
                "+{} {} {}: {} {}",
                dur(c.start_us - t0),
                c.method,
                c.target(),
                c.code_name,
                c.message
            );
            let _ = writeln!(
                s,
                r#"<text x="{LABEL_X}" y="{}" fill="{}">{}</text>"#,
                y + 16.0 * (i + 1) as f64,
                colour::FAILED,
                xml_escape(&fit(&line, 150))
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
