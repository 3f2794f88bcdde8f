//! Errors the gateway answers itself, in the shape of the API the client spoke: OpenAI's
//! `{"error": {message, type, param, code}}` or Anthropic's `{"type": "error", "error": {type, message}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value as Json, json};

/// Which API a request spoke, from its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    OpenAi,
    Anthropic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// 400: the body is not JSON, or has no model.
    BadRequest,
    /// 401: a key is missing or wrong.
    Unauthorized,
    /// 404: no replica serves the model, or no such route.
    NotFound,
    /// 413: the body is larger than the gateway takes.
    TooLarge,
    /// 429: the key has too many requests in flight.
    RateLimited,
    /// 502: no replica could be reached.
    BadGateway,
    /// 503: replicas serve the model but none is healthy now.
    Unavailable,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayError {
    pub kind: Kind,
    pub message: String,
    /// The request field at fault, for OpenAI's `param`.
    pub param: Option<&'static str>,
    pub retry_after: Option<u32>,
}

impl GatewayError {
    pub fn new(kind: Kind, message: impl Into<String>) -> GatewayError {
        GatewayError { kind, message: message.into(), param: None, retry_after: None }
    }

    pub fn status(&self) -> StatusCode {
        match self.kind {
            Kind::BadRequest => StatusCode::BAD_REQUEST,
            Kind::Unauthorized => StatusCode::UNAUTHORIZED,
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Kind::BadGateway => StatusCode::BAD_GATEWAY,
            Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn body(&self, api: Api) -> Json {
        match api {
            Api::OpenAi => {
                let (kind, code) = match self.kind {
                    // OpenAI's own answer to an unknown model: an invalid request, code model_not_found.
                    Kind::NotFound if self.param == Some("model") => ("invalid_request_error", json!("model_not_found")),
                    Kind::NotFound => ("not_found_error", Json::Null),
                    Kind::BadRequest | Kind::TooLarge => ("invalid_request_error", Json::Null),
                    Kind::Unauthorized => ("authentication_error", json!("invalid_api_key")),
                    Kind::RateLimited => ("rate_limit_error", Json::Null),
                    Kind::BadGateway => ("server_error", Json::Null),
                    Kind::Unavailable => ("service_unavailable_error", Json::Null),
                };
                json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": code}})
            }
            Api::Anthropic => {
                let kind = match self.kind {
                    Kind::BadRequest => "invalid_request_error",
                    Kind::Unauthorized => "authentication_error",
                    Kind::NotFound => "not_found_error",
                    Kind::TooLarge => "request_too_large",
                    Kind::RateLimited => "rate_limit_error",
                    Kind::BadGateway => "api_error",
                    Kind::Unavailable => "overloaded_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": self.message}})
            }
        }
    }

    pub fn response(&self, api: Api) -> Response {
        let mut resp = (self.status(), [(header::CONTENT_TYPE, "application/json")], self.body(api).to_string()).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
