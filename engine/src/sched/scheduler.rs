//! Sequences, admission control, preemption and cancellation around the block manager and the
//! planner. The caller (the server) loops: `schedule()` → one engine step over the plan →
//! sample the logit rows → `complete_step()`.
//!
//! Admission is FIFO: a request runs when a sequence slot is open and its blocks fit (after
//! prefix reuse), otherwise it waits in a bounded queue; a full queue rejects with a retry
//! hint. When a decoding sequence needs a block and none is left, the newest running sequence
//! is preempted: its blocks are released (its computed full blocks stay cached) and it goes
//! back to the head of the queue with every token it has, to be recomputed — mostly from the
//! prefix cache — when space returns.
//!
//! Each running sequence also holds a ring index below `max_seqs` (a free list: admission takes
//! one, cancellation, completion and preemption give it back), no two running sequences the
//! same: the engine keeps a sliding-window layer's KV of a sequence in that ring of blocks
//! (the window-only layout, `Engine::step_in_rings`).

use std::collections::VecDeque;

use super::SeqId;
use super::kv_blocks::{KvBlocks, KvError, KvStats};
use super::plan::{SeqLimits, SeqView, StepLimits, StepPlan, plan_step};
use super::quarantine::{ShapeChunk, StallShape};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    pub limits: StepLimits,
    /// Positions per sequence (the model's context as served).
    pub context: usize,
    /// Requests that may wait for admission.
    pub max_queue: usize,
    /// Retry hint of a rejection with an empty queue; grows with the queue.
    pub retry_after_secs: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: SeqId,
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    /// From the poison quarantine; default: none.
    pub limits: SeqLimits,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// Running now; prefill starts after `cached_tokens` reused prompt tokens.
    Running { cached_tokens: usize },
    /// Waiting; `position` 0 is next.
    Queued { position: usize },
}

/// Why a request was not accepted; `http_status` maps it for the API.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the prompt has no tokens")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    NoTokensRequested,
    #[error("the prompt has {prompt} tokens, more than the context of {context} tokens")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("the server is at capacity ({queued} requests waiting); retry after {retry_after_secs} s")]
    QueueFull { queued: usize, retry_after_secs: u32 },
    #[error("request id {0} is already scheduled")]
    Duplicate(SeqId),
}

impl Rejection {
    pub fn http_status(&self) -> u16 {
        match self {
            Rejection::QueueFull { .. } => 503,
            Rejection::Duplicate(_) => 409,
            _ => 400,
        }
    }

    /// For the `Retry-After` header.
    pub fn retry_after_secs(&self) -> Option<u32> {
        match self {
            Rejection::QueueFull { retry_after_secs, .. } => Some(*retry_after_secs),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("scheduler config: {0}")]
    Config(String),
    #[error("step results: {0}")]
    Step(String),
    #[error(transparent)]
    Kv(#[from] KvError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// `max_new_tokens` generated.
    Length,
    /// The context is full: the token just emitted has no position left.
    Context,
}

/// A token a sequence produced in a step; with `finish` the sequence is gone from the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Emitted {
    pub seq: SeqId,
    pub token: u32,
    pub finish: Option<Finish>,
}

#[derive(Clone, Debug)]
struct Sequence {
    id: SeqId,
    /// Prompt, then generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose KV is written.
    computed: usize,
    /// Tokens the block manager knows (its table holds them).
    kv_known: usize,
    generated: usize,
    max_new: usize,
    /// Logits came back since admission: one pending token means a decode.
    prefilled: bool,
    limits: SeqLimits,
    cached_tokens: usize,
    /// The ring it holds while running (meaningless while waiting).
    ring: u32,
}

pub struct Scheduler {
    cfg: SchedConfig,
    kv: KvBlocks,
    /// Ring indexes no running sequence holds (popped from the end: 0 first).
    free_rings: Vec<u32>,
    /// In admission order (FIFO for prefill; the last is preempted first).
    running: Vec<Sequence>,
    waiting: VecDeque<Sequence>,
    preemptions: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig, kv: KvBlocks) -> Result<Self, SchedError> {
        let capacity = kv.total_blocks() as u64 * kv.block_size() as u64;
        if cfg.context == 0 || capacity < cfg.context as u64 {
            // A lone sequence must always fit, or a full-context request could wait forever.
            return Err(SchedError::Config(format!(
                "context {} must be at least 1 and fit in the KV cache ({} blocks of {} = {capacity} positions)",
                cfg.context,
                kv.total_blocks(),
                kv.block_size()
            )));
        }
        if u32::try_from(cfg.context).is_err() {
            return Err(SchedError::Config(format!("context {}: positions are u32 in the engine", cfg.context)));
        }
        let free_rings = all_rings(&cfg);
        Ok(Scheduler { cfg, kv, free_rings, running: Vec::new(), waiting: VecDeque::new(), preemptions: 0 })
    }

