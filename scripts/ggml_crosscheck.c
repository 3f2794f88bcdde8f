// Runs ggml's CPU ops on deterministic inputs and dumps inputs and outputs, for
// engine/examples/ggml_crosscheck.rs to compare brink's engine::cpu with. Built and run by
// scripts/ggml-crosscheck against the ggml of a llama.cpp source tree (the one llama-cpp-python
// vendors), with the x86-64 AVX2 flags brink mirrors.
//
// Dump format, repeated: u32 name length, name, u32 kind (0 f32, 1 i32, 2 bytes), u64 count, data.
#include "ggml.h"
#include "ggml-cpu.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *out;

static void dump(const char *name, int kind, const void *data, uint64_t n, size_t elem) {
    uint32_t len = (uint32_t)strlen(name);
    fwrite(&len, 4, 1, out);
    fwrite(name, 1, len, out);
    uint32_t k = (uint32_t)kind;
    fwrite(&k, 4, 1, out);
    fwrite(&n, 8, 1, out);
    fwrite(data, elem, n, out);
}
static void dump_f32(const char *n, const float *d, uint64_t c) { dump(n, 0, d, c, 4); }
static void dump_i32(const char *n, const int32_t *d, uint64_t c) { dump(n, 1, d, c, 4); }
static void dump_u8(const char *n, const void *d, uint64_t c) { dump(n, 2, d, c, 1); }

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}
static float unif(uint64_t seed, uint64_t i) { // [-1, 1)
    return (float)((mix(seed * 0x9E3779B97F4A7C15ULL + i) >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}
static float *rnd(uint64_t seed, size_t n, float scale) {
    float *v = malloc(n * 4);
    for (size_t i = 0; i < n; i++) v[i] = unif(seed, i) * scale;
    return v;
}

static struct ggml_context *ctx_new(void) {
    struct ggml_init_params p = {.mem_size = 512u << 20, .mem_buffer = NULL, .no_alloc = false};
    return ggml_init(p);
}
static void compute(struct ggml_context *ctx, struct ggml_tensor *t, int threads) {
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, t);
    ggml_graph_compute_with_ctx(ctx, gf, threads);
}

static void check_quantize(void) {
    const int K = 2048, R = 24;
    float *x = malloc((size_t)R * K * 4);
    for (int r = 0; r < R; r++) {
        float scale = (r % 4 == 0) ? 1e-3f : (r % 4 == 1) ? 1.0f : (r % 4 == 2) ? 37.0f : 1e4f;
        for (int i = 0; i < K; i++) x[r * K + i] = unif(100 + r, i) * scale;
    }
    // Rows with exact halves: amax 127 (id = 1) and integer + 0.5 values.
    for (int i = 0; i < K; i++) x[20 * K + i] = (i % 32 == 0) ? 127.0f : (float)((int)(i % 250) - 125) + 0.5f;
    for (int i = 0; i < K; i++) x[21 * K + i] = 0.0f;
    for (int i = 0; i < K; i++) x[22 * K + i] = (i % 256 == 5) ? -3.0f : (i % 256 == 9 ? 3.0f : unif(7, i));
    dump_f32("quant.x", x, (size_t)R * K);
    const struct ggml_type_traits_cpu *q80 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0);
    const struct ggml_type_traits_cpu *q8k = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K);
    size_t b80 = ggml_row_size(GGML_TYPE_Q8_0, K), b8k = ggml_row_size(GGML_TYPE_Q8_K, K);
    uint8_t *o80 = malloc(b80 * R), *o8k = malloc(b8k * R);
    for (int r = 0; r < R; r++) {
        q80->from_float(x + r * K, o80 + r * b80, K);
        q8k->from_float(x + r * K, o8k + r * b8k, K);
    }
    dump_u8("quant.q8_0", o80, b80 * R);
    dump_u8("quant.q8_K", o8k, b8k * R);
    // The weight quantizer brink mirrors for mxfp4 (quantize_row_mxfp4_ref), on the same rows.
    size_t bmx = ggml_row_size(GGML_TYPE_MXFP4, K);
    uint8_t *omx = malloc(bmx * R);
    ggml_quantize_chunk(GGML_TYPE_MXFP4, x, omx, 0, R, K, NULL);
    dump_u8("quant.mxfp4", omx, bmx * R);
    free(x); free(o80); free(o8k); free(omx);
}

