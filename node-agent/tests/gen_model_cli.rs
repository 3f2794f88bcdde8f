//! `brink-agent gen-model` as a user runs it: it writes a model our reader opens, says what it
//! wrote, writes the same bytes twice, writes gpt-oss with `--arch gpt-oss`, and refuses unknown
//! architectures, types, presets (for the architecture) and bad shapes with an error naming the
//! flag.

use std::process::Command;

use brink_engine::gguf::{GgmlType, GgufFile};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_brink-agent"))
}

#[test]
fn writes_the_model_it_describes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let args = ["gen-model", "--arch", "qwen3moe", "--preset", "tiny", "--type", "q4_0", "--layers", "3", "--experts", "8", "--out"];
    let out = agent().args(args).arg(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.metadata().get_u32("qwen3moe.block_count").unwrap(), 3);
    assert_eq!(file.metadata().get_u32("qwen3moe.expert_count").unwrap(), 8);
    assert_eq!(file.require_tensor("blk.2.ffn_up_exps.weight").unwrap().dims(), [256, 256, 8]);
    assert_eq!(file.require_tensor("blk.2.ffn_up_exps.weight").unwrap().ggml_type(), GgmlType::Q4_0);
    let bytes = std::fs::metadata(&path).unwrap().len();
    assert!(stdout.contains(&format!("{bytes} bytes")), "{stdout}");
    assert!(stdout.contains("MB/s") && stdout.contains("parameters"), "{stdout}");

    let again = dir.path().join("again.gguf");
    assert!(agent().args(args).arg(&again).status().unwrap().success());
    assert!(std::fs::read(&path).unwrap() == std::fs::read(&again).unwrap(), "same flags, different bytes");
    let seeded = dir.path().join("seeded.gguf");
    assert!(agent().args(args).arg(&seeded).args(["--seed", "9"]).status().unwrap().success());
    assert!(std::fs::read(&path).unwrap() != std::fs::read(&seeded).unwrap(), "--seed changed nothing");
}

#[test]
fn writes_a_gpt_oss_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt-oss.gguf");
    let args = ["gen-model", "--arch", "gpt-oss", "--preset", "tiny", "--layers", "3", "--sliding-window", "64", "--out"];
    let out = agent().args(args).arg(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.architecture().unwrap(), "gpt-oss");
    assert_eq!(file.metadata().get_u32("gpt-oss.block_count").unwrap(), 3);
    assert_eq!(file.metadata().get_u32("gpt-oss.attention.sliding_window").unwrap(), 64);
    // MXFP4 experts by default, as the published gpt-oss files.
    assert_eq!(file.require_tensor("blk.2.ffn_up_exps.weight").unwrap().ggml_type(), GgmlType::MXFP4);
    assert_eq!(file.require_tensor("blk.2.attn_sinks.weight").unwrap().ggml_type(), GgmlType::F32);
    let bytes = std::fs::metadata(&path).unwrap().len();
    assert!(stdout.contains(&format!("{bytes} bytes")), "{stdout}");
}

#[test]
fn bad_flags_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("bad.gguf");
    let out = out_path.to_str().unwrap();
    let base = ["gen-model", "--out", out];
    for (extra, needles) in [
        (vec!["--arch", "llama"], vec!["--arch", "llama", "qwen3moe", "gpt-oss"]),
        (vec!["--arch", "gpt-oss", "--preset", "demo"], vec!["--preset", "demo", "gpt-oss", "tiny", "gpt-oss-20b", "gpt-oss-120b"]),
        (vec!["--arch", "qwen3moe", "--preset", "gpt-oss-20b"], vec!["--preset", "gpt-oss-20b", "qwen3moe", "qwen3-30b-a3b"]),
        (vec!["--arch", "qwen3moe", "--sliding-window", "64"], vec!["--sliding-window", "gpt-oss"]),
        (vec!["--arch", "gpt-oss", "--sliding-window", "0"], vec!["--sliding-window 0"]),
        (vec!["--arch", "gpt-oss", "--type", "q4_K"], vec!["--hidden", "token_embd.weight", "q4_K"]),
        (vec!["--arch", "qwen3moe", "--type", "q3_K"], vec!["--type", "q3_K", "k-mix"]),
        (vec!["--arch", "qwen3moe", "--preset", "huge"], vec!["--preset", "huge", "qwen3-30b-a3b"]),
        (vec!["--arch", "qwen3moe", "--kv-heads", "3"], vec!["--kv-heads 3"]),
        (vec!["--arch", "qwen3moe", "--top-k", "0"], vec!["--top-k 0"]),
        (vec!["--arch", "qwen3moe", "--vocab", "10"], vec!["--vocab 10"]),
        (vec!["--arch", "qwen3moe", "--type", "q4_K", "--expert-ffn", "100"], vec!["--expert-ffn", "blk.0.ffn_down_exps.weight", "q4_K"]),
        (vec!["--arch", "qwen3moe", "--hidden", "many"], vec!["--hidden"]),
    ] {
        let o = agent().args(base).args(&extra).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?} succeeded");
        for needle in needles {
            assert!(err.contains(needle), "{extra:?}: {needle:?} not in {err}");
        }
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
        assert!(!out_path.exists(), "{extra:?} left a file");
    }
    assert_eq!(dir.path().read_dir().unwrap().count(), 0, "a partial file was left behind");
}
