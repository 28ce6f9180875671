//! The ids a replay changes: the runtime gives a replayed RunPodSandbox a new sandbox id and a
//! replayed CreateContainer a new container id, and the replay gives a pod a new uid. Later
//! requests name the recorded ones; [`IdMap::rewrite`] puts the new ones in their place and
//! says which ids it could not map (the call is then reported, not sent).

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// Fields that hold a sandbox or container id in CRI requests: `pod_sandbox_id`,
/// `container_id`, and the `id` of the List/Stats filters.
const ID_FIELDS: &[&str] = &["pod_sandbox_id", "container_id", "id"];

/// Deepest nesting walked (CRI messages nest about 6 deep).
const MAX_DEPTH: usize = 64;

/// Recorded id → replayed id, both ways.
#[derive(Debug, Default, Clone)]
pub(crate) struct IdMap {
    ids: HashMap<String, String>,
    /// Ids the replay made (already new: a request holding one needs no rewriting).
    new: HashSet<String>,
    /// Replayed containers by what names them on the runtime (new sandbox id, name, attempt):
    /// a recorded container whose own CreateContainer failed in the replay maps to the one an
    /// earlier replayed call made under the same name.
    by_name: HashMap<(String, String, u64), String>,
}

/// What [`IdMap::rewrite`] did to a request.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Rewritten {
    /// (recorded, new) pairs put in, once each.
    pub(crate) pairs: Vec<(String, String)>,
    /// Ids in id fields that map to nothing (made before the recording, or by a call that was
    /// not replayed or failed).
    pub(crate) unmapped: Vec<String>,
}

impl IdMap {
    pub(crate) fn insert(&mut self, recorded: &str, new: &str) {
        if recorded.is_empty() || new.is_empty() {
            return;
        }
        self.ids.insert(recorded.to_string(), new.to_string());
        self.new.insert(new.to_string());
    }

    pub(crate) fn get(&self, recorded: &str) -> Option<&str> {
        self.ids.get(recorded).map(String::as_str)
    }

    /// Remembers a container the replay created, by its name in its (new) sandbox.
    pub(crate) fn created_container(&mut self, sandbox: &str, name: &str, attempt: u64, id: &str) {
        self.by_name.insert(
            (sandbox.to_string(), name.to_string(), attempt),
            id.to_string(),
        );
        self.new.insert(id.to_string());
    }

    /// The container the replay created under this name in this (new) sandbox.
    pub(crate) fn container_named(&self, sandbox: &str, name: &str, attempt: u64) -> Option<&str> {
        self.by_name
            .get(&(sandbox.to_string(), name.to_string(), attempt))
            .map(String::as_str)
    }

    /// Replaces, anywhere in `v`, every string that is a recorded id (or uid) by its new one,
    /// and lists the ids in id fields it cannot map.
    pub(crate) fn rewrite(&self, v: &mut Value) -> Rewritten {
        let mut out = Rewritten::default();
        self.walk(v, None, &mut out, 0);
        out
    }

    fn walk(&self, v: &mut Value, key: Option<&str>, out: &mut Rewritten, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        match v {
            Value::String(s) if !s.is_empty() => {
                if let Some(new) = self.ids.get(s.as_str()) {
                    let pair = (s.clone(), new.clone());
                    if !out.pairs.contains(&pair) {
                        out.pairs.push(pair);
                    }
                    *s = new.clone();
                } else if key.is_some_and(|k| ID_FIELDS.contains(&k))
                    && !self.new.contains(s.as_str())
                    && !out.unmapped.contains(s)
                {
                    out.unmapped.push(s.clone());
                }
            }
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    self.walk(x, Some(k), out, depth + 1);
                }
            }
            // A list's items are under the list's own field name.
            Value::Array(items) => {
                for x in items {
                    self.walk(x, key, out, depth + 1);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Later requests name the recorded ids; the replay sends the new ones in their place,
    /// wherever they are (fields, filters, label values).
    #[test]
    fn recorded_ids_become_the_replayed_ones_everywhere() {
        let mut map = IdMap::default();
        map.insert("sb-old", "sb-new");
        map.insert("ct-old", "ct-new");
        map.insert("uid-old", "uid-new");
        let mut req = json!({
            "pod_sandbox_id": "sb-old",
            "container_id": "ct-old",
            "filter": {"id": "ct-old", "pod_sandbox_id": "sb-old", "label_selector": {}},
            "config": {"labels": {"io.kubernetes.pod.uid": "uid-old"}, "name": "sb-old-ish"},
        });
        let r = map.rewrite(&mut req);
        assert_eq!(req["pod_sandbox_id"], "sb-new");
        assert_eq!(req["container_id"], "ct-new");
        assert_eq!(req["filter"]["id"], "ct-new");
        assert_eq!(req["filter"]["pod_sandbox_id"], "sb-new");
        assert_eq!(req["config"]["labels"]["io.kubernetes.pod.uid"], "uid-new");
        // Only whole values: a name that merely starts like an id stays.
        assert_eq!(req["config"]["name"], "sb-old-ish");
        assert!(r.unmapped.is_empty());
        assert_eq!(r.pairs.len(), 3, "{:?}", r.pairs);
    }

    /// An id no replayed call made cannot be guessed: it is listed, so the call is not sent.
    #[test]
    fn ids_made_before_the_recording_are_unmapped() {
        let mut map = IdMap::default();
        map.insert("sb-old", "sb-new");
        let mut req = json!({"container_id": "made-earlier", "pod_sandbox_id": "sb-old",
            "filter": {"id": ""}, "image": {"image": "busybox"}});
        let r = map.rewrite(&mut req);
        assert_eq!(r.unmapped, vec!["made-earlier".to_string()]);
        // Empty ids (no filter) and non-id fields are not ids to map.
        assert_eq!(req["filter"]["id"], "");
        // An id the replay made itself is new already.
        let mut again = json!({"pod_sandbox_id": "sb-new"});
        assert!(map.rewrite(&mut again).unmapped.is_empty());
    }

    /// A container the replay made under a name answers for the recorded container of that
    /// name, when the recorded call that made it fails in the replay (the name is taken).
    #[test]
    fn containers_are_found_by_name_in_their_new_sandbox() {
        let mut map = IdMap::default();
        map.created_container("sb-new", "app", 0, "ct-new");
        assert_eq!(map.container_named("sb-new", "app", 0), Some("ct-new"));
        assert_eq!(map.container_named("sb-new", "app", 1), None);
        assert_eq!(map.container_named("sb-other", "app", 0), None);
        let mut req = json!({"container_id": "ct-new"});
        assert!(map.rewrite(&mut req).unmapped.is_empty());
    }
}
