//! A model on a backend with its paged KV cache: prefill (in chunks), decode, greedy or sampled
//! generation. The serving scheduler (continuous batching, prefix reuse through shared blocks)
//! builds on [`Engine::step`], giving each sequence's block table; the other callers use a
//! fixed table per slot ([`Engine::slot_blocks`]).
//!
//! Sliding-window layers keep only a ring of blocks per sequence by default (the window-only
//! layout, [`EngineOptions::full_window_kv`]): [`crate::backend::ring_blocks`] blocks, enough
//! for the window and the longest chunk. A sequence's ring is its slot for the callers of slot
//! tables; the serving scheduler hands them out and passes them to [`Engine::step_in_rings`].

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::arch::{self, Loaded};
use crate::backend::{Backend, Batch, KvSpec, Logits, ring_blocks, ring_max_chunk};
use crate::gguf::GgufFile;
use crate::model::{ModelConfig, ModelError};
use crate::monitor::{Monitor, Op};
use crate::sampler::{Sampler, SamplingParams};
use brink_kernels::ops::attention::DEFAULT_BLOCK_SIZE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// KV positions per sequence; 0 takes the model's trained context.
    pub context: usize,
    /// Sequences of `context` positions the KV cache holds at once: it has
    /// `slots · ceil(context / block_size)` blocks.
    pub slots: usize,
    /// Largest number of prompt tokens run in one forward pass.
    pub prefill_chunk: usize,
    /// Positions per KV block: a power of two; 0 takes the default (16).
    pub block_size: usize,
    /// Keep every position of every slot in the sliding-window layers too (as the full layers
    /// do), so their blocks can be shared by prefix reuse; false (the default) keeps only a ring
    /// of blocks per sequence there, enough for the window and a chunk of `prefill_chunk`.
    pub full_window_kv: bool,
    /// Rings the sliding-window layers hold (sequences that can be in a step at once through
    /// [`Engine::step_in_rings`]); 0 takes `slots`. Callers that draw block tables from a pool
    /// of their own (the model-level test) need more rings than whole-context slots.
    pub rings: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            context: 4096,
            slots: 1,
            prefill_chunk: 2048,
            block_size: DEFAULT_BLOCK_SIZE as usize,
            full_window_kv: false,
            rings: 0,
        }
    }
}

/// The window-only layout of an engine's sliding-window layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRing {
    /// Blocks of each sequence's ring.
    pub blocks: usize,
    /// The largest window of the model's layers.
    pub window: usize,
    /// The longest chunk of one sequence a step may hold ([`crate::backend::ring_max_chunk`]).
    pub max_chunk: usize,
}

/// One item of a [`Engine::step`]: tokens of the sequence whose KV block table is `blocks`,
/// from position `start_pos` (the table covers the positions up to the last token).
pub struct StepItem<'a> {
    pub blocks: &'a [u32],
    pub start_pos: u32,
    pub tokens: &'a [u32],
    pub logits: Logits,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends after any of these tokens (which is kept in the output).
    pub stop_tokens: Vec<u32>,
    /// Keep the logits of the last prompt position and of every generated position.
    pub record_logits: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    StopToken,
    /// The caller's callback asked to stop.
    Cancelled,
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    pub stop: StopReason,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

/// How long loading took and how much it read.
#[derive(Clone, Copy, Debug)]
pub struct LoadReport {
    pub seconds: f64,
    pub tensor_bytes: u64,
}

pub struct Engine<B: Backend> {
    backend: B,
    model: Box<dyn Loaded<B>>,
    kv: KvSpec,
    /// The windowed layers' rings (None: every layer keeps whole sequences).
    ring: Option<WindowRing>,
    opts: EngineOptions,
    load: LoadReport,
    monitor: Arc<Monitor>,
    /// Steps run, for the progress board.
    steps: u64,
}

