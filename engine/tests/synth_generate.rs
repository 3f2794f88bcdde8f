//! The synthetic model generator: files are byte-identical for the same seed, shape and type
//! (whatever the number of threads), carry every key and tensor llama.cpp's qwen3moe loader
//! reads, decode to finite values of the planned scale, and bad shapes or types are refused
//! with errors naming the field and the tensor.

use std::path::Path;

use brink_engine::gguf::{GgmlType, GgufFile};
use brink_engine::synth::{
    self, Init, Preset, QuantScheme, Qwen3MoeShape, ShapeField, SynthError, SynthSpec, TensorPlan, tensor_bytes, vocab,
};
use brink_kernels::quant::TensorType;

fn spec(preset: Preset, scheme: QuantScheme, seed: u64) -> SynthSpec {
    SynthSpec { scheme, seed, ..SynthSpec::from_preset(preset) }
}

fn write(spec: &SynthSpec, path: &Path) -> synth::Report {
    synth::generate(spec, path, |_, _| {}).unwrap_or_else(|e| panic!("{e}"))
}

fn read_tensor(file: &GgufFile, name: &str) -> Vec<u8> {
    let info = file.require_tensor(name).unwrap();
    let mut buf = vec![0u8; info.size() as usize];
    file.read_tensor_into(info, &mut buf).unwrap();
    buf
}

#[test]
fn same_seed_same_bytes_whatever_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(Preset::Tiny, QuantScheme::KMix, 7);
    let run = |threads: usize, name: &str| {
        let path = dir.path().join(name);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| write(&s, &path));
        std::fs::read(&path).unwrap()
    };
    let one = run(1, "a.gguf");
    let three = run(3, "b.gguf");
    assert!(one == three, "1 thread and 3 threads wrote different bytes");
    let again = run(2, "c.gguf");
    assert!(one == again);

    let other_seed = dir.path().join("d.gguf");
    write(&spec(Preset::Tiny, QuantScheme::KMix, 8), &other_seed);
    let other = std::fs::read(&other_seed).unwrap();
    assert_eq!(other.len(), one.len());
    assert!(other != one, "a different seed gave the same file");
    assert!(dir.path().read_dir().unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().ends_with(".partial")));
}

/// A tensor's bytes depend on its name and the seed, not on the rest of the model.
#[test]
fn tensors_do_not_depend_on_the_layer_count() {
    let dir = tempfile::tempdir().unwrap();
    let two = dir.path().join("two.gguf");
    let three = dir.path().join("three.gguf");
    let s2 = spec(Preset::Tiny, QuantScheme::Uniform(TensorType::Q4_0), 1);
    let mut s3 = s2.clone();
    s3.shape.layers = 3;
    write(&s2, &two);
    write(&s3, &three);
    let (a, b) = (GgufFile::open(&two).unwrap(), GgufFile::open(&three).unwrap());
    for name in ["blk.1.ffn_down_exps.weight", "token_embd.weight", "output.weight"] {
        assert!(read_tensor(&a, name) == read_tensor(&b, name), "{name}");
    }
    assert!(b.tensor("blk.2.attn_q.weight").is_some());
}

