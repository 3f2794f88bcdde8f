//! Reading Grafana dashboards, pure: loading `dashboards/*.json`, the structural rules a
//! dashboard must meet, its panels' targets, the series names in a PromQL expression, the series
//! docs/metrics.md documents, and filling in the template variables.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

/// Every `*.json` of `dir` as `(file name, document)`, sorted by name.
pub fn dashboards(dir: &Path) -> Result<Vec<(String, Value)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let doc = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        out.push((path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string(), doc));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// One query of one panel.
#[derive(Debug, Clone, PartialEq)]
pub struct PanelTarget {
    pub panel: String,
    pub expr: String,
}

/// The panels of a dashboard, rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

pub fn panel_targets(d: &Value) -> Vec<PanelTarget> {
    let mut out = Vec::new();
    for p in panels(d) {
        let title = p["title"].as_str().unwrap_or("(untitled)");
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(PanelTarget { panel: title.to_string(), expr: t["expr"].as_str().unwrap_or_default().to_string() });
        }
    }
    out
}

/// Variables Grafana defines itself.
const BUILTIN_VARIABLES: [&str; 5] = ["__rate_interval", "__range", "__interval", "__range_s", "__interval_ms"];

/// `$name` and `${name}` (and `${name:format}`) references in `text`.
pub fn variable_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' {
            let (start, braced) = if b.get(i + 1) == Some(&b'{') { (i + 2, true) } else { (i + 1, false) };
            let end = start + b[start..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
            if end > start {
                out.insert(text[start..end].to_string());
            }
            i = if braced { end + b[end..].iter().position(|c| *c == b'}').map_or(0, |p| p + 1) } else { end };
        } else {
            i += 1;
        }
    }
    out
}

/// The rules a dashboard Grafana imports as intended must meet; each problem in words.
pub fn validate_dashboard(d: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for key in ["uid", "title"] {
        if d[key].as_str().is_none_or(str::is_empty) {
            problems.push(format!("no {key}"));
        }
    }
    match d["schemaVersion"].as_u64() {
        Some(v) if v >= 36 => {}
        other => problems.push(format!("schemaVersion {other:?}: expected a number >= 36 (Grafana 9+, datasource references by uid)")),
    }
    let vars: Vec<&Value> = d["templating"]["list"].as_array().map(|l| l.iter().collect()).unwrap_or_default();
    let var_names: BTreeSet<String> = vars.iter().filter_map(|v| v["name"].as_str().map(str::to_string)).collect();
    match vars.iter().find(|v| v["name"] == "datasource") {
        Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {}
        _ => problems.push("no `datasource` variable of type datasource over prometheus".into()),
    }
    for name in ["cluster", "node"] {
        if !var_names.contains(name) {
            problems.push(format!("no `{name}` variable"));
        }
    }
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let name = v["name"].as_str().unwrap_or_default();
        if v["datasource"]["uid"] != "${datasource}" {
            problems.push(format!("variable {name}: datasource is not ${{datasource}}"));
        }
        let q = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or_default();
        if !q.starts_with("label_values(") {
            problems.push(format!("variable {name}: query {q:?} is not label_values(...)"));
        }
    }
    let ds_ok = |v: &Value| v["uid"] == "${datasource}" && v["type"] == "prometheus";
    let mut ids = BTreeSet::new();
    let mut used = BTreeSet::new();
    for p in panels(d) {
        let title = p["title"].as_str().unwrap_or_default();
        if title.is_empty() {
            problems.push(format!("panel {} has no title", p["id"]));
        }
        if p["type"] == "row" {
            continue;
        }
        match p["id"].as_u64() {
            Some(id) if ids.insert(id) => {}
            Some(id) => problems.push(format!("panel {title:?}: id {id} is not unique")),
            None => problems.push(format!("panel {title:?}: no numeric id")),
        }
        let g = &p["gridPos"];
        match (g["x"].as_u64(), g["y"].as_u64(), g["w"].as_u64(), g["h"].as_u64()) {
            (Some(x), Some(_), Some(w), Some(h)) if w >= 1 && h >= 1 && x + w <= 24 => {}
            _ => problems.push(format!("panel {title:?}: gridPos {g} is not on the 24-column grid")),
        }
        if !ds_ok(&p["datasource"]) {
            problems.push(format!("panel {title:?}: datasource {} is not the ${{datasource}} prometheus variable", p["datasource"]));
        }
        let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("panel {title:?}: no query"));
        }
        let mut ref_ids = BTreeSet::new();
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            if expr.trim().is_empty() {
                problems.push(format!("panel {title:?}: a target without an expression"));
            }
            if !ds_ok(&t["datasource"]) {
                problems.push(format!("panel {title:?}: target {} does not use ${{datasource}}", t["refId"]));
            }
            if !t["refId"].as_str().is_some_and(|r| ref_ids.insert(r.to_string())) {
                problems.push(format!("panel {title:?}: refId {} missing or repeated", t["refId"]));
            }
            for v in variable_refs(expr) {
                if !var_names.contains(&v) && !BUILTIN_VARIABLES.contains(&v.as_str()) {
                    problems.push(format!("panel {title:?}: ${v} is not a variable of the dashboard"));
                }
                used.insert(v);
            }
        }
    }
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let name = v["name"].as_str().unwrap_or_default();
        if !used.contains(name) {
            problems.push(format!("variable {name} is defined but no panel uses it"));
        }
    }
    problems
}

