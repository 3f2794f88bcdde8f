//! Comparing two sets of logits row by row: the measure behind the llama.cpp parity tests and
//! the CUDA-against-CPU checks.
//!
//! The error of a row is `max_i |a_i − b_i| / max_i |b_i|` (relative to the row's largest
//! reference logit, so tiny logits near zero do not blow it up); a set's error is its worst row.

/// How far `a` is from the reference `b`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitDiff {
    pub rows: usize,
    /// Worst row's relative error.
    pub max_rel_err: f64,
    /// Row with that error.
    pub worst_row: usize,
    /// Rows whose argmax differs.
    pub argmax_mismatches: usize,
    /// Rows of `a` holding NaN or infinity.
    pub non_finite_rows: usize,
    /// Median and 99th percentile of the finite rows' errors: between backends whose
    /// arithmetic differs, a few rows can move far (a near-tie in the router's top-k picks
    /// another expert) while a broken kernel moves most rows, or all rows past some count.
    pub median_rel_err: f64,
    pub p99_rel_err: f64,
}

impl LogitDiff {
    pub fn within(&self, tolerance: f64) -> bool {
        self.non_finite_rows == 0 && self.max_rel_err <= tolerance
    }
}

/// Compares `a` with the reference `b`, both `[rows, vocab]`. `None` if the shapes differ.
pub fn compare(a: &[f32], b: &[f32], vocab: usize) -> Option<LogitDiff> {
    if vocab == 0 || a.len() != b.len() || !a.len().is_multiple_of(vocab) {
        return None;
    }
    let mut d = LogitDiff {
        rows: a.len() / vocab,
        max_rel_err: 0.0,
        worst_row: 0,
        argmax_mismatches: 0,
        non_finite_rows: 0,
        median_rel_err: 0.0,
        p99_rel_err: 0.0,
    };
    let mut errs = Vec::with_capacity(d.rows);
    for (r, (ra, rb)) in a.chunks_exact(vocab).zip(b.chunks_exact(vocab)).enumerate() {
        if ra.iter().any(|x| !x.is_finite()) {
            d.non_finite_rows += 1;
            continue;
        }
        let scale = rb.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs())).max(f64::MIN_POSITIVE);
        let err = ra.iter().zip(rb).fold(0.0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / scale;
        errs.push(err);
        if err > d.max_rel_err {
            d.max_rel_err = err;
            d.worst_row = r;
        }
        if crate::sampler::argmax(ra) != crate::sampler::argmax(rb) {
            d.argmax_mismatches += 1;
        }
    }
    errs.sort_by(f64::total_cmp);
    let at = |q: f64| errs.get(((errs.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    (d.median_rel_err, d.p99_rel_err) = (at(0.5), at(0.99));
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_relative_to_the_rows_largest_logit() {
        let b = [1.0, -4.0, 2.0, 0.5, 0.25, 0.0];
        let a = [1.0, -4.0, 2.0 + 0.004, 0.5, 0.55, 0.0];
        let d = compare(&a, &b, 3).unwrap();
        assert_eq!(d.rows, 2);
        assert!((d.max_rel_err - 0.6).abs() < 1e-6, "{d:?}");
        assert_eq!(d.worst_row, 1);
        assert_eq!(d.argmax_mismatches, 1);
        assert!(!d.within(0.05) && d.within(0.7));
        assert_eq!((d.median_rel_err, d.p99_rel_err), (d.max_rel_err, d.max_rel_err), "{d:?}");
    }

    #[test]
    fn nan_rows_and_shape_mismatches_are_reported() {
        let d = compare(&[f32::NAN, 1.0], &[0.0, 1.0], 2).unwrap();
        assert_eq!(d.non_finite_rows, 1);
        assert!(!d.within(1.0));
        assert!(compare(&[1.0], &[1.0, 2.0], 1).is_none());
        assert!(compare(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0], 2).is_none());
    }
}
