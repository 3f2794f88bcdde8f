#!/usr/bin/env python3
"""llama.cpp as the reference for brink's parity tests (through llama-cpp-python==0.3.36).

Runs llama.cpp on the CPU (2 threads, no flash attention, KV cache in llama.cpp's default f16,
seed 0, no weight repacking: see no_repack_model_params) and prints one JSON object on stdout.
Nothing is sampled: every token is the argmax of the logits (ties go to the lowest id), and
generation never stops early (not even at an end-of-generation token), so the output is a pure
function of the model file and the arguments.

Modes and their JSON (keys are stable; the parity tests depend on them):

  --model F --prompt TEXT [--n-predict N] [--no-bos] [--parse-special] [--no-logits]
    {"model": str, "llama_cpp_version": str, "system_info": str, "n_vocab": int, "prompt": str,
     "add_bos": bool, "parse_special": bool,
     "prompt_tokens": [int],          # the prompt as llama.cpp tokenizes it
     "tokens": [int],                 # N greedy tokens
     "text": str,                     # their detokenized text (invalid UTF-8 replaced by U+FFFD;
                                      # control tokens rendered, as with special=True)
     "logits": [[float]]}             # N rows of n_vocab: logits[i] is the row tokens[i] is the
                                      # argmax of: logits[0] at the last prompt position,
                                      # logits[i] at the position of tokens[i-1]
                                      # (omitted with --no-logits)

  --model F --prompt TEXT --tokenize-only [--no-bos] [--parse-special]
    the same without "tokens", "text" and "logits" (the model's weights are not loaded)

  --model F --tokenize JSON_LIST_OF_STRINGS [--no-bos]
    {"model": str, "llama_cpp_version": str, "system_info": str, "n_vocab": int, "add_bos": bool,
     "results": [{"text": str,
                  "tokens": [int],                 # special-token text is plain text
                  "tokens_parse_special": [int]}]} # special-token text becomes its token

system_info: llama.cpp's build features ("AVX2 = 1 | ..."): the parity tests check the build is
the x86-64 AVX2 one brink mirrors (scripts/test builds it so).

--no-bos: do not add the BOS token even if the model asks for it (tokenizer.ggml.add_bos_token;
brink's synthetic models set it to false, so it changes nothing there).

Errors (a model llama.cpp cannot load, a bad argument) go to stderr with exit status 1 or 2.
"""

import argparse
import json
import os
import sys


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="GGUF file")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prompt", help="text to tokenize and continue")
    mode.add_argument("--tokenize", help="JSON list of strings to tokenize")
    p.add_argument("--n-predict", type=int, default=32, help="greedy tokens to generate (default 32)")
    p.add_argument("--tokenize-only", action="store_true", help="only tokenize --prompt")
    p.add_argument("--no-bos", action="store_true", help="never add a BOS token")
    p.add_argument("--parse-special", action="store_true", help="special-token text in the prompt becomes its token")
    p.add_argument("--no-logits", action="store_true", help="leave the logits out of the output")
    p.add_argument("--n-ctx", type=int, default=0, help="context size (default: prompt + n-predict)")
    args = p.parse_args(argv)
    if args.n_predict < 1:
        p.error("--n-predict must be at least 1")
    if args.tokenize is not None:
        try:
            texts = json.loads(args.tokenize)
        except json.JSONDecodeError as e:
            p.error(f"--tokenize: not JSON: {e}")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            p.error("--tokenize: expected a JSON list of strings")
        args.texts = texts
    return args


# llama.cpp's matmul paths, pinned to the ones brink's CPU backend mirrors bit for bit
# (engine/src/ggml_cpu/quant_dot.rs): with these two switches every quantized matmul of an x86-64
# AVX2 build is ggml_vec_dot_* or llamafile's sgemm, which compute the same lanes.
#
# - GGML_CPU_TILED_MM=0: ggml's tiled K-quant kernel (mul_mat and per-expert mul_mat_id of 8+
#   activation rows, AVX/AVX2/AVX-512 builds) sums in its own order; off, those go to vec_dot.
#   ggml reads it once, at the first matmul: set before llama.cpp runs anything.
# - use_extra_bufts=False (no_repack_model_params): no CPU_REPACK buffer.
os.environ["GGML_CPU_TILED_MM"] = "0"


