//! The terminal view of a pod's calls: text bars, never wider than the terminal.

use std::fmt::Write as _;

use super::{dur, fit, header, note, Pod};

/// The terminal view: a header, a time axis, one row per call; never wider than `width`
/// characters (at least 80).
pub fn text(pod: &Pod, width: usize) -> String {
    const METHOD: usize = 17;
    const TARGET: usize = 12;
    const NOTE: usize = 28;
    let width = width.max(80);
    // method, target, "|" bar "|", note.
    let bar = width - METHOD - TARGET - 2 - 3 - NOTE;
    let (t0, t1) = pod.span();
    let span = (t1 - t0) as f64;
    let cell = |t: i64| (t - t0) as f64 / span * bar as f64;
    let mut out = String::new();
    let _ = writeln!(out, "{}", fit(&header(pod), width));
    let _ = writeln!(
        out,
        "{}",
        fit("█ forwarded   ░ held by crisp   × failed or refused", width)
    );
    let axis_pad = " ".repeat(METHOD + TARGET + 2);
    let end_label = dur(t1 - t0);
    let _ = writeln!(
        out,
        "{axis_pad}0{}{end_label}",
        " ".repeat((bar + 2).saturating_sub(1 + end_label.chars().count()))
    );
    for c in &pod.calls {
        let first = (cell(c.start_us).floor() as usize).min(bar - 1);
        let last = (cell(c.end_us()).ceil() as usize).clamp(first + 1, bar);
        // The held share of the call's cells, rounded: a short hold in a long call may not show.
        let mut held_cells = if c.duration_us > 0 {
            ((last - first) as f64 * c.held_us as f64 / c.duration_us as f64).round() as usize
        } else {
            0
        };
        if !c.ok() {
            // A failure always shows: its last cell is ×, however much of the call was held.
            held_cells = held_cells.min(last - first - 1);
        }
        let cells: String = (0..bar)
            .map(|i| {
                if i < first || i >= last {
                    ' '
                } else if i < first + held_cells {
                    '░'
                } else if c.ok() {
                    '█'
                } else {
                    '×'
                }
            })
            .collect();
        let row = format!(
            "{:<METHOD$} {:<TARGET$} |{cells}| {}",
            fit(&c.method, METHOD),
            fit(&c.target(), TARGET),
            note(c)
        );
        let _ = writeln!(out, "{}", fit(&row, width));
    }
    out
}
