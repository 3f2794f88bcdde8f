//! Running one model-level case on a loaded engine (in the worker process): the decode
//! sequences' prompts first, then ONE step with every sequence's rows, then each sequence again
//! alone in reference chunks; the last-position logits of the step and of the references are
//! compared.
//!
//! The decode sequences are the same eight short prompts in every case, so their references
//! (each alone, from position 0) are computed once per worker and kept ([`References`]); their
//! prompts are prefilled together in one setup step. On a 48-layer model a step costs ~15 ms
//! however few its rows, and these were 16 of the ~25 steps of a small mixed case.

use std::collections::HashMap;
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

/// Reference logits of short sequences by their tokens: the decode sequences recur in every
/// mixed case. Only sequences up to [`References::MAX_TOKENS`] are kept, at most
/// [`References::MAX_ENTRIES`] of them.
#[derive(Default)]
pub struct References {
    by_tokens: HashMap<Vec<u32>, Vec<f32>>,
}

impl References {
    pub const MAX_TOKENS: usize = 16;
    pub const MAX_ENTRIES: usize = 64;

    /// [`reference`] of `tokens`, from the cache when it was computed before.
    fn get(&mut self, engine: &mut dyn AnyEngine, blocks: &[u32], tokens: &[u32]) -> Result<Vec<f32>, String> {
        if let Some(r) = self.by_tokens.get(tokens) {
            return Ok(r.clone());
        }
        let r = reference(engine, blocks, tokens, REFERENCE_CHUNK as usize)?;
        if tokens.len() <= Self::MAX_TOKENS && self.by_tokens.len() < Self::MAX_ENTRIES {
            self.by_tokens.insert(tokens.to_vec(), r.clone());
        }
        Ok(r)
    }
}

/// The tokens of sequence `seq` of `case`: the decode sequences (`cached > 0`) are the same in
/// every case, so their references are reused; the others are the case's own.
fn sequence_tokens(case: &ModelCase, seq: usize, plan: &SeqPlan, vocab: usize) -> Vec<u32> {
    let case_key = if plan.cached > 0 { 0 } else { case.tokens };
    prompt_tokens(case_key, seq as u64, plan.len(), vocab)
}

/// Runs `case` on `engine`, drawing block tables from `pool` (returned to it afterwards).
pub fn run_case(engine: &mut dyn AnyEngine, pool: &mut BlockPool, refs: &mut References, case: &ModelCase) -> ModelOutcome {
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
    let out = run_with(engine, refs, case, &seqs, &tables).unwrap_or_else(|error| ModelOutcome::Error { error });
    tables.into_iter().rev().for_each(|t| pool.give_back(t));
    out
}

fn run_with(
    engine: &mut dyn AnyEngine,
    refs: &mut References,
    case: &ModelCase,
    seqs: &[SeqPlan],
    tables: &[Vec<u32>],
) -> Result<ModelOutcome, String> {
    let vocab = engine.config().vocab;
    let tokens: Vec<Vec<u32>> = seqs.iter().enumerate().map(|(i, s)| sequence_tokens(case, i, s, vocab)).collect();
    // The decode sequences' prompts, prefilled together: their KV is in the cache when the step
    // under test decodes. No setup step has more rows than the case's count, so a failure that
    // starts at some row count is never charged to a smaller count.
    let setup: Vec<StepItem> = seqs
        .iter()
        .zip(&tokens)
        .zip(tables)
        .filter(|((s, _), _)| s.cached > 0)
        .map(|((s, t), blocks)| StepItem { blocks, start_pos: 0, tokens: &t[..s.cached as usize], logits: Logits::None })
        .collect();
    let per_step = (case.tokens / seqs.iter().map(|s| s.cached).max().unwrap_or(1).max(1)).max(1) as usize;
    for group in setup.chunks(per_step) {
        engine.step(group).map_err(|e| e.to_string())?;
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
    let mut reference_logits = Vec::with_capacity(step.len());
    for (t, blocks) in tokens.iter().zip(tables) {
        reference_logits.extend(refs.get(engine, blocks, t)?);
    }
    let refs = reference_logits;
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

    /// Two mixed cases on the tiny model (CPU): both compare equal within the tolerance, and
    /// the eight decode sequences' references are computed once, for the first.
    #[test]
    fn mixed_cases_reuse_the_decode_references() {
        use super::super::cases::{Composition, DECODE_PROMPT, TOLERANCE, pool_blocks};
        use crate::synth::{Preset, SynthSpec};
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        crate::synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap();
        let opts = crate::EngineOptions { context: 256, slots: 1, prefill_chunk: 256, block_size: 0 };
        let mut engine = crate::open(&model, crate::BackendKind::Cpu, opts).unwrap();
        let mut pool = BlockPool::new(pool_blocks(64, engine.block_size() as u64) as u32);
        let mut refs = References::default();
        for tokens in [12u64, 40] {
            let mut batch = vec![tokens - 8];
            batch.extend([1; 8]);
            let case = ModelCase { id: format!("m/t{tokens}"), composition: Composition::MixedDecode, tokens, batch, reasons: vec![] };
            assert_eq!(case.sequences()[1].cached, DECODE_PROMPT);
            match run_case(engine.as_mut(), &mut pool, &mut refs, &case) {
                ModelOutcome::Compared { max_err, compared, non_finite_rows, .. } => {
                    assert!(max_err <= TOLERANCE && non_finite_rows == 0, "{tokens}: {max_err}");
                    assert_eq!(compared, 9 * engine.config().vocab as u64);
                }
                other => panic!("{tokens}: {other:?}"),
            }
            // t12: the 8 decode sequences and the 4-token prefill are kept; t40 reuses the 8 and
            // its 32-token prefill is too long to keep.
            assert_eq!(refs.by_tokens.len(), 9, "t{tokens}");
        }
    }
}
