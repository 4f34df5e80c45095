//! An in-process fake Kubernetes API server speaking the real HTTP API, for driving the
//! controller through a real `kube::Client`.
//!
//! It serves any resource by path, generically: core (`/api/v1/...`) and grouped
//! (`/apis/GROUP/VERSION/...`), namespaced and cluster-scoped, and all-namespaces lists. Verbs:
//! list (with `key=value` label selectors) and watch (newline-delimited `ADDED`/`MODIFIED`/
//! `DELETED` events from a resource version on, then a `BOOKMARK`, held open for changes),
//! get, create (`409 AlreadyExists`), replace (`409 Conflict` on a stale `resourceVersion`),
//! patch (merge, and server-side apply treated as a merge), delete, and the `status` and
//! `scale` subresources (`scale` of Deployments maps to `spec.replicas`). Every write is
//! recorded in [`Fake::writes`] so tests can assert what changed, and nothing else did.
//!
//! What it leaves out: authentication and RBAC, admission and defaulting, validation against
//! schemas (a ServingPool is stored as sent), field selectors, set-based selectors,
//! pagination, watch expiry (`410 Gone`), strategic-merge and JSON-patch semantics, field
//! ownership in server-side apply, garbage collection and every built-in controller: no
//! Deployment controller makes pods (tests call [`Fake::sync_pods`] to play it), no scheduler
//! binds them, and events are stored, not aggregated.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};

/// (resource, namespace, name): resource is `GROUP/VERSION/PLURAL` (`/v1/pods` for core).
type Key = (String, String, String);

#[derive(Default)]
struct Store {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Value>,
    log: Vec<(u64, &'static str, String, Value)>,
    writes: Vec<(String, String)>,
}

/// The fake server's state.
pub struct Fake {
    store: Mutex<Store>,
    changed: tokio::sync::broadcast::Sender<u64>,
    pub addr: SocketAddr,
}

/// A parsed request path.
#[derive(Debug, Clone)]
struct ApiPath {
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<ApiPath> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest): (String, &[&str]) = match parts.as_slice() {
        ["api", v, rest @ ..] => (format!("/{v}"), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (p, None, None),
        [p, n] => (p, Some(n.to_string()), None),
        [p, n, s] => (p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    Some(ApiPath {
        resource: format!("{gv}/{plural}"),
        namespace,
        name,
        sub,
    })
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response()
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn matches(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    sel.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => obj["metadata"]["labels"][k].as_str() == Some(v),
        None => false,
    })
}

impl Fake {
    /// Starts a fake API server on 127.0.0.1:0.
    pub async fn start() -> Arc<Fake> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = Arc::new(Fake {
            store: Mutex::default(),
            changed: tokio::sync::broadcast::channel(1024).0,
            addr,
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        fake
    }

    /// A client for this server.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// Stores an object directly (no write recorded), as setup.
    pub fn put(&self, resource: &str, mut obj: Value) {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let mut s = self.store.lock().unwrap();
        let key = (resource.to_string(), ns, name);
        let kind = if s.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        s.rv += 1;
        s.uid += 1;
        let rv = s.rv;
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{}", s.uid));
        }
        if obj["metadata"]["generation"].is_null() {
            obj["metadata"]["generation"] = json!(1);
        }
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.objects.insert(key, obj.clone());
        s.log.push((rv, kind, resource.to_string(), obj));
        drop(s);
        let _ = self.changed.send(rv);
    }

    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let s = self.store.lock().unwrap();
        s.objects
            .get(&(resource.to_string(), ns.to_string(), name.to_string()))
            .cloned()
    }

    pub fn list(&self, resource: &str) -> Vec<Value> {
        let s = self.store.lock().unwrap();
        s.objects
            .iter()
            .filter(|((r, _, _), _)| r == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Removes an object directly (no write recorded), as the test's world changing.
    pub fn remove(&self, resource: &str, ns: &str, name: &str) {
        let mut s = self.store.lock().unwrap();
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        if let Some(mut obj) = s.objects.remove(&key) {
            s.rv += 1;
            let rv = s.rv;
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            s.log.push((rv, "DELETED", resource.to_string(), obj));
            drop(s);
            let _ = self.changed.send(rv);
        }
    }

    /// Every write the server accepted: (method, path).
    pub fn writes(&self) -> Vec<(String, String)> {
        self.store.lock().unwrap().writes.clone()
    }

    /// Writes other than the leader Lease's.
    pub fn writes_except_leases(&self) -> Vec<(String, String)> {
        self.writes()
            .into_iter()
            .filter(|(_, p)| !p.contains("/leases"))
            .collect()
    }

    /// Plays the Deployment controller (and the scheduler) for one Deployment: makes its
    /// pods as many as `spec.replicas`, new ones `ready` on `node` or, with `node` `None`,
    /// pending (unscheduled); excess pods go, newest first.
    pub fn sync_pods(&self, ns: &str, deployment: &str, node: Option<&str>) {
        let d = self
            .get(DEPLOYMENTS, ns, deployment)
            .expect("deployment exists");
        let want = d["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
        let labels = d["spec"]["selector"]["matchLabels"].clone();
        let mut mine: Vec<Value> = self
            .list(PODS)
            .into_iter()
            .filter(|p| {
                p["metadata"]["namespace"] == ns
                    && labels
                        .as_object()
                        .unwrap()
                        .iter()
                        .all(|(k, v)| p["metadata"]["labels"][k] == *v)
            })
            .collect();
        mine.sort_by_key(|p| p["metadata"]["name"].as_str().unwrap().to_string());
        while mine.len() > want {
            let p = mine.pop().unwrap();
            self.remove(PODS, ns, p["metadata"]["name"].as_str().unwrap());
        }
        let mut i = 0;
        while mine.len() < want {
            let name = format!("{deployment}-{i}");
            i += 1;
            if mine.iter().any(|p| p["metadata"]["name"] == name.as_str()) {
                continue;
            }
            let pod = pod(ns, &name, &labels, node);
            self.put(PODS, pod.clone());
            mine.push(pod);
        }
    }
}

pub const DEPLOYMENTS: &str = "apps/v1/deployments";
pub const PODS: &str = "/v1/pods";
pub const NODES: &str = "/v1/nodes";
pub const EVENTS: &str = "events.k8s.io/v1/events";
pub const LEASES: &str = "coordination.k8s.io/v1/leases";
pub const POOLS: &str = "sluice.dev/v1alpha1/servingpools";
pub const SLICES: &str = "discovery.k8s.io/v1/endpointslices";
pub const PROVISIONING: &str = "autoscaling.x-k8s.io/v1/provisioningrequests";
pub const PODTEMPLATES: &str = "/v1/podtemplates";

/// A pod with these labels, ready on `node`, or pending without one.
pub fn pod(ns: &str, name: &str, labels: &Value, node: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "replica", "image": "sluice"}]},
        "status": {"phase": "Pending"}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
        p["status"] = json!({"phase": "Running", "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}]});
    }
    p
}

/// A Deployment whose pods carry `app=NAME`.
pub fn deployment(ns: &str, name: &str, replicas: u32) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "replica", "image": "sluice",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})
}

