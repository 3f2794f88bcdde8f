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

/// A cluster with the brink.dev CRDs and no objects: discovery lists the seven resources, every
/// list is empty, and every watch stays open with no events (until the test ends).
fn empty_cluster() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || answer_empty(stream));
        }
    });
    format!("http://{addr}")
}

fn answer_empty(mut stream: std::net::TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        let _ = std::io::Read::read_exact(&mut reader, &mut body);
        let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        if target.contains("watch=true") {
            // A watch with nothing to say: headers, then silence.
            let _ = write!(stream, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n");
            let _ = stream.flush();
            std::thread::sleep(Duration::from_secs(600));
            return;
        }
        let body = if target.starts_with("/version") {
            r#"{"major":"1","minor":"37","gitVersion":"v1.37.1","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":"linux/amd64"}"#.to_string()
        } else if target.starts_with("/apis/brink.dev/v1alpha1?") || target == "/apis/brink.dev/v1alpha1" {
            let resource = |name: &str, kind: &str, namespaced: bool| {
                format!(r#"{{"name":"{name}","singularName":"","namespaced":{namespaced},"kind":"{kind}","verbs":["get","list","watch"]}}"#)
            };
            format!(
                r#"{{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"brink.dev/v1alpha1","resources":[{},{},{},{},{},{},{}]}}"#,
                resource("sparknodes", "SparkNode", false),
                resource("models", "Model", true),
                resource("modeldeployments", "ModelDeployment", true),
                resource("modelreplicas", "ModelReplica", true),
                resource("regressionsweeps", "RegressionSweep", true),
                resource("sweepruns", "SweepRun", true),
                resource("sweepresults", "SweepResult", true)
            )
        } else {
            r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"1"},"items":[]}"#.to_string()
        };
        if write!(stream, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).is_err() {
            return;
        }
    }
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").expect("request");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).expect("response");
    out
}

#[cfg(unix)]
#[test]
fn run_serves_metrics_and_drains_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = kubeconfig(dir.path(), &empty_cluster());
    let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let metrics = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_brink-operator"))
        // The fake cluster serves no Leases: leader election is tested with the elector's own tests.
        .args(["run", "--leader-elect", "false", "--drain-seconds", "3", "--metrics-addr", &metrics, "--kubeconfig"])
        .arg(&config)
        .env("RUST_LOG", "info,kube_runtime::controller=debug")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start brink-operator");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    let wait_for = |needle: &str, log: &mut Vec<String>| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
                let hit = line.contains(needle);
                log.push(line);
                if hit {
                    return;
                }
            }
        }
        panic!("no {needle:?} in the log within 30 s:\n{}", log.join("\n"));
    };
    wait_for("caches filled; controllers starting", &mut log);

    let health = http_get(&metrics, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"), "{health}");
    let text = http_get(&metrics, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200") && text.contains("text/plain; version=0.0.4"), "{text}");
    // No reconcile ran (the cluster is empty), but the families are registered.
    assert!(text.contains("brink_operator_reconciles_total{controller=\"modeldeployment\"} 0"), "{text}");
    assert!(text.contains("brink_operator_reconcile_duration_seconds_count{controller=\"modelreplica\"} 0"), "{text}");

    // Every controller's runner starts once its own watches filled its cache (kube logs it at
    // debug): a signal before that is the bounded-drain case, not the one tested here.
    for _ in brink_operator::controllers::CONTROLLERS {
        wait_for("store is ready, starting runner", &mut log);
    }
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
    assert!(killed.success());
    wait_for("shutting down: draining reconciles", &mut log);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "brink-operator did not exit within 30 s of SIGTERM:\n{}", log.join("\n"));
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit {status:?}:\n{}", log.join("\n"));
    // Drained: every controller stopped on its own, not at the drain limit.
    for line in rx.try_iter() {
        log.push(line);
    }
    let all = log.join("\n");
    assert!(all.contains("deployment controller stopped") && all.contains("replica controller stopped"), "{all}");
    assert!(all.contains("regression sweep controller stopped") && all.contains("sweep run controller stopped"), "{all}");
    assert!(all.contains("controllers stopped") && !all.contains("did not drain"), "{all}");
}

#[test]
fn run_names_the_missing_crds_and_how_to_install_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, stderr) = run_operator(&kubeconfig(dir.path(), &cluster_without_crds()));
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(
            "the brink.dev CRDs are not installed: missing sparknodes.brink.dev, models.brink.dev, modeldeployments.brink.dev, modelreplicas.brink.dev, regressionsweeps.brink.dev, sweepruns.brink.dev, sweepresults.brink.dev; install them with `brink-operator crds | kubectl apply -f -`"
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
