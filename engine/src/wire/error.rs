//! API errors: an HTTP status, a kind, a message naming what was wrong, rendered in the error
//! JSON of whichever API the client spoke.

use serde_json::{Value as Json, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: the body is malformed or a field is invalid.
    InvalidRequest,
    /// 401: missing or wrong API key.
    Authentication,
    /// 404: unknown model or route.
    NotFound,
    /// 413: the body is larger than the server takes.
    RequestTooLarge,
    /// 429: the queue is full; retry later.
    RateLimit,
    /// 503: the engine is restarting or overloaded.
    Overloaded,
    /// 500: a bug or an engine failure.
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault (`messages[1].role`), for OpenAI's `param`.
    pub param: Option<String>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.status, self.openai_type(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        let status = match kind {
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Authentication => 401,
            ErrorKind::NotFound => 404,
            ErrorKind::RequestTooLarge => 413,
            ErrorKind::RateLimit => 429,
            ErrorKind::Overloaded => 503,
            ErrorKind::Internal => 500,
        };
        ApiError { status, kind, message: message.into(), param: None }
    }

    /// A 400 about `field`; the message starts with the field's name.
    pub fn invalid(field: &str, problem: impl std::fmt::Display) -> ApiError {
        ApiError { param: Some(field.to_string()), ..ApiError::new(ErrorKind::InvalidRequest, format!("{field}: {problem}")) }
    }

    /// A 404 for a model this server does not serve, listing the ones it does.
    pub fn unknown_model(requested: &str, served: &[String]) -> ApiError {
        let message = format!("model \"{requested}\" is not served here; available: {}", served.join(", "));
        ApiError { param: Some("model".into()), ..ApiError::new(ErrorKind::NotFound, message) }
    }

    pub fn openai_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest | ErrorKind::RequestTooLarge => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Overloaded => "service_unavailable_error",
            ErrorKind::Internal => "server_error",
        }
    }

    pub fn anthropic_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::RequestTooLarge => "request_too_large",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Overloaded => "overloaded_error",
            ErrorKind::Internal => "api_error",
        }
    }

    /// `{"error": {"message", "type", "param", "code"}}`; `code` repeats the type as a string
    /// the SDKs expose as `err.code`.
    pub fn openai_json(&self) -> Json {
        let code = match self.kind {
            ErrorKind::NotFound if self.param.as_deref() == Some("model") => Json::from("model_not_found"),
            ErrorKind::Authentication => Json::from("invalid_api_key"),
            _ => Json::Null,
        };
        json!({"error": {"message": self.message, "type": self.openai_type(), "param": self.param, "code": code}})
    }

    /// `{"type": "error", "error": {"type", "message"}}`.
    pub fn anthropic_json(&self) -> Json {
        json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}})
    }
}

/// A body that did not parse as the request type: malformed JSON keeps serde's line and column;
/// a wrong type names the field's path (`messages[0].content`).
pub fn from_body_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::new(ErrorKind::InvalidRequest, format!("malformed JSON body: {inner}"));
    }
    if path.is_empty() || path == "." {
        return ApiError::new(ErrorKind::InvalidRequest, format!("invalid request body: {inner}"));
    }
    ApiError::invalid(&path, inner)
}

/// Parses a request body into `T`, with errors from [`from_body_error`].
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(from_body_error)?;
    de.end().map_err(|e| ApiError::new(ErrorKind::InvalidRequest, format!("malformed JSON body: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Body {
        model: String,
        messages: Vec<Msg>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Msg {
        role: String,
    }

    #[test]
    fn malformed_json_keeps_line_and_column() {
        let e = parse_body::<Body>(b"{\n  \"model\": \"m\",\n  \"messages\": [}").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.starts_with("malformed JSON body: "), "{}", e.message);
        assert!(e.message.contains("line 3 column 16"), "{}", e.message);
        let e = parse_body::<Body>(b"{\"model\": \"m\", \"messages\": []} x").unwrap_err();
        assert!(e.message.contains("trailing characters"), "{}", e.message);
        let e = parse_body::<Body>(b"").unwrap_err();
        assert!(e.message.contains("EOF"), "{}", e.message);
    }

    #[test]
    fn wrong_type_names_the_field() {
        let e = parse_body::<Body>(br#"{"model": "m", "messages": [{"role": "user"}, {"role": 7}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].role"));
        assert!(e.message.starts_with("messages[1].role: invalid type: integer `7`, expected a string"), "{}", e.message);
        let e = parse_body::<Body>(br#"{"messages": []}"#).unwrap_err();
        assert!(e.message.contains("missing field `model`"), "{}", e.message);
    }

    #[test]
    fn each_api_shape() {
        let e = ApiError::invalid("temperature", "must be at least 0, got -1");
        assert_eq!(
            e.openai_json(),
            json!({"error": {"message": "temperature: must be at least 0, got -1", "type": "invalid_request_error", "param": "temperature", "code": null}})
        );
        assert_eq!(
            e.anthropic_json(),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "temperature: must be at least 0, got -1"}})
        );
        let e = ApiError::unknown_model("gpt-4", &["qwen3".into()]);
        assert_eq!(e.status, 404);
        assert_eq!(e.openai_json()["error"]["code"], "model_not_found");
        assert_eq!(e.anthropic_json()["error"]["type"], "not_found_error");
        assert_eq!(ApiError::new(ErrorKind::Overloaded, "x").anthropic_json()["error"]["type"], "overloaded_error");
        assert_eq!(ApiError::new(ErrorKind::RateLimit, "x").status, 429);
    }
}
