//! The CUDA backend: every [`Backend`] op on GPU 0, composed from the kernel framework's
//! launch functions (`brink_kernels::ops`), each launch planned against the device's own
//! limits and checked (an error names the kernel, grid, block and shape).
//!
//! Activations stay on the device (`[rows, width]` f32, [`CudaAct`]) in pooled buffers; scratch
//! grows with the largest batch and is reused, so a steady stream of batches allocates nothing
//! (`buffer_allocations`). The host waits for the device only in `logits`, which copies its
//! rows back and reads the embed kernel's count of out-of-vocabulary ids, and in
//! `begin_batch`, whose uploads from pageable memory cudarc completes before returning (the
//! stream is idle then: the previous step ended with its logits).
//!
//! Module map: `weights` (upload, per-type layouts; `repack`: MXFP4 as Q8_0 where the device
//! has room, `weights::Mxfp4`), `batch_state` (the batch on the device), `buffers` (activation pool,
//! scratch), `gather` (embed, row selection), `pointwise` (norms, RoPE, add), `dense`
//! (projections, logits), `moe` (the routed block), `attention`, `kv`, `progress` (device
//! progress for the watchdog).

mod attention;
mod batch_state;
mod buffers;
mod dense;
mod gather;
mod graphs;
mod kv;
mod moe;
mod pointwise;
mod progress;
mod repack;
mod weights;

use std::sync::Arc;

use brink_kernels::cuda::{Gpu, GpuError};
use brink_kernels::ops::attention::DeviceBatch;
use brink_kernels::ops::embed::BadIds;
use brink_kernels::ops::rope::{RopeTable, RopeYarn};
use brink_kernels::sources::{self, KernelSource};

use crate::backend::{AttentionSpec, Backend, Batch, KvSpec, MoeSpec, MoeWeights, Result, WeightRole};
use crate::gguf::GgmlType;
use crate::model::{BackendError, HostTensor, LayerSpec, MatrixDims, Rope};
use crate::monitor::{FaultKind, Monitor, Op};

use batch_state::BatchState;
use buffers::{AllocCounter, Pool};
use graphs::{GraphKey, Graphs, Mode};
use kv::KvCache;
use moe::MoeScratch;

pub use buffers::CudaAct;
pub use graphs::GraphStats;
pub use weights::CudaWeight;

const NAME: &str = "cuda";

/// The features of [`LayerSpec::features`] the CUDA backend computes: the attention kernels take
/// the window and the sinks (`attention`); the rope kernel takes YaRN's table and scale (`rope`;
/// the fused norm + RoPE kernel is plain NEOX only, and without Q/K norm the rope kernel runs
/// alone); the projection biases are a kernel of their own (`add_bias`); the router kernel takes
/// the softmax over the picks, the SwiGLU kernels the clamped activation, and the bias kernel the
/// router's and the picked experts' biases (`moe`, on the GEMM path).
const COMPUTED: [&str; 8] = [
    "sliding-window attention",
    "attention sinks",
    "YaRN RoPE",
    "attention without Q/K norm",
    "attention biases",
    "top-k-then-softmax routing",
    "clamped SwiGLU",
    "expert biases",
];

