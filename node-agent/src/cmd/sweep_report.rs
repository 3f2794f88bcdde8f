//! `brink-agent sweep-report FILE...`: sweep results (files written by `sweep`, or
//! `kubectl get sweepresults -o json`, one object or a List) as tables, JSON or CSV, and with
//! `--trend` each node's figures across its runs, oldest first.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use brink_api::crd::SweepResult;

use crate::error::Error;
use crate::sweep::figures;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
}

#[derive(clap::Args)]
pub struct ReportArgs {
    /// SweepResult JSON files (single objects or Lists).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Per node, its figures across the runs in the files (table format).
    #[arg(long)]
    trend: bool,
}

/// Every SweepResult in `text`: one object, or a List's `items`.
pub fn parse_results(text: &str, file: &Path) -> Result<Vec<SweepResult>, Error> {
    let parse =
        |expected, reason: serde_json::Error| Error::Parse { flag: None, path: file.to_path_buf(), expected, reason: reason.to_string() };
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| parse("JSON", e))?;
    let items = match v.get("items").and_then(|i| i.as_array()) {
        Some(items) => items.clone(),
        None => vec![v],
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| serde_json::from_value(item).map_err(|e| Error::content(None, file, format!("item {i}: not a SweepResult: {e}"))))
        .collect()
}

pub fn run_report(a: ReportArgs) -> ExitCode {
    let mut results = Vec::new();
    for f in &a.files {
        match std::fs::read_to_string(f).map_err(|e| Error::read(None, f, e)).and_then(|t| parse_results(&t, f)) {
            Ok(mut r) => results.append(&mut r),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    // Oldest first: the order runs happened in.
    results.sort_by_key(|r| r.status.as_ref().and_then(|s| s.started_at.as_ref().map(|t| t.0)));
    print!("{}", render(&results, a.format, a.trend));
    ExitCode::SUCCESS
}

pub fn render(results: &[SweepResult], format: Format, trend: bool) -> String {
    let empty = Default::default();
    let status = |r: &SweepResult| r.status.as_ref().unwrap_or(&empty).clone();
    match format {
        Format::Json => serde_json::to_string_pretty(results).unwrap_or_default() + "\n",
        Format::Csv => {
            let statuses: Vec<_> = results.iter().map(status).collect();
            let rows: Vec<(String, String, &_)> =
                results.iter().zip(&statuses).map(|(r, s)| (r.spec.run.clone(), r.spec.node.clone(), s)).collect();
            figures::csv(&rows)
        }
        Format::Table if trend => {
            let mut nodes: Vec<&str> = results.iter().map(|r| r.spec.node.as_str()).collect();
            nodes.sort();
            nodes.dedup();
            let statuses: Vec<_> = results.iter().map(status).collect();
            nodes
                .iter()
                .map(|n| {
                    let runs: Vec<(String, &_)> =
                        results.iter().zip(&statuses).filter(|(r, _)| r.spec.node == *n).map(|(r, s)| (r.spec.run.clone(), s)).collect();
                    figures::trend(n, &runs)
                })
                .collect::<Vec<_>>()
                .join("\n")
        }
        Format::Table => results.iter().map(|r| figures::table(&r.spec.node, &r.spec.run, &status(r))).collect::<Vec<_>>().join("\n"),
    }
}
