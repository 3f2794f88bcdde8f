//! The thin HTTP side: the `--url` parsed, one kept-alive HTTP/1.1 connection per simulated
//! user (hyper's client), `GET` for JSON, and a streaming completion clocked as its bytes arrive.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
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

/// Parses `--url`. A trailing `/v1` is accepted (the OpenAI clients' base URL) and dropped.
pub fn parse_url(url: &str) -> Result<Endpoint, String> {
    let bad = |why: &str| format!("--url {url}: {why}");
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some(("https", _)) => return Err(bad("https is not supported (plain HTTP/1.1 only); benchmark the server's own http port")),
        Some((scheme, _)) => return Err(bad(&format!("unsupported scheme `{scheme}`; expected http://HOST:PORT"))),
        None => return Err(bad("expected http://HOST:PORT")),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    if authority.contains('@') {
        return Err(bad("credentials in the URL are not supported; use --api-key"));
    }
    // The port follows the last `:` outside an IPv6 literal's brackets.
    let port_colon = authority.rfind(':').filter(|&i| !authority[i..].contains(']'));
    let (host, port) = match port_colon {
        Some(i) => {
            let port = &authority[i + 1..];
            (&authority[..i], port.parse::<u16>().map_err(|_| bad(&format!("`{port}` is not a port number")))?)
        }
        None => (authority, 80),
    };
    if host.is_empty() || host == "[]" {
        return Err(bad("no host"));
    }
    let mut prefix = path.trim_end_matches('/');
    prefix = prefix.strip_suffix("/v1").unwrap_or(prefix);
    if prefix.contains(['?', '#']) {
        return Err(bad("a query or fragment has no place in the server's base URL"));
    }
    Ok(Endpoint {
        base: format!("http://{authority}{prefix}"),
        addr: format!("{host}:{port}"),
        host: authority.to_string(),
        prefix: prefix.to_string(),
    })
}

/// One HTTP/1.1 connection, used for one request at a time.
pub struct Conn {
    send: http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    pub async fn open(ep: &Endpoint) -> Result<Conn, String> {
        let tcp = TcpStream::connect(&ep.addr).await.map_err(|e| format!("cannot reach {}: {e}", ep.base))?;
        // Small SSE chunks must not wait for Nagle on the request side either.
        tcp.set_nodelay(true).map_err(|e| format!("{}: {e}", ep.base))?;
        let (send, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(|e| format!("{}: HTTP handshake failed: {e}", ep.base))?;
        tokio::spawn(async move {
            // Ends when the server closes or the sender is dropped; a failure shows on the next request.
            let _ = conn.await;
        });
        Ok(Conn { send })
    }

    /// False once the server closed it (then a new one is opened).
    pub fn usable(&self) -> bool {
        !self.send.is_closed()
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, String> {
        self.send.ready().await.map_err(|e| e.to_string())?;
        self.send.send_request(req).await.map_err(|e| e.to_string())
    }
}

fn request(ep: &Endpoint, method: Method, path: &str, body: Option<&Value>, api_key: Option<&str>) -> Result<Request<Full<Bytes>>, String> {
    let mut b = Request::builder().method(method).uri(format!("{}{path}", ep.prefix)).header(header::HOST, &ep.host);
    if let Some(k) = api_key {
        b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let body = match body {
        Some(v) => {
            b = b.header(header::CONTENT_TYPE, "application/json").header(header::ACCEPT, "text/event-stream");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    b.body(Full::new(body)).map_err(|e| format!("{}: {e}", ep.url(path)))
}

/// `GET path` and its JSON; non-2xx answers are errors naming the URL and what the server said.
pub async fn get_json(ep: &Endpoint, path: &str, api_key: Option<&str>) -> Result<Value, String> {
    let url = ep.url(path);
    let mut conn = Conn::open(ep).await?;
    let resp = conn.send(request(ep, Method::GET, path, None, api_key)?).await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| format!("{url}: {e}"))?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        return Err(status_error(&url, status, &text));
    }
    serde_json::from_str(&text).map_err(|e| format!("{url}: the answer is not JSON ({e}): {}", excerpt(&text)))
}

/// A non-2xx answer as a message, with the hint a 401 needs.
pub fn status_error(url: &str, status: StatusCode, body: &str) -> String {
    let said = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| excerpt(body));
    let hint = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => " (pass the server's key with --api-key)",
        StatusCode::NOT_FOUND => " (is this an OpenAI-compatible server?)",
        _ => "",
    };
    format!("{url}: {status}{hint}: {said}")
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
    /// The request could not be sent or its answer not read.
    Connection(String),
}

/// How a stream without its usage chunk is reported (the calibration falls back on it).
pub const NO_USAGE: &str = "the stream ended without a usage chunk";

/// `usage.prompt_tokens` of a non-streaming completion (`body` without `stream`).
pub async fn prompt_tokens_of(conn: &mut Conn, ep: &Endpoint, body: &Value, api_key: Option<&str>) -> Result<u64, String> {
    let url = ep.url("/v1/completions");
    let mut req = request(ep, Method::POST, "/v1/completions", Some(body), api_key)?;
    req.headers_mut().insert(header::ACCEPT, header::HeaderValue::from_static("application/json"));
    let resp = conn.send(req).await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    let text = resp.into_body().collect().await.map_err(|e| format!("{url}: {e}"))?.to_bytes();
    let text = String::from_utf8_lossy(&text);
    if !status.is_success() {
        return Err(status_error(&url, status, &text));
    }
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["usage"]["prompt_tokens"].as_u64())
        .ok_or_else(|| format!("{url}: no usage.prompt_tokens in the answer: {}", excerpt(&text)))
}

/// POSTs a streaming completion and clocks it: text chunks by the time their bytes arrived. A
/// server that streams no usage chunk (llama-cpp-python's) counts as `known_prompt_tokens` (the
/// calibration's count of this prompt length) and one generated token per text chunk; without
/// `known_prompt_tokens` that stream is `Broken`.
pub async fn stream_completion(
    conn: &mut Conn,
    ep: &Endpoint,
    body: &Value,
    api_key: Option<&str>,
    known_prompt_tokens: Option<u64>,
) -> StreamEnd {
    let req = match request(ep, Method::POST, "/v1/completions", Some(body), api_key) {
        Ok(r) => r,
        Err(e) => return StreamEnd::Connection(e),
    };
    let t0 = Instant::now();
    let resp = match conn.send(req).await {
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
            Err(e) => return StreamEnd::Connection(e.to_string()),
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
                Err(e) => return StreamEnd::Broken(e),
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
            let ep = parse_url(url).unwrap();
            assert_eq!((ep.base.as_str(), ep.addr.as_str(), ep.prefix.as_str()), (base, addr, prefix), "{url}");
        }
        assert_eq!(parse_url("http://h:1/v1").unwrap().url("/v1/models"), "http://h:1/v1/models");
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
            let e = parse_url(url).unwrap_err();
            assert!(e.starts_with(&format!("--url {url}:")) && e.contains(needle), "{url}: {e}");
        }
    }

    #[test]
    fn status_errors_say_what_to_do() {
        let e = status_error("http://h:1/v1/models", StatusCode::UNAUTHORIZED, r#"{"error":{"message":"missing API key"}}"#);
        assert_eq!(e, "http://h:1/v1/models: 401 Unauthorized (pass the server's key with --api-key): missing API key");
        let e = status_error("http://h:1/v1/completions", StatusCode::BAD_REQUEST, "plain words");
        assert_eq!(e, "http://h:1/v1/completions: 400 Bad Request: plain words");
    }
}
