//! The routing gateway in this process in front of fake replicas (`common::fake_upstream`)
//! that answer at once and misbehave on request: proxying JSON and SSE, model aggregation,
//! validation before routing, retries before the first byte, SSE error events after it,
//! health checks, session and prefix affinity, replicas without metrics, file discovery.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fake_upstream::{self, Fake};
use common::routing::*;
use sluice_gateway::api::HttpLimits;
use sluice_gateway::discovery::Source;
use sluice_gateway::router::policy::Policy;
use sluice_gateway::router::remote::ReplicaUrl;
use sluice_gateway::router::RouterConfig;

struct Fakes {
    fakes: Vec<std::sync::Arc<Fake>>,
    urls: Vec<ReplicaUrl>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn start_fakes(n: usize, model: &str) -> Fakes {
    let mut f = Fakes {
        fakes: Vec::new(),
        urls: Vec::new(),
        tasks: Vec::new(),
    };
    for _ in 0..n {
        let fake = Fake::new(model);
        let (addr, task) = fake_upstream::serve(fake.clone(), 0).await;
        f.fakes.push(fake);
        f.urls.push(ReplicaUrl::from_addr(addr));
        f.tasks.push(task);
    }
    f
}

async fn fakes(n: usize, model: &str) -> (Vec<std::sync::Arc<Fake>>, Vec<ReplicaUrl>) {
    let f = start_fakes(n, model).await;
    // The servers run until the runtime ends.
    std::mem::forget(f.tasks);
    (f.fakes, f.urls)
}

async fn ready(gw: &Gateway, n: usize) {
    let router = gw.router.clone();
    eventually(Duration::from_secs(5), "replicas become eligible", || {
        let now = std::time::Instant::now();
        router
            .replicas()
            .values()
            .filter(|r| r.eligible(now))
            .count()
            == n
    })
    .await;
}

fn base(gw: &Gateway) -> String {
    format!("http://{}", gw.addr)
}

/// A gateway routing to `urls` (`quick_config`) once all of them are eligible, and its base URL.
async fn routing_to(urls: Vec<ReplicaUrl>) -> (Gateway, String) {
    let gw = routing_with(quick_config(), &urls).await;
    let b = base(&gw);
    (gw, b)
}

/// A gateway routing to `urls` with `cfg`, once every replica is eligible.
async fn routing_with(cfg: RouterConfig, urls: &[ReplicaUrl]) -> Gateway {
    let gw = gateway(
        cfg,
        vec![Source::Static(urls.to_vec())],
        HttpLimits::default(),
    )
    .await;
    ready(&gw, urls.len()).await;
    gw
}

/// A model's seconds and tokens in `sluice_gateway_prompt_tokens_per_second`, read from the
/// gateway's `/metrics` once the seconds so far are over.
async fn prompt_sums(b: &str, model: &str) -> (f64, f64) {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let m = get(b, "/metrics").await.body.unwrap();
    let bursts = "sluice_gateway_prompt_tokens_per_second";
    (
        metric(&m, &format!("{bursts}_count"), &[("model", model)]),
        metric(&m, &format!("{bursts}_sum"), &[("model", model)]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_json_and_sse_and_aggregates_models() {
    let (a, urls_a) = fakes(1, "alpha").await;
    let (_b, urls_b) = fakes(1, "beta").await;
    let urls: Vec<ReplicaUrl> = urls_a.iter().chain(&urls_b).cloned().collect();
    let (_gw, b) = routing_to(urls).await;

    let models = get(&b, "/v1/models").await.json();
    let ids: BTreeSet<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, BTreeSet::from(["alpha", "beta"]));
    assert_eq!(get(&b, "/v1/models/beta").await.status, 200);
    assert_eq!(get(&b, "/ready").await.status, 200);

    let r = post(&b, "/v1/chat/completions", chat("alpha", "hi", false), &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["choices"][0]["message"]["content"], "hi");
    assert_eq!(r.replica().as_deref(), Some(urls_a[0].as_str()));
    // The body reaches the replica as the client sent it.
    let sent = a[0].last_body.lock().unwrap().clone().unwrap();
    assert_eq!(sent, chat("alpha", "hi", false));

    let r = post(&b, "/v1/chat/completions", chat("beta", "hi", true), &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(r.replica().as_deref(), Some(urls_b[0].as_str()));
    let body = r.body.unwrap();
    assert_eq!(body.matches("data: ").count(), 3, "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");

    // Unknown models and invalid requests are answered by the gateway, in OpenAI's shape.
    let served = a[0].served();
    let r = post(&b, "/v1/chat/completions", chat("gamma", "hi", false), &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let bad =
        r#"{"model": "alpha", "temperature": 9, "messages": [{"role": "user", "content": "x"}]}"#;
    let r = post(&b, "/v1/chat/completions", bad.into(), &[]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "temperature");
    let r = post(
        &b,
        "/v1/completions",
        r#"{"model": "alpha", "prompt": [[]]}"#.into(),
        &[],
    )
    .await;
    assert_eq!(r.status, 400);
    let r = post(&b, "/v1/chat/completions", "{oops".into(), &[]).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        a[0].served(),
        served,
        "refused requests never reach a replica"
    );

    let m = get(&b, "/metrics").await.body.unwrap();
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_upstream_requests_total",
            &[("replica", urls_a[0].as_str()), ("status", "200")]
        ),
        1.0
    );
    assert!(
        metric(
            &m,
            "sluice_gateway_routing_decisions_total",
            &[("policy", "prefix-affinity")]
        ) >= 2.0
    );

    // Each second's prompt tokens per served model (a proxied request's bytes / 4), observed
    // once the second is over; no series for a model no replica serves.
    for model in ["alpha", "beta"] {
        let (seconds, tokens) = prompt_sums(&b, model).await;
        assert!(
            seconds >= 1.0 && tokens > 0.0,
            "{model}: {seconds} s, {tokens}"
        );
    }
    let m = get(&b, "/metrics").await.body.unwrap();
    assert!(!m.contains("model=\"gamma\""), "{m}");
}

/// Replicas started with `--max-prompt-tokens` list their bound on `/v1/models`; the gateway
/// lists the largest while every replica of the model has one, and leaves a prompt estimated
/// past it (bytes / 4) out of its per-second prompt sums: the replicas refuse it, so it is no
/// prefill for the autoscaler to size a fleet for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_past_every_replicas_bound_stay_out_of_the_prompt_sums() {
    let (fs, urls) = fakes(2, "m").await;
    fs[0].max_prompt_tokens.store(100, Ordering::SeqCst);
    fs[1].max_prompt_tokens.store(200, Ordering::SeqCst);
    let (_gw, b) = routing_to(urls).await;
    assert_eq!(
        get(&b, "/v1/models/m").await.json()["max_prompt_tokens"],
        200
    );
    // ~500 tokens by the estimate: past both bounds, refused as the replica refuses it.
    let long = "word ".repeat(400);
    let r = post(&b, "/v1/chat/completions", chat("m", &long, false), &[]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        r.json()["error"]["code"],
        "context_length_exceeded",
        "{r:?}"
    );
    assert_eq!(prompt_sums(&b, "m").await, (0.0, 0.0));
    let r = post(&b, "/v1/chat/completions", chat("m", "hi", false), &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    let (seconds, tokens) = prompt_sums(&b, "m").await;
    assert!(
        seconds == 1.0 && tokens > 0.0 && tokens < 100.0,
        "{seconds} s, {tokens}"
    );
}

/// A mixed pool: one replica bounds prompts at 100 tokens (a slow GPU), the other at 1,000.
/// A prompt past the first's bound by the gateway's estimate goes to the second however
/// loaded it is; one the estimate puts within it but the replica counts past it (the fake
/// counts a token per byte) is refused there and retried on the second before any byte
/// reached the client; one past both bounds is refused by the second alone, its 400 passed
/// on and its estimated tokens observed in `sluice_gateway_model_refused_prompt_tokens`.
/// Short prompts still go to the least loaded replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_go_to_the_replicas_whose_bound_takes_them() {
    let (fs, urls) = fakes(2, "m").await;
    fs[0].max_prompt_tokens.store(100, Ordering::SeqCst);
    fs[1].max_prompt_tokens.store(1_000, Ordering::SeqCst);
    // The second looks busy: least-load sends it nothing it need not.
    fs[1].running.store(50, Ordering::SeqCst);
    let cfg = RouterConfig {
        policy: Policy::LeastLoad,
        ..quick_config()
    };
    let gw = routing_with(cfg, &urls).await;
    let router = gw.router.clone();
    eventually(Duration::from_secs(5), "bounds and loads are read", || {
        let now = std::time::Instant::now();
        let replicas = router.replicas();
        router.prompt_bound("m") == Some(1_000)
            && replicas[&urls[1]].score(now, Duration::from_secs(1)) >= 50.0
            && replicas[&urls[0]].longest_prompt("m") == 100
    })
    .await;
    let b = base(&gw);
    let send = |content: String| {
        let b = b.clone();
        async move { post(&b, "/v1/chat/completions", chat("m", &content, false), &[]).await }
    };
    let upstream = |m: &str, i: usize, status: &str| {
        metric(
            m,
            "sluice_gateway_upstream_requests_total",
            &[("replica", urls[i].as_str()), ("status", status)],
        )
    };

    let short = send("hi".into()).await;
    assert_eq!(short.status, 200, "{short:?}");
    assert_eq!(short.replica().as_deref(), Some(urls[0].as_str()));

    // ~150 tokens by the estimate: only the second takes it.
    let long = send("word ".repeat(120)).await;
    assert_eq!(long.status, 200, "{long:?}");
    assert_eq!(long.replica().as_deref(), Some(urls[1].as_str()));
    assert_eq!(fs[0].served(), 1);

    // ~40 tokens by the estimate, ~230 by the replica's count: refused by the first, retried.
    let under = send("word ".repeat(32)).await;
    assert_eq!(under.status, 200, "{under:?}");
    assert_eq!(under.replica().as_deref(), Some(urls[1].as_str()));
    assert_eq!(fs[0].served(), 2);
    let m = get(&b, "/metrics").await.body.unwrap();
    assert_eq!(upstream(&m, 0, "400"), 1.0, "{m}");
    assert_eq!(upstream(&m, 1, "200"), 2.0, "{m}");
    let refused = |m: &str, part: &str| {
        metric(
            m,
            &format!("sluice_gateway_model_refused_prompt_tokens_{part}"),
            &[("model", "m")],
        )
    };
    // A refusal retried elsewhere is no refused prompt.
    assert_eq!(refused(&m, "count"), 0.0, "{m}");

    // Past both: the second refuses it, and the client reads its refusal.
    let past = send("word ".repeat(1_000)).await;
    assert_eq!(past.status, 400, "{past:?}");
    assert_eq!(past.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(fs[0].served(), 2);
    let m = get(&b, "/metrics").await.body.unwrap();
    assert_eq!(upstream(&m, 1, "400"), 1.0, "{m}");
    // Counted once, at the gateway's estimate: ~1,250 tokens (bytes / 4), past the 1,000.
    assert_eq!(refused(&m, "count"), 1.0, "{m}");
    let sum = refused(&m, "sum");
    assert!((1_001.0..1_400.0).contains(&sum), "{sum}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_dead_replicas_are_retried_before_the_first_byte() {
    let Fakes {
        fakes: fs,
        urls,
        tasks,
    } = start_fakes(3, "m").await;
    fs[0].refuse_next.store(1, Ordering::SeqCst);
    *fs[1].refuse_status.lock().unwrap() = 429;
    fs[1].refuse_next.store(1, Ordering::SeqCst);
    let cfg = RouterConfig {
        policy: Policy::RoundRobin,
        // One check at start, then none: only passive ejection notices the death below.
        health_interval: Duration::from_secs(3600),
        max_attempts: 4,
        // Eject on the first failure, so the three misbehaving replicas cost one attempt each.
        ejection: sluice_gateway::router::health::EjectionPolicy {
            eject_after: 1,
            ..Default::default()
        },
        ..quick_config()
    };
    let gw = routing_with(cfg, &urls).await;
    // The third replica dies: its connects fail from now on.
    tasks[2].abort();
    let b = base(&gw);
    for i in 0..10 {
        let r = post(
            &b,
            "/v1/chat/completions",
            chat("m", &format!("q{i}"), i % 2 == 0),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert!(r.body.is_ok());
    }
    let m = get(&b, "/metrics").await.body.unwrap();
    let at = |u: &ReplicaUrl, s: &str| {
        metric(
            &m,
            "sluice_gateway_upstream_requests_total",
            &[("replica", u.as_str()), ("status", s)],
        )
    };
    assert_eq!(at(&urls[0], "503"), 1.0, "{m}");
    assert_eq!(at(&urls[1], "429"), 1.0, "{m}");
    assert!(
        metric(&m, "sluice_gateway_upstream_retries_total", &[]) >= 3.0,
        "{m}"
    );
    // The 503 ejected the first replica; a 429 ejects nobody.
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_replica_ejections_total",
            &[("replica", urls[0].as_str())]
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_replica_ejections_total",
            &[("replica", urls[1].as_str())]
        ),
        0.0
    );
    // The dead one failed to connect and was ejected.
    assert_eq!(at(&urls[2], "connect_error"), 1.0, "{m}");
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_replica_ejections_total",
            &[("replica", urls[2].as_str())]
        ),
        1.0
    );

