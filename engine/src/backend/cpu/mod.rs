//! The reference backend: multi-threaded CPU math that mirrors llama.cpp's CPU arithmetic
//! (activations quantized to each weight's dot type, f16 KV cache, f64 norm and softmax sums)
//! so that it matches llama.cpp token for token, and the CUDA backend is checked against it.

mod kv;
mod moe;

use std::sync::Arc;

use crate::backend::{AttentionSpec, Backend, Batch, Chunk, KvSpec, MoeSpec, MoeWeights, Result, WeightRole};
use crate::ggml_cpu::{self, CpuError, WeightMatrix};
use crate::gguf::GgmlType;
use crate::model::{BackendError, HostTensor, LayerSpec, MatrixDims, Rope};
use crate::monitor::{self, FaultKind, Monitor, Op};

use kv::KvCache;

const NAME: &str = "cpu";
const MATRIX_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

/// `[rows, width]` activations.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuAct {
    pub rows: usize,
    pub width: usize,
    pub data: Vec<f32>,
}

impl CpuAct {
    fn zeros(rows: usize, width: usize) -> Self {
        CpuAct { rows, width, data: vec![0.0; rows * width] }
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.width..(r + 1) * self.width]
    }
}

pub struct CpuWeight {
    t: HostTensor,
    /// The values of an F32 vector (norm weights).
    values: Option<Vec<f32>>,
}

impl CpuWeight {
    /// Matrix `m` of the tensor (the expert index of a stacked expert tensor).
    fn matrix(&self, m: usize) -> Result<WeightMatrix<'_>> {
        let (rows, cols) = (self.t.rows(), self.t.row_len());
        let size = rows * self.t.row_bytes();
        let data = self.t.bytes.get(m * size..(m + 1) * size).ok_or_else(|| err(format!("{} has no matrix {m}", self.t.name)))?;
        WeightMatrix::new(self.t.ggml_type, rows, cols, data).map_err(|e| cpu_err(&self.t.name, e))
    }
}

#[derive(Default)]
pub struct CpuBackend {
    kv: Option<KvCache>,
    batch: Batch,
    monitor: Arc<Monitor>,
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::default()
    }

    fn kv(&mut self) -> Result<&mut KvCache> {
        self.kv.as_mut().ok_or_else(|| err("attention before the KV cache was allocated"))
    }

    /// Stores the batch's K/V rows at their cache rows, then attends each chunk over its
    /// sequence's positions, gathered through its block table into contiguous scratch (or read
    /// in place when its blocks are consecutive): the arithmetic is that of an unpaged cache.
    fn attend(
        &mut self,
        batch: &Batch,
        q: &CpuAct,
        k: &CpuAct,
        v: &CpuAct,
        sinks: Option<&CpuWeight>,
        spec: &AttentionSpec,
    ) -> Result<CpuAct> {
        let sinks = match sinks {
            Some(w) => {
                let s = w.values.as_deref().ok_or_else(|| err(format!("{} is not an F32 vector", w.t.name)))?;
                if s.len() != spec.heads {
                    return Err(err(format!(
                        "attention (layer {}): {} has {} sinks for {} heads",
                        spec.layer,
                        w.t.name,
                        s.len(),
                        spec.heads
                    )));
                }
                Some(s)
            }
            None => None,
        };
        if spec.window == Some(0) {
            return Err(err(format!("attention (layer {}): a sliding window of 0 keys", spec.layer)));
        }
        let ext = ggml_cpu::AttnExt { window: spec.window, sinks };
        let kv = self.kv()?;
        // A windowed layer of the window-only layout: its ring, through the window tables.
        let windowed = kv.spec.ring_layer(spec).map_err(err)?;
        let table_of = |c: &Chunk| batch.layer_table(c, windowed);
        for (i, c) in batch.chunks.iter().enumerate() {
            if let Some(why) = kv.table_unsupported(spec.layer, table_of(c), c.end_pos() as usize) {
                return Err(err(format!("attention (layer {}): chunk {i}: {why}", spec.layer)));
            }
        }
        for (r, row) in batch.layer_rows(windowed).into_iter().enumerate() {
            let row = row.ok_or_else(|| err(format!("attention: batch row {r} is outside its chunk's block table")))?;
            kv.store(spec.layer, row, k.row(r), v.row(r));
        }
        let mut out = CpuAct::zeros(q.rows, spec.heads * spec.head_dim);
        let width = out.width;
        let (mut k_scratch, mut v_scratch) = (Vec::new(), Vec::new());
        for c in &batch.chunks {
            let rows = c.first_row as usize..(c.first_row + c.len) as usize;
            // Through a ring, the positions before a query's window hold other positions' keys:
            // the attention masks them (-inf, weight 0) without reading them, so the sums are
            // those of the full layout bit for bit.
            let (kc, vc) = kv.positions(spec.layer, table_of(c), c.end_pos() as usize, &mut k_scratch, &mut v_scratch);
            // Summed as llama.cpp sums a batch of this chunk's tokens (`ggml_cpu::attention`).
            ggml_cpu::attention_ext(
                &q.data[rows.start * width..rows.end * width],
                kc,
                vc,
                &batch.positions[rows.clone()],
                spec.heads,
                spec.kv_heads,
                spec.head_dim,
                spec.scale,
                rows.len(),
                ext,
                &mut out.data[rows.start * width..rows.end * width],
            );
        }
        Ok(out)
    }
}

