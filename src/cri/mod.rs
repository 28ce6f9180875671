//! What crisp knows about the CRI: routing a gRPC path to an RPC, the decoded views of the few
//! messages the features read, the field numbers read off the wire by number, and in-place
//! patching of the wire bytes.
//!
//! Nothing here is used to re-encode a forwarded message: views are decoded *copies* (prost drops
//! unknown fields, which is fine for a copy and fatal for a forwarded message — DESIGN.md §1).

pub mod api;
#[cfg(test)]
pub(crate) mod drift;
pub mod patch;
pub mod skim;
pub mod tags;
pub mod varint;
pub mod views;
pub mod wire;

use std::fmt;

/// CRI API version, taken from the gRPC service path. The two are wire-identical apart from the
/// path (KUBELET-CRI.md §8.1), so every feature behaves the same on both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiVersion {
    V1,
    V1alpha2,
}

impl ApiVersion {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "v1",
            ApiVersion::V1alpha2 => "v1alpha2",
        }
    }
}

macro_rules! rpcs {
    ($( $name:ident : $svc:ident, $kind:ident ;)*) => {
        /// Every RPC of the CRI that crisp recognises (v1.36 set; a superset of v1alpha2).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Rpc { $($name,)* }

        impl Rpc {
            pub(crate) const ALL: &'static [Rpc] = &[$(Rpc::$name,)*];

            pub(crate) fn name(self) -> &'static str {
                match self { $(Rpc::$name => stringify!($name),)* }
            }

            fn from_name(service: Service, name: &str) -> Option<Rpc> {
                match name {
                    $(stringify!($name) if service == Service::$svc => Some(Rpc::$name),)*
                    _ => None,
                }
            }

            /// Polling calls (>95 % of kubelet's traffic, KUBELET-CRI.md §4.1): never held, logged
            /// at debug, hidden from the tap unless asked for.
            pub fn kind(self) -> RpcKind {
                match self { $(Rpc::$name => RpcKind::$kind,)* }
            }
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Service {
    Runtime,
    Image,
}

/// How a call is treated for logging and the tap's default filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RpcKind {
    /// Changes runtime state (create, start, stop, pull, ...).
    Mutating,
    /// List*, *Status, *Stats, Version and friends.
    Polling,
    /// Server-streaming.
    Streaming,
}

rpcs! {
    Version: Runtime, Polling;
    RunPodSandbox: Runtime, Mutating;
    StopPodSandbox: Runtime, Mutating;
    RemovePodSandbox: Runtime, Mutating;
    PodSandboxStatus: Runtime, Polling;
    ListPodSandbox: Runtime, Polling;
    CreateContainer: Runtime, Mutating;
    StartContainer: Runtime, Mutating;
    StopContainer: Runtime, Mutating;
    RemoveContainer: Runtime, Mutating;
    ListContainers: Runtime, Polling;
    ContainerStatus: Runtime, Polling;
    UpdateContainerResources: Runtime, Mutating;
    ReopenContainerLog: Runtime, Mutating;
    ExecSync: Runtime, Mutating;
    Exec: Runtime, Mutating;
    Attach: Runtime, Mutating;
    PortForward: Runtime, Mutating;
    ContainerStats: Runtime, Polling;
    ListContainerStats: Runtime, Polling;
    PodSandboxStats: Runtime, Polling;
    ListPodSandboxStats: Runtime, Polling;
    UpdateRuntimeConfig: Runtime, Mutating;
    Status: Runtime, Polling;
    CheckpointContainer: Runtime, Mutating;
    GetContainerEvents: Runtime, Streaming;
    ListMetricDescriptors: Runtime, Polling;
    ListPodSandboxMetrics: Runtime, Polling;
    RuntimeConfig: Runtime, Polling;
    UpdatePodSandboxResources: Runtime, Mutating;
    StreamPodSandboxes: Runtime, Streaming;
    StreamContainers: Runtime, Streaming;
    StreamContainerStats: Runtime, Streaming;
    StreamPodSandboxStats: Runtime, Streaming;
    StreamPodSandboxMetrics: Runtime, Streaming;
    ListImages: Image, Polling;
    ImageStatus: Image, Polling;
    PullImage: Image, Mutating;
    RemoveImage: Image, Mutating;
    ImageFsInfo: Image, Polling;
    StreamImages: Image, Streaming;
}

impl Rpc {
    /// The field of this RPC's response messages that holds the listed items: `containers` (1)
    /// of each StreamContainersResponse, and so on for the six streamed lists of KEP-5825
    /// (api.proto: each is `repeated ... = 1`). `None` for every other RPC.
    pub(crate) fn listed_items(self) -> Option<u32> {
        match self {
            Rpc::StreamPodSandboxes
            | Rpc::StreamContainers
            | Rpc::StreamContainerStats
            | Rpc::StreamPodSandboxStats
            | Rpc::StreamPodSandboxMetrics
            | Rpc::StreamImages => Some(1),
            _ => None,
        }
    }
}

/// A routed gRPC path. `rpc` is `None` for paths crisp does not know; those are forwarded
/// untouched like everything else (DESIGN.md §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub(crate) version: Option<ApiVersion>,
    pub rpc: Option<Rpc>,
}

