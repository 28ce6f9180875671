//! A request header block's fields as the relay decodes them, and the routes of the paths a
//! connection used.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use bytes::Bytes;

use crate::cri::Route;
use crate::proxy::http2::IdHasher;

/// A header block's fields as decoded, kept until the relay knows where the block goes: to the
/// runtime (through its [`crate::proxy::http2::Indexer`]) or, as owned fields, to the observed path.
#[derive(Default)]
pub(super) struct FieldList {
    bytes: Vec<u8>,
    /// Each field's name and value lengths, in order, their bytes one after the other in `bytes`.
    lens: Vec<(usize, usize)>,
}

impl FieldList {
    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.lens.clear();
    }

    /// The decoded size so far (names and values).
    pub(super) fn size(&self) -> usize {
        self.bytes.len()
    }

    pub(super) fn push(&mut self, name: &[u8], value: &[u8]) {
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self.lens.push((name.len(), value.len()));
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut at = 0;
        self.lens.iter().map(move |&(n, v)| {
            let field = (&self.bytes[at..at + n], &self.bytes[at + n..at + n + v]);
            at += n + v;
            field
        })
    }

    /// The fields, owned: what a diverted stream hands on.
    pub(super) fn to_owned(&self) -> Vec<(Bytes, Bytes)> {
        self.iter()
            .map(|(n, v)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))
            .collect()
    }
}

/// The paths one client connection used, with their routes. A kubelet uses a few dozen; a
/// client that sends ever new paths only makes the cache start over.
#[derive(Default)]
pub(super) struct PathCache {
    map: HashMap<Box<[u8]>, (Route, http::uri::PathAndQuery), BuildHasherDefault<IdHasher>>,
    /// The last path asked for, when its text is exactly the bytes it came from: a poll asks
    /// for the same one again, found without hashing it.
    last: Option<(Route, http::uri::PathAndQuery)>,
}

impl PathCache {
    const MAX: usize = 128;

    /// The route and path of a request's `:path` value.
    pub(super) fn get(&mut self, raw: &[u8]) -> (Route, http::uri::PathAndQuery) {
        if let Some(last) = &self.last {
            if last.1.as_str().as_bytes() == raw {
                return last.clone();
            }
        }
        let hit = match self.map.get(raw) {
            Some(hit) => hit.clone(),
            None => {
                let route = Route::from_path(std::str::from_utf8(raw).unwrap_or("/"));
                let path = http::uri::PathAndQuery::from_maybe_shared(Bytes::copy_from_slice(raw))
                    .unwrap_or_else(|_| http::uri::PathAndQuery::from_static("/"));
                if self.map.len() >= Self::MAX {
                    self.map.clear();
                }
                self.map.insert(raw.into(), (route, path.clone()));
                (route, path)
            }
        };
        // Only a path whose text is its bytes: a hit above is then the same path.
        self.last = (hit.1.as_str().as_bytes() == raw).then(|| hit.clone());
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::PathCache;
    use crate::cri::Route;

    /// Whatever the order it is asked in, the cache answers as a fresh parse does.
    #[test]
    fn a_path_asked_again_or_in_turn_gets_its_own_route() {
        let paths: [&[u8]; 6] = [
            b"/runtime.v1.RuntimeService/ListContainers",
            b"/runtime.v1.RuntimeService/Version",
            b"",
            b"/",
            b"not a path",
            b"/runtime.v1.RuntimeService/Version?x=1",
        ];
        let mut cache = PathCache::default();
        for round in 0..3 {
            for (i, raw) in paths.iter().enumerate() {
                for raw in [raw, raw, &paths[(i + round) % paths.len()]] {
                    let fresh = PathCache::default().get(raw);
                    let got = cache.get(raw);
                    assert_eq!(
                        (got.0, got.1.as_str()),
                        (fresh.0, fresh.1.as_str()),
                        "{raw:?}"
                    );
                    assert_eq!(got.0, Route::from_path(std::str::from_utf8(raw).unwrap()));
                }
            }
        }
    }
}
