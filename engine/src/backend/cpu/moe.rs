//! The routed-expert block on the CPU, in llama.cpp's order of operations (`build_moe_ffn`):
//! router logits (+ the router bias), then the gating — softmax, top-k, renormalised weights
//! (qwen3moe), or top-k of the logits and the softmax of those (gpt-oss) — times the weights
//! scale; per expert the gate and up projections of the tokens routed to it (+ the expert's
//! biases, `ggml_add_id`), SwiGLU or the clamped SwiGLU, the down projection (+ its bias);
//! each pick's output scaled by its weight, the picks summed in slot order. Every bias value is
//! one f32 add, so adding it per expert gives `add_id`'s bits.

use rayon::prelude::*;

use crate::backend::{MoeSpec, MoeWeights, Result};
use crate::ggml_cpu::{self, QuantizedActs};
use crate::model::MatrixDims;
use crate::model::{Activation, Gating};

use super::{CpuAct, CpuWeight, cpu_err, err, linear};

pub fn moe(x: &CpuAct, w: &MoeWeights<'_, CpuWeight>, spec: &MoeSpec) -> Result<CpuAct> {
    let (rows, hidden, k, ffn) = (x.rows, x.width, spec.top_k, spec.expert_ffn);
    if w.gate.t.matrices() != spec.experts || w.gate.t.rows() != ffn || w.down.t.rows() != hidden || w.down.t.row_len() != ffn {
        return Err(err(format!("moe: expert tensors {:?} / {:?} do not match {spec:?}", w.gate.t.dims, w.down.t.dims)));
    }
    ggml_cpu::check_moe_shape(spec.experts, k).map_err(|e| cpu_err(&w.router.t.name, e))?;
    let biases = match &w.biases {
        Some(b) => Some(Biases {
            router: bias_rows(b.router, spec.experts, 1)?,
            gate: bias_rows(b.gate, spec.experts, ffn)?,
            up: bias_rows(b.up, spec.experts, ffn)?,
            down: bias_rows(b.down, spec.experts, hidden)?,
        }),
        None => None,
    };
    let mut logits = linear(x, &w.router.matrix(0)?);
    if let Some(b) = &biases {
        ggml_cpu::add_bias(&mut logits.data, b.router);
    }
    let (mut routing, scale) = match spec.gating {
        Gating::SoftmaxThenTopK { norm_top_k, weights_scale } => {
            (ggml_cpu::route(&logits.data, spec.experts, k, norm_top_k), weights_scale)
        }
        Gating::TopKThenSoftmax { weights_scale } => (ggml_cpu::route_softmax_weight(&logits.data, spec.experts, k), weights_scale),
    };
    // llama.cpp scales unless the factor is 0 or 1.
    if let Some(s) = scale.filter(|&s| s != 0.0 && s != 1.0) {
        routing.weights.iter_mut().for_each(|v| *v *= s);
    }
    // x quantized once for every expert's gate and up (ggml's mul_mat_id converts src1 once).
    let gate0 = w.gate.matrix(0)?;
    let acts = QuantizedActs::new(gate0.kind().vec_dot_type(), &x.data, hidden, rows);
    // expert_out[t, j]: the down projection of pick j of token t, before its weight.
    let mut expert_out = vec![0.0f32; rows * k * hidden];
    for (e, picks) in routing.by_expert().iter().enumerate().filter(|(_, p)| !p.is_empty()) {
        let rows_of: Vec<usize> = picks.iter().map(|&(t, _)| t as usize).collect();
        let n = rows_of.len();
        let (gate_w, up_w, down_w) = (w.gate.matrix(e)?, w.up.matrix(e)?, w.down.matrix(e)?);
        let mut gate = vec![0.0f32; n * ffn];
        let mut up = vec![0.0f32; n * ffn];
        ggml_cpu::matmul_gather(&gate_w, &acts, &rows_of, &mut gate);
        ggml_cpu::matmul_gather(&up_w, &acts, &rows_of, &mut up);
        if let Some(b) = &biases {
            ggml_cpu::add_bias(&mut up, &b.up[e * ffn..(e + 1) * ffn]);
            ggml_cpu::add_bias(&mut gate, &b.gate[e * ffn..(e + 1) * ffn]);
        }
        let mut par = CpuAct::zeros(n, ffn);
        match spec.activation {
            Activation::SwiGlu => ggml_cpu::swiglu(&gate, &up, &mut par.data),
            Activation::ClampedSwiGlu { alpha, limit } => ggml_cpu::swiglu_oai(&gate, &up, alpha, limit, &mut par.data),
        }
        // The down projection is a mul_mat_id too: row by row (`vec_dot`), never sgemm's order.
        let par_acts = QuantizedActs::new(down_w.kind().vec_dot_type(), &par.data, ffn, n);
        let all: Vec<usize> = (0..n).collect();
        let mut y = vec![0.0f32; n * hidden];
        ggml_cpu::matmul_gather(&down_w, &par_acts, &all, &mut y);
        if let Some(b) = &biases {
            ggml_cpu::add_bias(&mut y, &b.down[e * hidden..(e + 1) * hidden]);
        }
        for (i, &(t, j)) in picks.iter().enumerate() {
            let at = (t as usize * k + j as usize) * hidden;
            expert_out[at..at + hidden].copy_from_slice(&y[i * hidden..(i + 1) * hidden]);
        }
    }
    let mut out = CpuAct::zeros(rows, hidden);
    out.data.par_chunks_mut(hidden).zip(expert_out.par_chunks(k * hidden)).zip(routing.weights.par_chunks(k)).for_each(|((o, e), wt)| {
        ggml_cpu::combine(e, wt, k, hidden, o);
    });
    Ok(out)
}

/// The biases of one block, as F32 values: `[experts, width]` each.
struct Biases<'a> {
    router: &'a [f32],
    gate: &'a [f32],
    up: &'a [f32],
    down: &'a [f32],
}

/// The values of bias tensor `w`, which must be `experts` rows of `width`.
fn bias_rows(w: &CpuWeight, experts: usize, width: usize) -> Result<&[f32]> {
    let v = w.values.as_deref().ok_or_else(|| err(format!("moe: bias {} is not F32", w.t.name)))?;
    if v.len() != experts * width {
        return Err(err(format!("moe: bias {} has {} values, expected {experts} x {width}", w.t.name, v.len())));
    }
    Ok(v)
}
