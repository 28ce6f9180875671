//! What `crisp replay --as-runtime` served, as text or JSON: the recorded calls answered, those
//! the peer never made, calls the recording does not have, calls made more often than recorded,
//! answers in another order than recorded, and answers that kept redaction placeholders.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::script::{ServedReport, StreamServed, Unsent};
use super::Step;
use crate::metrics::code_name;
use crate::tenant;

/// Most calls listed under one heading of the text report.
const MAX_LISTED: usize = 20;

/// A stream's messages not sent, counted by why.
fn unsent_by_reason(st: &StreamServed) -> Vec<(Unsent, u64)> {
    let mut by: std::collections::BTreeMap<Unsent, u64> = Default::default();
    for (_, why) in &st.unsent {
        *by.entry(*why).or_default() += 1;
    }
    if st.dropped > 0 {
        *by.entry(Unsent::Dropped).or_default() += st.dropped;
    }
    by.into_iter().collect()
}

fn call(s: &Step) -> String {
    format!("#{} {} {}", s.index + 1, s.method, s.target)
        .trim_end()
        .to_string()
}

impl ServedReport {
    /// Whether the peer did something else than the recording: a call not in it, a recorded
    /// mutating call never made, or answers in another order.
    pub fn differs(&self) -> bool {
        !self.unmatched.is_empty() || !self.not_asked.is_empty() || !self.order.is_empty()
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let unmatched: u32 = self.unmatched.iter().map(|(_, n)| n).sum();
        let polled: u32 = self.polling.values().map(|(n, _)| n).sum();
        let _ = writeln!(
            out,
            "served {} as the runtime: {} recorded calls, {} of them mutating",
            self.scope, self.recorded, self.mutating
        );
        let _ = writeln!(
            out,
            "  {} of {} mutating calls answered as recorded, {} polling calls answered, \
             {} calls not in the recording",
            self.answered.len(),
            self.mutating,
            polled,
            unmatched
        );
        let mut section = |title: &str, lines: Vec<String>| {
            if lines.is_empty() {
                return;
            }
            let _ = writeln!(out, "\n{title}:");
            for l in lines.iter().take(MAX_LISTED) {
                let _ = writeln!(out, "  {l}");
            }
            if lines.len() > MAX_LISTED {
                let _ = writeln!(out, "  … and {} more", lines.len() - MAX_LISTED);
            }
        };
        let step = |i: usize| &self.steps[i];
        section(
            "answered (in the order asked)",
            self.answered
                .iter()
                .map(|&i| {
                    let s = step(i);
                    format!("{:<40} {}", call(s), code_name(s.recorded.code))
                })
                .collect(),
        );
        section(
            "not in the recording (answered Unimplemented)",
            self.unmatched
                .iter()
                .map(|(u, n)| format!("{n}× {} ({})", u.method, u.identity))
                .collect(),
        );
        section(
            "recorded but never asked for",
            self.not_asked.iter().map(|&i| call(step(i))).collect(),
        );
        section(
            "order differences",
            self.order
                .iter()
                .map(|&(i, j)| {
                    format!(
                        "{}: answered before {}, recorded after it",
                        call(step(i)),
                        call(step(j))
                    )
                })
                .collect(),
        );
        section(
            "asked more often than recorded (answered as the last recorded one again)",
            self.again
                .iter()
                .map(|&(i, n)| format!("{}: {n} more", call(step(i))))
                .collect(),
        );
        section(
            "polling calls (answered, recorded answers)",
            self.polling
                .iter()
                .filter(|(_, (n, _))| *n > 0)
                .map(|(m, (n, r))| format!("{m}: {n} answered from {r} recorded"))
                .collect(),
        );
        section(
            "streamed calls (messages sent, of those recorded)",
            self.streams
                .iter()
                .map(|(i, st)| {
                    let s = step(*i);
                    let mut line = format!(
                        "{}: {} sent of {} recorded ({} {})",
                        call(s),
                        st.sent,
                        s.recorded_messages(),
                        st.answers,
                        if st.answers == 1 { "answer" } else { "answers" }
                    );
                    for (why, n) in unsent_by_reason(st) {
                        let _ = write!(line, "; {n} not sent: {why}");
                    }
                    line
                })
                .collect(),
        );
        section(
            "pod uids in the answers (recorded → the peer's)",
            self.uids
                .iter()
                .map(|(r, p)| format!("{r} → {p}"))
                .collect(),
        );
        section(
            "answers with redacted fields (kept as the recording has them: placeholders, never \
             the values)",
            self.redacted.iter().map(|&i| call(step(i))).collect(),
        );
        section(
            "answered OK with an empty message (the recording has no response: record with \
             `crisp tap --full`)",
            self.empty.iter().map(|&i| call(step(i))).collect(),
        );
        out
    }

