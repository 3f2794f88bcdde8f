//! `brink-operator run` at start-up: a clear error when the API server cannot be reached, and
//! one that names every missing brink.dev CRD and the command that installs them. The API
//! server is a small local HTTP server that answers discovery as a cluster without the CRDs.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

fn kubeconfig(dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
    );
    std::fs::write(&path, yaml).expect("write kubeconfig");
    path
}

/// Answers `/version` and 404 for everything else, until the test ends.
fn cluster_without_crds() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // Drain the headers.
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
            let (code, body) = if path.starts_with("/version") {
                ("200 OK", r#"{"major":"1","minor":"37","gitVersion":"v1.37.1","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":"linux/amd64"}"#.to_string())
            } else {
                (
                    "404 Not Found",
                    format!(
                        r#"{{"apiVersion":"v1","kind":"Status","status":"Failure","message":"the server could not find the requested resource ({path})","reason":"NotFound","code":404}}"#
                    ),
                )
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {code}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}")
}

fn run_operator(kubeconfig: &std::path::Path) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_brink-operator"))
        .args(["run", "--metrics-addr", "127.0.0.1:0", "--kubeconfig"])
        .arg(kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start brink-operator");
    // It must give up on its own: the start-up checks do not retry forever.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            return (status.success(), String::from_utf8_lossy(&out.stderr).into_owned());
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("brink-operator run did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn run_names_the_missing_crds_and_how_to_install_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, stderr) = run_operator(&kubeconfig(dir.path(), &cluster_without_crds()));
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(
            "the brink.dev CRDs are not installed: missing sparknodes.brink.dev, models.brink.dev, modeldeployments.brink.dev, modelreplicas.brink.dev; install them with `brink-operator crds | kubectl apply -f -`"
        ),
        "{stderr}"
    );
}

#[test]
fn run_says_when_the_api_server_is_unreachable() {
    // A port nothing listens on: bound, then released.
    let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, stderr) = run_operator(&kubeconfig(dir.path(), &format!("http://127.0.0.1:{port}")));
    assert!(!ok, "{stderr}");
    assert!(stderr.contains(&format!("cannot reach the Kubernetes API server (http://127.0.0.1:{port}/)")), "{stderr}");
    assert!(stderr.contains("check the kubeconfig's server and credentials"), "{stderr}");
}

#[test]
fn run_says_when_the_kubeconfig_is_unreadable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, stderr) = run_operator(&dir.path().join("absent"));
    assert!(!ok);
    assert!(stderr.contains("reading the kubeconfig") && stderr.contains("absent"), "{stderr}");
}