#[test]
fn metadata_and_tensors_are_complete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let s = spec(Preset::TinyTop8, QuantScheme::Uniform(TensorType::Q8_0), 0);
    let report = write(&s, &path);
    let file = GgufFile::open(&path).unwrap();
    let md = file.metadata();
    let shape = s.shape;
    assert_eq!(file.architecture().unwrap(), "qwen3moe");
    assert_eq!(file.parts()[0].version(), 3);
    let u32s = [
        ("qwen3moe.context_length", shape.context),
        ("qwen3moe.embedding_length", shape.hidden as u32),
        ("qwen3moe.block_count", shape.layers),
        ("qwen3moe.feed_forward_length", (shape.expert_ffn * u64::from(shape.top_k)) as u32),
        ("qwen3moe.expert_feed_forward_length", shape.expert_ffn as u32),
        ("qwen3moe.attention.head_count", shape.heads),
        ("qwen3moe.attention.head_count_kv", shape.kv_heads),
        ("qwen3moe.attention.key_length", shape.head_dim as u32),
        ("qwen3moe.attention.value_length", shape.head_dim as u32),
        ("qwen3moe.expert_count", shape.experts),
        ("qwen3moe.expert_used_count", shape.top_k),
        ("general.file_type", 7),
        ("general.quantization_version", 2),
    ];
    for (key, want) in u32s {
        assert_eq!(md.get_u32(key).unwrap(), want, "{key}");
    }
    assert_eq!(md.get_f32("qwen3moe.rope.freq_base").unwrap(), 1e6);
    assert_eq!(md.get_f32("qwen3moe.attention.layer_norm_rms_epsilon").unwrap(), 1e-6);
    assert!(md.get_str("general.name").unwrap().contains("tiny-top8"));
    assert_eq!(md.get_u64(synth::SEED_KEY).unwrap(), 0);
    assert_eq!(md.get_str(synth::PRESET_KEY).unwrap(), "tiny-top8");

    // Tokenizer: gpt2 BPE with Qwen2's pre-tokenizer, arrays as long as the vocabulary.
    assert_eq!(md.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), "qwen2");
    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len() as u64, shape.vocab);
    let types = md.get_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.as_i32().map(<[i32]>::len), Some(tokens.len()), "token_type must be an i32 array (llama.cpp checks)");
    let merges = md.get_str_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(merges.len(), report.merges);
    assert!(merges.iter().all(|m| m.split(' ').count() == 2), "a merge is two tokens separated by one space");
    let eos = md.get_u32("tokenizer.ggml.eos_token_id").unwrap() as usize;
    assert_eq!(&*tokens[eos], vocab::IM_END);
    assert_eq!(&*tokens[md.get_u32("tokenizer.ggml.bos_token_id").unwrap() as usize], vocab::ENDOFTEXT);
    assert_eq!(&*tokens[md.get_u32("tokenizer.ggml.padding_token_id").unwrap() as usize], vocab::ENDOFTEXT);
    assert!(!md.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(md.get_str("tokenizer.chat_template").unwrap().contains("<|im_start|>"));

    // Tensors: the names, dims and types llama.cpp's qwen3moe loader creates.
    let (h, v, e, f) = (shape.hidden, shape.vocab, u64::from(shape.experts), shape.expert_ffn);
    let (q, kv) = (u64::from(shape.heads) * shape.head_dim, u64::from(shape.kv_heads) * shape.head_dim);
    let mut expected: Vec<(String, Vec<u64>, GgmlType)> =
        vec![("token_embd.weight".into(), vec![h, v], GgmlType::Q8_0), ("output_norm.weight".into(), vec![h], GgmlType::F32)];
    expected.push(("output.weight".into(), vec![h, v], GgmlType::Q8_0));
    for l in 0..shape.layers {
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        expected.extend([
            (n("attn_norm"), vec![h], GgmlType::F32),
            (n("attn_q"), vec![h, q], GgmlType::Q8_0),
            (n("attn_k"), vec![h, kv], GgmlType::Q8_0),
            (n("attn_v"), vec![h, kv], GgmlType::Q8_0),
            (n("attn_output"), vec![q, h], GgmlType::Q8_0),
            (n("attn_q_norm"), vec![shape.head_dim], GgmlType::F32),
            (n("attn_k_norm"), vec![shape.head_dim], GgmlType::F32),
            (n("ffn_norm"), vec![h], GgmlType::F32),
            (n("ffn_gate_inp"), vec![h, e], GgmlType::F32),
            (n("ffn_gate_exps"), vec![h, f, e], GgmlType::Q8_0),
            (n("ffn_up_exps"), vec![h, f, e], GgmlType::Q8_0),
            (n("ffn_down_exps"), vec![f, h, e], GgmlType::Q8_0),
        ]);
    }
    assert_eq!(file.tensors().len(), expected.len());
    for (name, dims, ty) in &expected {
        let t = file.require_tensor(name).unwrap();
        assert_eq!((t.dims(), t.ggml_type()), (dims.as_slice(), *ty), "{name}");
    }
    assert_eq!(report.tensors, expected.len());
    assert_eq!(report.bytes, std::fs::metadata(&path).unwrap().len());
    assert_eq!(report.params, expected.iter().map(|(_, d, _)| d.iter().product::<u64>()).sum::<u64>());
}

