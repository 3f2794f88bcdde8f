//! Field sets, the unit of server-side-apply ownership: a tree of field names and list-map entry
//! keys, serialised as the API server's `fieldsV1` (`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},...}}}}`).
//!
//! Lists are atomic (one leaf) unless the kind declares them a list-map; a list-map entry is a
//! node of its own (`.` marks the entry itself as owned) so two managers can own different entries.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::kinds::ResourceKind;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathElement {
    Field(String),
    /// A list-map entry, by the canonical JSON of its key fields (`{"type":"Ready"}`).
    Key(String),
}

/// A set of field paths. `member`: this node itself is in the set (a leaf field, or a list-map entry).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    pub member: bool,
    pub children: BTreeMap<PathElement, FieldSet>,
}

/// The part of an object that ownership is tracked for: no identity or server-set metadata, and
/// with a status subresource, either only the status (`/status` writes) or everything but it.
pub fn tracked_view(obj: &Value, kind: &ResourceKind, subresource: &str) -> Value {
    let mut out = Map::new();
    let Some(o) = obj.as_object() else { return Value::Object(out) };
    for (k, v) in o {
        let keep = match k.as_str() {
            "apiVersion" | "kind" => false,
            "status" if kind.status_subresource => subresource == "status",
            _ => !kind.status_subresource || subresource != "status",
        };
        if !keep {
            continue;
        }
        if k == "metadata" {
            let mut meta = Map::new();
            if let Some(m) = v.as_object() {
                for f in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(x) = m.get(f) {
                        meta.insert(f.to_string(), x.clone());
                    }
                }
            }
            if !meta.is_empty() {
                out.insert(k.clone(), Value::Object(meta));
            }
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() { field.to_string() } else { format!("{path}.{field}") }
}

/// The canonical key of a list-map entry; an entry without any key field is invalid.
pub fn entry_key(entry: &Value, keys: &[String], path: &str) -> ApiResult<String> {
    let mut m = Map::new();
    for k in keys {
        if let Some(v) = entry.get(k) {
            m.insert(k.clone(), v.clone());
        }
    }
    if m.is_empty() {
        return Err(ApiError::invalid(format!("{path}: an entry of this associative list has none of its key fields {keys:?}")));
    }
    Ok(Value::Object(m).to_string())
}

impl FieldSet {
    fn leaf() -> Self {
        Self { member: true, children: BTreeMap::new() }
    }

    /// Every field `value` sets (leaves), with list-map entries as nodes of their own.
    pub fn from_value(value: &Value, kind: &ResourceKind) -> ApiResult<Self> {
        Self::build(value, kind, "")
    }

    fn build(value: &Value, kind: &ResourceKind, path: &str) -> ApiResult<Self> {
        match value {
            Value::Object(m) if !m.is_empty() => {
                let mut set = Self::default();
                for (k, v) in m {
                    let child_path = join(path, k);
                    set.children.insert(PathElement::Field(k.clone()), Self::build(v, kind, &child_path)?);
                }
                Ok(set)
            }
            Value::Array(items) => match kind.list_keys_at(path) {
                Some(keys) => {
                    let mut set = Self::leaf();
                    for item in items {
                        let key = entry_key(item, keys, path)?;
                        let mut entry = Self::build(item, kind, path)?;
                        entry.member = true;
                        set.children.insert(PathElement::Key(key), entry);
                    }
                    // The list field itself is not a leaf when it has entries: only the entries are owned.
                    set.member = set.children.is_empty();
                    Ok(set)
                }
                None => Ok(Self::leaf()),
            },
            _ => Ok(Self::leaf()),
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    pub fn union(&mut self, other: &FieldSet) {
        self.member |= other.member;
        for (el, sub) in &other.children {
            self.children.entry(el.clone()).or_default().union(sub);
        }
    }

    /// `self` without the members of `other` (empty nodes dropped).
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet { member: self.member && !other.member, children: BTreeMap::new() };
        for (el, sub) in &self.children {
            let rest = match other.children.get(el) {
                Some(o) => sub.difference(o),
                None => sub.clone(),
            };
            if !rest.is_empty() {
                out.children.insert(el.clone(), rest);
            }
        }
        out
    }

    /// Whether the set holds `path` as a member.
    pub fn contains(&self, path: &[PathElement]) -> bool {
        match path.split_first() {
            None => self.member,
            Some((el, rest)) => self.children.get(el).is_some_and(|c| c.contains(rest)),
        }
    }

    /// The set with only `path` in it.
    pub fn single(path: &[PathElement]) -> FieldSet {
        let mut node = Self::leaf();
        for el in path.iter().rev() {
            let mut parent = Self::default();
            parent.children.insert(el.clone(), node);
            node = parent;
        }
        node
    }

    /// Every member path, depth first.
    pub fn members(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.walk(&mut Vec::new(), &mut out);
        out
    }

    fn walk(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        if self.member {
            out.push(prefix.clone());
        }
        for (el, sub) in &self.children {
            prefix.push(el.clone());
            sub.walk(prefix, out);
            prefix.pop();
        }
    }

    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".to_string(), Value::Object(Map::new()));
        }
        for (el, sub) in &self.children {
            let k = match el {
                PathElement::Field(f) => format!("f:{f}"),
                PathElement::Key(k) => format!("k:{k}"),
            };
            m.insert(k, sub.to_fields_v1());
        }
        Value::Object(m)
    }

    /// Parses `fieldsV1`; entries it does not model (`v:` set values, `i:` indexes) are kept out.
    pub fn from_fields_v1(v: &Value) -> FieldSet {
        let Some(m) = v.as_object() else { return FieldSet::default() };
        if m.is_empty() {
            return Self::leaf();
        }
        let mut set = FieldSet::default();
        for (k, sub) in m {
            if k == "." {
                set.member = true;
            } else if let Some(f) = k.strip_prefix("f:") {
                set.children.insert(PathElement::Field(f.to_string()), Self::from_fields_v1(sub));
            } else if let Some(key) = k.strip_prefix("k:") {
                set.children.insert(PathElement::Key(key.to_string()), Self::from_fields_v1(sub));
            }
        }
        set
    }
}

