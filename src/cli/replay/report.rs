//! What a replay found: each call's recorded answer against its answer now, and where they
//! differ — status, message class (the same failure with another kind of message), duration
//! beyond a tolerance (a hold that is gone, or a call that is slow now), and order (a call
//! answered before another in the recording and after it now). Printed as text or JSON.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::prepare::{short_id, NotSent, Redacted};
use super::{Answer, Options, Pace, Plan, Step};
use crate::cli::timeline::dur;
use crate::metrics::code_name;
use crate::tenant;

/// Two answers this close are not said to have changed order.
const ORDER_SLACK: Duration = Duration::from_millis(20);
/// Longest message shown.
const MAX_MESSAGE: usize = 200;
/// Most order changes listed for one call.
const MAX_ORDER_PER_CALL: usize = 3;

/// What happened to one call.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Sent {
        now: Answer,
        /// When it was sent, since the replay started.
        sent_at: Duration,
        redacted: Vec<Redacted>,
        /// (recorded id, new id) put into its request.
        rewritten: Vec<(String, String)>,
        note: Option<String>,
        /// A streamed call: what was read of its stream.
        stream: Option<StreamRead>,
    },
    NotSent(NotSent),
}

/// What the replay read of a stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StreamRead {
    pub(crate) messages: u64,
    /// The replay cancelled it after this (it did not end by itself in the recording).
    pub(crate) cancelled_after: Option<Duration>,
}

/// A sandbox the replay made, and what cleanup did with it.
#[derive(Debug, Clone)]
pub(crate) struct Cleanup {
    pub(crate) sandbox: String,
    pub(crate) result: String,
}

/// How a call's answer now differs from the recorded one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Difference {
    Status {
        recorded: Option<i32>,
        now: Option<i32>,
    },
    /// The same failure code, with a message of another kind.
    Message {
        recorded: String,
        now: String,
    },
    Duration {
        recorded: Duration,
        held: Duration,
        now: Duration,
    },
    /// Answered before the call at this index in the recording, after it now.
    AnsweredAfter(usize),
    /// A stream's messages: as many as recorded, or not.
    Messages {
        recorded: u64,
        now: u64,
    },
    NotSent(String),
}

/// The report of one replay.
#[derive(Debug)]
pub struct Report {
    scope: String,
    pace: Pace,
    tolerance: Duration,
    steps: Vec<Step>,
    outcomes: Vec<Outcome>,
    differences: Vec<Vec<Difference>>,
    cleanup: Vec<Cleanup>,
    interrupted: bool,
    polling_left_out: usize,
}

impl Report {
    pub(crate) fn new(
        plan: &Plan,
        outcomes: Vec<Outcome>,
        cleanup: Vec<Cleanup>,
        interrupted: bool,
        opts: &Options,
    ) -> Report {
        let mut differences: Vec<Vec<Difference>> = plan
            .steps
            .iter()
            .zip(&outcomes)
            .map(|(s, o)| differences(s, o, opts.tolerance))
            .collect();
        for (first, then) in order_changes(&plan.steps, &outcomes) {
            let d = &mut differences[first];
            let n = d
                .iter()
                .filter(|x| matches!(x, Difference::AnsweredAfter(_)))
                .count();
            if n < MAX_ORDER_PER_CALL {
                d.push(Difference::AnsweredAfter(then));
            }
        }
        Report {
            scope: plan.scope.clone(),
            pace: opts.pace,
            tolerance: opts.tolerance,
            steps: plan.steps.clone(),
            outcomes,
            differences,
            cleanup,
            interrupted,
            polling_left_out: plan.polling_left_out,
        }
    }

    /// Whether any call differs (or was not sent).
    pub fn differs(&self) -> bool {
        self.differences.iter().any(|d| !d.is_empty())
    }

