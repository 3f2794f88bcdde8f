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
/// pseudo-random rows to make up `max`. Sorted, distinct. [`sample_rows_around`] with no
/// critical index of the caller's own.
pub fn sample_rows(n: u64, tile: u64, max: usize, seed: u64) -> Vec<u64> {
    sample_rows_around(n, tile, max, seed, &[])
}

/// The rows [`sample_rows_around`] always includes, whatever `max`: the first row and the
/// whole first tile, the last two tiles (the tail tile, partial or whole, and the one before),
/// hence the last row, and every critical index ±1 (the caller's and the 2^16 and 2^31 marks)
/// that lies inside `0..n`. Sorted, distinct.
pub fn always_sampled(n: u64, tile: u64, critical: &[u64]) -> Vec<u64> {
    let mut rows = always_unsorted(n, tile, critical);
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// [`always_sampled`]'s rows in the order the sampling has always taken them (repeats kept):
/// the random fill counts them as they come, so the rows sampled stay those of earlier runs.
fn always_unsorted(n: u64, tile: u64, critical: &[u64]) -> Vec<u64> {
    let mut rows: Vec<u64> = Vec::with_capacity(3 * tile as usize + 3 * (critical.len() + 3));
    rows.extend(0..tile.max(1).min(n));
    rows.extend(n.saturating_sub(2 * tile.max(1))..n);
    for &mark in [65_535u64, 65_536, 1 << 31].iter().chain(critical) {
        rows.extend([mark.checked_sub(1), Some(mark), mark.checked_add(1)].into_iter().flatten().filter(|&r| r < n));
    }
    rows
}

/// Rows of an `n`-row output to compare: all of them up to `max`; otherwise
/// [`always_sampled`]`(n, tile, critical)` and pseudo-random rows (from `seed`) to make up
/// `max` beyond the tiles. Sorted, distinct; a pure function of its arguments.
pub fn sample_rows_around(n: u64, tile: u64, max: usize, seed: u64, critical: &[u64]) -> Vec<u64> {
    if n <= max as u64 {
        return (0..n).collect();
    }
    let mut rows = always_unsorted(n, tile, critical);
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

    /// The rule as a table: (n, tile, critical indices) and the rows that must always be in.
    #[test]
    fn always_sampled_rows_table() {
        let table: &[(u64, u64, &[u64], &[u64])] = &[
            // First tile, last two tiles (the tail tile of 4 rows and the whole one before it).
            (100, 8, &[], &[0, 1, 7, 84, 91, 92, 95, 99]),
            // n a multiple of the tile: the last two whole tiles.
            (96, 8, &[], &[0, 7, 80, 87, 88, 95]),
            // A critical index: itself and its neighbours.
            (1000, 16, &[500], &[0, 15, 499, 500, 501, 968, 999]),
            // Critical indices at the ends clip to the output.
            (1000, 16, &[0, 999, 5000], &[0, 1, 998, 999]),
            // The 2^16 marks when they fit.
            (70_000, 64, &[], &[65_534, 65_535, 65_536, 65_537, 69_872, 69_999]),
            // A tile wider than the output: every row.
            (5, 64, &[], &[0, 1, 2, 3, 4]),
        ];
        for &(n, tile, critical, must) in table {
            let always = always_sampled(n, tile, critical);
            assert!(always.windows(2).all(|w| w[0] < w[1]) && always.iter().all(|&r| r < n), "{n} {tile}");
            for m in must {
                assert!(always.contains(m), "n {n} tile {tile} critical {critical:?}: {m} missing");
            }
            assert!(!always.iter().any(|&r| r >= n));
            // Sampling keeps every always-included row, whatever the budget and seed.
            for (max, seed) in [(1, 0), (16, 7), (256, 99)] {
                let rows = sample_rows_around(n, tile, max, seed, critical);
                assert!(always.iter().all(|r| rows.contains(r)), "n {n} max {max}");
                assert!(rows.windows(2).all(|w| w[0] < w[1]) && rows.iter().all(|&r| r < n));
                assert_eq!(rows, sample_rows_around(n, tile, max, seed, critical), "a pure function");
            }
        }
        // Small outputs are compared whole.
        assert_eq!(sample_rows_around(40, 64, 40, 3, &[7]), (0..40).collect::<Vec<_>>());
        // The old entry point is the rule with no caller indices.
        assert_eq!(sample_rows(100_000, 64, 256, 1), sample_rows_around(100_000, 64, 256, 1, &[]));
    }
}
