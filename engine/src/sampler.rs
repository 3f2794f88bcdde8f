//! Choosing the next token from a row of logits on the host: greedy at temperature 0,
//! otherwise temperature, then top-k, then top-p (nucleus), then a seeded draw.
//!
//! Greedy is what the parity tests compare; the stochastic path is deterministic for a given
//! seed so a request with `seed` repeats exactly.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 (or below) means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Checks the ranges an API request can get wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("temperature must be a finite number >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

/// Index of the largest logit; ties go to the lowest id, NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() && !l.is_nan() {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Sampler { params, rng: StdRng::seed_from_u64(params.seed) }
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = self.params;
        if p.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut cand: Vec<(u32, f32)> =
            logits.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (i as u32, l / p.temperature)).collect();
        if cand.is_empty() {
            return 0;
        }
        // Descending by logit, ties to the lowest id, so the kept set is well defined.
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|&(_, l)| ((l - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs.iter().position(|&q| {
                acc += q;
                acc >= p.top_p as f64
            });
            let keep = keep.map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            cand.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        let mut draw = self.rng.random::<f64>() * total;
        for (i, q) in probs.iter().enumerate() {
            draw -= q;
            if draw < 0.0 {
                return cand[i].0;
            }
        }
        cand[cand.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_first_maximum_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.2]), 1);
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 0.2, 5.0]), 2);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.3, 2.0, 1.9, -4.0];
        for params in [
            SamplingParams { temperature: 1.0, top_k: 1, top_p: 1.0, seed: 7 },
            SamplingParams { temperature: 1.0, top_k: 0, top_p: 1e-6, seed: 7 },
        ] {
            let mut s = Sampler::new(params);
            assert!((0..50).all(|_| s.sample(&logits) == 1));
        }
    }

    #[test]
    fn sampling_follows_the_distribution_and_repeats_per_seed() {
        let logits = [0.0f32, (3.0f32).ln()];
        let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 42 };
        let mut s = Sampler::new(params);
        let draws: Vec<u32> = (0..4000).map(|_| s.sample(&logits)).collect();
        let ones = draws.iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
        let mut again = Sampler::new(params);
        assert!(draws.iter().all(|&t| again.sample(&logits) == t));
    }

    #[test]
    fn validation_names_the_bad_field() {
        assert!(SamplingParams { temperature: -1.0, ..Default::default() }.validate().unwrap_err().contains("temperature"));
        assert!(SamplingParams { top_p: 0.0, ..Default::default() }.validate().unwrap_err().contains("top_p"));
    }
}
