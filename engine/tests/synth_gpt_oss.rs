//! Synthetic gpt-oss models: the tiny file carries every key and tensor llama.cpp's gpt-oss
//! loader (src/models/openai-moe.cpp) reads, in the types the published GGUFs use, decodes to the
//! planned scales, is the same bytes for the same seed, is read alike by gguf-py, and its harmony
//! template renders and tokenizes with brink's tokenizer; the 20b- and 120b-shaped plans are
//! laid out (tensor list, exact file size) without writing a byte.
//!
//! The gguf-py check is skipped with a message when python3 or the package is missing, unless
//! BRINK_REQUIRE_PY=1 (as scripts/test sets), where that is a failure.

use std::path::Path;
use std::process::Command;

use brink_engine::chat_template::ChatTemplate;
use brink_engine::gguf::{GgmlType, GgufFile};
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use brink_engine::synth::{self, GptOssPreset, Init, QuantScheme, ShapeField, SynthError, tensor_bytes};
use brink_engine::tokenizer::Tokenizer;
use brink_kernels::quant::TensorType;
use serde_json::{Value as Json, json};

fn write(spec: &GptOssSpec, path: &Path) -> synth::Report {
    gpt_oss::generate(spec, path, |_, _| {}).unwrap_or_else(|e| panic!("{e}"))
}

fn read_tensor(file: &GgufFile, name: &str) -> Vec<u8> {
    let info = file.require_tensor(name).unwrap();
    let mut buf = vec![0u8; info.size() as usize];
    file.read_tensor_into(info, &mut buf).unwrap();
    buf
}