/// A node, optionally with taints.
pub fn node(name: &str, taints: &[&str]) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "spec": {"taints": taints.iter().map(|k| json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>()}})
}

async fn handle(
    State(fake): State<Arc<Fake>>,
    method: Method,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let Some(t) = parse_path(uri.path()) else {
        return status(404, "NotFound", &format!("no route {}", uri.path()));
    };
    let write = method != Method::GET;
    if write {
        fake.store
            .lock()
            .unwrap()
            .writes
            .push((method.to_string(), uri.path().to_string()));
    }
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        let ct = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // Server-side apply bodies are YAML; kube sends JSON, which is YAML too.
        let _ = ct;
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return status(400, "BadRequest", &format!("body: {e}")),
        }
    };
    match (method.clone(), &t.name) {
        (Method::GET, None) => {
            let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
            if watch {
                watch_stream(fake, t, q)
            } else {
                list(&fake, &t, q.get("labelSelector"))
            }
        }
        (Method::GET, Some(name)) => get_one(&fake, &t, name),
        (Method::POST, None) => create(&fake, &t, body),
        (Method::PUT, Some(name)) => replace(&fake, &t, name, body),
        (Method::PATCH, Some(name)) => patch(&fake, &t, name, body),
        (Method::DELETE, Some(name)) => delete(&fake, &t, name),
        _ => status(405, "MethodNotAllowed", "unsupported"),
    }
}

fn key(t: &ApiPath, name: &str) -> Key {
    (
        t.resource.clone(),
        t.namespace.clone().unwrap_or_default(),
        name.to_string(),
    )
}