    /// Admits `req` now, queues it, or rejects it.
    pub fn submit(&mut self, req: Request) -> Result<Admitted, Rejection> {
        if req.prompt.is_empty() {
            return Err(Rejection::EmptyPrompt);
        }
        if req.max_new_tokens == 0 {
            return Err(Rejection::NoTokensRequested);
        }
        if req.prompt.len() > self.cfg.context {
            return Err(Rejection::PromptTooLong { prompt: req.prompt.len(), context: self.cfg.context });
        }
        if self.position(req.id).is_some() {
            return Err(Rejection::Duplicate(req.id));
        }
        let seq = Sequence {
            id: req.id,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            computed: 0,
            kv_known: 0,
            generated: 0,
            max_new: req.max_new_tokens,
            prefilled: false,
            limits: req.limits,
            cached_tokens: 0,
            ring: 0,
        };
        // Nobody waiting: no one to overtake.
        if self.waiting.is_empty() && self.running.len() < self.cfg.limits.max_seqs && self.kv.fits(&seq.tokens).is_ok() {
            let cached_tokens = self.start(seq).map_err(|_| self.queue_full())?;
            return Ok(Admitted::Running { cached_tokens });
        }
        if self.waiting.len() >= self.cfg.max_queue {
            return Err(self.queue_full());
        }
        self.waiting.push_back(seq);
        Ok(Admitted::Queued { position: self.waiting.len() - 1 })
    }

    fn queue_full(&self) -> Rejection {
        // A rough wait: each full round of running sequences takes about the base hint.
        let rounds = 1 + self.waiting.len() / self.cfg.limits.max_seqs;
        let secs = (self.cfg.retry_after_secs.max(1) as u64).saturating_mul(rounds as u64).min(600) as u32;
        Rejection::QueueFull { queued: self.waiting.len(), retry_after_secs: secs }
    }

    /// Allocates `seq`'s blocks and makes it running; returns its cached prompt tokens.
    fn start(&mut self, mut seq: Sequence) -> Result<usize, KvError> {
        // At most max_seqs run, so a ring is free whenever a slot is (checked, not assumed).
        let Some(ring) = self.free_rings.pop() else {
            return Err(KvError::Invalid { seq: seq.id, what: format!("no free ring among {} running sequences", self.running.len()) });
        };
        let a = match self.kv.allocate(seq.id, &seq.tokens) {
            Ok(a) => a,
            Err(e) => {
                self.free_rings.push(ring);
                return Err(e);
            }
        };
        seq.ring = ring;
        seq.computed = a.cached_tokens;
        seq.kv_known = seq.tokens.len();
        seq.cached_tokens = a.cached_tokens;
        seq.prefilled = false;
        self.running.push(seq);
        Ok(a.cached_tokens)
    }

