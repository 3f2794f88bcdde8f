//! Compares `engine::cpu` with ggml's CPU ops, from a dump written by scripts/ggml_crosscheck.c
//! (run both with scripts/ggml-crosscheck). Fails unless every op brink mirrors exactly is bit
//! for bit ggml's: activation quantization and the mxfp4 weight quantizer; matmuls of every
//! weight type brink multiplies, for 1, 2, 3, 7 and 40 activation rows (ggml's vec_dot and
//! llamafile's sgemm; an odd number of blocks for the 32-wide types), and the experts'
//! mul_mat_id for 1 and 6 tokens; RMSNorm, softmax, SwiGLU, RoPE, argsort, get_rows, attention
//! for decode and prefill; gpt-oss's ops: attention with a sliding window and sinks at the
//! window's edge and over a wrapped cache, softmax with sinks, YaRN RoPE, swiglu_oai, softmax-weight routing, add_id.
//!
//! `cargo run --release -p brink-engine --example ggml_crosscheck -- DUMP`

use std::collections::HashMap;
use std::process::ExitCode;

use brink_engine::ggml_cpu::act_quant::{BlockQ8_0, BlockQ8K, quantize_row_q8_0, quantize_row_q8_k};
use brink_engine::ggml_cpu::activation::{OAI_ALPHA, OAI_LIMIT};
use brink_engine::ggml_cpu::argsort::argsort_desc;
use brink_engine::ggml_cpu::softmax::{soft_max_rows, soft_max_sink};
use brink_engine::ggml_cpu::{
    AttnExt, QuantizedActs, WeightMatrix, Yarn, add_bias, add_id, attention, attention_cells, attention_ext, get_rows, matmul,
    matmul_gather, rms_norm, rope_neox, rope_neox_yarn, route_softmax_weight, swiglu, swiglu_oai,
};
use brink_engine::gguf::GgmlType;
use brink_kernels::quant::mxfp4;
use half::f16;

struct Dump(HashMap<String, (u32, Vec<u8>)>);

