//! What a replica Pod runs for each engine, pure: the serving parameters mapped to the engine's
//! own flags, a gang member's command for the engine's multi-node mode, the qualification
//! sidecar's script and the liveness check that follows the engine's progress metrics.
//!
//! Mapping (`spec.serving` -> flags):
//!
//! | field | vLLM | SGLang | llama.cpp |
//! |---|---|---|---|
//! | context | `--max-model-len` | `--context-length` | `-c` (context x concurrency: llama.cpp splits `-c` over its slots) |
//! | maxBatchTokens | `--max-num-batched-tokens` | `--max-prefill-tokens` | `--batch-size` |
//! | prefillChunk | `--long-prefill-token-threshold` | `--chunked-prefill-size` | `--ubatch-size` |
//! | concurrency | `--max-num-seqs` | `--max-running-requests` | `--parallel` |
//!
//! `kvFraction` has no counterpart (vLLM's `--gpu-memory-utilization` is a share of the whole
//! GPU, not of what the weights leave): set the engine's own flag in `spec.engine.args`, which
//! come last and so override a mapped flag of the same name.

use brink_api::crd::{EngineKind, Serving};

/// Ray's GCS port on a vLLM gang's leader.
pub const RAY_PORT: u16 = 6379;
/// SGLang's `--dist-init-addr` port on the leader.
pub const SGLANG_DIST_PORT: u16 = 20000;
/// `ggml-rpc-server`'s port on a llama.cpp gang's workers (its own default).
pub const LLAMA_RPC_PORT: u16 = 50052;
/// llama.cpp's server and its RPC backend's worker, where llama.cpp's own images
/// (ghcr.io/ggml-org/llama.cpp) keep them: in /app, which is not on their PATH (their entrypoint
/// names the file), so a bare name in a Pod's command would not be found. The worker is
/// `ggml-rpc-server` in the llama.cpp brink pins and runs a gang with (older releases named it
/// `rpc-server`); both must be built with -DGGML_RPC=ON, which the published images are not.
pub const LLAMA_SERVER: &str = "/app/llama-server";
pub const LLAMA_RPC_SERVER: &str = "/app/ggml-rpc-server";
/// Where the qualification sidecar writes its report and the marker readiness reads.
pub const QUALIFICATION_DIR: &str = "/var/run/brink/qualification";
/// Written by the sidecar once the qualification passed (or passed clamped).
pub const QUALIFIED_MARKER: &str = "/var/run/brink/qualification/passed";
/// Where a replica's qualification report lies under the node's state directory `node_dir`
/// (as the Pod mounts it): where the node's agent reads the reports it publishes
/// (`brink-agent`'s `qualify::replica::report_path`, which keeps a name's letters, digits, `-`
/// and `.`: all a Kubernetes name has).
pub fn replica_report_path(node_dir: &str, namespace: &str, name: &str) -> String {
    format!("{}/replicas/{namespace}/{name}.json", node_dir.trim_end_matches('/'))
}
/// Seconds of pending requests without a token counter moving that the liveness check calls a
/// stall (the kubelet then restarts the engine).
pub const STALL_SECONDS: u32 = 120;

/// The engine's HTTP port when `spec.engine.port` is not set (`brink`: the operator's own).
pub fn default_port(kind: EngineKind, brink_port: u16) -> u16 {
    match kind {
        EngineKind::Brink => brink_port,
        EngineKind::Vllm => 8000,
        EngineKind::Sglang => 30000,
        EngineKind::Llamacpp => 8080,
    }
}

/// A gang member's place: its rank (0 = leader) among `size`, the leader's address, and the
/// workers' addresses in rank order (what llama.cpp's leader connects to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangRank {
    pub rank: u32,
    pub size: u32,
    pub leader_address: String,
    pub worker_addresses: Vec<String>,
}

impl GangRank {
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }
}

/// One engine process of a replica.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch<'a> {
    pub kind: EngineKind,
    pub model_path: &'a str,
    pub served_name: &'a str,
    pub port: u16,
    pub serving: &'a Serving,
    pub args: &'a [String],
    /// `None`: one node.
    pub gang: Option<&'a GangRank>,
}

