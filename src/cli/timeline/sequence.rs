//! The sequence view of a pod's calls (issue #46): kubelet, crisp and the runtime as three
//! lanes, each call as arrows between them, in the order things happened. A held call is the
//! gap between kubelet's arrow to crisp and crisp's forward to the runtime, drawn as a bar on
//! crisp's lane, with the hold's events — what it waited on, each probe round the tap reported,
//! how it ended — as notes beside it. A call crisp refused is answered from crisp's lane and
//! never reaches the runtime. Two renderings of the same steps: a self-contained SVG (no
//! scripts, fonts or links; every string XML-escaped) and Mermaid text for issues and docs
//! (every string reduced to characters Mermaid reads as text).
//!
//! Rows are in event order, not to scale: the waterfall (`svg`, `text`) is the view with a time
//! axis; here each row carries its time since the pod's first call.

use std::fmt::Write as _;

use super::svg::xml_escape;
use super::{colour, dur, fit, header, Call, Hold, Pod};

/// Most calls one sequence draws; a longer recording says how many it left out (a recording
/// is tenant-shaped: its size must not size the picture).
pub const MAX_SEQUENCE_CALLS: usize = 400;
/// Probe rounds ("update" events) drawn per hold: the first and last halves of this many; the
/// rest are counted in one note.
const MAX_ROUNDS_PER_HOLD: usize = 6;
/// Longest label on an arrow or a note, in characters.
const MAX_LABEL: usize = 72;

/// The three lanes, left to right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Kubelet,
    Crisp,
    Runtime,
}

/// What one row of the sequence shows.
#[derive(Debug, Clone, PartialEq)]
enum Step<'a> {
    /// kubelet sends the call; `through`: crisp forwarded it at once, so the arrow goes on to
    /// the runtime.
    Request { call: &'a Call, through: bool },
    /// A hold event of the call, on crisp's lane.
    Note { call: &'a Call, text: String },
    /// crisp forwards a call it held.
    Forward { call: &'a Call },
    /// The answer kubelet got, from the runtime or (refused, timed out) from crisp; `None`
    /// when kubelet gave up first.
    Answer { call: &'a Call, from: Lane },
}

/// How a held call ended, from its hold events; `None` when the recording has none for it.
fn hold_outcome<'a>(holds: &[&'a Hold]) -> Option<&'a str> {
    holds
        .iter()
        .rev()
        .find(|h| h.phase == "end" || h.phase == "refused")
        .map(|h| {
            if h.phase == "refused" && h.outcome.is_empty() {
                "refused"
            } else {
                h.outcome.as_str()
            }
        })
}

/// Whether crisp forwarded the call to the runtime: from the hold's recorded outcome when
/// there is one, else from the call itself (a call held for all of its duration that failed
/// was answered by crisp).
fn forwarded(call: &Call, holds: &[&Hold]) -> bool {
    match hold_outcome(holds) {
        Some(outcome) => matches!(outcome, "forwarded" | "timed out (proceed)"),
        None => call.held_us == 0 || call.held_us < call.duration_us || call.ok(),
    }
}