def no_repack_model_params(llama_cpp):
    """llama_model_default_params with use_extra_bufts off, for llama_cpp.Llama to load with.

    The extra buffer types (CPU_REPACK) re-lay Q4_0 and Q4_K weights of x86 AVX2 builds (rows a
    multiple of 8) for ggml's gemv/gemm kernels, with their own activation layout and summation
    order. Llama() takes no such argument, so its defaults are patched while it loads.
    """
    low = llama_cpp.llama_cpp
    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    return low, default, params


def load(model, vocab_only, n_ctx=512):
    import llama_cpp

    low, default, params = no_repack_model_params(llama_cpp)
    low.llama_model_default_params = params
    try:
        return llama_cpp.Llama(
            model_path=model,
            vocab_only=vocab_only,
            n_ctx=n_ctx,
            n_threads=2,
            n_threads_batch=2,
            # Logits of the last position of each eval only, as brink's engine computes them:
            # with logits_all llama.cpp would run the last layer and the output head over every
            # prompt row, as a batched matmul (sgemm's summation order) instead of one row's.
            logits_all=False,
            flash_attn=False,
            seed=0,
            verbose=False,
        )
    except Exception as e:  # llama-cpp-python raises ValueError with little detail; say what failed.
        print(f"llama.cpp could not load {model}: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        low.llama_model_default_params = default


def add_bos(llm, args):
    return (not args.no_bos) and bool(llm._model.add_bos_token())


def tokenize(llm, text, bos, special):
    return llm.tokenize(text.encode("utf-8"), add_bos=bos, special=special)


def header(llm, args):
    import llama_cpp

    return {
        "model": args.model,
        "llama_cpp_version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip(),
        "n_vocab": llm.n_vocab(),
    }


def run_tokenize(args):
    llm = load(args.model, vocab_only=True)
    bos = add_bos(llm, args)
    results = [
        {"text": t, "tokens": tokenize(llm, t, bos, False), "tokens_parse_special": tokenize(llm, t, bos, True)} for t in args.texts
    ]
    return {**header(llm, args), "add_bos": bos, "results": results}


def run_prompt(args):
    import numpy as np

    vocab = load(args.model, vocab_only=True)
    bos = add_bos(vocab, args)
    prompt_tokens = tokenize(vocab, args.prompt, bos, args.parse_special)
    out = {**header(vocab, args), "prompt": args.prompt, "add_bos": bos, "parse_special": args.parse_special, "prompt_tokens": prompt_tokens}
    if args.tokenize_only:
        return out
    if not prompt_tokens:
        print("the prompt tokenizes to no tokens: nothing to continue (give a non-empty prompt or drop --no-bos)", file=sys.stderr)
        sys.exit(2)
    n_ctx = args.n_ctx or len(prompt_tokens) + args.n_predict
    llm = load(args.model, vocab_only=False, n_ctx=n_ctx)
    llm.eval(prompt_tokens)
    rows, tokens = [], []
    for i in range(args.n_predict):
        # The logits of the eval's one output (its last token); llm.scores holds them only with logits_all.
        row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32, copy=True)
        token = int(np.argmax(row))  # first maximum: ties go to the lowest id
        rows.append(row)
        tokens.append(token)
        if i + 1 < args.n_predict:
            llm.eval([token])
    out["tokens"] = tokens
    out["text"] = llm.detokenize(tokens, special=True).decode("utf-8", errors="replace")
    if not args.no_logits:
        out["logits"] = [r.tolist() for r in rows]
    return out


def main(argv):
    args = parse_args(argv)
    out = run_tokenize(args) if args.tokenize is not None else run_prompt(args)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
