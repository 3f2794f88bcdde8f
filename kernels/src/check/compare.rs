//! Comparing GPU outputs with the CPU reference: the relative error over what was compared,
//! and which rows of a big output to compare.

use crate::testdata::hash2;

/// Tracks max |gpu − ref| / max |ref| over everything compared.
#[derive(Clone, Debug, Default)]
pub struct RelErr {
    max_abs_diff: f64,
    max_abs_ref: f64,
    pub compared: u64,
    nan: bool,
    /// First (index, gpu, ref) whose difference was the largest so far.
    pub worst: Option<(u64, f32, f32)>,
}

impl RelErr {
    pub fn add(&mut self, index: u64, gpu: f32, reference: f32) {
        self.compared += 1;
        if !gpu.is_finite() && reference.is_finite() {
            self.nan = true;
            self.worst.get_or_insert((index, gpu, reference));
            return;
        }
        let d = (gpu as f64 - reference as f64).abs();
        if d > self.max_abs_diff {
            self.max_abs_diff = d;
            self.worst = Some((index, gpu, reference));
        }
        self.max_abs_ref = self.max_abs_ref.max((reference as f64).abs());
    }

    pub fn add_slice(&mut self, first_index: u64, gpu: &[f32], reference: &[f32]) {
        for (i, (g, r)) in gpu.iter().zip(reference).enumerate() {
            self.add(first_index + i as u64, *g, *r);
        }
    }

    /// Infinite when the GPU produced a non-finite value the reference did not.
    pub fn value(&self) -> f64 {
        if self.nan {
            return f64::INFINITY;
        }
        if self.max_abs_ref == 0.0 {
            return if self.max_abs_diff == 0.0 { 0.0 } else { f64::INFINITY };
        }
        self.max_abs_diff / self.max_abs_ref
    }

    pub fn describe(&self) -> String {
        match self.worst {
            Some((i, g, r)) => format!("worst at {i}: gpu {g} vs ref {r}"),
            None => String::new(),
        }
    }
}

/// Rows of an `n`-row output to compare with the reference when comparing all is too slow:
/// all of them up to `max`, otherwise the first and last two tiles (tails are where bugs
/// live), the rows around every `tile` boundary near the 2^16 and 2^31 marks that fit, and
/// pseudo-random rows to make up `max`. Sorted, distinct.
pub fn sample_rows(n: u64, tile: u64, max: usize, seed: u64) -> Vec<u64> {
    if n <= max as u64 {
        return (0..n).collect();
    }
    let mut rows: Vec<u64> = Vec::with_capacity(max + 4 * tile as usize);
    rows.extend(0..tile.min(n));
    rows.extend(n.saturating_sub(2 * tile)..n);
    for mark in [65_535u64, 65_536, 1 << 31] {
        for r in [mark.saturating_sub(1), mark, mark + 1] {
            if r < n {
                rows.push(r);
            }
        }
    }
    let mut i = 0;
    while rows.len() < max + 2 * tile as usize {
        rows.push(hash2(seed, i) % n);
        i += 1;
    }
    rows.sort_unstable();
    rows.dedup();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_err_flags_nan_and_scales() {
        let mut e = RelErr::default();
        e.add(0, 1.0, 1.0);
        e.add(1, 2.1, 2.0);
        assert!((e.value() - 0.05).abs() < 1e-6);
        e.add(2, f32::NAN, 3.0);
        assert!(e.value().is_infinite());
    }

    #[test]
    fn samples_cover_tails() {
        let rows = sample_rows(100_000, 64, 256, 1);
        assert!(rows.contains(&0) && rows.contains(&99_999) && rows.contains(&(100_000 - 128)));
        assert!(rows.contains(&65_535) && rows.contains(&65_536));
        assert!(rows.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(sample_rows(10, 64, 256, 1), (0..10).collect::<Vec<_>>());
    }
}
