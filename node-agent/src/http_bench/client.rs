//! The thin HTTP side: the `--url` parsed, one kept-alive HTTP/1.1 connection per simulated
//! user (hyper's client), `GET` for JSON, and a streaming completion clocked as its bytes arrive.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use thiserror::Error;
use tokio::net::TcpStream;

use super::sse::{Chunk, SseDecoder, classify, excerpt};
use super::stats::{RequestSample, RequestTimer};

/// Where the server is: `http://HOST[:PORT][/PREFIX]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL as reported in messages, without a trailing `/` or `/v1`.
    pub base: String,
    /// `host:port` to connect to.
    pub addr: String,
    /// The `Host` header.
    pub host: String,
    /// Path before `/v1/...` (empty, or `/something`).
    pub prefix: String,
}

impl Endpoint {
    /// The full URL of an API path, for messages.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// A `--url` that cannot be benchmarked; every message names the URL and the flag.
#[derive(Debug, Error)]
pub enum UrlError {
    #[error("--url {url}: https is not supported (plain HTTP/1.1 only); benchmark the server's own http port")]
    Https { url: String },
    #[error("--url {url}: unsupported scheme `{scheme}`; expected http://HOST:PORT")]
    Scheme { url: String, scheme: String },
    #[error("--url {url}: expected http://HOST:PORT")]
    NoScheme { url: String },
    #[error("--url {url}: no host")]
    NoHost { url: String },
    #[error("--url {url}: credentials in the URL are not supported; use --api-key")]
    Credentials { url: String },
    #[error("--url {url}: `{port}` is not a port number")]
    Port { url: String, port: String },
    #[error("--url {url}: a query or fragment has no place in the server's base URL")]
    QueryOrFragment { url: String },
}

/// Parses `--url`. A trailing `/v1` is accepted (the OpenAI clients' base URL) and dropped.
pub fn endpoint(url: &str) -> Result<Endpoint, UrlError> {
    let u = || url.to_string();
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some(("https", _)) => return Err(UrlError::Https { url: u() }),
        Some((scheme, _)) => return Err(UrlError::Scheme { url: u(), scheme: scheme.to_string() }),
        None => return Err(UrlError::NoScheme { url: u() }),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.is_empty() {
        return Err(UrlError::NoHost { url: u() });
    }
    if authority.contains('@') {
        return Err(UrlError::Credentials { url: u() });
    }
    // The port follows the last `:` outside an IPv6 literal's brackets.
    let port_colon = authority.rfind(':').filter(|&i| !authority[i..].contains(']'));
    let (host, port) = match port_colon {
        Some(i) => {
            let port = &authority[i + 1..];
            (&authority[..i], port.parse::<u16>().map_err(|_| UrlError::Port { url: u(), port: port.to_string() })?)
        }
        None => (authority, 80),
    };
    if host.is_empty() || host == "[]" {
        return Err(UrlError::NoHost { url: u() });
    }
    let mut prefix = path.trim_end_matches('/');
    prefix = prefix.strip_suffix("/v1").unwrap_or(prefix);
    if prefix.contains(['?', '#']) {
        return Err(UrlError::QueryOrFragment { url: u() });
    }
    Ok(Endpoint {
        base: format!("http://{authority}{prefix}"),
        addr: format!("{host}:{port}"),
        host: authority.to_string(),
        prefix: prefix.to_string(),
    })
}

/// How long a connection may take to open before the server counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A request that failed, typed by the step that failed; every message names the URL.
#[derive(Debug, Error)]
pub enum HttpError {
    #[error("cannot reach {base}: {source}")]
    Connect {
        base: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach {base}: no connection within {} s", CONNECT_TIMEOUT.as_secs())]
    ConnectTimeout { base: String },
    #[error("{base}: HTTP handshake failed: {source}")]
    Handshake {
        base: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{url}: cannot build the request: {source}")]
    Build {
        url: String,
        #[source]
        source: hyper::http::Error,
    },
    /// Sending the request or reading the answer's head failed. `retried`: it was sent again on
    /// a new connection after the first one closed before answering, and failed again.
    #[error("{url}: {source}{}", if *retried { " (also when sent again on a new connection)" } else { "" })]
    Exchange {
        url: String,
        retried: bool,
        #[source]
        source: hyper::Error,
    },
    #[error("{url}: reading the answer: {source}")]
    Body {
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{url}: {status}{hint}: {said}")]
    Status { url: String, status: StatusCode, hint: &'static str, said: String },
    #[error("{url}: the answer is not JSON ({source}): {excerpt}")]
    NotJson {
        url: String,
        #[source]
        source: serde_json::Error,
        excerpt: String,
    },
    #[error("{url}: no usage.prompt_tokens in the answer: {excerpt}")]
    NoPromptTokens { url: String, excerpt: String },
}

impl HttpError {
    /// A non-2xx answer, with the hint a 401 or a 404 needs and what the server said.
    pub fn status(url: &str, status: StatusCode, body: &str) -> HttpError {
        let said = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| excerpt(body));
        let hint = match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => " (pass the server's key with --api-key)",
            StatusCode::NOT_FOUND => " (is this an OpenAI-compatible server?)",
            _ => "",
        };
        HttpError::Status { url: url.to_string(), status, hint, said }
    }
}

/// A request as data, so that it can be built again for a second connection.
struct Req<'a> {
    method: Method,
    path: &'a str,
    body: Option<&'a Value>,
    accept: &'static str,
    api_key: Option<&'a str>,
}

impl Req<'_> {
    fn build(&self, ep: &Endpoint) -> Result<Request<Full<Bytes>>, HttpError> {
        let mut b =
            Request::builder().method(self.method.clone()).uri(format!("{}{}", ep.prefix, self.path)).header(header::HOST, &ep.host);
        if let Some(k) = self.api_key {
            b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let body = match self.body {
            Some(v) => {
                b = b.header(header::CONTENT_TYPE, "application/json").header(header::ACCEPT, self.accept);
                Bytes::from(v.to_string())
            }
            None => Bytes::new(),
        };
        b.body(Full::new(body)).map_err(|source| HttpError::Build { url: ep.url(self.path), source })
    }
}

/// One HTTP/1.1 connection, used for one request at a time and kept alive between them.
///
/// A server may close a kept-alive connection whenever it is idle, without announcing it
/// (llama.cpp's `llama-server` closes it after every streamed answer): the close can reach the
/// client after its next request left. So a request is sent again, once, on a new connection
/// when the connection closed before any byte of the answer arrived and either the request never
/// left (hyper hands it back) or the connection had already carried an answer. Every request
/// here is a read of the model (a sizing or measured completion, a GET): the server kept
/// nothing of one it never answered. A fresh connection that closes after taking the request is
/// the server's failure and is reported, not retried.
pub struct Conn {
    ep: Endpoint,
    send: http1::SendRequest<Full<Bytes>>,
    /// Answers (response heads) this connection has carried.
    answered: u64,
}

impl Conn {
    pub async fn open(ep: &Endpoint) -> Result<Conn, HttpError> {
        let base = || ep.base.clone();
        let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&ep.addr)).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(source)) => return Err(HttpError::Connect { base: base(), source }),
            Err(_) => return Err(HttpError::ConnectTimeout { base: base() }),
        };
        // Small SSE chunks must not wait for Nagle on the request side either.
        tcp.set_nodelay(true).map_err(|source| HttpError::Connect { base: base(), source })?;
        let (send, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(|source| HttpError::Handshake { base: base(), source })?;
        tokio::spawn(async move {
            // Ends when the server closes or the sender is dropped; a failure shows on the next request.
            let _ = conn.await;
        });
        Ok(Conn { ep: ep.clone(), send, answered: 0 })
    }

    /// False once the server closed it (then a new one is opened).
    pub fn usable(&self) -> bool {
        !self.send.is_closed()
    }

    /// Sends `req` and returns the answer's head, sending it again once on a new connection
    /// where [`Conn`] says a closed connection allows it.
    async fn exchange(&mut self, req: &Req<'_>) -> Result<Response<Incoming>, HttpError> {
        let url = self.ep.url(req.path);
        let mut retried = false;
        loop {
            let reused = self.answered > 0;
            let request = req.build(&self.ep)?;
            let (error, unsent) = match self.send.ready().await {
                // Closed before the request could be handed over: it never left.
                Err(e) => (e, true),
                Ok(()) => match self.send.try_send_request(request).await {
                    Ok(resp) => {
                        self.answered += 1;
                        return Ok(resp);
                    }
                    Err(mut e) => {
                        let unsent = e.take_message().is_some();
                        (e.into_error(), unsent)
                    }
                },
            };
            if retried || !(unsent || (reused && closed_before_answer(&error))) {
                return Err(HttpError::Exchange { url, retried, source: error });
            }
            retried = true;
            *self = Conn::open(&self.ep).await?;
        }
    }
}

