//! crisp's admin API, generated from `proto/crisp/admin/v1/admin.proto` by build.rs: the
//! messages and services the admin socket serves (`admin/`), the tap's events are sent as
//! (`tap`), and the admin client reads (`cli/client.rs`).
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("crisp.admin.v1");
