//! Bias adds (gpt-oss has biases on Q, K, V, the attention output, the router and every
//! expert): `ggml_add` of a bias row broadcast over the rows, and `ggml_add_id`, which adds to
//! each (token, slot) row the bias row of the expert that slot picked. Each value is one f32
//! add (`ggml_vec_add_f32`), so any order of the rows gives ggml's bits.

/// `x[r] += bias` for every row r of `bias.len()` values.
///
/// # Panics
/// If `bias` is empty or `x` is not whole rows of it.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    assert!(!bias.is_empty() && x.len().is_multiple_of(bias.len()), "add_bias: {} values in rows of {}", x.len(), bias.len());
    for row in x.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
}

/// `ggml_add_id`: `x[i] += biases[ids[i]]` for each row i of `width` values, `biases` being
/// `[n_expert, width]` (rows i are token · top_k + slot, `ids` the routing's experts).
///
/// # Panics
/// If the lengths disagree or an id is past the biases (ggml asserts the same).
pub fn add_id(x: &mut [f32], biases: &[f32], ids: &[u32], width: usize) {
    assert!(
        width > 0 && x.len() == ids.len() * width && biases.len().is_multiple_of(width),
        "add_id: {} values for {} ids of width {width}, biases {}",
        x.len(),
        ids.len(),
        biases.len()
    );
    let n_expert = biases.len() / width;
    for (row, &e) in x.chunks_exact_mut(width).zip(ids) {
        assert!((e as usize) < n_expert, "add_id: expert {e} of {n_expert}");
        let b = &biases[e as usize * width..][..width];
        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_bias_broadcasts_over_rows() {
        let mut x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        add_bias(&mut x, &[0.5, -1.0, 1e8]);
        assert_eq!(x, [1.5, 1.0, 1e8 + 3.0, 4.5, 4.0, 1e8 + 6.0]);
    }

    #[test]
    fn add_id_picks_each_rows_expert() {
        // 3 experts of width 2; 2 tokens × 2 slots picking 2, 0 and 2, 1.
        let biases = [10.0, 11.0, 20.0, 21.0, 30.0, 31.0];
        let mut x = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0];
        add_id(&mut x, &biases, &[2, 0, 2, 1], 2);
        assert_eq!(x, [31.0, 32.0, 12.0, 13.0, 33.0, 34.0, 24.0, 25.0]);
    }

    #[test]
    #[should_panic(expected = "expert 3 of 3")]
    fn add_id_rejects_an_expert_past_the_biases() {
        add_id(&mut [0.0; 2], &[0.0; 6], &[3], 2);
    }
}
