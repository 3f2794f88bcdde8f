//! `place`: one table, each case also run with the nodes in every rotation of both orders.

use brink_api::Verdict;

use super::*;

/// Keys of two models that share the label and differ in head dim (the hash part differs).
const KEY_HEAD_DIM_128: &str = "qwen3moe-h2048-e128-top8-ffn768-5b1e0c7d3a9f2e64";
const KEY_HEAD_DIM_64: &str = "qwen3moe-h2048-e128-top8-ffn768-0d94c3b8e1f7a256";

struct Case {
    name: &'static str,
    nodes: Vec<NodeView>,
    dep: DeploymentView,
    count: u64,
    /// (node, maxBatchTokens, prefillChunk, validated), in placement order.
    placed: Vec<(&'static str, u64, u64, bool)>,
    /// (node, text its reasons must contain), for nodes not chosen.
    reasons: Vec<(&'static str, &'static str)>,
    /// Text the condition message must contain (empty: there must be none).
    message: &'static str,
    qualify: Vec<&'static str>,
}

fn case(name: &'static str, nodes: Vec<NodeView>, dep: DeploymentView, count: u64) -> Case {
    Case { name, nodes, dep, count, placed: vec![], reasons: vec![], message: "", qualify: vec![] }
}

impl Case {
    fn placed(mut self, p: &[(&'static str, u64, u64, bool)]) -> Case {
        self.placed = p.to_vec();
        self
    }
    fn on(self, nodes: &[&'static str]) -> Case {
        let p: Vec<_> = nodes.iter().map(|n| (*n, 8192, 2048, true)).collect();
        self.placed(&p)
    }
    fn why(mut self, node: &'static str, text: &'static str) -> Case {
        self.reasons.push((node, text));
        self
    }
    fn message(mut self, text: &'static str) -> Case {
        self.message = text;
        self
    }
    fn qualify(mut self, nodes: &[&'static str]) -> Case {
        self.qualify = nodes.to_vec();
        self
    }
}

/// gpt-oss-20b (24 layers, 8 KV heads of 64 dims, a window of 128 on every other layer) at a
/// 128k context for 4 sequences: with the window-aware facts (`rings`: 12 full layers of 2 KiB
/// a position, 12 rings of 2,176 positions) or with every layer counted at every position.
fn gpt_oss_20b(rings: bool) -> MemoryNeed {
    let (kv_bytes_per_token, kv_window_bytes_per_sequence) = if rings { (24 << 10, 51 << 20) } else { (48 << 10, 0) };
    MemoryNeed::Model { model_bytes: 13 * GIB, kv_bytes_per_token, kv_window_bytes_per_sequence, context: 131_072, concurrency: 4 }
}

fn cases() -> Vec<Case> {
    use TaintEffect::*;
    let other = "ai/other";
    vec![
        case("one healthy node", vec![node("a")], dep(), 1).on(&["a"]),
        case("cordoned", vec![with("a", |n| n.unschedulable = true), node("b")], dep(), 1).on(&["b"]).why("a", "cordoned"),
        case("NoSchedule taint blocks", vec![with("a", |n| n.taints = vec![taint("gpu-broken", NoSchedule)]), node("b")], dep(), 1)
            .on(&["b"])
            .why("a", "taint gpu-broken=true:NoSchedule"),
        case("NoExecute taint blocks", vec![with("a", |n| n.taints = vec![taint("gpu-broken", NoExecute)]), node("b")], dep(), 1)
            .on(&["b"])
            .why("a", "taint gpu-broken=true:NoExecute"),
        // The preference outranks load: b is busier but untainted.
        case(
            "PreferNoSchedule node is used last",
            vec![
                with("a", |n| n.taints = vec![taint("maint", PreferNoSchedule)]),
                with("b", |n| n.residents = vec![resident("x", other, 50 * GIB)]),
            ],
            dep(),
            1,
        )
        .on(&["b"])
        .why("a", "fits, but"),
        case(
            "PreferNoSchedule node is used when it is the only one",
            vec![with("a", |n| n.taints = vec![taint("maint", PreferNoSchedule)])],
            dep(),
            1,
        )
        .on(&["a"]),
        case(
            "a tolerated taint does not block",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoSchedule)])],
            dep_with(|d| d.tolerations = vec![Toleration { key: Some("dedicated".into()), value: None, effect: None }]),
            1,
        )
        .on(&["a"]),
        case(
            "a toleration of another effect does not tolerate",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoSchedule)])],
            dep_with(|d| d.tolerations = vec![Toleration { key: Some("dedicated".into()), value: None, effect: Some(NoExecute) }]),
            1,
        )
        .why("a", "taint dedicated=true:NoSchedule")
        .message("1 of 1 replicas cannot be placed; 0/1 nodes available: 1 taint dedicated=true:NoSchedule"),
        case(
            "a toleration of another value does not tolerate",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoExecute)])],
            dep_with(|d| d.tolerations = vec![Toleration { key: Some("dedicated".into()), value: Some("false".into()), effect: None }]),
            1,
        )
        .why("a", "taint dedicated=true:NoExecute")
        .message("1 taint dedicated=true:NoExecute"),
        case(
            "Equal: key, value and effect all match a NoExecute taint",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoExecute)])],
            dep_with(|d| {
                d.tolerations = vec![Toleration { key: Some("dedicated".into()), value: Some("true".into()), effect: Some(NoExecute) }]
            }),
            1,
        )
        .on(&["a"]),
        case(
            "Exists with no key tolerates every taint",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoExecute), taint("maint", NoSchedule)])],
            dep_with(|d| d.tolerations = vec![Toleration::default()]),
            1,
        )
        .on(&["a"]),
        case(
            "each blocking taint needs its own toleration",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoExecute), taint("maint", NoSchedule)])],
            dep_with(|d| d.tolerations = vec![Toleration { key: Some("dedicated".into()), value: None, effect: None }]),
            1,
        )
        .why("a", "taint maint=true:NoSchedule")
        .message("1 taint maint=true:NoSchedule"),
        case(
            "a toleration of another key does not tolerate",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoSchedule)]), node("b")],
            dep_with(|d| d.tolerations = vec![Toleration { key: Some("gpu".into()), value: None, effect: None }]),
            1,
        )
        .on(&["b"])
        .why("a", "taint dedicated=true:NoSchedule"),
        case(
            "Equal with no value matches a taint with no value",
            vec![with("a", |n| n.taints = vec![Taint { key: "gpu".into(), value: None, effect: NoSchedule }])],
            dep_with(|d| d.tolerations = vec![Toleration { key: Some("gpu".into()), value: Some(String::new()), effect: Some(NoSchedule) }]),
            1,
        )
        .on(&["a"]),
        case(
            "Equal with no value does not match a taint with a value",
            vec![with("a", |n| n.taints = vec![taint("gpu", NoSchedule)])],
            dep_with(|d| d.tolerations = vec![Toleration { key: Some("gpu".into()), value: Some(String::new()), effect: None }]),
            1,
        )
        .why("a", "taint gpu=true:NoSchedule"),
        case(
            "a tolerated node that misses a selected label is still refused",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoSchedule)])],
            dep_with(|d| {
                d.tolerations = vec![Toleration::default()];
                d.node_selector.insert("pool".into(), "inference".into());
            }),
            1,
        )
        .why("a", "node selector mismatch: no label pool (wanted inference)")
        .message("1 node selector mismatch"),
        case("a node a sweep drains takes no replica", vec![with("a", |n| n.sweep = Some("ai/nightly-7".into())), node("b")], dep(), 1)
            .on(&["b"])
            .why("a", "sweep in progress: SweepRun ai/nightly-7 drains the node"),
        case("only nodes a sweep drains", vec![with("a", |n| n.sweep = Some("ai/nightly-7".into()))], dep(), 1)
            .message("1 of 1 replicas cannot be placed; 0/1 nodes available: 1 sweep in progress"),
        case("heartbeat expired", vec![with("a", |n| n.heartbeat = expired(10)), node("b")], dep(), 1)
            .on(&["b"])
            .why("a", "heartbeat expired 10 s ago"),
        case("heartbeat lost", vec![with("a", |n| n.heartbeat = expired(600))], dep(), 1)
            .why("a", "heartbeat expired 600 s ago")
            .message("0/1 nodes available: 1 heartbeat expired"),
        case("heartbeat settling after an outage", vec![with("a", |n| n.heartbeat = settling(30)), node("b")], dep(), 1)
            .on(&["b"])
            .why("a", "heartbeat back for 30 s after an outage (settling for 120 s)"),
        case("settled: 120 s fresh", vec![with("a", |n| n.heartbeat = settling(120))], dep(), 1).on(&["a"]),
        case("heartbeat flapping", vec![with("a", |n| n.heartbeat = flapping()), node("b")], dep(), 1)
            .on(&["b"])
            .why("a", "heartbeat flapping: 3 outages within 600 s"),
        case("no heartbeat lease", vec![with("a", |n| n.heartbeat = HeartbeatHistory::new(40)), node("b")], dep(), 1)
            .on(&["b"])
            .why("a", "no heartbeat lease"),
        case("never qualified: qualification requested", vec![with("a", |n| n.classes.clear()), node("b")], dep(), 1)
            .on(&["b"])
            .why("a", "not qualified for class qwen3moe-h2048-e128-top8-ffn768 (no result yet; qualification requested)")
            .qualify(&["a"]),
        // A cordoned node is not asked to qualify: it could not serve anyway.
        // Two models with one label (they differ only in head dim): a node qualified for the
        // first is not qualified for the second; it is asked to qualify that key.
        case(
            "qualified only for another model with the same label",
            vec![
                with("a", |n| n.classes = [(KEY_HEAD_DIM_64.to_string(), qualified(16_384))].into()),
                with("b", |n| n.classes = [(KEY_HEAD_DIM_128.to_string(), qualified(16_384))].into()),
            ],
            dep_with(|d| d.shape_class = KEY_HEAD_DIM_128.into()),
            1,
        )
        .on(&["b"])
        .why("a", "not qualified for class qwen3moe-h2048-e128-top8-ffn768-5b1e0c7d3a9f2e64 (no result yet; qualification requested)")
        .qualify(&["a"]),
        case(
            "proof incomplete: not placed even without requireQualified",
            vec![with("a", |n| {
                let reason = "proof incomplete: negative control(s) neg_gemv_gridz not run in this run (replicas resident), no earlier proof";
                n.classes.insert(CLASS.into(), ClassQualification::Done(Verdict::ProofIncomplete { reason: reason.into() }));
            })],
            dep_with(|d| d.require_qualified = false),
            1,
        )
        .why("a", "proof incomplete: negative control(s) neg_gemv_gridz not run")
        .message("0/1 nodes available: 1 not qualified for qwen3moe"),
        case(
            "never qualified and cordoned: not asked",
            vec![with("a", |n| {
                n.classes.clear();
                n.unschedulable = true
            })],
            dep(),
            1,
        )
        .why("a", "cordoned"),
        case(
            "never qualified, qualification not required: unvalidated",
            vec![with("a", |n| n.classes.clear())],
            dep_with(|d| d.require_qualified = false),
            1,
        )
        .placed(&[("a", 8192, 2048, false)]),
        case(
            "disqualified",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), ClassQualification::Done(Verdict::Disqualified { reason: "tail bug at 5 tokens".into() }));
            })],
            dep_with(|d| d.require_qualified = false),
            1,
        )
        .why("a", "(disqualified: tail bug at 5 tokens)")
        .message("0/1 nodes available: 1 not qualified for qwen3moe"),
        case(
            "qualifying now",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), ClassQualification::InProgress);
            })],
            dep_with(|d| d.require_qualified = false),
            1,
        )
        .why("a", "(qualifying now)"),
        case(
            "stale qualification",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), ClassQualification::Stale { changed: "driverVersion changed: 580 -> 590".into() });
            })],
            dep(),
            1,
        )
        .why("a", "(stale, re-qualifying: driverVersion changed: 580 -> 590)"),
        case(
            "nothing executed, qualification required",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), ClassQualification::Done(Verdict::NotQualified { reason: "no GPU".into() }));
            })],
            dep(),
            1,
        )
        .why("a", "(nothing executed: no GPU)"),
        case(
            "nothing executed, qualification not required: unvalidated",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), ClassQualification::Done(Verdict::NotQualified { reason: "no GPU".into() }));
            })],
            dep_with(|d| d.require_qualified = false),
            1,
        )
        .placed(&[("a", 8192, 2048, false)]),
        case(
            "another class's result does not count",
            vec![with("a", |n| {
                n.classes = BTreeMap::from([("llama-other".to_string(), qualified(16_384))]);
            })],
            dep(),
            1,
        )
        .why("a", "no result yet")
        .qualify(&["a"]),
        // Memory boundaries: need 20 GiB.
        case("memory: exact fit", vec![with("a", |n| n.allocatable_bytes = 20 * GIB)], dep(), 1).on(&["a"]),
        case("memory: one byte short", vec![with("a", |n| n.allocatable_bytes = 20 * GIB - 1)], dep(), 1)
            .why("a", "memory: needs 20.00 GiB, has 20.00 GiB (after residents and a 0.00 GiB reserve), 1 B short")
            .message("1 of 1 replicas cannot be placed; 0/1 nodes available: 1 insufficient memory (needs 20.00 GiB)"),
        case(
            "memory: the reserve fits exactly",
            vec![with("a", |n| n.allocatable_bytes = 24 * GIB)],
            dep_with(|d| d.reserve_bytes = 4 * GIB),
            1,
        )
        .on(&["a"]),
        case(
            "memory: the reserve one byte over",
            vec![with("a", |n| n.allocatable_bytes = 24 * GIB)],
            dep_with(|d| d.reserve_bytes = 4 * GIB + 1),
            1,
        )
        .why("a", "1 B short"),
        case(
            "memory: residents of every deployment count",
            vec![with("a", |n| {
                n.allocatable_bytes = 60 * GIB;
                n.residents = vec![resident("x", "ai/other", 30 * GIB), resident("y", "ml/third", 10 * GIB)];
            })],
            dep(),
            1,
        )
        .on(&["a"]),
        case(
            "memory: residents one byte over",
            vec![with("a", |n| {
                n.allocatable_bytes = 60 * GIB;
                n.residents = vec![resident("x", "ai/other", 30 * GIB), resident("y", "ml/third", 10 * GIB + 1)];
            })],
            dep(),
            1,
        )
        .why("a", "1 B short"),
        case(
            "memory: an overcommitted node has none",
            vec![with("a", |n| n.residents = vec![resident("x", "ai/other", 150 * GIB)])],
            dep(),
            1,
        )
        .why("a", "has 0.00 GiB"),
        // 10 GiB of weights + 64 KiB/token x 32768 tokens x 4 sequences (8 GiB) = 18 GiB.
        case(
            "memory: model plus KV, exact",
            vec![with("a", |n| n.allocatable_bytes = 18 * GIB)],
            dep_with(|d| {
                d.memory = MemoryNeed::Model {
                    model_bytes: 10 * GIB,
                    kv_bytes_per_token: 64 << 10,
                    kv_window_bytes_per_sequence: 0,
                    context: 32_768,
                    concurrency: 4,
                }
            }),
            1,
        )
        .on(&["a"]),
        case(
            "memory: model plus KV, one byte short",
            vec![with("a", |n| n.allocatable_bytes = 18 * GIB - 1)],
            dep_with(|d| {
                d.memory = MemoryNeed::Model {
                    model_bytes: 10 * GIB,
                    kv_bytes_per_token: 64 << 10,
                    kv_window_bytes_per_sequence: 0,
                    context: 32_768,
                    concurrency: 4,
                }
            }),
            1,
        )
        .why("a", "needs 18.00 GiB"),
        // gpt-oss-20b at a 128k context for 4 sequences: 13 GiB of weights + 4 x (24 KiB/token
        // (the 12 full layers) x 131,072 + 51 MiB (the 12 windowed layers' rings)) = 25 GiB +
        // 204 MiB. Counting every layer at every position asked 13 + 4 x 6 = 37 GiB.
        case("memory: window-only KV, exact", vec![with("a", |n| n.allocatable_bytes = 25 * GIB + (204 << 20))], dep_with(|d| d.memory = gpt_oss_20b(true)), 1)
            .on(&["a"]),
        case(
            "memory: window-only KV, one byte short",
            vec![with("a", |n| n.allocatable_bytes = 25 * GIB + (204 << 20) - 1)],
            dep_with(|d| d.memory = gpt_oss_20b(true)),
            1,
        )
        .why("a", "needs 25.20 GiB"),
        // The same at a prefill chunk of 8192: rings of ceil((8192 + 127) / 16) blocks, 8,320
        // positions, asked as 4 rings at 2048 (204 MiB per sequence): 25 GiB + 816 MiB, more than
        // the node that fits the default chunk.
        case(
            "memory: window-only KV at prefill chunk 8192, exact",
            vec![with("a", |n| n.allocatable_bytes = 25 * GIB + (816 << 20))],
            dep_with(|d| {
                d.prefill_chunk = 8192;
                d.memory = gpt_oss_20b(true);
            }),
            1,
        )
        .placed(&[("a", 8192, 8192, true)]),
        case(
            "memory: window-only KV at prefill chunk 8192 does not fit the chunk-2048 node",
            vec![with("a", |n| n.allocatable_bytes = 25 * GIB + (204 << 20))],
            dep_with(|d| {
                d.prefill_chunk = 8192;
                d.memory = gpt_oss_20b(true);
            }),
            1,
        )
        .why("a", "needs 25.80 GiB"),
        case("memory: window-only KV fits 32 GiB", vec![with("a", |n| n.allocatable_bytes = 32 * GIB)], dep_with(|d| d.memory = gpt_oss_20b(true)), 1)
            .on(&["a"]),
        case(
            "memory: every layer's KV at every position does not fit 32 GiB",
            vec![with("a", |n| n.allocatable_bytes = 32 * GIB)],
            dep_with(|d| d.memory = gpt_oss_20b(false)),
            1,
        )
        .why("a", "needs 37.00 GiB"),
        // Envelopes: request 8192 / 2048.
        case(
            "Clamp at envelope == request",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), qualified(8192));
            })],
            dep(),
            1,
        )
        .on(&["a"]),
        case(
            "Refuse at envelope == request",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), clamped(8192, 8193));
            })],
            dep_with(|d| d.on_self_test_failure = OnSelfTestFailure::Refuse),
            1,
        )
        .on(&["a"]),
        case(
            "Clamp below request: batch clamped",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), clamped(4096, 6144));
            })],
            dep(),
            1,
        )
        .placed(&[("a", 4096, 2048, true)]),
        case(
            "Clamp below the chunk: both clamped",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), clamped(1024, 1025));
            })],
            dep(),
            1,
        )
        .placed(&[("a", 1024, 1024, true)]),
        case(
            "Refuse one token below request",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), clamped(8191, 8192));
            })],
            dep_with(|d| d.on_self_test_failure = OnSelfTestFailure::Refuse),
            1,
        )
        .why("a", "envelope 8191 tokens for class qwen3moe-h2048-e128-top8-ffn768 below requested 8192 under onSelfTestFailure Refuse")
        .message("1 envelope below requested 8192 tokens (Refuse)"),
        case(
            "Refuse uses the node whose envelope covers",
            vec![
                with("a", |n| {
                    n.classes.insert(CLASS.into(), clamped(4096, 6144));
                }),
                node("b"),
            ],
            dep_with(|d| d.on_self_test_failure = OnSelfTestFailure::Refuse),
            1,
        )
        .on(&["b"])
        .why("a", "envelope 4096"),
        case(
            "a zero envelope serves nothing",
            vec![with("a", |n| {
                n.classes.insert(CLASS.into(), qualified(0));
            })],
            dep(),
            1,
        )
        .why("a", "validated no batch size"),
        case(
            "node selector",
            vec![
                with("a", |n| {
                    n.labels.insert(GPU_LABEL.into(), "NVIDIA-H200".into());
                }),
                with("b", |n| n.labels.clear()),
                node("c"),
            ],
            dep_with(|d| {
                d.node_selector.insert(GPU_LABEL.into(), "NVIDIA-GB10".into());
            }),
            1,
        )
        .on(&["c"])
        .why("a", "node selector mismatch: nvidia.com/gpu.product=NVIDIA-H200, wanted NVIDIA-GB10")
        .why("b", "node selector mismatch: no label nvidia.com/gpu.product (wanted NVIDIA-GB10)"),
        case(
            "least loaded first",
            vec![
                with("a", |n| n.residents = vec![resident("x", other, 30 * GIB)]),
                with("b", |n| n.residents = vec![resident("y", other, 10 * GIB)]),
                with("c", |n| n.residents = vec![resident("z", other, 20 * GIB)]),
            ],
            dep(),
            2,
        )
        .on(&["b", "c"])
        .why("a", "fits, but"),
        case(
            "load is relative to the node's memory",
            vec![
                with("a", |n| {
                    n.allocatable_bytes = 200 * GIB;
                    n.residents = vec![resident("x", other, 40 * GIB)];
                }),
                with("b", |n| n.residents = vec![resident("y", other, 30 * GIB)]),
            ],
            dep(),
            1,
        )
        .on(&["a"]),
        case("equal nodes: the name decides", vec![node("c"), node("a"), node("b")], dep(), 1).on(&["a"]),
        case(
            "one per node: an existing replica counts",
            vec![with("a", |n| n.residents = vec![resident("chat-0", DEP, 20 * GIB)]), node("b")],
            dep(),
            1,
        )
        .on(&["b"])
        .why("a", "already hosts a replica of this deployment"),
        case("one per node: more replicas than nodes", vec![node("a"), node("b")], dep(), 3)
            .on(&["a", "b"])
            .message("1 of 3 replicas cannot be placed; 0/2 nodes available: 2 already hosts a replica (one per node)"),
        // need 20: a 100, b 50, c 30. Fewest own replicas first, then load: a b c | a (0.2) b (0.4;
        // c has 10 left) | a (0.4 vs b full).
        case(
            "prefer spread over uneven nodes",
            vec![node("a"), with("b", |n| n.allocatable_bytes = 50 * GIB), with("c", |n| n.allocatable_bytes = 30 * GIB)],
            dep_with(|d| d.spread = Spread::Prefer),
            6,
        )
        .on(&["a", "b", "c", "a", "b", "a"]),
        case(
            "prefer spread: existing replicas count",
            vec![with("a", |n| n.residents = vec![resident("chat-0", DEP, 20 * GIB), resident("chat-1", DEP, 20 * GIB)]), node("b")],
            dep_with(|d| d.spread = Spread::Prefer),
            3,
        )
        .on(&["b", "b", "a"]),
        case(
            "prefer spread: memory shrinks as replicas land",
            vec![with("a", |n| n.allocatable_bytes = 50 * GIB)],
            dep_with(|d| d.spread = Spread::Prefer),
            3,
        )
        .on(&["a", "a"])
        .message("1 of 3 replicas cannot be placed; 0/1 nodes available: 1 insufficient memory (needs 20.00 GiB)"),
        case("no nodes", vec![], dep(), 1).message("1 of 1 replicas cannot be placed; no nodes"),
        case("nothing to place", vec![node("a")], dep(), 0).why("a", "fits, but"),
        case(
            "every reason is listed",
            vec![with("a", |n| {
                n.unschedulable = true;
                n.taints = vec![taint("z-last", NoExecute), taint("a-first", NoSchedule)];
                n.heartbeat = expired(5);
                n.allocatable_bytes = GIB;
                n.classes.insert(CLASS.into(), ClassQualification::InProgress);
            })],
            dep(),
            1,
        )
        .why(
            "a",
            "cordoned; taint a-first=true:NoSchedule; taint z-last=true:NoExecute; heartbeat expired 5 s ago; not qualified for class",
        )
        .why("a", "qualifying now); memory: needs 20.00 GiB, has 1.00 GiB")
        .message("0/1 nodes available: 1 cordoned, 1 heartbeat expired, 1 insufficient memory (needs 20.00 GiB), 1 not qualified for"),
        case(
            "the summary counts nodes per reason, most first",
            vec![
                with("a", |n| n.unschedulable = true),
                with("b", |n| n.unschedulable = true),
                with("c", |n| n.allocatable_bytes = GIB),
                with("d", |n| n.heartbeat = expired(1)),
                with("e", |n| n.unschedulable = true),
            ],
            dep(),
            2,
        )
        .message("2 of 2 replicas cannot be placed; 0/5 nodes available: 3 cordoned, 1 heartbeat expired, 1 insufficient memory (needs 20.00 GiB)"),
    ]
}

