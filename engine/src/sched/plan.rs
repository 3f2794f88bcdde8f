//! The step planner of continuous batching: which sequences advance by how many tokens in the
//! next forward pass. Pure: it reads the running sequences and returns a plan.
//!
//! Every decoding sequence gets its one token first, so decodes never wait behind a long
//! prompt; the rest of the token budget goes to prefill chunks of the sequences still
//! prefilling, in FIFO order, so a long prompt is split over steps while decodes continue.

use super::SeqId;

/// Why step limits were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("scheduler limits: {0}")]
pub struct LimitsError(pub String);

/// The validated limits of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLimits {
    /// Tokens per step: `max_batch_tokens`, clamped to the node's validated envelope.
    pub budget: usize,
    /// Most tokens of one prefill chunk (≤ `budget`).
    pub prefill_chunk: usize,
    /// Most sequences in a step (≤ `budget`, so every decode always fits).
    pub max_seqs: usize,
}

impl StepLimits {
    /// `envelope`: the largest batch the node was validated at (e.g. 8192), when known; the
    /// budget and the chunk never exceed it.
    pub fn new(max_batch_tokens: usize, prefill_chunk: usize, max_seqs: usize, envelope: Option<usize>) -> Result<Self, LimitsError> {
        if max_batch_tokens == 0 || prefill_chunk == 0 || max_seqs == 0 || envelope == Some(0) {
            return Err(LimitsError(format!(
                "max_batch_tokens {max_batch_tokens}, prefill chunk {prefill_chunk}, max sequences {max_seqs} and the \
                 envelope {envelope:?} must all be at least 1"
            )));
        }
        let budget = envelope.map_or(max_batch_tokens, |e| max_batch_tokens.min(e));
        if max_seqs > budget {
            return Err(LimitsError(format!(
                "{max_seqs} sequences per step cannot all decode within a budget of {budget} tokens (max_batch_tokens \
                 {max_batch_tokens}, envelope {envelope:?})"
            )));
        }
        Ok(StepLimits { budget, prefill_chunk: prefill_chunk.min(budget), max_seqs })
    }
}

/// Extra limits on one sequence's prefill (from the poison quarantine).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeqLimits {
    /// Largest prefill chunk of this sequence.
    pub chunk: Option<usize>,
    /// Largest step total while this sequence prefills.
    pub batch: Option<usize>,
}

/// What the planner needs to know about a running sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqView {
    pub id: SeqId,
    /// Tokens whose KV is in the cache: the next chunk starts at this position.
    pub computed: usize,
    /// Known tokens not yet computed: the rest of the prompt, or the one sampled token.
    pub pending: usize,
    /// The prompt is done: `pending` is the last sampled token.
    pub decoding: bool,
    pub limits: SeqLimits,
}

/// One chunk of the step: positions `start_pos..start_pos + len` of `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedChunk {
    pub seq: SeqId,
    pub start_pos: usize,
    pub len: usize,
    /// Logits of the chunk's last row are needed: a decode, or the chunk that ends a prompt.
    pub logits: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Decodes first, then prefill chunks in FIFO order.
    pub chunks: Vec<PlannedChunk>,
}

impl StepPlan {
    pub fn total_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Rows with logits, in order: one per chunk with `logits`.
    pub fn logit_chunks(&self) -> impl Iterator<Item = &PlannedChunk> {
        self.chunks.iter().filter(|c| c.logits)
    }
}

