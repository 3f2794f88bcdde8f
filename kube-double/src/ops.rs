//! The verbs on stored objects: create, replace, patch (merge, JSON, strategic, apply), delete
//! (preconditions here, finalizers and garbage collection in `gc`), and the `/status` and `/scale`
//! subresources, with the API server's rules for resourceVersion, generation and status.

use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};
use crate::gc::{Propagation, delete_object, remove_object};
use crate::kinds::ResourceKind;
use crate::merge::{json_patch, merge_by_keys};
use crate::schema_defaults::apply_defaults;
use crate::ssa::{Applier, apply, record_update};
use crate::state::State;
use crate::store::ObjectKey;

/// The patch types, by request `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: Option<&str>) -> ApiResult<Self> {
        match ct.map(|c| c.split(';').next().unwrap_or("").trim()) {
            Some("application/json-patch+json") => Ok(Self::Json),
            Some("application/merge-patch+json") => Ok(Self::Merge),
            Some("application/strategic-merge-patch+json") => Ok(Self::Strategic),
            Some("application/apply-patch+yaml") | Some("application/apply-patch+cbor") => Ok(Self::Apply),
            other => {
                Err(ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format: {other:?}")))
            }
        }
    }
}

/// Who writes and how (from the query string).
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub manager: String,
    pub force: bool,
    pub dry_run: bool,
}

/// Where an object lives: the kind and its namespace/name from the path.
pub struct Target<'a> {
    pub kind: &'a ResourceKind,
    pub namespace: Option<&'a str>,
}

impl Target<'_> {
    pub fn key(&self, name: &str) -> ObjectKey {
        ObjectKey {
            group: self.kind.group.clone(),
            plural: self.kind.plural.clone(),
            namespace: if self.kind.namespaced { self.namespace.unwrap_or_default().to_string() } else { String::new() },
            name: name.to_string(),
        }
    }

    fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(&self.kind.plural, &self.kind.group, name)
    }

    /// Namespaced kinds need a namespace in the path for anything but list and watch.
    pub fn check_scope(&self) -> ApiResult<()> {
        match (self.kind.namespaced, self.namespace) {
            (true, None) => {
                Err(ApiError::new(404, "NotFound", format!("{} is namespaced: the path needs /namespaces/<ns>/", self.kind.plural)))
            }
            (false, Some(_)) => {
                Err(ApiError::new(404, "NotFound", format!("{} is cluster-scoped: the path has a namespace", self.kind.plural)))
            }
            _ => Ok(()),
        }
    }
}

fn meta(obj: &Value, field: &str) -> Option<String> {
    obj.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str).map(str::to_string)
}

fn meta_mut(obj: &mut Value) -> ApiResult<&mut Map<String, Value>> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the request body is not a JSON object"));
    }
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj.get_mut("metadata").and_then(Value::as_object_mut).ok_or_else(|| ApiError::bad_request("metadata is not an object"))
}

/// Checks `apiVersion`/`kind` when given and fills them in.
fn type_meta(obj: &mut Value, kind: &ResourceKind) -> ApiResult<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(format!("the {} in the request body is not a JSON object", kind.kind)));
    }
    let want_av = kind.api_version();
    for (field, want) in [("apiVersion", want_av.as_str()), ("kind", kind.kind.as_str())] {
        match obj.get(field).and_then(Value::as_str) {
            Some(got) if got != want => {
                return Err(ApiError::bad_request(format!("{field} {got:?} in the body does not match {want:?} of the request path")));
            }
            _ => obj[field] = json!(want),
        }
    }
    Ok(())
}

/// Everything outside `metadata` and `status`: what `metadata.generation` counts changes of.
fn spec_part(obj: &Value) -> Value {
    let mut m = obj.as_object().cloned().unwrap_or_default();
    for k in ["metadata", "status", "apiVersion", "kind"] {
        m.remove(k);
    }
    Value::Object(m)
}