fn reasons_text(p: &Placement, node: &str) -> Option<String> {
    p.not_chosen.iter().find(|(n, _)| n == node).map(|(_, rs)| rs.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; "))
}

#[test]
fn placement_table() {
    let cases = cases();
    assert!(cases.len() >= 50, "{} cases", cases.len());
    // Every case runs; the failures are reported together.
    let failures: Vec<String> =
        cases.iter().filter_map(|c| std::panic::catch_unwind(|| check(c)).err().map(|e| panic_text(&*e, c.name))).collect();
    assert!(failures.is_empty(), "{} of the placement cases failed:\n{}", failures.len(), failures.join("\n"));
}

pub(super) fn panic_text(e: &(dyn std::any::Any + Send), name: &str) -> String {
    let text = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
    format!("{name}: {}", text.unwrap_or_default())
}

fn check(c: &Case) {
    {
        let first = place(&c.dep, &c.nodes, c.count, NOW, &POLICY).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let got: Vec<(&str, u64, u64, bool)> = first
            .assignments
            .iter()
            .map(|a| (a.node.as_str(), a.limits.max_batch_tokens, a.limits.prefill_chunk, a.limits.validated))
            .collect();
        assert_eq!(got, c.placed, "{}: assignments", c.name);
        for a in &first.assignments {
            assert_eq!(a.memory_bytes, c.dep.memory_bytes().unwrap(), "{}", c.name);
        }
        assert_eq!(first.unplaced, c.count - c.placed.len() as u64, "{}: unplaced", c.name);
        for (node, text) in &c.reasons {
            let r = reasons_text(&first, node).unwrap_or_else(|| panic!("{}: {node} was chosen", c.name));
            assert!(r.contains(text), "{}: {node}: {r:?} lacks {text:?}", c.name);
        }
        // Every node is either chosen or has a reason.
        let chosen: std::collections::BTreeSet<&str> = got.iter().map(|g| g.0).collect();
        assert_eq!(chosen.len() + first.not_chosen.len(), c.nodes.len(), "{}", c.name);
        assert!(first.not_chosen.iter().all(|(n, rs)| !rs.is_empty() && !chosen.contains(n.as_str())), "{}", c.name);
        // A message exactly when a replica is unplaced, naming the counts (and `c.message`).
        match &first.message {
            None => assert!(first.unplaced == 0 && c.message.is_empty(), "{}: no message", c.name),
            Some(m) => {
                let counts = format!("{} of {} replicas cannot be placed; ", first.unplaced, c.count);
                assert!(first.unplaced > 0 && m.starts_with(&counts) && m.contains(c.message), "{}: {m:?} lacks {:?}", c.name, c.message);
            }
        }
        assert_eq!(first.qualify, c.qualify, "{}: qualify", c.name);
        for order in orders(&c.nodes) {
            assert_eq!(place(&c.dep, &order, c.count, NOW, &POLICY).unwrap(), first, "{}: depends on the input order", c.name);
        }
    }
}

#[test]
fn bad_deployments_are_refused_with_the_field() {
    let model = |kv: u64, context: u64, concurrency: u64| MemoryNeed::Model {
        model_bytes: GIB,
        kv_bytes_per_token: kv,
        kv_window_bytes_per_sequence: 0,
        context,
        concurrency,
    };
    let windowed = |window: u64, concurrency: u64| MemoryNeed::Model {
        model_bytes: GIB,
        kv_bytes_per_token: 1,
        kv_window_bytes_per_sequence: window,
        context: 1,
        concurrency,
    };
    let table: Vec<(DeploymentView, &str)> = vec![
        (dep_with(|d| d.max_batch_tokens = 0), "ModelDeployment ai/chat: spec.serving.maxBatchTokens: must be at least 1"),
        (dep_with(|d| d.prefill_chunk = 0), "spec.serving.prefillChunk: must be at least 1"),
        (dep_with(|d| d.prefill_chunk = 8193), "spec.serving.prefillChunk: 8193 exceeds serving.maxBatchTokens 8192"),
        (dep_with(|d| d.memory = model(1, 0, 1)), "spec.serving.context: must be at least 1"),
        (dep_with(|d| d.memory = model(1, 1, 0)), "spec.serving.concurrency: must be at least 1"),
        (
            dep_with(|d| d.memory = model(1 << 40, 1 << 20, 1 << 10)),
            "memory need: model 1073741824 B + (KV 1099511627776 B/token x context 1048576 + window KV 0 B at prefill chunk 2048, \
             scaled to 2048) x concurrency 1024 exceeds 2^64 bytes",
        ),
        (
            dep_with(|d| d.memory = windowed(u64::MAX, 1)),
            "+ window KV 18446744073709551615 B at prefill chunk 2048, scaled to 2048) x concurrency 1 exceeds 2^64 bytes",
        ),
        (dep_with(|d| d.memory = windowed(1 << 62, 4)), "exceeds 2^64 bytes"),
        // Fine at the default chunk (below); four rings at 8192 overflow.
        (
            dep_with(|d| {
                d.prefill_chunk = 8192;
                d.memory = windowed(1 << 62, 1);
            }),
            "+ window KV 4611686018427387904 B at prefill chunk 2048, scaled to 8192) x concurrency 1 exceeds 2^64 bytes",
        ),
        (dep_with(|d| d.memory = model(u64::MAX - GIB + 1, 1, 1)), "exceeds 2^64 bytes"),
        (dep_with(|d| d.memory = MemoryNeed::Bytes(0)), "spec.memory: a replica needs 0 bytes"),
        (dep_with(|d| d.replicas = MAX_REPLICAS + 1), "spec.replicas: 10001 exceeds the limit of 10000"),
    ];
    for (d, want) in table {
        let err = place(&d, &[node("a")], 1, NOW, &POLICY).unwrap_err().to_string();
        assert!(err.contains(want), "{err:?} lacks {want:?}");
    }
    // One byte under the overflow is fine.
    assert!(place(&dep_with(|d| d.memory = model(u64::MAX - GIB, 1, 1)), &[node("a")], 1, NOW, &POLICY).is_ok());
    assert!(place(&dep_with(|d| d.memory = windowed(u64::MAX - GIB - 1, 1)), &[node("a")], 1, NOW, &POLICY).is_ok());
    assert!(place(&dep_with(|d| d.memory = windowed(1 << 62, 1)), &[node("a")], 1, NOW, &POLICY).is_ok());
    assert!(place(&dep_with(|d| d.replicas = MAX_REPLICAS), &[node("a")], 1, NOW, &POLICY).is_ok());
    let err = place(&dep(), &[node("a")], MAX_REPLICAS + 1, NOW, &POLICY).unwrap_err().to_string();
    assert_eq!(err, "ModelDeployment ai/chat: 10001 new replicas asked of one placement (limit 10000)");
    // The most a call may ask for, on a node with room for all: placed, one each.
    let big = place(&dep_with(|d| d.spread = Spread::Prefer), &[with("a", |n| n.allocatable_bytes = u64::MAX)], MAX_REPLICAS, NOW, &POLICY)
        .unwrap();
    assert_eq!((big.assignments.len() as u64, big.unplaced), (MAX_REPLICAS, 0));
    let err = place(&dep(), &[node("a"), node("b"), node("a")], 1, NOW, &POLICY).unwrap_err();
    assert_eq!(err, DecideError::DuplicateNode("a".into()));
}