// Dense matmuls: one activation row (ggml's vec_dot), two or more (llamafile's sgemm for the
// float types and q4_0/q8_0, vec_dot for the K-quants), in shapes with sgemm's edge tiles
// (rows not a multiple of 4, tokens not a multiple of 4).
static const enum ggml_type mm_types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0,
                                          GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_MXFP4};
#define N_MM_TYPES (sizeof(mm_types) / sizeof(mm_types[0]))

static void check_matmul(void) {
    // rows, row length; the third (25 blocks of 32) for the 32-wide types, whose vec_dot may
    // pair blocks and take an odd last one apart (mxfp4).
    const int shapes[][2] = {{96, 2048}, {90, 768}, {40, 800}};
    const int ns[] = {1, 2, 3, 7, 40};
    for (size_t t = 0; t < N_MM_TYPES; t++) {
        for (size_t sh = 0; sh < 3; sh++) {
            if (sh == 2 && ggml_blck_size(mm_types[t]) != 32) continue;
            const int N = shapes[sh][0], K = shapes[sh][1];
            for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++) {
                int n = ns[c];
                struct ggml_context *ctx = ctx_new();
                float *wf = rnd(200 + t + 50 * sh, (size_t)N * K, 0.05f);
                struct ggml_tensor *w = ggml_new_tensor_2d(ctx, mm_types[t], K, N);
                ggml_quantize_chunk(mm_types[t], wf, w->data, 0, N, K, NULL);
                float *xf = rnd(300 + t * 10 + c + 1000 * sh, (size_t)n * K, 2.0f);
                struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n);
                memcpy(x->data, xf, (size_t)n * K * 4);
                struct ggml_tensor *y = ggml_mul_mat(ctx, w, x);
                compute(ctx, y, 2);
                char name[64];
                snprintf(name, sizeof name, "mm.%s.%dx%d.%d.w", ggml_type_name(mm_types[t]), N, K, n);
                dump_u8(name, w->data, ggml_nbytes(w));
                snprintf(name, sizeof name, "mm.%s.%dx%d.%d.x", ggml_type_name(mm_types[t]), N, K, n);
                dump_f32(name, xf, (size_t)n * K);
                snprintf(name, sizeof name, "mm.%s.%dx%d.%d.y", ggml_type_name(mm_types[t]), N, K, n);
                dump_f32(name, y->data, (size_t)n * N);
                free(wf); free(xf);
                ggml_free(ctx);
            }
        }
    }
}

// The routed experts' matmul (llama.cpp's build_moe_ffn): mul_mat_id of E stacked expert
// matrices with each token's top-k ids, for one token (decode) and several (prefill).
static void check_mul_mat_id(void) {
    const int E = 8, N = 64, K = 512, TOPK = 3;
    const int ns[] = {1, 6};
    for (size_t t = 0; t < N_MM_TYPES; t++) {
        for (size_t c = 0; c < 2; c++) {
            int n = ns[c];
            struct ggml_context *ctx = ctx_new();
            float *wf = rnd(700 + t, (size_t)E * N * K, 0.05f);
            struct ggml_tensor *w = ggml_new_tensor_3d(ctx, mm_types[t], K, N, E);
            ggml_quantize_chunk(mm_types[t], wf, w->data, 0, (int64_t)E * N, K, NULL);
            float *xf = rnd(800 + t * 10 + c, (size_t)n * K, 2.0f);
            struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, 1, n);
            memcpy(x->data, xf, (size_t)n * K * 4);
            struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, TOPK, n);
            int32_t *idv = ids->data;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < TOPK; j++) idv[i * TOPK + j] = (int32_t)((i * 5 + j * 3 + (i * j) % 2) % E);
            struct ggml_tensor *y = ggml_mul_mat_id(ctx, w, x, ids);  // [N, TOPK, n]
            compute(ctx, y, 2);
            char name[64];
            snprintf(name, sizeof name, "mmid.%s.%d.w", ggml_type_name(mm_types[t]), n);
            dump_u8(name, w->data, ggml_nbytes(w));
            snprintf(name, sizeof name, "mmid.%s.%d.x", ggml_type_name(mm_types[t]), n);
            dump_f32(name, xf, (size_t)n * K);
            snprintf(name, sizeof name, "mmid.%s.%d.ids", ggml_type_name(mm_types[t]), n);
            dump_i32(name, idv, (size_t)n * TOPK);
            snprintf(name, sizeof name, "mmid.%s.%d.y", ggml_type_name(mm_types[t]), n);
            dump_f32(name, y->data, (size_t)n * TOPK * N);
            free(wf); free(xf);
            ggml_free(ctx);
        }
    }
}

