//! The double over HTTP, for processes: the operator and `brink-agent run` take a kubeconfig, not
//! an in-process `kube::Client`. A TCP listener serves the same [`DoubleService`] (HTTP/1.1, no
//! TLS, no authentication); watch responses stream as the API server's do, one JSON line per
//! event, for as long as the client keeps the connection.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::Path;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::handle::KubeDouble;
use crate::service::{DoubleService, ResponseBody};

/// A running HTTP server for a double. Dropping it stops the server and closes every open
/// connection (watches included).
pub struct HttpDouble {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl HttpDouble {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`: the kubeconfig's `server`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig for this server to `path` (see [`kubeconfig`]).
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) -> io::Result<()> {
        std::fs::write(path, kubeconfig(&self.url(), namespace))
    }
}

impl Drop for HttpDouble {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

/// A kubeconfig (JSON, which every YAML reader accepts) with one cluster at `server_url`, a user
/// without credentials (the double allows every request) and `namespace` as the context's default.
pub fn kubeconfig(server_url: &str, namespace: &str) -> String {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kube-double", "cluster": {"server": server_url}}],
        "users": [{"name": "kube-double", "user": {}}],
        "contexts": [{"name": "kube-double", "context": {"cluster": "kube-double", "user": "kube-double", "namespace": namespace}}],
        "current-context": "kube-double",
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

impl KubeDouble {
    /// Serves this double over HTTP on `addr` (port 0: any free port) from a task on the current
    /// tokio runtime; returns the bound address and the handle that keeps the server alive.
    pub async fn serve_http(&self, addr: SocketAddr) -> io::Result<(SocketAddr, HttpDouble)> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept_loop(listener, self.service()));
        Ok((addr, HttpDouble { addr, task }))
    }
}

async fn accept_loop(listener: TcpListener, service: DoubleService) {
    let mut connections = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of file descriptors and the like: the next accept may succeed.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        // Reap finished connections so the set does not grow for the life of a test.
        while connections.try_join_next().is_some() {}
        let service = service.clone();
        connections.spawn(async move {
            let handler = hyper::service::service_fn(move |req| answer(service.clone(), req));
            // A client that goes away mid-request is the client's business, not the server's.
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), handler).await;
        });
    }
}

async fn answer(service: DoubleService, req: Request<Incoming>) -> Result<Response<ResponseBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            let status = crate::error::ApiError::bad_request(format!("reading the request body failed: {e}"));
            return Ok(crate::service::json_response(status.code, &status.status_body()));
        }
    };
    Ok(service.serve(Request::from_parts(parts, kube::client::Body::from(bytes))).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_parses_as_kube_reads_it() {
        let text = kubeconfig("http://127.0.0.1:6443", "brink");
        let kc: kube::config::Kubeconfig = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("kube-double"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("http://127.0.0.1:6443"));
        assert_eq!(kc.contexts[0].context.as_ref().unwrap().namespace.as_deref(), Some("brink"));
    }
}
