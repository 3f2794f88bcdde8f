//! Reference cross-check: brink's CPU dequantization against gguf-py's numpy dequantizers
//! (`gguf.quants.dequantize`, PyPI `gguf`), element for element, on deterministic random
//! blocks of every tensor type the engine computes.
//!
//! Expected: bit-identical values for every type. The K-quants too: brink evaluates ggml's
//! `(d·sc)·q − dmin·m` in the same f32 steps as numpy does, with no FMA contraction. MXFP4
//! over every exponent byte (subnormal scales at 0 and 1, infinities from 253 up) and every
//! code. The one allowed difference is a NaN's quiet bit for f16, which ggml (and brink, via
//! `half`) sets and numpy may leave clear.
//!
//! Needs python3 with `gguf` (scripts/test installs it). Without it the test says so and passes,
//! unless `BRINK_REQUIRE_PY=1` (set by scripts/test), which makes a missing package a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use brink_kernels::quant::TensorType;
use brink_kernels::quant::kquants::{Q4_K_D, Q4_K_DMIN, Q5_K_D, Q5_K_DMIN, Q6_K_D};
use brink_kernels::testdata::hash2;

/// Random blocks per quantized type: a million K-quant values each.
const BLOCKS: u64 = 4096;
/// Values per row when the K-quants go through `dequantize_rows` (large enough to be split
/// between threads, as a model tensor is).
const ROW_LEN: usize = 4096;
const F32_QUIET_BIT: u32 = 0x0040_0000;

fn python_has_gguf() -> bool {
    Command::new("python3").args(["-c", "import gguf, numpy"]).output().map(|o| o.status.success()).unwrap_or(false)
}

/// Any finite f16 (subnormals included): the scale fields of a valid block.
fn finite_f16_bits(h: u64) -> [u8; 2] {
    let bits = (h & 0xffff) as u16;
    let bits = if bits & 0x7c00 == 0x7c00 { bits & !0x4000 } else { bits };
    bits.to_le_bytes()
}

/// `BLOCKS` blocks of random bytes whose f16 fields (at `f16s` in each block) are finite.
fn random_blocks(seed: u64, t: TensorType, f16s: &[usize]) -> Vec<u8> {
    let n = t.block_bytes();
    let mut bytes: Vec<u8> = (0..BLOCKS * n as u64).map(|i| hash2(seed, i) as u8).collect();
    for (b, block) in bytes.chunks_exact_mut(n).enumerate() {
        for (k, &at) in f16s.iter().enumerate() {
            block[at..at + 2].copy_from_slice(&finite_f16_bits(hash2(seed ^ 0xf16, (b * 2 + k) as u64)));
        }
    }
    bytes
}

/// The inputs: every f16 and bf16 bit pattern (NaNs, infinities, subnormals, signed zeros),
/// random f32 words, and random blocks of the quantized types.
fn cases() -> Vec<(TensorType, Vec<u8>)> {
    let all_u16: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let mut f32_words: Vec<u8> = (0..BLOCKS).flat_map(|i| (hash2(3, i) as u32).to_le_bytes()).collect();
    f32_words.extend([0x7f80_0001u32, 0xffc0_0000, 0x8000_0000, 0x0000_0001].iter().flat_map(|w| w.to_le_bytes()));
    vec![
        (TensorType::F32, f32_words),
        (TensorType::F16, all_u16.clone()),
        (TensorType::BF16, all_u16),
        (TensorType::Q4_0, random_blocks(4, TensorType::Q4_0, &[0])),
        (TensorType::Q8_0, random_blocks(8, TensorType::Q8_0, &[0])),
        (TensorType::Q4_K, random_blocks(12, TensorType::Q4_K, &[Q4_K_D, Q4_K_DMIN])),
        (TensorType::Q5_K, random_blocks(13, TensorType::Q5_K, &[Q5_K_D, Q5_K_DMIN])),
        (TensorType::Q6_K, random_blocks(14, TensorType::Q6_K, &[Q6_K_D])),
        (TensorType::MXFP4, mxfp4_blocks()),
    ]
}

