//! The chart's ValidatingAdmissionPolicy, evaluated as the API server would (no API server can
//! run here): its match conditions, variables and validations are CEL, run with the `cel` crate
//! on admission requests an agent, the operator and a stolen token would make.

use cel::{Context, Program, Value};
use serde_json::{Value as Json, json};

/// One admission request's CEL inputs.
pub struct Request {
    pub operation: &'static str,
    pub group: &'static str,
    pub username: String,
    /// The node claim of a Pod-bound service-account token.
    pub node_claim: Option<String>,
    pub resource: &'static str,
    pub sub_resource: &'static str,
    pub object: Json,
}

#[derive(Debug, PartialEq)]
pub enum Decision {
    /// The policy does not apply (its match conditions are false).
    NotMatched,
    Allowed,
    /// Denied, with the message the API server would return.
    Denied(String),
}

fn eval(expr: &str, ctx: &Context) -> Result<Value, String> {
    let program = Program::compile(expr).map_err(|e| format!("CEL does not parse: {expr}: {e}"))?;
    program.execute(ctx).map_err(|e| format!("CEL fails: {expr}: {e}"))
}

fn eval_bool(expr: &str, ctx: &Context) -> Result<bool, String> {
    match eval(expr, ctx)? {
        Value::Bool(b) => Ok(b),
        other => Err(format!("CEL {expr} gave {other:?}, not a bool")),
    }
}

fn to_cel(v: &Json) -> Result<Value, String> {
    cel::to_value(v).map_err(|e| format!("converting {v} to CEL: {e}"))
}

/// Whether `spec.matchConstraints.resourceRules` cover the request (a subresource is named
/// `resource/sub`, as the API server matches it).
fn in_rules(spec: &Json, req: &Request) -> bool {
    let name = if req.sub_resource.is_empty() { req.resource.to_string() } else { format!("{}/{}", req.resource, req.sub_resource) };
    let has = |list: &Json, want: &str| list.as_array().is_some_and(|l| l.iter().any(|v| v == want || v == "*"));
    spec["matchConstraints"]["resourceRules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| has(&r["apiGroups"], req.group) && has(&r["operations"], req.operation) && has(&r["resources"], &name))
}

/// What the policy `spec` decides for `req`.
pub fn decide(spec: &Json, req: &Request) -> Result<Decision, String> {
    if !in_rules(spec, req) {
        return Ok(Decision::NotMatched);
    }
    let extra = match &req.node_claim {
        Some(node) => json!({"authentication.kubernetes.io/node-name": [node]}),
        None => json!({}),
    };
    let request = json!({
        "userInfo": {"username": req.username, "extra": extra},
        "resource": {"group": req.group, "version": "v1", "resource": req.resource},
        "subResource": req.sub_resource,
    });
    let mut ctx = Context::default();
    ctx.add_variable_from_value("request", to_cel(&request)?);
    ctx.add_variable_from_value("object", to_cel(&req.object)?);
    for cond in spec["matchConditions"].as_array().into_iter().flatten() {
        if !eval_bool(cond["expression"].as_str().unwrap_or_default(), &ctx)? {
            return Ok(Decision::NotMatched);
        }
    }
    let mut variables = serde_json::Map::new();
    for var in spec["variables"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap_or_default().to_string();
        let value = match eval(var["expression"].as_str().unwrap_or_default(), &ctx)? {
            Value::String(s) => Json::String(s.to_string()),
            Value::Bool(b) => Json::Bool(b),
            other => return Err(format!("variable {name}: unexpected {other:?}")),
        };
        variables.insert(name, value);
        ctx.add_variable_from_value("variables", to_cel(&Json::Object(variables.clone()))?);
    }
    for v in spec["validations"].as_array().into_iter().flatten() {
        if eval_bool(v["expression"].as_str().unwrap_or_default(), &ctx)? {
            continue;
        }
        let message = match (v["messageExpression"].as_str(), v["message"].as_str()) {
            (Some(expr), _) => match eval(expr, &ctx)? {
                Value::String(s) => s.to_string(),
                other => return Err(format!("messageExpression {expr} gave {other:?}")),
            },
            (None, Some(m)) => m.to_string(),
            (None, None) => String::from("denied"),
        };
        return Ok(Decision::Denied(message));
    }
    Ok(Decision::Allowed)
}
