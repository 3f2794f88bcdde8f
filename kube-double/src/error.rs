//! API errors as the API server reports them: an HTTP status plus a `meta/v1 Status` body, so
//! `kube::Error::Api` carries the same `reason`, `code` and `message` a real server would send.

use serde_json::{Value, json};

/// One failed request: becomes a `Status` object with `status: Failure`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    /// The machine-readable reason (`NotFound`, `Conflict`, `AlreadyExists`, `Invalid`, ...).
    pub reason: String,
    pub message: String,
    /// `details.name` / `details.group` / `details.kind` of the object the error is about.
    pub details: Option<Box<ErrorDetails>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorDetails {
    pub name: String,
    pub group: String,
    /// The resource's plural name, as the API server puts it in `details.kind`.
    pub kind: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self { code, reason: reason.to_string(), message: message.into(), details: None }
    }

    pub fn with_details(mut self, name: &str, group: &str, plural: &str) -> Self {
        self.details = Some(Box::new(ErrorDetails { name: name.to_string(), group: group.to_string(), kind: plural.to_string() }));
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub fn not_found(plural: &str, group: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", qualified(plural, group))).with_details(name, group, plural)
    }

    pub fn already_exists(plural: &str, group: &str, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", qualified(plural, group))).with_details(name, group, plural)
    }

    /// The optimistic-concurrency failure: the message is the API server's, word for word.
    pub fn stale(plural: &str, group: &str, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(plural, group)
            ),
        )
        .with_details(name, group, plural)
    }

    /// A watch or list from a resourceVersion older than the retained history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// The `meta/v1 Status` body.
    pub fn status_body(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = json!({ "name": d.name, "group": d.group, "kind": d.kind });
        }
        v
    }
}

/// `pods` for the core group, `modeldeployments.brink.dev` otherwise (as in the server's messages).
fn qualified(plural: &str, group: &str) -> String {
    if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") }
}

pub type ApiResult<T> = Result<T, ApiError>;