/// `BLOCKS` random MXFP4 blocks whose exponent byte runs through all 256 values (16 times
/// each), then one block per (exponent, code) pair: code c in every nibble of the block.
fn mxfp4_blocks() -> Vec<u8> {
    let mut bytes = random_blocks(39, TensorType::MXFP4, &[]);
    for (b, block) in bytes.chunks_exact_mut(TensorType::MXFP4.block_bytes()).enumerate() {
        block[0] = b as u8;
    }
    for e in 0..=255u8 {
        for c in 0..16u8 {
            bytes.push(e);
            bytes.extend([c | c << 4; 16]);
        }
    }
    bytes
}

/// gguf-py's name of the type (`GGMLQuantizationType`).
fn gguf_py_name(t: TensorType) -> String {
    t.name().to_uppercase()
}

fn run_reference(dir: &Path, cases: &[(TensorType, Vec<u8>)]) -> Vec<Vec<f32>> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/gguf_dequantize.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script);
    let mut outputs = Vec::new();
    for (t, bytes) in cases {
        let (src, dst) = (dir.join(format!("{t}.in")), dir.join(format!("{t}.out")));
        std::fs::write(&src, bytes).unwrap();
        cmd.arg(gguf_py_name(*t)).arg(&src).arg(&dst);
        outputs.push(dst);
    }
    let run = cmd.output().unwrap();
    assert!(run.status.success(), "{} failed: {}", script.display(), String::from_utf8_lossy(&run.stderr));
    outputs
        .iter()
        .map(|p| std::fs::read(p).unwrap().chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect())
        .collect()
}

fn same(t: TensorType, ours: f32, theirs: f32) -> bool {
    ours.to_bits() == theirs.to_bits() || (t == TensorType::F16 && theirs.is_nan() && ours.to_bits() == theirs.to_bits() | F32_QUIET_BIT)
}

fn ours(t: TensorType, bytes: &[u8]) -> Vec<f32> {
    if t.block_size() > 1 && t.block_size() < ROW_LEN {
        return t.dequantize_row(bytes).unwrap();
    }
    let mut out = vec![f32::NAN; t.value_count(bytes.len()).unwrap()];
    let row_len = if t.is_quantized() { ROW_LEN } else { out.len() };
    t.dequantize_rows(bytes, row_len, &mut out).unwrap();
    out
}

#[test]
fn dequantization_is_bit_identical_with_gguf_py() {
    if !python_has_gguf() {
        assert!(
            std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"),
            "BRINK_REQUIRE_PY=1 but python3 cannot import gguf and numpy (pip install 'gguf>=0.18,<1')"
        );
        eprintln!("python3 with gguf not found: reference cross-check skipped (pip install 'gguf>=0.18,<1')");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cases = cases();
    let reference = run_reference(dir.path(), &cases);
    let mut failures = Vec::new();
    for ((t, bytes), theirs) in cases.iter().zip(&reference) {
        let ours = ours(*t, bytes);
        assert_eq!(ours.len(), theirs.len(), "{t}: {} values from brink, {} from gguf-py", ours.len(), theirs.len());
        let differ: Vec<usize> = (0..ours.len()).filter(|&i| !same(*t, ours[i], theirs[i])).collect();
        match differ.first() {
            None => eprintln!("{t}: {} values bit-identical with gguf-py", ours.len()),
            Some(&i) => failures.push(format!(
                "{t}: {} of {} values differ; first at {i} (block {}): brink {:e} ({:#010x}), gguf-py {:e} ({:#010x})",
                differ.len(),
                ours.len(),
                i / t.block_size(),
                ours[i],
                ours[i].to_bits(),
                theirs[i],
                theirs[i].to_bits()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