fn moments(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Every tensor llama.cpp's `llama_model_openai_moe::load_arch_tensors` creates (all required),
/// with its ggml-order dims, in the types of ggml-org/gpt-oss-20b-GGUF.
fn llama_cpp_tensors(spec: &GptOssSpec) -> Vec<(String, Vec<u64>, GgmlType)> {
    let s = spec.shape;
    let (h, v, q, kv, f, e) = (s.hidden, s.vocab, s.q_width(), s.kv_width(), s.expert_ffn, u64::from(s.experts));
    let (q8, f32, mx) = (GgmlType::Q8_0, GgmlType::F32, GgmlType::MXFP4);
    let mut out: Vec<(String, Vec<u64>, GgmlType)> = vec![
        ("token_embd.weight".into(), vec![h, v], q8),
        ("output_norm.weight".into(), vec![h], f32),
        ("output.weight".into(), vec![h, v], q8),
    ];
    for l in 0..s.layers {
        let n = |t: &str| format!("blk.{l}.{t}");
        out.extend([
            (n("attn_norm.weight"), vec![h], f32),
            (n("post_attention_norm.weight"), vec![h], f32),
            (n("attn_q.weight"), vec![h, q], q8),
            (n("attn_k.weight"), vec![h, kv], q8),
            (n("attn_v.weight"), vec![h, kv], q8),
            (n("attn_q.bias"), vec![q], f32),
            (n("attn_k.bias"), vec![kv], f32),
            (n("attn_v.bias"), vec![kv], f32),
            (n("attn_output.weight"), vec![q, h], q8),
            (n("attn_output.bias"), vec![h], f32),
            (n("attn_sinks.weight"), vec![u64::from(s.heads)], f32),
            (n("ffn_gate_inp.weight"), vec![h, e], f32),
            (n("ffn_gate_inp.bias"), vec![e], f32),
            (n("ffn_gate_exps.weight"), vec![h, f, e], mx),
            (n("ffn_up_exps.weight"), vec![h, f, e], mx),
            (n("ffn_down_exps.weight"), vec![f, h, e], mx),
            (n("ffn_gate_exps.bias"), vec![f, e], f32),
            (n("ffn_up_exps.bias"), vec![f, e], f32),
            (n("ffn_down_exps.bias"), vec![h, e], f32),
        ]);
    }
    out
}

#[test]
fn tiny_has_every_key_and_tensor_llama_cpp_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let spec = GptOssSpec::from_preset(GptOssPreset::Tiny);
    let report = write(&spec, &path);
    let plan = spec.plan().unwrap();
    assert_eq!(report.bytes, plan.file_bytes(), "the plan's file size is the file's");
    assert_eq!(report.bytes, std::fs::metadata(&path).unwrap().len());

    let file = GgufFile::open(&path).unwrap();
    let md = file.metadata();
    let s = spec.shape;
    assert_eq!(file.architecture().unwrap(), "gpt-oss");
    // The tiny shape: both layer kinds, K tails (320 = 256 + 64), Q wider than the hidden state,
    // a context past the window.
    assert!(s.layers >= 2 && s.hidden.is_multiple_of(32) && !s.hidden.is_multiple_of(256) && s.q_width() != s.hidden);
    assert!(s.context > 2 * s.sliding_window);
    let u32s = [
        ("gpt-oss.block_count", s.layers),
        ("gpt-oss.context_length", s.context),
        ("gpt-oss.embedding_length", s.hidden as u32),
        ("gpt-oss.feed_forward_length", s.expert_ffn as u32),
        ("gpt-oss.expert_feed_forward_length", s.expert_ffn as u32),
        ("gpt-oss.attention.head_count", s.heads),
        ("gpt-oss.attention.head_count_kv", s.kv_heads),
        ("gpt-oss.attention.key_length", s.head_dim as u32),
        ("gpt-oss.attention.value_length", s.head_dim as u32),
        ("gpt-oss.attention.sliding_window", 128),
        ("gpt-oss.expert_count", s.experts),
        ("gpt-oss.expert_used_count", s.top_k),
        ("gpt-oss.rope.scaling.original_context_length", s.yarn_original_context),
        ("general.file_type", 38), // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
        ("general.quantization_version", 2),
    ];
    for (key, want) in u32s {
        assert_eq!(md.get_u32(key).unwrap(), want, "{key}");
    }
    let f32s = [
        ("gpt-oss.rope.freq_base", 150_000.0),
        ("gpt-oss.attention.layer_norm_rms_epsilon", 1e-5),
        ("gpt-oss.rope.scaling.factor", 32.0),
        ("gpt-oss.rope.scaling.yarn_beta_fast", 32.0),
        ("gpt-oss.rope.scaling.yarn_beta_slow", 1.0),
    ];
    for (key, want) in f32s {
        assert_eq!(md.get_f32(key).unwrap(), want, "{key}");
    }
    assert_eq!(md.get_str("gpt-oss.rope.scaling.type").unwrap(), "yarn");
    assert_eq!(md.get_str(synth::PRESET_KEY).unwrap(), "tiny");
    assert!(md.get_str("general.name").unwrap().contains("gpt-oss"));

    // Tokenizer: gpt2 BPE, gpt-4o pre-tokenizer, the harmony specials as control tokens.
    assert_eq!(md.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), "gpt-4o");
    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len() as u64, s.vocab);
    let types = md.get_array("tokenizer.ggml.token_type").unwrap().as_i32().unwrap().to_vec();
    for special in [gpt_oss::START, gpt_oss::END, gpt_oss::MESSAGE, gpt_oss::CHANNEL, gpt_oss::RETURN, gpt_oss::CALL, gpt_oss::CONSTRAIN] {
        let id = tokens.iter().position(|t| &**t == special).unwrap_or_else(|| panic!("{special} is not a token"));
        assert_eq!(types[id], 3, "{special} is not a control token");
    }
    let token = |key: &str| &*tokens[md.get_u32(key).unwrap() as usize];
    assert_eq!(token("tokenizer.ggml.bos_token_id"), gpt_oss::STARTOFTEXT);
    assert_eq!(token("tokenizer.ggml.eos_token_id"), gpt_oss::RETURN);
    assert_eq!(token("tokenizer.ggml.padding_token_id"), gpt_oss::ENDOFTEXT);
    assert_eq!(md.get_str("tokenizer.chat_template").unwrap(), include_str!("chat_template_gpt_oss.jinja"));

    let expected = llama_cpp_tensors(&spec);
    assert_eq!(file.tensors().len(), expected.len(), "tensors beyond llama.cpp's list");
    for (name, dims, ty) in &expected {
        let t = file.require_tensor(name).unwrap();
        assert_eq!((t.dims(), t.ggml_type()), (dims.as_slice(), *ty), "{name}");
    }
    assert_eq!(report.tensors, expected.len());
    assert_eq!(report.params, expected.iter().map(|(_, d, _)| d.iter().product::<u64>()).sum::<u64>());

    // Data: each tensor is its plan's bytes and decodes to the planned scale.
    for plan in spec.shape.tensors(spec.scheme) {
        let bytes = read_tensor(&file, &plan.name);
        assert!(bytes == tensor_bytes(&plan, spec.seed), "{}: file bytes differ from the plan's", plan.name);
        let mut x = vec![0f32; plan.elements() as usize];
        plan.init.tensor_type().dequantize_rows(&bytes, plan.dims[0] as usize, &mut x).unwrap();
        assert!(x.iter().all(|v| v.is_finite()), "{}", plan.name);
        let (mean, sd) = moments(&x);
        match plan.init {
            // Vectors as short as the 8 sinks: loose bounds.
            Init::Bias { std } if x.len() < 1000 => {
                assert!(sd < 2.0 * f64::from(std) && sd > 0.2 * f64::from(std), "{}: std {sd}", plan.name)
            }
            Init::Matrix { std, .. } | Init::Router { std } | Init::Bias { std } | Init::Head { std, .. } => {
                // MXFP4 draws power-of-two scales around the planned one: a wider tolerance.
                assert!((sd / f64::from(std) - 1.0).abs() < 0.15, "{}: std {sd} vs {std}", plan.name);
                assert!(mean.abs() < 0.1 * f64::from(std), "{}: mean {mean}", plan.name);
            }
            Init::Norm => assert!((mean - 1.0).abs() < 0.05, "{}: mean {mean}", plan.name),
        }
    }
}

