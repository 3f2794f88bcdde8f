//! Running one model-level case on a loaded engine (in the worker process): the decode
//! sequences' prompts first, then ONE step with every sequence's rows, then each sequence again
//! alone in reference chunks; the last-position logits of the step and of the references are
//! compared.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::cases::{ModelCase, REFERENCE_CHUNK, SeqPlan};
use crate::backend::Logits;
use crate::engine::{AnyEngine, StepItem};
use crate::parity;

/// What running a case found (judged against the tolerance by the parent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ModelOutcome {
    Compared {
        /// Worst sequence's `max |step - reference| / max |reference|`.
        max_err: f64,
        /// Sequence with that error.
        worst_seq: u64,
        /// Sequences whose step logits hold NaN or infinity.
        non_finite_rows: u64,
        argmax_mismatches: u64,
        /// Logits compared (sequences x vocab).
        compared: u64,
        /// The batched step alone.
        step_ms: f64,
    },
    /// The engine refused or failed a step (a typed error, not a hang).
    Error { error: String },
}

/// The KV blocks cases draw their block tables from. Handed out from the top down, so a
/// sequence's table is not the identity map of positions to blocks that a bug could hide behind.
pub struct BlockPool {
    free: Vec<u32>,
}

impl BlockPool {
    pub fn new(blocks: u32) -> Self {
        BlockPool { free: (0..blocks).collect() }
    }

    /// `n` blocks, or an error naming the shortfall.
    pub fn take(&mut self, n: u64) -> Result<Vec<u32>, String> {
        let n = usize::try_from(n).map_err(|_| format!("{n} KV blocks"))?;
        if n > self.free.len() {
            return Err(format!("the case needs {n} more KV blocks, the pool has {} free", self.free.len()));
        }
        Ok(self.free.split_off(self.free.len() - n).into_iter().rev().collect())
    }

    pub fn give_back(&mut self, mut blocks: Vec<u32>) {
        blocks.reverse();
        self.free.extend(blocks);
    }
}

/// Deterministic token ids of sequence `seq` of a case (a SplitMix64 stream): the same case
/// sees the same prompts in every run.
pub fn prompt_tokens(case_tokens: u64, seq: u64, len: u64, vocab: usize) -> Vec<u32> {
    let mut state = case_tokens.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seq.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % vocab.max(1) as u64) as u32
        })
        .collect()
}

/// Runs `tokens` of one sequence alone from position 0 in chunks of `chunk`; the logits of its
/// last position.
pub fn reference(engine: &mut dyn AnyEngine, blocks: &[u32], tokens: &[u32], chunk: usize) -> Result<Vec<f32>, String> {
    let mut last = Vec::new();
    let n = tokens.len().div_ceil(chunk.max(1));
    for (i, c) in tokens.chunks(chunk.max(1)).enumerate() {
        let want = if i + 1 == n { Logits::Last } else { Logits::None };
        let item = StepItem { blocks, start_pos: (i * chunk) as u32, tokens: c, logits: want };
        last = engine.step(&[item]).map_err(|e| e.to_string())?;
    }
    Ok(last)
}

/// Runs `case` on `engine`, drawing block tables from `pool` (returned to it afterwards).
pub fn run_case(engine: &mut dyn AnyEngine, pool: &mut BlockPool, case: &ModelCase) -> ModelOutcome {
    let seqs = case.sequences();
    let mut tables = Vec::with_capacity(seqs.len());
    for s in &seqs {
        match pool.take(s.len().div_ceil(engine.block_size() as u64)) {
            Ok(t) => tables.push(t),
            Err(e) => {
                tables.into_iter().for_each(|t| pool.give_back(t));
                return ModelOutcome::Error { error: e };
            }
        }
    }
    let out = run_with(engine, case, &seqs, &tables).unwrap_or_else(|error| ModelOutcome::Error { error });
    tables.into_iter().rev().for_each(|t| pool.give_back(t));
    out
}

fn run_with(engine: &mut dyn AnyEngine, case: &ModelCase, seqs: &[SeqPlan], tables: &[Vec<u32>]) -> Result<ModelOutcome, String> {
    let vocab = engine.config().vocab;
    let tokens: Vec<Vec<u32>> = seqs.iter().enumerate().map(|(i, s)| prompt_tokens(case.tokens, i as u64, s.len(), vocab)).collect();
    // The decode sequences' prompts, each alone: their KV is in the cache when the step decodes.
    for ((s, t), blocks) in seqs.iter().zip(&tokens).zip(tables) {
        if s.cached > 0 {
            reference(engine, blocks, &t[..s.cached as usize], REFERENCE_CHUNK as usize)?;
        }
    }
    let items: Vec<StepItem> = seqs
        .iter()
        .zip(&tokens)
        .zip(tables)
        .map(|((s, t), blocks)| StepItem { blocks, start_pos: s.cached as u32, tokens: &t[s.cached as usize..], logits: Logits::Last })
        .collect();
    let t0 = Instant::now();
    let step = engine.step(&items).map_err(|e| e.to_string())?;
    let step_ms = t0.elapsed().as_secs_f64() * 1e3;
    // Each sequence again from position 0, alone, in reference chunks. It rewrites its own blocks
    // before reading them (a chunk stores its K/V, then attends), so nothing of the step leaks in.
    let mut refs = Vec::with_capacity(step.len());
    for (t, blocks) in tokens.iter().zip(tables) {
        refs.extend(reference(engine, blocks, t, REFERENCE_CHUNK as usize)?);
    }
    if refs.iter().any(|x| !x.is_finite()) {
        return Err("the reference logits hold NaN or infinity".into());
    }
    let d = parity::compare(&step, &refs, vocab)
        .ok_or_else(|| format!("the step returned {} logits, the references {} (vocab {vocab})", step.len(), refs.len()))?;
    Ok(ModelOutcome::Compared {
        max_err: d.max_rel_err,
        worst_seq: d.worst_row as u64,
        non_finite_rows: d.non_finite_rows as u64,
        argmax_mismatches: d.argmax_mismatches as u64,
        compared: step.len() as u64,
        step_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_hands_out_descending_tables_and_refuses_a_shortfall() {
        let mut p = BlockPool::new(10);
        let a = p.take(3).unwrap();
        assert_eq!(a, vec![9, 8, 7]);
        let b = p.take(7).unwrap();
        assert_eq!(b.len(), 7);
        assert!(p.take(1).unwrap_err().contains("0 free"));
        p.give_back(b);
        p.give_back(a);
        assert_eq!(p.take(10).unwrap().len(), 10);
    }

    #[test]
    fn prompts_are_deterministic_in_the_vocabulary() {
        let a = prompt_tokens(64, 1, 100, 2000);
        assert_eq!(a, prompt_tokens(64, 1, 100, 2000));
        assert_ne!(a, prompt_tokens(64, 2, 100, 2000));
        assert!(a.iter().all(|&t| t < 2000));
        assert!(a.iter().collect::<std::collections::BTreeSet<_>>().len() > 50);
    }
}