    /// The report as one line of JSON.
    pub fn json_text(&self) -> String {
        tenant::json(&self.json())
    }

    /// The report as one JSON object: `scope`, `answered[]`, `unmatched[]`, `not_asked[]`,
    /// `order[]`, `again[]`, `polling{}`, `streams[]`, `redacted[]`, `empty[]`, `uids[]`,
    /// `summary`.
    pub fn json(&self) -> Value {
        let step = |i: usize| {
            let s = &self.steps[i];
            json!({
                "index": s.index + 1,
                "method": s.method,
                "target": s.target,
                "code_name": code_name(s.recorded.code),
                "message": s.recorded.message,
            })
        };
        let unmatched: u32 = self.unmatched.iter().map(|(_, n)| n).sum();
        json!({
            "scope": self.scope,
            "answered": self.answered.iter().map(|&i| step(i)).collect::<Vec<_>>(),
            "unmatched": self.unmatched.iter().map(|(u, n)| json!({
                "method": u.method,
                "pod_sandbox_id": u.identity.sandbox,
                "container_id": u.identity.container,
                "name": u.identity.name,
                "count": n,
            })).collect::<Vec<_>>(),
            "not_asked": self.not_asked.iter().map(|&i| step(i)).collect::<Vec<_>>(),
            "order": self.order.iter().map(|&(i, j)| json!({
                "call": step(i), "recorded_before": step(j),
            })).collect::<Vec<_>>(),
            "again": self.again.iter().map(|&(i, n)| json!({"call": step(i), "extra": n}))
                .collect::<Vec<_>>(),
            "polling": self.polling.iter().map(|(m, (n, r))| (m.clone(), json!({
                "answered": n, "recorded": r,
            }))).collect::<serde_json::Map<_, _>>(),
            "streams": self.streams.iter().map(|(i, st)| json!({
                "call": step(*i),
                "answers": st.answers,
                "recorded_messages": self.steps[*i].recorded_messages(),
                "sent": st.sent,
                "not_sent": unsent_by_reason(st).into_iter().map(|(why, n)| json!({
                    "reason": why.to_string(), "count": n,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "redacted": self.redacted.iter().map(|&i| step(i)).collect::<Vec<_>>(),
            "empty": self.empty.iter().map(|&i| step(i)).collect::<Vec<_>>(),
            "uids": self.uids.iter().map(|(r, p)| json!({"recorded": r, "peer": p}))
                .collect::<Vec<_>>(),
            "summary": {
                "recorded": self.recorded,
                "mutating": self.mutating,
                "answered": self.answered.len(),
                "polling_answered": self.polling.values().map(|(n, _)| n).sum::<u32>(),
                "unmatched": unmatched,
                "not_asked": self.not_asked.len(),
                "order_differences": self.order.len(),
                "again": self.again.iter().map(|(_, n)| n).sum::<u32>(),
                "stream_messages_sent": self.streams.iter().map(|(_, s)| s.sent).sum::<u32>(),
            },
        })
    }
}
