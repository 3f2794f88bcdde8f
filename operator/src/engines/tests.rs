//! The engine table: each engine's command for one node and for each gang role, the flags the
//! serving parameters map to, and the liveness script run against metrics it is fed.

use brink_api::crd::{EngineKind, Serving};

use super::*;

const SERVING: Serving = Serving { context: 8192, max_batch_tokens: 4096, prefill_chunk: 1024, concurrency: 4, kv_fraction: 0.5 };

fn launch<'a>(kind: EngineKind, args: &'a [String], gang: Option<&'a GangRank>) -> Launch<'a> {
    Launch { kind, model_path: "/cache/models/abc.gguf", served_name: "qwen", port: 8000, serving: &SERVING, args, gang }
}

fn line(argv: &[String]) -> String {
    argv.join(" ")
}

fn gang(rank: u32) -> GangRank {
    GangRank {
        rank,
        size: 3,
        leader_address: "qwen-0.qwen-0-gang.ai.svc".into(),
        worker_addresses: vec!["qwen-0-w1.qwen-0-gang.ai.svc".into(), "qwen-0-w2.qwen-0-gang.ai.svc".into()],
    }
}

#[test]
fn one_node_each_engine_gets_its_own_flags() {
    let extra = vec!["--enforce-eager".to_string()];
    // (kind, extra args, the whole command line)
    let cases: &[(EngineKind, &[String], &str)] = &[
        (
            EngineKind::Brink,
            &[],
            "brink-agent serve --model /cache/models/abc.gguf --host 0.0.0.0 --port 8000 --context 8192 --max-batch-tokens 4096 \
             --prefill-chunk 1024 --slots 4 --served-model-name qwen --backend cuda --model-test --qualification-dir /var/lib/brink/node",
        ),
        (
            EngineKind::Vllm,
            &extra,
            "vllm serve /cache/models/abc.gguf --served-model-name qwen --host 0.0.0.0 --port 8000 --max-model-len 8192 \
             --max-num-batched-tokens 4096 --max-num-seqs 4 --enable-chunked-prefill --long-prefill-token-threshold 1024 --enforce-eager",
        ),
        (
            EngineKind::Sglang,
            &[],
            "python3 -m sglang.launch_server --model-path /cache/models/abc.gguf --served-model-name qwen --host 0.0.0.0 --port 8000 \
             --context-length 8192 --max-prefill-tokens 4096 --chunked-prefill-size 1024 --max-running-requests 4 --enable-metrics",
        ),
        (
            // -c is the context of all slots together.
            EngineKind::Llamacpp,
            &[],
            "/app/llama-server -m /cache/models/abc.gguf --alias qwen --host 0.0.0.0 --port 8000 -c 32768 --batch-size 4096 \
             --ubatch-size 1024 --parallel 4 --n-gpu-layers 999 --metrics",
        ),
    ];
    for (kind, args, want) in cases {
        let want: String = want.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(line(&command(&launch(*kind, args, None)).expect("command")), want, "{kind:?}");
    }
}

