//! A labelled histogram with fixed bucket bounds: the store the Prometheus text and the OTLP
//! export both read from (pure: no I/O, no clock).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Label names and values of one series, in a fixed order (the key of a series).
pub type Labels = Vec<(&'static str, String)>;

/// One series' counts: `buckets[i]` counts observations `<= bounds[i]` and above the bound
/// before it (not cumulative); the last entry counts those above every bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub buckets: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    series: Mutex<BTreeMap<Labels, Series>>,
}

impl Histogram {
    /// `bounds` ascending (the semantic conventions' advisory boundaries).
    pub const fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, series: Mutex::new(BTreeMap::new()) }
    }

    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    /// Counts `value` in `labels`' series. NaN (never produced by a clock) is dropped rather
    /// than poisoning the sum.
    pub fn observe(&self, labels: Labels, value: f64) {
        if value.is_nan() {
            return;
        }
        let slot = self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len());
        if let Ok(mut m) = self.series.lock() {
            let s = m.entry(labels).or_insert_with(|| Series { buckets: vec![0; self.bounds.len() + 1], sum: 0.0, count: 0 });
            s.buckets[slot] += 1;
            s.sum += value;
            s.count += 1;
        }
    }

    /// Every series, ordered by labels.
    pub fn snapshot(&self) -> Vec<(Labels, Series)> {
        self.series.lock().map(|m| m.iter().map(|(l, s)| (l.clone(), s.clone())).collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_bucket_of_their_upper_bound_per_series() {
        static B: [f64; 3] = [0.1, 1.0, 10.0];
        let h = Histogram::new(&B);
        let l = |m: &str| vec![("model", m.to_string())];
        for v in [0.05, 0.1, 0.5, 1.0, 3.0, 100.0, f64::NAN] {
            h.observe(l("a"), v);
        }
        h.observe(l("b"), 2.0);
        let snap = h.snapshot();
        assert_eq!(snap.len(), 2);
        assert_eq!(snap[0].0, l("a"));
        // Upper bounds are inclusive, as Prometheus' `le` and OTLP's explicit buckets read them.
        assert_eq!(snap[0].1.buckets, [2, 2, 1, 1]);
        assert_eq!(snap[0].1.count, 6);
        assert!((snap[0].1.sum - 104.65).abs() < 1e-9, "{}", snap[0].1.sum);
        assert_eq!(snap[1].1, Series { buckets: vec![0, 0, 1, 0], sum: 2.0, count: 1 });
    }
}