/// The note one hold event makes on crisp's lane.
fn note_text(h: &Hold) -> String {
    let wait = if h.waiting_on.is_empty() {
        String::new()
    } else {
        format!("waiting for {}", h.waiting_on)
    };
    let why = [wait.as_str(), h.reason.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    match h.phase.as_str() {
        "start" => format!("hold: {why}"),
        "update" if !h.probe_result.is_empty() => format!("probe: {}", h.probe_result),
        "update" => format!("still {why}"),
        "end" => format!("hold ended: {}", h.outcome),
        _ => format!("refused: {why}"),
    }
}

/// The rows of `pod`'s sequence, in time order (at equal times: a call's request, its notes,
/// its forward, its answer), and how many calls were left out past [`MAX_SEQUENCE_CALLS`].
fn steps(pod: &Pod) -> (Vec<(i64, Step<'_>)>, usize) {
    let mut rows: Vec<(i64, u8, usize, Step<'_>)> = Vec::new();
    let drawn = &pod.calls[..pod.calls.len().min(MAX_SEQUENCE_CALLS)];
    for (i, call) in drawn.iter().enumerate() {
        let holds: Vec<&Hold> = if call.call_id == 0 {
            Vec::new()
        } else {
            pod.holds
                .iter()
                .filter(|h| h.call_id == call.call_id)
                .collect()
        };
        let forwarded = forwarded(call, &holds);
        let held = call.held_us > 0 || !holds.is_empty();
        rows.push((
            call.start_us,
            0,
            i,
            Step::Request {
                call,
                through: forwarded && !held,
            },
        ));
        let rounds: Vec<&&Hold> = holds.iter().filter(|h| h.phase == "update").collect();
        let half = MAX_ROUNDS_PER_HOLD / 2;
        for (k, h) in holds.iter().enumerate() {
            let text = if h.phase != "update" {
                note_text(h)
            } else {
                let round = rounds.iter().position(|r| std::ptr::eq(**r, *h));
                match round {
                    Some(r) if rounds.len() > MAX_ROUNDS_PER_HOLD && r == half => {
                        format!("… {} more probe rounds", rounds.len() - 2 * half)
                    }
                    Some(r)
                        if rounds.len() > MAX_ROUNDS_PER_HOLD
                            && r > half
                            && r < rounds.len() - half =>
                    {
                        continue
                    }
                    _ => note_text(h),
                }
            };
            // A note never sorts before its request (clocks of one recording, but be sure).
            rows.push((
                h.time_us.max(call.start_us),
                1,
                i * 64 + k,
                Step::Note { call, text },
            ));
        }
        let end = call.start_us + call.duration_us;
        if forwarded && held {
            rows.push((
                (call.start_us + call.held_us).min(end),
                2,
                i,
                Step::Forward { call },
            ));
        }
        let from = if forwarded {
            Lane::Runtime
        } else {
            Lane::Crisp
        };
        rows.push((end, 3, i, Step::Answer { call, from }));
    }
    rows.sort_by_key(|(t, rank, i, _)| (*t, *rank, *i));
    let left_out = pod.calls.len() - drawn.len();
    (
        rows.into_iter().map(|(t, _, _, s)| (t, s)).collect(),
        left_out,
    )
}

/// The label of a call's request arrow: method and what it acts on.
fn request_label(c: &Call) -> String {
    let target = c.target();
    if target.is_empty() {
        c.method.clone()
    } else {
        format!("{} {}", c.method, target)
    }
}

/// The label of a call's answer: what it acted on, its status (and message), how long it took,
/// and how long of that crisp held it.
fn answer_label(c: &Call) -> String {
    let mut s = c.target();
    if !s.is_empty() {
        s.push_str(": ");
    }
    if c.code_name.is_empty() {
        s.push_str("no answer (kubelet gave up)");
    } else {
        s.push_str(&c.code_name);
    }
    if !c.ok() && !c.message.is_empty() {
        let _ = write!(s, ": {}", c.message);
    }
    let _ = write!(s, " {}", dur(c.duration_us));
    if c.held_us > 0 {
        let _ = write!(s, " (held {})", dur(c.held_us));
    }
    s
}

/// Text Mermaid reads as text: letters, digits and a few punctuation marks kept, everything
/// else (`;` ends a statement, `#` starts an entity, `%%` a comment, `<` markup) replaced.
fn mermaid_text(s: &str) -> String {
    fit(s, MAX_LABEL)
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || "' ._-/:()=,+@[]*!?…→·—".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The pod's sequence as Mermaid text (`sequenceDiagram`), for an issue or a doc.
pub fn mermaid(pod: &Pod) -> String {
    let (t0, _) = pod.span();
    let (rows, left_out) = steps(pod);
    let mut s = String::from(
        "sequenceDiagram\n    participant K as kubelet\n    participant C as crisp\n    \
         participant R as runtime\n",
    );
    let _ = writeln!(s, "    Note over K,R: {}", mermaid_text(&header(pod)));
    for (at, step) in &rows {
        let when = format!("+{}", dur(at - t0));
        let line = match step {
            Step::Request { call, through } => format!(
                "{}: {} {}",
                if *through { "K->>R" } else { "K->>C" },
                mermaid_text(&request_label(call)),
                when
            ),
            Step::Note { text, .. } => {
                format!("Note right of C: {} {}", mermaid_text(text), when)
            }
            Step::Forward { call } => format!(
                "C->>R: {} after {} {}",
                mermaid_text(&request_label(call)),
                dur(call.held_us),
                when
            ),
            Step::Answer { call, from } => format!(
                "{}: {} {}",
                if *from == Lane::Runtime {
                    "R-->>K"
                } else {
                    "C-->>K"
                },
                mermaid_text(&answer_label(call)),
                when
            ),
        };
        let _ = writeln!(s, "    {line}");
    }
    if left_out > 0 {
        let _ = writeln!(s, "    Note over K,R: {left_out} more calls not drawn");
    }
    s
}

const WIDTH: f64 = 1100.0;
const TIME_X: f64 = 10.0;
const KUBELET_X: f64 = 190.0;
const CRISP_X: f64 = 520.0;
const RUNTIME_X: f64 = 850.0;
const ROW_H: f64 = 26.0;
const TOP: f64 = 96.0;

fn lane_x(lane: Lane) -> f64 {
    match lane {
        Lane::Kubelet => KUBELET_X,
        Lane::Crisp => CRISP_X,
        Lane::Runtime => RUNTIME_X,
    }
}

/// One arrow with its label above it, and the row's details on hover.
fn arrow(s: &mut String, y: f64, (from, to): (Lane, Lane), label: &str, style: (&str, bool)) {
    let (x1, x2) = (lane_x(from), lane_x(to));
    let (colour, dashed) = style;
    let dash = if dashed {
        r#" stroke-dasharray="6 4""#
    } else {
        ""
    };
    let marker = if colour == colour::FAILED {
        "head-failed"
    } else {
        "head"
    };
    let _ = writeln!(
        s,
        r#"<g><title>{title}</title><line x1="{x1}" y1="{y}" x2="{x2}" y2="{y}" stroke="{colour}" stroke-width="1.6"{dash} marker-end="url(#{marker})"/><text x="{tx}" y="{ty}" text-anchor="middle" fill="{colour}">{text}</text></g>"#,
        title = xml_escape(label),
        // Between the leftmost lane the arrow touches and the next one.
        tx = x1.min(x2) + (CRISP_X - KUBELET_X) / 2.0,
        ty = y - 5.0,
        text = xml_escape(&fit(label, 48)),
    );
}

/// The pod's sequence as a self-contained SVG: three lanes with their lifelines, one row per
/// step, each held call's hold as a bar on crisp's lane from kubelet's request to the forward
/// (or crisp's answer).
pub fn sequence_svg(pod: &Pod) -> String {
    let (t0, _) = pod.span();
    let (rows, left_out) = steps(pod);
    let bottom = TOP + (rows.len() as f64 + 0.5) * ROW_H;
    let height = bottom + 40.0 + if left_out > 0 { 20.0 } else { 0.0 };
    let mut s = String::with_capacity(4096 + rows.len() * 400);
    let _ = write!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="12">
<title>crisp sequence: {title}</title>
<defs><marker id="head" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#333333"/></marker><marker id="head-failed" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="{failed}"/></marker></defs>
<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>
<text x="{TIME_X}" y="22" font-size="15" font-weight="bold">{head}</text>
<rect x="{TIME_X}" y="32" width="14" height="10" fill="{held}"/><text x="30" y="41">held by crisp (the gap before its forward)</text>
<line x1="400" y1="37" x2="440" y2="37" stroke="{failed}" stroke-width="1.6"/><text x="446" y="41">failed or refused</text>
<text x="{TIME_X}" y="{lane_y}" fill="#555555">since first call</text>
"##,
        title = xml_escape(&pod.id()),
        head = xml_escape(&header(pod)),
        held = colour::HELD,
        failed = colour::FAILED,
        lane_y = TOP - 24.0,
    );
    for (lane, name) in [
        (Lane::Kubelet, "kubelet"),
        (Lane::Crisp, "crisp"),
        (Lane::Runtime, "runtime"),
    ] {
        let x = lane_x(lane);
        let _ = writeln!(
            s,
            r##"<rect x="{rx}" y="{ry}" width="110" height="24" rx="4" fill="#eef2f7" stroke="#555555"/><text x="{x}" y="{ty}" text-anchor="middle" font-weight="bold">{name}</text><line x1="{x}" y1="{ly}" x2="{x}" y2="{bottom}" stroke="#aaaaaa" stroke-dasharray="3 3"/>"##,
            rx = x - 55.0,
            ry = TOP - 42.0,
            ty = TOP - 25.0,
            ly = TOP - 18.0,
        );
    }
    // Each held call's bar, from its request's row to its forward's (or answer's) row.
    let row_y = |i: usize| TOP + (i as f64 + 0.5) * ROW_H;
    for (i, (_, step)) in rows.iter().enumerate() {
        let Step::Request {
            call,
            through: false,
        } = step
        else {
            continue;
        };
        let end = rows.iter().enumerate().skip(i + 1).find(|(_, (_, st))| {
            matches!(st, Step::Forward { call: c } | Step::Answer { call: c, .. }
                if std::ptr::eq(*c, *call))
        });
        let Some((j, _)) = end else {
            continue;
        };
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{y}" width="12" height="{h}" fill="{held}"><title>{title}</title></rect>"#,
            x = CRISP_X - 6.0,
            y = row_y(i),
            h = row_y(j) - row_y(i),
            held = colour::HELD,
            title = xml_escape(&format!(
                "{} held {}",
                request_label(call),
                dur(call.held_us)
            )),
        );
    }
    for (i, (at, step)) in rows.iter().enumerate() {
        let y = row_y(i);
        let _ = writeln!(
            s,
            r##"<text x="{TIME_X}" y="{ty}" fill="#555555">+{when}</text>"##,
            ty = y + 4.0,
            when = dur(at - t0),
        );
        match step {
            Step::Request { call, through } => {
                let to = if *through { Lane::Runtime } else { Lane::Crisp };
                arrow(
                    &mut s,
                    y,
                    (Lane::Kubelet, to),
                    &request_label(call),
                    ("#333333", false),
                );
            }
            Step::Note { call, text } => {
                let _ = writeln!(
                    s,
                    r##"<g><title>{title}</title><circle cx="{CRISP_X}" cy="{y}" r="3" fill="{held}"/><text x="{tx}" y="{ty}" fill="#8a5a00" font-size="11">{text}</text></g>"##,
                    title = xml_escape(&format!("{}: {text}", request_label(call))),
                    held = colour::HELD,
                    tx = CRISP_X + 12.0,
                    ty = y + 4.0,
                    text = xml_escape(&fit(text, MAX_LABEL)),
                );
            }
            Step::Forward { call } => {
                let label = format!("{} after {}", request_label(call), dur(call.held_us));
                arrow(
                    &mut s,
                    y,
                    (Lane::Crisp, Lane::Runtime),
                    &label,
                    ("#333333", false),
                );
            }
            Step::Answer { call, from } => {
                let colour = if call.ok() { "#333333" } else { colour::FAILED };
                arrow(
                    &mut s,
                    y,
                    (*from, Lane::Kubelet),
                    &answer_label(call),
                    (colour, true),
                );
            }
        }
    }
    if left_out > 0 {
        let _ = writeln!(
            s,
            r#"<text x="{TIME_X}" y="{}">{left_out} more calls not drawn (at most {MAX_SEQUENCE_CALLS})</text>"#,
            bottom + 30.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The waterfall tests' call, with the tap's call id its hold events name.
    fn call(id: u64, method: &str, container: &str, at_ms: i64, dur_ms: i64, held_ms: i64) -> Call {
        let c = super::super::tests::call(method, container, at_ms, dur_ms, held_ms, "OK");
        Call { call_id: id, ..c }
    }

    fn hold(id: u64, at_ms: i64, phase: &str, probe: &str, outcome: &str) -> Hold {
        Hold {
            call_id: id,
            time_us: T0_US + at_ms * 1000,
            phase: phase.into(),
            waiting_on: "proxy".into(),
            reason: "not ready".into(),
            probe_result: probe.into(),
            outcome: outcome.into(),
        }
    }

    /// The waterfall tests' calls start at this time (µs since the epoch) plus their offset.
    const T0_US: i64 = 1_700_000_000_000_000;

    /// Each row as `µs-since-the-first-call what`.
    fn kinds(pod: &Pod) -> Vec<String> {
        steps(pod)
            .0
            .iter()
            .map(|(t, s)| (t - T0_US, s))
            .map(|(t, s)| match s {
                Step::Request { call, through } => {
                    format!("{t} req {} {}", call.target(), through)
                }
                Step::Note { text, .. } => format!("{t} note {text}"),
                Step::Forward { call } => format!("{t} fwd {}", call.target()),
                Step::Answer { call, from } => format!("{t} ans {} {from:?}", call.target()),
            })
            .collect()
    }

    /// The demo's shape: the proxy started, the app's create held until the proxy's probe
    /// passed, then forwarded; the hold's rounds sit between request and forward.
    #[test]
    fn a_held_create_is_a_gap_between_request_and_forward_with_its_rounds_between() {
        let pod = Pod {
            namespace: "demo".into(),
            name: "web".into(),
            calls: vec![
                call(1, "StartContainer", "proxy", 0, 50, 0),
                call(2, "CreateContainer", "app", 100, 2600, 2500),
            ],
            holds: vec![
                hold(2, 100, "start", "", ""),
                hold(2, 1100, "update", "connect refused", ""),
                hold(2, 2600, "end", "", "forwarded"),
            ],
        };
        assert_eq!(
            kinds(&pod),
            [
                "0 req proxy true",
                "50000 ans proxy Runtime",
                "100000 req app false",
                "100000 note hold: waiting for proxy: not ready",
                "1100000 note probe: connect refused",
                "2600000 note hold ended: forwarded",
                "2600000 fwd app",
                "2700000 ans app Runtime",
            ]
        );
        let svg = sequence_svg(&pod);
        assert_eq!(svg.matches(colour::HELD).count(), 2 + 3, "{svg}");
        let m = mermaid(&pod);
        assert!(m.contains("K->>C: CreateContainer app +100ms"), "{m}");
        assert!(
            m.contains("C->>R: CreateContainer app after 2.50s +2.60s"),
            "{m}"
        );
        assert!(
            m.contains("R-->>K: app: OK 2.60s (held 2.50s) +2.70s"),
            "{m}"
        );
    }

    /// A refused call is answered by crisp and never reaches the runtime, with or without its
    /// hold events in the recording.
    #[test]
    fn a_refused_call_is_answered_from_crisp_and_never_forwarded() {
        let mut refused = call(3, "CreateContainer", "app", 0, 2, 2);
        refused.code_name = "FailedPrecondition".into();
        refused.message = "proxy not created".into();
        let mut pod = Pod {
            calls: vec![refused],
            holds: vec![hold(3, 1, "refused", "", "refused")],
            ..Default::default()
        };
        let want = [
            "0 req app false",
            "1000 note refused: waiting for proxy: not ready",
        ];
        assert_eq!(kinds(&pod)[..2], want);
        assert_eq!(kinds(&pod)[2], "2000 ans app Crisp");
        pod.holds.clear();
        assert_eq!(kinds(&pod), ["0 req app false", "2000 ans app Crisp"]);
        assert!(mermaid(&pod).contains("C-->>K: app: FailedPrecondition: proxy not created"));
    }

    /// A hold with many probe rounds shows the first and last few and counts the rest, and a
    /// recording longer than the cap draws the cap and says how many it left out.
    #[test]
    fn rounds_and_calls_are_bounded() {
        let mut holds = vec![hold(1, 0, "start", "", "")];
        holds.extend((1..=50).map(|i| hold(1, i * 10, "update", &format!("round {i}"), "")));
        let pod = Pod {
            calls: vec![call(1, "CreateContainer", "app", 0, 600, 590)],
            holds,
            ..Default::default()
        };
        let notes: Vec<String> = kinds(&pod)
            .into_iter()
            .filter(|k| k.contains(" note "))
            .collect();
        assert_eq!(notes.len(), 1 + MAX_ROUNDS_PER_HOLD + 1, "{notes:?}");
        assert!(notes.iter().any(|n| n.ends_with("… 44 more probe rounds")));
        assert!(notes.last().unwrap().ends_with("round 50"));

        let many = Pod {
            calls: (0..MAX_SEQUENCE_CALLS as i64 + 5)
                .map(|i| call(0, "StartContainer", "c", i, 1, 0))
                .collect(),
            ..Default::default()
        };
        let (rows, left_out) = steps(&many);
        assert_eq!((rows.len(), left_out), (2 * MAX_SEQUENCE_CALLS, 5));
        assert!(sequence_svg(&many).contains("5 more calls not drawn"));
    }

    /// Tenant text becomes neither markup nor Mermaid syntax: one line per step, and no label
    /// holds a character Mermaid gives a meaning to.
    #[test]
    fn hostile_names_stay_text() {
        let name = "a;b#35;%%<script>x</script>\nK->>R: forged";
        let mut c = call(1, "CreateContainer", name, 0, 1, 0);
        c.code_name = "Unknown".into();
        c.message = "--> end;\n%%".into();
        let pod = Pod {
            namespace: "n;s".into(),
            name: "<p>".into(),
            calls: vec![c],
            ..Default::default()
        };
        let m = mermaid(&pod);
        // Three participants, the header note, the request and its answer.
        assert_eq!(m.lines().count(), 1 + 3 + 1 + 2, "{m}");
        for line in m.lines().skip(4) {
            let (_, label) = line.split_once(": ").expect(line);
            assert!(
                !label.contains([';', '#', '%', '<', '>', '{', '}']),
                "{line}"
            );
        }
        let svg = sequence_svg(&pod);
        assert!(!svg.contains("<script") && !svg.contains("<p>"), "{svg}");
    }
}