/// Mean and standard deviation of values.
fn moments(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Every type's blocks, decoded by brink-kernels' dequantizers, are finite, zero-mean and of the
/// planned standard deviation; every block has its own scale.
#[test]
fn every_type_decodes_to_the_planned_scale() {
    let std = 0.05f32;
    for ty in brink_engine::synth::weights::FILLABLE {
        let plan = TensorPlan { name: format!("probe.{ty}"), dims: vec![512, 300], init: Init::Matrix { ty, std } };
        let bytes = tensor_bytes(&plan, 11);
        assert_eq!(bytes.len(), 512 * 300 / ty.block_size() * ty.block_bytes());
        let mut x = vec![0f32; 512 * 300];
        ty.dequantize_rows(&bytes, 512, &mut x).unwrap();
        assert!(x.iter().all(|v| v.is_finite()), "{ty}: non-finite value");
        let (mean, sd) = moments(&x);
        assert!(mean.abs() < 0.02 * f64::from(std), "{ty}: mean {mean}");
        assert!((sd / f64::from(std) - 1.0).abs() < 0.06, "{ty}: std {sd}, planned {std}");
        if ty.is_quantized() {
            // Per-block scales vary: block amplitudes are not all equal.
            let block = ty.block_size();
            let amax: Vec<f32> = x.chunks(block).map(|b| b.iter().fold(0f32, |m, v| m.max(v.abs()))).collect();
            let (lo, hi) = amax.iter().fold((f32::MAX, 0f32), |(lo, hi), &a| (lo.min(a), hi.max(a)));
            assert!(hi > 1.5 * lo, "{ty}: block amplitudes {lo}..{hi} do not vary");
        }
    }
}

/// The file's tensors (a K-quant mix, read back from disk) decode to the scales their plan asks
/// for: the data of each tensor is where its info says.
#[test]
fn file_tensors_decode_to_their_plans() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.gguf");
    let s = spec(Preset::Tiny, QuantScheme::KMix, 3);
    write(&s, &path);
    let file = GgufFile::open(&path).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    // (TensorType is not Ord; its name is.)
    for plan in s.shape.tensors(s.scheme) {
        let ty = plan.init.tensor_type();
        let bytes = read_tensor(&file, &plan.name);
        assert!(bytes == tensor_bytes(&plan, s.seed), "{}: file bytes differ from the plan's", plan.name);
        let mut x = vec![0f32; plan.elements() as usize];
        ty.dequantize_rows(&bytes, plan.dims[0] as usize, &mut x).unwrap();
        let (mean, sd) = moments(&x);
        match plan.init {
            Init::Matrix { std, .. } | Init::Router { std } | Init::Bias { std } | Init::Head { std, .. } => {
                assert!((sd / f64::from(std) - 1.0).abs() < 0.1, "{}: std {sd} vs {std}", plan.name);
                assert!(mean.abs() < 0.1 * f64::from(std), "{}: mean {mean}", plan.name);
            }
            Init::Norm => {
                assert!(x.iter().all(|v| (0.9..=1.1).contains(v)), "{}: norm weights away from 1", plan.name);
                assert!((mean - 1.0).abs() < 0.02);
            }
        }
        seen.insert(ty.name());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["f32", "q4_K", "q5_K", "q6_K"]);
}