static void check_elementwise(void) {
    struct ggml_context *ctx = ctx_new();
    // rms_norm · w (the graph's norm), rows of 2048 and the per-head Q/K norm rows of 128
    const int W = 2048, R = 9;
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W, R);
    float *xf = rnd(1, (size_t)W * R, 3.0f);
    memcpy(x->data, xf, (size_t)W * R * 4);
    struct ggml_tensor *w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, W);
    float *wf = rnd(2, W, 1.0f);
    memcpy(w->data, wf, W * 4);
    struct ggml_tensor *y = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-6f), w);
    compute(ctx, y, 1);
    dump_f32("rms.x", xf, (size_t)W * R); dump_f32("rms.w", wf, W); dump_f32("rms.y", y->data, (size_t)W * R);

    // soft_max_ext with scale (attention-like) and plain soft_max (router)
    const int S = 257, SR = 6;
    struct ggml_tensor *s = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, S, SR);
    float *sf = rnd(3, (size_t)S * SR, 30.0f);
    memcpy(s->data, sf, (size_t)S * SR * 4);
    struct ggml_tensor *sy = ggml_soft_max_ext(ctx, s, NULL, 0.088388f, 0.0f);
    struct ggml_tensor *sr = ggml_soft_max(ctx, s);
    compute(ctx, sy, 1);
    compute(ctx, sr, 1);
    dump_f32("sm.x", sf, (size_t)S * SR); dump_f32("sm.y", sy->data, (size_t)S * SR); dump_f32("sm.router", sr->data, (size_t)S * SR);

    // swiglu_split(gate, up) and silu
    const int F = 768 * 3 + 5;
    struct ggml_tensor *g = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, F), *u = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, F);
    float *gf = rnd(4, F, 12.0f), *uf = rnd(5, F, 2.0f);
    memcpy(g->data, gf, F * 4); memcpy(u->data, uf, F * 4);
    struct ggml_tensor *sw = ggml_swiglu_split(ctx, g, u);
    compute(ctx, sw, 1);
    dump_f32("sw.g", gf, F); dump_f32("sw.u", uf, F); dump_f32("sw.y", sw->data, F);

    // NEOX rope, head_dim 128, 4 heads, positions past 2^16
    const int D = 128, H = 4, T = 8;
    int32_t pos[8] = {0, 1, 17, 4095, 65535, 65536, 70001, 200003};
    struct ggml_tensor *r = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, H, T);
    float *rf = rnd(6, (size_t)D * H * T, 2.0f);
    memcpy(r->data, rf, (size_t)D * H * T * 4);
    struct ggml_tensor *p = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
    memcpy(p->data, pos, sizeof pos);
    struct ggml_tensor *ry = ggml_rope_ext(ctx, r, p, NULL, D, GGML_ROPE_TYPE_NEOX, 0, 1000000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    compute(ctx, ry, 1);
    dump_f32("rope.x", rf, (size_t)D * H * T); dump_i32("rope.pos", pos, T); dump_f32("rope.y", ry->data, (size_t)D * H * T);

    // argsort desc on tie-heavy router-sized rows (128 experts)
    const int E = 128, AR = 40;
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, E, AR);
    float *af = malloc((size_t)E * AR * 4);
    for (int i = 0; i < E * AR; i++) af[i] = (float)(mix(77 + i) % (2 + (i / E) % 9)) * 0.25f;
    memcpy(a->data, af, (size_t)E * AR * 4);
    struct ggml_tensor *full = ggml_argsort(ctx, a, GGML_SORT_ORDER_DESC);
    compute(ctx, full, 1);
    dump_f32("as.x", af, (size_t)E * AR); dump_i32("as.y", full->data, (size_t)E * AR);
    ggml_free(ctx);
}