impl Dump {
    fn read(path: &str) -> Result<Dump, String> {
        let b = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        let mut m = HashMap::new();
        let mut at = 0usize;
        let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
            let s = b.get(*at..*at + n).ok_or_else(|| format!("{path}: truncated at byte {at}"))?;
            *at += n;
            Ok(s)
        };
        while at < b.len() {
            let len = u32::from_le_bytes(take(&mut at, 4)?.try_into().unwrap()) as usize;
            let name = String::from_utf8(take(&mut at, len)?.to_vec()).map_err(|e| format!("{path}: {e}"))?;
            let kind = u32::from_le_bytes(take(&mut at, 4)?.try_into().unwrap());
            let n = u64::from_le_bytes(take(&mut at, 8)?.try_into().unwrap()) as usize;
            let data = take(&mut at, n * if kind == 2 { 1 } else { 4 })?.to_vec();
            m.insert(name, (kind, data));
        }
        Ok(Dump(m))
    }

    fn get(&self, name: &str, kind: u32) -> &[u8] {
        match self.0.get(name) {
            Some((k, d)) if *k == kind => d,
            _ => panic!("the dump has no {name} of kind {kind}: rebuild scripts/ggml_crosscheck.c"),
        }
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        self.get(name, 0).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn u32s(&self, name: &str) -> Vec<u32> {
        self.get(name, 1).chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn bytes(&self, name: &str) -> &[u8] {
        self.get(name, 2)
    }

    fn f16s(&self, name: &str) -> Vec<f16> {
        self.bytes(name).chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect()
    }
}

#[derive(Default)]
struct Verdict {
    checks: usize,
    failures: Vec<String>,
}

impl Verdict {
    /// Prints the comparison (values bit-identical, and the largest difference relative to the
    /// largest |expected|); passes only if every value is bit-identical.
    fn compare(&mut self, name: &str, ours: &[f32], theirs: &[f32]) {
        assert_eq!(ours.len(), theirs.len(), "{name}: lengths");
        let same = ours.iter().zip(theirs).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
        let scale = theirs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = ours.iter().zip(theirs).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        let rel = if scale > 0.0 { diff / scale } else { diff };
        let ok = same == ours.len();
        self.checks += 1;
        println!(
            "{:<4} {name:<32} {same:>6}/{:<6} bit-identical, max |diff| {:.2e} of max |y|",
            if ok { "ok" } else { "FAIL" },
            ours.len(),
            rel
        );
        if !ok {
            self.failures.push(name.to_string());
        }
    }

    fn check(&mut self, name: &str, ok: bool, detail: String) {
        self.checks += 1;
        println!("{:<4} {name:<24} {detail}", if ok { "ok" } else { "FAIL" });
        if !ok {
            self.failures.push(name.to_string());
        }
    }
}

fn quantization(d: &Dump, v: &mut Verdict) {
    let x = d.f32s("quant.x");
    let k = 2048;
    let (q80, q8k) = (d.bytes("quant.q8_0"), d.bytes("quant.q8_K"));
    let (mut bad80, mut bad8k) = (0, 0);
    for (r, xr) in x.chunks_exact(k).enumerate() {
        let mut a = vec![BlockQ8_0 { d: 0.0, qs: [0; 32] }; k / 32];
        quantize_row_q8_0(xr, &mut a);
        for (i, b) in a.iter().enumerate() {
            let mut mine = f16::from_f32(b.d).to_le_bytes().to_vec();
            mine.extend(b.qs.iter().map(|&q| q as u8));
            bad80 += usize::from(mine != q80[(r * k / 32 + i) * 34..][..34]);
        }
        let mut a = vec![BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] }; k / 256];
        quantize_row_q8_k(xr, &mut a);
        for (i, b) in a.iter().enumerate() {
            let mut mine = b.d.to_le_bytes().to_vec();
            mine.extend(b.qs.iter().map(|&q| q as u8));
            mine.extend(b.bsums.iter().flat_map(|s| s.to_le_bytes()));
            bad8k += usize::from(mine != q8k[(r * k / 256 + i) * 292..][..292]);
        }
    }
    v.check("quantize q8_0", bad80 == 0, format!("{bad80} of {} activation blocks differ", x.len() / 32));
    v.check("quantize q8_K", bad8k == 0, format!("{bad8k} of {} activation blocks differ", x.len() / 256));
    let (ours, theirs) = (mxfp4::quantize_row_mxfp4(&x), d.bytes("quant.mxfp4"));
    let bad = ours.chunks(mxfp4::BLOCK_MXFP4_BYTES).zip(theirs.chunks(mxfp4::BLOCK_MXFP4_BYTES)).filter(|(a, b)| a != b).count();
    v.check("quantize mxfp4", bad == 0 && ours.len() == theirs.len(), format!("{bad} of {} weight blocks differ", x.len() / 32));
}

const MM_TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

fn matmuls(d: &Dump, v: &mut Verdict) {
    for ty in MM_TYPES {
        let odd = (ty.block_size() == 32).then_some((40, 800));
        for (rows, cols) in [(96, 2048), (90, 768)].into_iter().chain(odd) {
            for n in [1, 2, 3, 7, 40] {
                let tag = format!("mm.{}.{rows}x{cols}.{n}", ty.name());
                let w = WeightMatrix::new(ty, rows, cols, d.bytes(&format!("{tag}.w"))).expect("a rows x cols matrix");
                let x = d.f32s(&format!("{tag}.x"));
                let mut ours = vec![0.0; n * rows];
                matmul(&w, &x, n, &mut ours);
                v.compare(&format!("matmul {} {rows}x{cols} n={n}", ty.name()), &ours, &d.f32s(&format!("{tag}.y")));
            }
        }
    }
}

/// mul_mat_id as brink's MoE block runs it: the activations quantized once, each expert's
/// tokens gathered ([`matmul_gather`]), the outputs put back in (token, slot) order.
fn mul_mat_ids(d: &Dump, v: &mut Verdict) {
    let (experts, rows, cols, top_k) = (8, 64, 512, 3);
    for ty in MM_TYPES {
        for n in [1, 6] {
            let tag = format!("mmid.{}.{n}", ty.name());
            let ws = WeightMatrix::stacked(ty, experts, rows, cols, d.bytes(&format!("{tag}.w"))).expect("stacked experts");
            let x = d.f32s(&format!("{tag}.x"));
            let ids = d.u32s(&format!("{tag}.ids"));
            let acts = QuantizedActs::new(ws[0].kind().vec_dot_type(), &x, cols, n);
            let mut ours = vec![0.0; n * top_k * rows];
            for (e, w) in ws.iter().enumerate() {
                let picks: Vec<usize> = (0..n * top_k).filter(|&i| ids[i] as usize == e).collect();
                let rows_of: Vec<usize> = picks.iter().map(|&i| i / top_k).collect();
                let mut y = vec![0.0; picks.len() * rows];
                matmul_gather(w, &acts, &rows_of, &mut y);
                for (p, &i) in picks.iter().enumerate() {
                    ours[i * rows..(i + 1) * rows].copy_from_slice(&y[p * rows..(p + 1) * rows]);
                }
            }
            v.compare(&format!("mul_mat_id {} n={n}", ty.name()), &ours, &d.f32s(&format!("{tag}.y")));
        }
    }
}

