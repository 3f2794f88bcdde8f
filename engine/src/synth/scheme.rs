//! Which tensor type each weight matrix gets: one type for all (`--type q4_0`), `k-mix`, a
//! K-quant mix modelled on llama-quantize's Q4_K_M, or `mxfp4-moe` (gpt-oss's layout). Norm weights and the router stay F32 in
//! every scheme, as llama-quantize leaves them.

use brink_kernels::quant::TensorType;

use super::error::SynthError;
use super::weights::FILLABLE;

/// The weight matrices of a qwen3moe model, by role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Matrix {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantScheme {
    /// Every matrix in this type.
    Uniform(TensorType),
    /// Mostly q4_K; attn_v and ffn_down_exps q6_K on the layers llama-quantize gives more bits
    /// (`use_more_bits`: the first and last eighth and every third layer between) and q5_K on
    /// the others; output q6_K.
    KMix,
    /// The routed experts in MXFP4, every other matrix q8_0: how llama.cpp's converter writes
    /// gpt-oss (llama-quantize's MXFP4_MOE).
    Mxfp4Moe,
}

impl QuantScheme {
    pub const NAMES: [&str; 11] = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q5_K", "q6_K", "mxfp4", "k-mix", "mxfp4-moe"];

    /// The type of `matrix` in layer `layer` of `layers` (`layer` is ignored for the embedding
    /// and the output).
    pub fn matrix_type(self, matrix: Matrix, layer: u32, layers: u32) -> TensorType {
        match self {
            QuantScheme::Uniform(ty) => ty,
            QuantScheme::KMix => match matrix {
                Matrix::Output => TensorType::Q6_K,
                Matrix::AttnV | Matrix::FfnDownExps if use_more_bits(layer, layers) => TensorType::Q6_K,
                Matrix::AttnV | Matrix::FfnDownExps => TensorType::Q5_K,
                _ => TensorType::Q4_K,
            },
            QuantScheme::Mxfp4Moe => match matrix {
                Matrix::FfnGateExps | Matrix::FfnUpExps | Matrix::FfnDownExps => TensorType::MXFP4,
                _ => TensorType::Q8_0,
            },
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            QuantScheme::Uniform(ty) => match ty {
                TensorType::F32 => 0,
                TensorType::F16 => 1,
                TensorType::Q4_0 => 2,
                TensorType::Q8_0 => 7,
                TensorType::Q4_K => 14, // Q4_K_S: the pure K-quant types are their _S variants
                TensorType::Q5_K => 16,
                TensorType::Q6_K => 18,
                TensorType::BF16 => 32,
                // llama.cpp's LLAMA_FTYPE_GUESSED: a type without a file type of its own.
                _ => 1024,
            },
            QuantScheme::KMix => 15,     // Q4_K_M
            QuantScheme::Mxfp4Moe => 38, // MXFP4_MOE
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantScheme::Uniform(ty) => ty.name(),
            QuantScheme::KMix => "k-mix",
            QuantScheme::Mxfp4Moe => "mxfp4-moe",
        }
    }
}

/// llama-quantize's choice of layers that keep more bits in attn_v and ffn_down.
fn use_more_bits(layer: u32, layers: u32) -> bool {
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2
}

impl std::str::FromStr for QuantScheme {
    type Err = SynthError;

    /// A type name in any case (`q4_K`, `Q4_K`, `q4_k`) or `k-mix`.
    fn from_str(s: &str) -> Result<Self, SynthError> {
        if s.eq_ignore_ascii_case("k-mix") {
            return Ok(QuantScheme::KMix);
        }
        if s.eq_ignore_ascii_case("mxfp4-moe") {
            return Ok(QuantScheme::Mxfp4Moe);
        }
        let ty = s.parse::<TensorType>().ok().filter(|t| FILLABLE.contains(t));
        ty.map(QuantScheme::Uniform).ok_or_else(|| SynthError::UnknownType(s.to_string()))
    }
}

impl std::fmt::Display for QuantScheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_round_trip() {
        for name in QuantScheme::NAMES {
            let s: QuantScheme = name.parse().unwrap();
            assert_eq!(s.name(), name);
        }
        assert_eq!("Q4_K".parse::<QuantScheme>().unwrap(), QuantScheme::Uniform(TensorType::Q4_K));
        assert!(matches!("q3_K".parse::<QuantScheme>(), Err(SynthError::UnknownType(t)) if t == "q3_K"));
    }

    #[test]
    fn k_mix_follows_use_more_bits() {
        // 48 layers: 0..6 and 42..48 and every third layer from 6 + 2.
        let more: Vec<u32> = (0..48).filter(|&l| use_more_bits(l, 48)).collect();
        assert_eq!(more[..8], [0, 1, 2, 3, 4, 5, 8, 11]);
        assert!(more.ends_with(&[41, 42, 43, 44, 45, 46, 47]));
        let k = QuantScheme::KMix;
        assert_eq!(k.matrix_type(Matrix::FfnDownExps, 0, 48), TensorType::Q6_K);
        assert_eq!(k.matrix_type(Matrix::FfnDownExps, 6, 48), TensorType::Q5_K);
        assert_eq!(k.matrix_type(Matrix::AttnV, 8, 48), TensorType::Q6_K);
        assert_eq!(k.matrix_type(Matrix::FfnUpExps, 0, 48), TensorType::Q4_K);
        assert_eq!(k.matrix_type(Matrix::Output, 0, 48), TensorType::Q6_K);
        assert_eq!(k.matrix_type(Matrix::TokenEmbd, 0, 48), TensorType::Q4_K);
        // Two layers: one of each, so a tiny model has all three K-quants.
        assert_eq!(k.matrix_type(Matrix::AttnV, 0, 2), TensorType::Q5_K);
        assert_eq!(k.matrix_type(Matrix::AttnV, 1, 2), TensorType::Q6_K);
    }
}
