//! Weight matrix × activation rows: `y[t·rows + r] = dot(W[r], x[t])`, as ggml's `mul_mat` with
//! the weights as src0: each activation row converted once to the weight's vec_dot format, then
//! one dot per (row, token), spread over rayon's threads. Like ggml, a dense matmul of two or
//! more rows sums float dots in llamafile's sgemm order ([`vec_dot_sgemm`]), one row and the
//! gathered rows of an expert in `ggml_vec_dot_*`'s ([`vec_dot`]).
//!
//! Work split: many tokens (prefill) → tiles of tokens per task, each weight row reused across
//! the tile while it is in L1; few tokens (decode) → chunks of weight rows per task.

use rayon::prelude::*;

use super::act_quant::{ActRow, QuantizedActs};
use super::error::CpuError;
use super::vec_dot::{WeightKind, vec_dot, vec_dot_sgemm};
use crate::gguf::GgmlType;

/// A 2-D weight tensor in its GGUF bytes: `rows` rows of `cols` values (ggml's ne1 × ne0).
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    pub ggml_type: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    kind: WeightKind,
}

impl<'a> WeightMatrix<'a> {
    /// Checks the type (one the CPU multiplies), the row length (whole blocks) and the data
    /// length (exactly `rows` rows).
    pub fn new(ggml_type: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, CpuError> {
        let kind = WeightKind::of(ggml_type)?;
        if rows == 0 || cols == 0 {
            return Err(CpuError::Empty { ty: ggml_type, rows, cols });
        }
        let block = kind.block_size();
        if !cols.is_multiple_of(block) {
            return Err(CpuError::PartialBlock { ty: ggml_type, rows, cols, block });
        }
        let expected = (rows as u64).saturating_mul((cols / block * kind.block_bytes()) as u64);
        if expected != data.len() as u64 {
            return Err(CpuError::DataLength { ty: ggml_type, rows, cols, expected, got: data.len() });
        }
        Ok(WeightMatrix { ggml_type, rows, cols, data, kind })
    }

    /// The `n` matrices of `rows` × `cols` stacked in a 3-D tensor (experts: ggml's ne2), each a
    /// view of its slice of `data`.
    pub fn stacked(ggml_type: GgmlType, n: usize, rows: usize, cols: usize, data: &'a [u8]) -> Result<Vec<Self>, CpuError> {
        let kind = WeightKind::of(ggml_type)?;
        if n == 0 || rows == 0 || cols == 0 {
            return Err(CpuError::Empty { ty: ggml_type, rows: n * rows, cols });
        }
        let block = kind.block_size();
        if !cols.is_multiple_of(block) {
            return Err(CpuError::PartialBlock { ty: ggml_type, rows, cols, block });
        }
        let per = (rows as u64).checked_mul((cols / block * kind.block_bytes()) as u64);
        let expected = per.and_then(|p| p.checked_mul(n as u64)).unwrap_or(u64::MAX);
        if expected != data.len() as u64 {
            return Err(CpuError::StackLength { ty: ggml_type, n, rows, cols, expected, got: data.len() });
        }
        data.chunks_exact(data.len() / n).map(|d| WeightMatrix::new(ggml_type, rows, cols, d)).collect()
    }

    pub fn kind(&self) -> WeightKind {
        self.kind
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.kind.block_size() * self.kind.block_bytes()
    }

    /// Row `i`'s bytes (panics past the end, like slice indexing).
    pub fn row(&self, i: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[i * rb..(i + 1) * rb]
    }
}

/// `y[t·rows + r] = dot(W[r], x[t])` for `x` of `n_tokens` rows of `w.cols` values.
///
/// # Panics
/// If `x.len() != n_tokens · w.cols` or `y.len() != n_tokens · w.rows`: the graph derives both
/// from the model's checked shapes.
pub fn matmul(w: &WeightMatrix, x: &[f32], n_tokens: usize, y: &mut [f32]) {
    let acts = QuantizedActs::new(w.kind.vec_dot_type(), x, w.cols, n_tokens);
    matmul_quantized(w, &acts, y);
}

/// [`matmul`] with activations converted beforehand (shared by matrices of one vec_dot format).
///
/// # Panics
/// If the activations' format or row length is not the matrix's, or `y.len() != acts.rows() · w.rows`.
pub fn matmul_quantized(w: &WeightMatrix, acts: &QuantizedActs, y: &mut [f32]) {
    check_acts(w, acts);
    assert_eq!(y.len(), acts.rows() * w.rows, "matmul output: {} values for {} x {}", y.len(), acts.rows(), w.rows);
    // ggml's mul_mat hands two or more rows to llamafile's sgemm when it takes the shape.
    let sgemm = acts.rows() >= 2 && w.rows.is_multiple_of(4) && w.cols.is_multiple_of(8);
    run(w, acts, |t| t, if sgemm { vec_dot_sgemm } else { vec_dot }, y);
}

/// `y[i·rows + r] = dot(W[r], acts[rows_of[i]])`: the activation rows a matrix meets picked by
/// index, as ggml's `mul_mat_id` gathers the tokens routed to one expert.
///
/// # Panics
/// As [`matmul_quantized`], and if an index is past the activations.
pub fn matmul_gather(w: &WeightMatrix, acts: &QuantizedActs, rows_of: &[usize], y: &mut [f32]) {
    check_acts(w, acts);
    assert_eq!(y.len(), rows_of.len() * w.rows, "matmul output: {} values for {} x {}", y.len(), rows_of.len(), w.rows);
    if let Some(&bad) = rows_of.iter().find(|&&i| i >= acts.rows()) {
        panic!("matmul_gather: activation row {bad} of {}", acts.rows());
    }
    // ggml's mul_mat_id dots row by row (`vec_dot`), however many rows an expert gets.
    run(w, acts, |i| rows_of[i], vec_dot, y);
}

fn check_acts(w: &WeightMatrix, acts: &QuantizedActs) {
    assert_eq!(acts.kind(), w.kind.vec_dot_type(), "{} weights against {:?} activations", w.ggml_type, acts.kind());
    assert_eq!(acts.cols(), w.cols, "{} x {} {} weights against activation rows of {}", w.rows, w.cols, w.ggml_type, acts.cols());
}

/// Below this many multiply-adds a matmul runs on the calling thread.
const SERIAL_MAX_MACS: usize = 1 << 17;

/// Tokens per task when the work is split by tokens.
const TOKEN_TILE: usize = 8;

type DotFn = fn(WeightKind, &[u8], ActRow<'_>) -> f32;

fn run(w: &WeightMatrix, acts: &QuantizedActs, act_row: impl Fn(usize) -> usize + Sync, dot: DotFn, y: &mut [f32]) {
    let rows = w.rows;
    let n = y.len() / rows;
    if n == 0 {
        return;
    }
    if n * rows * w.cols < SERIAL_MAX_MACS {
        // Too little work to pay for rayon's hand-offs (a small model's decode).
        for (t, yt) in y.chunks_exact_mut(rows).enumerate() {
            let x = acts.row(act_row(t));
            for (r, out) in yt.iter_mut().enumerate() {
                *out = dot(w.kind, w.row(r), x);
            }
        }
        return;
    }
    let threads = rayon::current_num_threads();
    if n >= TOKEN_TILE * threads * 2 {
        // Prefill: a tile of tokens per task; each weight row meets the whole tile.
        y.par_chunks_mut(TOKEN_TILE * rows).enumerate().for_each(|(tile, yt)| {
            let t0 = tile * TOKEN_TILE;
            let nt = yt.len() / rows;
            for r in 0..rows {
                let wr = w.row(r);
                for i in 0..nt {
                    yt[i * rows + r] = dot(w.kind, wr, acts.row(act_row(t0 + i)));
                }
            }
        });
    } else {
        // Decode: chunks of weight rows per task, for each token.
        let chunk = (rows / (threads * 8)).clamp(4, 64);
        y.par_chunks_mut(rows).enumerate().for_each(|(i, yt)| {
            let x = acts.row(act_row(i));
            yt.par_chunks_mut(chunk).enumerate().for_each(|(c, yc)| {
                for (j, out) in yc.iter_mut().enumerate() {
                    *out = dot(w.kind, w.row(c * chunk + j), x);
                }
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml_cpu::act_quant::{ActRow, VecDotType};
    use brink_kernels::quant::TensorType;
    use brink_kernels::testdata::{hash2, uniform_pm1};
    use half::f16;

    fn random_matrix(ty: GgmlType, seed: u64, rows: usize, cols: usize) -> Vec<u8> {
        let kind = WeightKind::of(ty).unwrap();
        let bytes = rows * cols / kind.block_size() * kind.block_bytes();
        let mut data: Vec<u8> = (0..bytes as u64).map(|i| hash2(seed, i) as u8).collect();
        // Keep every f16/f32 field finite and of model size: rewrite the scale fields, or the values.
        match kind {
            WeightKind::F32 => {
                data = (0..(rows * cols) as u64).flat_map(|i| (uniform_pm1(seed, i) * 0.1).to_le_bytes()).collect();
            }
            WeightKind::F16 => {
                data = (0..(rows * cols) as u64).flat_map(|i| f16::from_f32(uniform_pm1(seed, i) * 0.1).to_le_bytes()).collect();
            }
            WeightKind::BF16 => {
                data =
                    (0..(rows * cols) as u64).flat_map(|i| (((uniform_pm1(seed, i) * 0.1).to_bits() >> 16) as u16).to_le_bytes()).collect();
            }
            WeightKind::MXFP4 => {
                for block in data.chunks_exact_mut(kind.block_bytes()) {
                    block[0] = 118 + block[0] % 4; // scales 2^-10 .. 2^-7
                }
            }
            _ => {
                let fields: &[usize] = match kind {
                    WeightKind::Q6_K => &[208],
                    WeightKind::Q4_K | WeightKind::Q5_K => &[0, 2],
                    _ => &[0],
                };
                for (b, block) in data.chunks_exact_mut(kind.block_bytes()).enumerate() {
                    for &at in fields {
                        let v = (1.0 + (hash2(seed, b as u64 * 3 + at as u64) % 64) as f32 / 64.0) * 2f32.powi(-8);
                        block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                    }
                }
            }
        }
        data
    }

    /// matmul against per-element vec_dot and against dequantize-then-f64, over shapes with tails:
    /// one row, one token, one block, many tokens (the prefill path), rows not a multiple of chunks.
    #[test]
    fn matmul_matches_vec_dot_and_f64_reference() {
        let shapes = [(1, 256, 1), (3, 512, 1), (37, 256, 5), (130, 768, 2), (5, 256, 70), (64, 2048, 33), (8, 512, 3)];
        for ty in WeightKind::ALL.map(WeightKind::ggml_type) {
            for (s, &(rows, cols, n)) in shapes.iter().enumerate() {
                let data = random_matrix(ty, s as u64, rows, cols);
                let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
                let x: Vec<f32> = (0..(n * cols) as u64).map(|i| uniform_pm1(50 + s as u64, i)).collect();
                let mut y = vec![f32::NAN; n * rows];
                matmul(&w, &x, n, &mut y);
                let acts = QuantizedActs::new(w.kind().vec_dot_type(), &x, cols, n);
                let tt = TensorType::from_ggml_id(ty.id()).unwrap();
                for t in 0..n {
                    let xv: Vec<f64> = match acts.row(t) {
                        ActRow::Float(v) => v.iter().map(|&v| v as f64).collect(),
                        ActRow::Q8_0(b) => b.iter().flat_map(|b| b.qs.map(|q| b.d as f64 * q as f64)).collect(),
                        ActRow::Q8K(b) => b.iter().flat_map(|b| b.qs.map(|q| b.d as f64 * q as f64)).collect(),
                    };
                    for r in 0..rows {
                        let got = y[t * rows + r];
                        let sgemm = n >= 2 && rows % 4 == 0 && cols % 8 == 0;
                        let want =
                            if sgemm { vec_dot_sgemm(w.kind(), w.row(r), acts.row(t)) } else { vec_dot(w.kind(), w.row(r), acts.row(t)) };
                        assert_eq!(got.to_bits(), want.to_bits(), "{ty} {rows}x{cols} t{t} r{r}");
                        let wd = tt.dequantize_row(w.row(r)).unwrap();
                        let (exact, mag) =
                            wd.iter().zip(&xv).fold((0.0, 0.0), |(s, m), (&w, &x)| (s + w as f64 * x, m + (w as f64 * x).abs()));
                        // Scales and mins may cancel (q4_K/q5_K): a loose bound on Σ|terms|, see vec_dot's test for the tight one.
                        assert!((got as f64 - exact).abs() <= 1e-5 * (mag + 1.0), "{ty} {rows}x{cols} t{t} r{r}: {got} vs {exact}");
                    }
                }
            }
        }
    }

    #[test]
    fn gather_picks_activation_rows() {
        let (rows, cols) = (9, 512);
        let data = random_matrix(GgmlType::Q4_K, 3, rows, cols);
        let w = WeightMatrix::new(GgmlType::Q4_K, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..(4 * cols) as u64).map(|i| uniform_pm1(4, i)).collect();
        let acts = QuantizedActs::new(VecDotType::Q8K, &x, cols, 4);
        let mut all = vec![0.0; 4 * rows];
        matmul_quantized(&w, &acts, &mut all);
        let pick = [3, 0, 3];
        let mut y = vec![0.0; pick.len() * rows];
        matmul_gather(&w, &acts, &pick, &mut y);
        for (i, &t) in pick.iter().enumerate() {
            assert_eq!(y[i * rows..(i + 1) * rows], all[t * rows..(t + 1) * rows]);
        }
    }

    #[test]
    fn constructor_checks_type_and_lengths() {
        let data = vec![0u8; 2 * 18 * 2];
        assert!(WeightMatrix::new(GgmlType::Q4_0, 2, 64, &data).is_ok());
        assert_eq!(
            WeightMatrix::new(GgmlType::Q4_0, 2, 64, &data[1..]).unwrap_err(),
            CpuError::DataLength { ty: GgmlType::Q4_0, rows: 2, cols: 64, expected: 72, got: 71 }
        );
        assert_eq!(
            WeightMatrix::new(GgmlType::Q4_0, 2, 48, &data).unwrap_err(),
            CpuError::PartialBlock { ty: GgmlType::Q4_0, rows: 2, cols: 48, block: 32 }
        );
        assert_eq!(WeightMatrix::new(GgmlType::Q2_K, 1, 256, &[0; 84]).unwrap_err(), CpuError::UnsupportedType(GgmlType::Q2_K));
        assert!(matches!(WeightMatrix::new(GgmlType::F32, 0, 4, &[]), Err(CpuError::Empty { .. })));
        let e = WeightMatrix::new(GgmlType::Q4_0, 2, 64, &data[1..]).unwrap_err().to_string();
        assert!(e.contains("q4_0") && e.contains("72") && e.contains("71"), "{e}");
    }

    #[test]
    fn stacked_experts_are_consecutive_slices() {
        let (n, rows, cols) = (4, 3, 256);
        let data = random_matrix(GgmlType::Q6_K, 8, n * rows, cols);
        let experts = WeightMatrix::stacked(GgmlType::Q6_K, n, rows, cols, &data).unwrap();
        let whole = WeightMatrix::new(GgmlType::Q6_K, n * rows, cols, &data).unwrap();
        assert_eq!(experts.len(), n);
        for (e, m) in experts.iter().enumerate() {
            for r in 0..rows {
                assert_eq!(m.row(r), whole.row(e * rows + r));
            }
        }
        assert!(WeightMatrix::stacked(GgmlType::Q6_K, n, rows, cols, &data[..data.len() - 1]).is_err());
        assert!(WeightMatrix::stacked(GgmlType::Q6_K, 0, rows, cols, &data).is_err());
    }

    #[test]
    #[should_panic(expected = "matmul output")]
    fn wrong_output_length_panics() {
        let data = vec![0u8; 34];
        let w = WeightMatrix::new(GgmlType::Q8_0, 1, 32, &data).unwrap();
        matmul(&w, &[0.0; 32], 1, &mut [0.0; 2]);
    }
}
