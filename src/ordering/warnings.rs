//! A pod's malformed annotations (DESIGN.md §2): each one a [`Warning`] shown cut and escaped,
//! all of them counted in [`Warnings`], a few kept, one log line per pod.

use std::ops::Deref;

use crate::tenant;

/// Warnings of one pod kept to be shown (those with the smallest keys); all are counted.
pub const MAX_WARNINGS_KEPT: usize = 8;
/// Warnings named in the pod's one log line; the others are counted in it.
const WARNINGS_SHOWN: usize = 3;
/// Longest annotation value shown in a warning, in bytes.
const VALUE_SHOWN: usize = 128;
/// Longest reason shown in a warning, in bytes.
const REASON_SHOWN: usize = 512;

/// A malformed annotation of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub key: String,
    /// The value as shown: cut and escaped ([`tenant::text`]), never the whole of a huge one.
    pub value: String,
    pub(crate) reason: String,
}

impl Warning {
    pub(crate) fn new(key: &str, value: &str, reason: String) -> Warning {
        Warning {
            key: key.to_string(),
            value: tenant::cut(value, VALUE_SHOWN),
            reason,
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Everything is shown cut and escaped: annotations can be huge (and the reason may quote
        // the value), and the log line must stay one short line.
        let key = tenant::text(&self.key, tenant::MAX_FIELD);
        write!(
            f,
            "annotation {key}=\"{}\" ignored: {}",
            tenant::text(&self.value, VALUE_SHOWN),
            tenant::text(&self.reason, REASON_SHOWN)
        )
    }
}

/// A pod's malformed annotations: every one counted, the [`MAX_WARNINGS_KEPT`] with the
/// smallest keys kept (sorted by key), so thousands of bad keys cost neither memory nor log
/// lines. Reads as the slice of those kept.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Warnings {
    kept: Vec<Warning>,
    total: usize,
}

impl Warnings {
    pub(crate) fn push(&mut self, w: Warning) {
        let key = w.key.clone();
        self.push_with(&key, || w);
    }

    /// Counts a warning about `key`, built by `make` only if it is kept: a pod's thousands of
    /// bad keys cost a count and a comparison each.
    pub(crate) fn push_with(&mut self, key: &str, make: impl FnOnce() -> Warning) {
        self.total = self.total.saturating_add(1);
        if self.kept.len() < MAX_WARNINGS_KEPT {
            self.kept.push(make());
        } else if let Some(last) = self
            .kept
            .iter_mut()
            .max_by(|a, b| a.key.cmp(&b.key))
            .filter(|last| key < last.key.as_str())
        {
            *last = make();
        }
    }

    /// All the pod's warnings, kept or not (what `crisp_bad_annotations_total` counts).
    pub fn total(&self) -> usize {
        self.total
    }

    pub(super) fn sort(&mut self) {
        self.kept.sort_by(|a, b| a.key.cmp(&b.key));
    }

    /// The pod's one log line: the warning, or how many there are and the first few; at most
    /// [`tenant::MAX_LOG_LINE`] bytes.
    pub fn summary(&self) -> String {
        let line = match self.kept.as_slice() {
            [] => String::new(),
            [w] if self.total == 1 => w.to_string(),
            kept => {
                let shown: Vec<String> = kept
                    .iter()
                    .take(WARNINGS_SHOWN)
                    .map(Warning::to_string)
                    .collect();
                let more = self.total.saturating_sub(shown.len());
                let tail = if more > 0 {
                    format!("; and {more} more")
                } else {
                    String::new()
                };
                format!(
                    "{} malformed annotations ignored (each as if absent): {}{tail}",
                    self.total,
                    shown.join("; ")
                )
            }
        };
        tenant::cut(&line, tenant::MAX_LOG_LINE)
    }
}

impl Deref for Warnings {
    type Target = [Warning];
    fn deref(&self) -> &[Warning] {
        &self.kept
    }
}

impl<'a> IntoIterator for &'a Warnings {
    type Item = &'a Warning;
    type IntoIter = std::slice::Iter<'a, Warning>;
    fn into_iter(self) -> Self::IntoIter {
        self.kept.iter()
    }
}