static void check_get_rows(void) {
    const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                    GGML_TYPE_Q6_K, GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_MXFP4};
    const int K = 512, V = 10;
    int32_t ids[5] = {9, 0, 3, 3, 7};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        struct ggml_context *ctx = ctx_new();
        float *wf = rnd(400 + t, (size_t)V * K, 0.5f);
        struct ggml_tensor *w = ggml_new_tensor_2d(ctx, types[t], K, V);
        ggml_quantize_chunk(types[t], wf, w->data, 0, V, K, NULL);
        struct ggml_tensor *i = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 5);
        memcpy(i->data, ids, sizeof ids);
        struct ggml_tensor *y = ggml_get_rows(ctx, w, i);
        compute(ctx, y, 1);
        char name[64];
        snprintf(name, sizeof name, "gr.%s.w", ggml_type_name(types[t]));
        dump_u8(name, w->data, ggml_nbytes(w));
        snprintf(name, sizeof name, "gr.%s.y", ggml_type_name(types[t]));
        dump_f32(name, y->data, (size_t)5 * K);
        free(wf);
        ggml_free(ctx);
    }
    dump_i32("gr.ids", ids, 5);
}

// llama.cpp's non-flash-attention path: kq = mul_mat(K, Q); soft_max_ext(kq, mask, scale);
// kqv = mul_mat(Vᵀ, kq), with an f16 K cache and a transposed f16 V cache.
// gpt-oss's layers add a sliding window (llama.cpp's standard SWA: key j masked for query p when
// p - j >= window; 0 for none) and per-head sinks (ggml_soft_max_add_sinks). cellpos: the
// position each of the n_pos cells holds (-1: empty), as llama.cpp's SWA cache reuses cells;
// NULL: cell j holds position j.
static void attention_case(const char *tag, int n_q, const int *qpos, int n_pos, int d, int window, int sinks, const int *cellpos) {
    const int n_head = 8, n_kv = 2;
    struct ggml_context *ctx = ctx_new();
    float *qf = rnd(500 + n_q, (size_t)n_q * n_head * d, 3.0f);
    float *kf = rnd(501 + n_q, (size_t)n_pos * n_kv * d, 3.0f);
    float *vf = rnd(502 + n_q, (size_t)n_pos * n_kv * d, 1.0f);
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, n_head, n_q);
    memcpy(q->data, qf, ggml_nbytes(q));
    struct ggml_tensor *k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, n_kv, n_pos);
    ggml_fp32_to_fp16_row(kf, k->data, (int64_t)n_pos * n_kv * d);
    struct ggml_tensor *vt = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, n_pos, d, n_kv);
    ggml_fp16_t *vtd = vt->data;
    for (int j = 0; j < n_pos; j++)
        for (int h = 0; h < n_kv; h++)
            for (int c = 0; c < d; c++) vtd[((size_t)h * d + c) * n_pos + j] = ggml_fp32_to_fp16(vf[((size_t)j * n_kv + h) * d + c]);
    struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_pos, n_q);
    float *m = mask->data;
    for (int i = 0; i < n_q; i++)
        for (int j = 0; j < n_pos; j++) {
            int pj = cellpos ? cellpos[j] : j;
            m[i * n_pos + j] = pj >= 0 && pj <= qpos[i] && !(window > 0 && qpos[i] - pj >= window) ? 0.0f : -INFINITY;
        }
    float *sf = rnd(503 + n_q, n_head, 4.0f);
    struct ggml_tensor *sk = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n_head);
    memcpy(sk->data, sf, n_head * 4);
    struct ggml_tensor *qp = ggml_permute(ctx, q, 0, 2, 1, 3);
    struct ggml_tensor *kp = ggml_permute(ctx, k, 0, 2, 1, 3);
    struct ggml_tensor *kq = ggml_mul_mat(ctx, kp, qp);
    kq = ggml_soft_max_ext(ctx, kq, mask, 1.0f / sqrtf((float)d), 0.0f);
    if (sinks) ggml_soft_max_add_sinks(kq, sk);
    struct ggml_tensor *kqv = ggml_mul_mat(ctx, vt, kq);
    struct ggml_tensor *o = ggml_cont(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3));
    compute(ctx, o, 1);
    ggml_fp16_t *vh = malloc((size_t)n_pos * n_kv * d * 2);
    ggml_fp32_to_fp16_row(vf, vh, (int64_t)n_pos * n_kv * d);
    char name[64];
    snprintf(name, sizeof name, "att.%s.q", tag); dump_f32(name, qf, (size_t)n_q * n_head * d);
    snprintf(name, sizeof name, "att.%s.k", tag); dump_u8(name, k->data, ggml_nbytes(k));
    snprintf(name, sizeof name, "att.%s.v", tag); dump_u8(name, vh, (size_t)n_pos * n_kv * d * 2);
    snprintf(name, sizeof name, "att.%s.pos", tag); dump_i32(name, qpos, n_q);
    snprintf(name, sizeof name, "att.%s.out", tag); dump_f32(name, o->data, (size_t)n_q * n_head * d);
    if (sinks) { snprintf(name, sizeof name, "att.%s.sinks", tag); dump_f32(name, sf, n_head); }
    if (cellpos) { snprintf(name, sizeof name, "att.%s.cells", tag); dump_i32(name, cellpos, n_pos); }
    free(qf); free(kf); free(vf); free(vh); free(sf);
    ggml_free(ctx);
}

