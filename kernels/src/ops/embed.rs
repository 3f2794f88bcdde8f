//! Embedding lookup: `out[t, :] = dequantize(table[ids[t], :])`, table `[vocab, hidden]` in
//! q8_0, q4_0 or f32, out f32 `[tokens, hidden]`.
//!
//! One block per token on grid.x (`cuda/embed.cu`), 64-bit row offsets. An id outside
//! `[0, vocab)` is clamp-and-flag: its row is written as zeros and counted in a device counter
//! ([`BadIds`]) that the engine reads after the step and turns into an error for the request;
//! the kernel never reads outside the table and never faults. Dequantization is `d · q` in f32
//! on both sides, exact, so the twin matches bit for bit.

use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError, error_name};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform, fill_weights};
use crate::quant::{GgmlType, QK, WeightType};
use crate::sources::EMBED;
use crate::testdata::{hash2, uniform_row, weight_row};
use crate::thresholds::{Critical, grid_limit_point, overflow_point};

pub const KERNEL: &str = "embed";
/// `d · q` is exact in f32 (an f16 times an integer of at most 8 bits) and an f32 table is
/// copied: the device and the twin agree bit for bit.
pub const TOLERANCE: f64 = 0.0;
const THREADS: u32 = 256;
/// Rows compared with the twin: all up to this, else `sample_rows` (first and last rows included).
const SAMPLE_ROWS: usize = 512;

/// Formats the embedding table may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TableType {
    Q8_0,
    Q4_0,
    F32,
}

impl TableType {
    pub const ALL: [TableType; 3] = [TableType::Q8_0, TableType::Q4_0, TableType::F32];

    /// The block format, for the quantized tables.
    pub fn quant(self) -> Option<WeightType> {
        match self {
            TableType::Q8_0 => Some(WeightType::Q8_0),
            TableType::Q4_0 => Some(WeightType::Q4_0),
            TableType::F32 => None,
        }
    }

    /// `WTYPE_Q8_0`, `WTYPE_Q4_0` or `TTYPE_F32` in embed.cu: the ggml type id.
    fn code(self) -> i32 {
        self.quant().map_or(GgmlType::F32.id() as i32, WeightType::code)
    }

    pub fn name(self) -> &'static str {
        self.quant().map_or("f32", WeightType::name)
    }

    /// Bytes of one row of `hidden` elements (`hidden` a multiple of 32 when quantized).
    pub fn row_bytes(self, hidden: u32) -> u64 {
        self.quant().map_or(4 * hidden as u64, |w| w.row_bytes(hidden as usize) as u64)
    }
}

impl std::fmt::Display for TableType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbedCase {
    /// Rows of the table (151,936 for qwen3).
    pub vocab: u32,
    /// Row width: the model's hidden size.
    pub hidden: u32,
    pub table: TableType,
}

impl EmbedCase {
    fn shape(&self, tokens: u64) -> String {
        format!("tokens={tokens} vocab={} hidden={} table={}", self.vocab, self.hidden, self.table)
    }

    /// Why the kernel cannot take this problem, if it cannot.
    fn unsupported(&self, tokens: u64) -> Option<String> {
        let max = i32::MAX as u32;
        if tokens == 0 {
            Some("0 tokens".into())
        } else if self.vocab == 0 || self.vocab > max {
            Some(format!("vocab {} must be in 1..2^31 (ids are i32)", self.vocab))
        } else if self.hidden == 0 || self.hidden > max {
            Some(format!("hidden {} must be in 1..2^31", self.hidden))
        } else if self.table.quant().is_some() && !self.hidden.is_multiple_of(QK as u32) {
            Some(format!("hidden {} is not a multiple of {QK}, as a {} row must be", self.hidden, self.table))
        } else {
            None
        }
    }

    /// Bytes of the whole table.
    pub fn table_bytes(&self) -> u64 {
        self.vocab as u64 * self.table.row_bytes(self.hidden)
    }
}

/// Every launch one lookup of `tokens` ids makes (one).
pub fn plans(tokens: u64, c: &EmbedCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c, limits)?])
}

/// grid = (tokens, 1, 1): one block of 256 threads per token.
pub fn plan(tokens: u64, c: &EmbedCase, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    if let Some(what) = c.unsupported(tokens) {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: c.shape(tokens) });
    }
    Launch::checked(
        KERNEL,
        c.shape(tokens),
        [tokens, 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: tokens, per_block: 1 }],
        limits,
    )
}

/// The table row of `id`, when the id is in `[0, vocab)`.
fn row_of(id: i32, vocab: u32) -> Option<usize> {
    usize::try_from(id).ok().filter(|&r| r < vocab as usize)
}