fn check_stale(body: &Value, existing: &Value, t: &Target, name: &str) -> ApiResult<()> {
    match meta(body, "resourceVersion") {
        Some(rv) if !rv.is_empty() && Some(&rv) != meta(existing, "resourceVersion").as_ref() => {
            Err(ApiError::stale(&t.kind.plural, &t.kind.group, name))
        }
        _ => Ok(()),
    }
}

pub fn get(st: &State, t: &Target, name: &str) -> ApiResult<Value> {
    t.check_scope()?;
    st.store.get(&t.key(name)).cloned().ok_or_else(|| t.not_found(name))
}

pub fn create(st: &mut State, t: &Target, mut body: Value, opts: &WriteOptions) -> ApiResult<Value> {
    t.check_scope()?;
    type_meta(&mut body, t.kind)?;
    let path_ns = t.namespace.map(str::to_string);
    let suffix = st.next_name_suffix();
    let uid = st.next_uid();
    let now = st.clock.now();
    let m = meta_mut(&mut body)?;
    if t.kind.namespaced {
        match m.get("namespace").and_then(Value::as_str) {
            Some(ns) if Some(ns) != path_ns.as_deref() => {
                return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
            }
            _ => {
                m.insert("namespace".into(), json!(path_ns));
            }
        }
    }
    let name = match (m.get("name").and_then(Value::as_str), m.get("generateName").and_then(Value::as_str)) {
        (Some(n), _) if !n.is_empty() => n.to_string(),
        (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{suffix}"),
        _ => return Err(ApiError::invalid("metadata.name: Required value: name or generateName is required")),
    };
    m.insert("name".into(), json!(name));
    m.insert("uid".into(), json!(uid));
    m.insert("creationTimestamp".into(), json!(now));
    m.insert("generation".into(), json!(1));
    for server_set in ["resourceVersion", "deletionTimestamp", "managedFields", "selfLink"] {
        m.remove(server_set);
    }
    let key = t.key(&name);
    if st.store.get(&key).is_some() {
        return Err(ApiError::already_exists(&t.kind.plural, &t.kind.group, &name));
    }
    if t.kind.status_subresource
        && let Some(o) = body.as_object_mut()
    {
        o.remove("status");
    }
    apply_defaults(&mut body, t.kind);
    record_update(None, &mut body, t.kind, &opts.manager, "", &now)?;
    if opts.dry_run {
        return Ok(body);
    }
    Ok(st.store.put(key, body))
}

/// Server-owned metadata survives every client write.
fn keep_server_metadata(new: &mut Value, existing: &Value) -> ApiResult<()> {
    let old = existing.get("metadata").cloned().unwrap_or_default();
    let m = meta_mut(new)?;
    for f in
        ["name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "managedFields"]
    {
        match old.get(f) {
            Some(v) => m.insert(f.to_string(), v.clone()),
            None => m.remove(f),
        };
    }
    m.remove("resourceVersion");
    Ok(())
}

/// How an update arrived: through which subresource, by whom, and whether server-side apply
/// already recorded its ownership.
struct Via<'a> {
    sub: &'a str,
    opts: &'a WriteOptions,
    applied: bool,
}

/// The common tail of every update: subresource isolation, generation, ownership, finalizers.
fn finish_update(st: &mut State, t: &Target, name: &str, existing: &Value, mut new: Value, via: Via) -> ApiResult<Value> {
    let Via { sub, opts, applied } = via;
    type_meta(&mut new, t.kind)?;
    if sub == "status" {
        // A status write changes only the status.
        let mut only_status = existing.clone();
        match new.get("status") {
            Some(s) => only_status["status"] = s.clone(),
            None => {
                if let Some(o) = only_status.as_object_mut() {
                    o.remove("status");
                }
            }
        }
        if applied {
            only_status["metadata"]["managedFields"] = new.pointer("/metadata/managedFields").cloned().unwrap_or(json!([]));
        }
        new = only_status;
        apply_defaults(&mut new, t.kind);
    } else {
        let managed = new.pointer("/metadata/managedFields").cloned();
        keep_server_metadata(&mut new, existing)?;
        if applied && let Some(mf) = managed {
            new["metadata"]["managedFields"] = mf;
        }
        if t.kind.status_subresource {
            // A main-resource write ignores the status.
            match existing.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        }
        apply_defaults(&mut new, t.kind);
        if spec_part(&new) != spec_part(existing) {
            let g = existing.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            new["metadata"]["generation"] = json!(g + 1);
        }
    }
    let now = st.clock.now();
    if !applied {
        record_update(Some(existing), &mut new, t.kind, &opts.manager, sub, &now)?;
    }
    if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    if opts.dry_run {
        return Ok(new);
    }
    if unchanged(&new, existing) {
        // As etcd's guaranteed update: a write that changes nothing is not stored, gets no new
        // resourceVersion and wakes no watch (a controller re-applying the same status does not loop).
        return Ok(existing.clone());
    }
    let key = t.key(name);
    let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
    let finalizers_left = new.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
    if deleting && !finalizers_left {
        // The last finalizer is gone: the object goes for real.
        st.store.put(key.clone(), new);
        return remove_object(st, &key).ok_or_else(|| t.not_found(name));
    }
    Ok(st.store.put(key, new))
}

/// Equal but for the resourceVersion and the times in `managedFields`.
fn unchanged(new: &Value, existing: &Value) -> bool {
    let normalise = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
            if let Some(entries) = m.get_mut("managedFields").and_then(Value::as_array_mut) {
                for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                    e.remove("time");
                }
            }
        }
        v
    };
    normalise(new) == normalise(existing)
}

