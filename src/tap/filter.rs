//! Which calls one tap subscriber sees: method globs, pod/namespace, errors only, slower than N,
//! polling calls on or off. Split in two so the tap can skip work early: what can be decided
//! from the call alone ([`Filter::wants_route`], [`Filter::wants_outcome`]) and what needs the
//! names crisp resolved ([`Filter::wants_names`]).

use std::time::Duration;

use crate::cri::{Route, Rpc, RpcKind};

/// A shell-style glob: `*` matches any run of characters, `?` exactly one. Nothing else is
/// special, so method names and gRPC paths match literally.
#[derive(Debug, Clone)]
pub(crate) struct Glob {
    pattern: String,
    matcher: wildmatch::WildMatch,
}

impl PartialEq for Glob {
    fn eq(&self, other: &Glob) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for Glob {}

impl Glob {
    /// `*` matches any run of characters, `?` any one; everything else itself.
    pub(crate) fn new(pattern: &str) -> Glob {
        Glob {
            pattern: pattern.to_string(),
            matcher: wildmatch::WildMatch::new(pattern),
        }
    }

    pub(crate) fn matches(&self, text: &str) -> bool {
        self.matcher.matches(text)
    }

    /// A glob naming a gRPC path rather than a method (`/runtime.v1alpha2.*`).
    fn is_path(&self) -> bool {
        self.pattern.contains('/')
    }
}

/// The method name shown for a path: the RPC name, or the last path segment of a path crisp
/// does not know.
pub(crate) fn method_name<'a>(route: &Route, path: &'a str) -> &'a str {
    match route.rpc {
        Some(r) => r.name(),
        None => path.rsplit('/').next().unwrap_or(path),
    }
}

/// Whether `rpc` is one of kubelet's polling calls, hidden unless asked for: the polling kind
/// (List*, *Status, *Stats, Version), and the streamed lists of KEP-5825 that replace the lists
/// in kubelet 1.36 (its PLEG relists with them every second) — streaming on the wire, polling in
/// what they are.
fn polls(rpc: Option<Rpc>) -> bool {
    matches!(rpc.map(Rpc::kind), Some(RpcKind::Polling))
        || rpc.and_then(Rpc::listed_items).is_some()
}

/// One subscriber's filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    /// When non-empty, exactly the methods matching one of these are shown, polling included.
    pub(crate) methods: Vec<Glob>,
    pub(crate) namespace: Option<String>,
    pub(crate) pod: Option<String>,
    pub(crate) errors_only: bool,
    pub(crate) slower_than: Duration,
    /// Show List*/​*Status/​*Stats/Version and the Stream* lists (hidden by default: >95 % of
    /// kubelet's traffic).
    pub(crate) include_polling: bool,
    /// Decode request and response messages to JSON.
    pub(crate) full: bool,
    /// Show secrets. Only ever set for a root caller (checked by the admin server).
    pub(crate) unredacted: bool,
}

impl Filter {
    /// Whether calls to this route may be shown: decided before the call runs, so the proxy only
    /// buffers messages somebody can see.
    pub(crate) fn wants_route(&self, route: &Route, path: &str) -> bool {
        if !self.methods.is_empty() {
            let name = method_name(route, path);
            return self
                .methods
                .iter()
                .any(|g| g.matches(name) || g.matches(path));
        }
        self.include_polling || !polls(route.rpc)
    }

    /// Conservative per-RPC version of [`Filter::wants_route`] (`None`: paths crisp does not
    /// know), for the tap's interest bitmap: true whenever some path of this RPC could match.
    pub(crate) fn may_want_rpc(&self, rpc: Option<Rpc>) -> bool {
        if !self.methods.is_empty() {
            return match rpc {
                Some(r) => self
                    .methods
                    .iter()
                    .any(|g| g.is_path() || g.matches(r.name())),
                None => true,
            };
        }
        self.include_polling || !polls(rpc)
    }

    pub(crate) fn wants_outcome(&self, code: Option<i32>, duration: Duration) -> bool {
        if self.errors_only && code == Some(0) {
            return false;
        }
        duration >= self.slower_than
    }

    /// Whether this subscriber sees the messages of streamed responses: not when it filters on
    /// the outcome (errors only, slower than), which a message does not have yet.
    pub(crate) fn wants_messages(&self) -> bool {
        !self.errors_only && self.slower_than.is_zero()
    }

