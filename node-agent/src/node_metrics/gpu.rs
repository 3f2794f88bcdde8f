//! GPU sensor readings → gauges (pure). What NVML reads is in [`super::nvml_gpus`]; here a
//! reading becomes series labelled with the GPU's UUID and name, in Prometheus base units
//! (celsius, watts, hertz, ratios). A reading the GPU does not support is absent, never 0: on
//! GB10, for one, NVML has no memory clock or memory utilisation to give.

use brink_engine::server::telemetry::histogram::Labels;
use brink_engine::server::telemetry::{Kind, Scalar};

/// One GPU's readings at one moment; `None` where NVML could not read the value on this GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuSample {
    /// NVML's UUID (`GPU-…`), as `brink-agent device` and the qualification name the GPU.
    pub uuid: String,
    pub name: String,
    pub temperature_celsius: Option<u32>,
    pub power_milliwatts: Option<u32>,
    /// The power limit the driver enforces now.
    pub power_limit_milliwatts: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    /// Percent of the last sample period during which a kernel ran.
    pub gpu_utilization_percent: Option<u32>,
    /// Percent of the last sample period during which device memory was read or written.
    pub memory_utilization_percent: Option<u32>,
}

/// A gauge: its name, help, and how it reads a sample (in base units).
struct Gauge {
    name: &'static str,
    help: &'static str,
    value: fn(&GpuSample) -> Option<f64>,
}

const GAUGES: [Gauge; 7] = [
    Gauge { name: "brink_gpu_temperature_celsius", help: "GPU die temperature.", value: |s| s.temperature_celsius.map(f64::from) },
    Gauge { name: "brink_gpu_power_watts", help: "GPU power draw.", value: |s| s.power_milliwatts.map(|mw| f64::from(mw) / 1e3) },
    Gauge {
        name: "brink_gpu_power_limit_watts",
        help: "The power limit the driver enforces (a GPU at its limit is clocked down).",
        value: |s| s.power_limit_milliwatts.map(|mw| f64::from(mw) / 1e3),
    },
    Gauge { name: "brink_gpu_sm_clock_hertz", help: "Current SM clock.", value: |s| s.sm_clock_mhz.map(|mhz| f64::from(mhz) * 1e6) },
    Gauge {
        name: "brink_gpu_memory_clock_hertz",
        help: "Current memory clock.",
        value: |s| s.memory_clock_mhz.map(|mhz| f64::from(mhz) * 1e6),
    },
    Gauge {
        name: "brink_gpu_utilization_ratio",
        help: "Fraction of NVML's last sample period during which a kernel ran on the GPU.",
        value: |s| s.gpu_utilization_percent.map(|p| f64::from(p) / 100.0),
    },
    Gauge {
        name: "brink_gpu_memory_utilization_ratio",
        help: "Fraction of NVML's last sample period during which device memory was read or written.",
        value: |s| s.memory_utilization_percent.map(|p| f64::from(p) / 100.0),
    },
];

fn labels(s: &GpuSample) -> Labels {
    vec![("gpu_uuid", s.uuid.clone()), ("gpu_name", s.name.clone())]
}

/// Every GPU gauge, each with a series per GPU that has the reading. A gauge no GPU can read
/// stays in the table without series, so the set of names is the same at every read (the OTLP
/// export registers its instruments from the first one).
pub fn scalars(samples: &[GpuSample]) -> Vec<Scalar> {
    GAUGES
        .iter()
        .map(|g| Scalar {
            name: g.name,
            kind: Kind::Gauge,
            help: g.help,
            samples: samples.iter().filter_map(|s| (g.value)(s).map(|v| (labels(s), v))).collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> GpuSample {
        GpuSample {
            uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
            name: "NVIDIA H200".into(),
            temperature_celsius: Some(47),
            power_milliwatts: Some(123_456),
            power_limit_milliwatts: Some(700_000),
            sm_clock_mhz: Some(1980),
            memory_clock_mhz: Some(2619),
            gpu_utilization_percent: Some(87),
            memory_utilization_percent: Some(41),
        }
    }

    fn value(table: &[Scalar], name: &str, uuid: &str) -> Option<f64> {
        let s = table.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name}"));
        s.samples.iter().find(|(l, _)| l[0].1 == uuid).map(|(_, v)| *v)
    }

    #[test]
    fn readings_convert_to_base_units_with_the_gpus_labels() {
        let s = h200();
        let table = scalars(std::slice::from_ref(&s));
        assert_eq!(table.len(), 7);
        assert!(table.iter().all(|t| t.kind == Kind::Gauge && t.name.starts_with("brink_gpu_") && t.samples.len() == 1));
        let got: Vec<(&str, f64)> = table.iter().map(|t| (t.name, t.samples[0].1)).collect();
        assert_eq!(
            got,
            [
                ("brink_gpu_temperature_celsius", 47.0),
                ("brink_gpu_power_watts", 123.456),
                ("brink_gpu_power_limit_watts", 700.0),
                ("brink_gpu_sm_clock_hertz", 1.98e9),
                ("brink_gpu_memory_clock_hertz", 2.619e9),
                ("brink_gpu_utilization_ratio", 0.87),
                ("brink_gpu_memory_utilization_ratio", 0.41),
            ]
        );
        assert_eq!(table[0].samples[0].0, vec![("gpu_uuid", s.uuid.clone()), ("gpu_name", "NVIDIA H200".to_string())]);
    }

    /// GB10 through NVML: no memory clock, no memory utilisation. Those series are absent, not 0,
    /// while the other GPU keeps its own.
    #[test]
    fn unsupported_readings_are_absent_not_zero() {
        let gb10 = GpuSample {
            uuid: "GPU-6b2d371a".into(),
            name: "NVIDIA GB10".into(),
            temperature_celsius: Some(0),
            power_milliwatts: Some(30_000),
            power_limit_milliwatts: None,
            sm_clock_mhz: Some(2418),
            memory_clock_mhz: None,
            gpu_utilization_percent: Some(0),
            memory_utilization_percent: None,
        };
        let h = h200();
        let table = scalars(&[gb10.clone(), h.clone()]);
        assert_eq!(value(&table, "brink_gpu_memory_clock_hertz", &gb10.uuid), None);
        assert_eq!(value(&table, "brink_gpu_memory_utilization_ratio", &gb10.uuid), None);
        assert_eq!(value(&table, "brink_gpu_power_limit_watts", &gb10.uuid), None);
        assert_eq!(value(&table, "brink_gpu_memory_clock_hertz", &h.uuid), Some(2.619e9));
        // A real zero reading stays a zero.
        assert_eq!(value(&table, "brink_gpu_utilization_ratio", &gb10.uuid), Some(0.0));
        assert_eq!(value(&table, "brink_gpu_temperature_celsius", &gb10.uuid), Some(0.0));
    }

    #[test]
    fn no_gpus_give_the_names_without_series() {
        let table = scalars(&[]);
        assert_eq!(table.len(), 7);
        assert!(table.iter().all(|t| t.samples.is_empty()));
    }
}