/// PromQL words that are not series: aggregations, functions' keywords, set operators.
const KEYWORDS: [&str; 14] =
    ["by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless", "inf", "nan", "atan2"];
/// Aggregations, which may be followed by `by (...)` before their parenthesis.
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "limitk",
    "limit_ratio",
];

/// The series an expression reads: identifiers that are not functions, aggregations, keywords,
/// label names (inside `{}`, `by (...)`, `on (...)`, ...), durations or strings.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    // After `by`/`on`/...: the next parenthesis holds label names.
    let mut label_list_next = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            i += if chars[i] == '\\' { 2 } else { 1 };
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' if label_list_next => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                label_list_next = false;
            }
            c if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace()).copied();
                let lower = word.to_ascii_lowercase();
                if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&lower.as_str()) {
                    label_list_next = next == Some('(');
                } else if KEYWORDS.contains(&lower.as_str()) || AGGREGATIONS.contains(&lower.as_str()) || next == Some('(') {
                    // a keyword, an aggregation or a function call
                } else {
                    out.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// The series named in docs/metrics.md: each backquoted `brink_…` or `gen_ai_…` name.
pub fn documented_series(markdown: &str) -> BTreeSet<String> {
    markdown
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| (s.starts_with("brink_") || s.starts_with("gen_ai_")) && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(str::to_string)
        .collect()
}

/// `expr` with each `$name`/`${name}` replaced by `values[name]`; a variable without a value is
/// an error naming it.
pub fn substitute(expr: &str, values: &BTreeMap<&str, String>) -> Result<String, String> {
    let mut out = expr.to_string();
    // Longest names first, so `$__range` does not eat the start of `$__range_s`.
    let mut refs: Vec<String> = variable_refs(expr).into_iter().collect();
    refs.sort_by_key(|r| std::cmp::Reverse(r.len()));
    for name in refs {
        let value = values.get(name.as_str()).ok_or_else(|| format!("no value for ${name}"))?;
        out = out.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value);
    }
    Ok(out)
}

#[test]
fn metric_names_skip_functions_labels_durations_and_keywords() {
    let e = r#"histogram_quantile(0.95, sum by (le, node) (rate(gen_ai_server_time_to_first_token_seconds_bucket{cluster=~"$cluster", node="a b"}[$__rate_interval])))"#;
    assert_eq!(metric_names(e), BTreeSet::from(["gen_ai_server_time_to_first_token_seconds_bucket".to_string()]));
    let e = r#"100 * (brink_sweep_figure{x="y"} / on (namespace, sweep) group_left brink_sweep_fleet_median - 1) or sum by (node) (0 * brink_model_cache_bytes) and time() - up offset 5m"#;
    let want = ["brink_model_cache_bytes", "brink_sweep_figure", "brink_sweep_fleet_median", "up"];
    assert_eq!(metric_names(e), want.iter().map(|s| s.to_string()).collect());
    assert_eq!(metric_names(r#"count({__name__="x"}) > 1e3"#), BTreeSet::new());
}

#[test]
fn documented_series_are_the_backquoted_names() {
    let md = "| `brink_a_total` | counter | `layer` |\n`gen_ai_x` and `brink_b`, `not a name`, `rate(brink_c[1m])`";
    assert_eq!(documented_series(md), ["brink_a_total", "brink_b", "gen_ai_x"].iter().map(|s| s.to_string()).collect());
}

#[test]
fn substitution_fills_both_forms_and_names_a_missing_variable() {
    let values = BTreeMap::from([("node", "a|b".to_string()), ("__range", "5m".to_string())]);
    assert_eq!(substitute(r#"x{node=~"$node"}[$__range] ${node}"#, &values).unwrap(), r#"x{node=~"a|b"}[5m] a|b"#);
    assert_eq!(substitute("x{c=~\"$cluster\"}", &values).unwrap_err(), "no value for $cluster");
    assert_eq!(variable_refs("${a:regex} $b_c x"), BTreeSet::from(["a".to_string(), "b_c".to_string()]));
}

#[test]
fn validation_names_each_broken_rule() {
    let d = serde_json::json!({
        "uid": "u", "title": "t", "schemaVersion": 16,
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"},
                                {"name": "cluster", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"}, "query": {"query": "label_values(x, cluster)"}}]},
        "panels": [
            {"id": 1, "type": "stat", "title": "a", "datasource": {"type": "prometheus", "uid": "${datasource}"}, "gridPos": {"x": 20, "y": 0, "w": 8, "h": 4},
             "targets": [{"refId": "A", "expr": "x{node=~\"$node\"}", "datasource": {"type": "prometheus", "uid": "prom-1"}}]},
            {"id": 1, "type": "stat", "title": "b", "datasource": {"type": "prometheus", "uid": "${datasource}"}, "gridPos": {"x": 0, "y": 0, "w": 8, "h": 4}, "targets": []}
        ]
    });
    let p = validate_dashboard(&d);
    for want in [
        "schemaVersion Some(16)",
        "no `node` variable",
        "panel \"a\": gridPos",
        "panel \"a\": target \"A\" does not use ${datasource}",
        "panel \"a\": $node is not a variable",
        "panel \"b\": id 1 is not unique",
        "panel \"b\": no query",
        "variable cluster is defined but no panel uses it",
    ] {
        assert!(p.iter().any(|x| x.starts_with(want)), "no problem {want:?} in {p:#?}");
    }
    assert_eq!(p.len(), 8, "{p:#?}");
}
