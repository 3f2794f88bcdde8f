//! Named model shapes, each with the type it is usually generated in.

use brink_kernels::quant::TensorType;

use super::error::SynthError;
use super::qwen3moe::Qwen3MoeShape;
use super::scheme::QuantScheme;
use super::vocab::TRAINED_TOKENS;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// For tests: two layers, every width a multiple of 256 so every type (K-quants too) fits.
    Tiny,
    /// As `tiny` with top-8 routing over 32 experts (the routing of Qwen3-30B-A3B).
    TinyTop8,
    /// The README's demo model: small enough to run fast on a CPU.
    Demo,
    /// The shape of Qwen3-30B-A3B, for benchmarks.
    Qwen3_30bA3b,
}

impl Preset {
    pub const ALL: [Preset; 4] = [Preset::Tiny, Preset::TinyTop8, Preset::Demo, Preset::Qwen3_30bA3b];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::TinyTop8 => "tiny-top8",
            Preset::Demo => "demo",
            Preset::Qwen3_30bA3b => "qwen3-30b-a3b",
        }
    }

    pub fn shape(self) -> Qwen3MoeShape {
        let tiny = Qwen3MoeShape {
            layers: 2,
            hidden: 256,
            experts: 16,
            top_k: 4,
            expert_ffn: 256,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            vocab: TRAINED_TOKENS,
            context: 4096,
            rope_theta: 1_000_000.0,
            rms_eps: 1e-6,
        };
        match self {
            Preset::Tiny => tiny,
            Preset::TinyTop8 => Qwen3MoeShape { experts: 32, top_k: 8, ..tiny },
            Preset::Demo => Qwen3MoeShape { layers: 4, hidden: 512, experts: 32, top_k: 4, heads: 8, kv_heads: 2, context: 8192, ..tiny },
            Preset::Qwen3_30bA3b => Qwen3MoeShape {
                layers: 48,
                hidden: 2048,
                experts: 128,
                top_k: 8,
                expert_ffn: 768,
                heads: 32,
                kv_heads: 4,
                head_dim: 128,
                vocab: 151_936,
                context: 40_960,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-6,
            },
        }
    }

    /// The type the preset is generated in unless `--type` says otherwise.
    pub fn default_scheme(self) -> QuantScheme {
        match self {
            Preset::Qwen3_30bA3b => QuantScheme::Uniform(TensorType::Q4_0),
            _ => QuantScheme::Uniform(TensorType::Q8_0),
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = SynthError;

    fn from_str(s: &str) -> Result<Self, SynthError> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| SynthError::UnknownPreset { name: s.to_string(), known: Self::ALL.map(Preset::name).to_vec() })
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_parse() {
        for p in Preset::ALL {
            p.shape().validate().unwrap();
            assert_eq!(p.name().parse::<Preset>().unwrap(), p);
        }
        assert!(matches!("huge".parse::<Preset>(), Err(SynthError::UnknownPreset { .. })));
    }

    #[test]
    fn qwen3_30b_a3b_has_about_30b_parameters() {
        let s = Preset::Qwen3_30bA3b.shape();
        let params: u64 = s.tensors(QuantScheme::Uniform(TensorType::Q4_0)).iter().map(|t| t.elements()).sum();
        // Qwen3-30B-A3B: 30.5 B parameters.
        assert!((30_400_000_000..30_600_000_000).contains(&params), "{params}");
    }
}
