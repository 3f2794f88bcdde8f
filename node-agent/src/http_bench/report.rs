//! The results as a table a person reads, CSV (one row per point) and JSON (the run's settings,
//! the server's `/v1/models` answer and one object per point).

use serde_json::{Value, json};

use super::stats::{PointResult, Summary};

fn ms(s: Option<Summary>, pick: fn(&Summary) -> f64) -> String {
    s.map(|s| format!("{:.1}", pick(&s) * 1e3)).unwrap_or_else(|| "-".into())
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map(|x| format!("{x:.digits$}")).unwrap_or_else(|| "-".into())
}

/// The table: one line per point; latencies in milliseconds (end-to-end in seconds).
pub fn table(points: &[PointResult]) -> String {
    let head = [
        "prompt",
        "conc",
        "gen",
        "ok",
        "rej",
        "fail",
        "in tok",
        "out tok",
        "req/s",
        "out tok/s",
        "tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "e2e p50 s",
    ];
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.prompt_tokens.to_string(),
                p.concurrency.to_string(),
                p.max_tokens.to_string(),
                p.requests.to_string(),
                p.rejected.to_string(),
                p.failed.values().sum::<u64>().to_string(),
                opt(p.mean_prompt_tokens, 0),
                opt(p.mean_output_tokens, 1),
                format!("{:.2}", p.request_throughput),
                format!("{:.1}", p.output_tokens_per_s),
                format!("{:.1}", p.total_tokens_per_s),
                ms(p.ttft_s, |s| s.p50),
                ms(p.ttft_s, |s| s.p99),
                ms(p.itl_s, |s| s.p50),
                ms(p.itl_s, |s| s.p99),
                opt(p.e2e_s.map(|s| s.p50), 2),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..head.len()).map(|i| rows.iter().map(|r| r[i].len()).chain([head[i].len()]).max().unwrap_or(0)).collect();
    let line = |cells: &[String]| cells.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect::<Vec<_>>().join("  ");
    let mut out = line(&head.map(String::from)) + "\n";
    for r in &rows {
        out += &line(r);
        out.push('\n');
    }
    let failures: Vec<String> = points
        .iter()
        .filter(|p| !p.failed.is_empty())
        .map(|p| {
            let kinds: Vec<String> = p.failed.iter().map(|(k, n)| format!("{n} x {k}")).collect();
            format!("failed at prompt {} conc {} gen {}: {}", p.prompt_tokens, p.concurrency, p.max_tokens, kinds.join(", "))
        })
        .collect();
    for f in failures {
        out += &f;
        out.push('\n');
    }
    out
}

const SUMMARIES: [&str; 3] = ["ttft", "itl", "e2e"];

/// CSV with a header; empty cells where a point has no successful request.
pub fn csv(points: &[PointResult]) -> String {
    let mut head: Vec<String> = [
        "prompt_tokens",
        "concurrency",
        "max_tokens",
        "requests",
        "rejected",
        "failed",
        "failed_by_kind",
        "duration_s",
        "mean_prompt_tokens",
        "mean_output_tokens",
        "request_throughput",
        "output_tokens_per_s",
        "total_tokens_per_s",
    ]
    .map(String::from)
    .to_vec();
    for s in SUMMARIES {
        head.extend(["mean", "p50", "p90", "p99"].map(|q| format!("{s}_{q}_s")));
    }
    let num = |x: Option<f64>| x.map(|x| format!("{x}")).unwrap_or_default();
    let mut out = head.join(",") + "\n";
    for p in points {
        let kinds: Vec<String> = p.failed.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        let mut row = vec![
            p.prompt_tokens.to_string(),
            p.concurrency.to_string(),
            p.max_tokens.to_string(),
            p.requests.to_string(),
            p.rejected.to_string(),
            p.failed.values().sum::<u64>().to_string(),
            // `;` inside, so the cell needs no quoting.
            kinds.join(";"),
            num(Some(p.duration_s)),
            num(p.mean_prompt_tokens),
            num(p.mean_output_tokens),
            num(Some(p.request_throughput)),
            num(Some(p.output_tokens_per_s)),
            num(Some(p.total_tokens_per_s)),
        ];
        for s in [p.ttft_s, p.itl_s, p.e2e_s] {
            row.extend([s.map(|s| s.mean), s.map(|s| s.p50), s.map(|s| s.p90), s.map(|s| s.p99)].map(num));
        }
        out += &row.join(",");
        out.push('\n');
    }
    out
}

