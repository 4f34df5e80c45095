//! The gateway's own queue in routing mode, in front of fake replicas with a fixed number of
//! sequence slots (`common::fake_upstream`, `max_num_seqs`): a backlog waits in the gateway and
//! drains onto a replica that becomes ready (late binding), where dispatch-at-once leaves it on
//! the first; a model announced with no replica is listed and its requests are held until one
//! is announced, or refused with 503 + Retry-After after the hold timeout; a deadline that
//! passes in the queue is a 504 `deadline_exceeded`; a full queue is a 429.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::fake_upstream::{self, Fake};
use common::routing::*;
use sluice_gateway::api::HttpLimits;
use sluice_gateway::discovery::Source;
use sluice_gateway::router::remote::ReplicaUrl;
use sluice_gateway::router::{Binding, RouterConfig};

/// A fake replica of model `m` with `slots` sequence slots, each request holding one for
/// `service_ms`.
async fn capped(slots: u64, service_ms: u64) -> (Arc<Fake>, ReplicaUrl) {
    let fake = Fake::new("m");
    fake.max_num_seqs.store(slots, Ordering::SeqCst);
    fake.delay_ms.store(service_ms, Ordering::SeqCst);
    let (addr, task) = fake_upstream::serve(fake.clone(), 0).await;
    std::mem::forget(task);
    (fake, ReplicaUrl::from_addr(addr))
}

fn base(gw: &Gateway) -> String {
    format!("http://{}", gw.addr)
}

fn temp_file(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "sluice-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ))
}

async fn metrics(gw: &Gateway) -> String {
    get(&base(gw), "/metrics").await.body.unwrap()
}

/// Sends `n` chat requests at once; their answers come back through the handles.
fn burst(gw: &Gateway, n: usize) -> Vec<tokio::task::JoinHandle<Answer>> {
    (0..n)
        .map(|i| {
            let b = base(gw);
            tokio::spawn(async move {
                post(
                    &b,
                    "/v1/chat/completions",
                    chat("m", &format!("q{i}"), false),
                    &[],
                )
                .await
            })
        })
        .collect()
}

