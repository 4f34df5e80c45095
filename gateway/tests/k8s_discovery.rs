//! EndpointSlice discovery driven through a real `kube::Client` against a fake Kubernetes API
//! server in this process that speaks the real HTTP API for one resource:
//! `GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices` with a `labelSelector`, as a
//! list (an `EndpointSliceList` carrying the collection's `resourceVersion`) or with
//! `watch=true` as newline-delimited JSON watch events (`ADDED`, `MODIFIED`, `DELETED`, and a
//! `BOOKMARK` after the backlog) from the requested resource version on, held open for new
//! changes.
//!
//! Services are served too, from a fixed list (`GET /api/v1/namespaces/NS/services`: a list,
//! or a watch that sends a bookmark and then nothing), for the `sluice.dev/models` annotation.
//!
//! What the fake leaves out: authentication, field selectors, set-based label selectors (only
//! `key=value`), pagination (`limit`/`continue` are ignored: every list is one page),
//! `resourceVersionMatch` semantics, watch expiry (`410 Gone` and the relist it forces; the
//! watcher's relist path is instead exercised by restarting the watch), `timeoutSeconds`
//! (watches stay open), protobuf, and every other resource. The replicas are fake OpenAI
//! servers on 127.0.0.1–3 sharing one port, as pods behind one Service do.

mod common;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get as route_get;
use common::fake_upstream::{self, Fake};
use common::routing::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use sluice_gateway::api::HttpLimits;
use sluice_gateway::discovery::k8s::{self, Target};

/// The fake API server's store: every slice and the log of changes, by resource version.
#[derive(Default)]
struct Store {
    rv: u64,
    slices: std::collections::BTreeMap<(String, String), Value>,
    log: Vec<(u64, &'static str, Value)>,
}

struct Api {
    store: Mutex<Store>,
    changed: tokio::sync::broadcast::Sender<u64>,
    watches: Mutex<usize>,
    /// Services, listed as they are (no changes are watched).
    services: Mutex<Vec<Value>>,
}

impl Api {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            store: Mutex::default(),
            changed: tokio::sync::broadcast::channel(64).0,
            watches: Mutex::new(0),
            services: Mutex::default(),
        })
    }

    /// Creates or replaces a slice (`ADDED` or `MODIFIED`).
    fn put(&self, ns: &str, mut slice: Value) {
        let mut s = self.store.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        slice["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = (
            ns.to_string(),
            slice["metadata"]["name"].as_str().unwrap().to_string(),
        );
        let kind = if s.slices.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        s.slices.insert(key, slice.clone());
        s.log.push((rv, kind, slice));
        drop(s);
        let _ = self.changed.send(rv);
    }

    fn delete(&self, ns: &str, name: &str) {
        let mut s = self.store.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        let mut slice = s
            .slices
            .remove(&(ns.to_string(), name.to_string()))
            .expect("deleting a slice that exists");
        slice["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.log.push((rv, "DELETED", slice));
        drop(s);
        let _ = self.changed.send(rv);
    }
}

fn matches(slice: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector else { return true };
    sel.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => slice["metadata"]["labels"][k].as_str() == Some(v),
        None => false,
    })
}

fn slice_ns(slice: &Value) -> &str {
    slice["metadata"]["namespace"].as_str().unwrap_or("")
}

