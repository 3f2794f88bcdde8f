//! Fault injection, for tests of the watchdog only: makes a chosen layer hang or fail, on the
//! steps whose batch reaches a number of rows (so a "poison" prompt can be told from the small
//! requests around it).
//!
//! Spec: `hang:layer=N[,min-rows=R][,max-rows=M]` or `fail:layer=N[,min-rows=R][,max-rows=M]`
//! (`max-rows` makes small steps fail, as a tail bug does, while larger ones pass). A hang on the CPU backend
//! is a blocking wait; on the CUDA backend it is the negative control's tail-skip kernel, a real
//! warp deadlock on the device. A fail returns an error from the layer.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    Hang,
    Fail,
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
        let usage = "expected hang:layer=N[,min-rows=R][,max-rows=M] or fail:layer=N[,min-rows=R][,max-rows=M]";
        let (kind, rest) = s.split_once(':').ok_or_else(|| format!("fault {s:?}: {usage}"))?;
        let kind = match kind.trim() {
            "hang" => FaultKind::Hang,
            "fail" => FaultKind::Fail,
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
