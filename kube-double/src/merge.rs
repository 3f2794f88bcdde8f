//! Merging one object into another the way the API server does for each patch type, and removing
//! fields a manager gave up.
//!
//! - JSON merge patch (RFC 7386): `json_patch::merge` (lists replaced, `null` deletes).
//! - Strategic merge patch and server-side apply: like a merge patch, except that list-maps (lists
//!   the kind declares `x-kubernetes-list-type: map`, e.g. conditions by `type`, containers by
//!   `name`) merge entry by entry on their keys. Strategic merge also honours `$patch: delete` on
//!   a list entry and `$patch: replace` on a list or object; other `$` directives are dropped.

use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::fieldset::{FieldSet, PathElement, entry_key};
use crate::kinds::ResourceKind;

fn join(path: &str, field: &str) -> String {
    if path.is_empty() { field.to_string() } else { format!("{path}.{field}") }
}

/// Merges `patch` into `target` with list-maps merged by key. `null` removes a field.
pub fn merge_by_keys(target: &mut Value, patch: &Value, kind: &ResourceKind, path: &str, strategic: bool) -> ApiResult<()> {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            if strategic && p.get("$patch").and_then(Value::as_str) == Some("replace") {
                let mut clean = p.clone();
                strip_directives(&mut clean);
                *t = clean;
                return Ok(());
            }
            for (k, pv) in p {
                if k.starts_with('$') {
                    continue;
                }
                if pv.is_null() {
                    t.remove(k);
                    continue;
                }
                let child_path = join(path, k);
                match t.get_mut(k) {
                    Some(tv) => merge_by_keys(tv, pv, kind, &child_path, strategic)?,
                    None => {
                        let mut v = pv.clone();
                        if strategic {
                            strip_directives_value(&mut v);
                        }
                        t.insert(k.clone(), v);
                    }
                }
            }
            Ok(())
        }
        (Value::Array(t), Value::Array(p)) if kind.list_keys_at(path).is_some() => {
            let keys = kind.list_keys_at(path).unwrap_or_default();
            if strategic && p.iter().any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace")) {
                *t = p.iter().filter(|e| e.get("$patch").is_none()).cloned().collect();
                return Ok(());
            }
            for entry in p {
                let key = entry_key(entry, keys, path)?;
                let pos = t.iter().position(|e| entry_key(e, keys, path).ok().as_deref() == Some(key.as_str()));
                let delete = strategic && entry.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        t.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => merge_by_keys(&mut t[i], entry, kind, path, strategic)?,
                    (None, false) => {
                        let mut v = entry.clone();
                        strip_directives_value(&mut v);
                        t.push(v);
                    }
                }
            }
            Ok(())
        }
        (t, p) => {
            let mut v = p.clone();
            if strategic {
                strip_directives_value(&mut v);
            }
            *t = v;
            Ok(())
        }
    }
}

fn strip_directives(m: &mut Map<String, Value>) {
    m.retain(|k, _| !k.starts_with('$'));
    for v in m.values_mut() {
        strip_directives_value(v);
    }
}

fn strip_directives_value(v: &mut Value) {
    match v {
        Value::Object(m) => strip_directives(m),
        Value::Array(a) => a.iter_mut().for_each(strip_directives_value),
        _ => {}
    }
}

/// Removes from `obj` what `removed` holds and no other manager (`others`) owns: a leaf field,
/// or a whole list-map entry when nobody else owns anything in it.
pub fn prune(obj: &mut Value, removed: &FieldSet, others: &FieldSet, kind: &ResourceKind, path: &str) {
    let empty = FieldSet::default();
    for (el, sub) in &removed.children {
        let other = others.children.get(el).unwrap_or(&empty);
        let drop_whole = sub.member && other.is_empty();
        match el {
            PathElement::Field(f) => {
                let Some(m) = obj.as_object_mut() else { continue };
                if drop_whole {
                    m.remove(f);
                } else if let Some(child) = m.get_mut(f) {
                    prune(child, sub, other, kind, &join(path, f));
                }
            }
            PathElement::Key(k) => {
                let Some(keys) = kind.list_keys_at(path) else { continue };
                let Some(items) = obj.as_array_mut() else { continue };
                let Some(i) = items.iter().position(|e| entry_key(e, keys, path).ok().as_deref() == Some(k.as_str())) else { continue };
                if drop_whole {
                    items.remove(i);
                } else {
                    prune(&mut items[i], sub, other, kind, path);
                }
            }
        }
    }
}

/// Applies an RFC 6902 JSON patch.
pub fn json_patch(target: &mut Value, patch: &Value) -> ApiResult<()> {
    let ops: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| ApiError::bad_request(format!("invalid JSON patch document: {e}")))?;
    json_patch::patch(target, &ops).map_err(|e| ApiError::invalid(format!("the JSON patch could not be applied: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::KindRegistry;
    use serde_json::json;

    #[test]
    fn strategic_merge_merges_list_maps_and_replaces_atomic_lists() {
        let reg = KindRegistry::standard();
        let pod = reg.get("", "v1", "pods").unwrap();
        let mut live =
            json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}], "tolerations": [{"key": "x"}]}});
        let patch = json!({"spec": {
            "containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}, {"name": "a", "$patch": "delete"}],
            "tolerations": [{"key": "y"}]
        }});
        merge_by_keys(&mut live, &patch, pod, "", true).unwrap();
        assert_eq!(
            live,
            json!({"spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}], "tolerations": [{"key": "y"}]}})
        );
    }

    #[test]
    fn prune_keeps_what_others_own() {
        let reg = KindRegistry::standard();
        let kind = reg.get("brink.dev", "v1alpha1", "sparknodes").unwrap();
        let mut live = json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}], "x": 1}});
        let removed = FieldSet::from_value(
            &json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}], "x": 1}}),
            kind,
        )
        .unwrap();
        let others = FieldSet::from_value(&json!({"status": {"conditions": [{"type": "B", "status": "False"}]}}), kind).unwrap();
        prune(&mut live, &removed, &others, kind, "");
        assert_eq!(live, json!({"status": {"conditions": [{"type": "B", "status": "False"}]}}));
    }
}
