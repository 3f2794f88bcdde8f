//! `labelSelector` (equality- and set-based) and `fieldSelector` (`metadata.name`,
//! `metadata.namespace`) as the API server parses and matches them.

use serde_json::Value;

use crate::error::{ApiError, ApiResult};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas outside parentheses (`a in (x,y),b` is two requirements).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().map(str::trim).filter(|r| !r.is_empty()).collect()
}

fn set_values(s: &str, whole: &str) -> ApiResult<Vec<String>> {
    let inner =
        s.trim().strip_prefix('(').and_then(|r| r.strip_suffix(')')).ok_or_else(|| {
            ApiError::bad_request(format!("unable to parse requirement: expected a parenthesised value set in {whole:?}"))
        })?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

fn label_key(k: &str, whole: &str) -> ApiResult<String> {
    let k = k.trim();
    let valid = !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if valid {
        Ok(k.to_string())
    } else {
        Err(ApiError::bad_request(format!("unable to parse requirement: invalid label key {k:?} in {whole:?}")))
    }
}

impl LabelSelector {
    pub fn parse(s: &str) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        for r in split_top_level(s) {
            let req = if let Some(k) = r.strip_prefix('!') {
                Requirement::NotExists(label_key(k, s)?)
            } else if let Some((k, v)) = r.split_once("!=") {
                Requirement::NotEq(label_key(k, s)?, v.trim().to_string())
            } else if let Some((k, v)) = r.split_once("==") {
                Requirement::Eq(label_key(k, s)?, v.trim().to_string())
            } else if let Some((k, v)) = r.split_once('=') {
                Requirement::Eq(label_key(k, s)?, v.trim().to_string())
            } else if let Some((k, v)) = r.split_once(" notin ") {
                Requirement::NotIn(label_key(k, s)?, set_values(v, s)?)
            } else if let Some((k, v)) = r.split_once(" in ") {
                Requirement::In(label_key(k, s)?, set_values(v, s)?)
            } else {
                Requirement::Exists(label_key(r, s)?)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector over the fields every kind supports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        for r in split_top_level(s) {
            let (field, equal, value) = if let Some((f, v)) = r.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = r.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = r.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: {r:?}; expected field=value or field!=value")));
            };
            let field = field.trim();
            if field != "metadata.name" && field != "metadata.namespace" {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field} (the double supports metadata.name and metadata.namespace)"
                )));
            }
            reqs.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = if field == "metadata.name" { "/metadata/name" } else { "/metadata/namespace" };
            let actual = obj.pointer(pointer).and_then(Value::as_str).unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selector_cases() {
        let o = obj(json!({"app": "x", "tier": "gpu"}));
        let cases = [
            ("", true),
            ("app=x", true),
            ("app==x", true),
            ("app=y", false),
            ("app!=y", true),
            ("app!=x", false),
            ("app in (x, z)", true),
            ("app in (z)", false),
            ("app notin (z)", true),
            ("missing notin (z)", true),
            ("app notin (x)", false),
            ("tier", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=x,tier in (gpu,cpu)", true),
            ("app=x,tier=cpu", false),
        ];
        for (sel, want) in cases {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&o), want, "{sel}");
        }
        assert!(!LabelSelector::parse("app=x").unwrap().matches(&json!({"metadata": {"name": "n"}})));
    }

    #[test]
    fn bad_selectors_are_400() {
        for sel in ["app in x", "a b=c", "=x"] {
            assert_eq!(LabelSelector::parse(sel).unwrap_err().code, 400, "{sel}");
        }
        assert_eq!(FieldSelector::parse("spec.nodeName=x").unwrap_err().code, 400);
        assert_eq!(FieldSelector::parse("metadata.name").unwrap_err().code, 400);
    }

    #[test]
    fn field_selector_cases() {
        let o = obj(json!({}));
        for (sel, want) in [("metadata.name=a", true), ("metadata.name!=a", false), ("metadata.namespace=ns,metadata.name=b", false)] {
            assert_eq!(FieldSelector::parse(sel).unwrap().matches(&o), want, "{sel}");
        }
    }
}