/// CPU twin of one row: `row` holds the table row's bytes (little-endian f32 for `F32`).
pub fn embed_row_cpu(row: &[u8], table: TableType, out: &mut [f32]) {
    match table.quant() {
        Some(w) => out.copy_from_slice(&w.dequantize_row(row)),
        None => out.iter_mut().zip(row.chunks_exact(4)).for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    }
}

/// CPU twin: `table` holds the `vocab` rows; returns `out [ids.len(), hidden]` and the number of
/// ids outside `[0, vocab)`, whose rows are zeros (as on the device).
pub fn embed_cpu(ids: &[i32], table: &[u8], c: &EmbedCase) -> (Vec<f32>, u64) {
    let (h, rb) = (c.hidden as usize, c.table.row_bytes(c.hidden) as usize);
    let mut out = vec![0.0f32; ids.len() * h];
    out.par_chunks_mut(h.max(1)).zip(ids).for_each(|(o, &id)| {
        if let Some(r) = row_of(id, c.vocab) {
            embed_row_cpu(&table[r * rb..(r + 1) * rb], c.table, o);
        }
    });
    let bad = ids.iter().filter(|&&id| row_of(id, c.vocab).is_none()).count() as u64;
    (out, bad)
}

/// Device counter of the ids outside `[0, vocab)` that [`launch`] met (their rows are zeros).
/// It accumulates over launches; the engine reads it when it synchronises anyway (end of step)
/// and fails the requests of that step if it is not zero.
pub struct BadIds(CudaSlice<u64>);

impl BadIds {
    pub fn new(gpu: &Gpu) -> Result<BadIds, GpuError> {
        Ok(BadIds(gpu.upload(&[0u64])?))
    }

    /// The count so far (a synchronising copy).
    pub fn read(&self, gpu: &Gpu) -> Result<u64, GpuError> {
        Ok(gpu.download(&self.0)?[0])
    }

    pub fn reset(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        gpu.stream().memset_zeros(&mut self.0).map_err(|e| GpuError::Driver { call: "cuMemsetD8(bad ids)".into(), error: error_name(&e) })
    }
}

/// Looks up `tokens` ids: `ids` `[tokens]`, `table` the `[vocab, hidden]` rows (any element
/// type: the kernel reads bytes), `out` `[tokens, hidden]` f32 (any element type holding f32
/// bits). Buffers too small for the shape are refused before the launch.
pub fn launch<T: DeviceRepr, Y: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    c: &EmbedCase,
    ids: &CudaView<i32>,
    table: &CudaView<T>,
    out: &mut CudaViewMut<Y>,
    bad: &mut BadIds,
) -> Result<(), GpuError> {
    let p = plan(tokens, c, gpu.limits())?;
    require_bytes(
        &p,
        &[
            ("ids", bytes_of(ids.len(), 4), 4 * tokens),
            ("table", bytes_of(table.len(), size_of::<T>()), c.table_bytes()),
            ("out", bytes_of(out.len(), size_of::<Y>()), 4 * tokens * c.hidden as u64),
        ],
    )?;
    let f = gpu.function(&EMBED, KERNEL)?;
    let (ttype, vocab, hidden) = (c.table.code(), c.vocab as i32, c.hidden as i32);
    gpu.launch(&p, &f, |b| {
        b.arg(ids).arg(table).arg(&ttype).arg(out).arg(&vocab).arg(&hidden).arg(&mut bad.0);
    })?;
    Ok(())
}

/// Counts this plan makes critical: where `out[t·hidden + col]` passes 2^31 − 1, and where the
/// blocks on grid.x pass 65,535 (legal on x; a token index on y or z would fail there).
pub fn critical_counts(c: &EmbedCase, limits: &DeviceLimits) -> Vec<Critical> {
    let mut v = vec![Critical::new(1, "single token (one decode step)")];
    v.extend(overflow_point(c.hidden as u64, "embed: out[t·hidden + col] passes 2^31 − 1"));
    v.extend(grid_limit_point(1, limits.max_grid_dim[1] as u64, "embed: one block per token on grid.x"));
    v
}

/// The table, the ids, the counter and the guarded output of a self-test case.
pub fn device_bytes(tokens: u64, c: &EmbedCase) -> u64 {
    c.table_bytes() + 4 * tokens + 8 + 4 * (tokens * c.hidden as u64 + GUARD_WORDS as u64)
}

const SEED_TABLE: u64 = 0x40;
const SEED_IDS: u64 = 0x41;