// llama.cpp's non-flash-attention path: kq = mul_mat(K, Q); soft_max_ext(kq, mask, scale);
// kqv = mul_mat(Vᵀ, kq), with an f16 K cache and a transposed f16 V cache, over a KV length
// padded to 256 as llama.cpp's cache is.
static void check_attention(void) {
    const int prefill[5] = {195, 196, 197, 198, 199};
    const int decode[1] = {200};
    attention_case("prefill", 5, prefill, 256, 128, 0, 0, NULL);
    attention_case("decode", 1, decode, 256, 128, 0, 0, NULL);
    // gpt-oss (head_dim 64, window 128): queries at the window's edge (127 is the last to see
    // key 0, 128 the first not to, 129 the next), past the first window with the first visible
    // key inside a vector of 8 (200: keys 73..200), and the last; with and without sinks.
    const int edge[8] = {126, 127, 128, 129, 130, 200, 254, 255};
    const int edge_decode[1] = {129}, far_decode[1] = {250};
    attention_case("swa-prefill", 8, edge, 256, 64, 128, 1, NULL);
    attention_case("swa-decode", 1, edge_decode, 256, 64, 128, 1, NULL);
    attention_case("swa-decode-far", 1, far_decode, 256, 64, 128, 1, NULL);
    attention_case("swa-nosink", 8, edge, 256, 64, 128, 0, NULL);
    attention_case("sink-full", 8, edge, 256, 64, 0, 1, NULL);
    // A wrapped SWA cache: positions 100..255 in cells 100..255, 256..352 in cells 0..96,
    // cells 97..99 empty; 230 sees cells 103..230, 340..352 see cells on both sides of the wrap.
    int ring[256];
    for (int c = 0; c < 256; c++) ring[c] = c < 97 ? c + 256 : c < 100 ? -1 : c;
    const int ring_q[5] = {230, 340, 350, 351, 352}, ring_decode[1] = {352};
    attention_case("swa-ring", 5, ring_q, 256, 64, 128, 1, ring);
    attention_case("swa-ring-decode", 1, ring_decode, 256, 64, 128, 1, ring);
}

