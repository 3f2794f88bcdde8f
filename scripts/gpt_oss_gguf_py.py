#!/usr/bin/env python3
"""Writes a tiny gpt-oss GGUF with gguf-py's own writer (GGUFWriter, gguf.quants), not brink's:
the parity test's model that no brink code wrote (engine/tests/llama_parity_gpt_oss.rs).

The shape is gpt-oss's in miniature: 2 layers (layer 0 windowed, llama.cpp's pattern 2), Q wider
than the hidden state, GQA, per-head sinks, Q/K/V/O biases, a biased router and biased experts,
YaRN, MXFP4 experts and q8_0 attention, embedding and output; norms, biases, sinks and the router
F32, as llama.cpp's converter writes them. Random values (numpy, --seed) scaled so activations
stay O(1). The tokenizer is copied from --vocab-from (any GGUF with a BPE vocabulary: the test
passes brink's synthetic qwen3moe, whose gpt2-style vocabulary llama.cpp loads for any
architecture).

usage: gpt_oss_gguf_py.py --out FILE --vocab-from GGUF [--seed N] [--window W]
"""

import argparse
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

ARCH = "gpt-oss"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 128, 4, 2, 64
EXPERTS, TOP_K, FFN = 8, 2, 128
LAYERS, CONTEXT = 2, 2048


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-from", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=32, help="attention.sliding_window (default 32)")
    return p.parse_args(argv)


def copy_tokenizer(src, w):
    """Every tokenizer.* key of src, with its type; returns the vocabulary size."""
    r = gguf.GGUFReader(src)
    n_vocab = None
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[1])
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            w.add_key_value(key, value, vtype)
    if n_vocab is None:
        sys.exit(f"{src} has no tokenizer.ggml.tokens")
    return n_vocab


def main(argv):
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    w = gguf.GGUFWriter(args.out, ARCH)
    w.add_name("gguf-py gpt-oss fixture")
    n_vocab = copy_tokenizer(args.vocab_from, w)
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_expert_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(64)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_sliding_window(args.window)

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def quant(name, values, qtype):
        w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    def f32(name, values):
        w.add_tensor(name, values.astype(np.float32))

    # numpy shapes are ggml's dims reversed: a [ne0, ne1, ne2] tensor is (ne2, ne1, ne0).
    quant("token_embd.weight", normal((n_vocab, HIDDEN), 1.0), Q.Q8_0)
    q_w, kv_w = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        b = f"blk.{i}."
        f32(b + "attn_norm.weight", 1.0 + normal((HIDDEN,), 0.1))
        for name, rows in (("attn_q", q_w), ("attn_k", kv_w), ("attn_v", kv_w)):
            quant(b + name + ".weight", normal((rows, HIDDEN), HIDDEN**-0.5), Q.Q8_0)
            f32(b + name + ".bias", normal((rows,), 0.1))
        quant(b + "attn_output.weight", normal((HIDDEN, q_w), q_w**-0.5), Q.Q8_0)
        f32(b + "attn_output.bias", normal((HIDDEN,), 0.1))
        f32(b + "attn_sinks.weight", normal((HEADS,), 1.0))
        f32(b + "post_attention_norm.weight", 1.0 + normal((HIDDEN,), 0.1))
        f32(b + "ffn_gate_inp.weight", normal((EXPERTS, HIDDEN), HIDDEN**-0.5))
        f32(b + "ffn_gate_inp.bias", normal((EXPERTS,), 0.1))
        quant(b + "ffn_gate_exps.weight", normal((EXPERTS, FFN, HIDDEN), HIDDEN**-0.5), Q.MXFP4)
        quant(b + "ffn_up_exps.weight", normal((EXPERTS, FFN, HIDDEN), HIDDEN**-0.5), Q.MXFP4)
        quant(b + "ffn_down_exps.weight", normal((EXPERTS, HIDDEN, FFN), FFN**-0.5), Q.MXFP4)
        f32(b + "ffn_gate_exps.bias", normal((EXPERTS, FFN), 0.1))
        f32(b + "ffn_up_exps.bias", normal((EXPERTS, FFN), 0.1))
        f32(b + "ffn_down_exps.bias", normal((EXPERTS, HIDDEN), 0.1))
    f32("output_norm.weight", 1.0 + normal((HIDDEN,), 0.1))
    quant("output.weight", normal((n_vocab, HIDDEN), 2.0 * HIDDEN**-0.5), Q.Q8_0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1:])
