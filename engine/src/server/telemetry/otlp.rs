//! OTLP export (http/protobuf) of the telemetry store's metrics and the requests' spans, when
//! the standard `OTEL_*` variables ask for it. [`OtlpConfig::from_lookup`] reads the variables
//! (pure, table-tested); [`start`] builds the SDK pipeline: a periodic metric reader and a batch
//! span processor, each on its own thread with a blocking HTTP client.
//!
//! Counters and gauges are observed from the same table `/metrics` renders ([`super::scalars`]);
//! the GenAI histograms get each observation as the store does ([`super::Telemetry`] records both).

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;

use super::{
    DURATION_BOUNDS, GenAiMetric, Kind, Otel, OtelHistograms, REQUEST_DURATION, Scalar, TOKEN_BOUNDS, TOKEN_USAGE, TPOT, TPOT_BOUNDS, TTFT,
    TTFT_BOUNDS, attributes,
};

pub const DEFAULT_SERVICE_NAME: &str = "brink-agent";
/// The SDK's default (`OTEL_METRIC_EXPORT_INTERVAL`, milliseconds).
pub const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(60);

/// Where and how to export; `None` endpoints are signals not exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The full URL spans are posted to (`…/v1/traces`).
    pub traces: Option<String>,
    /// The full URL metrics are posted to (`…/v1/metrics`).
    pub metrics: Option<String>,
    pub service_name: String,
    pub export_interval: Duration,
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// A signal's endpoint as the OTLP exporter spec resolves it: the signal's own variable as
/// written, else the base endpoint with `/v1/<signal>` appended.
fn signal_endpoint(get: &dyn Fn(&str) -> Option<String>, signal: &str) -> Result<Option<String>, String> {
    let upper = signal.to_uppercase();
    let own_var = format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT");
    let exporter_var = format!("OTEL_{upper}_EXPORTER");
    if let Some(exporter) = non_empty(get(&exporter_var)) {
        match exporter.as_str() {
            "none" => return Ok(None),
            "otlp" => {}
            other => return Err(format!("{exporter_var}={other}: only `otlp` and `none` are supported")),
        }
    }
    for var in [format!("OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"), "OTEL_EXPORTER_OTLP_PROTOCOL".to_string()] {
        if let Some(p) = non_empty(get(&var)) {
            if p != "http/protobuf" {
                return Err(format!("{var}={p}: this build exports OTLP over http/protobuf only"));
            }
            break;
        }
    }
    let (var, url) = match (non_empty(get(&own_var)), non_empty(get("OTEL_EXPORTER_OTLP_ENDPOINT"))) {
        (Some(own), _) => (own_var, own),
        (None, Some(base)) => ("OTEL_EXPORTER_OTLP_ENDPOINT".to_string(), format!("{}/v1/{signal}", base.trim_end_matches('/'))),
        (None, None) => return Ok(None),
    };
    if url.starts_with("https://") {
        return Err(format!("{var}: {url}: https needs TLS, which this build leaves out; export to a local collector over http://"));
    }
    if !url.starts_with("http://") || url.len() <= "http://".len() {
        return Err(format!("{var}: {url:?} is not an http:// URL"));
    }
    Ok(Some(url))
}

impl OtlpConfig {
    /// The configuration `get` (a variable's value) describes; `None` when nothing is exported.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<OtlpConfig>, String> {
        if non_empty(get("OTEL_SDK_DISABLED")).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let traces = signal_endpoint(&get, "traces")?;
        let metrics = signal_endpoint(&get, "metrics")?;
        if traces.is_none() && metrics.is_none() {
            return Ok(None);
        }
        let export_interval = match non_empty(get("OTEL_METRIC_EXPORT_INTERVAL")) {
            None => DEFAULT_EXPORT_INTERVAL,
            Some(ms) => match ms.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => return Err(format!("OTEL_METRIC_EXPORT_INTERVAL={ms}: expected milliseconds above 0")),
            },
        };
        let service_name = non_empty(get("OTEL_SERVICE_NAME")).unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
        Ok(Some(OtlpConfig { traces, metrics, service_name, export_interval }))
    }

    pub fn from_env() -> Result<Option<OtlpConfig>, String> {
        OtlpConfig::from_lookup(|k| std::env::var(k).ok())
    }
}

/// The running exporters; [`OtlpPipeline::shutdown`] flushes what is left.
pub struct OtlpPipeline {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
}

impl OtlpPipeline {
    /// Exports what is pending and stops the exporters' threads. Blocks (up to the exporters'
    /// timeouts): call it off the async runtime's threads.
    pub fn shutdown(self) -> Result<(), String> {
        let mut errors = Vec::new();
        if let Some(t) = self.tracer_provider
            && let Err(e) = t.shutdown()
        {
            errors.push(format!("traces: {e}"));
        }
        if let Some(m) = self.meter_provider
            && let Err(e) = m.shutdown()
        {
            errors.push(format!("metrics: {e}"));
        }
        if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
    }
}

fn histogram_f64(meter: &Meter, m: &GenAiMetric, bounds: &[f64]) -> opentelemetry::metrics::Histogram<f64> {
    meter.f64_histogram(m.otel).with_description(m.help).with_unit(m.unit).with_boundaries(bounds.to_vec()).build()
}

