//! ggml tensor types: the table is the kernels' ([`brink_kernels::quant::types`]: ids, names,
//! block sizes and bytes, and what brink computes with each), so the reader, the backends and
//! the kernels agree on every type. The reader needs every type's size to validate a file's
//! layout even when the engine cannot compute with that type; which types the engine computes
//! with is decided by the backends.

pub use brink_kernels::quant::GgmlType;

use super::error::ShapeProblem;

/// Bytes of a tensor with these dimensions (ggml order: `dims[0]` is the row length).
///
/// Enforces what ggml needs to address the tensor: 1 to 4 dimensions, none zero, at most
/// `i64::MAX` elements, and rows made of whole blocks.
pub fn tensor_bytes(ty: GgmlType, dims: &[u64]) -> Result<u64, ShapeProblem> {
    if dims.is_empty() || dims.len() > 4 {
        return Err(ShapeProblem::DimCount(dims.len() as u32));
    }
    let mut elements: u64 = 1;
    for (index, &d) in dims.iter().enumerate() {
        if d == 0 {
            return Err(ShapeProblem::ZeroDim { index });
        }
        elements = elements.checked_mul(d).filter(|&e| e <= i64::MAX as u64).ok_or(ShapeProblem::TooManyElements)?;
    }
    let block = ty.block_size();
    if !dims[0].is_multiple_of(block) {
        return Err(ShapeProblem::PartialBlock { ne0: dims[0], ty: ty.name(), block });
    }
    // elements / block * block_bytes <= elements * 4.5 for every type, but stay checked.
    (elements / block).checked_mul(ty.block_bytes()).ok_or(ShapeProblem::TooManyElements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_bytes_checks_shape() {
        assert_eq!(tensor_bytes(GgmlType::Q4_K, &[512, 3]), Ok(2 * 3 * 144));
        assert_eq!(tensor_bytes(GgmlType::F32, &[]), Err(ShapeProblem::DimCount(0)));
        assert_eq!(tensor_bytes(GgmlType::F32, &[1, 1, 1, 1, 1]), Err(ShapeProblem::DimCount(5)));
        assert_eq!(tensor_bytes(GgmlType::F32, &[4, 0]), Err(ShapeProblem::ZeroDim { index: 1 }));
        assert!(matches!(tensor_bytes(GgmlType::Q8_0, &[48]), Err(ShapeProblem::PartialBlock { ne0: 48, .. })));
        assert_eq!(tensor_bytes(GgmlType::F32, &[1 << 32, 1 << 31]), Err(ShapeProblem::TooManyElements));
        assert_eq!(tensor_bytes(GgmlType::F64, &[1 << 62]), Err(ShapeProblem::TooManyElements));
    }
}