/// The value at `path` in `obj`, resolving list-map entries by their key.
pub fn value_at<'a>(obj: &'a Value, path: &[PathElement], kind: &ResourceKind) -> Option<&'a Value> {
    let mut cur = obj;
    let mut schema_path = String::new();
    for el in path {
        cur = match el {
            PathElement::Field(f) => {
                schema_path = join(&schema_path, f);
                cur.get(f)?
            }
            PathElement::Key(k) => {
                let keys = kind.list_keys_at(&schema_path)?;
                cur.as_array()?.iter().find(|e| entry_key(e, keys, &schema_path).ok().as_deref() == Some(k.as_str()))?
            }
        };
    }
    Some(cur)
}

/// `.status.conditions[type="Ready"].status`, as the API server names fields in conflicts.
pub fn display_path(path: &[PathElement]) -> String {
    let mut s = String::new();
    for el in path {
        match el {
            PathElement::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            PathElement::Key(k) => {
                let parts: Vec<String> = serde_json::from_str::<Map<String, Value>>(k)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                    .unwrap_or_else(|_| vec![k.clone()]);
                s.push('[');
                s.push_str(&parts.join(","));
                s.push(']');
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::KindRegistry;
    use serde_json::json;

    #[test]
    fn list_map_entries_are_nodes_and_round_trip_through_fields_v1() {
        let reg = KindRegistry::standard();
        let kind = reg.get("brink.dev", "v1alpha1", "sparknodes").unwrap();
        let v = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "device": {"name": "GB10"}, "tags": [1, 2]}});
        let set = FieldSet::from_value(&v, kind).unwrap();
        let fv1 = set.to_fields_v1();
        assert_eq!(
            fv1,
            json!({"f:status": {
                "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}},
                "f:device": {"f:name": {}},
                "f:tags": {}
            }})
        );
        assert_eq!(FieldSet::from_fields_v1(&fv1), set);
        let ready =
            [PathElement::Field("status".into()), PathElement::Field("conditions".into()), PathElement::Key("{\"type\":\"Ready\"}".into())];
        assert!(set.contains(&ready));
        assert_eq!(value_at(&v, &ready, kind).unwrap()["status"], "True");
        assert_eq!(display_path(&ready), ".status.conditions[type=\"Ready\"]");
    }

    #[test]
    fn difference_keeps_only_what_the_other_lacks() {
        let reg = KindRegistry::standard();
        let kind = reg.get("brink.dev", "v1alpha1", "sparknodes").unwrap();
        let a = FieldSet::from_value(&json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}}), kind).unwrap();
        let b = FieldSet::from_value(&json!({"status": {"conditions": [{"type": "A"}]}}), kind).unwrap();
        let d = a.difference(&b);
        let paths: Vec<String> = d.members().iter().map(|p| display_path(p)).collect();
        assert_eq!(paths, [".status.conditions[type=\"B\"]", ".status.conditions[type=\"B\"].type"]);
    }

    #[test]
    fn entry_without_key_is_invalid() {
        let reg = KindRegistry::standard();
        let kind = reg.get("brink.dev", "v1alpha1", "sparknodes").unwrap();
        let err = FieldSet::from_value(&json!({"status": {"conditions": [{"status": "True"}]}}), kind).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.contains("status.conditions"), "{}", err.message);
    }

    #[test]
    fn status_subresource_splits_the_tracked_view() {
        let reg = KindRegistry::standard();
        let kind = reg.get("brink.dev", "v1alpha1", "sparknodes").unwrap();
        let obj = json!({"apiVersion": "x", "kind": "y", "metadata": {"name": "n", "labels": {"a": "b"}, "uid": "u"}, "spec": {"s": 1}, "status": {"t": 2}});
        assert_eq!(tracked_view(&obj, kind, ""), json!({"metadata": {"labels": {"a": "b"}}, "spec": {"s": 1}}));
        assert_eq!(tracked_view(&obj, kind, "status"), json!({"status": {"t": 2}}));
    }
}
