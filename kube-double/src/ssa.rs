//! Field ownership: server-side apply (`application/apply-patch+yaml`) and the `Update` entries
//! that every other write records in `metadata.managedFields`.
//!
//! A manager's applied configuration is the set of fields it owns; re-applying without a field it
//! owned removes that field unless another manager owns it too; setting a field another manager
//! owns to a different value is a conflict (409, naming the manager) unless forced, and forcing
//! moves the ownership.

use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::fieldset::{FieldSet, PathElement, display_path, tracked_view, value_at};
use crate::kinds::ResourceKind;
use crate::merge::{merge_by_keys, prune};

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedEntry {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    pub api_version: String,
    pub time: String,
    /// `""` for the main resource, `status` for the status subresource.
    pub subresource: String,
    pub fields: FieldSet,
}

impl ManagedEntry {
    fn same_owner(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }
}

pub fn read_managed(obj: &Value) -> Vec<ManagedEntry> {
    let Some(list) = obj.pointer("/metadata/managedFields").and_then(Value::as_array) else { return Vec::new() };
    list.iter()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            ManagedEntry {
                manager: s("manager"),
                operation: s("operation"),
                api_version: s("apiVersion"),
                time: s("time"),
                subresource: s("subresource"),
                fields: e.get("fieldsV1").map(FieldSet::from_fields_v1).unwrap_or_default(),
            }
        })
        .collect()
}

pub fn write_managed(obj: &mut Value, entries: &[ManagedEntry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": e.fields.to_fields_v1(),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".to_string(), Value::Array(list));
        }
    }
}

/// Who is applying, how, and when.
#[derive(Debug, Clone)]
pub struct Applier<'a> {
    pub manager: &'a str,
    pub force: bool,
    /// `""` or `status`.
    pub subresource: &'a str,
    pub now: &'a str,
}

/// Server-side apply of `applied` onto `live` (`live` already holds name/namespace/metadata for a
/// new object). Returns the merged object with updated `managedFields`.
pub fn apply(live: &Value, applied: &Value, kind: &ResourceKind, who: &Applier) -> ApiResult<Value> {
    let mut obj = live.clone();
    let applied_view = tracked_view(applied, kind, who.subresource);
    let new_set = FieldSet::from_value(&applied_view, kind)?;
    let live_view = tracked_view(live, kind, who.subresource);
    let mut entries = read_managed(live);

    // Conflicts: a leaf this apply sets to a value other than the live one, owned by someone else.
    let mut conflicts: Vec<(String, Vec<PathElement>)> = Vec::new();
    for path in new_set.members() {
        let Some(current) = value_at(&live_view, &path, kind) else { continue };
        let is_leaf = value_at(&applied_view, &path, kind).is_some_and(|v| !v.is_object() || v.as_object().is_some_and(|m| m.is_empty()));
        if !is_leaf || value_at(&applied_view, &path, kind) == Some(current) {
            continue;
        }
        for e in entries.iter().filter(|e| !e.same_owner(who.manager, "Apply", who.subresource)) {
            if e.fields.contains(&path) {
                conflicts.push((e.manager.clone(), path.clone()));
            }
        }
    }
    if !conflicts.is_empty() {
        if !who.force {
            let n = conflicts.len();
            let lines: Vec<String> =
                conflicts.iter().map(|(m, p)| format!("conflict with \"{m}\" using {}: {}", kind.api_version(), display_path(p))).collect();
            let plural = if n == 1 { "conflict" } else { "conflicts" };
            let name = live.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            return Err(ApiError::new(409, "Conflict", format!("Apply failed with {n} {plural}: {}", lines.join("; "))).with_details(
                name,
                &kind.group,
                &kind.plural,
            ));
        }
        for (_, path) in &conflicts {
            let taken = FieldSet::single(path);
            for e in entries.iter_mut().filter(|e| !e.same_owner(who.manager, "Apply", who.subresource)) {
                e.fields = e.fields.difference(&taken);
            }
        }
    }

    // Fields this manager applied before and no longer does: removed unless someone else owns them.
    let previous =
        entries.iter().find(|e| e.same_owner(who.manager, "Apply", who.subresource)).map(|e| e.fields.clone()).unwrap_or_default();
    let removed = previous.difference(&new_set);
    let mut others = FieldSet::default();
    for e in entries.iter().filter(|e| !e.same_owner(who.manager, "Apply", who.subresource)) {
        others.union(&e.fields);
    }
    prune(&mut obj, &removed, &others, kind, "");
    merge_by_keys(&mut obj, &applied_view, kind, "", false)?;

    entries.retain(|e| !e.same_owner(who.manager, "Apply", who.subresource));
    entries.push(ManagedEntry {
        manager: who.manager.to_string(),
        operation: "Apply".to_string(),
        api_version: kind.api_version(),
        time: who.now.to_string(),
        subresource: who.subresource.to_string(),
        fields: new_set,
    });
    write_managed(&mut obj, &entries);
    Ok(obj)
}