/// The connection ended before any byte of an answer: closed by the peer, reset, or cut
/// before the message completed.
fn closed_before_answer(e: &hyper::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(io.kind(), BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof);
        }
        source = s.source();
    }
    false
}

/// `GET path` and its JSON; non-2xx answers are errors naming the URL and what the server said.
pub async fn fetch_json(ep: &Endpoint, path: &str, api_key: Option<&str>) -> Result<Value, HttpError> {
    let url = ep.url(path);
    let mut conn = Conn::open(ep).await?;
    let req = Req { method: Method::GET, path, body: None, accept: "application/json", api_key };
    let resp = conn.exchange(&req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|source| HttpError::Body { url: url.clone(), source })?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        return Err(HttpError::status(&url, status, &text));
    }
    serde_json::from_str(&text).map_err(|source| HttpError::NotJson { url, source, excerpt: excerpt(&text) })
}

/// How a streaming request ended.
#[derive(Debug)]
pub enum StreamEnd {
    Done(RequestSample),
    /// A non-2xx answer; `retry_after`: it carried a `Retry-After` header.
    Status {
        status: StatusCode,
        retry_after: bool,
        body: String,
    },
    /// A 2xx answer that is not an event stream.
    NotStreaming {
        content_type: String,
        body: String,
    },
    /// The stream broke, reported an error, or ended without its usage.
    Broken(String),
    /// The request could not be sent or its answer not read (the error names the URL).
    Connection(HttpError),
}