#[test]
fn same_seed_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = GptOssSpec::from_preset(GptOssPreset::Tiny);
    let (a, b, c) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"), dir.path().join("c.gguf"));
    write(&spec, &a);
    write(&spec, &b);
    write(&GptOssSpec { seed: 1, ..spec.clone() }, &c);
    let a = std::fs::read(&a).unwrap();
    assert!(a == std::fs::read(&b).unwrap(), "same spec, different bytes");
    assert!(a != std::fs::read(&c).unwrap(), "the seed changed nothing");
}

/// The real shapes, planned: llama.cpp's tensor list, the published sizes (ggml-org's
/// gpt-oss-20b-mxfp4.gguf is 12.1 GB, gpt-oss-120b ~63 GB), the header only.
#[test]
fn real_shapes_plan_without_writing() {
    for (preset, layers, experts, gb) in [(GptOssPreset::GptOss20b, 24, 32, 11.9..12.2), (GptOssPreset::GptOss120b, 36, 128, 62.5..63.5)] {
        let spec = GptOssSpec::from_preset(preset);
        let plan = spec.plan().unwrap();
        assert_eq!((spec.shape.layers, spec.shape.experts), (layers, experts));
        let mut expected = llama_cpp_tensors(&spec);
        let mut planned: Vec<(String, Vec<u64>, GgmlType)> =
            plan.writer.tensors().iter().map(|t| (t.name.clone(), t.dims.clone(), t.ggml_type)).collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        planned.sort_by(|a, b| a.0.cmp(&b.0));
        assert!(planned == expected, "{preset}: the plan's tensors are not llama.cpp's");
        let size = plan.file_bytes() as f64 / 1e9;
        assert!(gb.contains(&size), "{preset}: {size} GB");
        assert_eq!(plan.vocab_tokens, 201_088);
    }
}

#[test]
fn bad_shapes_and_types_name_the_flag() {
    let mut spec = GptOssSpec::from_preset(GptOssPreset::Tiny);
    spec.shape.sliding_window = 0;
    let err = spec.plan().unwrap_err();
    assert!(matches!(err, SynthError::BadShape { field: ShapeField::SlidingWindow, .. }), "{err}");
    assert!(err.to_string().starts_with("--sliding-window 0:"), "{err}");

    // K-quants need rows of 256: hidden 320 cannot be q4_K.
    let spec = GptOssSpec { scheme: QuantScheme::Uniform(TensorType::Q4_K), ..GptOssSpec::from_preset(GptOssPreset::Tiny) };
    let err = spec.plan().unwrap_err();
    assert!(matches!(&err, SynthError::Unstorable { tensor, .. } if tensor == "token_embd.weight"), "{err}");
    assert!(err.to_string().contains("--hidden"), "{err}");
    // Any scheme keeps norms, biases, sinks and the router F32.
    let spec = GptOssSpec { scheme: QuantScheme::Uniform(TensorType::Q8_0), ..GptOssSpec::from_preset(GptOssPreset::Tiny) };
    let plan = spec.plan().unwrap();
    for t in plan.writer.tensors() {
        let f32 = t.dims.len() == 1 || t.name.ends_with(".bias") || t.name.contains("ffn_gate_inp");
        assert_eq!(t.ggml_type == GgmlType::F32, f32, "{}", t.name);
    }
}

