use std::process::ExitCode;

use brink_gateway::Gateway;
use brink_gateway::cli::Args;
use brink_gateway::telemetry::Telemetry;
use clap::Parser;

fn main() -> ExitCode {
    // clap exits 2 on a bad flag (an --upstream that is not http://HOST:PORT, say).
    let args = Args::parse();
    let listen = args.listen;
    let config = match args.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("brink-gateway: {e}");
            return ExitCode::from(2);
        }
    };
    // Before the runtime: the OTLP batch exporter runs its own thread with a blocking client.
    let telemetry = match Telemetry::from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("brink-gateway: {e}");
            return ExitCode::from(2);
        }
    };
    let gateway = Gateway::new(config).traced(telemetry.tracer());
    let code = run(listen, gateway);
    // The spans still pending; a collector that is gone costs a message, not the exit code.
    if let Err(e) = telemetry.shutdown() {
        eprintln!("brink-gateway: {e}");
    }
    code
}

fn run(listen: std::net::SocketAddr, gateway: Gateway) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("brink-gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("brink-gateway: --listen {listen}: {e}");
                return ExitCode::from(2);
            }
        };
        let config = &gateway.config;
        let served = if config.kubernetes {
            // kube's TLS and another dependency's may both link a rustls provider; rustls will
            // not choose between them, so the gateway names one.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let client = match kube::Client::try_default().await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("brink-gateway: --kubernetes: no cluster to talk to: {e}");
                    return ExitCode::from(2);
                }
            };
            let scope = if config.namespaces.is_empty() { "all namespaces".to_string() } else { config.namespaces.join(", ") };
            eprintln!("brink-gateway: listening on http://{listen}, replicas from the cluster ({scope})");
            brink_gateway::serve_kubernetes(listener, gateway, client, shutdown_signal()).await
        } else {
            eprintln!("brink-gateway: listening on http://{listen}, {} upstreams", config.upstreams.len());
            brink_gateway::serve(listener, gateway, shutdown_signal()).await
        };
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("brink-gateway: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Ctrl-C or SIGTERM (what Kubernetes sends): stop taking connections, finish the requests in flight.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