/// Registers each scalar of `read`'s table as an observable counter or gauge that reads the
/// table again at every collection.
fn observe_scalars(meter: &Meter, read: Arc<dyn Fn() -> Vec<Scalar> + Send + Sync>) {
    for s in read() {
        let (name, kind) = (s.name, s.kind);
        let read = read.clone();
        let callback = move |obs: &dyn opentelemetry::metrics::AsyncInstrument<f64>| {
            if let Some(s) = read().into_iter().find(|s| s.name == name) {
                for (labels, v) in &s.samples {
                    obs.observe(*v, &attributes(labels));
                }
            }
        };
        // The instruments stay registered with the provider; the handles need not be kept.
        match kind {
            Kind::Counter => {
                meter.f64_observable_counter(s.otel_name()).with_description(s.help).with_callback(callback).build();
            }
            Kind::Gauge => {
                meter.f64_observable_gauge(s.otel_name()).with_description(s.help).with_callback(callback).build();
            }
        }
    }
}

/// Starts the exporters `cfg` names. `read` gives the counter and gauge table (the same one
/// `/metrics` renders). Returns the instruments for [`super::Telemetry::otel`] and the pipeline
/// to shut down. Call it off the async runtime's threads (the HTTP clients are blocking).
pub fn start(cfg: &OtlpConfig, read: Arc<dyn Fn() -> Vec<Scalar> + Send + Sync>) -> Result<(Otel, OtlpPipeline), String> {
    let resource = Resource::builder().with_service_name(cfg.service_name.clone()).build();
    let tracer_provider = match &cfg.traces {
        Some(url) => {
            let exporter = SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url.clone())
                .build()
                .map_err(|e| format!("the OTLP span exporter for {url}: {e}"))?;
            Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.clone()).build())
        }
        None => None,
    };
    let meter_provider = match &cfg.metrics {
        Some(url) => {
            let exporter = MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url.clone())
                .build()
                .map_err(|e| format!("the OTLP metric exporter for {url}: {e}"))?;
            let reader = PeriodicReader::builder(exporter).with_interval(cfg.export_interval).build();
            Some(SdkMeterProvider::builder().with_reader(reader).with_resource(resource).build())
        }
        None => None,
    };
    let scope = || opentelemetry::InstrumentationScope::builder("brink").with_version(env!("CARGO_PKG_VERSION")).build();
    let histograms = meter_provider.as_ref().map(|mp| {
        let meter = mp.meter_with_scope(scope());
        observe_scalars(&meter, read);
        OtelHistograms {
            ttft: histogram_f64(&meter, &TTFT, &TTFT_BOUNDS),
            tpot: histogram_f64(&meter, &TPOT, &TPOT_BOUNDS),
            duration: histogram_f64(&meter, &REQUEST_DURATION, &DURATION_BOUNDS),
            tokens: meter
                .u64_histogram(TOKEN_USAGE.otel)
                .with_description(TOKEN_USAGE.help)
                .with_unit(TOKEN_USAGE.unit)
                .with_boundaries(TOKEN_BOUNDS.to_vec())
                .build(),
        }
    });
    let tracer = tracer_provider.as_ref().map(|tp| tp.tracer_with_scope(scope()));
    Ok((Otel { tracer, histograms }, OtlpPipeline { tracer_provider, meter_provider }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Option<OtlpConfig>, String> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        OtlpConfig::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn the_standard_variables_pick_endpoints_per_signal() {
        assert_eq!(config(&[]).unwrap(), None);
        assert_eq!(config(&[("OTEL_SERVICE_NAME", "x")]).unwrap(), None);
        let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]).unwrap().unwrap();
        assert_eq!(c.traces.as_deref(), Some("http://collector:4318/v1/traces"));
        assert_eq!(c.metrics.as_deref(), Some("http://collector:4318/v1/metrics"));
        assert_eq!((c.service_name.as_str(), c.export_interval), ("brink-agent", Duration::from_secs(60)));
        // A signal's own variable is used as written and wins over the base.
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://b:9000/custom"),
            ("OTEL_SERVICE_NAME", "node-7"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.metrics.as_deref(), Some("http://b:9000/custom"));
        assert_eq!(c.traces.as_deref(), Some("http://a:4318/v1/traces"));
        assert_eq!((c.service_name.as_str(), c.export_interval), ("node-7", Duration::from_millis(500)));
        // Only traces.
        let c = config(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4318/v1/traces")]).unwrap().unwrap();
        assert_eq!((c.traces.is_some(), c.metrics.is_none()), (true, true));
        // `none` turns a signal off; the SDK switch turns everything off.
        let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"), ("OTEL_METRICS_EXPORTER", "none")]).unwrap().unwrap();
        assert_eq!((c.traces.is_some(), c.metrics.is_none()), (true, true));
        assert_eq!(config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"), ("OTEL_SDK_DISABLED", "true")]).unwrap(), None);
        assert!(config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).is_ok());
    }

    #[test]
    fn unsupported_settings_are_named() {
        let cases: [(&[(&str, &str)], &str); 6] = [
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
            ),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"), ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")], "TRACES_PROTOCOL"),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://a:4318")], "https needs TLS"),
            (&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "collector:4318")], "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"), ("OTEL_METRIC_EXPORT_INTERVAL", "soon")], "OTEL_METRIC_EXPORT_INTERVAL=soon"),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"), ("OTEL_TRACES_EXPORTER", "zipkin")], "OTEL_TRACES_EXPORTER=zipkin"),
        ];
        for (vars, want) in cases {
            let e = config(vars).unwrap_err();
            assert!(e.contains(want), "{vars:?}: {e}");
        }
    }
}