impl<B: Backend + 'static> Engine<B> {
    pub fn load(path: &Path, mut backend: B, mut opts: EngineOptions) -> Result<Self, ModelError> {
        let t0 = Instant::now();
        let file = GgufFile::open(path)?;
        let model = arch::load(&file, &mut backend)?;
        let c = model.config();
        if opts.context == 0 || opts.context > c.context {
            opts.context = c.context;
        }
        opts.slots = opts.slots.max(1);
        if opts.rings == 0 {
            opts.rings = opts.slots;
        }
        opts.prefill_chunk = opts.prefill_chunk.max(1);
        if opts.block_size == 0 {
            opts.block_size = DEFAULT_BLOCK_SIZE as usize;
        }
        if !opts.block_size.is_power_of_two() || opts.block_size > u32::MAX as usize {
            return Err(ModelError::Request(format!("KV block size {} is not a power of two below 2^32", opts.block_size)));
        }
        let blocks =
            opts.slots.checked_mul(opts.context.div_ceil(opts.block_size)).filter(|&b| b <= i32::MAX as usize).ok_or_else(|| {
                ModelError::Request(format!(
                    "{} slots of {} positions in blocks of {}: more than 2^31 − 1 blocks",
                    opts.slots, opts.context, opts.block_size
                ))
            })?;
        let mut kv = KvSpec::full(c.layers, blocks, opts.block_size, c.attention.kv_heads, c.attention.head_dim);
        let ring = window_ring(c, &opts);
        if let Some(r) = ring {
            kv.window_blocks =
                opts.rings.checked_mul(r.blocks).filter(|&b| b <= i32::MAX as usize).ok_or_else(|| {
                    ModelError::Request(format!("{} rings of {} blocks: more than 2^31 − 1 blocks", opts.rings, r.blocks))
                })?;
            kv.window_layers = c.layer_specs.iter().map(|l| l.attention.window.is_some()).collect();
        }
        backend.alloc_kv(kv.clone())?;
        let load = LoadReport { seconds: t0.elapsed().as_secs_f64(), tensor_bytes: file.tensor_bytes() };
        Ok(Engine { backend, model, kv, ring, opts, load, monitor: Arc::new(Monitor::local()), steps: 0 })
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// Reports progress to `monitor` (and arms its fault) from the next step on.
    pub fn set_monitor(&mut self, monitor: Arc<Monitor>) {
        self.backend.set_monitor(monitor.clone());
        self.monitor = monitor;
    }

    /// Blocks of the KV cache.
    pub fn total_blocks(&self) -> usize {
        self.kv.blocks
    }

    /// Positions per KV block.
    pub fn block_size(&self) -> usize {
        self.kv.block_size
    }

    /// The KV cache's shape as allocated.
    pub fn kv_spec(&self) -> &KvSpec {
        &self.kv
    }

    /// The sliding-window layers' rings, when they keep only a ring per sequence.
    pub fn window_ring(&self) -> Option<WindowRing> {
        self.ring
    }

    /// The fixed block table of `slot` for callers that hold whole sequences in slots (prefill,
    /// generate, bench, parity): blocks `slot · n .. (slot + 1) · n`, `n = ceil(context /
    /// block_size)`. Empty for a slot past `slots`, which [`Engine::check`] then refuses.
    pub fn slot_blocks(&self, slot: u32) -> Vec<u32> {
        let n = self.opts.context.div_ceil(self.kv.block_size);
        if slot as usize >= self.opts.slots {
            return Vec::new();
        }
        // slots · n = blocks ≤ 2^31 − 1 (checked at load).
        let first = slot as usize * n;
        (first..first + n).map(|b| b as u32).collect()
    }

    /// One forward pass over several sequences' chunks; returns the logits of the rows each
    /// item asked for, in item order, `[rows, vocab]`. With the window-only layout each item's
    /// table must be a slot's fixed table ([`Engine::slot_blocks`]): its ring is that slot's
    /// (other tables go through [`Engine::step_in_rings`]).
    pub fn step(&mut self, items: &[StepItem<'_>]) -> Result<Vec<f32>, ModelError> {
        match self.ring {
            None => self.run_step(items, None),
            Some(_) => {
                let rings = items.iter().map(|it| self.slot_ring(it)).collect::<Result<Vec<u32>, ModelError>>()?;
                self.run_step(items, Some(&rings))
            }
        }
    }

    /// [`Engine::step`] with each item's ring index (`rings[i]` for `items[i]`, below `rings`,
    /// no two alike): the windowed layers' KV of that sequence lives in that ring. Without the
    /// window-only layout the rings are not used.
    pub fn step_in_rings(&mut self, items: &[StepItem<'_>], rings: &[u32]) -> Result<Vec<f32>, ModelError> {
        if rings.len() != items.len() {
            return Err(ModelError::Request(format!("{} ring indexes for {} items", rings.len(), items.len())));
        }
        self.run_step(items, self.ring.map(|_| rings))
    }

    /// The ring of an item on a slot's fixed table: that slot.
    fn slot_ring(&self, it: &StepItem<'_>) -> Result<u32, ModelError> {
        let n = self.opts.context.div_ceil(self.kv.block_size);
        let need = (it.start_pos as usize + it.tokens.len()).div_ceil(self.kv.block_size).max(1);
        let slot = it.blocks.first().map_or(0, |&b| b as usize / n);
        let first = slot * n;
        let is_slot_table = slot < self.opts.slots
            && it.blocks.len() >= need
            && it.blocks[..need].iter().enumerate().all(|(i, &b)| b as usize == first + i);
        if !is_slot_table {
            return Err(ModelError::Request(
                "the sliding-window layers keep a ring of KV blocks per sequence: a block table that is not a slot's needs its \
                 ring index (Engine::step_in_rings)"
                    .into(),
            ));
        }
        Ok(slot as u32)
    }

    fn run_step(&mut self, items: &[StepItem<'_>], rings: Option<&[u32]>) -> Result<Vec<f32>, ModelError> {
        let bs = self.kv.block_size as u32;
        let mut batch = match self.ring {
            Some(r) if rings.is_some() => Batch::with_ring(bs, r.blocks as u32)?,
            _ => Batch::new(bs)?,
        };
        for (i, it) in items.iter().enumerate() {
            self.check(it.blocks, it.start_pos as usize, it.tokens)?;
            match (self.ring, rings) {
                (Some(r), Some(rings)) => {
                    let ring = rings[i];
                    self.check_ring(&r, ring, it.tokens.len())?;
                    if let Some(j) = rings[..i].iter().position(|&o| o == ring) {
                        return Err(ModelError::Request(format!("items {j} and {i} of one step share the ring {ring}")));
                    }
                    batch.push_in_ring(it.blocks, ring, it.start_pos, it.tokens, it.logits)?
                }
                _ => batch.push(it.blocks, it.start_pos, it.tokens, it.logits)?,
            }
        }
        self.steps += 1;
        self.monitor.board().begin_step(self.steps, batch.rows() as u64, batch.chunks.len() as u64);
        let logits = match self.model.forward(&mut self.backend, &batch) {
            // A graph that could not be captured or replayed: the same step, eagerly. Its KV
            // writes are the same values at the same rows, so running it twice is harmless.
            Err(_) if self.backend.abandon_graph() => self.model.forward(&mut self.backend, &batch)?,
            other => other?,
        };
        // Back on the host (a failed step leaves its stage on the board, for the report).
        self.monitor.board().enter(None, Op::Step);
        Ok(logits)
    }

    /// A request's chunk against the cache: positions within the context, a block table that
    /// covers them with blocks of the cache (entries past the chunk's end are not read, so not
    /// checked), token ids in the vocabulary.
    pub fn check(&self, blocks: &[u32], start: usize, tokens: &[u32]) -> Result<(), ModelError> {
        let end = start + tokens.len();
        if end > self.opts.context {
            return Err(ModelError::Request(format!("positions {start}..{end} exceed the context of {} tokens", self.opts.context)));
        }
        let need = end.div_ceil(self.kv.block_size);
        if blocks.len() < need {
            return Err(ModelError::Request(format!(
                "positions {start}..{end} need {need} KV blocks of {}, the block table has {}",
                self.kv.block_size,
                blocks.len()
            )));
        }
        if let Some((i, b)) = blocks[..need].iter().enumerate().find(|(_, b)| **b as usize >= self.kv.blocks) {
            return Err(ModelError::Request(format!(
                "block table entry {i} is block {b}, but the KV cache holds {} blocks",
                self.kv.blocks
            )));
        }
        let vocab = self.config().vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Request(format!("token id {bad} is outside the vocabulary of {vocab}")));
        }
        Ok(())
    }

    /// A ring index and a chunk length the windowed layers' rings serve.
    fn check_ring(&self, r: &WindowRing, ring: u32, len: usize) -> Result<(), ModelError> {
        if ring as usize >= self.opts.rings {
            return Err(ModelError::Request(format!("ring {ring} out of range (the engine holds {} rings)", self.opts.rings)));
        }
        if len > r.max_chunk {
            return Err(ModelError::Request(format!(
                "a chunk of {len} tokens: the sliding-window layers' rings of {} blocks of {} serve chunks of at most {} tokens \
                 (window {}, prefill chunk {}; load with a larger prefill_chunk or full_window_kv)",
                r.blocks, self.kv.block_size, r.max_chunk, r.window, self.opts.prefill_chunk
            )));
        }
        Ok(())
    }

    /// Runs `tokens` of the sequence in `slot` from `start_pos`, in chunks of at most
    /// `prefill_chunk`; returns the logits `logits` asks for, from every chunk.
    pub fn prefill(&mut self, slot: u32, start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        let blocks = self.checked_slot_blocks(slot)?;
        self.prefill_blocks(&blocks, start_pos, tokens, logits)
    }

    /// [`Engine::slot_blocks`], or an error naming a slot past `slots`.
    fn checked_slot_blocks(&self, slot: u32) -> Result<Vec<u32>, ModelError> {
        if slot as usize >= self.opts.slots {
            return Err(ModelError::Request(format!("slot {slot} out of range (the engine holds {} sequences)", self.opts.slots)));
        }
        Ok(self.slot_blocks(slot))
    }

    /// [`Engine::prefill`] for the sequence whose KV block table is `blocks` (positions before
    /// `start_pos` are already in its blocks: e.g. a shared prompt prefix).
    pub fn prefill_blocks(&mut self, blocks: &[u32], start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        self.check(blocks, start_pos, tokens)?;
        let mut out = Vec::new();
        let n_chunks = tokens.len().div_ceil(self.opts.prefill_chunk);
        for (i, chunk) in tokens.chunks(self.opts.prefill_chunk).enumerate() {
            let pos = start_pos + i * self.opts.prefill_chunk;
            let want = match logits {
                Logits::Last if i + 1 < n_chunks => Logits::None,
                other => other,
            };
            out.extend(self.step(&[StepItem { blocks, start_pos: pos as u32, tokens: chunk, logits: want }])?);
        }
        Ok(out)
    }

    /// Prefills `prompt` into `slot` and generates up to `max_tokens` tokens. `on_token` sees
    /// each token as it is chosen and returns false to stop.
    pub fn generate(
        &mut self,
        slot: u32,
        prompt: &[u32],
        p: &GenerateParams,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Request("the prompt has no tokens".into()));
        }
        p.sampling.validate().map_err(ModelError::Request)?;
        let vocab = self.config().vocab;
        let mut sampler = Sampler::new(p.sampling);
        let blocks = self.checked_slot_blocks(slot)?;
        let t0 = Instant::now();
        let mut logits = self.prefill_blocks(&blocks, 0, prompt, Logits::Last)?;
        let prefill_seconds = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut out =
            Generation { tokens: Vec::new(), logits: Vec::new(), stop: StopReason::MaxTokens, prefill_seconds, decode_seconds: 0.0 };
        let mut pos = prompt.len();
        while out.tokens.len() < p.max_tokens {
            let row = &logits[logits.len() - vocab..];
            if p.record_logits {
                out.logits.push(row.to_vec());
            }
            let next = sampler.sample(row);
            out.tokens.push(next);
            if !on_token(next) {
                out.stop = StopReason::Cancelled;
                break;
            }
            if p.stop_tokens.contains(&next) {
                out.stop = StopReason::StopToken;
                break;
            }
            if out.tokens.len() == p.max_tokens {
                break;
            }
            logits = self.step(&[StepItem { blocks: &blocks, start_pos: pos as u32, tokens: &[next], logits: Logits::Last }])?;
            pos += 1;
        }
        out.decode_seconds = t1.elapsed().as_secs_f64();
        Ok(out)
    }
}