/// Records a non-apply write (create, replace, patch) by `manager`: it takes ownership of every
/// field whose value it changed, others lose those fields, and fields the write removed leave every set.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    kind: &ResourceKind,
    manager: &str,
    subresource: &str,
    now: &str,
) -> ApiResult<()> {
    let empty = json!({});
    let old_view = tracked_view(old.unwrap_or(&empty), kind, subresource);
    let new_view = tracked_view(new, kind, subresource);
    let new_set = FieldSet::from_value(&new_view, kind)?;
    let old_set = FieldSet::from_value(&old_view, kind)?;
    let mut changed = FieldSet::default();
    for path in new_set.members() {
        let before = value_at(&old_view, &path, kind);
        let entry_node = value_at(&new_view, &path, kind).is_some_and(|v| v.as_object().is_some_and(|m| !m.is_empty()));
        let differs = if entry_node { before.is_none() } else { before != value_at(&new_view, &path, kind) };
        if differs {
            changed.union(&FieldSet::single(&path));
        }
    }
    let gone = old_set.difference(&new_set);
    let mut entries = old.map(read_managed).unwrap_or_default();
    for e in entries.iter_mut() {
        e.fields = e.fields.difference(&gone);
        if !e.same_owner(manager, "Update", subresource) {
            e.fields = e.fields.difference(&changed);
        }
    }
    match entries.iter_mut().find(|e| e.same_owner(manager, "Update", subresource)) {
        Some(e) => {
            e.fields.union(&changed);
            if !changed.is_empty() {
                e.time = now.to_string();
            }
        }
        None if !changed.is_empty() => entries.push(ManagedEntry {
            manager: manager.to_string(),
            operation: "Update".to_string(),
            api_version: kind.api_version(),
            time: now.to_string(),
            subresource: subresource.to_string(),
            fields: changed,
        }),
        None => {}
    }
    write_managed(new, &entries);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::KindRegistry;

    fn node_kind() -> ResourceKind {
        KindRegistry::standard().get("brink.dev", "v1alpha1", "sparknodes").unwrap().clone()
    }

    fn who<'a>(m: &'a str, force: bool) -> Applier<'a> {
        Applier { manager: m, force, subresource: "status", now: "2026-01-01T00:00:00Z" }
    }

    fn cond(t: &str, s: &str) -> Value {
        json!({"type": t, "status": s})
    }

    fn types(obj: &Value) -> Vec<String> {
        obj["status"]["conditions"].as_array().unwrap().iter().map(|c| format!("{}={}", c["type"], c["status"])).collect()
    }

    #[test]
    fn two_managers_keep_their_own_entries() {
        let k = node_kind();
        let live = json!({"metadata": {"name": "n"}});
        let a = apply(&live, &json!({"status": {"conditions": [cond("Ready", "True")]}}), &k, &who("agent", false)).unwrap();
        let b = apply(&a, &json!({"status": {"conditions": [cond("Cordoned", "False")]}}), &k, &who("operator", false)).unwrap();
        assert_eq!(types(&b), ["\"Ready\"=\"True\"", "\"Cordoned\"=\"False\""]);
        // The agent re-applies without its entry: only its entry goes.
        let c = apply(&b, &json!({"status": {"conditions": []}}), &k, &who("agent", false)).unwrap();
        assert_eq!(types(&c), ["\"Cordoned\"=\"False\""]);
        // The operator changing the agent's field is a conflict naming the agent.
        let d = apply(&b, &json!({"status": {"conditions": [cond("Ready", "False")]}}), &k, &who("operator", false)).unwrap_err();
        assert_eq!(d.code, 409);
        assert!(
            d.message.contains("conflict with \"agent\"") && d.message.contains(".status.conditions[type=\"Ready\"].status"),
            "{}",
            d.message
        );
        // Forced, the operator takes it over; the agent's later re-apply of the old value conflicts.
        let e =
            apply(&b, &json!({"status": {"conditions": [cond("Ready", "False"), cond("Cordoned", "False")]}}), &k, &who("operator", true))
                .unwrap();
        assert_eq!(types(&e), ["\"Ready\"=\"False\"", "\"Cordoned\"=\"False\""]);
        let f = apply(&e, &json!({"status": {"conditions": [cond("Ready", "True")]}}), &k, &who("agent", false)).unwrap_err();
        assert!(f.message.contains("conflict with \"operator\""), "{}", f.message);
        // A manager that drops an entry it alone owned removes it (the operator no longer applies Cordoned).
        let g = apply(&e, &json!({"status": {"conditions": [cond("Ready", "False")]}}), &k, &who("operator", false)).unwrap();
        assert_eq!(types(&g), ["\"Ready\"=\"False\""]);
    }

    #[test]
    fn update_takes_ownership_of_changed_fields() {
        let k = node_kind();
        let live = apply(
            &json!({"metadata": {"name": "n"}}),
            &json!({"status": {"conditions": [cond("Ready", "True")]}}),
            &k,
            &who("agent", false),
        )
        .unwrap();
        let mut new = live.clone();
        new["status"]["conditions"][0]["status"] = json!("False");
        record_update(Some(&live), &mut new, &k, "kubectl", "status", "t").unwrap();
        let entries = read_managed(&new);
        let path = [
            PathElement::Field("status".into()),
            PathElement::Field("conditions".into()),
            PathElement::Key("{\"type\":\"Ready\"}".into()),
            PathElement::Field("status".into()),
        ];
        assert!(entries.iter().find(|e| e.manager == "kubectl").unwrap().fields.contains(&path));
        assert!(!entries.iter().find(|e| e.manager == "agent").unwrap().fields.contains(&path));
    }
}
