//! The routed-expert block on the CPU, in llama.cpp's order of operations (`build_moe_ffn`):
//! router logits (F32 matmul), softmax, top-k, renormalised weights; per expert the gate and up
//! projections of the tokens routed to it, SwiGLU, the down projection; each pick's output
//! scaled by its weight, the picks summed in slot order.

use rayon::prelude::*;

use crate::backend::{MoeSpec, MoeWeights, Result};
use crate::ggml_cpu::{self, QuantizedActs};
use crate::model::MatrixDims;

use super::{CpuAct, CpuWeight, cpu_err, err, linear};

pub fn moe(x: &CpuAct, w: &MoeWeights<'_, CpuWeight>, spec: &MoeSpec) -> Result<CpuAct> {
    let (rows, hidden, k, ffn) = (x.rows, x.width, spec.top_k, spec.expert_ffn);
    if w.gate.t.matrices() != spec.experts || w.gate.t.rows() != ffn || w.down.t.rows() != hidden || w.down.t.row_len() != ffn {
        return Err(err(format!("moe: expert tensors {:?} / {:?} do not match {spec:?}", w.gate.t.dims, w.down.t.dims)));
    }
    ggml_cpu::check_moe_shape(spec.experts, k).map_err(|e| cpu_err(&w.router.t.name, e))?;
    let logits = linear(x, &w.router.matrix(0)?);
    let mut routing = ggml_cpu::route(&logits.data, spec.experts, k, spec.norm_top_k);
    if let Some(s) = spec.weights_scale {
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
        let mut par = CpuAct::zeros(n, ffn);
        ggml_cpu::swiglu(&gate, &up, &mut par.data);
        // The down projection is a mul_mat_id too: row by row (`vec_dot`), never sgemm's order.
        let par_acts = QuantizedActs::new(down_w.kind().vec_dot_type(), &par.data, ffn, n);
        let all: Vec<usize> = (0..n).collect();
        let mut y = vec![0.0f32; n * hidden];
        ggml_cpu::matmul_gather(&down_w, &par_acts, &all, &mut y);
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
