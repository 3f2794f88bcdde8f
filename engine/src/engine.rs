//! A model on a backend with its KV cache: prefill (in chunks), decode, greedy or sampled
//! generation. The serving scheduler (continuous batching) builds on [`Engine::step`].

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::arch::{self, Loaded};
use crate::backend::{Backend, Batch, KvSpec, Logits};
use crate::gguf::GgufFile;
use crate::model::{ModelConfig, ModelError};
use crate::monitor::{Monitor, Op};
use crate::sampler::{Sampler, SamplingParams};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// KV positions per sequence; 0 takes the model's trained context.
    pub context: usize,
    /// Sequences whose KV caches are held at once.
    pub slots: usize,
    /// Largest number of prompt tokens run in one forward pass.
    pub prefill_chunk: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { context: 4096, slots: 1, prefill_chunk: 2048 }
    }
}

/// One item of a [`Engine::step`]: tokens of the sequence in `slot` from position `start_pos`.
pub struct StepItem<'a> {
    pub slot: u32,
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
        opts.prefill_chunk = opts.prefill_chunk.max(1);
        let kv = KvSpec {
            layers: c.layers,
            slots: opts.slots,
            context: opts.context,
            kv_heads: c.attention.kv_heads,
            head_dim: c.attention.head_dim,
        };
        backend.alloc_kv(kv)?;
        let load = LoadReport { seconds: t0.elapsed().as_secs_f64(), tensor_bytes: file.tensor_bytes() };
        Ok(Engine { backend, model, kv, opts, load, monitor: Arc::new(Monitor::local()), steps: 0 })
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// Reports progress to `monitor` (and arms its fault) from the next step on.
    pub fn set_monitor(&mut self, monitor: Arc<Monitor>) {
        self.backend.set_monitor(monitor.clone());
        self.monitor = monitor;
    }

    /// One forward pass over several sequences' chunks; returns the logits of the rows each
    /// item asked for, in item order, `[rows, vocab]`.
    pub fn step(&mut self, items: &[StepItem<'_>]) -> Result<Vec<f32>, ModelError> {
        let mut batch = Batch::default();
        for it in items {
            self.check(it.slot, it.start_pos as usize, it.tokens)?;
            batch.push(it.slot, it.start_pos, it.tokens, it.logits)?;
        }
        self.steps += 1;
        self.monitor.board().begin_step(self.steps, batch.rows() as u64, batch.chunks.len() as u64);
        let logits = self.model.forward(&mut self.backend, &batch)?;
        // Back on the host (a failed step leaves its stage on the board, for the report).
        self.monitor.board().enter(None, Op::Step);
        Ok(logits)
    }

    fn check(&self, slot: u32, start: usize, tokens: &[u32]) -> Result<(), ModelError> {
        if slot as usize >= self.kv.slots {
            return Err(ModelError::Request(format!("slot {slot} out of range (the engine holds {} sequences)", self.kv.slots)));
        }
        if start + tokens.len() > self.kv.context {
            return Err(ModelError::Request(format!(
                "positions {start}..{} exceed the context of {} tokens",
                start + tokens.len(),
                self.kv.context
            )));
        }
        let vocab = self.config().vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Request(format!("token id {bad} is outside the vocabulary of {vocab}")));
        }
        Ok(())
    }

    /// Runs `tokens` of the sequence in `slot` from `start_pos`, in chunks of at most
    /// `prefill_chunk`; returns the logits `logits` asks for, from every chunk.
    pub fn prefill(&mut self, slot: u32, start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        self.check(slot, start_pos, tokens)?;
        let mut out = Vec::new();
        let n_chunks = tokens.len().div_ceil(self.opts.prefill_chunk);
        for (i, chunk) in tokens.chunks(self.opts.prefill_chunk).enumerate() {
            let pos = start_pos + i * self.opts.prefill_chunk;
            let want = match logits {
                Logits::Last if i + 1 < n_chunks => Logits::None,
                other => other,
            };
            out.extend(self.step(&[StepItem { slot, start_pos: pos as u32, tokens: chunk, logits: want }])?);
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
        let t0 = Instant::now();
        let mut logits = self.prefill(slot, 0, prompt, Logits::Last)?;
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
            logits = self.step(&[StepItem { slot, start_pos: pos as u32, tokens: &[next], logits: Logits::Last }])?;
            pos += 1;
        }
        out.decode_seconds = t1.elapsed().as_secs_f64();
        Ok(out)
    }
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
    fn step(&mut self, items: &[StepItem<'_>]) -> Result<Vec<f32>, ModelError>;
    fn prefill(&mut self, slot: u32, start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError>;
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
    fn step(&mut self, items: &[StepItem<'_>]) -> Result<Vec<f32>, ModelError> {
        Engine::step(self, items)
    }
    fn prefill(&mut self, slot: u32, start_pos: usize, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        Engine::prefill(self, slot, start_pos, tokens, logits)
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
