//! Named model shapes, each with the type it is usually generated in: [`Preset`] for qwen3moe,
//! [`GptOssPreset`] for gpt-oss.

use brink_kernels::quant::TensorType;

use super::error::SynthError;
use super::gpt_oss::{self, GptOssShape};
use super::qwen3moe::{self, Qwen3MoeShape};
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
        Self::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| SynthError::UnknownPreset {
            arch: qwen3moe::ARCH,
            name: s.to_string(),
            known: Self::ALL.map(Preset::name).to_vec(),
        })
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// gpt-oss shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GptOssPreset {
    /// For tests: two layers (one windowed, one full), hidden 320 (= 2880 / 9: a multiple of 32,
    /// not of 256, so K tails are exercised), 8 heads of 64 over 2 KV heads (Q is wider than the
    /// hidden state, as in gpt-oss), 16 experts top 4, a 128-token window, YaRN ×32 over 128
    /// tokens (context 4096).
    Tiny,
    /// openai/gpt-oss-20b's config.json: 24 layers, hidden 2880, 64 heads of 64 over 8 KV heads,
    /// 32 experts top 4 of width 2880, vocabulary 201,088, window 128, context 131,072 (YaRN ×32
    /// over 4,096), RoPE base 150,000, RMS epsilon 1e-5. 20.9 B parameters, ~12.1 GB.
    GptOss20b,
    /// openai/gpt-oss-120b: as 20b with 36 layers and 128 experts. 116.8 B parameters, ~63 GB:
    /// for plans, thresholds and memory fit (streamed to disk if generated).
    GptOss120b,
}

impl GptOssPreset {
    pub const ALL: [GptOssPreset; 3] = [GptOssPreset::Tiny, GptOssPreset::GptOss20b, GptOssPreset::GptOss120b];

    pub fn name(self) -> &'static str {
        match self {
            GptOssPreset::Tiny => "tiny",
            GptOssPreset::GptOss20b => "gpt-oss-20b",
            GptOssPreset::GptOss120b => "gpt-oss-120b",
        }
    }

    pub fn shape(self) -> GptOssShape {
        let real = GptOssShape {
            layers: 24,
            hidden: 2880,
            experts: 32,
            top_k: 4,
            expert_ffn: 2880,
            heads: 64,
            kv_heads: 8,
            head_dim: 64,
            vocab: 201_088,
            context: 131_072,
            rope_theta: 150_000.0,
            rms_eps: 1e-5,
            sliding_window: 128,
            yarn_factor: 32.0,
            yarn_original_context: 4096,
        };
        match self {
            GptOssPreset::Tiny => GptOssShape {
                layers: 2,
                hidden: 320,
                experts: 16,
                top_k: 4,
                expert_ffn: 320,
                heads: 8,
                kv_heads: 2,
                vocab: TRAINED_TOKENS,
                context: 4096,
                yarn_original_context: 128,
                ..real
            },
            GptOssPreset::GptOss20b => real,
            GptOssPreset::GptOss120b => GptOssShape { layers: 36, experts: 128, ..real },
        }
    }

    /// Experts in MXFP4, the rest q8_0, as the published gpt-oss GGUFs.
    pub fn default_scheme(self) -> QuantScheme {
        QuantScheme::Mxfp4Moe
    }
}

impl std::str::FromStr for GptOssPreset {
    type Err = SynthError;

    fn from_str(s: &str) -> Result<Self, SynthError> {
        Self::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| SynthError::UnknownPreset {
            arch: gpt_oss::ARCH,
            name: s.to_string(),
            known: Self::ALL.map(GptOssPreset::name).to_vec(),
        })
    }
}

impl std::fmt::Display for GptOssPreset {
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
    fn gpt_oss_presets_are_valid_and_parse() {
        for p in GptOssPreset::ALL {
            p.shape().validate().unwrap();
            assert_eq!(p.name().parse::<GptOssPreset>().unwrap(), p);
        }
        assert!(matches!("demo".parse::<GptOssPreset>(), Err(SynthError::UnknownPreset { arch: "gpt-oss", .. })));
    }

    #[test]
    fn gpt_oss_shapes_have_the_published_parameter_counts() {
        let params = |p: GptOssPreset| p.shape().tensors(p.default_scheme()).iter().map(|t| t.elements()).sum::<u64>();
        // openai/gpt-oss-20b: 20.91 B; gpt-oss-120b: 116.83 B (model card: 21 B and 117 B).
        let small = params(GptOssPreset::GptOss20b);
        assert!((20_900_000_000..20_930_000_000).contains(&small), "{small}");
        let big = params(GptOssPreset::GptOss120b);
        assert!((116_800_000_000..116_850_000_000).contains(&big), "{big}");
    }

    #[test]
    fn qwen3_30b_a3b_has_about_30b_parameters() {
        let s = Preset::Qwen3_30bA3b.shape();
        let params: u64 = s.tensors(QuantScheme::Uniform(TensorType::Q4_0)).iter().map(|t| t.elements()).sum();
        // Qwen3-30B-A3B: 30.5 B parameters.
        assert!((30_400_000_000..30_600_000_000).contains(&params), "{params}");
    }
}
