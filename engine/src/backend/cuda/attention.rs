//! Attention: the batch's K and V rows go into the paged f16 KV cache at their cache rows
//! (`kv_store`), then every query row attends causally over its sequence's positions, read
//! through its block table (GQA: query
//! head h reads KV head h / (heads / kv_heads)) with the kernels of `ops::attention`: the
//! flash-attention prefill kernel for chunks of several tokens, the split-context decode
//! kernels for one-token chunks, both in one batch when it mixes them.
//!
//! The batch plan (tile map, decode splits) is built and uploaded once per batch and attention
//! spec, at the first layer of that spec, and reused by the others: every layer has the same
//! chunks, and a model has few specs (gpt-oss: its sliding-window layers and its full ones; the
//! decode spans of a windowed plan start at the window). Sinks are an input, not part of the plan.

use brink_kernels::cuda::{Gpu, GpuError};
use brink_kernels::ops::attention::{self as kattn, AttentionIo, BatchPlan, DecodeRoute, DeviceBatch};
use brink_kernels::ops::kv_store::{self, KvRows};
use cudarc::driver::CudaView;

use super::batch_state::BatchState;
use super::buffers::{AllocCounter, CudaAct, Grow};
use super::kv::KvCache;
use super::weights::{CudaWeight, WeightData};
use super::{fail, gpu_fail};
use crate::backend::{AttentionSpec, Chunk, KvSpec};
use crate::model::BackendError;

/// The batch's chunks and block tables, and their plans on the device (one per attention spec)
/// once a layer has asked for them.
pub(crate) struct AttnMaps {
    chunks: Vec<kattn::Chunk>,
    tables: Vec<u32>,
    /// The windowed layers' tables (window-only layout), entry for entry beside `tables`;
    /// empty without.
    window_tables: Vec<u32>,
    devices: Vec<DeviceBatch>,
    /// Partial results of the split-context decode kernels.
    workspace: Grow<f32>,
    /// The kernels' specs of the attention calls so far, in the order first seen (a model has
    /// one, or two with sliding-window layers), each with whether its layers read the window
    /// tables: a decode graph's plans are made before its capture from them.
    specs: Vec<(kattn::AttentionSpec, bool)>,
}

/// Specs a model may use before the list is taken for a sign of a bug (a spec per call).
const MAX_SPECS: usize = 8;

impl AttnMaps {
    pub(crate) fn new(gpu: &Gpu, allocs: &AllocCounter) -> Result<Self, BackendError> {
        let workspace = Grow::new(gpu, allocs).map_err(|e| fail(format!("allocating the attention workspace: {e}")))?;
        Ok(AttnMaps {
            chunks: Vec::new(),
            tables: Vec::new(),
            window_tables: Vec::new(),
            devices: Vec::new(),
            workspace,
            specs: Vec::new(),
        })
    }

    /// Takes a new batch's chunks and flat block tables (and window tables, for a cache with
    /// windowed layers); the device plan (which uploads the tables) is made by the first
    /// attention call.
    pub(crate) fn prepare(&mut self, _gpu: &Gpu, chunks: &[Chunk], tables: &[u32], window_tables: &[u32]) -> Result<(), BackendError> {
        self.chunks = chunks
            .iter()
            .map(|c| kattn::Chunk { table: c.table, start_pos: c.start_pos, n_tokens: c.len, first_row: c.first_row })
            .collect();
        self.tables.clear();
        self.tables.extend_from_slice(tables);
        self.window_tables.clear();
        self.window_tables.extend_from_slice(window_tables);
        self.devices.clear();
        Ok(())
    }

    /// Forgets the specs seen (a new KV cache: its block count is part of every spec).
    pub(crate) fn forget_specs(&mut self) {
        self.specs.clear();
        self.devices.clear();
    }

    /// The tables the layers of a spec read: the window tables for windowed layers.
    fn tables_for(&self, windowed: bool) -> &[u32] {
        if windowed { &self.window_tables } else { &self.tables }
    }

