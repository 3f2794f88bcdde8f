//! `brink-agent run` started against a kubeconfig, as an operator of the cluster would: with
//! no API server at the configured URL, and with an API server that lacks the brink.dev CRDs.
//! Each must end at once with exit 2 and the sentence that says what to do, not a panic or a
//! retry loop.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn kubeconfig(dir: &Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn run(dir: &Path, server: &str) -> Output {
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_brink-agent"))
        .args(["run", "--node-name", "n1", "--lease-namespace", "brink", "--state-dir"])
        .arg(dir.join("state"))
        .env("KUBECONFIG", kubeconfig(dir, server))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(60), "start-up took {:?}: a retry loop?", t0.elapsed());
    out
}

#[test]
fn no_api_server_names_the_url() {
    let dir = tempfile::tempdir().unwrap();
    // A port that was free a moment ago: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = run(dir.path(), &format!("http://127.0.0.1:{port}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("error: cannot reach the Kubernetes API at http://127.0.0.1:{port}/ (list sparknodes)")), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn missing_crds_say_how_to_install_them() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // An API server without the brink.dev group: 404 for every path, as a real one answers.
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) && line != "\r\n" {
                line.clear();
            }
            let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#;
            let head = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let mut s = reader.into_inner();
            let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body.as_bytes()));
        }
    });
    let out = run(dir.path(), &format!("http://{addr}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error: the brink.dev CRDs are not installed: run `brink-operator crds | kubectl apply -f -`"), "{stderr}");
}

#[test]
fn a_node_name_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_brink-agent"))
        .args(["run", "--lease-namespace", "brink", "--state-dir"])
        .arg(dir.path())
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--node-name: not given and $NODE_NAME is not set"), "{stderr}");
}
