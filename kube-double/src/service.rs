//! The HTTP face: a `tower::Service` that `kube::Client::new` accepts. It logs each request,
//! serves an injected fault if one matches, routes by method and path, and answers JSON (or a
//! stream of JSON lines for a watch).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};

use crate::discovery;
use crate::error::{ApiError, ApiResult};
use crate::gc::Propagation;
use crate::ops::{self, PatchKind, Target, WriteOptions};
use crate::path::{ResourcePath, parse};
use crate::selector::{FieldSelector, LabelSelector};
use crate::state::{RecordedRequest, State};
use crate::store::WatchFilter;
use crate::watch::{self, WatchParams};

pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// The service half of the double; clone it freely (all clones share one state).
#[derive(Clone)]
pub struct DoubleService {
    pub(crate) state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> ApiResult<MutexGuard<'_, State>> {
    state.lock().map_err(|_| ApiError::new(500, "InternalError", "the double's state lock is poisoned (a test panicked while holding it)"))
}

pub(crate) fn json_response(code: u16, body: &Value) -> Response<ResponseBody> {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
    let mut resp = Response::new(Full::new(bytes).boxed_unsync());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    resp
}

fn error_response(e: &ApiError) -> Response<ResponseBody> {
    json_response(e.code, &e.status_body())
}

/// The parsed query string.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: &str) -> Self {
        Self(form_urlencoded::parse(q.as_bytes()).into_owned().collect())
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true") | Some("1"))
    }
}

enum Reply {
    Json(u16, Value),
    Watch(futures::stream::BoxStream<'static, Bytes>),
}

impl DoubleService {
    pub(crate) async fn serve(self, req: Request<kube::client::Body>) -> Response<ResponseBody> {
        let (parts, body) = req.into_parts();
        let bytes = match body.collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) => return error_response(&ApiError::bad_request(format!("reading the request body failed: {e}"))),
        };
        let content_type = parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
        let user_agent = parts.headers.get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("unknown").to_string();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or("").to_string();
        let is_apply = content_type.as_deref().is_some_and(|c| c.starts_with("application/apply-patch"));
        let parsed_body = if bytes.is_empty() { None } else { ops::parse_body(&bytes, is_apply).ok() };
        {
            let mut st = match lock(&self.state) {
                Ok(s) => s,
                Err(e) => return error_response(&e),
            };
            st.log.push(RecordedRequest {
                method: parts.method.clone(),
                path: path.clone(),
                query: query.clone(),
                content_type: content_type.clone(),
                body: parsed_body,
            });
            if let Some(e) = st.take_fault(&parts.method, &path) {
                return error_response(&e);
            }
        }
        let req = Incoming { method: parts.method, path, query: Query::parse(&query), content_type, user_agent, body: bytes };
        match self.route(&req) {
            Ok(Reply::Json(code, v)) => json_response(code, &v),
            Ok(Reply::Watch(lines)) => {
                let frames = lines.map(|b| Ok::<_, Infallible>(Frame::data(b)));
                let mut resp = Response::new(StreamBody::new(frames).boxed_unsync());
                resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
                resp
            }
            Err(e) => error_response(&e),
        }
    }

    fn route(&self, req: &Incoming) -> ApiResult<Reply> {
        if req.method == Method::GET
            && let Some(doc) = discovery::answer(&lock(&self.state)?.registry, &req.path)
        {
            return doc.map(|v| Reply::Json(200, v));
        }
        let rp = parse(&req.path)?;
        let kind = lock(&self.state)?.registry.get(&rp.group, &rp.version, &rp.plural)?.clone();
        let t = Target { kind: &kind, namespace: rp.namespace.as_deref() };
        let sub = rp.subresource.as_deref().unwrap_or("");
        match sub {
            "" => {}
            "status" if kind.status_subresource => {}
            "scale" if kind.scale.is_some() => {}
            other => return Err(ApiError::new(404, "NotFound", format!("{} has no {other} subresource", kind.plural))),
        }
        let opts = WriteOptions {
            manager: req.query.get("fieldManager").map(str::to_string).unwrap_or_else(|| default_manager(&req.user_agent)),
            force: req.query.flag("force"),
            dry_run: req.query.get("dryRun") == Some("All"),
        };
        let body = || ops::parse_body(&req.body, false);
        if req.method == Method::GET && req.query.flag("watch") && sub.is_empty() {
            return open_watch(&self.state, &rp, &kind, &req.query);
        }
        let mut st = lock(&self.state)?;
        let st = &mut *st;
        match (&req.method, rp.name.as_deref()) {
            (&Method::GET, None) => list(st, &rp, &kind, &req.query).map(|v| Reply::Json(200, v)),
            (&Method::GET, Some(name)) => {
                let obj = ops::get(st, &t, name)?;
                if sub == "scale" { Ok(Reply::Json(200, ops::scale_of(&obj, &kind)?)) } else { Ok(Reply::Json(200, obj)) }
            }
            (&Method::POST, None) => ops::create(st, &t, body()?, &opts).map(|v| Reply::Json(201, v)),
            (&Method::PUT, Some(name)) if sub == "scale" => ops::write_scale(st, &t, name, &body()?, &opts).map(|v| Reply::Json(200, v)),
            (&Method::PUT, Some(name)) => ops::replace(st, &t, name, body()?, sub, &opts).map(|v| Reply::Json(200, v)),
            (&Method::PATCH, Some(name)) => {
                let pk = PatchKind::from_content_type(req.content_type.as_deref())?;
                let patch = ops::parse_body(&req.body, pk == PatchKind::Apply)?;
                let out = if sub == "scale" {
                    ops::patch_scale(st, &t, name, &patch, pk, &opts)?
                } else {
                    ops::patch(st, &t, name, patch, pk, sub, &opts)?
                };
                Ok(Reply::Json(200, out))
            }
            (&Method::DELETE, Some(name)) if sub.is_empty() => {
                let (options, policy, dry_run) = delete_options(req)?;
                ops::delete(st, &t, name, &options, policy, dry_run).map(|v| Reply::Json(200, v))
            }
            (&Method::DELETE, None) => {
                let (options, policy, dry_run) = delete_options(req)?;
                let listed = list(st, &rp, &kind, &req.query)?;
                let mut deleted = Vec::new();
                for item in listed["items"].as_array().cloned().unwrap_or_default() {
                    let name = item.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                    let ns = item.pointer("/metadata/namespace").and_then(Value::as_str);
                    let item_t = Target { kind: &kind, namespace: ns };
                    deleted.push(ops::delete(st, &item_t, name, &options, policy, dry_run)?);
                }
                Ok(Reply::Json(200, list_body(&kind, st.store.resource_version(), deleted, None)))
            }
            (m, _) => Err(ApiError::method_not_allowed(format!("{m} is not supported on {}", req.path))),
        }
    }
}

