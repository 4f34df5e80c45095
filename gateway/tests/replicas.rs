//! Real processes on loopback: three `sluice serve --model` replicas (the real model, small KV
//! pools, one compute thread each) and a routing `sluice serve --upstream ...` gateway in
//! front. The tests run one at a time (they share two cores) and bound every wait.
//!
//! - A replica SIGKILLed under load: every request completes or gets a clear error, the
//!   gateway stops sending to it once it has noticed, and uses it again within 2 s of its
//!   restart being ready.
//! - least-load keeps every replica busy: no replica queues two requests while another idles.
//! - prefix-affinity against round-robin on a shared-prefix workload: a far higher prefix-cache
//!   hit rate on the replicas (`vllm:prefix_cache_hits_total / _queries_total`), every
//!   replica still serving.
//! - A pool at zero: the model, announced with no replica in the discovery file, is listed;
//!   a request for it is held until a replica is started and announced, then answered there.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::processes::{model_dir, spawn, wait_ready, Proc};
use common::routing::{get, metric, post, send};
use common::MODEL;
use sluice_gateway::router::affinity;
use sluice_gateway::router::remote::ReplicaUrl;

/// The tests here each start four processes; one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A replica on `port` (0: any); `extra` may override the small KV pool (`--kv-cache-mib`).
fn replica(port: u16, extra: &[&str]) -> Proc {
    let kv = if extra.contains(&"--kv-cache-mib") {
        &[][..]
    } else {
        &["--kv-cache-mib", "48"][..]
    };
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--model",
        MODEL,
        "--model-dir",
        model_dir().to_str().unwrap(),
        "--threads",
        "1",
        "--max-model-len",
        "1024",
    ]
    .iter()
    .chain(kv)
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn(&args)
}

fn gateway(replicas: &[&Proc], extra: &[&str]) -> Proc {
    let mut args: Vec<String> = vec!["--port".into(), "0".into()];
    for r in replicas {
        args.push("--upstream".into());
        args.push(r.url.clone());
    }
    // Polls on a busy two-core machine can take a while: a generous staleness bound.
    for a in [
        "--stale-after",
        "3s",
        "--poll-interval",
        "100ms",
        "--health-interval",
        "100ms",
        "--health-path",
        "/ready",
    ] {
        args.push(a.into());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn(&args)
}

/// Starts three replicas and waits for them.
async fn fleet(extra: &[&str]) -> Vec<Proc> {
    let rs: Vec<Proc> = (0..3).map(|_| replica(0, extra)).collect();
    for r in &rs {
        wait_ready(&r.url, Duration::from_secs(120)).await;
    }
    rs
}

/// Sum of a series over a replica's label sets.
async fn replica_metric(url: &str, name: &str) -> f64 {
    metric(&get(url, "/metrics").await.body.unwrap(), name, &[])
}

fn completion(prompt: &str, max_tokens: usize, stream: bool) -> String {
    serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": true, "stream": stream})
    .to_string()
}

/// What became of one request under failure.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Complete,
    ClearError,
}

