//! The `default`s of a CRD's structural schema, applied on every write as the API server does:
//! a missing property with a default gets it when its parent object is present.

use serde_json::Value;

use crate::kinds::ResourceKind;

pub fn apply_defaults(obj: &mut Value, kind: &ResourceKind) {
    if let Some(schema) = &kind.schema {
        default_into(obj, schema);
    }
}

fn default_into(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(m) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else { return };
            for (name, prop) in props {
                // metadata is the server's, not the schema's.
                if name == "metadata" {
                    continue;
                }
                if !m.contains_key(name)
                    && let Some(d) = prop.get("default")
                {
                    m.insert(name.clone(), d.clone());
                }
                if let Some(child) = m.get_mut(name) {
                    default_into(child, prop);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                items.iter_mut().for_each(|i| default_into(i, item_schema));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_fill_missing_fields_under_present_parents() {
        let schema = json!({"properties": {
            "spec": {"properties": {"replicas": {"default": 1}, "inner": {"properties": {"x": {"default": "d"}}}, "list": {"items": {"properties": {"p": {"default": 0}}}}}},
        }});
        let mut obj = json!({"spec": {"replicas": 3, "list": [{}, {"p": 5}]}});
        default_into(&mut obj, &schema);
        assert_eq!(obj, json!({"spec": {"replicas": 3, "list": [{"p": 0}, {"p": 5}]}}));
        let mut obj = json!({"spec": {"inner": {}}});
        default_into(&mut obj, &schema);
        assert_eq!(obj, json!({"spec": {"replicas": 1, "inner": {"x": "d"}}}));
    }
}