    /// Notes `spec` as one the model uses (`windowed`: its layers read the window tables).
    fn note_spec(&mut self, spec: kattn::AttentionSpec, windowed: bool) -> Result<(), BackendError> {
        let spec = (spec, windowed);
        if !self.specs.contains(&spec) {
            if self.specs.len() >= MAX_SPECS {
                return Err(fail(format!("attention: more than {MAX_SPECS} attention specs in one model ({})", spec.0.describe())));
            }
            self.specs.push(spec);
        }
        Ok(())
    }

    /// This batch's plans, one per spec seen (in that order), with their decode splits padded
    /// to `splits`, and the workspace made large enough for them (before a capture, which must
    /// not allocate). None before any attention call.
    pub(crate) fn padded_plans(&mut self, gpu: &Gpu, rows: usize, splits: u64) -> Result<Option<Vec<BatchPlan>>, BackendError> {
        if self.specs.is_empty() {
            return Ok(None);
        }
        let mut plans = Vec::with_capacity(self.specs.len());
        for (spec, windowed) in &self.specs {
            let mut plan = BatchPlan::new(&self.chunks, self.tables_for(*windowed), rows as u64, spec, DecodeRoute::Split)
                .map_err(|e| gpu_fail("attention plan", &GpuError::Plan(e)))?;
            plan.pad_decode_splits(splits).map_err(|e| gpu_fail("attention plan", &GpuError::Plan(e)))?;
            plans.push(plan);
        }
        let floats = plans.iter().map(BatchPlan::workspace_floats).max().unwrap_or(0);
        self.workspace.ensure(gpu, floats.max(1) as usize).map_err(|e| fail(format!("attention workspace: {e}")))?;
        Ok(Some(plans))
    }

    /// Makes `devices` this batch's plans (a graph's, prepared before its capture).
    pub(crate) fn use_devices(&mut self, devices: Vec<DeviceBatch>) {
        self.devices = devices;
    }

    /// Hands the batch's device plans over (to the graph captured with them); empty when none.
    pub(crate) fn take_devices(&mut self) -> Vec<DeviceBatch> {
        std::mem::take(&mut self.devices)
    }

    /// The device plan for `spec`, and the decode workspace it needs. A windowed layer's spec
    /// (window-only layout) names the ring cache's block count, so it never shares a plan with
    /// a full layer's.
    fn plan(
        &mut self,
        gpu: &Gpu,
        rows: usize,
        spec: &kattn::AttentionSpec,
        windowed: bool,
    ) -> Result<(&DeviceBatch, &mut Grow<f32>), BackendError> {
        let i = match self.devices.iter().position(|d| d.plan().spec() == spec) {
            Some(i) => i,
            None => {
                let plan = BatchPlan::new(&self.chunks, self.tables_for(windowed), rows as u64, spec, DecodeRoute::Split)
                    .map_err(|e| gpu_fail("attention plan", &GpuError::Plan(e)))?;
                self.workspace
                    .ensure(gpu, plan.workspace_floats().max(1) as usize)
                    .map_err(|e| fail(format!("attention workspace: {e}")))?;
                self.devices.push(DeviceBatch::upload(gpu, plan).map_err(|e| fail(e.to_string()))?);
                self.devices.len() - 1
            }
        };
        Ok((&self.devices[i], &mut self.workspace))
    }
}

/// The head's sinks as the kernels read them: `[heads]` f32 (gpt-oss's `attn_sinks`).
fn sinks_view<'a>(sinks: Option<&'a CudaWeight>, spec: &AttentionSpec) -> Result<Option<CudaView<'a, f32>>, BackendError> {
    let Some(w) = sinks else { return Ok(None) };
    match &w.data {
        WeightData::F32(v) if v.len() == spec.heads => Ok(Some(v.as_view())),
        WeightData::F32(v) => Err(fail(format!(
            "attention (layer {}): sinks {} hold {} values, expected {} (one per head)",
            spec.layer,
            w.name(),
            v.len(),
            spec.heads
        ))),
        WeightData::Blocks { .. } => Err(fail(format!("attention (layer {}): sinks {} must be f32 values", spec.layer, w.name()))),
    }
}

