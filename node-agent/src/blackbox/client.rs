//! The engine seen through its HTTP API: one fresh HTTP/1.1 connection per request (a
//! connection the engine dropped never carries the next case), each request under a deadline.
//! What the engine offers besides `/v1/completions` is discovered: a health endpoint, a
//! tokenizer endpoint, its context, log-probabilities.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Method, Request, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

use super::verdict::Answer;
use crate::http_bench::client::Endpoint;
use crate::http_bench::sse::excerpt;

/// How a request went, before its body is judged.
#[derive(Debug)]
pub enum Sent {
    Answered {
        status: u16,
        body: String,
    },
    Timeout,
    /// Refused, reset, or closed before the whole answer.
    Dropped(Dropped),
}

/// Why a request got no whole answer: the connection or the exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum Dropped {
    #[error("cannot reach {base}: {source}")]
    Unreachable {
        base: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set TCP_NODELAY: {0}")]
    Socket(#[source] std::io::Error),
    #[error("HTTP handshake failed: {0}")]
    Handshake(#[source] hyper::Error),
    #[error("cannot build the request: {0}")]
    Request(#[source] hyper::http::Error),
    /// Refused or reset while the request was sent or the answer's head awaited.
    #[error("{0}")]
    Exchange(#[source] hyper::Error),
    #[error("the answer broke off: {0}")]
    BrokeOff(#[source] hyper::Error),
}

/// A request the engine did not answer as it should, naming the URL.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("{url}: the answer is not JSON ({source}): {excerpt}")]
    NotJson {
        url: String,
        #[source]
        source: serde_json::Error,
        excerpt: String,
    },
    /// A status outside 2xx; `said`: the error's message, else an excerpt of the body.
    #[error("{url}: HTTP {status}: {said}")]
    Status { url: String, status: u16, said: String },
    #[error("{url}: no answer within {:.0} s", .after.as_secs_f64())]
    Timeout { url: String, after: Duration },
    #[error("{url}: {source}")]
    Dropped {
        url: String,
        #[source]
        source: Dropped,
    },
    #[error("{url}: no `tokens` or `count` in the answer: {excerpt}")]
    NoCount { url: String, excerpt: String },
}

impl AnswerError {
    /// `sent`, which was not a 2xx answer, to `url` under `deadline`; `said` reads an error body.
    fn failed(url: String, sent: Sent, deadline: Duration, said: fn(&str) -> String) -> AnswerError {
        match sent {
            Sent::Answered { status, body } => AnswerError::Status { url, status, said: said(&body) },
            Sent::Timeout => AnswerError::Timeout { url, after: deadline },
            Sent::Dropped(source) => AnswerError::Dropped { url, source },
        }
    }
}

/// The engine and what every request carries.
#[derive(Clone, Debug)]
pub struct Engine {
    pub endpoint: Endpoint,
    pub model: String,
    pub api_key: Option<String>,
    /// Ask for log-probabilities (checked for non-finite values).
    pub logprobs: bool,
}

impl Engine {
    /// `method path` with an optional JSON body, under `deadline`.
    pub async fn send(&self, method: Method, path: &str, body: Option<&Value>, deadline: Duration) -> Sent {
        match tokio::time::timeout(deadline, self.send_now(method, path, body)).await {
            Ok(Ok((status, body))) => Sent::Answered { status, body },
            Ok(Err(e)) => Sent::Dropped(e),
            Err(_) => Sent::Timeout,
        }
    }

    async fn send_now(&self, method: Method, path: &str, body: Option<&Value>) -> Result<(u16, String), Dropped> {
        let ep = &self.endpoint;
        let tcp = TcpStream::connect(&ep.addr).await.map_err(|source| Dropped::Unreachable { base: ep.base.clone(), source })?;
        tcp.set_nodelay(true).map_err(Dropped::Socket)?;
        let (mut send, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(Dropped::Handshake)?;
        let mut b = Request::builder().method(method).uri(format!("{}{path}", ep.prefix)).header(header::HOST, &ep.host);
        if let Some(k) = &self.api_key {
            b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let bytes = match body {
            Some(v) => {
                b = b.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(v.to_string())
            }
            None => Bytes::new(),
        };
        let req = b.body(Full::new(bytes)).map_err(Dropped::Request)?;
        let exchange = async move {
            let resp = send.send_request(req).await.map_err(Dropped::Exchange)?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map_err(Dropped::BrokeOff)?.to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        };
        // The connection is driven here, not in a task of its own: when the deadline drops this
        // future the socket closes with it, and a hung request holds nothing of the engine's.
        tokio::pin!(exchange, conn);
        tokio::select! {
            r = &mut exchange => r,
            // Closed by the engine: what was read may still complete the answer, else it errs.
            _ = &mut conn => exchange.await,
        }
    }

    /// `GET path` as JSON: `Ok(None)` for a 404 (the engine has no such endpoint).
    pub async fn get_json(&self, path: &str, deadline: Duration) -> Result<Option<Value>, AnswerError> {
        let url = self.endpoint.url(path);
        match self.send(Method::GET, path, None, deadline).await {
            Sent::Answered { status: 404, .. } => Ok(None),
            Sent::Answered { status, body } if (200..300).contains(&status) => {
                serde_json::from_str(&body).map(Some).map_err(|source| AnswerError::NotJson { url, source, excerpt: excerpt(&body) })
            }
            other => Err(AnswerError::failed(url, other, deadline, excerpt)),
        }
    }

    /// The completion request: greedy, not streamed, `max_tokens` generated.
    pub fn completion_body(&self, prompt: &str, max_tokens: u64) -> Value {
        let mut body = json!({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": false});
        if self.logprobs {
            body["logprobs"] = json!(1);
        }
        body
    }

    /// One completion of `prompt` under `deadline`.
    pub async fn complete(&self, prompt: &str, max_tokens: u64, deadline: Duration) -> Answer {
        let t0 = Instant::now();
        match self.send(Method::POST, "/v1/completions", Some(&self.completion_body(prompt, max_tokens)), deadline).await {
            Sent::Answered { status, body } if (200..300).contains(&status) => parse_completion(&body, self.logprobs),
            Sent::Answered { status, body } => Answer::Status { status, body: said(&body) },
            Sent::Timeout => Answer::Timeout { after_s: t0.elapsed().as_secs_f64() },
            Sent::Dropped(e) => Answer::Dropped(e.to_string()),
        }
    }
}

/// The message of an OpenAI error body, else an excerpt of the body.
pub fn said(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            let e = &v["error"];
            e["message"].as_str().or_else(|| e.as_str()).or_else(|| v["detail"].as_str()).map(str::to_string)
        })
        .unwrap_or_else(|| excerpt(body))
}

/// A `/v1/completions` answer judged as an OpenAI completion.
pub fn parse_completion(body: &str, logprobs: bool) -> Answer {
    let v: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        // NaN and infinity are not JSON: an engine that prints them fails here.
        Err(e) => return Answer::Malformed(format!("the answer is not JSON ({e}): {}", excerpt(body))),
    };
    let Some(choice) = v["choices"].get(0) else { return Answer::Malformed(format!("no `choices[0]`: {}", excerpt(body))) };
    let Some(text) = choice["text"].as_str() else { return Answer::Malformed(format!("no `choices[0].text`: {}", excerpt(body))) };
    let usage = &v["usage"];
    let (Some(prompt_tokens), Some(completion_tokens)) = (usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()) else {
        return Answer::Malformed(format!("no `usage.prompt_tokens` and `usage.completion_tokens`: {}", excerpt(body)));
    };
    let finite = if logprobs {
        choice["logprobs"]["token_logprobs"].as_array().map(|lp| lp.iter().all(|x| x.as_f64().is_some_and(f64::is_finite)))
    } else {
        None
    };
    Answer::Completion { prompt_tokens, completion_tokens, text_chars: text.chars().count(), finite }
}

/// A tokenizer endpoint the engine has, and how to read its count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerEndpoint {
    pub path: &'static str,
}

impl TokenizerEndpoint {
    /// The endpoints tried, in order: vLLM's and llama.cpp server's `/tokenize`, then
    /// llama-cpp-python's `/extras/tokenize`.
    pub const KNOWN: [TokenizerEndpoint; 2] = [TokenizerEndpoint { path: "/tokenize" }, TokenizerEndpoint { path: "/extras/tokenize" }];

    pub fn body(&self, model: &str, text: &str) -> Value {
        match self.path {
            // vLLM reads `prompt`, llama.cpp's server `content` (`add_special`: a BOS as a prompt gets).
            "/tokenize" => json!({"model": model, "prompt": text, "content": text, "add_special": true}),
            _ => json!({"model": model, "input": text}),
        }
    }

    /// The count in an answer: `count`, else the length of `tokens`.
    pub fn count(answer: &Value) -> Option<u64> {
        answer["count"].as_u64().or_else(|| answer["tokens"].as_array().map(|t| t.len() as u64))
    }

    pub async fn tokens(&self, engine: &Engine, text: &str, deadline: Duration) -> Result<u64, AnswerError> {
        let url = engine.endpoint.url(self.path);
        match engine.send(Method::POST, self.path, Some(&self.body(&engine.model, text)), deadline).await {
            Sent::Answered { status, body } if (200..300).contains(&status) => serde_json::from_str::<Value>(&body)
                .ok()
                .as_ref()
                .and_then(Self::count)
                .ok_or_else(|| AnswerError::NoCount { url, excerpt: excerpt(&body) }),
            other => Err(AnswerError::failed(url, other, deadline, said)),
        }
    }
}

/// The context the engine says it runs with, and where it said so: brink's `GET /engine`,
/// vLLM's `max_model_len` in `/v1/models`, llama.cpp server's `GET /props`.
pub fn context_of(engine_status: Option<&Value>, models: &Value, model: &str, props: Option<&Value>) -> Option<(u64, String)> {
    if let Some(c) = engine_status.and_then(|v| v["context"].as_u64()) {
        return Some((c, "GET /engine".into()));
    }
    let listed = models["data"].as_array().and_then(|d| d.iter().find(|m| m["id"].as_str() == Some(model)));
    if let Some(c) = listed.and_then(|m| m["max_model_len"].as_u64()) {
        return Some((c, "GET /v1/models (max_model_len)".into()));
    }
    let p = props?;
    let n = p["default_generation_settings"]["n_ctx"].as_u64().or_else(|| p["n_ctx"].as_u64())?;
    Some((n, "GET /props (n_ctx)".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_are_judged_as_openai_answers() {
        let ok =
            r#"{"choices":[{"text":" hi","logprobs":{"token_logprobs":[-0.5,-1.0]}}],"usage":{"prompt_tokens":7,"completion_tokens":2}}"#;
        assert_eq!(
            parse_completion(ok, true),
            Answer::Completion { prompt_tokens: 7, completion_tokens: 2, text_chars: 3, finite: Some(true) }
        );
        assert!(matches!(parse_completion(ok, false), Answer::Completion { finite: None, .. }));
        let nulls = r#"{"choices":[{"text":"x","logprobs":{"token_logprobs":[null]}}],"usage":{"prompt_tokens":7,"completion_tokens":1}}"#;
        assert!(matches!(parse_completion(nulls, true), Answer::Completion { finite: Some(false), .. }));
        let no_lp = r#"{"choices":[{"text":"x","logprobs":null}],"usage":{"prompt_tokens":7,"completion_tokens":1}}"#;
        assert!(matches!(parse_completion(no_lp, true), Answer::Completion { finite: None, .. }));
        for (body, needle) in [
            (r#"{"choices":[{"text":"x","logprobs":{"token_logprobs":[NaN]}}]}"#, "not JSON"),
            ("<html>hello</html>", "not JSON"),
            (r#"{"object":"list"}"#, "no `choices[0]`"),
            (r#"{"choices":[{"message":{}}]}"#, "no `choices[0].text`"),
            (r#"{"choices":[{"text":"x"}]}"#, "usage.prompt_tokens"),
        ] {
            match parse_completion(body, true) {
                Answer::Malformed(e) => assert!(e.contains(needle), "{body}: {e}"),
                a => panic!("{body}: {a:?}"),
            }
        }
    }

    #[test]
    fn requests_that_fail_name_the_url() {
        let url = "http://engine:8000/tokenize".to_string();
        let minute = Duration::from_secs(60);
        let boom = Sent::Answered { status: 500, body: r#"{"error":{"message":"boom"}}"#.into() };
        let e = AnswerError::failed(url.clone(), boom, minute, said);
        assert!(matches!(e, AnswerError::Status { status: 500, .. }), "{e:?}");
        assert_eq!(e.to_string(), "http://engine:8000/tokenize: HTTP 500: boom");
        let e = AnswerError::failed(url.clone(), Sent::Timeout, minute, said);
        assert_eq!(e.to_string(), "http://engine:8000/tokenize: no answer within 60 s");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let sent = Sent::Dropped(Dropped::Unreachable { base: "http://engine:8000".into(), source: refused });
        let e = AnswerError::failed(url, sent, minute, said);
        assert!(e.to_string().starts_with("http://engine:8000/tokenize: cannot reach http://engine:8000: "), "{e}");
        assert!(std::error::Error::source(&e).is_some_and(|s| s.to_string().starts_with("cannot reach")), "{e:?}");
    }

    #[test]
    fn errors_say_what_the_engine_said() {
        assert_eq!(said(r#"{"error":{"message":"too long"}}"#), "too long");
        assert_eq!(said(r#"{"error":"worker died"}"#), "worker died");
        assert_eq!(said(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(said("plain"), "plain");
    }

    #[test]
    fn finds_the_context_where_each_engine_tells_it() {
        let models = json!({"data": [{"id": "m", "max_model_len": 4096}]});
        assert_eq!(context_of(Some(&json!({"context": 2048})), &models, "m", None), Some((2048, "GET /engine".into())));
        assert_eq!(context_of(None, &models, "m", None).unwrap().0, 4096);
        assert_eq!(context_of(None, &models, "other", None), None);
        let props = json!({"default_generation_settings": {"n_ctx": 1024}});
        assert_eq!(context_of(None, &json!({"data": []}), "m", Some(&props)), Some((1024, "GET /props (n_ctx)".into())));
        assert_eq!(context_of(None, &json!({"data": []}), "m", Some(&json!({"n_ctx": 512}))).unwrap().0, 512);
    }

    #[test]
    fn tokenizer_answers_of_each_engine_are_counted() {
        assert_eq!(TokenizerEndpoint::count(&json!({"count": 5, "tokens": [1, 2, 3, 4, 5]})), Some(5));
        assert_eq!(TokenizerEndpoint::count(&json!({"tokens": [1, 2, 3]})), Some(3));
        assert_eq!(TokenizerEndpoint::count(&json!({"detail": "x"})), None);
        let b = TokenizerEndpoint::KNOWN[1].body("m", "hi");
        assert_eq!(b, json!({"model": "m", "input": "hi"}));
    }
}