    /// Pod filters: a call crisp cannot attribute to a pod never matches one.
    pub(crate) fn wants_names(&self, namespace: &str, pod: &str) -> bool {
        if let Some(ns) = &self.namespace {
            if ns != namespace {
                return false;
            }
        }
        if let Some(p) = &self.pod {
            if p != pod {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let cases: &[(&str, &str, bool)] = &[
            ("CreateContainer", "CreateContainer", true),
            ("Create*", "CreateContainer", true),
            ("*Container", "StopContainer", true),
            ("*Container", "ContainerStatus", false),
            ("*Container*", "ContainerStatus", true),
            ("?topContainer", "StopContainer", true),
            ("*", "", true),
            ("", "", true),
            ("", "x", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            (
                "/runtime.v1alpha2.*",
                "/runtime.v1alpha2.ImageService/PullImage",
                true,
            ),
            (
                "/runtime.v1alpha2.*",
                "/runtime.v1.ImageService/PullImage",
                false,
            ),
            ("List*", "ListContainers", true),
            ("list*", "ListContainers", false),
        ];
        for (p, t, want) in cases {
            assert_eq!(Glob::new(p).matches(t), *want, "{p:?} vs {t:?}");
        }
    }

    fn route(path: &str) -> Route {
        Route::from_path(path)
    }

    #[test]
    fn polling_hidden_unless_asked_or_named() {
        let list = "/runtime.v1.RuntimeService/ListContainers";
        let create = "/runtime.v1.RuntimeService/CreateContainer";
        let f = Filter::default();
        assert!(!f.wants_route(&route(list), list));
        assert!(f.wants_route(&route(create), create));
        assert!(!f.may_want_rpc(Some(Rpc::ListContainers)));
        // The streamed lists of kubelet 1.36 poll as the lists they replace; other streams show.
        let stream = "/runtime.v1.RuntimeService/StreamContainers";
        let events = "/runtime.v1.RuntimeService/GetContainerEvents";
        assert!(!f.wants_route(&route(stream), stream));
        assert!(!f.may_want_rpc(Some(Rpc::StreamImages)));
        assert!(f.wants_route(&route(events), events));
        let f = Filter {
            include_polling: true,
            ..Default::default()
        };
        assert!(f.wants_route(&route(list), list));
        assert!(f.wants_route(&route(stream), stream));
        assert!(f.may_want_rpc(Some(Rpc::StreamImages)));
        // Naming a polling method shows it: filters select exactly what they say.
        let f = Filter {
            methods: vec![Glob::new("List*")],
            ..Default::default()
        };
        assert!(f.wants_route(&route(list), list));
        assert!(!f.wants_route(&route(create), create));
        assert!(f.may_want_rpc(Some(Rpc::ListContainers)));
        assert!(!f.may_want_rpc(Some(Rpc::CreateContainer)));
        // Unknown paths match by their last segment or their full path.
        let odd = "/runtime.v1.RuntimeService/FutureThing";
        assert!(Filter::default().wants_route(&route(odd), odd));
        let f = Filter {
            methods: vec![Glob::new("Future*")],
            ..Default::default()
        };
        assert!(f.wants_route(&route(odd), odd));
        assert!(f.may_want_rpc(None));
    }

    #[test]
    fn outcome_and_names() {
        let f = Filter {
            errors_only: true,
            slower_than: Duration::from_millis(10),
            ..Default::default()
        };
        assert!(!f.wants_outcome(Some(0), Duration::from_secs(1)));
        assert!(f.wants_outcome(Some(5), Duration::from_millis(10)));
        assert!(f.wants_outcome(None, Duration::from_secs(1)));
        assert!(!f.wants_outcome(Some(5), Duration::from_millis(9)));
        let f = Filter {
            namespace: Some("default".into()),
            ..Default::default()
        };
        assert!(f.wants_names("default", "web"));
        assert!(!f.wants_names("kube-system", "web"));
        assert!(!f.wants_names("", ""));
        let f = Filter {
            pod: Some("web".into()),
            ..Default::default()
        };
        assert!(f.wants_names("any", "web"));
        assert!(!f.wants_names("any", "db"));
    }
}