/// The shapes attention needs: Q `[rows, heads·d]`, K and V `[rows, kv_heads·d]`, a layer and
/// head layout the cache was made for.
pub(crate) fn check_shapes(spec: &AttentionSpec, kv: &KvSpec, rows: usize, q: &CudaAct, k: &CudaAct, v: &CudaAct) -> Result<(), String> {
    let (qw, kvw) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
    if spec.heads == 0 || spec.kv_heads == 0 || !spec.heads.is_multiple_of(spec.kv_heads) {
        return Err(format!("{} heads cannot share {} KV heads", spec.heads, spec.kv_heads));
    }
    if spec.layer >= kv.layers || spec.kv_heads != kv.kv_heads || spec.head_dim != kv.head_dim {
        return Err(format!(
            "layer {} with {} KV heads of {} does not fit the KV cache ({} layers, {} heads of {})",
            spec.layer, spec.kv_heads, spec.head_dim, kv.layers, kv.kv_heads, kv.head_dim
        ));
    }
    for (name, a, width) in [("Q", q, qw), ("K", k, kvw), ("V", v, kvw)] {
        if a.rows() != rows || a.width() != width {
            return Err(format!("{name} is [{}, {}], expected [{rows}, {width}] (the batch's rows)", a.rows(), a.width()));
        }
    }
    Ok(())
}

/// The kernels' view of the attention of a layer over this cache (the layer's own block count:
/// a windowed layer of the window-only layout has the ring cache's).
fn kernel_spec(spec: &AttentionSpec, kv: &KvSpec) -> Result<kattn::AttentionSpec, BackendError> {
    let u = |v: usize, what: &str| u32::try_from(v).map_err(|_| fail(format!("attention: {what} {v} does not fit u32")));
    let s = kattn::AttentionSpec {
        heads: u(spec.heads, "heads")?,
        kv_heads: u(spec.kv_heads, "kv_heads")?,
        head_dim: u(spec.head_dim, "head_dim")?,
        blocks: u(kv.layer_blocks(spec.layer), "blocks")?,
        block_size: u(kv.block_size, "block_size")?,
        scale: spec.scale,
        window: match spec.window {
            None => 0,
            Some(0) => return Err(fail(format!("attention (layer {}): a sliding window of 0 keys", spec.layer))),
            Some(w) => w,
        },
    };
    match s.unsupported() {
        Some(why) => Err(fail(format!("attention (layer {}): {why}", spec.layer))),
        None => Ok(s),
    }
}

/// Stores K and V, then attends; `out` is `[rows, heads·d]`.
pub(crate) fn attention(
    gpu: &Gpu,
    kv: Option<&mut KvCache>,
    batch: &mut BatchState,
    (q, k, v): (&CudaAct, &CudaAct, &CudaAct),
    sinks: Option<&CudaWeight>,
    spec: &AttentionSpec,
    out: &mut CudaAct,
) -> Result<(), BackendError> {
    let rows = batch.require("attention")?;
    let kv = kv.ok_or_else(|| fail("attention: no KV cache (alloc_kv was not called)"))?;
    check_shapes(spec, &kv.spec, rows, q, k, v).map_err(|why| fail(format!("attention (layer {}): {why}", spec.layer)))?;
    let windowed = kv.spec.ring_layer(spec).map_err(fail)?;
    let kspec = kernel_spec(spec, &kv.spec)?;
    let sinks = sinks_view(sinks, spec)?;
    batch.attn.note_spec(kspec, windowed)?;
    let layer = &mut kv.layers[spec.layer];
    let n = rows * k.width();
    let dest = if windowed { &batch.window_dest } else { &batch.dest };
    let src = KvRows { k: k.buf.slice(0..n), v: v.buf.slice(0..n), dest: dest.slice(0..rows) };
    kv_store::launch(gpu, &kspec, rows as u64, &src, &mut layer.k.as_view_mut(), &mut layer.v.as_view_mut())
        .map_err(|e| gpu_fail("kv_store", &e))?;
    let (device, workspace) = batch.attn.plan(gpu, rows, &kspec, windowed)?;
    let qn = rows * q.width();
    let io = AttentionIo {
        q: q.buf.slice(0..qn),
        k_cache: layer.k.as_view(),
        v_cache: layer.v.as_view(),
        out: out.buf.slice_mut(0..qn),
        workspace: workspace.as_view_mut(),
        sinks,
    };
    kattn::launch(gpu, device, io).map_err(|e| gpu_fail(format_args!("attention (layer {})", spec.layer), &e))
}