fn list(fake: &Fake, t: &ApiPath, selector: Option<&String>) -> Response {
    let s = fake.store.lock().unwrap();
    let items: Vec<&Value> = s
        .objects
        .iter()
        .filter(|((r, ns, _), v)| {
            *r == t.resource && t.namespace.as_ref().is_none_or(|n| n == ns) && matches(v, selector)
        })
        .map(|(_, v)| v)
        .collect();
    axum::Json(json!({"apiVersion": "v1", "kind": "List",
        "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}))
    .into_response()
}

fn scale_of(d: &Value) -> Value {
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
        "metadata": {"name": d["metadata"]["name"], "namespace": d["metadata"]["namespace"],
            "resourceVersion": d["metadata"]["resourceVersion"]},
        "spec": {"replicas": d["spec"]["replicas"]},
        "status": {"replicas": d["status"]["replicas"].as_u64().unwrap_or(0)}})
}

fn get_one(fake: &Fake, t: &ApiPath, name: &str) -> Response {
    let s = fake.store.lock().unwrap();
    match s.objects.get(&key(t, name)) {
        None => status(404, "NotFound", &format!("{} {name} not found", t.resource)),
        Some(o) if t.sub.as_deref() == Some("scale") => axum::Json(scale_of(o)).into_response(),
        Some(o) => axum::Json(o.clone()).into_response(),
    }
}

/// Stores `obj` under `k` at a new resource version and logs the change.
fn commit(fake: &Fake, s: &mut Store, k: Key, mut obj: Value, kind: &'static str) -> Value {
    s.rv += 1;
    let rv = s.rv;
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    s.objects.insert(k.clone(), obj.clone());
    s.log.push((rv, kind, k.0, obj.clone()));
    let _ = fake.changed.send(rv);
    obj
}

fn create(fake: &Fake, t: &ApiPath, mut obj: Value) -> Response {
    let Some(name) = obj["metadata"]["name"].as_str().map(str::to_string) else {
        return status(422, "Invalid", "metadata.name is required");
    };
    let mut s = fake.store.lock().unwrap();
    let k = key(t, &name);
    if s.objects.contains_key(&k) {
        return status(
            409,
            "AlreadyExists",
            &format!("{} {name} already exists", t.resource),
        );
    }
    s.uid += 1;
    obj["metadata"]["uid"] = json!(format!("uid-{}", s.uid));
    obj["metadata"]["generation"] = json!(1);
    obj["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    if let Some(ns) = &t.namespace {
        obj["metadata"]["namespace"] = json!(ns);
    }
    let out = commit(fake, &mut s, k, obj, "ADDED");
    (StatusCode::CREATED, axum::Json(out)).into_response()
}

fn replace(fake: &Fake, t: &ApiPath, name: &str, mut obj: Value) -> Response {
    let mut s = fake.store.lock().unwrap();
    let k = key(t, name);
    let Some(old) = s.objects.get(&k).cloned() else {
        return status(404, "NotFound", &format!("{} {name} not found", t.resource));
    };
    let sent = obj["metadata"]["resourceVersion"].as_str().unwrap_or("");
    if !sent.is_empty() && sent != old["metadata"]["resourceVersion"].as_str().unwrap_or("") {
        return status(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version",
        );
    }
    obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
    obj["metadata"]["generation"] = old["metadata"]["generation"].clone();
    let out = commit(fake, &mut s, k, obj, "MODIFIED");
    axum::Json(out).into_response()
}

fn patch(fake: &Fake, t: &ApiPath, name: &str, body: Value) -> Response {
    let mut s = fake.store.lock().unwrap();
    let k = key(t, name);
    let Some(mut obj) = s.objects.get(&k).cloned() else {
        return status(404, "NotFound", &format!("{} {name} not found", t.resource));
    };
    match t.sub.as_deref() {
        Some("scale") => {
            if let Some(n) = body["spec"]["replicas"].as_u64() {
                obj["spec"]["replicas"] = json!(n);
            }
            let out = commit(fake, &mut s, k, obj, "MODIFIED");
            axum::Json(scale_of(&out)).into_response()
        }
        Some("status") => {
            merge(&mut obj["status"], &body["status"]);
            let out = commit(fake, &mut s, k, obj, "MODIFIED");
            axum::Json(out).into_response()
        }
        _ => {
            let spec_before = obj["spec"].clone();
            merge(&mut obj, &body);
            if obj["spec"] != spec_before {
                let g = obj["metadata"]["generation"].as_i64().unwrap_or(1);
                obj["metadata"]["generation"] = json!(g + 1);
            }
            let out = commit(fake, &mut s, k, obj, "MODIFIED");
            axum::Json(out).into_response()
        }
    }
}

fn delete(fake: &Fake, t: &ApiPath, name: &str) -> Response {
    let mut s = fake.store.lock().unwrap();
    let k = key(t, name);
    let Some(mut obj) = s.objects.remove(&k) else {
        return status(404, "NotFound", &format!("{} {name} not found", t.resource));
    };
    s.rv += 1;
    let rv = s.rv;
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    s.log.push((rv, "DELETED", k.0, obj.clone()));
    let _ = fake.changed.send(rv);
    axum::Json(obj).into_response()
}

fn watch_stream(fake: Arc<Fake>, t: ApiPath, q: HashMap<String, String>) -> Response {
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let selector = q.get("labelSelector").cloned();
    let changes = fake.changed.subscribe();
    let relevant = move |res: &str, obj: &Value, t: &ApiPath, sel: Option<&String>| {
        res == t.resource
            && t.namespace
                .as_ref()
                .is_none_or(|n| obj["metadata"]["namespace"].as_str() == Some(n))
            && matches(obj, sel)
    };
    let line = |kind: &str, obj: &Value| {
        Bytes::from(format!("{}\n", json!({"type": kind, "object": obj})))
    };
    let (first, sent) = {
        let s = fake.store.lock().unwrap();
        let mut out = Vec::new();
        for (rv, kind, res, obj) in &s.log {
            if *rv > from && relevant(res, obj, &t, selector.as_ref()) {
                out.push(line(kind, obj));
            }
        }
        if q.get("allowWatchBookmarks").map(String::as_str) == Some("true") {
            out.push(line(
                "BOOKMARK",
                &json!({"metadata": {"resourceVersion": s.rv.to_string()}}),
            ));
        }
        (out, s.rv.max(from))
    };
    let later = futures_util::stream::unfold(
        (changes, sent, fake, t, selector),
        move |(mut changes, mut sent, fake, t, selector)| async move {
            loop {
                match changes.recv().await {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return None,
                }
                let news: Vec<Bytes> = {
                    let s = fake.store.lock().unwrap();
                    let mut out = Vec::new();
                    for (rv, kind, res, obj) in &s.log {
                        if *rv > sent && relevant(res, obj, &t, selector.as_ref()) {
                            out.push(line(kind, obj));
                        }
                    }
                    sent = sent.max(s.rv);
                    out
                };
                if !news.is_empty() {
                    return Some((
                        Bytes::from(news.concat()),
                        (changes, sent, fake, t, selector),
                    ));
                }
            }
        },
    );
    let stream = futures_util::stream::iter(first)
        .chain(later)
        .map(Ok::<_, Infallible>);
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// A fake GKE REST API and metadata server on one port: records node pool calls, hands out
/// tokens only to requests with `Metadata-Flavor: Google`, and refuses pool calls without
/// the token it handed out.
///
/// What it leaves out: long-running operations (a call's answer is final), node pool
/// validation, quotas, and token expiry (the token never expires within a test).
pub struct FakeGke {
    pub calls: Mutex<Vec<(String, Value)>>,
    pub token_requests: Mutex<u32>,
    pub addr: SocketAddr,
}

impl FakeGke {
    pub async fn start() -> Arc<FakeGke> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let g = Arc::new(FakeGke {
            calls: Mutex::default(),
            token_requests: Mutex::new(0),
            addr,
        });
        let app = axum::Router::new()
            .fallback(gke_handle)
            .with_state(g.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        g
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn gke_handle(
    State(g): State<Arc<FakeGke>>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    if uri.path() == "/computeMetadata/v1/instance/service-accounts/default/token" {
        if h("metadata-flavor") != "Google" {
            return (StatusCode::FORBIDDEN, "missing Metadata-Flavor").into_response();
        }
        *g.token_requests.lock().unwrap() += 1;
        return axum::Json(
            json!({"access_token": "tok-123", "expires_in": 3599, "token_type": "Bearer"}),
        )
        .into_response();
    }
    if h("authorization") != "Bearer tok-123" {
        return (StatusCode::UNAUTHORIZED, "bad token").into_response();
    }
    if method != Method::POST || !uri.path().starts_with("/v1/projects/") {
        return (StatusCode::NOT_FOUND, "no route").into_response();
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    g.calls.lock().unwrap().push((uri.path().to_string(), body));
    axum::Json(json!({"name": "operation-1", "status": "DONE"})).into_response()
}