/// The JSON document: `settings` (the run's flags), `server` (URL and `/v1/models`), `points`.
pub fn json_doc(settings: Value, url: &str, models: Value, points: &[PointResult]) -> Value {
    json!({
        "settings": settings,
        "server": {"url": url, "models": models},
        "points": points,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn point(requests: u64) -> PointResult {
        let s = Summary { mean: 0.02, p50: 0.015, p90: 0.03, p99: 0.05 };
        PointResult {
            prompt_tokens: 128,
            concurrency: 4,
            max_tokens: 64,
            requests,
            rejected: 1,
            failed: BTreeMap::from([("500".to_string(), 2), ("connection".to_string(), 1)]),
            duration_s: 2.0,
            mean_prompt_tokens: (requests > 0).then_some(129.0),
            mean_output_tokens: (requests > 0).then_some(64.0),
            request_throughput: requests as f64 / 2.0,
            output_tokens_per_s: 128.0,
            total_tokens_per_s: 386.0,
            ttft_s: (requests > 0).then_some(s),
            itl_s: (requests > 0).then_some(s),
            e2e_s: (requests > 0).then_some(s),
        }
    }

    #[test]
    fn csv_has_one_row_per_point_and_stable_columns() {
        let text = csv(&[point(4), point(0)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let head: Vec<&str> = lines[0].split(',').collect();
        assert_eq!(head.len(), 25);
        assert_eq!(&head[..4], ["prompt_tokens", "concurrency", "max_tokens", "requests"]);
        assert_eq!(head[24], "e2e_p99_s");
        for l in &lines[1..] {
            assert_eq!(l.split(',').count(), 25, "{l}");
        }
        let row: Vec<&str> = lines[1].split(',').collect();
        assert_eq!((row[3], row[5], row[6], row[14]), ("4", "3", "500:2;connection:1", "0.015"));
        let empty: Vec<&str> = lines[2].split(',').collect();
        assert_eq!((empty[3], empty[8], empty[13]), ("0", "", ""));
    }

    #[test]
    fn json_has_settings_server_and_points() {
        let doc = json_doc(json!({"seed": 3}), "http://h:1", json!({"data": [{"id": "m"}]}), &[point(4), point(0)]);
        assert_eq!(doc["settings"]["seed"], 3);
        assert_eq!(doc["server"]["models"]["data"][0]["id"], "m");
        let p = &doc["points"][0];
        assert_eq!((p["requests"].as_u64(), p["rejected"].as_u64(), p["failed"]["500"].as_u64()), (Some(4), Some(1), Some(2)));
        assert_eq!(p["ttft_s"]["p99"].as_f64(), Some(0.05));
        assert!(doc["points"][1]["ttft_s"].is_null());
        assert_eq!(doc["points"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn table_lines_up_and_names_failures() {
        let t = table(&[point(4), point(0)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert_eq!(lines[0].len(), lines[1].len(), "{t}");
        assert_eq!(lines[1].len(), lines[2].len(), "{t}");
        assert!(lines[1].contains("15.0") && lines[1].contains("50.0"), "TTFT in ms: {t}");
        assert!(lines[2].contains(" -"), "{t}");
        assert_eq!(lines[3], "failed at prompt 128 conc 4 gen 64: 2 x 500, 1 x connection");
    }
}