pub fn replace(st: &mut State, t: &Target, name: &str, body: Value, sub: &str, opts: &WriteOptions) -> ApiResult<Value> {
    t.check_scope()?;
    let existing = st.store.get(&t.key(name)).cloned().ok_or_else(|| t.not_found(name))?;
    if meta(&body, "name").is_some_and(|n| n != name) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({:?}) does not match the name on the URL ({name})",
            meta(&body, "name")
        )));
    }
    if t.kind.custom && meta(&body, "resourceVersion").is_none_or(|rv| rv.is_empty()) {
        // Custom resources allow no unconditional update.
        return Err(ApiError::invalid(format!(
            "{}.{} \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
            t.kind.plural, t.kind.group
        )));
    }
    check_stale(&body, &existing, t, name)?;
    finish_update(st, t, name, &existing, body, Via { sub, opts, applied: false })
}

/// YAML or JSON (an apply patch may be either).
pub fn parse_body(bytes: &[u8], yaml_ok: bool) -> ApiResult<Value> {
    match serde_json::from_slice(bytes) {
        Ok(v) => Ok(v),
        Err(e) if yaml_ok => {
            let text =
                std::str::from_utf8(bytes).map_err(|_| ApiError::bad_request(format!("the body is neither JSON ({e}) nor UTF-8 YAML")))?;
            serde_saphyr::from_str(text).map_err(|y| ApiError::bad_request(format!("the body is neither JSON ({e}) nor YAML ({y})")))
        }
        Err(e) => Err(ApiError::bad_request(format!("the body is not JSON: {e}"))),
    }
}

pub fn patch(st: &mut State, t: &Target, name: &str, patch: Value, kind: PatchKind, sub: &str, opts: &WriteOptions) -> ApiResult<Value> {
    t.check_scope()?;
    if kind == PatchKind::Apply {
        return server_side_apply(st, t, name, &patch, sub, opts);
    }
    if kind == PatchKind::Strategic && t.kind.custom {
        // Custom resources have no patch-merge keys in Go types: the API server refuses these.
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    }
    let existing = st.store.get(&t.key(name)).cloned().ok_or_else(|| t.not_found(name))?;
    let mut patched = existing.clone();
    patch_document(&mut patched, &patch, kind, t.kind)?;
    if meta(&patched, "resourceVersion").is_some_and(|rv| !rv.is_empty() && Some(&rv) != meta(&existing, "resourceVersion").as_ref()) {
        // The patch carried a resourceVersion precondition that no longer holds.
        return Err(ApiError::stale(&t.kind.plural, &t.kind.group, name));
    }
    finish_update(st, t, name, &existing, patched, Via { sub, opts, applied: false })
}