/// Why a launch cannot be rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaunchError {
    /// brink's engine runs on one node only.
    BrinkGang,
    /// A gang of one, or a rank outside it, or worker addresses that do not match its size.
    BadGang(String),
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::BrinkGang => write!(f, "engine kind brink runs on one node: spec.nodesPerReplica must be 1"),
            LaunchError::BadGang(why) => write!(f, "gang: {why}"),
        }
    }
}

impl std::error::Error for LaunchError {}

fn s(v: &str) -> String {
    v.to_string()
}

/// The engine's serving command line for one node (or a gang's leader, before its
/// multi-node flags), without the extra arguments.
fn serve_argv(l: &Launch) -> Vec<String> {
    let sv = l.serving;
    let port = l.port.to_string();
    match l.kind {
        EngineKind::Brink => vec![
            s("brink-agent"),
            s("serve"),
            s("--model"),
            s(l.model_path),
            s("--host"),
            s("0.0.0.0"),
            s("--port"),
            port,
            s("--context"),
            sv.context.to_string(),
            s("--max-batch-tokens"),
            sv.max_batch_tokens.to_string(),
            s("--prefill-chunk"),
            sv.prefill_chunk.to_string(),
            s("--slots"),
            sv.concurrency.to_string(),
            s("--served-model-name"),
            s(l.served_name),
            // Replicas run on GPU nodes: asked explicitly, the engine never falls back to the cpu.
            s("--backend"),
            s("cuda"),
            // Its own model-level threshold test before `/ready` (or the node's result for the
            // same shape key and fingerprint, kept in the node's state dir).
            s("--model-test"),
            s("--qualification-dir"),
            s(crate::controllers::pod::NODE_STATE_DIR),
        ],
        EngineKind::Vllm => vec![
            s("vllm"),
            s("serve"),
            s(l.model_path),
            s("--served-model-name"),
            s(l.served_name),
            s("--host"),
            s("0.0.0.0"),
            s("--port"),
            port,
            s("--max-model-len"),
            sv.context.to_string(),
            s("--max-num-batched-tokens"),
            sv.max_batch_tokens.to_string(),
            s("--max-num-seqs"),
            sv.concurrency.to_string(),
            s("--enable-chunked-prefill"),
            s("--long-prefill-token-threshold"),
            sv.prefill_chunk.to_string(),
        ],
        EngineKind::Sglang => vec![
            s("python3"),
            s("-m"),
            s("sglang.launch_server"),
            s("--model-path"),
            s(l.model_path),
            s("--served-model-name"),
            s(l.served_name),
            s("--host"),
            s("0.0.0.0"),
            s("--port"),
            port,
            s("--context-length"),
            sv.context.to_string(),
            s("--max-prefill-tokens"),
            sv.max_batch_tokens.to_string(),
            s("--chunked-prefill-size"),
            sv.prefill_chunk.to_string(),
            s("--max-running-requests"),
            sv.concurrency.to_string(),
            // The liveness check reads its token counters.
            s("--enable-metrics"),
        ],
        EngineKind::Llamacpp => vec![
            s(LLAMA_SERVER),
            s("-m"),
            s(l.model_path),
            s("--alias"),
            s(l.served_name),
            s("--host"),
            s("0.0.0.0"),
            s("--port"),
            port,
            s("-c"),
            sv.context.saturating_mul(u64::from(sv.concurrency)).to_string(),
            s("--batch-size"),
            sv.max_batch_tokens.to_string(),
            s("--ubatch-size"),
            sv.prefill_chunk.to_string(),
            s("--parallel"),
            sv.concurrency.to_string(),
            // Every layer on the GPU (or the RPC devices), and the metrics liveness reads.
            s("--n-gpu-layers"),
            s("999"),
            s("--metrics"),
        ],
    }
}

/// Single-quoted for `sh -c`.
pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@%+".contains(&b)) {
        return arg.to_string();
    }
    format!("'{}'", arg.replace('\'', r"'\''"))
}

fn shell_line(argv: &[String]) -> String {
    argv.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")
}

