//! Which token counts to test: derived from the model shape, the serving envelope and the
//! device's limits, never chosen by hand.
//!
//! Each kernel module lists the counts its own launch plan makes critical (index overflow
//! points of its flattened buffers, tile tails). This module adds what is common to all of
//! them: where a *naive* launch would put a growing index on `grid.y/z` (the first failure of
//! the design: `tokens x top_k` on `grid.z` dies at `floor(65535 / top_k) + 1`), the serving
//! envelope and context `-1, 0, +1`, and the batch compositions (several sequences, prefill
//! mixed with decode) whose totals hit each count.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::limits::DeviceLimits;

/// The top_k values whose grid limits every report derives (the models brink serves use these).
pub const TOP_K_SET: [u32; 7] = [1, 2, 4, 6, 8, 10, 16];

/// The largest index a signed 32-bit integer holds.
pub const I32_MAX: u64 = i32::MAX as u64;

/// A token count that matters, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Critical {
    pub tokens: u64,
    pub reason: String,
}

impl Critical {
    pub fn new(tokens: u64, reason: impl Into<String>) -> Self {
        Critical { tokens, reason: reason.into() }
    }
}

/// The attention half of a model class as the kernels see it, with its rope and norm constants.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionShape {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// `rope.freq_base`.
    pub rope_theta: f32,
    /// `attention.layer_norm_rms_epsilon`.
    pub norm_eps: f32,
}

/// The qualification key: everything of a model that a kernel launch or a critical count
/// depends on. Two models with equal shapes share a qualification; any difference (a head dim,
/// the vocabulary, one tensor's weight type) makes another key, qualified on its own.
///
/// The globals hold what today is the same in every layer (hidden width, attention, experts);
/// `layers` holds the per-layer specs (consecutive equal layers merged with a count), so a
/// model whose layers differ gets its own entries without a new key format. `name` is a
/// readable label and never the identity: see [`ModelShape::key`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Readable label, e.g. `qwen3moe-h2048-e128-top8-ffn768`; not part of the identity.
    pub name: String,
    pub hidden: u32,
    pub experts: u32,
    pub top_k: u32,
    /// Width of one expert's FFN (gate/up output, down input).
    pub expert_ffn: u32,
    pub vocab: u32,
    pub context: u32,
    pub attention: AttentionShape,
    /// A latent dense projection (MLA-style), when the class has one.
    pub latent: Option<LatentShape>,
    /// Weight type (ggml name, e.g. `q8_0`) of each tensor outside the layers, by tensor name
    /// (`token_embd.weight`, `output.weight`, ...). Empty when the shape did not come from a file.
    #[serde(default)]
    pub weights: BTreeMap<String, String>,
    /// The decoder layers, in order; consecutive equal layers are one entry.
    #[serde(default)]
    pub layers: Vec<LayerSpec>,
}

/// A run of `count` consecutive layers with the same spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerSpec {
    pub count: u32,
    /// Weight type of each tensor role in the layer, by the name after `blk.N.`
    /// (`attn_q.weight`, `ffn_down_exps.weight`, ...).
    pub weights: BTreeMap<String, String>,
    /// What the layer computes beyond the plain (qwen3moe) layer of the shape's dimensions, by
    /// property (`attention.window`: `128`, `attention.sinks`: `true`, `attention.rope`:
    /// `yarn(...)`, `ffn.gating`, `ffn.activation`, biases, ...). Empty for a plain layer, and
    /// then left out of the encoding, so the keys of plain models are those they had before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kind: BTreeMap<String, String>,
}

/// Prefix of the canonical encoding of a shape; bump the suffix with the encoding itself.
const SHAPE_TAG: &str = "brink-shape-v1";

/// Hex digits of the hash a key carries (64 bits: collisions among the shapes of one fleet
/// are not a concern; the full hash is [`ModelShape::hash`]).
const KEY_HASH_HEX: usize = 16;

impl ModelShape {
    /// Every field but the label as `(path, canonical JSON value)`, sorted by path
    /// (`attention.head_dim`, `layers[0].weights.attn_q.weight`, ...). The one list both the
    /// hash and [`ModelShape::changed_fields`] come from; it depends on field names, not on
    /// their declaration order or on how serde orders map keys.
    pub fn fields(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        // Serialising plain numbers, strings and maps cannot fail.
        if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(self) {
            for (k, v) in map {
                if k != "name" {
                    flatten(&k, &v, &mut out);
                }
            }
        }
        out
    }