/// A request's outcome; panics on anything that is neither a full answer nor a clear error.
fn judge(a: &Result<common::routing::Answer, String>, stream: bool, max_tokens: usize) -> Outcome {
    let a = match a {
        Ok(a) => a,
        Err(e) => panic!("the gateway dropped a request: {e}"),
    };
    let body = match &a.body {
        Ok(b) => b,
        Err(e) => panic!(
            "an answer was cut without an error (status {}): {e}",
            a.status
        ),
    };
    if a.status != 200 {
        let v: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|_| panic!("status {} without an error body: {body}", a.status));
        assert!(v["error"]["message"].is_string(), "{body}");
        return Outcome::ClearError;
    }
    if !stream {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], max_tokens, "{body}");
        return Outcome::Complete;
    }
    assert!(
        body.ends_with("data: [DONE]\n\n"),
        "a stream without [DONE]: {body}"
    );
    if body.contains("\"error\"") {
        let event = body
            .split("\n\n")
            .find(|e| e.contains("\"error\""))
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(event.strip_prefix("data: ").unwrap()).unwrap();
        assert!(v["error"]["message"].is_string(), "{event}");
        return Outcome::ClearError;
    }
    Outcome::Complete
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_replica_is_routed_around_and_used_again_after_restart() {
    let _serial = SERIAL.lock().await;
    let mut rs = fleet(&["--max-num-seqs", "4"]).await;
    let gw = gateway(&rs.iter().collect::<Vec<_>>(), &["--policy", "least-load"]);
    wait_ready(&gw.url, Duration::from_secs(30)).await;
    let gw_url = gw.url.clone();

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let served_by = Arc::new(Mutex::new(Vec::<(Instant, String)>::new()));
    let mut workers = Vec::new();
    for w in 0..6 {
        let (stop, outcomes, served_by, url) = (
            stop.clone(),
            outcomes.clone(),
            served_by.clone(),
            gw_url.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let stream = (w + i) % 2 == 0;
                let a = send(
                    &url,
                    "POST",
                    "/v1/completions",
                    Some(completion(&format!("Story {w}-{i}:"), 12, stream)),
                    &[],
                )
                .await;
                let o = judge(&a, stream, 12);
                if let Ok(a) = &a {
                    if let Some(r) = a.replica() {
                        served_by.lock().unwrap().push((Instant::now(), r));
                    }
                }
                outcomes.lock().unwrap().push(o);
                i += 1;
            }
        }));
    }
    // Load on all three, then SIGKILL one.
    let deadline = Instant::now() + Duration::from_secs(60);
    while outcomes.lock().unwrap().len() < 12 {
        assert!(Instant::now() < deadline, "no progress under load");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = rs[1].url.clone();
    let port: u16 = victim.rsplit(':').next().unwrap().parse().unwrap();
    rs[1].child.kill().unwrap();
    let _ = rs[1].child.wait();

    // The gateway notices (health check or ejection).
    let eligible = |m: &str| {
        metric(
            m,
            "sluice_gateway_replica_eligible",
            &[("replica", &victim)],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = get(&gw_url, "/metrics").await.body.unwrap();
        if eligible(&m) == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway never noticed the dead replica"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Attempts already under way when it noticed have failed by now (loopback refuses at once).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let attempts = |m: &str| {
        metric(
            m,
            "sluice_gateway_upstream_requests_total",
            &[("replica", &victim)],
        )
    };
    let before = attempts(&get(&gw_url, "/metrics").await.body.unwrap());
    let done_before = outcomes.lock().unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(60);
    while outcomes.lock().unwrap().len() < done_before + 12 {
        assert!(Instant::now() < deadline, "no progress after the kill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = get(&gw_url, "/metrics").await.body.unwrap();
    assert_eq!(
        attempts(&m),
        before,
        "requests went to the dead replica after it was noticed"
    );

    // Restart it on the same port; once it is ready the gateway uses it within 2 s.
    rs[1] = replica(port, &["--max-num-seqs", "4"]);
    wait_ready(&rs[1].url, Duration::from_secs(120)).await;
    let ready_at = Instant::now();
    // Besides the workers' closed loops, a short request every 100 ms, so that picks keep
    // happening while the workers wait on long answers.
    let back = loop {
        let used = served_by
            .lock()
            .unwrap()
            .iter()
            .any(|(t, r)| *t >= ready_at && *r == victim);
        if used {
            break ready_at.elapsed();
        }
        assert!(
            ready_at.elapsed() < Duration::from_secs(2),
            "the restarted replica was not used within 2 s"
        );
        let (url, served_by) = (gw_url.clone(), served_by.clone());
        tokio::spawn(async move {
            let a = post(&url, "/v1/completions", completion("Probe:", 1, false), &[]).await;
            if let Some(r) = a.replica() {
                served_by.lock().unwrap().push((Instant::now(), r));
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let outcomes = outcomes.lock().unwrap().clone();
    let complete = outcomes.iter().filter(|o| **o == Outcome::Complete).count();
    assert!(complete >= 24, "{outcomes:?}");
    eprintln!(
        "{} requests: {complete} complete, {} clear errors; restarted replica used after {back:?}",
        outcomes.len(),
        outcomes.len() - complete
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn least_load_keeps_every_replica_busy() {
    let _serial = SERIAL.lock().await;
    let rs = fleet(&["--max-num-seqs", "2", "--max-num-batched-tokens", "64"]).await;
    let gw = gateway(&rs.iter().collect::<Vec<_>>(), &["--policy", "least-load"]);
    wait_ready(&gw.url, Duration::from_secs(30)).await;
    let urls: Vec<String> = rs.iter().map(|r| r.url.clone()).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, urls) = (stop.clone(), urls.clone());
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let mut s = Vec::new();
                for u in &urls {
                    let m = get(u, "/metrics").await.body.unwrap();
                    s.push((
                        metric(&m, "vllm:num_requests_waiting", &[]),
                        metric(&m, "vllm:num_requests_running", &[]),
                    ));
                }
                samples.push(s);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            samples
        })
    };
    // Nine closed-loop clients against six sequence slots: a queue of one per replica when
    // the load is even. They keep going until the sampler has stopped, so the samples never
    // include the tail of the run, where clients finishing leave replicas idle by design.
    let working = Arc::new(AtomicBool::new(true));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..9 {
        let (url, working, done) = (gw.url.clone(), working.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut by = Vec::new();
            let mut i = 0;
            while working.load(Ordering::Relaxed) {
                let a = post(
                    &url,
                    "/v1/completions",
                    completion(&format!("Tale {w}-{i}:"), 16, false),
                    &[],
                )
                .await;
                assert_eq!(a.status, 200, "{a:?}");
                by.push(a.replica().unwrap());
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            by
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.load(Ordering::Relaxed) < 27 {
        assert!(Instant::now() < deadline, "no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    working.store(false, Ordering::Relaxed);
    let mut per_replica: BTreeMap<String, usize> = BTreeMap::new();
    for w in workers {
        for r in w.await.unwrap() {
            *per_replica.entry(r).or_default() += 1;
        }
    }
    // A replica's figures are read one after another, not at one instant, and a request can
    // sit in an engine's intake for a step before it counts as running: a state counts only
    // when two consecutive samples show it (the same replica idle, some replica two deep).
    let idle_while_queued = |s: &[(f64, f64)]| -> Vec<usize> {
        if !s.iter().any(|&(w, _)| w >= 2.0) {
            return Vec::new();
        }
        (0..s.len()).filter(|&i| s[i] == (0.0, 0.0)).collect()
    };
    let bad: Vec<&[Vec<(f64, f64)>]> = samples
        .windows(2)
        .filter(|w| {
            let a = idle_while_queued(&w[0]);
            idle_while_queued(&w[1]).iter().any(|i| a.contains(i))
        })
        .collect();
    assert!(samples.len() >= 5, "too few samples: {}", samples.len());
    assert!(
        bad.is_empty(),
        "a queue grew while a replica idled: {bad:?} of {} samples",
        samples.len()
    );
    assert_eq!(per_replica.len(), 3, "{per_replica:?}");
    assert!(per_replica.values().all(|&n| n >= 4), "{per_replica:?}");
}

/// A system prompt of about 400 tokens, distinct from the first word on.
fn system_prompt(tag: &str) -> String {
    let words = [
        "river", "stone", "market", "lantern", "garden", "window", "silver", "harbor", "meadow",
        "castle", "forest", "candle", "bridge", "valley", "winter", "summer",
    ];
    let mut s = format!("{tag}. You answer questions about the following notes.");
    for i in 0..380 {
        s.push(' ');
        s.push_str(words[(i * 7 + tag.len()) % words.len()]);
    }
    s
}

fn chat_body(system: &str, question: &str) -> String {
    serde_json::json!({"model": MODEL, "max_tokens": 2, "temperature": 0, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]})
    .to_string()
}

/// Sends `prefixes × 3` requests, question-major (each round visits every prefix), three at a
/// time; returns the replicas' prefix-cache hit rate over the run and who served each prefix.
async fn shared_prefix_run(
    gw: &str,
    replicas: &[String],
    prefixes: &[String],
) -> (f64, BTreeMap<usize, BTreeSet<String>>) {
    let hits = |u: String| async move { replica_metric(&u, "vllm:prefix_cache_hits_total").await };
    let queries =
        |u: String| async move { replica_metric(&u, "vllm:prefix_cache_queries_total").await };
    let (mut h0, mut q0) = (0.0, 0.0);
    for r in replicas {
        h0 += hits(r.clone()).await;
        q0 += queries(r.clone()).await;
    }
    let jobs: Vec<(usize, String)> = (0..3)
        .flat_map(|q| {
            prefixes
                .iter()
                .enumerate()
                .map(move |(p, s)| (p, chat_body(s, &format!("Question {q} about note {p}?"))))
        })
        .collect();
    let jobs = Arc::new(Mutex::new(jobs.into_iter()));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (jobs, gw) = (jobs.clone(), gw.to_string());
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let Some((p, body)) = jobs.lock().unwrap().next() else {
                    return out;
                };
                let a = post(&gw, "/v1/chat/completions", body, &[]).await;
                assert_eq!(a.status, 200, "{a:?}");
                out.push((p, a.replica().unwrap()));
            }
        }));
    }
    let mut by_prefix: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for w in workers {
        for (p, r) in w.await.unwrap() {
            by_prefix.entry(p).or_default().insert(r);
        }
    }
    let (mut h1, mut q1) = (0.0, 0.0);
    for r in replicas {
        h1 += hits(r.clone()).await;
        q1 += queries(r.clone()).await;
    }
    ((h1 - h0) / (q1 - q0).max(1.0), by_prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prefix_affinity_hits_the_prefix_cache_far_more_than_round_robin() {
    let _serial = SERIAL.lock().await;
    let rs = fleet(&["--kv-cache-mib", "160"]).await;
    let urls: Vec<String> = rs.iter().map(|r| r.url.clone()).collect();
    let replica_urls: Vec<ReplicaUrl> =
        urls.iter().map(|u| ReplicaUrl::parse(u).unwrap()).collect();
    // Four prefixes, at least one owned by each replica under the gateway's hashing, so that
    // "load still spread" is decided by the gateway following the ranking, not by the luck of
    // four draws (the bounded-load fallback is tested in `policy` and with fakes). Not three
    // or six: sent question-major to three replicas in turn, each prefix would land on the same
    // replica every round and round-robin would look like affinity. Three questions each; the
    // 400-token prefills are what this test spends its time on.
    let owner = |system: &str| {
        let text = affinity::chat_text([("system", system), ("user", "")]);
        let key = affinity::prefix_key(&text, 512).unwrap();
        replica_urls
            .iter()
            .max_by_key(|u| affinity::weight(key, u))
            .unwrap()
            .to_string()
    };
    let pick = |set: &str| {
        let mut per: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for i in 0.. {
            let s = system_prompt(&format!("Notes {set}{i}"));
            let o = owner(&s);
            let v = per.entry(o).or_default();
            if v.is_empty() {
                v.push(s);
            }
            if per.len() == 3 {
                break;
            }
        }
        let mut all: Vec<String> = per.into_values().flatten().collect();
        all.push(system_prompt(&format!("Notes {set}-extra")));
        all
    };
    let rr = gateway(&rs.iter().collect::<Vec<_>>(), &["--policy", "round-robin"]);
    let pa = gateway(
        &rs.iter().collect::<Vec<_>>(),
        &["--policy", "prefix-affinity"],
    );
    wait_ready(&rr.url, Duration::from_secs(30)).await;
    wait_ready(&pa.url, Duration::from_secs(30)).await;

    let (rr_rate, _) = shared_prefix_run(&rr.url, &urls, &pick("A")).await;
    let b = pick("B");
    let (pa_rate, by_prefix) = shared_prefix_run(&pa.url, &urls, &b).await;
    eprintln!("prefix-cache hit rate: round-robin {rr_rate:.2}, prefix-affinity {pa_rate:.2}");
    // Affinity: the second and third requests of a prefix find its ~400 tokens cached (about
    // 0.63 of all prompt tokens); round-robin: only by chance.
    assert!(
        pa_rate > rr_rate + 0.25 && pa_rate > 0.45,
        "round-robin {rr_rate:.2}, prefix-affinity {pa_rate:.2}"
    );
    assert!(by_prefix.values().all(|s| s.len() == 1), "{by_prefix:?}");
    let used: BTreeSet<&String> = by_prefix.values().flatten().collect();
    assert_eq!(used.len(), 3, "load not spread: {by_prefix:?}");
    let m = get(&pa.url, "/metrics").await.body.unwrap();
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_routing_decisions_total",
            &[("reason", "affinity_hit")]
        ),
        3.0 * b.len() as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_held_at_zero_replicas_is_answered_once_one_is_announced() {
    let _serial = SERIAL.lock().await;
    let file = std::env::temp_dir().join(format!("sluice-pool-{}", std::process::id()));
    std::fs::write(&file, format!("model {MODEL}\n")).unwrap();
    let discover = format!("file://{}", file.display());
    let gw = gateway(
        &[],
        &[
            "--discover",
            &discover,
            "--discover-interval",
            "100ms",
            "--hold-timeout",
            "300s",
        ],
    );
    let listed = |body: &str| body.contains(&format!("\"id\":\"{MODEL}\""));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listed(&get(&gw.url, "/v1/models").await.body.unwrap()) {
        assert!(
            Instant::now() < deadline,
            "the announced model is not listed"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let held = {
        let url = gw.url.clone();
        tokio::spawn(async move {
            post(
                &url,
                "/v1/completions",
                completion("Once upon", 4, false),
                &[],
            )
            .await
        })
    };
    let held_metric = |m: &str| metric(m, "sluice_gateway_queue_held", &[("model", MODEL)]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while held_metric(&get(&gw.url, "/metrics").await.body.unwrap()) != 1.0 {
        assert!(
            Instant::now() < deadline,
            "the request is not counted as held"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // A replica starts; once ready it is announced, and the held request goes to it.
    let r = replica(0, &["--max-num-seqs", "4"]);
    wait_ready(&r.url, Duration::from_secs(120)).await;
    assert_eq!(
        replica_metric(&r.url, "sluice_engine_max_num_seqs").await,
        4.0
    );
    std::fs::write(&file, format!("model {MODEL}\n{}\n", r.url)).unwrap();
    let a = tokio::time::timeout(Duration::from_secs(60), held)
        .await
        .expect("the held request is answered")
        .unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.replica().as_deref(), Some(r.url.as_str()));
    assert_eq!(a.json()["usage"]["completion_tokens"], 4);
    let m = get(&gw.url, "/metrics").await.body.unwrap();
    assert_eq!(held_metric(&m), 0.0);
    let _ = std::fs::remove_file(&file);
}
