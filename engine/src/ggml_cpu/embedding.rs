//! Token embedding lookup (`ggml_get_rows` on `token_embd`): each row dequantized to f32 by the
//! type's `to_float`, which brink-kernels' dequantizers reproduce bit for bit.

use brink_kernels::quant::TensorType;
use rayon::prelude::*;

use super::error::CpuError;
use super::matmul::WeightMatrix;

/// Rows `ids` of `table` into `out` (`ids.len() × table.cols` values).
///
/// Token ids come from the tokenizer, so an id past the table is an error, not a panic.
///
/// # Panics
/// If `out.len() != ids.len() · table.cols`.
pub fn get_rows(table: &WeightMatrix, ids: &[u32], out: &mut [f32]) -> Result<(), CpuError> {
    assert_eq!(out.len(), ids.len() * table.cols, "get_rows: {} values for {} rows of {}", out.len(), ids.len(), table.cols);
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows) {
        return Err(CpuError::TokenId { id, rows: table.rows });
    }
    let ty = TensorType::from_ggml_id(table.ggml_type.id()).map_err(|_| CpuError::UnsupportedType(table.ggml_type))?;
    out.par_chunks_exact_mut(table.cols)
        .zip(ids)
        .try_for_each(|(o, &id)| ty.dequantize_into(table.row(id as usize), o).map_err(|_| CpuError::UnsupportedType(table.ggml_type)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgmlType;
    use half::f16;

    #[test]
    fn looks_up_and_dequantizes_rows() {
        // q8_0, 3 rows of 32: row r has d = r + 1 and quants j − 16.
        let mut data = Vec::new();
        for r in 0..3 {
            data.extend(f16::from_f32((r + 1) as f32).to_le_bytes());
            data.extend((0..32).map(|j| (j as i8 - 16) as u8));
        }
        let table = WeightMatrix::new(GgmlType::Q8_0, 3, 32, &data).unwrap();
        let mut out = vec![0.0; 2 * 32];
        get_rows(&table, &[2, 0], &mut out).unwrap();
        assert_eq!(out[0], -48.0);
        assert_eq!(out[31], 45.0);
        assert_eq!(out[32], -16.0);
        assert_eq!(get_rows(&table, &[3], &mut out[..32]), Err(CpuError::TokenId { id: 3, rows: 3 }));
    }

    #[test]
    fn float_tables_are_exact() {
        let vals = [1.5f32, -2.25, 3.0, 0.0];
        let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let table = WeightMatrix::new(GgmlType::F32, 2, 2, &data).unwrap();
        let mut out = [0.0; 2];
        get_rows(&table, &[1], &mut out).unwrap();
        assert_eq!(out, [3.0, 0.0]);
    }
}