impl Route {
    pub(crate) const UNKNOWN: Route = Route {
        version: None,
        rpc: None,
    };

    /// Routes a request path such as `/runtime.v1.RuntimeService/CreateContainer`.
    /// Allocation-free: this runs for every call.
    pub fn from_path(path: &str) -> Route {
        let Some(rest) = path.strip_prefix("/runtime.") else {
            return Route::UNKNOWN;
        };
        let (version, rest) = if let Some(r) = rest.strip_prefix("v1alpha2.") {
            (ApiVersion::V1alpha2, r)
        } else if let Some(r) = rest.strip_prefix("v1.") {
            (ApiVersion::V1, r)
        } else {
            return Route::UNKNOWN;
        };
        let (service, name) = if let Some(n) = rest.strip_prefix("RuntimeService/") {
            (Service::Runtime, n)
        } else if let Some(n) = rest.strip_prefix("ImageService/") {
            (Service::Image, n)
        } else {
            return Route {
                version: Some(version),
                rpc: None,
            };
        };
        Route {
            version: Some(version),
            rpc: Rpc::from_name(service, name),
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.rpc, self.version) {
            (Some(rpc), Some(v)) => write!(f, "{}/{}", v.as_str(), rpc.name()),
            _ => f.write_str("unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_both_versions_and_unknowns() {
        let r = Route::from_path("/runtime.v1.RuntimeService/CreateContainer");
        assert_eq!(
            r,
            Route {
                version: Some(ApiVersion::V1),
                rpc: Some(Rpc::CreateContainer)
            }
        );
        let r = Route::from_path("/runtime.v1alpha2.ImageService/PullImage");
        assert_eq!(
            r,
            Route {
                version: Some(ApiVersion::V1alpha2),
                rpc: Some(Rpc::PullImage)
            }
        );
        // An image RPC on the runtime service is not a CRI method.
        assert_eq!(
            Route::from_path("/runtime.v1.RuntimeService/PullImage").rpc,
            None
        );
        assert_eq!(
            Route::from_path("/runtime.v1.RuntimeService/FutureThing").rpc,
            None
        );
        assert_eq!(
            Route::from_path("/grpc.health.v1.Health/Check"),
            Route::UNKNOWN
        );
        assert_eq!(
            Route::from_path("/runtime.v2.RuntimeService/Version"),
            Route::UNKNOWN
        );
        assert_eq!(
            Route::from_path("/runtime.v1.RuntimeService/ListContainers")
                .rpc
                .map(Rpc::kind),
            Some(RpcKind::Polling)
        );
    }

    #[test]
    fn every_rpc_routes_to_itself() {
        for rpc in Rpc::ALL {
            let svc = if matches!(
                rpc,
                Rpc::ListImages
                    | Rpc::ImageStatus
                    | Rpc::PullImage
                    | Rpc::RemoveImage
                    | Rpc::ImageFsInfo
                    | Rpc::StreamImages
            ) {
                "ImageService"
            } else {
                "RuntimeService"
            };
            for v in ["v1", "v1alpha2"] {
                let path = format!("/runtime.{v}.{svc}/{}", rpc.name());
                assert_eq!(Route::from_path(&path).rpc, Some(*rpc), "{path}");
            }
        }
    }
}