/// Past the trained tokens, the output rows of `[PAD]` tokens are 16 times smaller, so greedy
/// decoding of a model padded to 151,936 tokens still picks real tokens.
#[test]
fn padding_rows_of_the_output_head_are_quiet() {
    let mut s = SynthSpec { scheme: QuantScheme::Uniform(TensorType::Q4_0), ..SynthSpec::from_preset(Preset::Tiny) };
    s.shape.vocab = 2600;
    let head = s.shape.tensors(s.scheme).into_iter().find(|t| t.name == "output.weight").unwrap();
    let Init::Head { std, live_rows, .. } = head.init else { panic!("{:?}", head.init) };
    assert_eq!(live_rows, vocab::TRAINED_TOKENS);
    let h = s.shape.hidden as usize;
    let mut x = vec![0f32; h * 2600];
    TensorType::Q4_0.dequantize_rows(&tensor_bytes(&head, 5), h, &mut x).unwrap();
    let (live, pad) = x.split_at(h * live_rows as usize);
    let (_, live_sd) = moments(live);
    let (_, pad_sd) = moments(pad);
    assert!((live_sd / f64::from(std) - 1.0).abs() < 0.05, "{live_sd}");
    assert!((pad_sd * 16.0 / f64::from(std) - 1.0).abs() < 0.05, "{pad_sd}");
    // The boundary row: the last live row is loud, the first padding row quiet.
    let row_sd = |r: usize| moments(&x[r * h..(r + 1) * h]).1 / f64::from(std);
    assert!(row_sd(1999) > 0.6 && row_sd(2000) < 0.15, "{} {}", row_sd(1999), row_sd(2000));
}

#[test]
fn unstorable_shapes_name_the_tensor_and_the_flag() {
    let base = SynthSpec::from_preset(Preset::Tiny);
    type Change = fn(&mut Qwen3MoeShape);
    let cases: [(QuantScheme, Change, &str, &str); 4] = [
        (QuantScheme::Uniform(TensorType::Q4_K), |s| s.expert_ffn = 100, "blk.0.ffn_down_exps.weight", "--expert-ffn"),
        (QuantScheme::KMix, |s| s.hidden = 320, "token_embd.weight", "--hidden"),
        (QuantScheme::Uniform(TensorType::Q6_K), |s| s.head_dim = 32, "blk.0.attn_output.weight", "--heads × --head-dim"),
        (QuantScheme::Uniform(TensorType::Q8_0), |s| s.hidden = 48, "token_embd.weight", "--hidden"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (scheme, change, tensor, flag) in cases {
        let mut s = SynthSpec { scheme, ..base.clone() };
        change(&mut s.shape);
        let path = dir.path().join("x.gguf");
        let err = synth::generate(&s, &path, |_, _| {}).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(&err, SynthError::Unstorable { tensor: t, .. } if t == tensor), "{msg}");
        assert!(msg.contains(flag) && msg.contains(tensor) && msg.contains(scheme.name()), "{msg}");
        assert!(!path.exists());
    }
    // F32 stores any row length.
    let mut s = SynthSpec { scheme: QuantScheme::Uniform(TensorType::F32), ..base.clone() };
    s.shape.hidden = 48;
    assert!(s.plan().is_ok());
}

#[test]
fn bad_shapes_name_the_flag() {
    let mut s = SynthSpec::from_preset(Preset::Demo);
    s.shape.top_k = 64;
    let err = s.plan().unwrap_err();
    assert!(matches!(err, SynthError::BadShape { field: ShapeField::TopK, .. }), "{err}");
    assert!(err.to_string().starts_with("--top-k 64:"), "{err}");
}

#[test]
fn io_errors_name_the_path_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("m.gguf");
    let err = synth::generate(&SynthSpec::from_preset(Preset::Tiny), &path, |_, _| {}).unwrap_err();
    assert!(matches!(err, SynthError::Io { .. }), "{err}");
    assert!(err.to_string().contains("missing-dir"), "{err}");
}

/// The benchmark shape (Qwen3-30B-A3B) in Q4_0 is a ~16 GiB file (planned, not written).
#[test]
fn qwen3_30b_a3b_q4_0_plan_is_about_16_gib() {
    let plan = SynthSpec::from_preset(Preset::Qwen3_30bA3b).plan().unwrap();
    let gib = plan.data_bytes() as f64 / (1u64 << 30) as f64;
    assert!((15.5..16.5).contains(&gib), "{gib} GiB");
    assert_eq!(plan.vocab_tokens, 151_936);
}
