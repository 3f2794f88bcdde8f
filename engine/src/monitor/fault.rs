//! Fault injection, for tests of the watchdog only: makes a chosen layer hang or fail, on the
//! steps whose batch reaches a number of rows (so a "poison" prompt can be told from the small
//! requests around it).
//!
//! Spec: `hang:layer=N[,min-rows=R][,max-rows=M]`, `fail:…`, `launch-error:…` or
//! `sticky-launch-error:…` with the same keys (`max-rows` makes small steps fail, as a tail bug
//! does, while larger ones pass). A hang on the CPU backend is a blocking wait; on the CUDA
//! backend it is the negative control's tail-skip kernel, a real warp deadlock on the device. A
//! fail returns an error from the layer; a launch error returns one shaped as the CUDA backend's
//! rejected launch (kernel [`INJECTED_KERNEL`]), so the launch-error accounting is tested on
//! any machine; a sticky one claims the CUDA context is lost (the supervisor must restart the
//! engine child).

use std::fmt;
use std::str::FromStr;

use crate::model::{BackendError, KernelLaunchFailure};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    Hang,
    Fail,
    LaunchError { sticky: bool },
}

/// The kernel an injected launch error names.
pub const INJECTED_KERNEL: &str = "injected_fault";

/// The error a `launch-error` fault makes `backend` return at `layer`; a sticky one names the
/// error CUDA leaves a context unusable after.
pub fn injected_launch_error(backend: &'static str, layer: u32, op: impl fmt::Debug, sticky: bool) -> BackendError {
    let (phase, error) = if sticky { ("execution", "CUDA_ERROR_ILLEGAL_ADDRESS") } else { ("launch", "CUDA_ERROR_INVALID_VALUE") };
    let launch = KernelLaunchFailure { kernel: INJECTED_KERNEL.into(), phase: phase.into(), error: error.into(), sticky };
    let mut e = BackendError::new(backend, format!("injected launch error at layer {layer} ({op:?}): kernel {INJECTED_KERNEL}"));
    e.launch = Some(launch);
    e
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub layer: u32,
    /// Steps with fewer rows run normally.
    pub min_rows: u64,
    /// Steps with more rows run normally (`None`: no upper bound).
    pub max_rows: Option<u64>,
}

impl Fault {
    /// The fault to inject when `layer` of a step of `rows` rows starts, if any.
    pub fn fires(&self, layer: u32, rows: u64) -> Option<FaultKind> {
        (layer == self.layer && rows >= self.min_rows && self.max_rows.is_none_or(|m| rows <= m)).then_some(self.kind)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            FaultKind::Hang => "hang",
            FaultKind::Fail => "fail",
            FaultKind::LaunchError { sticky: false } => "launch-error",
            FaultKind::LaunchError { sticky: true } => "sticky-launch-error",
        };
        write!(f, "{kind}:layer={},min-rows={}", self.layer, self.min_rows)?;
        match self.max_rows {
            Some(m) => write!(f, ",max-rows={m}"),
            None => Ok(()),
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Fault, String> {
        let usage = "expected hang:layer=N[,min-rows=R][,max-rows=M], or fail:, launch-error: or sticky-launch-error: with the same keys";
        let (kind, rest) = s.split_once(':').ok_or_else(|| format!("fault {s:?}: {usage}"))?;
        let kind = match kind.trim() {
            "hang" => FaultKind::Hang,
            "fail" => FaultKind::Fail,
            "launch-error" => FaultKind::LaunchError { sticky: false },
            "sticky-launch-error" => FaultKind::LaunchError { sticky: true },
            other => return Err(format!("fault {s:?}: unknown kind {other:?}; {usage}")),
        };
        let (mut layer, mut min_rows, mut max_rows) = (None, 1u64, None);
        for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| format!("fault {s:?}: {part:?} is not key=value; {usage}"))?;
            let n: u64 = value.trim().parse().map_err(|_| format!("fault {s:?}: {key}={value:?} is not a number"))?;
            match key.trim() {
                "layer" => layer = Some(u32::try_from(n).map_err(|_| format!("fault {s:?}: layer {n} is too large"))?),
                "min-rows" => min_rows = n.max(1),
                "max-rows" => max_rows = Some(n),
                other => return Err(format!("fault {s:?}: unknown key {other:?}; {usage}")),
            }
        }
        let layer = layer.ok_or_else(|| format!("fault {s:?}: layer=N is required; {usage}"))?;
        Ok(Fault { kind, layer, min_rows, max_rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_fire_on_their_layer_and_size() {
        let f: Fault = "hang:layer=2,min-rows=1000".parse().unwrap();
        assert_eq!(f, Fault { kind: FaultKind::Hang, layer: 2, min_rows: 1000, max_rows: None });
        assert_eq!(f.fires(2, 1000), Some(FaultKind::Hang));
        assert_eq!(f.fires(2, 999), None);
        assert_eq!(f.fires(1, 5000), None);
        let f: Fault = "fail:layer=0".parse().unwrap();
        assert_eq!(f.fires(0, 1), Some(FaultKind::Fail));
        assert_eq!(f.to_string().parse::<Fault>().unwrap(), f);
        let f: Fault = "launch-error:layer=1,min-rows=2".parse().unwrap();
        assert_eq!((f.fires(1, 2), f.to_string().parse::<Fault>().unwrap()), (Some(FaultKind::LaunchError { sticky: false }), f));
        let f: Fault = "sticky-launch-error:layer=0".parse().unwrap();
        assert_eq!((f.kind, f.to_string().parse::<Fault>().unwrap()), (FaultKind::LaunchError { sticky: true }, f));
        let e = injected_launch_error("cpu", 1, "AttnNorm", false);
        let l = e.launch.as_ref().unwrap();
        assert_eq!((l.kernel.as_str(), l.phase.as_str(), l.sticky), (INJECTED_KERNEL, "launch", false));
        assert!(e.to_string().contains("injected launch error at layer 1"), "{e}");
        let l = injected_launch_error("cuda", 0, "Embed", true).launch.unwrap();
        assert_eq!((l.phase.as_str(), l.error.as_str(), l.sticky), ("execution", "CUDA_ERROR_ILLEGAL_ADDRESS", true));
        let f: Fault = "fail:layer=0,max-rows=3".parse().unwrap();
        assert_eq!((f.fires(0, 1), f.fires(0, 3), f.fires(0, 4)), (Some(FaultKind::Fail), Some(FaultKind::Fail), None));
        assert_eq!(f.to_string().parse::<Fault>().unwrap(), f);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (spec, needle) in [
            ("hang", "expected"),
            ("crash:layer=1", "unknown kind"),
            ("hang:min-rows=5", "layer=N is required"),
            ("hang:layer=x", "not a number"),
            ("hang:layer=1,depth=2", "unknown key"),
            ("hang:layer", "not key=value"),
            ("hang:layer=99999999999", "too large"),
        ] {
            let e = spec.parse::<Fault>().unwrap_err();
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }
}