fn elementwise(d: &Dump, v: &mut Verdict) {
    let (x, w) = (d.f32s("rms.x"), d.f32s("rms.w"));
    let mut ours = vec![0.0; x.len()];
    rms_norm(&x, 2048, &w, 1e-6, &mut ours);
    v.compare("rms_norm · w", &ours, &d.f32s("rms.y"));

    let x = d.f32s("sm.x");
    let mut ours = vec![0.0; x.len()];
    soft_max_rows(&x, 257, 0.088388, &mut ours);
    v.compare("soft_max_ext (scale)", &ours, &d.f32s("sm.y"));
    soft_max_rows(&x, 257, 1.0, &mut ours);
    v.compare("soft_max (router)", &ours, &d.f32s("sm.router"));

    let (g, u) = (d.f32s("sw.g"), d.f32s("sw.u"));
    let mut ours = vec![0.0; g.len()];
    swiglu(&g, &u, &mut ours);
    v.compare("swiglu", &ours, &d.f32s("sw.y"));

    let mut x = d.f32s("rope.x");
    rope_neox(&mut x, 4, 128, &d.u32s("rope.pos"), 1_000_000.0);
    v.compare("rope neox", &x, &d.f32s("rope.y"));

    let (x, y) = (d.f32s("as.x"), d.u32s("as.y"));
    let rows = x.len() / 128;
    let same = x.chunks_exact(128).zip(y.chunks_exact(128)).filter(|(x, y)| argsort_desc(x) == *y).count();
    v.check("argsort desc (ties)", same == rows, format!("{same}/{rows} rows of 128 identical"));

    let ids = d.u32s("gr.ids");
    for ty in
        [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16, GgmlType::BF16, GgmlType::MXFP4]
    {
        let t = WeightMatrix::new(ty, 10, 512, d.bytes(&format!("gr.{}.w", ty.name()))).expect("a 10 x 512 table");
        let mut ours = vec![0.0; ids.len() * 512];
        get_rows(&t, &ids, &mut ours).expect("ids within the table");
        v.compare(&format!("get_rows {}", ty.name()), &ours, &d.f32s(&format!("gr.{}.y", ty.name())));
    }
}

fn attentions(d: &Dump, v: &mut Verdict) {
    for tag in ["prefill", "decode"] {
        let q = d.f32s(&format!("att.{tag}.q"));
        let (k, vv) = (d.f16s(&format!("att.{tag}.k")), d.f16s(&format!("att.{tag}.v")));
        let mut ours = vec![0.0; q.len()];
        attention(&q, &k, &vv, &d.u32s(&format!("att.{tag}.pos")), 8, 2, 128, 1.0 / 128f32.sqrt(), &mut ours);
        v.compare(&format!("attention {tag}"), &ours, &d.f32s(&format!("att.{tag}.out")));
    }
}