#[test]
fn gang_members_run_the_engines_multi_node_mode() {
    let extra = vec!["--dtype".to_string(), "auto".to_string()];
    let leader = gang(0);
    let worker = gang(2);
    let vllm_leader = command(&launch(EngineKind::Vllm, &extra, Some(&leader))).expect("vllm leader");
    assert_eq!(vllm_leader[..2], ["sh", "-c"]);
    assert!(
        vllm_leader[2].starts_with("ray start --head --port=6379 --node-ip-address=\"$POD_IP\" --disable-usage-stats && exec vllm serve ")
    );
    assert!(
        vllm_leader[2].ends_with("--tensor-parallel-size 3 --pipeline-parallel-size 1 --distributed-executor-backend ray --dtype auto"),
        "{}",
        vllm_leader[2]
    );
    let vllm_worker = command(&launch(EngineKind::Vllm, &extra, Some(&worker))).expect("vllm worker");
    assert_eq!(
        vllm_worker,
        ["sh", "-c", "exec ray start --address=qwen-0.qwen-0-gang.ai.svc:6379 --node-ip-address=\"$POD_IP\" --block --disable-usage-stats"]
    );

    let sglang = |g: &GangRank| line(&command(&launch(EngineKind::Sglang, &[], Some(g))).expect("sglang"));
    for (g, rank) in [(&leader, "0"), (&worker, "2")] {
        assert!(
            sglang(g).ends_with(&format!("--tp-size 3 --nnodes 3 --node-rank {rank} --dist-init-addr qwen-0.qwen-0-gang.ai.svc:20000")),
            "{}",
            sglang(g)
        );
    }

    let llama_leader = line(&command(&launch(EngineKind::Llamacpp, &[], Some(&leader))).expect("llama leader"));
    assert!(
        llama_leader.ends_with("--metrics --rpc qwen-0-w1.qwen-0-gang.ai.svc:50052,qwen-0-w2.qwen-0-gang.ai.svc:50052"),
        "{llama_leader}"
    );
    assert_eq!(
        command(&launch(EngineKind::Llamacpp, &extra, Some(&worker))).expect("ggml-rpc-server"),
        ["/app/ggml-rpc-server", "--host", "0.0.0.0", "--port", "50052"]
    );

    // Ports: the leader's API (and Ray's GCS or SGLang's init address), a worker's RPC.
    assert_eq!(ports(EngineKind::Vllm, 8000, Some(&leader)), [("http", 8000), ("ray", 6379)]);
    assert_eq!(ports(EngineKind::Vllm, 8000, Some(&worker)), []);
    assert_eq!(ports(EngineKind::Sglang, 30000, Some(&leader)), [("http", 30000), ("dist-init", 20000)]);
    assert_eq!(ports(EngineKind::Llamacpp, 8080, Some(&worker)), [("rpc", 50052)]);
    assert_eq!(ports(EngineKind::Llamacpp, 8080, None), [("http", 8080)]);
}

#[test]
fn a_gang_that_cannot_be_run_is_an_error() {
    let brink = GangRank { rank: 0, size: 2, leader_address: "l".into(), worker_addresses: vec!["w".into()] };
    assert_eq!(command(&launch(EngineKind::Brink, &[], Some(&brink))), Err(LaunchError::BrinkGang));
    let bad = [
        GangRank { rank: 0, size: 1, leader_address: "l".into(), worker_addresses: vec![] },
        GangRank { rank: 2, size: 2, leader_address: "l".into(), worker_addresses: vec!["w".into()] },
        GangRank { rank: 0, size: 3, leader_address: "l".into(), worker_addresses: vec!["w".into()] },
    ];
    for g in bad {
        assert!(matches!(command(&launch(EngineKind::Vllm, &[], Some(&g))), Err(LaunchError::BadGang(_))), "{g:?}");
    }
}

#[test]
fn defaults_and_quoting() {
    assert_eq!(
        [EngineKind::Brink, EngineKind::Vllm, EngineKind::Sglang, EngineKind::Llamacpp].map(|k| default_port(k, 8080)),
        [8080, 8000, 30000, 8080]
    );
    assert_eq!(shell_quote("/a/b.gguf"), "/a/b.gguf");
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(shell_quote(""), "''");
    assert_eq!(shell_quote("a b;c"), "'a b;c'");
    let report = replica_report_path("/var/lib/brink/node/", "ai", "chat-0");
    assert_eq!(report, "/var/lib/brink/node/replicas/ai/chat-0.json");
    let script = sidecar_script(8000, "qwen", &SERVING, &report);
    assert!(
        script.contains(
            "brink-agent qualify --url http://127.0.0.1:8000 --model qwen --max-batch-tokens 4096 --prefill-chunk 1024 \
         --out /var/run/brink/qualification/report.json --replica-report /var/lib/brink/node/replicas/ai/chat-0.json || exit $?"
        ),
        "{script}"
    );
    assert!(script.contains("/dev/tcp/127.0.0.1/8000") && script.contains(&format!("touch {QUALIFIED_MARKER}")));
    assert!(progress_metrics(EngineKind::Brink).is_none());
}

