//! Prefix reuse through the paged KV cache, end to end on the CPU backend: a sequence whose
//! block table shares another's first full blocks computes only its own positions, reading the
//! shared prefix's K/V from the other's blocks, and gets bit for bit the logits of the sequence
//! that computed the whole prompt. The tables are scrambled (not slot-contiguous, not ascending),
//! and a control shows the shared blocks are really read: the same positions over fresh, never
//! written blocks give different logits.

use std::path::{Path, PathBuf};

use brink_engine::backend::Logits;
use brink_engine::backend::cpu::CpuBackend;
use brink_engine::synth::{self, Preset, SynthSpec};
use brink_engine::{Engine, EngineOptions, StepItem};

const BLOCK: usize = 16;

fn tiny(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &path, |_, _| {}).unwrap();
    path
}

/// Deterministic prompt tokens below `vocab`.
fn prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

fn engine(path: &Path) -> Engine<CpuBackend> {
    // 4 sequences of 256 positions: 64 blocks of 16.
    let opts = EngineOptions { context: 256, slots: 4, prefill_chunk: 48, block_size: BLOCK, full_window_kv: false, rings: 0 };
    let e = Engine::load(path, CpuBackend::new(), opts).unwrap();
    assert_eq!((e.total_blocks(), e.block_size()), (64, BLOCK));
    e
}

/// A's table, B's fresh blocks and a control's, all disjoint and out of order.
const A: [u32; 8] = [37, 2, 60, 11, 45, 8, 23, 63];
const B_OWN: [u32; 4] = [0, 51, 19, 30];
const FRESH: [u32; 8] = [12, 40, 5, 58, 33, 26, 49, 17];

#[test]
fn a_shared_prefix_is_read_not_recomputed_and_gives_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    // A prompt that ends exactly on a block boundary, and one that ends inside a block.
    for (len, shared) in [(96usize, 5usize), (101, 6), (40, 1)] {
        let mut e = engine(&model);
        let vocab = e.config().vocab;
        let p = prompt(len, vocab);
        let split = shared * BLOCK;
        // A computes the whole prompt (in chunks of 48) through its scrambled table.
        let want = e.prefill_blocks(&A, 0, &p, Logits::Last).unwrap();
        // So does a fresh engine through slot 0's contiguous blocks: the paging changes nothing.
        let whole = engine(&model).prefill(0, 0, &p, Logits::Last).unwrap();
        assert!(whole == want, "prompt of {len}: a scrambled table's prefill differs from a fresh contiguous one");
        // B shares A's first `shared` blocks and computes only from `split`.
        let b: Vec<u32> = A[..shared].iter().chain(&B_OWN).copied().collect();
        let got = e.prefill_blocks(&b, split, &p[split..], Logits::Last).unwrap();
        assert_eq!(got.len(), vocab);
        assert!(got == want, "prompt of {len}, {shared} shared blocks: B's logits differ from a full prefill's");
        // Decoding continues identically over the shared and the own blocks.
        let next = argmax(&want);
        let step = |e: &mut Engine<CpuBackend>, table: &[u32]| {
            e.step(&[StepItem { blocks: table, start_pos: len as u32, tokens: &[next], logits: Logits::Last }]).unwrap()
        };
        let (da, db) = (step(&mut e, &A), step(&mut e, &b));
        assert!(da == db, "prompt of {len}: the decode step after reuse differs");
        // Control: the same positions over blocks nobody wrote read other keys.
        let control = e.prefill_blocks(&FRESH, split, &p[split..], Logits::Last).unwrap();
        assert!(control != want, "prompt of {len}: logits do not depend on the prefix blocks: the test could not fail");
    }
}

/// Two sequences stepped in one batch, one over a shared prefix, match the same sequences
/// stepped alone.
#[test]
fn a_batch_mixing_a_reused_prefix_and_a_fresh_prompt_matches_each_alone() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let mut e = engine(&model);
    let vocab = e.config().vocab;
    let p = prompt(64, vocab);
    let q = prompt(33, vocab / 2);
    e.prefill_blocks(&A, 0, &p[..32], Logits::None).unwrap();
    let b: Vec<u32> = A[..2].iter().chain(&B_OWN).copied().collect();
    let alone_b = e.prefill_blocks(&b, 32, &p[32..], Logits::Last).unwrap();
    let alone_c = e.prefill_blocks(&FRESH, 0, &q, Logits::Last).unwrap();
    let both = e
        .step(&[
            StepItem { blocks: &b, start_pos: 32, tokens: &p[32..], logits: Logits::Last },
            StepItem { blocks: &FRESH, start_pos: 0, tokens: &q, logits: Logits::Last },
        ])
        .unwrap();
    assert!(both[..vocab] == alone_b[..] && both[vocab..] == alone_c[..], "batched rows differ from the same rows alone");
}

#[test]
fn bad_block_tables_are_request_errors_naming_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(&tiny(dir.path()));
    let p = prompt(40, e.config().vocab);
    let short = e.prefill_blocks(&A[..2], 0, &p, Logits::Last).unwrap_err().to_string();
    assert!(short.contains("positions 0..40 need 3 KV blocks of 16, the block table has 2"), "{short}");
    let outside = e.prefill_blocks(&[1, 64, 2], 0, &p, Logits::Last).unwrap_err().to_string();
    assert!(outside.contains("entry 1 is block 64, but the KV cache holds 64 blocks"), "{outside}");
    let long = e.prefill_blocks(&A, 250, &p[..7], Logits::Last).unwrap_err().to_string();
    assert!(long.contains("positions 250..257 exceed the context of 256 tokens"), "{long}");
    let slot = e.prefill(4, 0, &p, Logits::Last).unwrap_err().to_string();
    assert!(slot.contains("slot 4 out of range"), "{slot}");
    // The fixed per-slot tables tile the cache.
    assert_eq!(e.slot_blocks(3), (48..64).collect::<Vec<u32>>());
    assert!(e.slot_blocks(4).is_empty());
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best }).0 as u32
}
