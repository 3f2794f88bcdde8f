//! The one error type of the controllers: what a reconcile could not do, worded for logs,
//! Events and the `errors` metric (by [`Error::kind`]).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// An API call failed (unreachable server, 5xx, a rejected write).
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// A server-side apply conflicted with another field manager (409): surfaced, not forced,
    /// so that the owner of the field is named instead of silently overwritten.
    #[error("{action}: conflict with another field manager: {message}")]
    Conflict { action: String, message: String },
    /// A decision refused its input (a duplicate node, an impossible serving limit).
    #[error("{0}")]
    Decide(#[from] crate::decide::DecideError),
    /// An object lacks a field the controller needs (namespace, name, uid).
    #[error("{kind} {name}: missing {field}")]
    MissingField { kind: &'static str, name: String, field: &'static str },
    /// A spec this operator cannot act on (a Model whose source sets nothing).
    #[error("{what}: {why}")]
    InvalidSpec { what: String, why: String },
    /// A condition that the API server would reject.
    #[error("{0}")]
    Condition(#[from] brink_api::crd::BadReason),
    #[error("serialising {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an API error; a 409 from an apply becomes [`Error::Conflict`].
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Error {
        let action = action.into();
        match &source {
            kube::Error::Api(status) if status.code == 409 => Error::Conflict { action, message: status.message.clone() },
            _ => Error::Kube { action, source },
        }
    }

    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "api",
            Error::Conflict { .. } => "conflict",
            Error::Decide(_) => "decide",
            Error::MissingField { .. } => "missing_field",
            Error::InvalidSpec { .. } => "invalid_spec",
            Error::Condition(_) => "condition",
            Error::Serialize { .. } => "serialize",
        }
    }
}

/// The HTTP status of an API error, if the server answered one.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}
