//! Routings for tests and the self-test: which experts each token's top-k slots pick.
//!
//! Besides random routing, two worst cases are constructed on purpose: every token on the same
//! experts (one expert holds all tokens: the largest segment), and maximal padding after
//! alignment (as many experts as possible hold `1 mod tile` rows, so each wastes `tile - 1`).

use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use crate::testdata::hash2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Each token picks `top_k` distinct experts uniformly at random.
    Uniform,
    /// Every token picks experts `0..top_k`: expert 0 (and each of the first `top_k`) holds
    /// every token.
    OneExpert,
    /// Expert counts `≡ 1 (mod tile)` wherever possible: the most padding alignment can add.
    MaxPadding,
}

impl Routing {
    pub fn name(self) -> &'static str {
        match self {
            Routing::Uniform => "uniform",
            Routing::OneExpert => "one-expert",
            Routing::MaxPadding => "max-padding",
        }
    }
}

/// Top-k expert ids, token-major: `ids[t * top_k + j]`. Within a token the ids are distinct.
pub fn route(routing: Routing, tokens: usize, experts: usize, top_k: usize, tile: usize, seed: u64) -> Vec<i32> {
    assert!(top_k >= 1 && top_k <= experts, "top_k {top_k} must be in 1..={experts}");
    match routing {
        Routing::OneExpert => (0..tokens).flat_map(|_| 0..top_k as i32).collect(),
        Routing::Uniform => {
            let mut ids = Vec::with_capacity(tokens * top_k);
            let mut picked = vec![false; experts];
            for t in 0..tokens {
                let mut draw = 0u64;
                for _ in 0..top_k {
                    // Rejection-sample a distinct expert (top_k <= experts, so this ends).
                    let e = loop {
                        let e = (hash2(seed, (t as u64) << 20 | draw) % experts as u64) as usize;
                        draw += 1;
                        if !picked[e] {
                            break e;
                        }
                    };
                    picked[e] = true;
                    ids.push(e as i32);
                }
                for j in 0..top_k {
                    picked[ids[t * top_k + j] as usize] = false;
                }
            }
            ids
        }
        Routing::MaxPadding => assign_counts(&max_padding_counts(tokens, experts, top_k, tile), tokens, top_k),
    }
}

/// Expert counts with as many `≡ 1 (mod tile)` as the tokens allow, each at most `tokens`.
pub fn max_padding_counts(tokens: usize, experts: usize, top_k: usize, tile: usize) -> Vec<usize> {
    let pairs = tokens * top_k;
    let mut counts = vec![0usize; experts];
    let mut left = pairs;
    for c in counts.iter_mut() {
        if left == 0 {
            break;
        }
        *c = 1;
        left -= 1;
    }
    // Whole tiles keep each count at 1 mod tile; hand them out round-robin.
    let mut progress = true;
    while left >= tile && progress {
        progress = false;
        for c in counts.iter_mut() {
            if left >= tile && *c + tile <= tokens {
                *c += tile;
                left -= tile;
                progress = true;
            }
        }
    }
    // What is left (less than a tile, or blocked by the per-expert cap) goes wherever it fits.
    for c in counts.iter_mut() {
        let add = left.min(tokens - *c);
        *c += add;
        left -= add;
    }
    debug_assert_eq!(left, 0);
    counts
}

/// Turns per-expert counts (each <= tokens, summing to tokens * top_k) into a routing where
/// each token picks `top_k` distinct experts: every token takes the experts with the most
/// rows still to place, which always succeeds under those two conditions.
fn assign_counts(counts: &[usize], tokens: usize, top_k: usize) -> Vec<i32> {
    let mut heap: BinaryHeap<(usize, std::cmp::Reverse<usize>)> =
        counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(e, &c)| (c, std::cmp::Reverse(e))).collect();
    let mut ids = Vec::with_capacity(tokens * top_k);
    let mut taken = Vec::with_capacity(top_k);
    for _ in 0..tokens {
        taken.clear();
        for _ in 0..top_k {
            let (c, e) = heap.pop().expect("counts sum to tokens * top_k");
            ids.push(e.0 as i32);
            taken.push((c - 1, e));
        }
        for &(c, e) in &taken {
            if c > 0 {
                heap.push((c, e));
            }
        }
    }
    ids
}

/// Rows per expert after routing.
pub fn expert_counts(ids: &[i32], experts: usize) -> Vec<usize> {
    let mut c = vec![0usize; experts];
    for &e in ids {
        c[e as usize] += 1;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn distinct_per_token(ids: &[i32], k: usize) -> bool {
        ids.chunks(k).all(|c| {
            let mut v = c.to_vec();
            v.sort();
            v.dedup();
            v.len() == k
        })
    }

    #[test]
    fn routings_are_valid() {
        for &(t, e, k) in &[(1, 128, 8), (7, 16, 4), (100, 128, 8), (3000, 128, 8), (65, 8, 8), (5, 10, 10)] {
            for r in [Routing::Uniform, Routing::OneExpert, Routing::MaxPadding] {
                let ids = route(r, t, e, k, 64, 1);
                assert_eq!(ids.len(), t * k);
                assert!(ids.iter().all(|&x| (0..e as i32).contains(&x)));
                assert!(distinct_per_token(&ids, k), "{r:?} t={t} e={e} k={k}");
            }
        }
    }

    #[test]
    fn max_padding_leaves_one_mod_tile() {
        let (t, e, k, tile) = (8192, 128, 8, 64);
        let ids = route(Routing::MaxPadding, t, e, k, tile, 0);
        let counts = expert_counts(&ids, e);
        let ones = counts.iter().filter(|&&c| c % tile == 1).count();
        // 65536 pairs over 128 experts: every expert can hold 1 + 64m rows but one takes the rest.
        assert!(ones >= e - 1, "{ones} experts at 1 mod {tile}");
        let padded: usize = counts.iter().map(|c| c.div_ceil(tile) * tile).sum();
        let uniform: usize = expert_counts(&route(Routing::Uniform, t, e, k, tile, 0), e).iter().map(|c| c.div_ceil(tile) * tile).sum();
        assert!(padded > uniform, "max padding {padded} vs uniform {uniform}");
    }

    #[test]
    fn one_expert_holds_every_token() {
        let ids = route(Routing::OneExpert, 1000, 128, 8, 64, 0);
        assert_eq!(expert_counts(&ids, 128)[0], 1000);
    }
}
