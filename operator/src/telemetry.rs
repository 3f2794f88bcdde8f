//! The operator's logs and traces: `tracing` to stderr always, and the spans over OTLP
//! (http/protobuf) when the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set ([`traces_endpoint`], pure: the base endpoint gets
//! `/v1/traces` appended, the traces one is used as written); `service.name` is
//! `OTEL_SERVICE_NAME`, else `brink-operator`.
//!
//! The spans worth exporting are the reconciles ([`crate::controllers`] opens one per reconcile
//! with the controller, the object and the outcome); kube-runtime's and the controllers' own
//! spans nest under them.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub const SERVICE_NAME: &str = "brink-operator";

/// Where the environment (`get`: a variable's value) asks traces to go: the traces endpoint
/// as written, else the base endpoint with `/v1/traces` appended; `None` when neither is set,
/// or `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turns them off.
pub fn traces_endpoint(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, String> {
    let set = |k: &str| get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match set("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => return Err(format!("OTEL_TRACES_EXPORTER={other}: only `otlp` and `none` are supported")),
    }
    for var in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(p) = set(var) {
            if p != "http/protobuf" {
                return Err(format!("{var}={p}: the operator exports OTLP over http/protobuf only"));
            }
            break;
        }
    }
    let (var, url) = match (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), set("OTEL_EXPORTER_OTLP_ENDPOINT")) {
        (Some(own), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", own),
        (None, Some(base)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("{}/v1/traces", base.trim_end_matches('/'))),
        (None, None) => return Ok(None),
    };
    // The exporter's HTTP client is built without TLS (a collector beside the operator).
    if !url.starts_with("http://") || url.len() <= "http://".len() {
        return Err(format!("{var}: {url:?}: expected an http:// URL (https is not built in; export to a local collector)"));
    }
    Ok(Some(url))
}

/// The running exporter; [`Telemetry::shutdown`] exports what is pending.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans go out over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes and stops the exporter. Blocks up to the exporter's timeout: call it off the
    /// async runtime's threads.
    pub fn shutdown(self) -> Result<(), String> {
        match self.provider {
            Some(p) => p.shutdown().map_err(|e| format!("flushing the OTLP traces: {e}")),
            None => Ok(()),
        }
    }
}

/// The tracer provider that batches spans to `url`.
fn provider(url: &str, service: String) -> Result<SdkTracerProvider, String> {
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .build()
        .map_err(|e| format!("the OTLP span exporter for {url}: {e}"))?;
    let resource = Resource::builder().with_service_name(service).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// [`init_with`] the process environment.
pub fn init() -> Result<Telemetry, String> {
    init_with(&|k| std::env::var(k).ok())
}

/// Installs the global subscriber: logs to stderr filtered by `RUST_LOG` (default `info`), and
/// the OTLP layer when `get` (the environment) asks for it. Call it once, before the async
/// runtime starts (the batch exporter runs its own thread with a blocking client).
pub fn init_with(get: &dyn Fn(&str) -> Option<String>) -> Result<Telemetry, String> {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter());
    let service = get("OTEL_SERVICE_NAME").filter(|s| !s.trim().is_empty()).unwrap_or_else(|| SERVICE_NAME.into());
    let provider = match traces_endpoint(get)? {
        Some(url) => Some(provider(&url, service)?),
        None => None,
    };
    let otel = provider.as_ref().map(|p| {
        let tracer = p.tracer(SERVICE_NAME);
        tracing_opentelemetry::layer().with_tracer(tracer).with_filter(filter())
    });
    tracing_subscriber::registry().with(fmt).with(otel).try_init().map_err(|e| format!("installing the log subscriber: {e}"))?;
    Ok(Telemetry { provider })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn requested(vars: &[(&str, &str)]) -> Result<Option<String>, String> {
        let m: HashMap<&str, &str> = vars.iter().copied().collect();
        traces_endpoint(&|k| m.get(k).map(|v| v.to_string()))
    }

    #[test]
    fn the_standard_variables_turn_traces_on_and_off() {
        let url = |u: &str| Ok(Some(u.to_string()));
        type Case<'a> = (&'a [(&'a str, &'a str)], Result<Option<String>, &'a str>);
        let cases: [Case<'_>; 11] = [
            (&[], Ok(None)),
            (&[("OTEL_SERVICE_NAME", "op")], Ok(None)),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")], url("http://collector:4318/v1/traces")),
            (&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/custom")], url("http://collector:4318/custom")),
            (&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://b:2")], url("http://t:1/x")),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")], Ok(None)),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_SDK_DISABLED", "TRUE")], Ok(None)),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_TRACES_EXPORTER", "none")], Ok(None)),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_TRACES_EXPORTER", "zipkin")], Err("OTEL_TRACES_EXPORTER=zipkin")),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                Err("OTEL_EXPORTER_OTLP_PROTOCOL=grpc"),
            ),
            (&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c:4318/v1/traces")], Err("expected an http:// URL")),
        ];
        for (vars, want) in cases {
            match (requested(vars), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w, "{vars:?}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{vars:?}: {e}"),
                (got, w) => panic!("{vars:?}: got {got:?}, want {w:?}"),
            }
        }
        // The traces protocol wins over the general one.
        assert_eq!(
            requested(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            ]),
            Ok(Some("http://c:4318/v1/traces".to_string()))
        );
    }
}