/// Token `t`'s id in the self-test: mostly random rows, the table's first and last rows, and
/// ids outside `[0, vocab)` (i32 extremes, -1, vocab) that must come out as counted zero rows.
/// `vocab` is at most `i32::MAX` (the plan refuses more).
fn test_id(t: u64, vocab: u32) -> i32 {
    let odd = (t / 64) % 2 == 1;
    match t % 64 {
        3 => vocab as i32 - 1,
        4 => 0,
        13 if odd => -1,
        13 => i32::MIN,
        29 if odd => vocab as i32,
        29 => i32::MAX,
        _ => (hash2(SEED_IDS, t) % vocab as u64) as i32,
    }
}

/// The self-test's table on the device, filled from `SEED_TABLE`.
enum TestTable {
    Blocks(CudaSlice<u8>),
    Floats(CudaSlice<f32>),
}

impl TestTable {
    fn fill(gpu: &Gpu, c: &EmbedCase) -> Result<TestTable, GpuError> {
        let rows = c.vocab as usize;
        match c.table.quant() {
            Some(w) => {
                let mut t = gpu.alloc::<u8>(c.table_bytes() as usize)?;
                fill_weights(gpu, &mut t, rows * (c.hidden as usize / QK), SEED_TABLE, w)?;
                Ok(TestTable::Blocks(t))
            }
            None => {
                let n = rows * c.hidden as usize;
                let mut t = gpu.alloc::<f32>(n)?;
                fill_uniform(gpu, &mut t, n, SEED_TABLE, 1.0)?;
                Ok(TestTable::Floats(t))
            }
        }
    }