/// Refuses a layer the CUDA backend cannot compute, naming every missing feature. Its path
/// computes qwen3moe's layer (full attention after per-head Q/K norm and plain NEOX RoPE,
/// softmax-then-top-k routing into SwiGLU experts) and the features in [`COMPUTED`]; no
/// expert biases or weights scale. MXFP4 matrices load as MXFP4 blocks (`weights`).
pub(crate) fn check_layer(layer: usize, spec: &LayerSpec) -> Result<()> {
    let mut missing = spec.features();
    missing.retain(|f| !COMPUTED.contains(f));
    if let crate::model::Gating::SoftmaxThenTopK { weights_scale: Some(_), .. } = spec.ffn.gating {
        missing.push("expert_weights_scale");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(fail(format!("layer {layer} needs {}, which the CUDA backend does not compute (use --backend cpu)", missing.join(", "))))
}

/// The theta of `rope` and its YaRN scaling as the rope kernel takes it (llama.cpp's
/// `rope_yarn` with freq_scale = 1 / factor and ext_factor 1, as the CPU backend runs it).
fn rope_table(rope: &Rope) -> (f32, Option<RopeYarn>) {
    match *rope {
        Rope::Neox { theta } => (theta, None),
        Rope::Yarn { theta, factor, orig_ctx, beta_fast, beta_slow, attn_factor } => {
            (theta, Some(RopeYarn { factor, orig_ctx, beta_fast, beta_slow, attn_factor }))
        }
    }
}

pub(crate) fn fail(message: impl Into<String>) -> BackendError {
    BackendError::new(NAME, message)
}

/// A GPU error in `context`; a failed kernel launch stays typed (the server counts them per kernel).
pub(crate) fn gpu_fail(context: impl std::fmt::Display, e: &GpuError) -> BackendError {
    BackendError::from_gpu(NAME, context, e)
}

/// Kernel families the backend launches: compiled (or taken from the disk cache) when the
/// backend opens, so a compile error shows then rather than in the middle of a step.
const SOURCES: [KernelSource; 13] = [
    sources::GLUE,
    sources::ATTENTION,
    sources::KV_STORE,
    sources::EMBED,
    sources::RMSNORM,
    sources::ROPE,
    sources::QUANTIZE,
    sources::OUTPUT_HEAD,
    sources::ROUTER,
    sources::MOE_ALIGN,
    sources::MOE_GEMV,
    sources::MOE_GEMM,
    sources::MOE_COMBINE,
];

pub struct CudaBackend {
    /// Device progress for a supervised engine (`progress`), set with a shared monitor.
    /// First, so it drops (its watcher stopped, its pinned word freed) before the context.
    device_progress: Option<progress::DeviceProgress>,
    gpu: Gpu,
    allocs: AllocCounter,
    acts: Pool<f32>,
    /// Rows of the largest batch so far: a larger one trims the activation pool.
    high_water: usize,
    batch: BatchState,
    moe: MoeScratch,
    kv: Option<KvCache>,
    ropes: Vec<RopeTable>,
    bad_ids: BadIds,
    monitor: Arc<Monitor>,
    /// Rows of the current batch (for the fault trigger).
    rows: u64,
    /// The layer whose ops are being queued: its "device done" callback goes in when the next
    /// layer (or the output norm) starts.
    open_layer: Option<u32>,
    /// Decode steps captured as CUDA graphs, and how the current step's ops run.
    graphs: Graphs,
}

impl CudaBackend {
    /// Opens GPU 0. A machine without a CUDA driver or GPU gets an error saying so.
    pub fn new() -> std::result::Result<Self, BackendError> {
        Self::open(0)
    }

    pub fn open(ordinal: usize) -> std::result::Result<Self, BackendError> {
        let gpu = Gpu::open(ordinal).map_err(|e| fail(format!("cannot open GPU {ordinal}: {e}")))?;
        gpu.load_modules(&SOURCES).map_err(|e| fail(format!("kernels: {e}")))?;
        let allocs = AllocCounter::default();
        let setup = |e: GpuError| fail(format!("allocating the backend's buffers: {e}"));
        Ok(CudaBackend {
            acts: Pool::new(allocs.clone()),
            high_water: 0,
            batch: BatchState::new(&gpu, &allocs)?,
            moe: MoeScratch::new(&gpu, &allocs).map_err(setup)?,
            kv: None,
            ropes: Vec::new(),
            bad_ids: BadIds::new(&gpu).map_err(setup)?,
            monitor: Arc::new(Monitor::local()),
            rows: 0,
            open_layer: None,
            device_progress: None,
            graphs: Graphs::new(gpu.diagnostic()),
            allocs,
            gpu,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Decode graphs captured and replayed so far.
    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.stats
    }

    /// How this decode step runs: replayed from a graph of its key, captured into one (the
    /// capture begins here, after every upload), or eagerly. Graphs need device progress
    /// without host callbacks (each callback frees its argument once) and no injected fault.
    fn graph_mode(&mut self, batch: &Batch) -> Result<Mode> {
        let callbacks = matches!(self.device_progress, Some(progress::DeviceProgress::Callbacks));
        if self.graphs.take_eager_once() || !self.graphs.enabled() || callbacks || self.monitor.fault().is_some() {
            return Ok(Mode::Eager);
        }
        let Some(key) = graphs::decode_key(batch) else { return Ok(Mode::Eager) };
        // Made (and the workspace sized) before anything is captured.
        let Some(plans) = self.batch.attn.padded_plans(&self.gpu, batch.rows(), key.splits)? else { return Ok(Mode::Eager) };
        match self.graphs.choose(key, self.allocs.frees()) {
            Mode::Replay(i) => {
                let entry = self.graphs.entry(i);
                // One plan per attention spec, in the order the capture saw them.
                let mut written = entry.attn.len() == plans.len();
                if written {
                    for (device, plan) in entry.attn.iter_mut().zip(plans) {
                        written &= device.rewrite(&self.gpu, plan).map_err(|e| gpu_fail("decode graph inputs", &e))?;
                        if !written {
                            break;
                        }
                    }
                }
                if written {
                    return Ok(Mode::Replay(i));
                }
                self.graphs.forget(i); // its arrays are too small now: captured again next time
                Ok(Mode::Eager)
            }
            Mode::Capture(key) => self.begin_capture(key, plans),
            Mode::Eager => Ok(Mode::Eager),
        }
    }

    fn begin_capture(&mut self, key: GraphKey, plans: Vec<brink_kernels::ops::attention::BatchPlan>) -> Result<Mode> {
        let mut devices = Vec::with_capacity(plans.len());
        for plan in plans {
            devices.push(DeviceBatch::upload_with_room(&self.gpu, plan, 2).map_err(|e| gpu_fail("decode graph inputs", &e))?);
        }
        self.batch.attn.use_devices(devices);
        match self.gpu.begin_capture() {
            Ok(()) => Ok(Mode::Capture(key)),
            Err(e) => {
                self.graphs.disable(&format!("beginning a capture: {e}"));
                Ok(Mode::Eager)
            }
        }
    }

    /// Ends a capture left open by a failed step. A failed capture is tried again at the key's
    /// next sighting (a few times); a failed replay turns graphs off.
    fn graph_failed(&mut self, why: &str) {
        if self.gpu.capturing() {
            let _ = self.gpu.end_capture();
        }
        self.batch.attn.take_devices();
        match self.graphs.mode {
            Mode::Capture(key) => self.graphs.capture_failed(key, why),
            _ => {
                self.graphs.stats.failed += 1;
                self.graphs.disable(why);
            }
        }
    }

    /// Replays graph `i` and reads the logits it wrote.
    fn replay(&mut self, i: usize) -> Result<Vec<f32>> {
        self.graphs.mode = Mode::Eager;
        let replayed = {
            let e = self.graphs.entry(i);
            self.gpu.replay(&e.graph)
        };
        if let Err(e) = replayed {
            self.graph_failed(&format!("replay: {e}"));
            self.graphs.retry_eagerly();
            return Err(gpu_fail("decode graph replay", &e));
        }
        self.graphs.stats.replayed += 1;
        self.monitor.board().enter(None, Op::DeviceWait);
        let values = {
            let out = &self.graphs.entry(i).out;
            self.gpu.download_range(&out.buf, 0, out.len()).map_err(|e| fail(format!("download: {e}")))?
        };
        self.check_bad_ids()?;
        Ok(values)
    }

    /// The q8_1 scratch (`moe.xq`, the input of every quantized projection and of the MoE
    /// block) records which activation's rows it holds (`buffers::ActRows`: the activation's
    /// unique id, rows, width), set by whatever writes it: `dense::quantize_rows`, or the hidden
    /// norm that writes its q8_1 rows with its output (`pointwise::rms_norm_q8_1`). A projection
    /// (`linear`, `linear_each`, `logits`) and the MoE router (`moe::route`) quantize through
    /// `dense::quantize_rows`, which launches nothing when the record names their input: so
    /// attn_norm's rows serve q, k and v, ffn_norm's the router and the experts, the output
    /// norm's the head. The record stays true because activations are written only by the op
    /// that creates them (a fresh id), except in place by `add` and `rope`: both drop it here,
    /// as does a reallocation of the scratch (`Grow::ensure`). Anything else that writes the
    /// scratch must drop or reset it (`Grow::set_holds`).
    fn stale_q8_1(&mut self) {
        self.moe.xq.set_holds(None);
    }

    /// Device buffers the backend has allocated for activations and scratch since it opened
    /// (weights and the KV cache aside): constant while batches do not grow.
    pub fn buffer_allocations(&self) -> u64 {
        self.allocs.get()
    }

    /// An activation of `rows x width` (uninitialised: the op writes it).
    fn act(&self, rows: usize, width: usize) -> Result<CudaAct> {
        let n = rows.checked_mul(width).ok_or_else(|| fail(format!("activation [{rows}, {width}] overflows")))?;
        let buf = self.acts.take(&self.gpu, n).map_err(|e| fail(format!("activation [{rows}, {width}]: {e}")))?;
        Ok(CudaAct::new(buf, rows, width))
    }

    /// Copies `values` (`[rows, width]`) to the device: test inputs, debugging.
    pub fn upload(&self, rows: usize, width: usize, values: &[f32]) -> Result<CudaAct> {
        if rows.checked_mul(width) != Some(values.len()) {
            return Err(fail(format!("upload: {} values for [{rows}, {width}]", values.len())));
        }
        let mut a = self.act(rows, width)?;
        if !values.is_empty() {
            self.gpu
                .stream()
                .memcpy_htod(values, &mut a.view_mut())
                .map_err(|e| fail(format!("upload: {}", brink_kernels::cuda::error_name(&e))))?;
        }
        Ok(a)
    }

    /// Copies `x` to the host (synchronises).
    pub fn download(&self, x: &CudaAct) -> Result<Vec<f32>> {
        if x.is_empty() {
            return Ok(Vec::new());
        }
        self.gpu.download_range(&x.buf, 0, x.len()).map_err(|e| fail(format!("download: {e}")))
    }

    /// Reads and clears the embed kernel's count of ids outside the table.
    fn check_bad_ids(&mut self) -> Result<()> {
        let bad = self.bad_ids.read(&self.gpu).map_err(|e| fail(format!("reading the embed's bad-id count: {e}")))?;
        if bad > 0 {
            self.bad_ids.reset(&self.gpu).map_err(|e| fail(format!("resetting the embed's bad-id count: {e}")))?;
            return Err(fail(format!("{bad} token ids of this step were outside the vocabulary (their rows were zeros)")));
        }
        Ok(())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let s = self.graphs.stats;
        if s.captured + s.failed > 0 {
            eprintln!(
                "brink: CUDA graphs: {} decode steps captured ({} kernel edges programmatic), {} replayed, {} failed",
                s.captured, s.programmatic_edges, s.replayed, s.failed
            );
        }
    }
}

impl Backend for CudaBackend {
    type Act = CudaAct;
    type Weight = CudaWeight;

    fn name(&self) -> &'static str {
        NAME
    }

    fn check_layer(&self, layer: usize, spec: &LayerSpec) -> Result<()> {
        check_layer(layer, spec)
    }

    fn supported_types(&self, role: WeightRole) -> &'static [GgmlType] {
        weights::supported_types(role)
    }

    fn load_weight(&mut self, t: HostTensor, role: WeightRole) -> Result<CudaWeight> {
        weights::load(&self.gpu, t, role, weights::Mxfp4::from_env())
    }

    fn alloc_kv(&mut self, spec: KvSpec) -> Result<()> {
        self.graphs.clear(); // they hold the old cache's addresses
        self.batch.attn.forget_specs(); // the cache's block count is part of each
        self.kv = None; // free the old cache before sizing the new one
        self.kv = Some(KvCache::alloc(&self.gpu, spec)?);
        Ok(())
    }

    fn begin_batch(&mut self, batch: &Batch) -> Result<()> {
        if self.graphs.mode != Mode::Eager || self.gpu.capturing() {
            self.graph_failed("a step ended inside a capture or replay");
        }
        self.graphs.mode = Mode::Eager;
        self.batch.begin(&self.gpu, batch, self.kv.as_ref().map(|kv| &kv.spec))?;
        if batch.rows() > self.high_water {
            self.acts.trim();
            self.high_water = batch.rows();
        }
        self.rows = batch.rows() as u64;
        self.open_layer = None;
        if let Some(p) = &self.device_progress {
            p.begin_step();
        }
        self.graphs.mode = self.graph_mode(batch)?;
        Ok(())
    }

    fn abandon_graph(&mut self) -> bool {
        let mode = self.graphs.mode;
        match mode {
            Mode::Capture(_) => self.graph_failed("the step failed while being captured"),
            Mode::Replay(_) => {}
            Mode::Eager if self.graphs.take_retry() => {}
            Mode::Eager => return false,
        }
        self.graphs.mode = Mode::Eager;
        self.graphs.next_step_eager();
        true
    }

    fn set_monitor(&mut self, monitor: Arc<Monitor>) {
        self.device_progress = None;
        if monitor.is_shared() {
            monitor.board().track_device();
            self.device_progress = Some(progress::DeviceProgress::new(&self.gpu, &monitor));
        }
        self.monitor = monitor;
    }

    fn mark(&mut self, layer: Option<u32>, op: Op) -> Result<()> {
        // A replayed graph holds the progress records of its capture.
        let replaying = self.graphs.replaying();
        if let Some(p) = self.device_progress.as_ref().filter(|_| layer != self.open_layer && op != Op::Embed) {
            if let Some(done) = self.open_layer.filter(|_| !replaying) {
                p.queue_layer_done(&self.gpu, &self.monitor, done)?;
            }
            self.open_layer = layer;
        }
        match self.monitor.enter(layer, op, self.rows) {
            None => Ok(()),
            // Queued like any kernel: the host goes on and blocks where it next waits for the
            // device, as it would behind a real deadlock.
            Some(FaultKind::Hang) => brink_kernels::ops::latent_proj::queue_hang(&self.gpu)
                .map_err(|e| fail(format!("injecting a hang at layer {}: {e}", layer.unwrap_or(0)))),
            Some(FaultKind::Fail) => Err(fail(format!("injected fault at layer {} ({op:?})", layer.unwrap_or(0)))),
            Some(FaultKind::LaunchError { sticky }) => Err(crate::monitor::injected_launch_error(NAME, layer.unwrap_or(0), op, sticky)),
        }
    }

    fn embed(&mut self, table: &CudaWeight) -> Result<CudaAct> {
        let mut out = self.act(self.batch.require("embed")?, table.row_len())?;
        if !self.graphs.replaying() {
            gather::embed(&self.gpu, &self.batch, table, &mut self.bad_ids, &mut out)?;
        }
        Ok(out)
    }

    fn rms_norm(&mut self, x: &CudaAct, w: &CudaWeight, eps: f32) -> Result<CudaAct> {
        let mut out = self.act(x.rows(), x.width())?;
        if !x.is_empty() && !self.graphs.replaying() {
            if pointwise::emits_q8_1(x, w) {
                // The hidden norms: their q8_1 rows are the next projection's (or MoE block's) input.
                pointwise::rms_norm_q8_1(&self.gpu, x, w, eps, &mut out, &mut self.moe.xq)?;
            } else {
                pointwise::rms_norm(&self.gpu, x, w, eps, &mut out)?;
            }
        }
        Ok(out)
    }

    fn linear(&mut self, x: &CudaAct, w: &CudaWeight) -> Result<CudaAct> {
        let n = dense::check_matrix(w, x.width(), "linear")?;
        let mut out = self.act(x.rows(), n)?;
        if !x.is_empty() && !self.graphs.replaying() {
            dense::project(&self.gpu, x, (x.rows(), x.width()), w, &mut self.moe.xq, &mut out.buf)?;
        }
        Ok(out)
    }

    fn linear_each<const N: usize>(&mut self, x: &CudaAct, ws: [&CudaWeight; N]) -> Result<[CudaAct; N]> {
        let mut out = Vec::with_capacity(N);
        for w in ws {
            let n = dense::check_matrix(w, x.width(), "linear")?;
            out.push(self.act(x.rows(), n)?);
        }
        let mut out: [CudaAct; N] = out.try_into().map_err(|_| fail(format!("linear_each: not {N} outputs")))?;
        if !x.is_empty() && !self.graphs.replaying() {
            dense::project_each(&self.gpu, x, (x.rows(), x.width()), &ws, &mut self.moe.xq, out.each_mut().map(|o| &mut *o.buf))?;
        }
        Ok(out)
    }

    fn rope(&mut self, x: &mut CudaAct, head_dim: usize, rope: &Rope) -> Result<()> {
        let (theta, yarn) = rope_table(rope);
        self.stale_q8_1();
        if self.graphs.replaying() {
            return Ok(());
        }
        pointwise::rope(&self.gpu, &self.batch, &mut self.ropes, x, (head_dim, theta, yarn))
    }

    fn norm_rope(&mut self, x: &CudaAct, w: &CudaWeight, eps: f32, head_dim: usize, rope: &Rope) -> Result<CudaAct> {
        let (theta, yarn) = rope_table(rope);
        let mut out = self.act(x.rows(), x.width())?;
        if x.is_empty() || self.graphs.replaying() {
            return Ok(out);
        }
        // The fused kernel rotates plain NEOX only: YaRN runs as the two ops.
        if yarn.is_none() && pointwise::norm_rope(&self.gpu, &self.batch, &mut self.ropes, x, w, (eps, head_dim, theta), &mut out)? {
            return Ok(out);
        }
        drop(out);
        let mut y = self.rms_norm(x, w, eps)?;
        self.rope(&mut y, head_dim, rope)?;
        Ok(y)
    }

    fn attention(&mut self, q: &CudaAct, k: &CudaAct, v: &CudaAct, sinks: Option<&CudaWeight>, spec: &AttentionSpec) -> Result<CudaAct> {
        let mut out = self.act(q.rows(), q.width())?;
        if self.graphs.replaying() {
            return Ok(out);
        }
        attention::attention(&self.gpu, self.kv.as_mut(), &mut self.batch, (q, k, v), sinks, spec, &mut out)?;
        Ok(out)
    }

    fn moe(&mut self, x: &CudaAct, w: &MoeWeights<'_, CudaWeight>, spec: &MoeSpec) -> Result<CudaAct> {
        let mut out = self.act(x.rows(), x.width())?;
        if !x.is_empty() && !self.graphs.replaying() {
            moe::moe(&self.gpu, &mut self.moe, x, w, spec, &mut out)?;
        }
        Ok(out)
    }

    fn add_bias(&mut self, x: &mut CudaAct, bias: &CudaWeight) -> Result<()> {
        self.stale_q8_1();
        if x.is_empty() || self.graphs.replaying() {
            return Ok(());
        }
        pointwise::add_bias(&self.gpu, x, bias)
    }

    fn add(&mut self, x: &mut CudaAct, y: &CudaAct) -> Result<()> {
        self.stale_q8_1();
        if (x.is_empty() && y.is_empty()) || self.graphs.replaying() {
            return Ok(());
        }
        pointwise::add(&self.gpu, x, y)
    }

    fn select_logit_rows(&mut self, x: &CudaAct) -> Result<CudaAct> {
        let mut out = self.act(self.batch.logit_rows.len(), x.width())?;
        if !self.graphs.replaying() {
            gather::select_rows(&self.gpu, x, &self.batch.logit_rows, &mut out)?;
        }
        Ok(out)
    }

    fn logits(&mut self, x: &CudaAct, w: &CudaWeight) -> Result<Vec<f32>> {
        let vocab = dense::check_matrix(w, x.width(), "logits")?;
        match self.graphs.mode {
            Mode::Replay(i) => return self.replay(i),
            Mode::Capture(key) => {
                let mut out = self.act(x.rows(), vocab)?;
                dense::project(&self.gpu, x, (x.rows(), x.width()), w, &mut self.moe.xq, &mut out.buf)?;
                let graph = self.gpu.end_capture();
                let attn = self.batch.attn.take_devices();
                let (graph, attn) = match (graph, attn) {
                    (Ok(g), a) if !a.is_empty() => (g, a),
                    (Err(e), _) => {
                        self.graph_failed(&format!("ending the capture: {e}"));
                        self.graphs.retry_eagerly();
                        return Err(gpu_fail("decode graph capture", &e));
                    }
                    (Ok(_), _) => {
                        self.graph_failed("the captured step had no attention plan");
                        self.graphs.retry_eagerly();
                        return Err(fail("decode graph capture: no attention plan"));
                    }
                };
                let i = self.graphs.insert(key, graph, attn, out);
                return self.replay(i);
            }
            Mode::Eager => {}
        }
        let mut values = Vec::new();
        if !x.is_empty() {
            let mut out = self.act(x.rows(), vocab)?;
            dense::project(&self.gpu, x, (x.rows(), x.width()), w, &mut self.moe.xq, &mut out.buf)?;
            self.monitor.board().enter(None, Op::DeviceWait);
            values = self.download(&out)?;
        }
        // Every step ends here: the one place the backend waits for the device anyway.
        self.check_bad_ids()?;
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Activation, Gating};

    #[test]
    fn gpt_oss_layers_load_and_what_the_kernels_do_not_compute_is_refused_by_name() {
        let plain = LayerSpec::plain(32, 4, 128, 1e6, 128, 8, 768);
        assert!(check_layer(0, &plain).is_ok(), "qwen3moe's layer loads");
        let mut gpt_oss = plain;
        gpt_oss.attention.window = Some(128);
        gpt_oss.attention.sinks = true;
        gpt_oss.attention.biases = true;
        gpt_oss.attention.qk_norm = false;
        gpt_oss.attention.rope =
            Rope::Yarn { theta: 1.5e5, factor: 32.0, orig_ctx: 4096, beta_fast: 32.0, beta_slow: 1.0, attn_factor: 1.0 };
        gpt_oss.ffn.gating = Gating::TopKThenSoftmax { weights_scale: None };
        gpt_oss.ffn.activation = Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 };
        gpt_oss.ffn.biases = true;
        // Every gpt-oss feature is computed: its layers load (both kinds: windowed and full).
        assert!(gpt_oss.features().iter().all(|f| COMPUTED.contains(f)), "{:?}", gpt_oss.features());
        assert!(check_layer(4, &gpt_oss).is_ok());
        let mut full = gpt_oss;
        full.attention.window = None;
        assert!(check_layer(5, &full).is_ok());
        // What is not computed is still refused by name.
        let mut wide_v = gpt_oss;
        wide_v.attention.value_dim = 64;
        let e = check_layer(4, &wide_v).unwrap_err().to_string();
        for needle in ["layer 4", "a V head width unlike the Q/K one", "cuda backend"] {
            assert!(e.contains(needle), "{needle}: {e}");
        }
        for computed in COMPUTED {
            assert!(!e.contains(computed), "{computed} is computed: {e}");
        }
        // MXFP4 matrices (gpt-oss's experts) load too (`check_type` finds the type listed).
        assert!(weights::supported_types(WeightRole::Matrix).contains(&crate::gguf::GgmlType::MXFP4));
        let mut scaled = plain;
        scaled.ffn.gating = Gating::SoftmaxThenTopK { norm_top_k: true, weights_scale: Some(2.5) };
        assert!(check_layer(0, &scaled).unwrap_err().to_string().contains("expert_weights_scale"));
    }
}