// gpt-oss's other ops: soft_max_ext with sinks on rows of 257 (vectors and a libm tail), YaRN
// NEOX RoPE, ggml_swiglu_oai, ggml_add_id, and the softmax-weight gating of build_moe_ffn.
static void check_gpt_oss(void) {
    struct ggml_context *ctx = ctx_new();
    const int S = 257, SR = 3, SH = 4;
    struct ggml_tensor *s = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, S, SR, SH);
    float *sf = rnd(900, (size_t)S * SR * SH, 30.0f);
    memcpy(s->data, sf, ggml_nbytes(s));
    // One sink above every scaled logit (it sets the max), the others inside the range.
    float sinks[4] = {-1.5f, 0.25f, 40.0f, 2.0f};
    struct ggml_tensor *sk = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, SH);
    memcpy(sk->data, sinks, sizeof sinks);
    struct ggml_tensor *sy = ggml_soft_max_ext(ctx, s, NULL, 0.125f, 0.0f);
    ggml_soft_max_add_sinks(sy, sk);
    compute(ctx, sy, 1);
    dump_f32("sink.x", sf, (size_t)S * SR * SH); dump_f32("sink.sinks", sinks, SH); dump_f32("sink.y", sy->data, (size_t)S * SR * SH);

    // YaRN as gpt-oss runs it (64 dims, base 150000, factor 32 over 4096, ext_factor 1), and
    // other parameters (attn_factor, betas, n_ctx_orig) whose correction dims differ.
    const int D = 64, H = 4, T = 9;
    int32_t pos[9] = {0, 1, 127, 128, 129, 4095, 4096, 65536, 131071};
    struct ggml_tensor *r = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, H, T);
    float *rf = rnd(901, (size_t)D * H * T, 2.0f);
    memcpy(r->data, rf, ggml_nbytes(r));
    struct ggml_tensor *p = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
    memcpy(p->data, pos, sizeof pos);
    struct ggml_tensor *y1 = ggml_rope_ext(ctx, r, p, NULL, D, GGML_ROPE_TYPE_NEOX, 4096, 150000.0f, 1.0f / 32.0f, 1.0f, 1.0f, 32.0f, 1.0f);
    struct ggml_tensor *y2 = ggml_rope_ext(ctx, r, p, NULL, D, GGML_ROPE_TYPE_NEOX, 8192, 10000.0f, 0.25f, 1.0f, 0.8f, 24.0f, 2.0f);
    compute(ctx, y1, 1);
    compute(ctx, y2, 1);
    dump_f32("yarn.x", rf, (size_t)D * H * T); dump_i32("yarn.pos", pos, T);
    dump_f32("yarn.y1", y1->data, (size_t)D * H * T); dump_f32("yarn.y2", y2->data, (size_t)D * H * T);

    // swiglu_oai over values reaching past both clamps
    const int F = 2880 + 5;
    struct ggml_tensor *g = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, F), *u = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, F);
    float *gf = rnd(902, F, 12.0f), *uf = rnd(903, F, 10.0f);
    memcpy(g->data, gf, F * 4); memcpy(u->data, uf, F * 4);
    struct ggml_tensor *so = ggml_swiglu_oai(ctx, g, u, 1.702f, 7.0f);
    compute(ctx, so, 1);
    dump_f32("oai.g", gf, F); dump_f32("oai.u", uf, F); dump_f32("oai.y", so->data, F);

    // Router: logits + bias, top 4 of 32 by argsort, softmax over the 4; one row of ties.
    const int E = 32, K = 4, N = 6, W = 40;
    struct ggml_tensor *lg = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, E, N);
    float *lf = rnd(904, (size_t)E * N, 5.0f);
    for (int e = 0; e < E; e++) lf[5 * E + e] = (float)(e % 3) * 0.5f;
    memcpy(lg->data, lf, ggml_nbytes(lg));
    struct ggml_tensor *lb = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, E);
    float *lbf = rnd(905, E, 1.0f);
    for (int e = 0; e < E; e++) if (e % 3 == 2) lbf[e] = 0.0f;  // keeps the last row's ties
    memcpy(lb->data, lbf, E * 4);
    struct ggml_tensor *probs = ggml_add(ctx, lg, lb);
    struct ggml_tensor *sel = ggml_argsort_top_k(ctx, probs, K);
    struct ggml_tensor *wts = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, E, N), sel);
    wts = ggml_soft_max(ctx, ggml_reshape_2d(ctx, wts, K, N));
    struct ggml_tensor *selc = ggml_cont(ctx, sel);
    compute(ctx, wts, 1);
    compute(ctx, selc, 1);
    dump_f32("route.logits", lf, (size_t)E * N); dump_f32("route.bias", lbf, E);
    dump_i32("route.experts", selc->data, (size_t)K * N); dump_f32("route.weights", wts->data, (size_t)K * N);

    // add_id: [W, K, N] expert outputs plus the picked experts' bias rows [W, E]
    struct ggml_tensor *a = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, W, K, N);
    float *af = rnd(906, (size_t)W * K * N, 3.0f);
    memcpy(a->data, af, ggml_nbytes(a));
    struct ggml_tensor *b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W, E);
    float *bf = rnd(907, (size_t)W * E, 1.0f);
    memcpy(b->data, bf, ggml_nbytes(b));
    struct ggml_tensor *ai = ggml_add_id(ctx, a, b, selc);
    compute(ctx, ai, 1);
    dump_f32("addid.a", af, (size_t)W * K * N); dump_f32("addid.b", bf, (size_t)W * E); dump_f32("addid.y", ai->data, (size_t)W * K * N);
    free(sf); free(rf); free(gf); free(uf); free(lf); free(lbf); free(af); free(bf);
    ggml_free(ctx);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DUMP_FILE\n", argv[0]);
        return 2;
    }
    out = fopen(argv[1], "wb");
    if (!out) {
        perror(argv[1]);
        return 1;
    }
    ggml_cpu_init();
    check_quantize();
    check_matmul();
    check_mul_mat_id();
    check_elementwise();
    check_get_rows();
    check_attention();
    check_gpt_oss();
    fclose(out);
    return 0;
}