/// A patch's effect on a document, without ownership. An apply patch here (only `/scale` gets
/// one) merges like a strategic merge without directives.
fn patch_document(target: &mut Value, patch: &Value, kind: PatchKind, rk: &ResourceKind) -> ApiResult<()> {
    match kind {
        PatchKind::Json => json_patch(target, patch),
        PatchKind::Merge => {
            json_patch::merge(target, patch);
            Ok(())
        }
        PatchKind::Strategic => merge_by_keys(target, patch, rk, "", true),
        PatchKind::Apply => merge_by_keys(target, patch, rk, "", false),
    }
}

/// `application/apply-patch+yaml`: ownership-aware merge; creates the object when it is missing.
fn server_side_apply(st: &mut State, t: &Target, name: &str, patch: &Value, sub: &str, opts: &WriteOptions) -> ApiResult<Value> {
    if opts.manager.is_empty() {
        return Err(ApiError::bad_request("PATCH with apply requires a fieldManager"));
    }
    if !patch.is_object() {
        return Err(ApiError::bad_request("an apply patch must be an object (the applied configuration)"));
    }
    if meta(patch, "name").is_some_and(|n| n != name) {
        return Err(ApiError::bad_request(format!(
            "the name of the applied object ({:?}) does not match the name on the URL ({name})",
            meta(patch, "name")
        )));
    }
    let key = t.key(name);
    let now = st.clock.now();
    let who = Applier { manager: &opts.manager, force: opts.force, subresource: sub, now: &now };
    match st.store.get(&key).cloned() {
        Some(existing) => {
            check_stale(patch, &existing, t, name)?;
            let merged = apply(&existing, patch, t.kind, &who)?;
            finish_update(st, t, name, &existing, merged, Via { sub, opts, applied: true })
        }
        None if sub.is_empty() => {
            // The applied config on an empty object, then the create rules (which drop managedFields).
            let mut skeleton = json!({"metadata": {"name": name}});
            if let Some(ns) = t.namespace {
                skeleton["metadata"]["namespace"] = json!(ns);
            }
            let merged = apply(&skeleton, patch, t.kind, &who)?;
            let managed = merged.pointer("/metadata/managedFields").cloned().unwrap_or(json!([]));
            let mut created = create(st, t, merged, &WriteOptions { dry_run: true, ..opts.clone() })?;
            created["metadata"]["managedFields"] = managed;
            if opts.dry_run {
                return Ok(created);
            }
            Ok(st.store.put(key, created))
        }
        None => Err(t.not_found(name)),
    }
}

/// `DeleteOptions`: preconditions and propagation.
pub fn delete(st: &mut State, t: &Target, name: &str, options: &Value, policy: Propagation, dry_run: bool) -> ApiResult<Value> {
    t.check_scope()?;
    let key = t.key(name);
    let existing = st.store.get(&key).cloned().ok_or_else(|| t.not_found(name))?;
    for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        if let Some(want) = options.pointer(&format!("/preconditions/{field}")).and_then(Value::as_str) {
            let have = meta(&existing, field).unwrap_or_default();
            if want != have {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!("Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"),
                )
                .with_details(name, &t.kind.group, &t.kind.plural));
            }
        }
    }
    if dry_run {
        return Ok(existing);
    }
    delete_object(st, &key, policy).ok_or_else(|| t.not_found(name))
}

/// The `autoscaling/v1` Scale view of an object.
pub fn scale_of(obj: &Value, kind: &ResourceKind) -> ApiResult<Value> {
    let paths = kind.scale.as_ref().ok_or_else(|| ApiError::new(404, "NotFound", format!("{} has no scale subresource", kind.plural)))?;
    let at = |p: &[String]| p.iter().try_fold(obj, |v, f| v.get(f));
    let selector = match &paths.label_selector {
        Some(p) => at(p).cloned().unwrap_or(json!("")),
        None => json!(
            obj.pointer("/spec/selector/matchLabels")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(","))
                .unwrap_or_default()
        ),
    };
    let m = obj.get("metadata").cloned().unwrap_or_default();
    Ok(json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": m.get("name"), "namespace": m.get("namespace"), "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"), "creationTimestamp": m.get("creationTimestamp"),
        },
        "spec": {"replicas": at(&paths.spec_replicas).cloned().unwrap_or(json!(0))},
        "status": {"replicas": at(&paths.status_replicas).cloned().unwrap_or(json!(0)), "selector": selector},
    }))
}