/// The window-only layout for `c`'s sliding-window layers under `opts` (context, block size and
/// prefill chunk settled): None without windowed layers, with `full_window_kv`, or when the ring
/// would be the whole table.
fn window_ring(c: &ModelConfig, opts: &EngineOptions) -> Option<WindowRing> {
    let window = c.layer_specs.iter().filter_map(|l| l.attention.window).max()? as usize;
    if opts.full_window_kv {
        return None;
    }
    let n = opts.context.div_ceil(opts.block_size);
    let blocks = ring_blocks(window, opts.prefill_chunk, opts.block_size, n);
    (blocks < n).then(|| WindowRing { blocks, window, max_chunk: ring_max_chunk(blocks, window, opts.block_size) })
}

/// Which backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// An [`Engine`] with its backend type erased, for callers that pick the backend at run time.
pub trait AnyEngine {
    fn config(&self) -> &ModelConfig;
    fn options(&self) -> EngineOptions;
    fn backend_name(&self) -> &'static str;
    fn load_report(&self) -> LoadReport;
    fn set_monitor(&mut self, monitor: Arc<Monitor>);
    /// Blocks of the paged KV cache, and positions per block (for the scheduler's `KvBlocks`).
    fn total_blocks(&self) -> usize;
    fn block_size(&self) -> usize;
    /// The fixed block table of a slot ([`Engine::slot_blocks`]).
    fn slot_blocks(&self, slot: u32) -> Vec<u32>;
    /// The sliding-window layers' rings ([`Engine::window_ring`]).
    fn window_ring(&self) -> Option<WindowRing>;
    /// Bytes of the KV cache as allocated ([`KvSpec::bytes`]).
    fn kv_bytes(&self) -> u64;
    fn step(&mut self, items: &[StepItem<'_>]) -> Result<Vec<f32>, ModelError>;
    fn step_in_rings(&mut self, items: &[StepItem<'_>], rings: &[u32]) -> Result<Vec<f32>, ModelError>;
    fn prefill(&mut self, slot: u32, start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError>;
    fn prefill_blocks(&mut self, blocks: &[u32], start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError>;
    fn generate(
        &mut self,
        slot: u32,
        prompt: &[u32],
        p: &GenerateParams,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, ModelError>;
}

impl<B: Backend + 'static> AnyEngine for Engine<B> {
    fn config(&self) -> &ModelConfig {
        Engine::config(self)
    }
    fn options(&self) -> EngineOptions {
        self.opts
    }
    fn backend_name(&self) -> &'static str {
        self.backend.name()
    }
    fn load_report(&self) -> LoadReport {
        self.load
    }
    fn set_monitor(&mut self, monitor: Arc<Monitor>) {
        Engine::set_monitor(self, monitor)
    }
    fn total_blocks(&self) -> usize {
        Engine::total_blocks(self)
    }
    fn block_size(&self) -> usize {
        Engine::block_size(self)
    }
    fn slot_blocks(&self, slot: u32) -> Vec<u32> {
        Engine::slot_blocks(self, slot)
    }
    fn window_ring(&self) -> Option<WindowRing> {
        Engine::window_ring(self)
    }
    fn kv_bytes(&self) -> u64 {
        self.kv.bytes()
    }
    fn step(&mut self, items: &[StepItem<'_>]) -> Result<Vec<f32>, ModelError> {
        Engine::step(self, items)
    }
    fn step_in_rings(&mut self, items: &[StepItem<'_>], rings: &[u32]) -> Result<Vec<f32>, ModelError> {
        Engine::step_in_rings(self, items, rings)
    }
    fn prefill(&mut self, slot: u32, start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        Engine::prefill(self, slot, start_pos, tokens, logits)
    }
    fn prefill_blocks(&mut self, blocks: &[u32], start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        Engine::prefill_blocks(self, blocks, start_pos, tokens, logits)
    }
    fn generate(
        &mut self,
        slot: u32,
        prompt: &[u32],
        p: &GenerateParams,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, ModelError> {
        Engine::generate(self, slot, prompt, p, on_token)
    }
}
/// Loads the model at `path` onto the backend `kind`.
pub fn open(path: &Path, kind: BackendKind, opts: EngineOptions) -> Result<Box<dyn AnyEngine>, ModelError> {
    match kind {
        BackendKind::Cpu => Ok(Box::new(Engine::load(path, crate::backend::cpu::CpuBackend::new(), opts)?)),
        BackendKind::Cuda => Ok(Box::new(Engine::load(path, crate::backend::cuda::CudaBackend::new()?, opts)?)),
    }
}