    /// Row `id` as the twin takes it: the bytes the fill kernels wrote.
    fn reference_row(c: &EmbedCase, id: usize) -> Vec<u8> {
        let h = c.hidden as usize;
        match c.table.quant() {
            Some(w) => weight_row(SEED_TABLE, id as u64, h, w),
            None => uniform_row(SEED_TABLE, (id * h) as u64, h, 1.0).iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// Self-test: table from a seed, ids with out-of-range ones mixed in, output poisoned; rows
/// compared bit for bit with the twin and the bad-id counter with the number planted.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &EmbedCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the table, the ids, the kernel, the poison check, the bad-id counter
/// and the sampled rows of the output (downloaded in runs); the twin of those rows, the count
/// of planted ids and the comparison are left to the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &EmbedCase) -> Result<Staged, GpuError> {
    plan(tokens, c, gpu.limits())?; // a bad shape is refused before anything is allocated
    let ids: Vec<i32> = (0..tokens).map(|t| test_id(t, c.vocab)).collect();
    let ids_dev = gpu.upload(&ids)?;
    let table = TestTable::fill(gpu, c)?;
    let h = c.hidden as usize;
    let mut out = Guarded::new(gpu, tokens as usize * h)?;
    let mut bad = BadIds::new(gpu)?;
    gpu.synchronize()?;
    let start = Instant::now();
    let mut out_view = out.buf.slice_mut(..out.words);
    match &table {
        TestTable::Blocks(t) => launch(gpu, tokens, c, &ids_dev.as_view(), &t.as_view(), &mut out_view, &mut bad)?,
        TestTable::Floats(t) => launch(gpu, tokens, c, &ids_dev.as_view(), &t.as_view(), &mut out_view, &mut bad)?,
    }
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let guard = out.check(gpu, 1)?;
    let counted = bad.read(gpu)?;
    let rows = sample_rows(tokens, 64, SAMPLE_ROWS, tokens);
    let got = out.read_rows_f32(gpu, &rows, h)?;
    let c = *c;
    Ok(Staged::Check(Box::new(move || {
        let planted = ids.iter().filter(|&&id| row_of(id, c.vocab).is_none()).count() as u64;
        let want: Vec<Vec<f32>> = rows
            .par_iter()
            .map(|&t| {
                let mut o = vec![0.0f32; h];
                if let Some(r) = row_of(ids[t as usize], c.vocab) {
                    embed_row_cpu(&TestTable::reference_row(&c, r), c.table, &mut o);
                }
                o
            })
            .collect();
        let mut err = RelErr::default();
        for ((&t, want), got) in rows.iter().zip(&want).zip(&got) {
            err.add_slice((t as usize * h) as u64, got, want);
        }
        let mut check = Check::of_floats(&err, TOLERANCE, guard, kernel_ms);
        check.int_mismatches = counted.abs_diff(planted);
        if counted != planted {
            check.note = format!("bad-id counter {counted}, {planted} out-of-range ids planted; {}", check.note);
        }
        Outcome::Ran(check)
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = EmbedCase;

    fn run(gpu: &Gpu, tokens: u64, c: &EmbedCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &EmbedCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &EmbedCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    const QWEN: EmbedCase = EmbedCase { vocab: 151_936, hidden: 2048, table: TableType::Q4_0 };

    /// Element `col` of a row straight from the GGUF block layout.
    fn scalar_element(row: &[u8], table: TableType, col: usize) -> f32 {
        let Some(w) = table.quant() else {
            return f32::from_le_bytes(row[4 * col..4 * col + 4].try_into().unwrap());
        };
        let b = &row[col / QK * w.block_bytes()..];
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let j = col % QK;
        match w {
            WeightType::Q8_0 => d * b[2 + j] as i8 as f32,
            WeightType::Q4_0 => {
                let q = if j < 16 { b[2 + j] & 15 } else { b[2 + j - 16] >> 4 };
                d * (q as f32 - 8.0)
            }
            _ => unreachable!("embedding tables are q8_0, q4_0 or f32"),
        }
    }

    #[test]
    fn twin_matches_block_layout_and_zeroes_bad_ids() {
        for table in TableType::ALL {
            let c = EmbedCase { vocab: 7, hidden: 96, table };
            let rows: Vec<Vec<u8>> = (0..7).map(|r| TestTable::reference_row(&c, r)).collect();
            let ids = [3, 0, 6, -1, 7, i32::MIN, i32::MAX, 6];
            let (out, bad) = embed_cpu(&ids, &rows.concat(), &c);
            assert_eq!(bad, 4, "{table}");
            for (t, &id) in ids.iter().enumerate() {
                for col in 0..96 {
                    let want = if (0..7).contains(&id) { scalar_element(&rows[id as usize], table, col) } else { 0.0 };
                    assert_eq!(out[t * 96 + col].to_bits(), want.to_bits(), "{table} token {t} col {col}");
                }
            }
        }
    }

    #[test]
    fn test_ids_plant_edges_and_out_of_range_ids() {
        let ids: Vec<i32> = (0..256).map(|t| test_id(t, QWEN.vocab)).collect();
        for id in [0, 151_935, -1, i32::MIN, 151_936, i32::MAX] {
            assert!(ids.contains(&id), "{id}");
        }
        assert_eq!(ids.iter().filter(|&&id| row_of(id, QWEN.vocab).is_none()).count(), 8);
        assert!((0..13).all(|t| row_of(test_id(t, 5), 5).is_some()));
    }

    #[test]
    fn plans_cover_every_token_once() {
        for limits in DeviceLimits::recorded() {
            for table in TableType::ALL {
                let c = EmbedCase { table, ..QWEN };
                for tokens in (1..=256).chain([8191, 8192, 14_135, 1 << 20]) {
                    let p = plans(tokens, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(p.len(), 1);
                    assert_eq!(p[0].grid, [tokens as u32, 1, 1]);
                    p[0].check_cover().unwrap();
                    assert!(p[0].simulate_cover(0).iter().all(|&h| h == 1), "{}", p[0]);
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::gb10();
        let bad = [
            (0, QWEN),
            (1, EmbedCase { vocab: 0, ..QWEN }),
            (1, EmbedCase { vocab: 1 << 31, ..QWEN }),
            (1, EmbedCase { hidden: 0, ..QWEN }),
            (1, EmbedCase { hidden: 100, ..QWEN }),
            (1, EmbedCase { hidden: 100, table: TableType::Q8_0, ..QWEN }),
        ];
        for (tokens, c) in bad {
            assert!(matches!(plans(tokens, &c, &l), Err(PlanError::Unsupported { .. })), "{c:?}");
        }
        assert!(plans(1, &EmbedCase { hidden: 100, table: TableType::F32, ..QWEN }, &l).is_ok());
    }

    #[test]
    fn critical_counts_for_qwen3() {
        let counts: Vec<u64> = critical_counts(&QWEN, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // (2^31 − 1) / 2048 = 1,048,575.99: out passes 2^31 at 1,048,576 tokens.
        for t in [1, 1_048_575, 1_048_576, 65_535, 65_536] {
            assert!(counts.contains(&t), "{t} missing from {counts:?}");
        }
    }

    #[test]
    fn buffers_too_small_are_refused() {
        let p = plan(3, &QWEN, &DeviceLimits::h200()).unwrap();
        assert!(require_bytes(&p, &[("a", 12, 12), ("b", 100, 99)]).is_ok());
        let e = require_bytes(&p, &[("a", 12, 12), ("out", 11, 12)]).unwrap_err();
        assert!(e.to_string().contains("buffer out holds 11 B"), "{e}");
    }
}
