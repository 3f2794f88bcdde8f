#!/usr/bin/env python3
"""Writes brink's Grafana dashboards (dashboards/*.json) from the panel lists below.

The JSON files are what Grafana imports and what the tests read (node-agent/tests/
dashboards_live.rs); this script is how they are kept consistent: one layout, one datasource
reference, one set of variables. Edit a panel here, run `python3 dashboards/generate.py`, commit
both. Series names and labels: docs/metrics.md; what each panel answers: docs/dashboards.md.
"""

import json
import pathlib

DS = {"type": "prometheus", "uid": "${datasource}"}
# Every filter the variables drive; `=~` so that "All" (`.*`) and multi-selection work.
C = 'cluster=~"$cluster"'
N = 'node=~"$node"'
M = 'model=~"$model"'
S = 'sweep=~"$sweep"'
RATE = "$__rate_interval"
RANGE = "$__range"


def target(expr, legend="", instant=False):
    return {"expr": expr, "legendFormat": legend, "instant": instant, "range": not instant}


def panel(title, description, targets, kind="timeseries", unit="short", w=12, h=8, **extra):
    p = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "_w": w,
        "_h": h,
    }
    if kind == "timeseries":
        p["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}, "tooltip": {"mode": "multi"}}
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value", "graphMode": "area"}
    if kind == "table":
        for t in targets:
            t["format"] = "table"
            t["instant"] = True
            t["range"] = False
    p.update(extra)
    return p


def matrix(row, column):
    """Grafana's "grouping to matrix" transformation: rows by one label, columns by another."""
    return [{"id": "groupingToMatrix", "options": {"rowField": row, "columnField": column, "valueField": "Value"}}]


# The operator's states (brink_fleet_node_qualified): the self-test's four, plus `stale` (taken
# under an older fingerprint of the node: a driver or agent upgrade) and `inProgress` (asked for,
# not reported yet).
QUAL_STATES = [
    ("qualified", 3, "green"),
    ("clamped", 2, "yellow"),
    ("notQualified", 1, "blue"),
    ("disqualified", 0, "red"),
    ("stale", -1, "orange"),
    ("inProgress", -2, "purple"),
]


def qualification_code(filters):
    """One number per (node, shape class) for the current state, so a matrix can colour it."""
    parts = [f'({code} * max by (node, shape_class) (brink_fleet_node_qualified{{{filters}, state="{s}"}} == 1))' for s, code, _ in QUAL_STATES]
    return " or ".join(parts)


QUAL_MAPPINGS = [{"type": "value", "options": {str(code): {"text": s, "color": color, "index": i} for i, (s, code, color) in enumerate(QUAL_STATES)}}]


def row(title, repeat=None):
    """A row header; with `repeat`, Grafana draws the row and the panels under it once per value
    of that variable."""
    r = {"type": "row", "title": title, "collapsed": False, "panels": [], "_w": 24, "_h": 1}
    if repeat:
        r["repeat"] = repeat
    return r


def variables(names, queries=None):
    out = [{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": ""}]
    queries = {
        "cluster": "label_values(brink_node_memory_total_bytes, cluster)",
        "node": 'label_values(brink_node_memory_total_bytes{cluster=~"$cluster"}, node)',
        "model": 'label_values(brink_requests_total{cluster=~"$cluster"}, model)',
        "sweep": 'label_values(brink_sweep_figure{cluster=~"$cluster"}, sweep)',
    } | (queries or {})
    for name in names:
        q = queries[name]
        out.append({
            "name": name,
            "label": name.capitalize(),
            "type": "query",
            "datasource": DS,
            "query": {"query": q, "refId": f"{name}-values"},
            "definition": q,
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {},
            "sort": 1,
            "hide": 0,
            "regex": "",
        })
    return out


def layout(panels):
    """Left to right, top to bottom, on Grafana's 24-column grid; ids from 1."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p.pop("_w"), p.pop("_h")
        if x + w > 24 or p["type"] == "row":
            x, y, row_h = 0, y + row_h, 0
        p["id"] = i
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        for j, t in enumerate(p.get("targets", [])):
            t["refId"] = chr(ord("A") + j)
            t["datasource"] = DS
        x += w
        row_h = max(row_h, h)
    return panels


def dashboard(uid, title, description, var_names, panels, queries=None):
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["brink"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "utc",
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": []},
        "links": [{"title": "brink dashboards", "type": "dashboards", "tags": ["brink"], "asDropdown": True}],
        "templating": {"list": variables(var_names, queries)},
        "panels": layout(panels),
    }


def fleet():
    return dashboard("brink-fleet", "brink / Fleet overview", "Nodes, their qualification, throughput and stalls across the fleet.", ["cluster", "node"], [
        panel("Nodes up", "Nodes whose agent heartbeat is fresh (the operator's view).", [target(f"sum(brink_fleet_node_up{{{C}}})", instant=True)], "stat", w=6, h=4),
        panel("Nodes down", "Nodes with a SparkNode whose heartbeat expired: their agent stopped or the node is gone.", [target(f"sum(1 - brink_fleet_node_up{{{C}}})", instant=True)], "stat", w=6, h=4,
              fieldConfig={"defaults": {"unit": "short", "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}]}}, "overrides": []}),
        panel("Nodes schedulable", "Nodes the operator may place replicas on (up, not cordoned, qualified for some class).", [target(f"sum(brink_fleet_node_schedulable{{{C}}})", instant=True)], "stat", w=6, h=4),
        panel("Replicas placed", "ModelReplicas placed on the fleet's nodes.", [target(f"sum(brink_fleet_node_replicas{{{C}}})", instant=True)], "stat", w=6, h=4),
        panel("Qualification per node and shape class", "The current qualification state of each node for each shape class, as its SparkNode reports it.",
              [target(qualification_code(f"{C}, {N}"), instant=True)], "table", w=12, h=8, transformations=matrix("node", "shape_class"),
              fieldConfig={"defaults": {"unit": "none", "mappings": QUAL_MAPPINGS, "custom": {"cellOptions": {"type": "color-background"}}}, "overrides": []}),
        panel("Node up and schedulable", "Per node over time: 1 while the heartbeat is fresh / while the node takes replicas.",
              [target(f"max by (node) (brink_fleet_node_up{{{C}, {N}}})", "{{node}} up"), target(f"max by (node) (brink_fleet_node_schedulable{{{C}, {N}}})", "{{node}} schedulable")], w=12, h=8),
        panel("Output tokens/s per node", "Tokens generated per second by the replicas on each node.",
              [target(f'sum by (node) (rate(brink_completion_tokens_total{{{C}, {N}, job="brink-replica"}}[{RATE}]))', "{{node}}")], w=12, unit="short"),
        panel("Decode tokens/s per node (engine time)", "Decode tokens per second of engine step time: falls when a node's GPU clocks down or its kernels slow.",
              [target(f"sum by (node) (rate(brink_decode_tokens_total{{{C}, {N}}}[{RATE}])) / sum by (node) (rate(brink_decode_seconds_total{{{C}, {N}}}[{RATE}]))", "{{node}}")], w=12),
        panel("Stalls per node", "Engine stalls the watchdog caught (0 where none happened in the range).",
              [target(f"sum by (node) (increase(brink_stalls_total{{{C}, {N}}}[{RANGE}])) or sum by (node) (0 * brink_engine_restarts_total{{{C}, {N}}})", "{{node}}", instant=True)], "bargauge", w=8),
        panel("Seconds since engine progress", "Per node, the longest time any replica's engine went without progress: a climbing line is a stall in the making.",
              [target(f"max by (node) (brink_seconds_since_progress{{{C}, {N}}})", "{{node}}")], w=8, unit="s"),
        panel("Engine restarts", "Engine child restarts (after a stall or crash) per node.",
              [target(f"sum by (node) (increase(brink_engine_restarts_total{{{C}, {N}}}[{RATE}]))", "{{node}}")], w=8),
        panel("Replicas per node", "ModelReplicas placed on each node.", [target(f"max by (node) (brink_fleet_node_replicas{{{C}, {N}}})", "{{node}}")], w=12),
        panel("Deployment replicas", "Desired, ready and unplaced replicas of each ModelDeployment: unplaced > 0 means no node fits.",
              [target(f"sum by (namespace, deployment, state) (brink_fleet_deployment_replicas{{{C}}})", instant=True)], "table", w=12,
              transformations=[{"id": "groupingToMatrix", "options": {"rowField": "deployment", "columnField": "state", "valueField": "Value"}}]),
    ])


def node():
    mem = lambda s: f"max by (node) ({s}{{{C}, {N}}})"  # the agent and each replica export it: one line per node
    return dashboard("brink-node", "brink / Node drill-down", "One node: GPU sensors, unified memory, model cache, qualification and the replicas it hosts.", ["cluster", "node", "model"], [
        panel("GPU temperature", "GPU die temperature (NVML). Absent without NVML.", [target(f"brink_gpu_temperature_celsius{{{C}, {N}}}", "{{node}} {{gpu_name}}")], w=8, unit="celsius"),
        panel("GPU power vs limit", "Power draw against the enforced limit: at the limit the GPU clocks down.",
              [target(f"brink_gpu_power_watts{{{C}, {N}}}", "{{node}} draw"), target(f"brink_gpu_power_limit_watts{{{C}, {N}}}", "{{node}} limit")], w=8, unit="watt"),
        panel("GPU clocks", "SM and memory clocks (GB10 reports no memory clock).",
              [target(f"brink_gpu_sm_clock_hertz{{{C}, {N}}}", "{{node}} SM"), target(f"brink_gpu_memory_clock_hertz{{{C}, {N}}}", "{{node}} memory")], w=8, unit="hertz"),
        panel("Unified memory", "MemTotal, MemAvailable and the page cache: on GB10 the GPU allocates from this memory.",
              [target(mem("brink_node_memory_total_bytes"), "{{node}} total"), target(mem("brink_node_memory_available_bytes"), "{{node}} available"),
               target(mem("brink_node_memory_page_cache_bytes"), "{{node}} page cache")], w=12, unit="bytes"),
        panel("GPU utilization", "Fraction of time a kernel ran, and of time device memory was busy.",
              [target(f"brink_gpu_utilization_ratio{{{C}, {N}}}", "{{node}} kernels"), target(f"brink_gpu_memory_utilization_ratio{{{C}, {N}}}", "{{node}} memory")], w=12, unit="percentunit"),
        panel("Model cache", "Bytes the agent's model cache holds against its budget.",
              [target(f"max by (node) (brink_model_cache_bytes{{{C}, {N}}})", "{{node}} used"), target(f"max by (node) (brink_model_cache_budget_bytes{{{C}, {N}}})", "{{node}} budget")], w=12, unit="bytes"),
        panel("Qualification", "This node's state per shape class (1 = current).",
              [target(f"max by (node, shape_class, state) (brink_qualified{{{C}, {N}}}) == 1", instant=True)], "table", w=12),
        panel("Replica output tokens/s", "Tokens generated per second by each replica on the node.",
              [target(f"sum by (node, deployment, model) (rate(brink_completion_tokens_total{{{C}, {N}, {M}}}[{RATE}]))", "{{node}} {{deployment}}")], w=12),
        panel("Replica time to first token", "p50 and p95 TTFT of the node's replicas (GenAI histogram).",
              [target(f"histogram_quantile(0.5, sum by (le, node, deployment) (rate(gen_ai_server_time_to_first_token_seconds_bucket{{{C}, {N}, {M}}}[{RATE}])))", "{{node}} {{deployment}} p50"),
               target(f"histogram_quantile(0.95, sum by (le, node, deployment) (rate(gen_ai_server_time_to_first_token_seconds_bucket{{{C}, {N}, {M}}}[{RATE}])))", "{{node}} {{deployment}} p95")], w=12, unit="s"),
        panel("Self-test cases", "The node's latest qualification: cases by suite and result (flagged/missed are negative controls).",
              [target(f"sum by (node, suite, result) (brink_selftest_cases{{{C}, {N}}})", instant=True)], "table", w=12),
        panel("KV cache blocks", "Paged KV blocks of the node's replicas: held by sequences, kept for prefix reuse, all.",
              [target(f"sum by (node) (brink_kv_blocks_used{{{C}, {N}, {M}}})", "{{node}} used"), target(f"sum by (node) (brink_kv_blocks_cached{{{C}, {N}, {M}}})", "{{node}} cached"),
               target(f"sum by (node) (brink_kv_blocks_total{{{C}, {N}, {M}}})", "{{node}} total")], w=12),
    ])


def selftest():
    return dashboard("brink-selftest", "brink / Self-test matrix", "Which node fails which kernel, and each node's qualification and envelope per shape class.", ["cluster", "node"], [
        panel("Failed or hung kernel cases, node × kernel", "Cases of the latest qualification that failed or hung, per kernel (0: all of its cases passed or were skipped).",
              [target(f'sum by (node, kernel) (brink_selftest_kernel_cases{{{C}, {N}, result=~"failed|hung"}}) or sum by (node, kernel) (0 * brink_selftest_kernel_cases{{{C}, {N}}})', instant=True)],
              "table", w=24, h=9, transformations=matrix("node", "kernel"),
              fieldConfig={"defaults": {"unit": "none", "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}]},
                                        "custom": {"cellOptions": {"type": "color-background"}}}, "overrides": []}),
        panel("Passed kernel cases, node × kernel", "Cases of the latest qualification that passed, per kernel.",
              [target(f'sum by (node, kernel) (brink_selftest_kernel_cases{{{C}, {N}, result="passed"}})', instant=True)], "table", w=24, h=9, transformations=matrix("node", "kernel")),
        panel("Qualification state, node × shape class", "The state each node holds for each shape class.",
              [target(qualification_code(f"{C}, {N}"), instant=True)], "table", w=12, transformations=matrix("node", "shape_class"),
              fieldConfig={"defaults": {"unit": "none", "mappings": QUAL_MAPPINGS, "custom": {"cellOptions": {"type": "color-background"}}}, "overrides": []}),
        panel("Envelope: max batch tokens, node × shape class", "The largest batch the node validated for the class (clamped below its first failure).",
              [target(f"max by (node, shape_class) (brink_fleet_node_envelope_max_batch_tokens{{{C}, {N}}})", instant=True)], "table", w=12, transformations=matrix("node", "shape_class")),
        panel("Cases by shape class, kernel and result", "Every (shape class, suite, kernel, result) count of each node's latest qualification.",
              [target(f"sum by (node, shape_class, suite, kernel, result) (brink_selftest_kernel_cases{{{C}, {N}}})", instant=True)], "table", w=12, h=10),
        panel("Cases by suite and result", "Kernel and model suites: passed, failed, hung, skipped, and the negative controls (flagged, missed).",
              [target(f"sum by (node, suite, result) (brink_selftest_cases{{{C}, {N}}})", instant=True)], "table", w=12, h=10),
    ])


def deployments():
    hq = lambda q, series: f"histogram_quantile({q}, sum by (le, deployment) (rate({series}_bucket{{{C}, {N}, {M}}}[{RATE}])))"
    by_dep = lambda series: f"sum by (deployment) (rate({series}{{{C}, {N}, {M}}}[{RATE}]))"
    gauge = lambda series: f"sum by (deployment) ({series}{{{C}, {N}, {M}}})"
    ttft, itl, dur = "gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds", "gen_ai_server_request_duration_seconds"
    return dashboard("brink-deployments", "brink / Deployments", "Latency, throughput, queue, KV cache and errors of the ModelDeployments' replicas.", ["cluster", "node", "model"], [
        panel("Time to first token", "Submission to first token, p50/p95/p99 per deployment.",
              [target(hq(0.5, ttft), "{{deployment}} p50"), target(hq(0.95, ttft), "{{deployment}} p95"), target(hq(0.99, ttft), "{{deployment}} p99")], w=12, unit="s"),
        panel("Inter-token latency", "Time per output token after the first, p50/p95/p99 per deployment.",
              [target(hq(0.5, itl), "{{deployment}} p50"), target(hq(0.95, itl), "{{deployment}} p95"), target(hq(0.99, itl), "{{deployment}} p99")], w=12, unit="s"),
        panel("Output tokens/s", "Tokens generated per second, per deployment.", [target(by_dep("brink_completion_tokens_total"), "{{deployment}}")], w=8),
        panel("Prompt tokens/s", "Prompt tokens admitted per second, per deployment.", [target(by_dep("brink_prompt_tokens_total"), "{{deployment}}")], w=8),
        panel("Request duration p95", "Submission to last token, p95 per deployment.", [target(hq(0.95, dur), "{{deployment}}")], w=8, unit="s"),
        panel("Queue depth and running", "Sequences waiting for admission and in the running batch.",
              [target(gauge("brink_requests_waiting"), "{{deployment}} waiting"), target(gauge("brink_requests_running"), "{{deployment}} running")], w=12),
        panel("KV cache blocks", "Paged KV blocks held by sequences, kept for prefix reuse, and all.",
              [target(gauge("brink_kv_blocks_used"), "{{deployment}} used"), target(gauge("brink_kv_blocks_cached"), "{{deployment}} cached"), target(gauge("brink_kv_blocks_total"), "{{deployment}} total")], w=12),
        panel("Prefix reuse ratio", "Share of prompt tokens read from the prefix cache instead of computed.",
              [target(f"{by_dep('brink_prefix_cached_tokens_total')} / {by_dep('brink_prompt_tokens_total')}", "{{deployment}}")], w=8, unit="percentunit"),
        panel("Requests and errors per second", "Generation requests received, and those answered with an error.",
              [target(by_dep("brink_requests_total"), "{{deployment}} requests"), target(by_dep("brink_request_errors_total"), "{{deployment}} errors")], w=8, unit="reqps"),
        panel("Error ratio", "Errors over requests.", [target(f"{by_dep('brink_request_errors_total')} / {by_dep('brink_requests_total')}", "{{deployment}}")], w=8, unit="percentunit"),
        panel("Engine restarts", "Engine child restarts (stall or crash) in the range, per deployment.",
              [target(f"sum by (deployment) (increase(brink_engine_restarts_total{{{C}, {N}, {M}}}[{RANGE}]))", "{{deployment}}", instant=True)], "bargauge", w=8),
        panel("Replicas: desired, ready, unplaced", "The operator's count of each deployment's replicas.",
              [target(f"sum by (namespace, deployment, state) (brink_fleet_deployment_replicas{{{C}}})", "{{deployment}} {{state}}")], w=8),
        panel("Tokens per request", "Mean input and output tokens per request (GenAI token usage).",
              [target(f"sum by (deployment, gen_ai_token_type) (rate(gen_ai_client_token_usage_sum{{{C}, {N}, {M}}}[{RATE}])) / sum by (deployment, gen_ai_token_type) (rate(gen_ai_client_token_usage_count{{{C}, {N}, {M}}}[{RATE}]))",
                      "{{deployment}} {{gen_ai_token_type}}")], w=8),
    ])


def gateway():
    """The gateway's own series (docs/metrics.md, "Gateway"): its `model` is the name clients ask
    for, and its `upstream` the replica's URL."""
    # `node` is the gateway Pod's node (with several gateway replicas, one of them).
    g = f"{C}, {N}"
    rate = lambda series, by, extra="": f"sum by ({by}) (rate({series}{{{g}, {M}{extra}}}[{RATE}]))"
    # A counter with no series yet (no retry, no affinity key so far) reads 0, not "no data".
    zero = f"sum by (model) (0 * rate(brink_gateway_requests_total{{{g}, {M}}}[{RATE}]))"
    first = "brink_gateway_time_to_first_byte_seconds_bucket"
    hq = lambda q: f'histogram_quantile({q}, sum by (le, model) (rate({first}{{{g}, {M}, stream="true"}}[{RATE}])))'
    failed = rate("brink_gateway_requests_total", "model, status", ', status!~"2.."')
    return dashboard("brink-gateway", "brink / Gateway", "The fleet gateway: replicas' health, rejections, and per model its requests, time to first token, errors and retries.",
                     ["cluster", "node", "model"], [
        panel("Healthy replicas", "Replicas whose /ready answers 200, as the gateway polls them.", [target(f"sum(brink_gateway_upstream_healthy{{{g}}})", instant=True)], "stat", w=6, h=4),
        panel("Requests in flight", "Requests the gateway holds, from routing to the end of the answer.", [target(f"sum(brink_gateway_model_in_flight{{{g}}})", instant=True)], "stat", w=6, h=4),
        panel("Requests/s", "Attempts at replicas per second, every status.", [target(f"sum(rate(brink_gateway_requests_total{{{g}}}[{RATE}]))", instant=True)], "stat", w=6, h=4, unit="reqps"),
        panel("Rejected/s", "Requests the gateway answered itself per second (unknown model, bad request, key, no healthy replica, over context).",
              [target(f"sum(rate(brink_gateway_rejections_total{{{g}}}[{RATE}]))", instant=True)], "stat", w=6, h=4, unit="reqps"),
        panel("Rejections by reason", "Requests the gateway answered itself, by reason (they carry no model: some never named one).",
              [target(f"sum by (reason) (rate(brink_gateway_rejections_total{{{g}}}[{RATE}]))", "{{reason}}")], w=8, unit="reqps"),
        panel("Replica health", "1 while a replica's /ready answers 200.", [target(f"max by (upstream) (brink_gateway_upstream_healthy{{{g}}})", "{{upstream}}")], w=8),
        panel("In flight per replica", "Requests the gateway has in flight to each replica.", [target(f"sum by (upstream) (brink_gateway_upstream_in_flight{{{g}}})", "{{upstream}}")], w=8),
        row("Model $model", repeat="model"),
        panel("Requests by status", "Attempts at a replica per second, by the status it answered (`error`: the connection failed before a response or its body).",
              [target(rate("brink_gateway_requests_total", "model, status"), "{{model}} {{status}}")], w=8, unit="reqps"),
        panel("Time to first token", "From the request's arrival at the gateway to the first event of a successful stream (a brink replica sends it with the first token), retries included: p50/p95/p99.",
              [target(hq(0.5), "{{model}} p50"), target(hq(0.95), "{{model}} p95"), target(hq(0.99), "{{model}} p99")], w=8, unit="s"),
        panel("Requests in flight", "Requests of the model the gateway holds: the queue the optional autoscaler reads.",
              [target(f"sum by (model) (brink_gateway_model_in_flight{{{g}, {M}}})", "{{model}}")], w=8),
        panel("Errors by reason", "Attempts a replica did not answer with a success, by status (`503` restarting or overloaded, `429` queue full, `error` connection failed, 4xx the client's).",
              [target(f"{failed} or {zero}", "{{model}} {{status}}")], w=8, unit="reqps"),
        panel("Retries by reason", "Requests sent on to another replica, by why the previous refused (before any byte reached the client).",
              [target(f"{rate('brink_gateway_retries_total', 'model, reason')} or {zero}", "{{model}} {{reason}}")], w=8, unit="reqps"),
        panel("Prefix affinity", "Requests sent first to their prompt prefix's replica, and prefixes moved off a replica with no room, by why.",
              [target(f"{rate('brink_gateway_affinity_hits_total', 'model')} or {zero}", "{{model}} hits"),
               target(f"{rate('brink_gateway_affinity_moves_total', 'model, reason')} or {zero}", "{{model}} moved {{reason}}")], w=8, unit="reqps"),
    ], queries={"model": 'label_values(brink_gateway_requests_total{cluster=~"$cluster"}, model)'})


SWEEP_METRICS = [("outputTokensPerS", "Output tokens/s", "short"), ("ttftP50S", "TTFT p50", "s"), ("itlP50S", "Inter-token latency p50", "s")]


def sweeps():
    f = f"{C}, {S}"
    panels = []
    for metric, name, unit in SWEEP_METRICS:
        sel = f'{f}, {N}, metric="{metric}"'
        panels.append(panel(f"{name}: node vs baseline vs fleet median", f"Each node's latest judged {name} per grid point, the baseline it was judged against, and the median of identical nodes.",
                            [target(f"brink_sweep_figure{{{sel}}}", "{{node}} p{{prompt_tokens}} c{{concurrency}} g{{gen_tokens}}"),
                             target(f"brink_sweep_baseline_figure{{{sel}}}", "{{node}} baseline p{{prompt_tokens}} c{{concurrency}} g{{gen_tokens}}"),
                             target(f'brink_sweep_fleet_median{{{f}, metric="{metric}"}}', "fleet median p{{prompt_tokens}} c{{concurrency}} g{{gen_tokens}}")], w=8, unit=unit))
    panels += [
        panel("Verdict per node (latest complete run)", "Pass, Outlier, Regressed, Failed, Hung or Lost for each node in each sweep's latest complete run.",
              [target(f"max by (sweep, node, verdict) (brink_sweep_node_verdict{{{f}, {N}}}) == 1", instant=True)], "table", w=12,
              transformations=[{"id": "groupingToMatrix", "options": {"rowField": "node", "columnField": "sweep", "valueField": "verdict"}}]),
        panel("Nodes by verdict over time", "How many nodes held each verdict in the latest complete run.",
              [target(f"sum by (verdict) (brink_sweep_node_verdict{{{f}, {N}}})", "{{verdict}}")], w=12),
        panel("Change vs baseline (%)", "Each node's latest figure against its baseline: negative throughput or positive latency is worse.",
              [target(f"100 * (brink_sweep_figure{{{f}, {N}}} / brink_sweep_baseline_figure{{{f}, {N}}} - 1)", "{{node}} {{metric}} p{{prompt_tokens}} c{{concurrency}} g{{gen_tokens}}")], w=12, unit="percent"),
        panel("Drift from fleet median (%)", "Each node's latest figure against the median of identical nodes: the outlier test.",
              [target(f"100 * (brink_sweep_figure{{{f}, {N}}} / on (namespace, sweep, prompt_tokens, concurrency, gen_tokens, metric) group_left brink_sweep_fleet_median{{{f}}} - 1)",
                      "{{node}} {{metric}} p{{prompt_tokens}} c{{concurrency}} g{{gen_tokens}}")], w=12, unit="percent"),
        panel("Regressions per node and metric", "Regression findings in the range.",
              [target(f"sum by (sweep, node, metric) (increase(brink_sweep_regressions_total{{{f}, {N}}}[{RANGE}]))", "{{node}} {{metric}}", instant=True)], "bargauge", w=8),
        panel("Outliers per node and metric", "Outlier findings in the range.",
              [target(f"sum by (sweep, node, metric) (increase(brink_sweep_outliers_total{{{f}, {N}}}[{RANGE}]))", "{{node}} {{metric}}", instant=True)], "bargauge", w=8),
        panel("Runs by verdict", "Completed runs in the range, by the run's verdict.",
              [target(f"sum by (sweep, verdict) (increase(brink_sweep_runs_total{{{f}}}[{RANGE}]))", "{{sweep}} {{verdict}}", instant=True)], "bargauge", w=8),
        panel("Time since the last complete run", "A sweep that stopped completing (schedule, Forbid with a stuck run) shows here.",
              [target(f"time() - max by (sweep) (brink_sweep_last_completion_timestamp_seconds{{{f}}})", "{{sweep}}")], w=12, unit="s"),
        panel("Agent sweep runs by result", "Sweeps the nodes' agents ran in the range: Done or Failed (0 where none ran).",
              [target(f"sum by (node, result) (increase(brink_agent_sweeps_total{{{C}, {N}}}[{RANGE}])) or sum by (node) (0 * brink_model_cache_bytes{{{C}, {N}}})", "{{node}} {{result}}", instant=True)], "bargauge", w=12),
    ]
    return dashboard("brink-sweeps", "brink / Sweep trends", "RegressionSweep figures over time against baselines and the fleet median; verdicts, regressions and outliers.",
                     ["cluster", "node", "sweep"], panels)


def main():
    out = pathlib.Path(__file__).resolve().parent
    for name, build in [("fleet-overview", fleet), ("node-drilldown", node), ("selftest-matrix", selftest), ("deployments", deployments), ("sweep-trends", sweeps), ("gateway", gateway)]:
        (out / f"{name}.json").write_text(json.dumps(build(), indent=2) + "\n")


if __name__ == "__main__":
    main()