fn err(message: impl Into<String>) -> BackendError {
    BackendError::new(NAME, message)
}

fn cpu_err(tensor: &str, e: CpuError) -> BackendError {
    err(format!("{tensor}: {e}"))
}

fn linear(x: &CpuAct, w: &WeightMatrix<'_>) -> CpuAct {
    let mut y = CpuAct::zeros(x.rows, w.rows);
    ggml_cpu::matmul(w, &x.data, x.rows, &mut y.data);
    y
}

impl Backend for CpuBackend {
    type Act = CpuAct;
    type Weight = CpuWeight;

    fn name(&self) -> &'static str {
        NAME
    }

    fn check_layer(&self, _layer: usize, _spec: &LayerSpec) -> Result<()> {
        // Every feature of the spec list has its llama.cpp-checked op in ggml_cpu.
        Ok(())
    }

    fn supported_types(&self, role: WeightRole) -> &'static [GgmlType] {
        match role {
            WeightRole::Embedding => MATRIX_TYPES,
            WeightRole::Matrix => MATRIX_TYPES,
            WeightRole::Scale => &[GgmlType::F32],
        }
    }

    fn load_weight(&mut self, t: HostTensor, role: WeightRole) -> Result<CpuWeight> {
        let values = match role {
            WeightRole::Scale => Some(t.f32_values().ok_or_else(|| err(format!("{} must be F32", t.name)))?),
            _ => None,
        };
        Ok(CpuWeight { t, values })
    }

    fn alloc_kv(&mut self, spec: KvSpec) -> Result<()> {
        self.kv = Some(KvCache::new(spec)?);
        Ok(())
    }

    fn begin_batch(&mut self, batch: &Batch) -> Result<()> {
        self.batch = batch.clone();
        Ok(())
    }

    fn set_monitor(&mut self, monitor: Arc<Monitor>) {
        self.monitor = monitor;
    }

    fn mark(&mut self, layer: Option<u32>, op: Op) -> Result<()> {
        match self.monitor.enter(layer, op, self.batch.rows() as u64) {
            None => Ok(()),
            Some(FaultKind::Hang) => monitor::block_forever(),
            Some(FaultKind::Fail) => Err(err(format!("injected fault at layer {} ({op:?})", layer.unwrap_or(0)))),
            Some(FaultKind::LaunchError { sticky }) => Err(monitor::injected_launch_error(NAME, layer.unwrap_or(0), op, sticky)),
        }
    }

    fn embed(&mut self, table: &CpuWeight) -> Result<CpuAct> {
        let m = table.matrix(0)?;
        let mut x = CpuAct::zeros(self.batch.rows(), m.cols);
        ggml_cpu::get_rows(&m, &self.batch.tokens, &mut x.data).map_err(|e| cpu_err(&table.t.name, e))?;
        Ok(x)
    }

    fn rms_norm(&mut self, x: &CpuAct, w: &CpuWeight, eps: f32) -> Result<CpuAct> {
        let weight = w.values.as_deref().ok_or_else(|| err(format!("{} is not a norm weight", w.t.name)))?;
        if weight.is_empty() || !x.width.is_multiple_of(weight.len()) {
            return Err(err(format!("rms_norm: width {} is not a multiple of {} ({})", x.width, weight.len(), w.t.name)));
        }
        let mut y = CpuAct::zeros(x.rows, x.width);
        ggml_cpu::rms_norm(&x.data, weight.len(), weight, eps, &mut y.data);
        Ok(y)
    }

    fn linear(&mut self, x: &CpuAct, w: &CpuWeight) -> Result<CpuAct> {
        let m = w.matrix(0)?;
        if x.width != m.cols {
            return Err(err(format!("linear: {} expects width {}, got {}", w.t.name, m.cols, x.width)));
        }
        Ok(linear(x, &m))
    }

    fn rope(&mut self, x: &mut CpuAct, head_dim: usize, rope: &Rope) -> Result<()> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) || !x.width.is_multiple_of(head_dim) || x.rows != self.batch.rows() {
            return Err(err(format!("rope: [{}, {}] in heads of {head_dim} for a batch of {}", x.rows, x.width, self.batch.rows())));
        }
        let heads = x.width / head_dim;
        match *rope {
            Rope::Neox { theta } => ggml_cpu::rope_neox(&mut x.data, heads, head_dim, &self.batch.positions, theta),
            Rope::Yarn { theta, factor, orig_ctx, beta_fast, beta_slow, attn_factor } => {
                // llama.cpp's cparams for a YaRN model: freq_scale = 1 / factor, ext_factor 1.
                let yarn =
                    ggml_cpu::Yarn { freq_scale: 1.0 / factor, ext_factor: 1.0, attn_factor, beta_fast, beta_slow, n_ctx_orig: orig_ctx };
                ggml_cpu::rope_neox_yarn(&mut x.data, heads, head_dim, &self.batch.positions, theta, &yarn);
            }
        }
        Ok(())
    }

    fn attention(&mut self, q: &CpuAct, k: &CpuAct, v: &CpuAct, sinks: Option<&CpuWeight>, spec: &AttentionSpec) -> Result<CpuAct> {
        let batch = std::mem::take(&mut self.batch);
        let result = self.attend(&batch, q, k, v, sinks, spec);
        self.batch = batch;
        result
    }

    fn moe(&mut self, x: &CpuAct, w: &MoeWeights<'_, CpuWeight>, spec: &MoeSpec) -> Result<CpuAct> {
        moe::moe(x, w, spec)
    }

    fn add(&mut self, x: &mut CpuAct, y: &CpuAct) -> Result<()> {
        if (x.rows, x.width) != (y.rows, y.width) {
            return Err(err(format!("add: [{}, {}] + [{}, {}]", x.rows, x.width, y.rows, y.width)));
        }
        x.data.iter_mut().zip(&y.data).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn add_bias(&mut self, x: &mut CpuAct, bias: &CpuWeight) -> Result<()> {
        let b = bias.values.as_deref().ok_or_else(|| err(format!("{} is not an F32 vector", bias.t.name)))?;
        if b.len() != x.width {
            return Err(err(format!("add_bias: {} has {} values for rows of {}", bias.t.name, b.len(), x.width)));
        }
        ggml_cpu::add_bias(&mut x.data, b);
        Ok(())
    }

    fn select_logit_rows(&mut self, x: &CpuAct) -> Result<CpuAct> {
        let mut y = CpuAct::zeros(self.batch.logit_rows.len(), x.width);
        for (i, &r) in self.batch.logit_rows.iter().enumerate() {
            y.data[i * x.width..(i + 1) * x.width].copy_from_slice(x.row(r as usize));
        }
        Ok(y)
    }

    fn logits(&mut self, x: &CpuAct, w: &CpuWeight) -> Result<Vec<f32>> {
        Ok(self.linear(x, w)?.data)
    }
}
