//! The Prometheus text format (0.0.4) of the telemetry store, and a strict reader of it that
//! the tests (and `scripts/prom-check`'s test) use to prove each line parses. Pure.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::histogram::{Histogram, Labels};
use super::{GenAiMetric, Kind, Scalar};

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn label_set(labels: &Labels, extra: Option<(&str, String)>) -> String {
    let mut parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{}\"", escape(&v)));
    }
    if parts.is_empty() { String::new() } else { format!("{{{}}}", parts.join(",")) }
}

/// `le` as Prometheus clients write it (`0.5`, `1.0`, `+Inf`).
fn le(bound: f64) -> String {
    if bound.fract() == 0.0 { format!("{bound:.1}") } else { bound.to_string() }
}

pub fn render_scalars(out: &mut String, scalars: &[Scalar]) {
    for s in scalars {
        let kind = match s.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = write!(out, "# HELP {} {}\n# TYPE {} {kind}\n", s.name, s.help, s.name);
        for (labels, v) in &s.samples {
            let _ = writeln!(out, "{}{} {v}", s.name, label_set(labels, None));
        }
    }
}

pub fn render_histogram(out: &mut String, m: &GenAiMetric, h: &Histogram) {
    let _ = write!(out, "# HELP {} {}\n# TYPE {} histogram\n", m.prom, m.help, m.prom);
    for (labels, s) in h.snapshot() {
        let mut cumulative = 0;
        for (i, &bound) in h.bounds().iter().enumerate() {
            cumulative += s.buckets[i];
            let _ = writeln!(out, "{}_bucket{} {cumulative}", m.prom, label_set(&labels, Some(("le", le(bound)))));
        }
        let _ = writeln!(out, "{}_bucket{} {}", m.prom, label_set(&labels, Some(("le", "+Inf".into()))), s.count);
        let _ = writeln!(out, "{}_sum{} {}", m.prom, label_set(&labels, None), s.sum);
        let _ = writeln!(out, "{}_count{} {}", m.prom, label_set(&labels, None), s.count);
    }
}

/// One sample line read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `{k="v",…}` at the start of `s`: the labels and the rest.
/// Label pairs as read back.
pub type ReadLabels = Vec<(String, String)>;

fn parse_labels(s: &str, line_no: usize) -> Result<(ReadLabels, &str), String> {
    let err = |what: &str| format!("line {line_no}: {what}");
    let mut rest = s.strip_prefix('{').ok_or_else(|| err("expected `{`"))?;
    let mut labels = Vec::new();
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or_else(|| err("a label without `=`"))?;
        let key = &rest[..eq];
        if !valid_name(key) {
            return Err(err(&format!("label name {key:?}")));
        }
        rest = rest[eq + 1..].strip_prefix('"').ok_or_else(|| err("a label value without quotes"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err(err("a bad escape in a label value")),
                },
                Some((_, c)) => value.push(c),
                None => return Err(err("an unterminated label value")),
            }
        };
        labels.push((key.to_string(), value));
        rest = &rest[end + 1..];
    }
}

/// Reads an exposition strictly: every line is `# HELP`, `# TYPE` (each once per name, TYPE
/// before its samples) or `name{labels} value`; histogram buckets are cumulative.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let mut helps = HashSet::new();
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !valid_name(name) || !helps.insert(name.to_string()) {
                return Err(format!("line {line_no}: HELP for {name:?} is invalid or repeated"));
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| format!("line {line_no}: TYPE without a kind"))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(format!("line {line_no}: unknown type {kind:?}"));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(format!("line {line_no}: TYPE for {name} repeated"));
            }
        } else if line.starts_with('#') || line.is_empty() {
            continue;
        } else {
            let name_end = line.find(['{', ' ']).ok_or_else(|| format!("line {line_no}: no value"))?;
            let name = &line[..name_end];
            if !valid_name(name) {
                return Err(format!("line {line_no}: metric name {name:?}"));
            }
            let (labels, rest) =
                if line[name_end..].starts_with('{') { parse_labels(&line[name_end..], line_no)? } else { (Vec::new(), &line[name_end..]) };
            let value_text = rest.strip_prefix(' ').ok_or_else(|| format!("line {line_no}: no space before the value"))?;
            let value = match value_text {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse::<f64>().map_err(|e| format!("line {line_no}: value {v:?}: {e}"))?,
            };
            let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).filter(|f| types.contains_key(*f));
            let family = family.unwrap_or(name);
            if !types.contains_key(family) {
                return Err(format!("line {line_no}: sample {name} before (or without) its TYPE"));
            }
            samples.push(Sample { name: name.to_string(), labels, value });
        }
    }
    check_buckets(&samples)?;
    Ok(samples)
}

/// Each histogram series' buckets never decrease and end at its `_count`.
fn check_buckets(samples: &[Sample]) -> Result<(), String> {
    let mut last: HashMap<(String, Vec<(String, String)>), f64> = HashMap::new();
    for s in samples {
        if let Some(family) = s.name.strip_suffix("_bucket") {
            let key: Vec<(String, String)> = s.labels.iter().filter(|(k, _)| k != "le").cloned().collect();
            let prev = last.insert((family.to_string(), key), s.value).unwrap_or(0.0);
            if s.value < prev {
                return Err(format!("{} {:?}: buckets decrease", s.name, s.labels));
            }
        }
    }
    for s in samples {
        if let Some(family) = s.name.strip_suffix("_count")
            && let Some(&inf) = last.get(&(family.to_string(), s.labels.clone()))
            && inf != s.value
        {
            return Err(format!("{family}: the +Inf bucket {inf} is not the count {}", s.value));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_expositions_are_named() {
        let cases = [
            ("# TYPE a counter\n# TYPE a counter\na 1\n", "repeated"),
            ("# HELP a x\n# HELP a y\n", "repeated"),
            ("a 1\n", "without) its TYPE"),
            ("# TYPE a counter\na{b=\"1} 2\n", "unterminated"),
            ("# TYPE a counter\na one\n", "value"),
            ("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n", "decrease"),
            ("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n", "not the count"),
            ("# TYPE a gauge\n9a 1\n", "metric name"),
        ];
        for (text, want) in cases {
            let e = parse_exposition(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