async fn endpointslices(
    State(api): State<Arc<Api>>,
    Path(ns): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let selector = q.get("labelSelector").cloned();
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    if !watch {
        let s = api.store.lock().unwrap();
        let items: Vec<&Value> = s
            .slices
            .iter()
            .filter(|((n, _), v)| *n == ns && matches(v, selector.as_ref()))
            .map(|(_, v)| v)
            .collect();
        let body = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
            "metadata": {"resourceVersion": s.rv.to_string()}, "items": items});
        return axum::Json(body).into_response();
    }
    *api.watches.lock().unwrap() += 1;
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let changes = api.changed.subscribe();
    let backlog: Vec<(u64, &'static str, Value)> = api
        .store
        .lock()
        .unwrap()
        .log
        .iter()
        .filter(|(rv, _, _)| *rv > from)
        .cloned()
        .collect();
    let line = |kind: &str, obj: &Value| {
        Bytes::from(format!("{}\n", json!({"type": kind, "object": obj})))
    };
    let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let stream = async_stream(
        api.clone(),
        ns,
        selector,
        from,
        backlog,
        bookmarks,
        line,
        changes,
    );
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// The watch body: the backlog, a bookmark, then each change as it happens.
#[allow(clippy::too_many_arguments)]
fn async_stream(
    api: Arc<Api>,
    ns: String,
    selector: Option<String>,
    from: u64,
    backlog: Vec<(u64, &'static str, Value)>,
    bookmarks: bool,
    line: impl Fn(&str, &Value) -> Bytes + Send + 'static,
    changes: tokio::sync::broadcast::Receiver<u64>,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let mut sent = from;
    let mut first: Vec<Bytes> = Vec::new();
    for (rv, kind, obj) in backlog {
        sent = sent.max(rv);
        if slice_ns(&obj) == ns && matches(&obj, selector.as_ref()) {
            first.push(line(kind, &obj));
        }
    }
    if bookmarks {
        let rv = api.store.lock().unwrap().rv.max(sent);
        first.push(line(
            "BOOKMARK",
            &json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                    "metadata": {"resourceVersion": rv.to_string()}}),
        ));
    }
    let later = futures_util::stream::unfold(
        (changes, sent, api, ns, selector, line),
        |(mut changes, mut sent, api, ns, selector, line)| async move {
            loop {
                match changes.recv().await {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return None,
                }
                let news: Vec<(u64, &'static str, Value)> = api
                    .store
                    .lock()
                    .unwrap()
                    .log
                    .iter()
                    .filter(|(rv, _, _)| *rv > sent)
                    .cloned()
                    .collect();
                let mut out = Vec::new();
                for (rv, kind, obj) in news {
                    sent = sent.max(rv);
                    if slice_ns(&obj) == ns && matches(&obj, selector.as_ref()) {
                        out.push(line(kind, &obj));
                    }
                }
                if !out.is_empty() {
                    let chunk = Bytes::from(out.concat());
                    return Some((chunk, (changes, sent, api, ns, selector, line)));
                }
            }
        },
    );
    futures_util::stream::iter(first)
        .chain(later)
        .map(Ok::<_, Infallible>)
}

/// Services: the list, or a watch that holds still after its bookmark.
async fn services(
    State(api): State<Arc<Api>>,
    Path(ns): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let rv = api.store.lock().unwrap().rv.to_string();
    if !matches!(q.get("watch").map(String::as_str), Some("true" | "1")) {
        let items: Vec<Value> = api
            .services
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s["metadata"]["namespace"] == ns.as_str())
            .cloned()
            .collect();
        let body = json!({"apiVersion": "v1", "kind": "ServiceList",
            "metadata": {"resourceVersion": rv}, "items": items});
        return axum::Json(body).into_response();
    }
    let bookmark = json!({"type": "BOOKMARK", "object": {"kind": "Service", "apiVersion": "v1",
        "metadata": {"resourceVersion": rv}}});
    let first =
        futures_util::stream::iter([Ok::<_, Infallible>(Bytes::from(format!("{bookmark}\n")))]);
    let body = first.chain(futures_util::stream::pending());
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(body))
        .unwrap()
}

/// A fake API server for `api` on a free port; returns a client of it.
async fn api_server(api: &Arc<Api>) -> kube::Client {
    let app = axum::Router::new()
        .route(
            "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            route_get(endpointslices),
        )
        .route("/api/v1/namespaces/{ns}/services", route_get(services))
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let config = kube::Config::new(format!("http://{api_addr}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_annotation_names_models_known_with_no_ready_endpoint() {
    let api = Api::new();
    // The pool is at zero: its slice lists no ready endpoint.
    api.put("prod", slice("llm-a", "llm", 8000, &[("127.0.0.9", false)]));
    api.services.lock().unwrap().extend([
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "llm", "namespace": "prod", "resourceVersion": "1",
                         "annotations": {"sluice.dev/models": "m2, m3"}},
            "spec": {"clusterIP": "None"}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "other", "namespace": "prod", "resourceVersion": "1",
                         "annotations": {"sluice.dev/models": "nope"}},
            "spec": {}}),
    ]);
    let client = api_server(&api).await;
    let gw = gateway(quick_config(), vec![], HttpLimits::default()).await;
    let slot = gw.router.add_source();
    tokio::spawn(k8s::run(
        client,
        Target::parse("prod/llm:http").unwrap(),
        gw.router.clone(),
        slot,
    ));
    let router = gw.router.clone();
    let want: BTreeSet<String> = ["m2", "m3"].map(String::from).into();
    eventually(Duration::from_secs(10), "the annotation's models", || {
        router.known_models() == want
    })
    .await;
    assert!(gw.router.replicas().is_empty());
    let b = format!("http://{}", gw.addr);
    let listed = get(&b, "/v1/models").await.json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m2", "m3"]);
    let r = post(&b, "/v1/chat/completions", chat("nope", "hi", false), &[]).await;
    assert_eq!(r.status, 404);
}