/// Plans the next step over `seqs` (in admission order; at most `limits.max_seqs` of them are
/// considered, the earliest). Sequences with nothing pending are skipped.
pub fn plan_step(limits: &StepLimits, seqs: &[SeqView]) -> StepPlan {
    let seqs: Vec<&SeqView> = seqs.iter().filter(|s| s.pending > 0).take(limits.max_seqs).collect();
    let mut plan = StepPlan::default();
    let mut total = 0usize;
    for s in seqs.iter().filter(|s| s.decoding) {
        plan.chunks.push(PlannedChunk { seq: s.id, start_pos: s.computed, len: 1, logits: true });
        total += 1;
    }
    let mut budget = limits.budget;
    for s in seqs.iter().filter(|s| !s.decoding) {
        let mut cap = limits.prefill_chunk.min(s.limits.chunk.unwrap_or(usize::MAX)).max(1);
        if let Some(b) = s.limits.batch {
            // Even under a batch limit smaller than the decodes, a sequence gets one token per
            // step: a quarantined prompt is slowed down, never starved.
            budget = budget.min(b.max(total + 1));
        }
        if total >= budget {
            break;
        }
        cap = cap.min(budget - total).min(s.pending);
        plan.chunks.push(PlannedChunk { seq: s.id, start_pos: s.computed, len: cap, logits: cap == s.pending });
        total += cap;
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill(id: SeqId, computed: usize, pending: usize) -> SeqView {
        SeqView { id, computed, pending, decoding: false, limits: SeqLimits::default() }
    }

    fn decode(id: SeqId, computed: usize) -> SeqView {
        SeqView { id, computed, pending: 1, decoding: true, limits: SeqLimits::default() }
    }

    /// Advances views as if the plan ran: prefill chunks computed, a completed prompt decodes.
    fn apply(seqs: &mut [SeqView], plan: &StepPlan) {
        for c in &plan.chunks {
            let s = seqs.iter_mut().find(|s| s.id == c.seq).unwrap();
            assert_eq!(c.start_pos, s.computed);
            s.computed += c.len;
            s.pending -= c.len;
            if c.logits {
                s.decoding = true;
                s.pending = 1;
            }
        }
    }

    #[test]
    fn limits_are_validated_and_clamped_to_the_envelope() {
        let l = StepLimits::new(16_384, 12_000, 8, Some(8192)).unwrap();
        assert_eq!(l, StepLimits { budget: 8192, prefill_chunk: 8192, max_seqs: 8 });
        assert_eq!(StepLimits::new(4096, 512, 8, None).unwrap().budget, 4096);
        assert!(StepLimits::new(0, 512, 8, None).is_err());
        assert!(StepLimits::new(4096, 512, 8, Some(0)).is_err());
        let e = StepLimits::new(4096, 512, 64, Some(32)).unwrap_err();
        assert!(e.0.contains("64 sequences") && e.0.contains("budget of 32"), "{e}");
    }

    #[test]
    fn decodes_first_then_fifo_prefill_chunks() {
        let l = StepLimits::new(100, 64, 8, None).unwrap();
        let seqs = [prefill(1, 0, 70), decode(2, 10), prefill(3, 0, 50), decode(4, 3)];
        let p = plan_step(&l, &seqs);
        let got: Vec<_> = p.chunks.iter().map(|c| (c.seq, c.start_pos, c.len, c.logits)).collect();
        // 2 decodes, then 64 of seq 1 (chunk limit), then the 34 left of the budget to seq 3.
        assert_eq!(got, [(2, 10, 1, true), (4, 3, 1, true), (1, 0, 64, false), (3, 0, 34, false)]);
        assert_eq!(p.total_tokens(), 100);
        // A chunk that ends the prompt wants logits.
        let p = plan_step(&l, &[prefill(1, 64, 6)]);
        assert_eq!(p.chunks, [PlannedChunk { seq: 1, start_pos: 64, len: 6, logits: true }]);
        assert!(plan_step(&l, &[]).is_empty());
    }

    #[test]
    fn a_24k_prompt_takes_ceil_len_over_chunk_steps_while_decodes_continue() {
        let chunk = 2048;
        let l = StepLimits::new(chunk + 16, chunk, 8, Some(8192)).unwrap();
        let mut seqs = vec![decode(1, 100), decode(2, 200), prefill(3, 0, 24_000), decode(4, 5)];
        let mut steps = 0;
        while !seqs[2].decoding {
            let p = plan_step(&l, &seqs);
            assert!(p.total_tokens() <= l.budget);
            for id in [1, 2, 4] {
                assert!(p.chunks.iter().any(|c| c.seq == id && c.len == 1), "decode {id} skipped at step {steps}");
            }
            apply(&mut seqs, &p);
            steps += 1;
        }
        assert_eq!(steps, 24_000usize.div_ceil(chunk));
        assert_eq!(seqs[2].computed, 24_000);
        assert_eq!(seqs[0].computed, 100 + steps);
    }

    #[test]
    fn envelope_caps_every_step() {
        // max_batch_tokens far above what the node was validated at.
        let l = StepLimits::new(65_536, 32_768, 16, Some(8192)).unwrap();
        let mut seqs: Vec<SeqView> = (0..6).map(|i| prefill(i, 0, 30_000)).collect();
        seqs.extend((6..16).map(|i| decode(i, 50)));
        for _ in 0..40 {
            let p = plan_step(&l, &seqs);
            assert!(p.total_tokens() <= 8192, "{}", p.total_tokens());
            assert!(p.chunks.iter().all(|c| c.len <= 8192));
            apply(&mut seqs, &p);
        }
        assert!(seqs.iter().all(|s| s.decoding));
    }

    /// Random mixes of prompts: the budget holds every step and every sequence advances within
    /// a bounded number of steps (FIFO: its wait is at most the prompts ahead of it).
    #[test]
    fn nothing_starves_and_the_budget_holds() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..50 {
            let l = StepLimits::new(rng.random_range(16..600), rng.random_range(1..300), rng.random_range(1..16), None).unwrap();
            let mut seqs: Vec<SeqView> = (0..l.max_seqs as SeqId)
                .map(|i| if rng.random_bool(0.5) { decode(i, 9) } else { prefill(i, 0, rng.random_range(1..3000)) })
                .collect();
            // Upper bound on the steps before the last prompt finishes: every step moves the
            // FIFO head by at least one token, so it is at most the total prompt tokens.
            let bound: usize = seqs.iter().filter(|s| !s.decoding).map(|s| s.pending).sum::<usize>() + 1;
            let mut since = vec![0usize; seqs.len()];
            for step in 0..bound {
                let p = plan_step(&l, &seqs);
                assert!(p.total_tokens() <= l.budget && p.chunks.iter().all(|c| c.len <= l.prefill_chunk));
                // The FIFO head of the prefills always advances.
                if let Some(head) = seqs.iter().find(|s| !s.decoding) {
                    assert!(p.chunks.iter().any(|c| c.seq == head.id), "head {} stalled at step {step}", head.id);
                }
                for (i, s) in seqs.iter().enumerate() {
                    since[i] = if p.chunks.iter().any(|c| c.seq == s.id) { 0 } else { since[i] + 1 };
                    assert!(!s.decoding || since[i] == 0, "decode {} skipped", s.id);
                }
                apply(&mut seqs, &p);
                if seqs.iter().all(|s| s.decoding) {
                    break;
                }
            }
            assert!(seqs.iter().all(|s| s.decoding), "prompts left after {bound} steps");
        }
    }

    #[test]
    fn quarantine_limits_shrink_a_sequence_but_never_stop_it() {
        let l = StepLimits::new(4096, 4096, 8, None).unwrap();
        let mut q = prefill(1, 0, 10_000);
        q.limits = SeqLimits { chunk: Some(1000), batch: Some(1500) };
        let p = plan_step(&l, &[decode(2, 4), q, prefill(3, 0, 5000)]);
        let got: Vec<_> = p.chunks.iter().map(|c| (c.seq, c.len)).collect();
        // Seq 1 keeps to its chunk, and the step to 1500 while it runs.
        assert_eq!(got, [(2, 1), (1, 1000), (3, 499)]);
        // A batch limit under the decodes still lets it take one token.
        q.limits = SeqLimits { chunk: None, batch: Some(2) };
        let p = plan_step(&l, &[decode(2, 4), decode(4, 4), decode(5, 4), q]);
        assert_eq!(p.chunks.last().map(|c| (c.seq, c.len)), Some((1, 1)));
    }
}