/// The harmony template from the file renders a conversation, and brink's tokenizer (gpt-4o
/// pre-tokenizer) reads each harmony marker as one special token.
#[test]
fn harmony_template_renders_and_tokenizes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write(&GptOssSpec::from_preset(GptOssPreset::Tiny), &path);
    let file = GgufFile::open(&path).unwrap();
    let template = ChatTemplate::from_gguf(file.metadata()).unwrap().expect("a chat template");
    let tokenizer = Tokenizer::from_gguf(file.metadata()).unwrap();
    assert_eq!(tokenizer.pre_tokenizer(), Some("gpt-4o"));
    let messages = json!([
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]);
    let text = render(&template, &messages);
    assert!(text.starts_with("<|start|>system<|message|>"), "{text}");
    assert!(text.ends_with("<|start|>assistant"), "{text}");
    let ids = tokenizer.encode(&text, false, true).unwrap();
    let id = |t: &str| tokenizer.token_id(t).unwrap_or_else(|| panic!("{t}"));
    let count = |t: &str| ids.iter().filter(|&&i| i == id(t)).count();
    assert_eq!(count(gpt_oss::START), 4, "system, developer, user, assistant: {ids:?}");
    assert_eq!(count(gpt_oss::MESSAGE), 3);
    assert_eq!(count(gpt_oss::END), 3);
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
}

fn render(template: &ChatTemplate, messages: &Json) -> String {
    let messages = messages.as_array().unwrap();
    template.render(messages, None, true).unwrap_or_else(|e| panic!("{e}"))
}

/// gpt-oss's file as gguf-py reads it: the same keys, tensors, types and shapes, and MXFP4 expert
/// data that gguf-py's dequantizer decodes to brink's values bit for bit.
#[test]
fn gguf_py_reads_tiny_alike() {
    let ok = Command::new("python3").args(["-c", "import gguf, numpy"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with the `gguf` package (pip install 'gguf>=0.17,<1') is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the gguf-py read of the synthetic gpt-oss model: {msg}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let spec = GptOssSpec::from_preset(GptOssPreset::Tiny);
    write(&spec, &path);
    const PY: &str = r#"
import json, sys
import numpy as np
import gguf
r = gguf.GGUFReader(sys.argv[1])
arch = r.fields["general.architecture"]
out = {
    "arch": bytes(arch.parts[arch.data[0]]).decode(),
    "keys": sorted(k for k in r.fields if not k.startswith("GGUF.")),
    "tensors": [[t.name, [int(d) for d in t.shape], t.tensor_type.name] for t in r.tensors],
}
t = next(t for t in r.tensors if t.name == "blk.1.ffn_down_exps.weight")
x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
out["down_exps_f32_hex"] = x[:4096].tobytes().hex()
print(json.dumps(out))
"#;
    let out = Command::new("python3").args(["-c", PY]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let py: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(py["arch"], "gpt-oss");

    let file = GgufFile::open(&path).unwrap();
    let mut ours: Vec<String> = file.metadata().iter().map(|(k, _)| k.to_string()).collect();
    ours.sort();
    let theirs: Vec<String> = py["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_string()).collect();
    assert_eq!(ours, theirs);
    let tensors = py["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), file.tensors().len());
    for (t, theirs) in file.tensors().iter().zip(tensors) {
        assert_eq!(theirs[0], t.name(), "tensor order");
        let dims: Vec<u64> = theirs[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(dims, t.dims(), "{}", t.name());
        assert_eq!(theirs[2].as_str().unwrap().to_ascii_lowercase(), t.ggml_type().name().to_ascii_lowercase(), "{}", t.name());
    }
    // The first 4,096 values of an MXFP4 expert tensor, decoded by gguf-py and by brink.
    let bytes = read_tensor(&file, "blk.1.ffn_down_exps.weight");
    let mut x = vec![0f32; bytes.len() / 17 * 32];
    TensorType::MXFP4.dequantize_rows(&bytes, spec.shape.expert_ffn as usize, &mut x).unwrap();
    let ours: String = x[..4096].iter().flat_map(|v| v.to_le_bytes()).map(|b| format!("{b:02x}")).collect();
    assert!(ours == py["down_exps_f32_hex"].as_str().unwrap(), "gguf-py decodes the MXFP4 experts differently");
}

/// brink's gpt-oss architecture reads the tiny file's layers as planned: the even layer
/// windowed, the odd one full, sinks and biases on both.
#[test]
fn brink_reads_the_layer_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let spec = GptOssSpec::from_preset(GptOssPreset::Tiny);
    write(&spec, &path);
    let config = brink_engine::arch::config(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!((config.arch.as_str(), config.layers, config.hidden), ("gpt-oss", 2, 320));
    let windows: Vec<Option<u32>> = config.layer_specs.iter().map(|l| l.attention.window).collect();
    assert_eq!(windows, [Some(spec.shape.sliding_window), None]);
    assert!(config.layer_specs.iter().all(|l| l.attention.sinks && l.attention.biases && l.ffn.biases));
    assert_eq!(spec.shape.is_windowed(0), windows[0].is_some());
}