    /// Every (recorded, new) id pair the requests carried, in the order first used.
    fn ids(&self) -> Vec<(String, String)> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for o in &self.outcomes {
            if let Outcome::Sent { rewritten, .. } = o {
                for p in rewritten {
                    if seen.insert(p.clone()) {
                        out.push(p.clone());
                    }
                }
            }
        }
        out
    }

    fn counts(&self) -> (usize, usize, usize) {
        let sent = self
            .outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Sent { .. }))
            .count();
        let differ = self.differences.iter().filter(|d| !d.is_empty()).count();
        (sent, self.outcomes.len() - sent, differ)
    }

    /// The readable report, at most 100 columns but for messages.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let pace = match self.pace {
            Pace::Recorded(1.0) => "at recorded speed".to_string(),
            Pace::Recorded(s) => format!("at {s}x recorded speed"),
            Pace::AsFastAsPossible => "as fast as possible".to_string(),
        };
        let _ = writeln!(
            out,
            "replay of {}: {} calls, {pace}",
            self.scope,
            self.steps.len()
        );
        let _ = writeln!(out, "{:>3}  {:<26} {:<34} now", "#", "call", "recorded");
        for ((s, o), d) in self.steps.iter().zip(&self.outcomes).zip(&self.differences) {
            let call = format!("{} {}", s.method, s.target);
            let now = match o {
                Outcome::Sent { now, .. } => answer(now),
                Outcome::NotSent(_) => "not sent".to_string(),
            };
            let _ = writeln!(
                out,
                "{:>3}  {:<26} {:<34} {:<26} {}",
                s.index + 1,
                tenant::cut(&call, 26),
                answer(&s.recorded),
                now,
                if d.is_empty() { "same" } else { "DIFFERS" }
            );
        }
        let (sent, not_sent, differ) = self.counts();
        if differ > 0 {
            out.push_str("\ndifferences:\n");
        }
        for ((s, o), ds) in self.steps.iter().zip(&self.outcomes).zip(&self.differences) {
            for d in ds {
                let _ = writeln!(
                    out,
                    "  #{} {} {}: {}",
                    s.index + 1,
                    s.method,
                    tenant::cut(&s.target, 64),
                    self.describe(d, s, o)
                );
            }
        }
        let ids = self.ids();
        if !ids.is_empty() {
            out.push_str("\nids rewritten (recorded → replayed):\n");
            for (r, n) in &ids {
                let _ = writeln!(
                    out,
                    "  {} → {}",
                    tenant::cut(short_id(r), 80),
                    tenant::cut(short_id(n), 80)
                );
            }
        }
        let notes: Vec<String> = self
            .steps
            .iter()
            .zip(&self.outcomes)
            .flat_map(|(s, o)| {
                let name = format!(
                    "  #{} {} {}",
                    s.index + 1,
                    s.method,
                    tenant::cut(&s.target, 64)
                );
                let mut lines: Vec<String> = borrowed_note(s)
                    .into_iter()
                    .map(|n| format!("{name}: {n}"))
                    .collect();
                if let Outcome::Sent { note: Some(n), .. } = o {
                    lines.push(format!("{name}: {n}"));
                }
                if let Outcome::Sent {
                    stream: Some(r), ..
                } = o
                {
                    lines.push(format!("{name}: {}", stream_note(s, r)));
                }
                lines
            })
            .collect();
        if !notes.is_empty() {
            out.push_str("\nnotes:\n");
            out.push_str(&notes.join("\n"));
            out.push('\n');
        }
        let redacted: Vec<String> = self
            .steps
            .iter()
            .zip(&self.outcomes)
            .filter_map(|(s, o)| match o {
                Outcome::Sent { redacted, .. } if !redacted.is_empty() => Some(format!(
                    "  #{} {} {}: {}",
                    s.index + 1,
                    s.method,
                    tenant::cut(&s.target, 64),
                    redactions(redacted)
                )),
                _ => None,
            })
            .collect();
        if !redacted.is_empty() {
            out.push_str(
                "\nreplayed with redacted fields (the recording never held their values; answers \
                 that depend on them may differ for that reason alone):\n",
            );
            out.push_str(&redacted.join("\n"));
            out.push('\n');
        }
        if !self.cleanup.is_empty() {
            out.push_str("\ncleanup:\n");
            for c in &self.cleanup {
                let _ = writeln!(out, "  sandbox {}: {}", short_id(&c.sandbox), c.result);
            }
        }
        let _ = writeln!(
            out,
            "\n{} calls: {sent} replayed, {not_sent} not sent, {differ} differ{}{}",
            self.steps.len(),
            if self.polling_left_out > 0 {
                format!(
                    " ({} polling calls left out: --all replays them)",
                    self.polling_left_out
                )
            } else {
                String::new()
            },
            if self.interrupted {
                "; interrupted (Ctrl-C)"
            } else {
                ""
            }
        );
        out
    }

    fn describe(&self, d: &Difference, s: &Step, o: &Outcome) -> String {
        let now_message = match o {
            Outcome::Sent { now, .. } if !now.message.is_empty() => {
                format!(" ({})", tenant::cut(&now.message, MAX_MESSAGE))
            }
            _ => String::new(),
        };
        match d {
            Difference::Status { recorded, now } => {
                let was = if s.recorded.message.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", tenant::cut(&s.recorded.message, MAX_MESSAGE))
                };
                format!(
                    "status {}{was} → {}{now_message}",
                    code_name(*recorded),
                    code_name(*now)
                )
            }
            Difference::Message { recorded, now } => format!(
                "message {} → {}",
                tenant::cut(recorded, MAX_MESSAGE),
                tenant::cut(now, MAX_MESSAGE)
            ),
            Difference::Duration {
                recorded,
                held,
                now,
            } => {
                let held = if held.is_zero() {
                    String::new()
                } else {
                    format!(", held {} by crisp", dur(micros(*held)))
                };
                format!(
                    "duration {}{held} → {} (tolerance {})",
                    dur(micros(*recorded)),
                    dur(micros(*now)),
                    dur(micros(self.tolerance))
                )
            }
            Difference::AnsweredAfter(other) => {
                let o = &self.steps[*other];
                format!(
                    "answered before #{} {} {} in the recording, after it now",
                    other + 1,
                    o.method,
                    tenant::cut(&o.target, 64)
                )
            }
            Difference::NotSent(why) => format!("not sent: {why}"),
            Difference::Messages { recorded, now } => {
                format!("{recorded} messages streamed → {now}")
            }
        }
    }

    /// [`Report::json`] as one line, tenant text escaped as the tap's `--json` lines are.
    pub fn json_text(&self) -> String {
        tenant::json(&self.json())
    }

    /// The report as one JSON object: `scope`, `calls[]` {`index, call_id, method, target,
    /// recorded, now, not_sent, differences[], redacted[], ids_rewritten[]`}, `ids`, `cleanup`,
    /// `summary`.
    pub fn json(&self) -> Value {
        let answer_json = |a: &Answer| {
            json!({
                "code": a.code,
                "code_name": code_name(a.code),
                "message": a.message,
                "duration_ms": a.duration.as_secs_f64() * 1e3,
                "held_ms": a.held.as_secs_f64() * 1e3,
            })
        };
        let calls: Vec<Value> = self
            .steps
            .iter()
            .zip(&self.outcomes)
            .zip(&self.differences)
            .map(|((s, o), ds)| {
                let mut v = json!({
                    "index": s.index + 1,
                    "call_id": s.call_id,
                    "method": s.method,
                    "target": s.target,
                    "recorded": answer_json(&s.recorded),
                    "differences": ds.iter().map(|d| json!({
                        "kind": kind(d),
                        "detail": self.describe(d, s, o),
                    })).collect::<Vec<_>>(),
                });
                match o {
                    Outcome::Sent {
                        now,
                        sent_at,
                        redacted,
                        rewritten,
                        note,
                        stream,
                    } => {
                        if let Some(r) = stream {
                            v["messages"] = json!({
                                "recorded": s.recorded_messages(),
                                "now": r.messages,
                            });
                            v["cancelled_after_ms"] =
                                json!(r.cancelled_after.map(|d| d.as_secs_f64() * 1e3));
                            v["stream"] = json!(stream_note(s, r));
                        }
                        v["now"] = answer_json(now);
                        v["sent_at_ms"] = json!(sent_at.as_secs_f64() * 1e3);
                        v["redacted"] =
                            json!(redacted.iter().map(|r| r.to_string()).collect::<Vec<_>>());
                        v["ids_rewritten"] = json!(rewritten
                            .iter()
                            .map(|(r, n)| json!({"recorded": r, "now": n}))
                            .collect::<Vec<_>>());
                        let notes: Vec<String> =
                            borrowed_note(s).into_iter().chain(note.clone()).collect();
                        v["notes"] = json!(notes);
                    }
                    Outcome::NotSent(why) => v["not_sent"] = json!(why.to_string()),
                }
                v
            })
            .collect();
        let (sent, not_sent, differ) = self.counts();
        json!({
            "scope": self.scope,
            "calls": calls,
            "ids": self.ids().iter().map(|(r, n)| json!({"recorded": r, "now": n})).collect::<Vec<_>>(),
            "cleanup": self.cleanup.iter().map(|c| json!({"sandbox": c.sandbox, "result": c.result})).collect::<Vec<_>>(),
            "summary": {
                "calls": self.steps.len(),
                "replayed": sent,
                "not_sent": not_sent,
                "differ": differ,
                "polling_left_out": self.polling_left_out,
                "interrupted": self.interrupted,
            },
        })
    }
}