    /// SHA-256 over the tag and one `path=value` line per field, lower-case hex.
    pub fn hash(&self) -> String {
        let mut text = String::from(SHAPE_TAG);
        text.push('\n');
        for (path, value) in self.fields() {
            text.push_str(&path);
            text.push('=');
            text.push_str(&value);
            text.push('\n');
        }
        Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The qualification key every cache, fingerprint, status and placement compares: the
    /// label, then the first hex digits of [`ModelShape::hash`]. The label is a function of
    /// the shape, so two keys are equal exactly when the hashes are.
    pub fn key(&self) -> String {
        format!("{}-{}", self.name, &self.hash()[..KEY_HASH_HEX])
    }

    /// The fields whose values differ from `other`'s, each as `path: old -> new` (self is old;
    /// `-` for a field one of them lacks).
    pub fn changed_fields(&self, other: &ModelShape) -> Vec<String> {
        let (a, b) = (self.fields(), other.fields());
        let mut paths: Vec<&String> = a.keys().chain(b.keys()).collect();
        paths.sort();
        paths.dedup();
        paths
            .into_iter()
            .filter(|p| a.get(*p) != b.get(*p))
            .map(|p| format!("{p}: {} -> {}", a.get(p).map_or("-", String::as_str), b.get(p).map_or("-", String::as_str)))
            .collect()
    }
}

/// Flattens a JSON value into `path=value` entries: objects by `.key`, arrays by `[i]`.
fn flatten(path: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                flatten(&format!("{path}.{k}"), v, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{path}[{i}]"), v, out);
            }
        }
        scalar => {
            out.insert(path.to_string(), scalar.to_string());
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatentShape {
    /// Input width K.
    pub k: u32,
    /// Output (latent) width, split into `groups` groups normalised separately.
    pub width: u32,
    pub groups: u32,
}

impl ModelShape {
    /// Qwen3-30B-A3B: hidden 2048, 128 experts, top-8, expert width 768, vocab 151,936,
    /// context 40,960. The latent projection is the shape of the third failure in the design
    /// (K 2560, 8 groups, width 1792), qualified alongside so that class of kernel is covered.
    pub fn qwen3_30b_a3b() -> Self {
        ModelShape {
            name: "qwen3moe-h2048-e128-top8-ffn768".into(),
            hidden: 2048,
            experts: 128,
            top_k: 8,
            expert_ffn: 768,
            vocab: 151_936,
            context: 40_960,
            attention: AttentionShape { heads: 32, kv_heads: 4, head_dim: 128, rope_theta: 1_000_000.0, norm_eps: 1e-6 },
            latent: Some(LatentShape { k: 2560, width: 1792, groups: 8 }),
            // Built in, not read from a file: no weight types, so its key is no real file's.
            weights: BTreeMap::new(),
            layers: Vec::new(),
        }
    }
}

/// The serving parameters a node would run with; their edges are critical counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Serving {
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
}

impl Default for Serving {
    fn default() -> Self {
        Serving { max_batch_tokens: 16_384, prefill_chunk: 4096 }
    }
}

/// `floor(I32_MAX / width)` (the last count whose flattened index fits) and the next one,
/// for a buffer with `width` elements per token.
pub fn overflow_point(width: u64, what: &str) -> Vec<Critical> {
    if width == 0 {
        return vec![];
    }
    let last = I32_MAX / width;
    vec![
        Critical::new(last, format!("{what}: last count below 2^31 (width {width}/token)")),
        Critical::new(last + 1, format!("{what}: first count past 2^31 (width {width}/token)")),
    ]
}

/// Where `per_token × tokens` first exceeds a grid limit on y/z: `floor(limit / per_token)`
/// passes, `+1` fails, if a launch put that product on a bounded axis.
pub fn grid_limit_point(per_token: u64, limit: u64, what: &str) -> Vec<Critical> {
    let last = limit / per_token;
    vec![
        Critical::new(last, format!("{what}: {last} x {per_token} = {} <= {limit} (last that fits)", last * per_token)),
        Critical::new(
            last + 1,
            format!("{what}: {} x {per_token} = {} > {limit} (first past the limit)", last + 1, (last + 1) * per_token),
        ),
    ]
}

/// Counts `1 ..= 2·tile − 1` (every tail of the first two tiles) when `exhaustive`, and always
/// `m·tile − 1, m·tile, m·tile + 1` for each multiplier in `multiples`.
pub fn tile_tails(tile: u64, exhaustive: bool, multiples: &[u64], what: &str) -> Vec<Critical> {
    let mut v = Vec::new();
    if exhaustive {
        v.extend((1..2 * tile).map(|t| Critical::new(t, format!("{what}: tail {} of tile {tile}", t % tile))));
    }
    for &m in multiples {
        for t in [m * tile - 1, m * tile, m * tile + 1] {
            if t > 0 {
                v.push(Critical::new(t, format!("{what}: around {m} x tile {tile}")));
            }
        }
    }
    v
}

/// Counts common to every token-indexed kernel: the naive grid limits for the model's top_k
/// (and the whole `TOP_K_SET` for the routed kernels), the serving envelope and the context.
pub fn envelope_counts(serving: &Serving, shape: &ModelShape) -> Vec<Critical> {
    let mut v = Vec::new();
    for (n, what) in [(serving.max_batch_tokens, "max batch tokens"), (serving.prefill_chunk, "prefill chunk")] {
        for t in [n.saturating_sub(1), n, n + 1] {
            if t > 0 {
                v.push(Critical::new(t, format!("{what} {n} -1/0/+1")));
            }
        }
    }
    v.push(Critical::new(shape.context as u64, format!("context length {}", shape.context)));
    v
}

/// Naive `tokens x top_k` on `grid.y/z`: for every top_k in the set.
pub fn routed_grid_counts(limits: &DeviceLimits) -> Vec<(u32, Vec<Critical>)> {
    let limit = limits.max_grid_dim[2] as u64;
    TOP_K_SET.iter().map(|&k| (k, grid_limit_point(k as u64, limit, &format!("tokens x top_k {k} on grid.z")))).collect()
}

/// Batches whose total is `tokens`: one prompt; four sequences (as a scheduler packs medium
/// prompts); a prefill chunk plus decode tokens of other sequences (prefill mixed with decode).
pub fn compositions(tokens: u64) -> Vec<Vec<u64>> {
    let mut v = vec![vec![tokens]];
    if tokens >= 4 {
        let q = tokens / 4;
        v.push(vec![q, q, q, tokens - 3 * q]);
    }
    if tokens >= 9 {
        let mut mixed = vec![tokens - 8];
        mixed.extend(std::iter::repeat_n(1, 8));
        v.push(mixed);
    }
    v
}

/// Merges counts: sorted by token count, reasons of equal counts joined, zero dropped.
pub fn merge(counts: impl IntoIterator<Item = Critical>) -> Vec<(u64, Vec<String>)> {
    let mut all: Vec<Critical> = counts.into_iter().filter(|c| c.tokens > 0).collect();
    all.sort_by_key(|c| c.tokens);
    let mut out: Vec<(u64, Vec<String>)> = Vec::new();
    for c in all {
        match out.last_mut() {
            Some((t, reasons)) if *t == c.tokens => {
                if !reasons.contains(&c.reason) {
                    reasons.push(c.reason);
                }
            }
            _ => out.push((c.tokens, vec![c.reason])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(v: &[Critical]) -> Vec<u64> {
        v.iter().map(|c| c.tokens).collect()
    }

    #[test]
    fn seed_grid_limits() {
        let l = DeviceLimits::gb10();
        let by_k: std::collections::HashMap<u32, Vec<u64>> = routed_grid_counts(&l).into_iter().map(|(k, v)| (k, counts(&v))).collect();
        assert_eq!(by_k[&8], vec![8191, 8192]);
        assert_eq!(by_k[&10], vec![6553, 6554]);
        assert_eq!(by_k[&1], vec![65535, 65536]);
        assert_eq!(by_k[&16], vec![4095, 4096]);
        assert_eq!(by_k[&6], vec![10922, 10923]);
    }

    #[test]
    fn logits_overflow_at_vocab_151936() {
        // Full logits [tokens, 151936] pass 2^31 elements at 14,135 tokens.
        assert_eq!(counts(&overflow_point(151_936, "logits")), vec![14_134, 14_135]);
    }

    #[test]
    fn tails_cover_every_residue_mod_64() {
        let v = tile_tails(64, true, &[128], "t");
        let residues: std::collections::BTreeSet<u64> = v.iter().map(|c| c.tokens % 64).collect();
        assert_eq!(residues.len(), 64);
        assert!(counts(&v).contains(&8191) && counts(&v).contains(&8193));
    }

    #[test]
    fn compositions_sum_to_the_count() {
        for t in [1, 5, 63, 8192, 8193] {
            for c in compositions(t) {
                assert_eq!(c.iter().sum::<u64>(), t, "{c:?}");
            }
        }
        assert_eq!(compositions(8192).len(), 3);
    }

    /// A shape as a file gives it: with weight types.
    fn with_weights() -> ModelShape {
        let mut s = ModelShape::qwen3_30b_a3b();
        s.weights = BTreeMap::from([("token_embd.weight".into(), "q8_0".into()), ("output.weight".into(), "q8_0".into())]);
        s.layers = vec![LayerSpec {
            count: 48,
            weights: BTreeMap::from([("attn_q.weight".into(), "q8_0".into()), ("ffn_down_exps.weight".into(), "q8_0".into())]),
            kind: BTreeMap::new(),
        }];
        s
    }

    #[test]
    fn the_key_is_stable_and_the_label_is_not_its_identity() {
        // Golden values: a change here changes every node's key, so every node re-qualifies.
        // Change them only together with SHAPE_TAG.
        assert_eq!(ModelShape::qwen3_30b_a3b().key(), "qwen3moe-h2048-e128-top8-ffn768-584945720bb64748");
        assert_eq!(with_weights().key(), "qwen3moe-h2048-e128-top8-ffn768-9b7da3edb29fa596");
        let mut renamed = with_weights();
        renamed.name = "another label".into();
        assert_eq!(renamed.hash(), with_weights().hash());
    }

    #[test]
    fn the_hash_ignores_the_order_maps_were_filled_in() {
        let mut a = with_weights();
        let mut b = with_weights();
        a.weights = [("a.weight", "f32"), ("b.weight", "q8_0")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        b.weights = [("b.weight", "q8_0"), ("a.weight", "f32")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        assert_eq!(a.key(), b.key());
        // The JSON text of a shape, keys in another order, reads back to the same key.
        let json = serde_json::to_value(&a).unwrap();
        let serde_json::Value::Object(map) = json else { panic!("not an object") };
        let reversed: serde_json::Map<String, serde_json::Value> = map.into_iter().rev().collect();
        let back: ModelShape = serde_json::from_value(serde_json::Value::Object(reversed)).unwrap();
        assert_eq!(back.key(), a.key());
    }

    #[test]
    fn head_dim_vocab_or_one_weight_type_make_another_key_and_name_the_field() {
        let a = with_weights();
        let mut head = a.clone();
        head.attention.head_dim = 64;
        let mut vocab = a.clone();
        vocab.vocab = 151_937;
        let mut wtype = a.clone();
        wtype.layers[0].weights.insert("ffn_down_exps.weight".into(), "q4_0".into());
        let mut layers = a.clone();
        layers.layers[0].count = 47;
        let mut window = a.clone();
        window.layers[0].kind.insert("attention.window".into(), "128".into());
        let mut sinks = window.clone();
        sinks.layers[0].kind.insert("attention.sinks".into(), "true".into());
        for (b, field) in [
            (&head, "attention.head_dim: 128 -> 64"),
            (&vocab, "vocab: 151936 -> 151937"),
            (&wtype, "layers[0].weights.ffn_down_exps.weight: \"q8_0\" -> \"q4_0\""),
            (&layers, "layers[0].count: 48 -> 47"),
            (&window, "layers[0].kind.attention.window: - -> \"128\""),
        ] {
            assert_ne!(a.key(), b.key(), "{field}");
            assert_eq!(a.name, b.name, "the label alone does not tell them apart");
            assert_eq!(a.changed_fields(b), vec![field.to_string()]);
        }
        assert!(a.changed_fields(&a.clone()).is_empty());
        assert_eq!(window.changed_fields(&sinks), vec!["layers[0].kind.attention.sinks: - -> \"true\"".to_string()]);
        assert_ne!(window.key(), sinks.key());
    }

    #[test]
    fn merge_joins_reasons() {
        let m = merge(vec![Critical::new(5, "a"), Critical::new(3, "b"), Critical::new(5, "c"), Critical::new(0, "z")]);
        assert_eq!(m, vec![(3, vec!["b".to_string()]), (5, vec!["a".to_string(), "c".to_string()])]);
    }
}