/// How a stream without its usage chunk is reported (the calibration falls back on it).
pub const NO_USAGE: &str = "the stream ended without a usage chunk";

/// `usage.prompt_tokens` of a non-streaming completion (`body` without `stream`).
pub async fn prompt_tokens_of(conn: &mut Conn, body: &Value, api_key: Option<&str>) -> Result<u64, HttpError> {
    let path = "/v1/completions";
    let url = conn.ep.url(path);
    let req = Req { method: Method::POST, path, body: Some(body), accept: "application/json", api_key };
    let resp = conn.exchange(&req).await?;
    let status = resp.status();
    let text = resp.into_body().collect().await.map_err(|source| HttpError::Body { url: url.clone(), source })?.to_bytes();
    let text = String::from_utf8_lossy(&text);
    if !status.is_success() {
        return Err(HttpError::status(&url, status, &text));
    }
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["usage"]["prompt_tokens"].as_u64())
        .ok_or_else(|| HttpError::NoPromptTokens { url, excerpt: excerpt(&text) })
}

/// POSTs a streaming completion and clocks it: text chunks by the time their bytes arrived. A
/// server that streams no usage chunk (llama-cpp-python's) counts as `known_prompt_tokens` (the
/// calibration's count of this prompt length) and one generated token per text chunk; without
/// `known_prompt_tokens` that stream is `Broken`.
pub async fn stream_completion(conn: &mut Conn, body: &Value, api_key: Option<&str>, known_prompt_tokens: Option<u64>) -> StreamEnd {
    let req = Req { method: Method::POST, path: "/v1/completions", body: Some(body), accept: "text/event-stream", api_key };
    let t0 = Instant::now();
    let resp = match conn.exchange(&req).await {
        Ok(r) => r,
        Err(e) => return StreamEnd::Connection(e),
    };
    let status = resp.status();
    let content_type = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let retry_after = resp.headers().contains_key(header::RETRY_AFTER);
    let mut body = resp.into_body();
    if !status.is_success() || !content_type.starts_with("text/event-stream") {
        let text = match body.collect().await {
            Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
            Err(source) => return StreamEnd::Connection(HttpError::Body { url: conn.ep.url(req.path), source }),
        };
        return if status.is_success() {
            StreamEnd::NotStreaming { content_type, body: text }
        } else {
            StreamEnd::Status { status, retry_after, body: text }
        };
    }
    let mut decoder = SseDecoder::default();
    let mut timer = RequestTimer::default();
    let mut usage = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return StreamEnd::Broken(format!("the stream broke: {e}")),
        };
        let Some(data) = frame.data_ref() else { continue };
        let at = t0.elapsed().as_secs_f64();
        for event in decoder.push(data) {
            match classify(&event) {
                Ok(Chunk::Text) => timer.text_at(at),
                Ok(Chunk::Usage { prompt_tokens, completion_tokens }) => usage = Some((prompt_tokens, completion_tokens)),
                Ok(Chunk::Other | Chunk::Done) => {}
                Ok(Chunk::Error(msg)) => return StreamEnd::Broken(format!("the server reported an error in the stream: {msg}")),
                Err(e) => return StreamEnd::Broken(e.to_string()),
            }
        }
    }
    match (usage, known_prompt_tokens) {
        (Some((p, c)), _) => StreamEnd::Done(timer.finish(t0.elapsed().as_secs_f64(), p, c)),
        (None, Some(p)) => {
            let chunks = timer.text_chunks();
            StreamEnd::Done(timer.finish(t0.elapsed().as_secs_f64(), p, chunks))
        }
        (None, None) => StreamEnd::Broken(format!("{NO_USAGE} (stream_options.include_usage)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_urls() {
        let cases = [
            ("http://127.0.0.1:8000", "http://127.0.0.1:8000", "127.0.0.1:8000", ""),
            ("http://localhost:8000/", "http://localhost:8000", "localhost:8000", ""),
            ("http://localhost:8000/v1", "http://localhost:8000", "localhost:8000", ""),
            ("http://gw.local/brink/v1/", "http://gw.local/brink", "gw.local:80", "/brink"),
            ("http://[::1]:9000", "http://[::1]:9000", "[::1]:9000", ""),
            ("http://[::1]", "http://[::1]", "[::1]:80", ""),
        ];
        for (url, base, addr, prefix) in cases {
            let ep = endpoint(url).unwrap();
            assert_eq!((ep.base.as_str(), ep.addr.as_str(), ep.prefix.as_str()), (base, addr, prefix), "{url}");
        }
        assert_eq!(endpoint("http://h:1/v1").unwrap().url("/v1/models"), "http://h:1/v1/models");
    }

    #[test]
    fn refuses_bad_urls_naming_them() {
        for (url, needle) in [
            ("https://h:443", "https is not supported"),
            ("ftp://h", "unsupported scheme"),
            ("localhost:8000", "expected http://"),
            ("http://:8000", "no host"),
            ("http://h:port", "`port` is not a port"),
            ("http://h:70000", "not a port"),
            ("http://u:p@h:1", "--api-key"),
            ("http://h:1/x?y=1", "query"),
        ] {
            let e = endpoint(url).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--url {url}:")) && e.contains(needle), "{url}: {e}");
        }
    }

    #[test]
    fn status_errors_say_what_to_do() {
        let e =
            HttpError::status("http://h:1/v1/models", StatusCode::UNAUTHORIZED, r#"{"error":{"message":"missing API key"}}"#).to_string();
        assert_eq!(e, "http://h:1/v1/models: 401 Unauthorized (pass the server's key with --api-key): missing API key");
        let e = HttpError::status("http://h:1/v1/completions", StatusCode::BAD_REQUEST, "plain words").to_string();
        assert_eq!(e, "http://h:1/v1/completions: 400 Bad Request: plain words");
    }
}