/// `DeleteOptions` from the body (kube sends them there), with the propagation policy and
/// `dryRun` from it or the query.
fn delete_options(req: &Incoming) -> ApiResult<(Value, Propagation, bool)> {
    let options = if req.body.is_empty() { json!({}) } else { ops::parse_body(&req.body, false)? };
    let policy = Propagation::parse(options.get("propagationPolicy").and_then(Value::as_str).or(req.query.get("propagationPolicy")))?;
    let dry_run = req.query.get("dryRun") == Some("All")
        || options.get("dryRun").and_then(Value::as_array).is_some_and(|d| d.iter().any(|v| v == "All"));
    Ok((options, policy, dry_run))
}

struct Incoming {
    method: Method,
    path: String,
    query: Query,
    content_type: Option<String>,
    user_agent: String,
    body: Bytes,
}

/// Without `fieldManager`, the API server names the manager after the user agent's first word.
fn default_manager(user_agent: &str) -> String {
    user_agent.split('/').next().unwrap_or("unknown").to_string()
}

fn list_body(kind: &crate::kinds::ResourceKind, rv: u64, items: Vec<Value>, cont: Option<String>) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({"apiVersion": kind.api_version(), "kind": format!("{}List", kind.kind), "metadata": meta, "items": items})
}

fn filter_for(rp: &ResourcePath, kind: &crate::kinds::ResourceKind, q: &Query, name: Option<&str>) -> ApiResult<WatchFilter> {
    let mut field_sel = q.get("fieldSelector").unwrap_or("").to_string();
    if let Some(n) = name {
        field_sel = if field_sel.is_empty() { format!("metadata.name={n}") } else { format!("{field_sel},metadata.name={n}") };
    }
    Ok(WatchFilter {
        group: kind.group.clone(),
        plural: kind.plural.clone(),
        namespace: if kind.namespaced { rp.namespace.clone() } else { None },
        labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(&field_sel)?,
    })
}

/// LIST with selectors and `limit`/`continue` (the token is `<resourceVersion>/<offset>`).
fn list(st: &State, rp: &ResourcePath, kind: &crate::kinds::ResourceKind, q: &Query) -> ApiResult<Value> {
    if !kind.namespaced && rp.namespace.is_some() {
        return Err(ApiError::new(404, "NotFound", format!("{} is cluster-scoped: the path has a namespace", kind.plural)));
    }
    let filter = filter_for(rp, kind, q, None)?;
    let items: Vec<Value> = st
        .store
        .list(&kind.group, &kind.plural, filter.namespace.as_deref())
        .into_iter()
        .filter(|(k, v)| filter.matches(k, v))
        .map(|(_, v)| v.clone())
        .collect();
    let (rv, offset) = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let parsed = token.split_once('/').and_then(|(rv, off)| Some((rv.parse::<u64>().ok()?, off.parse::<usize>().ok()?)));
            let (rv, off) = parsed.ok_or_else(|| ApiError::bad_request(format!("invalid continue token {token:?}")))?;
            if rv < st.store.history_floor() {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, off)
        }
        None => (st.store.resource_version(), 0),
    };
    let limit = match q.get("limit") {
        Some(l) => Some(l.parse::<usize>().map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?).filter(|l| *l > 0),
        None => None,
    };
    let rest: Vec<Value> = items.into_iter().skip(offset).collect();
    let (page, cont) = match limit {
        Some(l) if rest.len() > l => (rest[..l].to_vec(), Some(format!("{rv}/{}", offset + l))),
        _ => (rest, None),
    };
    Ok(list_body(kind, rv, page, cont))
}

/// A watch takes the state lock itself (to register atomically with its initial events).
fn open_watch(state: &Arc<Mutex<State>>, rp: &ResourcePath, kind: &crate::kinds::ResourceKind, q: &Query) -> ApiResult<Reply> {
    let filter = filter_for(rp, kind, q, rp.name.as_deref())?;
    let params = WatchParams {
        resource_version: q.get("resourceVersion").map(str::to_string),
        bookmarks: q.flag("allowWatchBookmarks"),
        send_initial_events: q.flag("sendInitialEvents"),
        timeout: watch::parse_timeout(q.get("timeoutSeconds"))?,
    };
    watch::open(state, filter, params, kind.api_version(), kind.kind.clone()).map(Reply::Watch)
}

impl tower_service::Service<Request<kube::client::Body>> for DoubleService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.serve(req).await) })
    }
}
