//! Pure checks of where tensor data lies: aligned, inside the file, not overlapping, and tensor
//! names unique (also across the parts of a split model).

use std::path::Path;

use super::error::{ErrorKind, GgufError};
use super::tensor::TensorInfo;

/// Sets each tensor's absolute `file_offset` after checking that its data is aligned, lies in
/// `data_start..file_len`, and overlaps no other tensor's data. Gaps between tensors are allowed
/// (llama.cpp insists on tightly packed data; other writers need not).
pub(crate) fn place_tensors(
    path: &Path,
    tensors: &mut [TensorInfo],
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors.iter_mut() {
        if t.offset % alignment != 0 {
            let kind = ErrorKind::MisalignedTensor { tensor: t.name.to_string(), offset: t.offset, alignment };
            return Err(GgufError::at(path, t.info_offset, kind));
        }
        let start = data_start.checked_add(t.offset).filter(|s| s.checked_add(t.size).is_some_and(|end| end <= file_len));
        let Some(start) = start else {
            let kind = ErrorKind::TensorPastEnd { tensor: t.name.to_string(), offset: t.offset, size: t.size, data_start, file_len };
            return Err(GgufError::at(path, t.info_offset, kind));
        };
        t.file_offset = start;
    }
    // u32 indices: the reader refuses more than u32::MAX tensors.
    let mut order: Vec<u32> = (0..tensors.len() as u32).collect();
    order.sort_unstable_by_key(|&i| (tensors[i as usize].file_offset, i));
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0] as usize], &tensors[w[1] as usize]);
        // Both ends were checked against file_len above, so this cannot overflow.
        let a_end = a.file_offset + a.size;
        if a_end > b.file_offset {
            let kind = ErrorKind::OverlappingTensors {
                first: a.name.to_string(),
                first_start: a.file_offset,
                first_end: a_end,
                second: b.name.to_string(),
                second_start: b.file_offset,
            };
            return Err(GgufError::at(path, b.info_offset, kind));
        }
    }
    Ok(())
}

/// Tensor indices sorted by name, for lookups; a repeated name is an error at its later place.
/// `path_of(part)` names the file a tensor's info came from.
pub(crate) fn sorted_by_name<'p>(tensors: &[TensorInfo], path_of: impl Fn(usize) -> &'p Path) -> Result<Vec<u32>, GgufError> {
    let count = u32::try_from(tensors.len()).map_err(|_| {
        let kind = ErrorKind::CountTooLarge { what: "tensor", count: tensors.len() as u64, remaining: 0, max: u32::MAX.into() };
        GgufError::new(path_of(0), None, kind)
    })?;
    let mut sorted: Vec<u32> = (0..count).collect();
    sorted.sort_unstable_by(|&a, &b| tensors[a as usize].name.cmp(&tensors[b as usize].name).then(a.cmp(&b)));
    if let Some(w) = sorted.windows(2).find(|w| tensors[w[0] as usize].name == tensors[w[1] as usize].name) {
        let t = &tensors[w[1] as usize];
        return Err(GgufError::at(path_of(t.part()), t.info_offset, ErrorKind::DuplicateTensor { name: t.name.to_string() }));
    }
    Ok(sorted)
}
