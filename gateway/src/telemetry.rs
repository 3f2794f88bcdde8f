//! The gateway's traces over OTLP (http/protobuf), when the standard
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set: the variables
//! are read as the operator's (operator/src/telemetry.rs) and the engine's server
//! (engine/src/server/telemetry/otlp.rs) read them ([`traces_endpoint`], pure), and spans go
//! through the SDK's batch processor, as theirs do. `service.name` is `OTEL_SERVICE_NAME`, else
//! `brink-gateway`. What the spans say: [`crate::spans`]; who makes them: [`crate::trace`].

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

pub const SERVICE_NAME: &str = "brink-gateway";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TelemetryError {
    #[error("OTEL_TRACES_EXPORTER={0}: only `otlp` and `none` are supported")]
    Exporter(String),
    #[error("{var}={protocol}: the gateway exports OTLP over http/protobuf only")]
    Protocol { var: &'static str, protocol: String },
    #[error("{var}: {url:?}: expected an http:// URL (https is not built in; export to a local collector)")]
    Url { var: &'static str, url: String },
    #[error("the OTLP span exporter for {url}: {message}")]
    Build { url: String, message: String },
    #[error("flushing the OTLP traces: {0}")]
    Flush(String),
}

/// Where the environment (`get`: a variable's value) asks traces to go: the traces endpoint as
/// written, else the base endpoint with `/v1/traces` appended; `None` when neither is set, or
/// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turns them off.
pub fn traces_endpoint(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, TelemetryError> {
    let set = |k: &str| get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match set("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => return Err(TelemetryError::Exporter(other.to_string())),
    }
    for var in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(protocol) = set(var) {
            if protocol != "http/protobuf" {
                return Err(TelemetryError::Protocol { var, protocol });
            }
            break;
        }
    }
    let (var, url) = match (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), set("OTEL_EXPORTER_OTLP_ENDPOINT")) {
        (Some(own), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", own),
        (None, Some(base)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("{}/v1/traces", base.trim_end_matches('/'))),
        (None, None) => return Ok(None),
    };
    // The exporter's HTTP client is built without TLS (a collector beside the gateway).
    if !url.starts_with("http://") || url.len() <= "http://".len() {
        return Err(TelemetryError::Url { var, url });
    }
    Ok(Some(url))
}

/// The running exporter, or none; [`Telemetry::shutdown`] exports what is pending.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// No export (what tests and a gateway without `OTEL_*` get).
    pub fn off() -> Telemetry {
        Telemetry { provider: None }
    }

    /// [`Telemetry::from_lookup`] the process environment.
    pub fn from_env() -> Result<Telemetry, TelemetryError> {
        Telemetry::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Starts the exporter `get` (the environment) asks for. Call it before the async runtime
    /// starts, or off its threads: the batch processor runs its own thread with a blocking client.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Telemetry, TelemetryError> {
        let Some(url) = traces_endpoint(get)? else { return Ok(Telemetry::off()) };
        let service = get("OTEL_SERVICE_NAME").map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .build()
            .map_err(|e| TelemetryError::Build { url, message: e.to_string() })?;
        let resource = Resource::builder().with_service_name(service.unwrap_or_else(|| SERVICE_NAME.into())).build();
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        Ok(Telemetry { provider: Some(provider) })
    }

    /// Whether spans go out over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// The tracer the gateway's spans are made with; `None` when nothing is exported (then no
    /// span is made at all).
    pub fn tracer(&self) -> Option<SdkTracer> {
        let scope = opentelemetry::InstrumentationScope::builder(SERVICE_NAME).with_version(env!("CARGO_PKG_VERSION")).build();
        self.provider.as_ref().map(|p| p.tracer_with_scope(scope))
    }

    /// Flushes and stops the exporter. Blocks up to the exporter's timeout: call it off the
    /// async runtime's threads.
    pub fn shutdown(self) -> Result<(), TelemetryError> {
        match self.provider {
            Some(p) => p.shutdown().map_err(|e| TelemetryError::Flush(e.to_string())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn requested(vars: &[(&str, &str)]) -> Result<Option<String>, TelemetryError> {
        let m: HashMap<&str, &str> = vars.iter().copied().collect();
        traces_endpoint(&|k| m.get(k).map(|v| v.to_string()))
    }

    #[test]
    fn the_standard_variables_turn_traces_on_and_off() {
        let url = |u: &str| Ok(Some(u.to_string()));
        type Case<'a> = (&'a [(&'a str, &'a str)], Result<Option<String>, &'a str>);
        let cases: [Case<'_>; 11] = [
            (&[], Ok(None)),
            (&[("OTEL_SERVICE_NAME", "gw")], Ok(None)),
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
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{vars:?}: {e}"),
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

    #[test]
    fn without_the_variables_no_tracer_is_made() {
        let t = Telemetry::from_lookup(&|_| None).unwrap();
        assert!(!t.exporting() && t.tracer().is_none());
        t.shutdown().unwrap();
    }
}