/// Writes a Scale's `spec.replicas` back into the object (a main-resource write).
pub fn write_scale(st: &mut State, t: &Target, name: &str, scale: &Value, opts: &WriteOptions) -> ApiResult<Value> {
    let existing = get(st, t, name)?;
    check_stale(scale, &existing, t, name)?;
    let replicas = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .ok_or_else(|| ApiError::invalid("spec.replicas: Required value: the Scale needs an integer spec.replicas"))?;
    if replicas < 0 {
        return Err(ApiError::invalid(format!("spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0")));
    }
    let paths =
        t.kind.scale.clone().ok_or_else(|| ApiError::new(404, "NotFound", format!("{} has no scale subresource", t.kind.plural)))?;
    let mut new = existing.clone();
    set_path(&mut new, &paths.spec_replicas, json!(replicas))?;
    let stored = finish_update(st, t, name, &existing, new, Via { sub: "", opts, applied: false })?;
    scale_of(&stored, t.kind)
}

/// Applies a patch of any type to the Scale view and writes the result.
pub fn patch_scale(st: &mut State, t: &Target, name: &str, patch: &Value, kind: PatchKind, opts: &WriteOptions) -> ApiResult<Value> {
    let existing = get(st, t, name)?;
    let mut scale = scale_of(&existing, t.kind)?;
    patch_document(&mut scale, patch, kind, t.kind)?;
    write_scale(st, t, name, &scale, opts)
}

/// Sets a field by path, creating missing parent objects; a parent that is not an object is an error.
fn set_path(obj: &mut Value, path: &[String], value: Value) -> ApiResult<()> {
    let Some((last, parents)) = path.split_last() else { return Err(ApiError::invalid("empty field path")) };
    let mut cur = obj;
    for f in parents {
        let m = cur.as_object_mut().ok_or_else(|| ApiError::invalid(format!("{}: the parent of {f} is not an object", path.join("."))))?;
        cur = m.entry(f.clone()).or_insert_with(|| json!({}));
    }
    cur.as_object_mut()
        .ok_or_else(|| ApiError::invalid(format!("{}: the parent of {last} is not an object", path.join("."))))?
        .insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_kinds_by_content_type() {
        let cases = [
            ("application/json-patch+json", PatchKind::Json),
            ("application/merge-patch+json", PatchKind::Merge),
            ("application/strategic-merge-patch+json; charset=utf-8", PatchKind::Strategic),
            ("application/apply-patch+yaml", PatchKind::Apply),
        ];
        for (ct, want) in cases {
            assert_eq!(PatchKind::from_content_type(Some(ct)).unwrap(), want, "{ct}");
        }
        assert_eq!(PatchKind::from_content_type(Some("text/plain")).unwrap_err().code, 415);
        assert_eq!(PatchKind::from_content_type(None).unwrap_err().code, 415);
    }

    #[test]
    fn apply_bodies_may_be_yaml() {
        let yaml = b"apiVersion: v1\nkind: ConfigMap\ndata:\n  k: v\n";
        assert_eq!(parse_body(yaml, true).unwrap(), json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}}));
        assert_eq!(parse_body(yaml, false).unwrap_err().code, 400);
        assert_eq!(parse_body(b"{\"a\": 1}", false).unwrap(), json!({"a": 1}));
    }

    #[test]
    fn set_path_refuses_non_object_parents() {
        let mut v = json!({"spec": 5});
        assert!(set_path(&mut v, &["spec".to_string(), "replicas".to_string()], json!(1)).is_err());
        let mut v = json!({});
        set_path(&mut v, &["spec".to_string(), "replicas".to_string()], json!(1)).unwrap();
        assert_eq!(v, json!({"spec": {"replicas": 1}}));
    }
}