    fn position(&self, id: SeqId) -> Option<(bool, usize)> {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            return Some((true, i));
        }
        self.waiting.iter().position(|s| s.id == id).map(|i| (false, i))
    }

    /// Removes `id` wherever it is (client gone, stop token, error): its blocks are freed and
    /// it is in no later plan. False when it was not scheduled.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        match self.position(id) {
            Some((true, i)) => {
                let seq = self.running.remove(i);
                self.free_rings.push(seq.ring);
                // Running sequences always hold blocks; a failure here means the two disagree,
                // which the tests check cannot happen.
                let _ = self.kv.release(id);
                true
            }
            Some((false, i)) => {
                self.waiting.remove(i);
                true
            }
            None => false,
        }
    }

    /// Moves the newest running sequence back to the head of the queue, freeing its blocks.
    fn preempt_newest(&mut self) -> Option<SeqId> {
        let mut seq = self.running.pop()?;
        let _ = self.kv.release(seq.id);
        self.free_rings.push(seq.ring);
        seq.computed = 0;
        seq.kv_known = 0;
        seq.prefilled = false;
        let id = seq.id;
        self.waiting.push_front(seq);
        self.preemptions += 1;
        Some(id)
    }

    /// The next step: admits what fits, gives decodes their next block (preempting if the cache
    /// is full), then plans.
    pub fn schedule(&mut self) -> StepPlan {
        // Blocks for the tokens sampled last step, oldest sequence first.
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if s.kv_known == s.tokens.len() {
                i += 1;
                continue;
            }
            let (id, new) = (s.id, s.tokens[s.kv_known..].to_vec());
            match self.kv.push_tokens(id, &new) {
                Ok(()) => {
                    self.running[i].kv_known += new.len();
                    i += 1;
                }
                // Free space by preempting the newest; if that is this sequence, it is gone and
                // index i now points past the end or at nothing new.
                Err(_) => {
                    self.preempt_newest();
                }
            }
        }
        while self.running.len() < self.cfg.limits.max_seqs {
            let Some(head) = self.waiting.front() else { break };
            if self.kv.fits(&head.tokens).is_err() {
                break;
            }
            let Some(seq) = self.waiting.pop_front() else { break };
            if let Err(e) = self.start(seq.clone()) {
                // `fits` said yes: only a broken invariant lands here; keep the request.
                debug_assert!(false, "{e}");
                self.waiting.push_front(seq);
                break;
            }
        }
        let views: Vec<SeqView> = self
            .running
            .iter()
            .map(|s| {
                let pending = s.tokens.len() - s.computed;
                SeqView { id: s.id, computed: s.computed, pending, decoding: s.prefilled && pending == 1, limits: s.limits }
            })
            .collect();
        plan_step(&self.cfg.limits, &views)
    }

    /// Applies a step's results: `sampled` holds one token per logits chunk of `plan`, in order.
    /// Chunks of sequences cancelled since `schedule` are skipped.
    pub fn complete_step(&mut self, plan: &StepPlan, sampled: &[u32]) -> Result<Vec<Emitted>, SchedError> {
        let want = plan.logit_chunks().count();
        if sampled.len() != want {
            return Err(SchedError::Step(format!("{} sampled tokens for {want} logit rows", sampled.len())));
        }
        let mut tokens = sampled.iter();
        let mut out = Vec::new();
        for c in &plan.chunks {
            let token = if c.logits { tokens.next().copied() } else { None };
            let Some(i) = self.running.iter().position(|s| s.id == c.seq) else { continue };
            let s = &mut self.running[i];
            if c.start_pos != s.computed || c.start_pos + c.len > s.tokens.len() {
                return Err(SchedError::Step(format!(
                    "sequence {}: chunk at {}+{} but {} of {} tokens are computed (plan out of date)",
                    s.id,
                    c.start_pos,
                    c.len,
                    s.computed,
                    s.tokens.len()
                )));
            }
            s.computed += c.len;
            self.kv.mark_computed(s.id, s.computed)?;
            let Some(token) = token else { continue };
            s.tokens.push(token);
            s.generated += 1;
            s.prefilled = true;
            let finish = if s.generated >= s.max_new {
                Some(Finish::Length)
            } else if s.tokens.len() > self.cfg.context {
                Some(Finish::Context)
            } else {
                None
            };
            out.push(Emitted { seq: c.seq, token, finish });
            if finish.is_some() {
                self.cancel(c.seq);
            }
        }
        Ok(out)
    }

    /// The sequence's tokens (prompt, then generated): a chunk's input is
    /// `tokens[start_pos..start_pos + len]`.
    pub fn tokens(&self, id: SeqId) -> Option<&[u32]> {
        self.running.iter().find(|s| s.id == id).map(|s| s.tokens.as_slice())
    }

    /// Where the sequence's positions live: block `i` holds positions `i·block_size..`.
    pub fn block_table(&self, id: SeqId) -> Option<&[u32]> {
        self.kv.block_table(id)
    }

    /// The ring index the running sequence holds (below `max_seqs`; no other running sequence
    /// holds it): where the engine keeps its sliding-window layers' KV.
    pub fn ring(&self, id: SeqId) -> Option<u32> {
        self.running.iter().find(|s| s.id == id).map(|s| s.ring)
    }

    /// Whether computed prompt prefixes are shared ([`KvBlocks::with_prefix_reuse`]).
    pub fn prefix_reuse(&self) -> bool {
        self.kv.prefix_reuse()
    }

    /// Prompt tokens reused from the cache at the sequence's (last) admission, for `usage`.
    pub fn cached_tokens(&self, id: SeqId) -> Option<usize> {
        self.running.iter().find(|s| s.id == id).map(|s| s.cached_tokens)
    }

    /// After the engine restarted, the cache's contents are gone: every block is forgotten
    /// (prefix index included) and the running sequences are dropped; they are returned, in
    /// admission order, for the caller to fail or [`Scheduler::requeue`]. Waiting requests stay
    /// queued and run on the new engine.
    pub fn reset_after_restart(&mut self) -> Result<Vec<Request>, SchedError> {
        self.kv = KvBlocks::with_prefix_reuse(self.kv.total_blocks(), self.kv.block_size(), self.kv.prefix_reuse())?;
        self.free_rings = all_rings(&self.cfg);
        Ok(self
            .running
            .drain(..)
            .map(|mut s| {
                s.tokens.truncate(s.prompt_len);
                Request { id: s.id, prompt: s.tokens, max_new_tokens: s.max_new, limits: s.limits }
            })
            .collect())
    }

    /// Queues requests that were running when the engine went, ahead of every waiting one and
    /// in the order given (they were admitted first), past the queue's limit (they were
    /// accepted already). Each starts again from its prompt.
    pub fn requeue(&mut self, reqs: Vec<Request>) -> Result<(), Rejection> {
        if let Some(r) = reqs.iter().find(|r| self.position(r.id).is_some()) {
            return Err(Rejection::Duplicate(r.id));
        }
        for req in reqs.into_iter().rev() {
            let seq = Sequence {
                id: req.id,
                prompt_len: req.prompt.len(),
                tokens: req.prompt,
                computed: 0,
                kv_known: 0,
                generated: 0,
                max_new: req.max_new_tokens,
                prefilled: false,
                limits: req.limits,
                cached_tokens: 0,
                ring: 0,
            };
            self.waiting.push_front(seq);
        }
        Ok(())
    }

    /// The shape of `plan` for the quarantine, when the step running it stalled.
    pub fn stall_shape(&self, plan: &StepPlan) -> StallShape {
        let chunks = plan
            .chunks
            .iter()
            .filter_map(|c| {
                let s = self.running.iter().find(|s| s.id == c.seq)?;
                Some(ShapeChunk { prompt_tokens: s.prompt_len, chunk_len: c.len, decode: s.prefilled })
            })
            .collect();
        StallShape { chunks, total: plan.total_tokens() }
    }

    pub fn kv_stats(&self) -> KvStats {
        self.kv.stats()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Nothing running and nothing waiting: idle, which the watchdog must not call a stall.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }
}