fn slice(name: &str, service: &str, port: u16, endpoints: &[(&str, bool)]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "prod",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": endpoints.iter().map(|(ip, ready)| json!({
            "addresses": [ip], "conditions": {"ready": ready}})).collect::<Vec<_>>(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpointslices_add_and_remove_replicas() {
    // Three fake replicas sharing a port on three loopback addresses.
    let first = Fake::new("m");
    let (a0, _t0) = fake_upstream::serve_on(first, "127.0.0.1".parse().unwrap(), 0).await;
    let port = a0.port();
    for ip in ["127.0.0.2", "127.0.0.3"] {
        std::mem::forget(fake_upstream::serve_on(Fake::new("m"), ip.parse().unwrap(), port).await);
    }
    let url = |ip: &str| format!("http://{ip}:{port}");

    let api = Api::new();
    api.put(
        "prod",
        slice(
            "llm-a",
            "llm",
            port,
            &[("127.0.0.1", true), ("127.0.0.2", true)],
        ),
    );
    // Another Service's slice in the same namespace: never a replica.
    api.put(
        "prod",
        slice("other-x", "other", port, &[("127.0.0.3", true)]),
    );
    let app = axum::Router::new()
        .route(
            "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            route_get(endpointslices),
        )
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let config = kube::Config::new(format!("http://{api_addr}").parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let gw = gateway(quick_config(), vec![], HttpLimits::default()).await;
    let slot = gw.router.add_source();
    let watcher = tokio::spawn(k8s::run(
        client,
        Target::parse("prod/llm:http").unwrap(),
        gw.router.clone(),
        slot,
    ));
    let router = gw.router.clone();
    let set =
        move || -> BTreeSet<String> { router.replicas().keys().map(|u| u.to_string()).collect() };
    let want = |ips: &[&str]| ips.iter().map(|ip| url(ip)).collect::<BTreeSet<_>>();

    let s = set.clone();
    let w = want(&["127.0.0.1", "127.0.0.2"]);
    eventually(
        Duration::from_secs(10),
        "the listed slice's replicas",
        || s() == w,
    )
    .await;
    // Requests reach them.
    let r2 = gw.router.clone();
    eventually(Duration::from_secs(5), "replicas healthy", || {
        r2.any_eligible()
    })
    .await;
    let b = format!("http://{}", gw.addr);
    let r = post(&b, "/v1/chat/completions", chat("m", "hi", false), &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(w.contains(&r.replica().unwrap()));

    // A second slice appears (watch: ADDED).
    api.put("prod", slice("llm-b", "llm", port, &[("127.0.0.3", true)]));
    let w = want(&["127.0.0.1", "127.0.0.2", "127.0.0.3"]);
    eventually(Duration::from_secs(10), "the added slice", || s() == w).await;
    // A pod turns unready (MODIFIED).
    api.put(
        "prod",
        slice(
            "llm-a",
            "llm",
            port,
            &[("127.0.0.1", false), ("127.0.0.2", true)],
        ),
    );
    let w = want(&["127.0.0.2", "127.0.0.3"]);
    eventually(
        Duration::from_secs(10),
        "the unready endpoint leaves",
        || s() == w,
    )
    .await;
    // A slice is deleted (DELETED).
    api.delete("prod", "llm-b");
    let w = want(&["127.0.0.2"]);
    eventually(
        Duration::from_secs(10),
        "the deleted slice's replica leaves",
        || s() == w,
    )
    .await;
    for i in 0..4 {
        let r = post(
            &b,
            "/v1/chat/completions",
            chat("m", &format!("{i}"), false),
            &[],
        )
        .await;
        assert_eq!(r.replica().unwrap(), url("127.0.0.2"));
    }
    // Changes to another Service never matter.
    api.put(
        "prod",
        slice("other-x", "other", port, &[("127.0.0.1", true)]),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s(), w);

    // A restarted watcher lists afresh and reports the same fleet.
    watcher.abort();
    let config = kube::Config::new(format!("http://{api_addr}").parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    api.put("prod", slice("llm-c", "llm", port, &[("127.0.0.1", true)]));
    tokio::spawn(k8s::run(
        client,
        Target::parse("prod/llm:http").unwrap(),
        gw.router.clone(),
        slot,
    ));
    let w = want(&["127.0.0.1", "127.0.0.2"]);
    eventually(Duration::from_secs(10), "the relisted fleet", || s() == w).await;
    assert!(*api.watches.lock().unwrap() >= 2);
}