/// What the report says of a stream read: its messages, and why the replay cancelled it.
fn stream_note(s: &Step, r: &StreamRead) -> String {
    let mut note = format!(
        "a stream: {} messages recorded, {} now",
        s.recorded_messages(),
        r.messages
    );
    if let Some(w) = r.cancelled_after {
        let why = if s.open_at_end {
            "still open when the recording ended"
        } else {
            "its client cancelled it in the recording"
        };
        let _ = write!(
            note,
            "; {why}: read for {} (its recorded duration ÷ speed), then cancelled",
            dur(micros(w))
        );
    }
    note
}

/// What the report says of a request the recording lacked and a retry stood in for.
fn borrowed_note(s: &Step) -> Option<String> {
    s.borrowed.map(|j| {
        format!(
            "request not recorded (crisp answered the call before the tap read it): sent with \
             the request of kubelet's retry, #{}",
            j + 1
        )
    })
}

fn kind(d: &Difference) -> &'static str {
    match d {
        Difference::Status { .. } => "status",
        Difference::Message { .. } => "message",
        Difference::Duration { .. } => "duration",
        Difference::AnsweredAfter(_) => "order",
        Difference::NotSent(_) => "not_sent",
        Difference::Messages { .. } => "messages",
    }
}

fn micros(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

/// `OK 366ms`, `FailedPrecondition 6.5ms held 5.9ms`.
fn answer(a: &Answer) -> String {
    let mut s = format!("{} {}", code_name(a.code), dur(micros(a.duration)));
    if !a.held.is_zero() {
        let _ = write!(s, " held {}", dur(micros(a.held)));
    }
    s
}

/// How one call's answer now differs from the recorded one (order aside).
pub(crate) fn differences(s: &Step, o: &Outcome, tolerance: Duration) -> Vec<Difference> {
    let (now, stream) = match o {
        Outcome::Sent { now, stream, .. } => (now, stream),
        Outcome::NotSent(why) => return vec![Difference::NotSent(why.to_string())],
    };
    let mut out = Vec::new();
    // A stream the replay cancelled as the recording's client did (or as the recording ended
    // with it open) lasted as long as the replay chose, and ended as it chose.
    let cancelled = stream.is_some_and(|r| r.cancelled_after.is_some());
    if let Some(r) = stream.filter(|r| r.messages != s.recorded_messages()) {
        out.push(Difference::Messages {
            recorded: s.recorded_messages(),
            now: r.messages,
        });
    }
    if cancelled {
        return out;
    }
    if now.code != s.recorded.code {
        out.push(Difference::Status {
            recorded: s.recorded.code,
            now: now.code,
        });
    } else if now.code != Some(0)
        && message_class(&now.message) != message_class(&s.recorded.message)
    {
        out.push(Difference::Message {
            recorded: s.recorded.message.clone(),
            now: now.message.clone(),
        });
    }
    let (a, b) = (s.recorded.duration, now.duration);
    if a.abs_diff(b) > tolerance {
        out.push(Difference::Duration {
            recorded: a,
            held: s.recorded.held,
            now: b,
        });
    }
    out
}

/// A message with what changes from run to run (ids, numbers, durations) taken out: two
/// messages of one class say the same thing about different objects.
pub(crate) fn message_class(m: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let variable = word.chars().any(|c| c.is_ascii_digit())
            || (word.len() >= 12 && word.chars().all(|c| c.is_ascii_hexdigit()));
        out.push_str(if variable { "#" } else { word });
        word.clear();
    };
    for c in m.chars() {
        if c.is_alphanumeric() || c == '-' || c == '.' || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Pairs (a, b) of mutating calls answered in one order in the recording and the other now,
/// each by more than [`ORDER_SLACK`]: `a` answered first in the recording.
pub(crate) fn order_changes(steps: &[Step], outcomes: &[Outcome]) -> Vec<(usize, usize)> {
    let ends: Vec<Option<(Duration, Duration)>> = steps
        .iter()
        .zip(outcomes)
        .map(|(s, o)| match o {
            Outcome::Sent { now, sent_at, .. } if !s.polling && !s.streamed() => {
                Some((s.recorded_end(), *sent_at + now.duration))
            }
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for (a, ea) in ends.iter().enumerate() {
        let Some((ra, na)) = ea else { continue };
        for (b, eb) in ends.iter().enumerate() {
            let Some((rb, nb)) = eb else { continue };
            if *ra + ORDER_SLACK < *rb && *nb + ORDER_SLACK < *na {
                out.push((a, b));
            }
        }
    }
    out
}

/// The redactions of a call, as the report lists them.
fn redactions(r: &[Redacted]) -> String {
    r.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