/// Every ring index, 0 popped first.
fn all_rings(cfg: &SchedConfig) -> Vec<u32> {
    (0..cfg.limits.max_seqs.min(u32::MAX as usize) as u32).rev().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn sched(blocks: usize, block_size: usize, budget: usize, chunk: usize, max_seqs: usize, context: usize) -> Scheduler {
        let cfg =
            SchedConfig { limits: StepLimits::new(budget, chunk, max_seqs, None).unwrap(), context, max_queue: 4, retry_after_secs: 2 };
        Scheduler::new(cfg, KvBlocks::new(blocks, block_size).unwrap()).unwrap()
    }

    fn req(id: SeqId, prompt: Vec<u32>, max_new: usize) -> Request {
        Request { id, prompt, max_new_tokens: max_new, limits: SeqLimits::default() }
    }

    /// A stand-in for the engine: the sampled token is a function of the sequence and position,
    /// so a recomputed sequence must produce the same stream.
    fn sample(plan: &StepPlan) -> Vec<u32> {
        plan.logit_chunks().map(|c| (c.seq as u32).wrapping_mul(1000) + (c.start_pos + c.len) as u32).collect()
    }

    fn check_invariants(s: &Scheduler) {
        let st = s.kv_stats();
        assert_eq!(st.free + st.cached + st.used, st.total);
        for q in &s.running {
            let table = s.kv.block_table(q.id).expect("a running sequence holds blocks");
            assert!(table.len() * st.block_size >= q.computed);
        }
        for q in &s.waiting {
            assert!(!s.kv.holds(q.id));
        }
        // Every ring is held by one running sequence or free, never both or twice.
        let mut rings: Vec<u32> = s.running.iter().map(|q| q.ring).chain(s.free_rings.iter().copied()).collect();
        rings.sort_unstable();
        assert_eq!(rings, (0..s.cfg.limits.max_seqs as u32).collect::<Vec<_>>(), "rings held or free");
    }

    #[test]
    fn rejections_say_why() {
        let mut s = sched(8, 16, 64, 32, 2, 100);
        assert_eq!(s.submit(req(1, vec![], 5)), Err(Rejection::EmptyPrompt));
        assert_eq!(s.submit(req(1, vec![1], 0)), Err(Rejection::NoTokensRequested));
        let e = s.submit(req(1, vec![7; 101], 5)).unwrap_err();
        assert_eq!(e.http_status(), 400);
        assert_eq!(e.to_string(), "the prompt has 101 tokens, more than the context of 100 tokens");
        assert_eq!(s.submit(req(1, vec![7; 100], 5)), Ok(Admitted::Running { cached_tokens: 0 }));
        assert_eq!(s.submit(req(1, vec![7; 3], 5)), Err(Rejection::Duplicate(1)));
        // 100 + 16 tokens take all 8 blocks: the next request queues, then the queue fills.
        assert_eq!(s.submit(req(2, vec![8; 16], 5)), Ok(Admitted::Running { cached_tokens: 0 }));
        for i in 0..4 {
            assert_eq!(s.submit(req(10 + i, vec![9; 10], 5)), Ok(Admitted::Queued { position: i as usize }));
        }
        let e = s.submit(req(20, vec![9; 10], 5)).unwrap_err();
        assert_eq!((e.http_status(), e.retry_after_secs()), (503, Some(6)));
        assert!(e.to_string().contains("4 requests waiting"), "{e}");
        assert!(Scheduler::new(s.cfg, KvBlocks::new(6, 16).unwrap()).is_err(), "context 100 cannot fit in 96 positions");
    }

    #[test]
    fn a_shared_prefix_is_not_recomputed() {
        let mut s = sched(64, 16, 256, 128, 4, 1000);
        let system: Vec<u32> = (0..200).collect();
        let mut a = system.clone();
        a.extend([900, 901]);
        s.submit(req(1, a, 3)).unwrap();
        let mut prefilled = 0;
        while s.tokens(1).is_some() {
            let p = s.schedule();
            prefilled += p.chunks.iter().filter(|c| c.seq == 1 && !c.logits || c.len > 1).map(|c| c.len).sum::<usize>();
            s.complete_step(&p, &sample(&p)).unwrap();
        }
        assert_eq!(prefilled, 202);
        let mut b = system.clone();
        b.extend([700, 701, 702]);
        assert_eq!(s.submit(req(2, b, 1)), Ok(Admitted::Running { cached_tokens: 192 }));
        let p = s.schedule();
        assert_eq!(p.chunks, [crate::sched::PlannedChunk { seq: 2, start_pos: 192, len: 11, logits: true }]);
        let out = s.complete_step(&p, &sample(&p)).unwrap();
        assert_eq!(out, [Emitted { seq: 2, token: 2203, finish: Some(Finish::Length) }]);
        assert!(s.is_idle());
        check_invariants(&s);
    }

    #[test]
    fn cancellation_frees_blocks_and_leaves_the_plan() {
        let mut s = sched(16, 8, 64, 32, 4, 100);
        s.submit(req(1, vec![1; 50], 10)).unwrap();
        s.submit(req(2, vec![2; 20], 10)).unwrap();
        let p = s.schedule();
        assert!(p.chunks.iter().any(|c| c.seq == 1) && p.chunks.iter().any(|c| c.seq == 2));
        let shape = s.stall_shape(&p);
        assert_eq!(
            shape.chunks,
            [
                ShapeChunk { prompt_tokens: 50, chunk_len: 32, decode: false },
                ShapeChunk { prompt_tokens: 20, chunk_len: 20, decode: false }
            ]
        );
        assert_eq!(shape.total, 52);
        // The client of 1 goes away while its step runs.
        assert!(s.cancel(1));
        let out = s.complete_step(&p, &sample(&p)).unwrap();
        assert!(out.iter().all(|e| e.seq == 2));
        assert!(s.schedule().chunks.iter().all(|c| c.seq == 2));
        assert_eq!(s.kv_stats().used, 3);
        assert!(s.cancel(2) && !s.cancel(2));
        assert_eq!(s.kv_stats().used, 0);
        assert!(s.is_idle());
        assert_eq!(s.stall_shape(&p), StallShape { chunks: vec![], total: p.total_tokens() });
        assert_eq!(s.complete_step(&StepPlan::default(), &[5]), Err(SchedError::Step("1 sampled tokens for 0 logit rows".into())));
    }

    #[test]
    fn a_restart_fails_running_keeps_waiting_and_forgets_the_cache() {
        let mut s = sched(8, 16, 64, 32, 1, 100);
        s.submit(req(1, (0..40).collect(), 2)).unwrap();
        s.submit(req(2, (0..40).collect(), 2)).unwrap();
        let p = s.schedule();
        s.complete_step(&p, &sample(&p)).unwrap();
        assert_eq!(s.kv_stats().used, 3);
        let lost = s.reset_after_restart().unwrap();
        assert_eq!(lost, [req(1, (0..40).collect(), 2)], "returned with its prompt alone (its sampled token dropped)");
        assert_eq!((s.running(), s.waiting()), (0, 1));
        assert_eq!(s.kv_stats(), KvStats { total: 8, free: 8, cached: 0, used: 0, block_size: 16 });
        // Request 2 shared 1's prompt, but that KV died with the engine: nothing is reused.
        let p = s.schedule();
        assert_eq!(s.cached_tokens(2), Some(0));
        assert_eq!(p.chunks[0].start_pos, 0);
    }

    #[test]
    fn a_requeued_request_goes_ahead_of_the_waiting_ones_past_the_queue_limit() {
        // One slot, a queue of 4: request 1 runs, 2..=5 fill the queue.
        let mut s = sched(16, 16, 64, 32, 1, 100);
        s.submit(req(1, (0..20).collect(), 3)).unwrap();
        for id in 2..=5 {
            s.submit(req(id, vec![id as u32; 4], 1)).unwrap();
        }
        assert!(matches!(s.submit(req(6, vec![6; 4], 1)), Err(Rejection::QueueFull { .. })));
        let p = s.schedule();
        s.complete_step(&p, &sample(&p)).unwrap();
        let lost = s.reset_after_restart().unwrap();
        assert_eq!(lost, [req(1, (0..20).collect(), 3)]);
        assert_eq!(s.requeue(vec![req(5, vec![0; 4], 1)]), Err(Rejection::Duplicate(5)), "5 is still waiting");
        s.requeue(lost).unwrap();
        assert_eq!((s.running(), s.waiting()), (0, 5), "past the queue's limit of 4");
        // It runs first, from its prompt, and yields its three tokens as a fresh request would.
        let p = s.schedule();
        assert_eq!((p.chunks[0].seq, p.chunks[0].start_pos, p.chunks[0].len), (1, 0, 20));
        let mut tokens = Vec::new();
        let mut p = p;
        loop {
            let emitted = s.complete_step(&p, &sample(&p)).unwrap();
            tokens.extend(emitted.iter().filter(|e| e.seq == 1).map(|e| e.token));
            if emitted.iter().any(|e| e.seq == 1 && e.finish.is_some()) {
                break;
            }
            p = s.schedule();
        }
        assert_eq!(tokens.len(), 3);
        assert_eq!(s.waiting(), 4, "the others still wait, in their order");
        let p = s.schedule();
        assert_eq!(p.chunks[0].seq, 2);
    }

    #[test]
    fn a_full_cache_preempts_the_newest_and_recomputes_it_identically() {
        // 6 blocks of 4: two sequences of 8-token prompts generating 12 tokens each cannot both
        // hold 20 positions (5 blocks each).
        let mut s = sched(6, 4, 32, 16, 2, 24);
        s.submit(req(1, vec![1; 8], 12)).unwrap();
        s.submit(req(2, vec![2; 8], 12)).unwrap();
        let mut streams: std::collections::HashMap<SeqId, Vec<u32>> = Default::default();
        let mut done = 0;
        for _ in 0..200 {
            let p = s.schedule();
            check_invariants(&s);
            for e in s.complete_step(&p, &sample(&p)).unwrap() {
                streams.entry(e.seq).or_default().push(e.token);
                done += e.finish.is_some() as usize;
            }
            if s.is_idle() {
                break;
            }
        }
        assert_eq!(done, 2);
        assert!(s.preemptions() > 0);
        assert!(s.reset_after_restart().unwrap().is_empty());
        // Each stream is what an unpreempted run gives: token k from position 8 + k.
        for id in [1u64, 2] {
            let want: Vec<u32> = (0..12).map(|k| id as u32 * 1000 + 8 + k).collect();
            assert_eq!(streams[&id], want, "sequence {id}");
        }
    }

    /// Many requests with random prompts sharing prefixes, random cancellations: every request
    /// ends exactly once (finished or cancelled), the budget holds, the blocks balance.
    #[test]
    fn random_traffic_loses_nothing() {
        let mut rng = StdRng::seed_from_u64(42);
        let cfg = SchedConfig { limits: StepLimits::new(96, 48, 6, Some(80)).unwrap(), context: 300, max_queue: 8, retry_after_secs: 1 };
        let mut s = Scheduler::new(cfg, KvBlocks::new(20, 16).unwrap()).unwrap();
        let system: Vec<u32> = (0..160).map(|i| i * 7).collect();
        let (mut next, mut submitted, mut ended) = (0u64, 0usize, 0usize);
        let mut want: std::collections::HashMap<SeqId, usize> = Default::default();
        let mut got: std::collections::HashMap<SeqId, usize> = Default::default();
        let (mut rejected, mut cached) = (0, 0);
        for _ in 0..3000 {
            if rng.random_bool(0.3) {
                let mut p = system[..rng.random_range(1..=system.len())].to_vec();
                p.extend((0..rng.random_range(0..80)).map(|_| rng.random_range(0..1000u32)));
                let n = rng.random_range(1..40);
                match s.submit(req(next, p, n)) {
                    Ok(a) => {
                        submitted += 1;
                        want.insert(next, n);
                        cached += matches!(a, Admitted::Running { cached_tokens } if cached_tokens > 0) as usize;
                    }
                    Err(Rejection::QueueFull { .. }) => rejected += 1,
                    Err(e) => panic!("{e}"),
                }
                next += 1;
            }
            if rng.random_bool(0.02) && !want.is_empty() {
                let id = *want.keys().min().unwrap();
                if s.cancel(id) {
                    want.remove(&id);
                    ended += 1;
                }
            }
            let p = s.schedule();
            assert!(p.total_tokens() <= 80);
            check_invariants(&s);
            for e in s.complete_step(&p, &sample(&p)).unwrap() {
                *got.entry(e.seq).or_default() += 1;
                if e.finish.is_some() {
                    assert_eq!(Some(got[&e.seq]), want.remove(&e.seq), "sequence {} ended with the wrong count", e.seq);
                    ended += 1;
                }
            }
        }
        while !s.is_idle() {
            let p = s.schedule();
            for e in s.complete_step(&p, &sample(&p)).unwrap() {
                *got.entry(e.seq).or_default() += 1;
                if e.finish.is_some() {
                    assert_eq!(Some(got[&e.seq]), want.remove(&e.seq));
                    ended += 1;
                }
            }
        }
        assert!(want.is_empty(), "{} requests never ended", want.len());
        assert_eq!(ended, submitted);
        assert!(rejected > 0 && cached > 0 && s.preemptions() > 0, "rejected {rejected}, cached {cached}, preempted {}", s.preemptions());
        assert_eq!(s.kv_stats().used, 0);
    }

    /// Rings: admission takes the lowest free one, cancellation, completion and preemption give
    /// it back, a restart frees them all; without prefix reuse nothing is reused.
    #[test]
    fn rings_are_held_by_one_running_sequence_each() {
        let limits = StepLimits::new(64, 32, 2, None).unwrap();
        let cfg = SchedConfig { limits, context: 64, max_queue: 4, retry_after_secs: 2 };
        let mut s = Scheduler::new(cfg, KvBlocks::with_prefix_reuse(16, 4, false).unwrap()).unwrap();
        assert!(!s.prefix_reuse() && sched(8, 16, 64, 32, 2, 100).prefix_reuse());
        let p = vec![5u32; 20];
        assert_eq!(s.submit(req(1, p.clone(), 3)), Ok(Admitted::Running { cached_tokens: 0 }));
        let plan = s.schedule();
        s.complete_step(&plan, &sample(&plan)).unwrap(); // sequence 1's prompt computed
        assert_eq!(s.submit(req(2, p.clone(), 3)), Ok(Admitted::Running { cached_tokens: 0 }), "no prefix reuse");
        assert_eq!(s.submit(req(3, p.clone(), 3)), Ok(Admitted::Queued { position: 0 }));
        assert_eq!((s.ring(1), s.ring(2), s.ring(3)), (Some(0), Some(1), None));
        check_invariants(&s);
        assert!(s.cancel(1));
        s.schedule(); // admits 3 into the ring 1 gave back
        assert_eq!((s.ring(2), s.ring(3)), (Some(1), Some(0)));
        check_invariants(&s);
        // Run to the end: completion frees the rings.
        while !s.is_idle() {
            let plan = s.schedule();
            check_invariants(&s);
            s.complete_step(&plan, &sample(&plan)).unwrap();
        }
        assert_eq!(s.free_rings.len(), 2);
        // A restart keeps the option and frees every ring.
        s.submit(req(4, p, 3)).unwrap();
        assert!(s.reset_after_restart().unwrap().len() == 1 && !s.prefix_reuse());
        check_invariants(&s);
    }
}