    // Every replica refusing: the client gets the last refusal, not a hang.
    for f in &fs {
        *f.refuse_status.lock().unwrap() = 503;
        f.refuse_next.store(100, Ordering::SeqCst);
    }
    let r = post(&b, "/v1/chat/completions", chat("m", "x", false), &[]).await;
    assert!(r.status == 503 || r.status == 502, "{r:?}");
    assert!(r.json()["error"]["message"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_broken_after_the_first_byte_ends_with_an_sse_error_event() {
    let (fs, urls) = fakes(1, "m").await;
    fs[0].break_streams.store(true, Ordering::SeqCst);
    let gw = routing_with(quick_config(), &urls).await;
    let r = post(
        &base(&gw),
        "/v1/chat/completions",
        chat("m", "x", true),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let body = r.body.unwrap();
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 3, "{body}");
    assert!(events[0].contains("\"content\":\"hi\""));
    let err: serde_json::Value =
        serde_json::from_str(events[1].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(err["error"]["type"], "upstream_error", "{err}");
    assert_eq!(events[2], "data: [DONE]");
    let m = get(&base(&gw), "/metrics").await.body.unwrap();
    assert_eq!(
        metric(&m, "sluice_gateway_upstream_broken_streams_total", &[]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_health_checks_take_a_replica_out_until_it_recovers() {
    let (fs, urls) = fakes(2, "m").await;
    let gw = gateway(
        RouterConfig {
            policy: Policy::RoundRobin,
            ..quick_config()
        },
        vec![Source::Static(urls.clone())],
        HttpLimits::default(),
    )
    .await;
    ready(&gw, 2).await;
    fs[0].healthy.store(false, Ordering::SeqCst);
    let router = gw.router.clone();
    let first = urls[0].clone();
    eventually(
        Duration::from_secs(5),
        "the unhealthy replica is out",
        || !router.replicas()[&first].eligible(std::time::Instant::now()),
    )
    .await;
    let before = fs[0].served();
    for i in 0..6 {
        let r = post(
            &base(&gw),
            "/v1/chat/completions",
            chat("m", &format!("{i}"), false),
            &[],
        )
        .await;
        assert_eq!(r.replica().as_deref(), Some(urls[1].as_str()));
    }
    assert_eq!(fs[0].served(), before);
    fs[0].healthy.store(true, Ordering::SeqCst);
    ready(&gw, 2).await;
    let mut seen = BTreeSet::new();
    for i in 0..4 {
        let r = post(
            &base(&gw),
            "/v1/chat/completions",
            chat("m", &format!("{i}"), false),
            &[],
        )
        .await;
        seen.insert(r.replica().unwrap());
    }
    assert_eq!(seen.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_prefixes_stick_to_a_replica() {
    let (_fs, urls) = fakes(3, "m").await;
    let gw = routing_with(quick_config(), &urls).await;
    let b = base(&gw);
    let mut by_prefix: HashMap<usize, BTreeSet<String>> = HashMap::new();
    for p in 0..12 {
        let system = format!(
            "You are assistant number {p}. {}",
            "Be precise. ".repeat(60)
        );
        for q in 0..3 {
            let body = serde_json::json!({"model": "m", "max_tokens": 2, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("question {q}")}]})
            .to_string();
            let r = post(&b, "/v1/chat/completions", body, &[]).await;
            by_prefix.entry(p).or_default().insert(r.replica().unwrap());
        }
    }
    assert!(by_prefix.values().all(|s| s.len() == 1), "{by_prefix:?}");
    let used: BTreeSet<&String> = by_prefix.values().flatten().collect();
    assert!(
        used.len() >= 2,
        "twelve prefixes all on one replica: {by_prefix:?}"
    );
    // A session id wins over the prompt.
    let mut seen = BTreeSet::new();
    for q in 0..8 {
        let r = post(
            &b,
            "/v1/chat/completions",
            chat("m", &format!("unrelated {q}"), false),
            &[("x-session-id", "user-42")],
        )
        .await;
        seen.insert(r.replica().unwrap());
    }
    assert_eq!(seen.len(), 1);
    let m = get(&b, "/metrics").await.body.unwrap();
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_routing_decisions_total",
            &[("reason", "session_hit")]
        ),
        8.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_routing_decisions_total",
            &[("reason", "affinity_hit")]
        ),
        36.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_load_reads_replica_metrics_and_copes_without_them() {
    let (fs, urls) = fakes(2, "m").await;
    let gw = gateway(
        RouterConfig {
            policy: Policy::LeastLoad,
            ..quick_config()
        },
        vec![Source::Static(urls.clone())],
        HttpLimits::default(),
    )
    .await;
    ready(&gw, 2).await;
    // Replica 0 reports a deep queue (other gateways' load): everything goes to replica 1.
    fs[0].waiting.store(20, Ordering::SeqCst);
    fs[0].running.store(8, Ordering::SeqCst);
    let b = base(&gw);
    eventually(Duration::from_secs(5), "the poll sees the queue", || {
        let r = gw.router.replicas();
        r[&urls[0]].score(std::time::Instant::now(), Duration::from_secs(1)) > 40.0
    })
    .await;
    for i in 0..10 {
        let r = post(
            &b,
            "/v1/chat/completions",
            chat("m", &format!("{i}"), false),
            &[],
        )
        .await;
        assert_eq!(r.replica().as_deref(), Some(urls[1].as_str()));
    }
    let m = get(&b, "/metrics").await.body.unwrap();
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_replica_load",
            &[("replica", urls[0].as_str()), ("signal", "waiting")]
        ),
        20.0
    );
    // Without vLLM series both are scored by in-flight alone, and both serve.
    for f in &fs {
        f.no_metrics.store(true, Ordering::SeqCst);
    }
    eventually(Duration::from_secs(5), "the poll sees no series", || {
        let r = gw.router.replicas();
        r[&urls[0]].score(std::time::Instant::now(), Duration::from_secs(1)) == 0.0
    })
    .await;
    let mut seen = BTreeSet::new();
    for i in 0..20 {
        let r = post(
            &b,
            "/v1/chat/completions",
            chat("m", &format!("{i}"), false),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
        seen.insert(r.replica().unwrap());
    }
    assert_eq!(seen.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_discovery_follows_the_file() {
    let (_fs, urls) = fakes(2, "m").await;
    let path = std::env::temp_dir().join(format!(
        "sluice-replicas-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::write(&path, format!("[\"{}\"]", urls[0])).unwrap();
    let gw = gateway(
        quick_config(),
        vec![Source::File(path.clone())],
        HttpLimits::default(),
    )
    .await;
    ready(&gw, 1).await;
    let b = base(&gw);
    let r = post(&b, "/v1/chat/completions", chat("m", "x", false), &[]).await;
    assert_eq!(r.replica().as_deref(), Some(urls[0].as_str()));
    // Swap the list (a line list this time; a different length so the change is seen).
    std::fs::write(&path, format!("# now\n{}\n", urls[1])).unwrap();
    let router = gw.router.clone();
    let second = urls[1].clone();
    eventually(
        Duration::from_secs(5),
        "the file's new replica replaces the old",
        || {
            let r = router.replicas();
            r.len() == 1 && r.contains_key(&second)
        },
    )
    .await;
    ready(&gw, 1).await;
    for _ in 0..3 {
        let r = post(&b, "/v1/chat/completions", chat("m", "x", false), &[]).await;
        assert_eq!(r.replica().as_deref(), Some(urls[1].as_str()));
    }
    // A broken file keeps the last good set.
    std::fs::write(&path, "not a url at all, and longer than before").unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(gw.router.replicas().contains_key(&urls[1]));
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_replica_means_503_and_not_ready() {
    let gw = gateway(
        quick_config(),
        vec![Source::Static(vec![])],
        HttpLimits::default(),
    )
    .await;
    let b = base(&gw);
    assert_eq!(get(&b, "/ready").await.status, 503);
    let r = post(&b, "/v1/chat/completions", chat("m", "x", false), &[]).await;
    assert_eq!(r.status, 404, "no replica serves any model yet");
    assert_eq!(r.json()["error"]["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_at_its_cap_is_not_sent_more() {
    let (fs, urls) = fakes(1, "m").await;
    fs[0].delay_ms.store(400, Ordering::SeqCst);
    let gw = gateway(
        RouterConfig {
            replica_max_in_flight: 1,
            ..quick_config()
        },
        vec![Source::Static(urls)],
        HttpLimits::default(),
    )
    .await;
    ready(&gw, 1).await;
    let b = base(&gw);
    let first = {
        let b = b.clone();
        tokio::spawn(
            async move { post(&b, "/v1/chat/completions", chat("m", "a", false), &[]).await },
        )
    };
    let router = gw.router.clone();
    eventually(
        Duration::from_secs(5),
        "the first request is in flight",
        || router.replicas().values().all(|r| r.in_flight() == 1),
    )
    .await;
    let r = post(&b, "/v1/chat/completions", chat("m", "b", false), &[]).await;
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.json()["error"]["code"], "replicas_at_capacity");
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(fs[0].served(), 1);
    // Its in-flight count is back to zero once the answer has been passed on.
    eventually(Duration::from_secs(5), "the count drops", || {
        router.replicas().values().all(|r| r.in_flight() == 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_discovery_routes_to_what_the_name_resolves_to() {
    let (fs, urls) = fakes(1, "m").await;
    let port: u16 = urls[0]
        .as_str()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // `localhost` resolves to 127.0.0.1 (and perhaps ::1, where nothing listens: that one never
    // passes a health check and is never picked).
    let gw = gateway(
        quick_config(),
        vec![Source::Dns {
            host: "localhost".into(),
            port,
        }],
        HttpLimits::default(),
    )
    .await;
    ready(&gw, 1).await;
    assert!(gw.router.replicas().contains_key(&urls[0]));
    for i in 0..3 {
        let r = post(
            &base(&gw),
            "/v1/chat/completions",
            chat("m", &format!("{i}"), true),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.replica().as_deref(), Some(urls[0].as_str()));
    }
    assert_eq!(fs[0].served(), 3);
}