/// A backlog of 12 on a replica with 2 slots, then a second replica joins: how many of the
/// backlog the second serves, and the first's peak concurrency.
async fn backlog_run(binding: Binding) -> (usize, u64, f64) {
    let (first, first_url) = capped(2, 150).await;
    let (second, second_url) = capped(2, 150).await;
    let gw = gateway(
        RouterConfig {
            binding,
            ..quick_config()
        },
        vec![Source::Static(vec![first_url])],
        HttpLimits::default(),
    )
    .await;
    let router = gw.router.clone();
    eventually(Duration::from_secs(5), "the first replica is ready", || {
        router.ready_for("m", std::time::Instant::now())
    })
    .await;
    let answers = burst(&gw, 12);
    let r = gw.router.clone();
    eventually(Duration::from_secs(5), "the backlog has formed", || {
        let in_flight: usize = r.replicas().values().map(|x| x.in_flight()).sum();
        in_flight + r.queue("m").depth() == 12
    })
    .await;
    let queued = metric(
        &metrics(&gw).await,
        "sluice_gateway_queue_depth",
        &[("model", "m")],
    );
    let slot = gw.router.add_source();
    gw.router.set_source(slot, BTreeSet::from([second_url]));
    for a in answers {
        assert_eq!(a.await.unwrap().status, 200);
    }
    // The front door saw all twelve, and each first token as the client waited for it.
    let text = metrics(&gw).await;
    let m = [("model", "m")];
    assert_eq!(
        metric(&text, "sluice_gateway_model_arrivals_total", &m),
        12.0
    );
    let ttft = "sluice_gateway_model_time_to_first_token_seconds";
    assert_eq!(metric(&text, &format!("{ttft}_count"), &m), 12.0);
    assert_eq!(
        metric(&text, "sluice_gateway_model_unserved_total", &m),
        0.0
    );
    (
        second.served(),
        first.peak_running.load(Ordering::SeqCst),
        queued,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_drains_onto_a_replica_that_becomes_ready() {
    let (late_second, late_peak, late_queued) = backlog_run(Binding::Late).await;
    // Late: the gateway kept all but the first replica's two slots' worth, and the new replica
    // took a share of them.
    assert!(late_queued >= 8.0, "queued in the gateway: {late_queued}");
    assert!(late_second >= 3, "the new replica served {late_second}");
    assert_eq!(late_peak, 2);
    // Early: everything went to the first replica at once; the new one got none of it.
    let (early_second, _, early_queued) = backlog_run(Binding::Early).await;
    assert_eq!(early_queued, 0.0);
    assert_eq!(early_second, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_at_zero_replicas_is_listed_and_held_until_a_replica_is_announced() {
    let path = temp_file("pool");
    std::fs::write(&path, "model m\n").unwrap();
    let gw = gateway(
        quick_config(),
        vec![Source::File(path.clone())],
        HttpLimits::default(),
    )
    .await;
    let b = base(&gw);
    let router = gw.router.clone();
    eventually(Duration::from_secs(5), "the model is announced", || {
        router.serves("m")
    })
    .await;
    let listed = get(&b, "/v1/models").await.json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m"]);
    // Ready: its requests must keep arriving for the pool to be scaled up.
    assert_eq!(get(&b, "/ready").await.status, 200);
    let unknown = post(&b, "/v1/chat/completions", chat("other", "x", false), &[]).await;
    assert_eq!(unknown.status, 404);

    let held = burst(&gw, 1).pop().unwrap();
    let mut text = String::new();
    for _ in 0..250 {
        text = metrics(&gw).await;
        if metric(&text, "sluice_gateway_queue_held", &[("model", "m")]) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(&text, "sluice_gateway_queue_held", &[("model", "m")]),
        1.0,
        "{text}"
    );
    assert!(!held.is_finished());
    assert_eq!(
        metric(&text, "sluice_gateway_queue_depth", &[("model", "m")]),
        1.0
    );
    let oldest = metric(
        &text,
        "sluice_gateway_queue_oldest_wait_seconds",
        &[("model", "m")],
    );
    assert!(oldest > 0.0, "{text}");

    // A replica is announced (the JSON form this time): the held request is answered there.
    let (fake, url) = capped(4, 0).await;
    let json = serde_json::json!({"models": ["m"], "replicas": [url.as_str()]});
    std::fs::write(&path, json.to_string()).unwrap();
    let answer = held.await.unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.replica().as_deref(), Some(url.as_str()));
    assert_eq!(fake.served(), 1);
    let text = metrics(&gw).await;
    assert_eq!(
        metric(&text, "sluice_gateway_queue_held", &[("model", "m")]),
        0.0
    );
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_past_the_hold_timeout_is_503_with_retry_after_and_a_full_queue_429() {
    let gw = gateway(
        RouterConfig {
            hold_timeout: Duration::from_millis(300),
            max_queue: 1,
            ..quick_config()
        },
        vec![Source::Models(vec!["m".into()])],
        HttpLimits::default(),
    )
    .await;
    // One request holds the head of the line, one waits behind it: the next finds it full.
    let held = burst(&gw, 2);
    let r = gw.router.clone();
    eventually(Duration::from_secs(5), "two requests wait", || {
        r.queue("m").depth() == 2
    })
    .await;
    let full = post(
        &base(&gw),
        "/v1/chat/completions",
        chat("m", "x", false),
        &[],
    )
    .await;
    assert_eq!(full.status, 429, "{full:?}");
    assert_eq!(full.json()["error"]["code"], "queue_full");
    for h in held {
        let a = h.await.unwrap();
        assert_eq!(a.status, 503, "{a:?}");
        assert!(a.headers.contains_key("retry-after"), "{a:?}");
        let e = &a.json()["error"];
        assert_eq!(e["type"], "service_unavailable");
        assert!(e["message"].as_str().unwrap().contains("'m'"), "{e}");
    }
    assert_eq!(gw.router.queue("m").depth(), 0);
    // All three were demand for `m` the fleet did not serve: what the autoscaler counts as
    // missed, where no replica's series shows them.
    let text = metrics(&gw).await;
    let unserved = |reason| {
        metric(
            &text,
            "sluice_gateway_model_unserved_total",
            &[("model", "m"), ("reason", reason)],
        )
    };
    assert_eq!(
        metric(
            &text,
            "sluice_gateway_model_arrivals_total",
            &[("model", "m")]
        ),
        3.0
    );
    assert_eq!(
        (unserved("queue_full"), unserved("unavailable")),
        (1.0, 2.0)
    );
    let ttft = "sluice_gateway_model_time_to_first_token_seconds_count";
    assert_eq!(metric(&text, ttft, &[("model", "m")]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_passes_in_the_queue_is_504_deadline_exceeded() {
    let gw = gateway(
        quick_config(),
        vec![Source::Models(vec!["m".into()])],
        HttpLimits {
            request_timeout: Some(Duration::from_millis(300)),
            ..HttpLimits::default()
        },
    )
    .await;
    let a = post(
        &base(&gw),
        "/v1/chat/completions",
        chat("m", "x", false),
        &[],
    )
    .await;
    assert_eq!(a.status, 504, "{a:?}");
    let e = &a.json()["error"];
    assert_eq!(e["code"], "deadline_exceeded");
    assert_eq!(e["type"], "timeout_error");
    assert_eq!(
        e["message"],
        "The request's deadline passed in the queue stage"
    );
    let text = metrics(&gw).await;
    assert_eq!(
        metric(
            &text,
            "sluice_gateway_deadline_exceeded_total",
            &[("stage", "queue")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_requests_leave_the_queue_first() {
    let (fake, url) = capped(1, 100).await;
    let gw = gateway(
        quick_config(),
        vec![Source::Static(vec![url])],
        HttpLimits::default(),
    )
    .await;
    let router = gw.router.clone();
    eventually(Duration::from_secs(5), "the replica is ready", || {
        router.ready_for("m", std::time::Instant::now())
    })
    .await;
    // One runs, one is the head; then a low and a high priority request queue behind.
    let mut first = burst(&gw, 2);
    let r = gw.router.clone();
    eventually(Duration::from_secs(5), "two are in", || {
        r.queue("m").depth() == 1
    })
    .await;
    let send = |priority: i32| {
        let b = base(&gw);
        tokio::spawn(async move {
            let body = serde_json::json!({"model": "m", "max_tokens": 1, "priority": priority,
                "messages": [{"role": "user", "content": format!("p{priority}")}]});
            post(&b, "/v1/chat/completions", body.to_string(), &[]).await;
            tokio::time::Instant::now()
        })
    };
    let low = send(-1);
    eventually(Duration::from_secs(5), "the low one waits", || {
        r.queue("m").depth() == 2
    })
    .await;
    let high = send(5);
    let (low, high) = (low.await.unwrap(), high.await.unwrap());
    assert!(
        high < low,
        "the high-priority request finished after the low one"
    );
    for f in first.drain(..) {
        assert_eq!(f.await.unwrap().status, 200);
    }
    assert_eq!(fake.served(), 4);
    let body = fake.last_body.lock().unwrap().clone().unwrap();
    assert!(String::from_utf8_lossy(&body).contains("p-1"));
}
