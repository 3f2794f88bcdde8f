//! An in-memory Kubernetes API server double for whole-flow tests of brink's operator and agent.
//!
//! [`KubeDouble::client`] gives a real `kube::Client` whose transport is the double, so any
//! `Api<K>`, `kube::runtime::watcher` and `Controller` runs against it unmodified. The double keeps
//! objects with resourceVersions (409 on a stale one), generation, `/status` and `/scale`
//! subresources, server-side apply with per-manager `managedFields` and list-map merging,
//! finalizers, ownerReference garbage collection, and watches that resume from a resourceVersion
//! (410 Gone once compacted). The test handle seeds objects, injects API errors and reads the
//! request log. [`KubeDouble::serve_http`] serves it over HTTP for processes (with a kubeconfig
//! from [`kubeconfig`]). Scope and limits: README.md.

mod discovery;
mod error;
mod fieldset;
mod gc;
mod handle;
mod http;
mod kinds;
mod merge;
mod ops;
mod path;
mod schema_defaults;
mod selector;
mod service;
mod ssa;
mod state;
mod store;
mod watch;

pub use error::{ApiError, ApiResult};
pub use handle::KubeDouble;
pub use http::{HttpDouble, kubeconfig};
pub use kinds::{KindRegistry, ListMapKeys, ResourceKind, ScalePaths, builtin_kinds};
pub use service::{DoubleService, ResponseBody};
pub use state::RecordedRequest;