/// Runs the liveness script for `kind` with a `curl` that prints each body of `bodies` in
/// turn (an empty body: curl fails), `date` fixed to each time of `times`; the exit code of
/// each probe.
fn probe_sequence(kind: EngineKind, steps: &[(u64, Option<&str>)]) -> Vec<i32> {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    let m = progress_metrics(kind).expect("metrics");
    let script = liveness_script(&m, 8000, 120, dir.path().to_str().expect("utf-8"));
    let mut codes = Vec::new();
    for (i, (at, body)) in steps.iter().enumerate() {
        let body_file = dir.path().join(format!("body{i}"));
        let curl = match body {
            Some(b) => {
                std::fs::write(&body_file, b).expect("body");
                format!("#!/bin/sh\ncat '{}'\n", body_file.display())
            }
            None => "#!/bin/sh\necho 'curl: (7) Failed to connect' >&2\nexit 7\n".to_string(),
        };
        for (name, text) in [("curl", curl), ("date", format!("#!/bin/sh\necho {at}\n"))] {
            let path = bin.join(name);
            std::fs::write(&path, text).expect("stub");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let out = std::process::Command::new("sh").arg("-c").arg(&script).env("PATH", path).output().expect("run sh");
        codes.push(out.status.code().unwrap_or(-1));
    }
    codes
}

#[test]
fn liveness_fails_only_when_requests_wait_and_no_token_counter_moves() {
    let vllm = |running: u32, waiting: u32, prompt: u64, generated: u64| {
        format!(
            "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{model_name=\"qwen\"}} {running}.0\n\
             vllm:num_requests_waiting{{model_name=\"qwen\"}} {waiting}.0\n\
             vllm:prompt_tokens_total{{model_name=\"qwen\"}} {prompt}.0\n\
             vllm:prompt_tokens_created{{model_name=\"qwen\"}} 1.7e+09\n\
             vllm:generation_tokens_total{{model_name=\"qwen\"}} {generated}.0\n"
        )
    };
    let b = |r, w, p, g| vllm(r, w, p, g);
    // Idle for long: alive. Pending with tokens moving: alive. Pending, frozen for 120 s: dead.
    let steps_owned = [
        (1000, Some(b(0, 0, 10, 10))),
        (2000, Some(b(0, 0, 10, 10))),
        (2010, Some(b(1, 2, 10, 10))),
        (2100, Some(b(1, 2, 500, 20))),
        (2200, Some(b(1, 2, 500, 21))),
        (2300, Some(b(1, 2, 500, 21))),
        (2420, Some(b(1, 2, 500, 21))),
        // The restart's counters start again from 0 (a change: alive).
        (2430, Some(b(1, 0, 0, 0))),
        // Unreachable: fails at once (the probe's threshold decides).
        (2440, None),
    ];
    let steps: Vec<(u64, Option<&str>)> = steps_owned.iter().map(|(t, b)| (*t, b.as_deref())).collect();
    assert_eq!(probe_sequence(EngineKind::Vllm, &steps), [0, 0, 0, 0, 0, 0, 1, 0, 1]);

    let llama = |processing: u32, predicted: u64| {
        format!(
            "llamacpp:prompt_tokens_total 100\nllamacpp:tokens_predicted_total {predicted}\n\
             llamacpp:requests_processing {processing}\nllamacpp:requests_deferred 0\n"
        )
    };
    let owned = [(0, Some(llama(1, 5))), (60, Some(llama(1, 5))), (119, Some(llama(1, 5))), (121, Some(llama(1, 5)))];
    let steps: Vec<(u64, Option<&str>)> = owned.iter().map(|(t, b)| (*t, b.as_deref())).collect();
    assert_eq!(probe_sequence(EngineKind::Llamacpp, &steps), [0, 0, 0, 1]);
}
