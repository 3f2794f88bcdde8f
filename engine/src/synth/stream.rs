//! Streams the generated tensor data into a GGUF file: each tensor is cut into chunks of
//! [`CHUNK_VALUES`] values, each chunk seeded from (model seed, tensor name, chunk index) and
//! filled on rayon's threads a batch at a time, then written in order. The bytes therefore do
//! not depend on the number of threads, and memory stays at one batch whatever the model's size.

use std::io::Write;

use brink_kernels::quant::TensorType;
use rayon::prelude::*;

use crate::gguf::TensorDataWriter;

use super::error::SynthError;
use super::qwen3moe::{Init, NORM_SPREAD, PAD_ROW_SCALE, TensorPlan};
use super::rng::{Rng, hash_name};
use super::weights::{fill_around, fill_weights};

/// Values per chunk: the unit of seeding and of parallel work (a multiple of every block size).
pub const CHUNK_VALUES: u64 = 1 << 16;
/// Chunks generated before a write: at most 64 MiB (f32) held at once.
const BATCH_CHUNKS: u64 = 256;

/// Fills one chunk of a tensor (`out`: its bytes, a whole number of blocks).
pub fn fill_chunk(tensor: &TensorPlan, seed: u64, chunk: u64, out: &mut [u8]) {
    let mut rng = Rng::for_chunk(seed, hash_name(&tensor.name), chunk);
    match tensor.init {
        Init::Matrix { ty, std } => fill_weights(ty, std, &mut rng, out),
        Init::Head { ty, std, live_rows } => {
            // Rows are whole blocks, so the first padding row starts on a block boundary; it
            // splits at most one chunk.
            let start = chunk * CHUNK_VALUES;
            let row_len = tensor.dims.first().copied().unwrap_or(1);
            let live_values = live_rows.saturating_mul(row_len).saturating_sub(start);
            let live_bytes = (live_values / ty.block_size() as u64 * ty.block_bytes() as u64).min(out.len() as u64) as usize;
            let (live, pad) = out.split_at_mut(live_bytes);
            fill_weights(ty, std, &mut rng, live);
            fill_weights(ty, std * PAD_ROW_SCALE, &mut rng, pad);
        }
        Init::Router { std } | Init::Bias { std } => fill_weights(TensorType::F32, std, &mut rng, out),
        Init::Norm => fill_around(1.0, NORM_SPREAD, &mut rng, out),
    }
}

/// Bytes of one full chunk of a tensor of this type.
fn chunk_bytes(tensor: &TensorPlan) -> u64 {
    let ty = tensor.init.tensor_type();
    CHUNK_VALUES / ty.block_size() as u64 * ty.block_bytes() as u64
}

/// Generates and writes every tensor's data, in order; `progress` gets the bytes written so far.
pub fn write_tensors<W: Write>(
    data: &mut TensorDataWriter<W>,
    tensors: &[TensorPlan],
    seed: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(), SynthError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut written = 0u64;
    for tensor in tensors {
        let ty = tensor.init.tensor_type();
        // The plan has checked that rows are whole blocks, so the size is exact.
        let total = tensor.elements() / ty.block_size() as u64 * ty.block_bytes() as u64;
        let chunk = chunk_bytes(tensor);
        let mut first_chunk = 0u64;
        let mut offset = 0u64;
        while offset < total {
            let len = (total - offset).min(BATCH_CHUNKS * chunk);
            buf.resize(len as usize, 0);
            buf.par_chunks_mut(chunk as usize).enumerate().for_each(|(i, c)| fill_chunk(tensor, seed, first_chunk + i as u64, c));
            data.write(&buf)?;
            offset += len;
            first_chunk += len.div_ceil(chunk);
            written += len;
            progress(written);
        }
    }
    Ok(())
}

/// One tensor's whole data in memory (tests, small tensors): the same bytes the file gets.
pub fn tensor_bytes(tensor: &TensorPlan, seed: u64) -> Vec<u8> {
    let ty = tensor.init.tensor_type();
    let total = tensor.elements() / ty.block_size() as u64 * ty.block_bytes() as u64;
    let mut out = vec![0u8; total as usize];
    out.par_chunks_mut(chunk_bytes(tensor) as usize).enumerate().for_each(|(i, c)| fill_chunk(tensor, seed, i as u64, c));
    out
}
