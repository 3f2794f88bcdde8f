//! What the gateway's spans say, built from what routing decided and what each replica answered
//! (pure; [`crate::trace`] makes the spans). One server span per request, named as the HTTP
//! conventions name it (`POST /v1/chat/completions`), and under it one client span per attempt
//! at a replica (`upstream`): a retried request shows each replica it was sent to, in order, with
//! why it went on.
//!
//! Attributes: the OpenTelemetry conventions' where they exist (`http.*`, `gen_ai.request.model`,
//! `error.type`), `brink.gateway.*` otherwise.

use opentelemetry::KeyValue;
use opentelemetry::trace::Status;

use crate::errors::Api;
use crate::metrics::Rejection;
use crate::pick::Affinity;

/// The name of every attempt's span.
pub const ATTEMPT_SPAN: &str = "upstream";

/// A request span's name: `{method} {route}`.
pub fn request_name(method: &str, route: &str) -> String {
    format!("{method} {route}")
}

/// What a request's span starts with.
pub fn request_start(method: &str, route: &str, api: Api) -> Vec<KeyValue> {
    let api = match api {
        Api::OpenAi => "openai",
        Api::Anthropic => "anthropic",
    };
    vec![
        KeyValue::new("http.request.method", method.to_string()),
        KeyValue::new("http.route", route.to_string()),
        KeyValue::new("brink.gateway.api", api),
    ]
}

/// What routing decided: the model, and whether the prompt went to its prefix's replica
/// (`hit`), was moved off it (`moved`, with why) or had none (`none`).
pub fn routed(model: &str, affinity: &Affinity) -> Vec<KeyValue> {
    let mut out = vec![KeyValue::new("gen_ai.request.model", model.to_string())];
    match affinity {
        Affinity::None => out.push(KeyValue::new("brink.gateway.affinity", "none")),
        Affinity::Hit => out.push(KeyValue::new("brink.gateway.affinity", "hit")),
        Affinity::Moved { why, .. } => {
            out.push(KeyValue::new("brink.gateway.affinity", "moved"));
            out.push(KeyValue::new("brink.gateway.affinity_moved", why.label()));
        }
    }
    out
}

/// The gateway answered the request itself (`brink.gateway.rejection`, the reason label of
/// `brink_gateway_rejections_total`).
pub fn rejected(why: Rejection) -> KeyValue {
    KeyValue::new("brink.gateway.rejection", why.label())
}

/// How a request ended: the status the client got and how many replicas were tried. A server
/// span is an error only for a 5xx (a 4xx is the client's).
pub fn request_end(status: u16, attempts: u32) -> (Vec<KeyValue>, Status) {
    let mut attrs =
        vec![KeyValue::new("http.response.status_code", i64::from(status)), KeyValue::new("brink.gateway.attempts", i64::from(attempts))];
    let status = if status >= 500 {
        attrs.push(KeyValue::new("error.type", status.to_string()));
        Status::error(format!("answered {status}"))
    } else {
        Status::Unset
    };
    (attrs, status)
}

/// One attempt at a replica, as it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptStart<'a> {
    /// 1 for the first replica tried.
    pub number: u32,
    /// The replica's base URL (the `upstream` label of the gateway's metrics).
    pub replica: &'a str,
    /// The model the client named.
    pub model: &'a str,
    /// The name the replica serves it under (its deployment's `--served-model-name`).
    pub served_as: &'a str,
    /// The replica is the prompt prefix's home, and routing sent the prompt there.
    pub affinity_hit: bool,
}

