//! Kept-alive connections the server closes: a tiny local server that answers sizing requests
//! and closes connections the ways real servers do (after every streamed answer without saying
//! so, as llama.cpp's `llama-server` does; after taking a request and sending nothing; a fresh
//! connection that takes a request and dies). A closed kept-alive connection must not fail a
//! sizing request; a fresh connection that takes the request and sends nothing must, once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::client::{Conn, Endpoint, HttpError, endpoint, prompt_tokens_of};
use super::runner::{PromptSizes, Target, calibrate};

/// What the server does with a connection once it read a request from it.
#[derive(Clone, Copy, Debug)]
enum Close {
    /// Answers, then closes (no `Connection: close`): every connection carries one answer.
    AfterEachAnswer,
    /// On the first connection: answers the first request, reads the second and closes without
    /// a byte of answer. Later connections are kept alive.
    SecondUnanswered,
    /// Reads the first request and closes without answering: the server fails.
    FirstUnanswered,
}

/// Requests read per connection, in the order the connections were accepted.
type Seen = Arc<Mutex<Vec<usize>>>;

/// Serves `POST /v1/completions` (streamed or not, as asked) with `usage.prompt_tokens` = the
/// prompt's words + 4 (a template's tokens, as llama.cpp counts them), closing as `close` says.
async fn server(close: Close) -> (Endpoint, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ep = endpoint(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let index = {
                let mut l = log.lock().unwrap();
                l.push(0);
                l.len() - 1
            };
            tokio::spawn(connection(sock, close, log.clone(), index));
        }
    });
    (ep, seen)
}

async fn connection(mut sock: TcpStream, close: Close, log: Seen, index: usize) {
    let mut buf = Vec::new();
    loop {
        let Some(body) = read_request(&mut sock, &mut buf).await else { return };
        let n = {
            let mut l = log.lock().unwrap();
            l[index] += 1;
            l[index]
        };
        match (close, n) {
            (Close::FirstUnanswered, 1) => return,
            (Close::SecondUnanswered, 2) if index == 0 => return,
            _ => {}
        }
        let req: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let tokens = req["prompt"].as_str().unwrap().split(' ').count() + 4;
        let usage = json!({"prompt_tokens": tokens, "completion_tokens": 1});
        let (kind, payload) = if req["stream"] == true {
            let events = format!(
                "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
                json!({"choices": [{"text": "x", "index": 0}]}),
                json!({"choices": [], "usage": usage})
            );
            ("text/event-stream", events)
        } else {
            ("application/json", json!({"choices": [{"text": "x"}], "usage": usage}).to_string())
        };
        let head = format!("HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n", payload.len());
        if sock.write_all(format!("{head}{payload}").as_bytes()).await.is_err() {
            return;
        }
        if let Close::AfterEachAnswer = close {
            return;
        }
    }
}

/// The body of the next request on `sock` (`None` at its end); `buf` keeps what was read past it.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + len {
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = buf[head_end..head_end + len].to_vec();
    buf.drain(..head_end + len);
    Some(body)
}

fn sizing(words: usize) -> serde_json::Value {
    json!({"model": "m", "prompt": vec!["the"; words].join(" "), "max_tokens": 1})
}

/// The server closed the kept-alive connection after its answer and the client saw it: the
/// next request never leaves on it (hyper: "channel closed") and goes on a new connection.
#[tokio::test]
async fn a_request_on_a_connection_closed_after_its_answer_goes_on_a_new_one() {
    let (ep, seen) = server(Close::AfterEachAnswer).await;
    let mut conn = Conn::open(&ep).await.unwrap();
    assert_eq!(prompt_tokens_of(&mut conn, &sizing(28), None).await.unwrap(), 32);
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while conn.usable() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    waited.await.expect("the client never saw the server close the connection");
    assert_eq!(prompt_tokens_of(&mut conn, &sizing(30), None).await.unwrap(), 34);
    assert_eq!(*seen.lock().unwrap(), vec![1, 1]);
}

/// The server took the second request of a kept-alive connection and closed it without a byte
/// of answer (the close raced the request): sent again, once, on a new connection.
#[tokio::test]
async fn a_reused_connection_closed_before_answering_is_retried_once() {
    let (ep, seen) = server(Close::SecondUnanswered).await;
    let mut conn = Conn::open(&ep).await.unwrap();
    assert_eq!(prompt_tokens_of(&mut conn, &sizing(10), None).await.unwrap(), 14);
    assert_eq!(prompt_tokens_of(&mut conn, &sizing(12), None).await.unwrap(), 16);
    assert_eq!(*seen.lock().unwrap(), vec![2, 1], "the second request was read on the first connection, then sent again");
    // The new connection stays in use.
    assert_eq!(prompt_tokens_of(&mut conn, &sizing(2), None).await.unwrap(), 6);
    assert_eq!(*seen.lock().unwrap(), vec![2, 2]);
}

/// A fresh connection that takes the request and closes without answering is the server
/// failing: an error naming the URL, the request sent once.
#[tokio::test]
async fn a_fresh_connection_closed_unanswered_is_an_error_not_a_retry() {
    let (ep, seen) = server(Close::FirstUnanswered).await;
    let mut conn = Conn::open(&ep).await.unwrap();
    let err = prompt_tokens_of(&mut conn, &sizing(10), None).await.unwrap_err();
    assert!(matches!(err, HttpError::Exchange { retried: false, .. }), "{err:?}");
    assert!(err.to_string().starts_with(&ep.url("/v1/completions")), "{err}");
    assert_eq!(*seen.lock().unwrap(), vec![1]);
}

/// Sizing a prompt against a server that closes the connection after every streamed answer
/// (as llama-server does): 28 words count 32 tokens, so the second try reuses the connection
/// the server closed; the calibration must still land on the count.
#[tokio::test]
async fn calibration_survives_a_server_that_closes_after_every_stream() {
    let (endpoint, seen) = server(Close::AfterEachAnswer).await;
    let target = Target { endpoint, model: "m".into(), api_key: None, seed: 0 };
    for _ in 0..20 {
        let c = calibrate(&target, 32, None).await.unwrap();
        assert_eq!((c.words, c.prompt_tokens), (28, 32));
    }
    let mut sizes = PromptSizes::default();
    assert_eq!(sizes.words(&target, 64).await.unwrap(), 60);
    assert!(seen.lock().unwrap().iter().all(|&n| n == 1), "one answer per connection");
}