/// The container command (argv) of `l`: the engine itself on one node; a gang member's part of
/// the engine's multi-node mode otherwise (vLLM: Ray head + `vllm serve` on the leader, Ray
/// workers joining it; SGLang: the launcher with rank and the leader's init address on every
/// member; llama.cpp: `ggml-rpc-server` on the workers, `llama-server --rpc` on the leader).
pub fn command(l: &Launch) -> Result<Vec<String>, LaunchError> {
    let with_args = |mut argv: Vec<String>| {
        argv.extend(l.args.iter().cloned());
        argv
    };
    let Some(g) = l.gang else { return Ok(with_args(serve_argv(l))) };
    if l.kind == EngineKind::Brink {
        return Err(LaunchError::BrinkGang);
    }
    if g.size < 2 || g.rank >= g.size || g.worker_addresses.len() as u64 != u64::from(g.size) - 1 {
        return Err(LaunchError::BadGang(format!(
            "rank {} of {} with {} worker addresses (a gang has at least 2 members, one address per worker)",
            g.rank,
            g.size,
            g.worker_addresses.len()
        )));
    }
    let size = g.size.to_string();
    Ok(match (l.kind, g.is_leader()) {
        (EngineKind::Vllm, true) => {
            let mut serve = serve_argv(l);
            serve.extend([
                s("--tensor-parallel-size"),
                size,
                s("--pipeline-parallel-size"),
                s("1"),
                s("--distributed-executor-backend"),
                s("ray"),
            ]);
            let serve = with_args(serve);
            let script = format!(
                "ray start --head --port={RAY_PORT} --node-ip-address=\"$POD_IP\" --disable-usage-stats && exec {}",
                shell_line(&serve)
            );
            vec![s("sh"), s("-c"), script]
        }
        (EngineKind::Vllm, false) => {
            let script = format!(
                "exec ray start --address={}:{RAY_PORT} --node-ip-address=\"$POD_IP\" --block --disable-usage-stats",
                shell_quote(&g.leader_address)
            );
            vec![s("sh"), s("-c"), script]
        }
        (EngineKind::Sglang, _) => {
            let mut argv = serve_argv(l);
            argv.extend([
                s("--tp-size"),
                size.clone(),
                s("--nnodes"),
                size,
                s("--node-rank"),
                g.rank.to_string(),
                s("--dist-init-addr"),
                format!("{}:{SGLANG_DIST_PORT}", g.leader_address),
            ]);
            with_args(argv)
        }
        (EngineKind::Llamacpp, true) => {
            let mut argv = serve_argv(l);
            let rpc: Vec<String> = g.worker_addresses.iter().map(|a| format!("{a}:{LLAMA_RPC_PORT}")).collect();
            argv.extend([s("--rpc"), rpc.join(",")]);
            with_args(argv)
        }
        (EngineKind::Llamacpp, false) => {
            vec![s(LLAMA_RPC_SERVER), s("--host"), s("0.0.0.0"), s("--port"), LLAMA_RPC_PORT.to_string()]
        }
        (EngineKind::Brink, _) => return Err(LaunchError::BrinkGang),
    })
}

/// The ports a member listens on, by name (the leader's `http` is the engine's API).
pub fn ports(kind: EngineKind, port: u16, gang: Option<&GangRank>) -> Vec<(&'static str, u16)> {
    match (kind, gang) {
        (_, None) => vec![("http", port)],
        (EngineKind::Vllm, Some(g)) if g.is_leader() => vec![("http", port), ("ray", RAY_PORT)],
        (EngineKind::Sglang, Some(g)) if g.is_leader() => vec![("http", port), ("dist-init", SGLANG_DIST_PORT)],
        (EngineKind::Llamacpp, Some(g)) if !g.is_leader() => vec![("rpc", LLAMA_RPC_PORT)],
        (_, Some(g)) if g.is_leader() => vec![("http", port)],
        (_, Some(_)) => vec![],
    }
}

/// The metrics an engine's liveness follows: requests pending (gauges summed) and tokens done
/// (counters summed). A stall is pending work with no counter moving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgressMetrics {
    pub path: &'static str,
    pub pending: &'static [&'static str],
    pub progress: &'static [&'static str],
}