pub fn attempt_start(a: &AttemptStart<'_>) -> Vec<KeyValue> {
    let mut out = vec![
        KeyValue::new("brink.gateway.attempt", i64::from(a.number)),
        KeyValue::new("brink.gateway.replica", a.replica.to_string()),
        KeyValue::new("gen_ai.request.model", a.model.to_string()),
        KeyValue::new("brink.gateway.affinity_hit", a.affinity_hit),
    ];
    if a.served_as != a.model {
        out.push(KeyValue::new("brink.gateway.served_as", a.served_as.to_string()));
    }
    out
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Its answer (whatever its status) went to the client.
    Answered { status: u16 },
    /// It refused before its first byte and the request went on to another replica; `reason`
    /// is the `reason` label of `brink_gateway_retries_total`.
    Retried { status: Option<u16>, reason: &'static str },
    /// It failed, and the gateway answered the client itself.
    Failed { status: Option<u16>, reason: &'static str, message: String },
}

/// An attempt's closing attributes and status (a client span: a 4xx or 5xx is an error).
pub fn attempt_end(end: &AttemptEnd) -> (Vec<KeyValue>, Status) {
    let code = |status: Option<u16>| status.map(|s| KeyValue::new("http.response.status_code", i64::from(s)));
    match end {
        AttemptEnd::Answered { status } => {
            let mut attrs = vec![KeyValue::new("brink.gateway.outcome", "answered")];
            attrs.extend(code(Some(*status)));
            if *status >= 400 {
                attrs.push(KeyValue::new("error.type", status.to_string()));
                return (attrs, Status::error(format!("answered {status}")));
            }
            (attrs, Status::Unset)
        }
        AttemptEnd::Retried { status, reason } => {
            let mut attrs = vec![KeyValue::new("brink.gateway.outcome", "retried"), KeyValue::new("brink.gateway.retry_reason", *reason)];
            attrs.extend(code(*status));
            attrs.push(KeyValue::new("error.type", *reason));
            (attrs, Status::error(format!("refused ({reason}); tried on another replica")))
        }
        AttemptEnd::Failed { status, reason, message } => {
            let mut attrs = vec![KeyValue::new("brink.gateway.outcome", "failed")];
            attrs.extend(code(*status));
            attrs.push(KeyValue::new("error.type", *reason));
            (attrs, Status::error(message.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pick::Busy;
    use opentelemetry::Value;

    fn get<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
        attrs.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
    }

    fn s(v: &str) -> Value {
        Value::from(v.to_string())
    }

    #[test]
    fn a_request_span_names_the_route_the_model_and_the_affinity() {
        assert_eq!(request_name("POST", "/v1/messages"), "POST /v1/messages");
        let start = request_start("POST", "/v1/messages", Api::Anthropic);
        assert_eq!(get(&start, "http.route"), Some(&s("/v1/messages")));
        assert_eq!(get(&start, "brink.gateway.api"), Some(&Value::from("anthropic")));
        let hit = routed("qwen", &Affinity::Hit);
        assert_eq!((get(&hit, "gen_ai.request.model"), get(&hit, "brink.gateway.affinity")), (Some(&s("qwen")), Some(&Value::from("hit"))));
        assert_eq!(get(&hit, "brink.gateway.affinity_moved"), None);
        let moved = routed("qwen", &Affinity::Moved { from: 1, why: Busy::Queue });
        assert_eq!(get(&moved, "brink.gateway.affinity"), Some(&Value::from("moved")));
        assert_eq!(get(&moved, "brink.gateway.affinity_moved"), Some(&Value::from("queue")));
        assert_eq!(get(&routed("q", &Affinity::None), "brink.gateway.affinity"), Some(&Value::from("none")));
        assert_eq!(rejected(Rejection::KeyLimit).value, Value::from("key_limit"));
    }

    #[test]
    fn a_request_is_an_error_only_for_a_5xx() {
        let (attrs, status) = request_end(200, 2);
        assert_eq!(
            (get(&attrs, "http.response.status_code"), get(&attrs, "brink.gateway.attempts")),
            (Some(&Value::I64(200)), Some(&Value::I64(2)))
        );
        assert_eq!((status, get(&attrs, "error.type")), (Status::Unset, None));
        assert_eq!(request_end(404, 0).1, Status::Unset);
        let (attrs, status) = request_end(502, 3);
        assert!(matches!(status, Status::Error { .. }));
        assert_eq!(get(&attrs, "error.type"), Some(&s("502")));
    }

    #[test]
    fn an_attempt_names_its_replica_and_the_served_name_only_when_renamed() {
        let a = AttemptStart { number: 2, replica: "http://b:8080", model: "m", served_as: "m", affinity_hit: false };
        let attrs = attempt_start(&a);
        assert_eq!(get(&attrs, "brink.gateway.attempt"), Some(&Value::I64(2)));
        assert_eq!(get(&attrs, "brink.gateway.replica"), Some(&s("http://b:8080")));
        assert_eq!(get(&attrs, "brink.gateway.affinity_hit"), Some(&Value::Bool(false)));
        assert_eq!(get(&attrs, "brink.gateway.served_as"), None);
        let renamed = attempt_start(&AttemptStart { served_as: "qwen3-30b", affinity_hit: true, ..a });
        assert_eq!(get(&renamed, "brink.gateway.served_as"), Some(&s("qwen3-30b")));
        assert_eq!(get(&renamed, "brink.gateway.affinity_hit"), Some(&Value::Bool(true)));
    }

    #[test]
    fn an_attempt_ends_answered_retried_or_failed() {
        let (attrs, status) = attempt_end(&AttemptEnd::Answered { status: 200 });
        assert_eq!(get(&attrs, "brink.gateway.outcome"), Some(&Value::from("answered")));
        assert_eq!((get(&attrs, "http.response.status_code"), status), (Some(&Value::I64(200)), Status::Unset));
        // The last replica's own refusal is the answer, and an error of the client span.
        let (attrs, status) = attempt_end(&AttemptEnd::Answered { status: 503 });
        assert_eq!((get(&attrs, "error.type"), matches!(status, Status::Error { .. })), (Some(&s("503")), true));

        let (attrs, status) = attempt_end(&AttemptEnd::Retried { status: Some(503), reason: "http_503" });
        assert_eq!(get(&attrs, "brink.gateway.outcome"), Some(&Value::from("retried")));
        assert_eq!(get(&attrs, "brink.gateway.retry_reason"), Some(&Value::from("http_503")));
        assert_eq!(get(&attrs, "http.response.status_code"), Some(&Value::I64(503)));
        assert!(matches!(status, Status::Error { .. }));
        let (attrs, _) = attempt_end(&AttemptEnd::Retried { status: None, reason: "connect_failed" });
        assert_eq!((get(&attrs, "http.response.status_code"), get(&attrs, "error.type")), (None, Some(&Value::from("connect_failed"))));

        let failed = AttemptEnd::Failed { status: None, reason: "connection_reset", message: "reset by peer".into() };
        let (attrs, status) = attempt_end(&failed);
        assert_eq!(get(&attrs, "brink.gateway.outcome"), Some(&Value::from("failed")));
        assert_eq!(status, Status::error("reset by peer"));
    }
}