/// gpt-oss attention (head_dim 64, window 128 where the tag says swa, sinks where dumped).
fn gpt_oss_attentions(d: &Dump, v: &mut Verdict) {
    for (tag, window) in [
        ("swa-prefill", Some(128)),
        ("swa-decode", Some(128)),
        ("swa-decode-far", Some(128)),
        ("swa-nosink", Some(128)),
        ("sink-full", None),
    ] {
        let q = d.f32s(&format!("att.{tag}.q"));
        let (k, vv) = (d.f16s(&format!("att.{tag}.k")), d.f16s(&format!("att.{tag}.v")));
        let sinks = (tag != "swa-nosink").then(|| d.f32s(&format!("att.{tag}.sinks")));
        let pos = d.u32s(&format!("att.{tag}.pos"));
        let mut ours = vec![0.0; q.len()];
        let ext = AttnExt { window, sinks: sinks.as_deref() };
        attention_ext(&q, &k, &vv, &pos, 8, 2, 64, 1.0 / 64f32.sqrt(), pos.len(), ext, &mut ours);
        v.compare(&format!("attention {tag}"), &ours, &d.f32s(&format!("att.{tag}.out")));
    }
    // A wrapped sliding-window cache: cells hold positions out of order, some none (-1).
    for tag in ["swa-ring", "swa-ring-decode"] {
        let q = d.f32s(&format!("att.{tag}.q"));
        let (k, vv) = (d.f16s(&format!("att.{tag}.k")), d.f16s(&format!("att.{tag}.v")));
        let sinks = d.f32s(&format!("att.{tag}.sinks"));
        let cells: Vec<Option<u32>> = d.u32s(&format!("att.{tag}.cells")).into_iter().map(|p| (p != u32::MAX).then_some(p)).collect();
        let pos = d.u32s(&format!("att.{tag}.pos"));
        let mut ours = vec![0.0; q.len()];
        let ext = AttnExt { window: Some(128), sinks: Some(&sinks) };
        attention_cells(&q, &k, &vv, &cells, &pos, 8, 2, 64, 1.0 / 64f32.sqrt(), pos.len(), ext, &mut ours);
        v.compare(&format!("attention {tag}"), &ours, &d.f32s(&format!("att.{tag}.out")));
    }
}

fn gpt_oss_ops(d: &Dump, v: &mut Verdict) {
    let (x, sinks) = (d.f32s("sink.x"), d.f32s("sink.sinks"));
    let (width, rows_per_head) = (257, 3);
    let mut ours = vec![0.0; x.len()];
    for (r, (x, o)) in x.chunks_exact(width).zip(ours.chunks_exact_mut(width)).enumerate() {
        soft_max_sink(x, 0.125, sinks[r / rows_per_head], o);
    }
    v.compare("soft_max_ext + sinks", &ours, &d.f32s("sink.y"));

    let pos = d.u32s("yarn.pos");
    let gpt_oss = Yarn { freq_scale: 1.0 / 32.0, ext_factor: 1.0, attn_factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 4096 };
    let other = Yarn { freq_scale: 0.25, ext_factor: 1.0, attn_factor: 0.8, beta_fast: 24.0, beta_slow: 2.0, n_ctx_orig: 8192 };
    for (name, yarn, base, y) in [("rope yarn (gpt-oss)", gpt_oss, 150_000.0, "yarn.y1"), ("rope yarn (other)", other, 10_000.0, "yarn.y2")]
    {
        let mut x = d.f32s("yarn.x");
        rope_neox_yarn(&mut x, 4, 64, &pos, base, &yarn);
        v.compare(name, &x, &d.f32s(y));
    }

    let (g, u) = (d.f32s("oai.g"), d.f32s("oai.u"));
    let mut ours = vec![0.0; g.len()];
    swiglu_oai(&g, &u, OAI_ALPHA, OAI_LIMIT, &mut ours);
    v.compare("swiglu_oai", &ours, &d.f32s("oai.y"));

    let (n_expert, top_k) = (32, 4);
    let mut logits = d.f32s("route.logits");
    add_bias(&mut logits, &d.f32s("route.bias"));
    let r = route_softmax_weight(&logits, n_expert, top_k);
    let theirs = d.u32s("route.experts");
    let same = r.experts.iter().zip(&theirs).filter(|(a, b)| a == b).count();
    v.check("route softmax_weight ids", same == theirs.len(), format!("{same}/{} experts identical", theirs.len()));
    v.compare("route softmax_weight", &r.weights, &d.f32s("route.weights"));

    let mut a = d.f32s("addid.a");
    add_id(&mut a, &d.f32s("addid.b"), &theirs, 40);
    v.compare("add_id", &a, &d.f32s("addid.y"));
}

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: ggml_crosscheck DUMP (written by scripts/ggml_crosscheck.c; see scripts/ggml-crosscheck)");
        return ExitCode::from(2);
    };
    let dump = match Dump::read(&path) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut v = Verdict::default();
    quantization(&dump, &mut v);
    matmuls(&dump, &mut v);
    mul_mat_ids(&dump, &mut v);
    elementwise(&dump, &mut v);
    attentions(&dump, &mut v);
    gpt_oss_attentions(&dump, &mut v);
    gpt_oss_ops(&dump, &mut v);
    if v.failures.is_empty() {
        println!("all {} checks passed", v.checks);
        ExitCode::SUCCESS
    } else {
        eprintln!("{} check(s) failed: {}", v.failures.len(), v.failures.join(", "));
        ExitCode::FAILURE
    }
}