/// `None` for brink, whose own `/live` follows its progress heartbeat.
pub fn progress_metrics(kind: EngineKind) -> Option<ProgressMetrics> {
    match kind {
        EngineKind::Brink => None,
        EngineKind::Vllm => Some(ProgressMetrics {
            path: "/metrics",
            pending: &["vllm:num_requests_running", "vllm:num_requests_waiting"],
            progress: &["vllm:prompt_tokens_total", "vllm:generation_tokens_total"],
        }),
        EngineKind::Sglang => Some(ProgressMetrics {
            path: "/metrics",
            pending: &["sglang:num_running_reqs", "sglang:num_queue_reqs"],
            progress: &["sglang:prompt_tokens_total", "sglang:generation_tokens_total"],
        }),
        EngineKind::Llamacpp => Some(ProgressMetrics {
            path: "/metrics",
            pending: &["llamacpp:requests_processing", "llamacpp:requests_deferred"],
            progress: &["llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"],
        }),
    }
}

/// A metric's name as the liveness script's awk matches it: the exact name, then labels or a
/// space (so that `x_total` does not match `x_total_created`).
fn awk_names(names: &[&str]) -> String {
    names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(" ")
}

/// The liveness probe's script (POSIX sh, curl and awk, which the engines' images carry): it
/// reads the engine's metrics, sums the pending gauges and the token counters, and fails when
/// requests have been pending for `stall_s` seconds with no counter moving. State between
/// probes lives in `state_dir` (the last counter sum and when it last moved). An unreachable
/// metrics endpoint fails the probe too (its failure threshold lets a restart through).
pub fn liveness_script(m: &ProgressMetrics, port: u16, stall_s: u32, state_dir: &str) -> String {
    format!(
        r#"set -u
state={state_dir}/brink-liveness
now=$(date +%s)
body=$(curl -fsS --max-time 5 http://127.0.0.1:{port}{path}) || {{ echo "metrics unreachable"; exit 1; }}
read pending tokens <<EOF
$(printf '%s\n' "$body" | awk -v pend='{pending}' -v prog='{progress}' '
  BEGIN {{ np = split(pend, P, " "); ng = split(prog, G, " "); p = 0; t = 0 }}
  /^#/ {{ next }}
  {{ name = $1; sub(/\{{.*/, "", name);
     for (i = 1; i <= np; i++) if (name == P[i]) p += $NF;
     for (i = 1; i <= ng; i++) if (name == G[i]) t += $NF }}
  END {{ printf "%d %d\n", p, t }}')
EOF
last_tokens=-1; moved_at=$now
[ -f "$state" ] && read last_tokens moved_at < "$state"
if [ "$pending" -eq 0 ] || [ "$tokens" -ne "$last_tokens" ]; then moved_at=$now; fi
echo "$tokens $moved_at" > "$state"
idle=$((now - moved_at))
if [ "$idle" -ge {stall_s} ]; then echo "stalled: $pending requests pending, no tokens for $idle s"; exit 1; fi
exit 0
"#,
        path = m.path,
        pending = awk_names(m.pending).replace('"', ""),
        progress = awk_names(m.progress).replace('"', ""),
    )
}

/// The qualification sidecar's script (bash, in brink's image): wait until the engine accepts
/// connections, qualify it over its HTTP API at the replica's serving limits, and on a pass
/// (or a pass clamped) mark the Pod qualified and hold; the readiness probe reads the marker.
/// A failed qualification ends the container: the kubelet restarts it (qualifying again), and
/// repeated failures are the replica's failed Pod. Pass, clamp or refuse, the verdict is also
/// written to `replica_report` (under the node's state directory, where brink's own replicas
/// write theirs): the node's agent publishes it in the `ModelReplica`'s status, and a clamp
/// becomes the deployment's `Clamped` condition.
pub fn sidecar_script(port: u16, served_name: &str, serving: &Serving, replica_report: &str) -> String {
    let qualify = [
        s("brink-agent"),
        s("qualify"),
        s("--url"),
        format!("http://127.0.0.1:{port}"),
        s("--model"),
        s(served_name),
        s("--max-batch-tokens"),
        serving.max_batch_tokens.to_string(),
        s("--prefill-chunk"),
        serving.prefill_chunk.to_string(),
        s("--out"),
        format!("{QUALIFICATION_DIR}/report.json"),
        s("--replica-report"),
        s(replica_report),
    ];
    format!(
        "rm -f {QUALIFIED_MARKER}\n\
         until (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; do sleep 5; done\n\
         {} || exit $?\n\
         touch {QUALIFIED_MARKER}\n\
         exec sleep infinity\n",
        shell_line(&qualify)
    )
}

#[cfg(test)]
mod tests;
