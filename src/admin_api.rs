//! crisp's admin API, generated from `proto/crisp/admin/v1/admin.proto` by build.rs: the
//! messages and services the admin socket serves (`admin/`), the tap's events are sent as
//! (`tap`), and the admin client reads (`cli/client.rs`).
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("crisp.admin.v1");

/// Whether the pod `namespace/name` is the one a [`ListPodsRequest`]'s `pod` names
/// (`namespace/name`, or `name` in any namespace; `None`: every pod is). The admin socket
/// answers by it, and `crisp pods` filters by it what an older crisp sent whole.
pub fn pod_named(want: Option<&str>, namespace: &str, name: &str) -> bool {
    match want {
        None => true,
        Some(w) => match w.split_once('/') {
            Some((ns, n)) => namespace == ns && name == n,
            None => name == w,
        },
    }
}
