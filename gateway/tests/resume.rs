//! Real processes on loopback: mid-stream resumption and deadlines.
//!
//! - Two replicas behind a routing gateway, 8 streams (half greedy, half seeded at
//!   temperature 1); one replica is SIGKILLed while they run: every stream finishes, each
//!   identical to the same request undisturbed (text, usage, one `id`); a ninth, sampled
//!   without a seed, finishes whole.
//! - Deadlines: in the local admission queue (504 `deadline_exceeded` while the engine is
//!   busy), and in decode through the gateway (an SSE error event with code
//!   `deadline_exceeded`, the replica's KV blocks freed).

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::processes::{model_dir, spawn, wait_ready, Proc};
use common::routing::{client, get, metric, post};
use common::MODEL;
use http_body_util::{BodyExt, Full};

/// The tests here each start several processes; one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn replica(extra: &[&str]) -> Proc {
    let dir = model_dir();
    let mut args = vec![
        "--port",
        "0",
        "--model",
        MODEL,
        "--model-dir",
        dir.to_str().unwrap(),
        "--threads",
        "1",
        "--max-model-len",
        "1024",
        "--kv-cache-mib",
        "48",
    ];
    args.extend(extra);
    spawn(&args)
}

fn gateway(replicas: &[&Proc]) -> Proc {
    let mut args = vec!["--port", "0", "--policy", "round-robin"];
    for r in replicas {
        args.extend(["--upstream", r.url.as_str()]);
    }
    args.extend([
        "--stale-after",
        "3s",
        "--poll-interval",
        "100ms",
        "--health-interval",
        "100ms",
        "--health-path",
        "/ready",
    ]);
    spawn(&args)
}

/// Request `i` of the eight: even ones greedy, odd ones seeded at temperature 1; the last
/// asks for two choices. A ninth samples without a seed.
fn body(i: usize) -> String {
    let mut v = serde_json::json!({"model": MODEL,
        "messages": [{"role": "user", "content": format!("Tell story number {i} about a fox.")}],
        "max_tokens": 80, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true}});
    if i == 8 {
        v["temperature"] = 1.into();
    } else if i.is_multiple_of(2) {
        v["temperature"] = 0.into();
    } else {
        v["temperature"] = 1.into();
        v["seed"] = (100 + i).into();
    }
    if i == 7 {
        v["n"] = 2.into();
    }
    v.to_string()
}

/// A streamed answer read: its text, usage, chunk ids, and whether it ended cleanly.
#[derive(Debug, Clone, PartialEq)]
struct Streamed {
    /// Per choice index.
    text: std::collections::BTreeMap<u64, String>,
    usage: serde_json::Value,
    ids: BTreeSet<String>,
    errors: Vec<String>,
    done: bool,
}

fn read_sse(body: &str) -> Streamed {
    let mut s = Streamed {
        text: Default::default(),
        usage: serde_json::Value::Null,
        ids: BTreeSet::new(),
        errors: Vec::new(),
        done: false,
    };
    for event in body.split("\n\n").filter(|e| !e.is_empty()) {
        let data = event.strip_prefix("data: ").expect("data events only");
        if data == "[DONE]" {
            s.done = true;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        if v.get("error").is_some() {
            s.errors.push(data.to_string());
            continue;
        }
        assert!(v["choices"][0].get("token_ids").is_none(), "{data}");
        s.ids.insert(v["id"].as_str().unwrap().to_string());
        for c in v["choices"].as_array().unwrap() {
            let index = c["index"].as_u64().unwrap();
            if let Some(t) = c["delta"]["content"].as_str() {
                s.text.entry(index).or_default().push_str(t);
            }
        }
        if !v["usage"].is_null() {
            s.usage = v["usage"].clone();
        }
    }
    s
}

/// Streams request `i`, reporting when its first content arrives; returns the replica that
/// answered first and the whole body.
async fn stream(url: String, i: usize, started: Arc<Mutex<usize>>) -> (String, String) {
    let req = hyper::Request::post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body(i))))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let replica = resp.headers()["x-sluice-replica"]
        .to_str()
        .unwrap()
        .to_string();
    let mut body = resp.into_body();
    let mut text = String::new();
    let mut counted = false;
    while let Some(frame) = body.frame().await {
        let data = frame
            .expect("the gateway never cuts a stream")
            .into_data()
            .unwrap();
        text.push_str(std::str::from_utf8(&data).unwrap());
        if !counted && text.matches("data: ").count() > 12 {
            *started.lock().unwrap() += 1;
            counted = true;
        }
    }
    (replica, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_stream_is_resumed_exactly() {
    let _serial = SERIAL.lock().await;
    let mut rs = [replica(&[]), replica(&[])];
    for r in &rs {
        wait_ready(&r.url, Duration::from_secs(120)).await;
    }
    let gw = gateway(&rs.iter().collect::<Vec<_>>());
    wait_ready(&gw.url, Duration::from_secs(30)).await;

    // The undisturbed references, one at a time.
    let mut reference = Vec::new();
    for i in 0..8 {
        let a = post(&gw.url, "/v1/chat/completions", body(i), &[]).await;
        let s = read_sse(a.body.as_ref().unwrap());
        assert!(s.done && s.errors.is_empty() && s.ids.len() == 1, "{s:?}");
        let n = if i == 7 { 2 } else { 1 };
        assert_eq!(s.usage["completion_tokens"], 80 * n);
        assert_eq!(s.text.len(), n);
        reference.push(s);
    }

    // All nine at once; SIGKILL the first replica once every stream has text.
    let started = Arc::new(Mutex::new(0));
    let tasks: Vec<_> = (0..9)
        .map(|i| tokio::spawn(stream(gw.url.clone(), i, started.clone())))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while *started.lock().unwrap() < 9 {
        assert!(Instant::now() < deadline, "the streams did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let victim = rs[0].url.clone();
    rs[0].child.kill().unwrap();
    let _ = rs[0].child.wait();

    let mut resumed = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let (replica, text) = t.await.unwrap();
        let got = read_sse(&text);
        assert!(got.errors.is_empty(), "stream {i}: {:?}", got.errors);
        assert!(got.done && got.ids.len() == 1, "stream {i}: {got:?}");
        if i == 8 {
            // Unseeded: another text, but one whole stream of the length asked for.
            assert_eq!(got.usage["completion_tokens"], 80, "{got:?}");
            continue;
        }
        assert_eq!(got.text, reference[i].text, "stream {i} (from {replica})");
        // The prompt's cached share depends on what ran before; the counts do not.
        for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(got.usage[k], reference[i].usage[k], "stream {i}: {k}");
        }
        let port = |u: &str| {
            u.trim_end_matches('/')
                .rsplit(':')
                .next()
                .unwrap()
                .to_string()
        };
        resumed += usize::from(port(&victim) == port(&replica));
    }
    assert!(resumed > 0, "no stream ran on the killed replica");
}

/// A deadline in the local admission queue: with the only permit held by a long request,
/// a short deadline ends in the queue with a 504; a malformed header is a 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deadline_passes_in_the_local_queue() {
    let _serial = SERIAL.lock().await;
    let r = replica(&["--max-in-flight", "1"]);
    wait_ready(&r.url, Duration::from_secs(120)).await;
    let long = serde_json::json!({"model": MODEL, "prompt": "Once upon a time",
        "max_tokens": 600, "ignore_eos": true, "temperature": 0, "stream": true})
    .to_string();
    let url = r.url.clone();
    let busy = tokio::spawn(async move { post(&url, "/v1/completions", long, &[]).await });
    wait_until(&r.url, "the long request running", |m| {
        metric(m, "vllm:num_requests_running", &[]) >= 1.0
    })
    .await;
    let short = serde_json::json!({"model": MODEL, "prompt": "Hi", "max_tokens": 4}).to_string();
    let a = post(
        &r.url,
        "/v1/completions",
        short.clone(),
        &[("x-sluice-deadline-ms", "200")],
    )
    .await;
    assert_eq!(a.status, 504, "{:?}", a.body);
    let e = a.json();
    assert_eq!(e["error"]["code"], "deadline_exceeded");
    assert_eq!(e["error"]["type"], "timeout_error");
    assert_eq!(
        e["error"]["message"],
        "The request's deadline passed in the queue stage"
    );
    let m = get(&r.url, "/metrics").await.body.unwrap();
    let queued = [("stage", "queue")];
    assert_eq!(
        metric(&m, "sluice_gateway_deadline_exceeded_total", &queued),
        1.0
    );
    let bad = post(
        &r.url,
        "/v1/completions",
        short,
        &[("x-sluice-deadline-ms", "soon")],
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "X-Sluice-Deadline-Ms");
    busy.abort();
}

/// A deadline that passes mid-stream through the gateway: an SSE error event with code
/// `deadline_exceeded` and `[DONE]`, never a `length` finish; the replica frees the blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deadline_passes_in_decode_through_the_gateway() {
    let _serial = SERIAL.lock().await;
    let r = replica(&[]);
    wait_ready(&r.url, Duration::from_secs(120)).await;
    let gw = gateway(&[&r]);
    wait_ready(&gw.url, Duration::from_secs(30)).await;
    let long = serde_json::json!({"model": MODEL, "prompt": "Once upon a time",
        "max_tokens": 900, "ignore_eos": true, "temperature": 0, "stream": true})
    .to_string();
    let a = post(
        &gw.url,
        "/v1/completions",
        long,
        &[("x-sluice-deadline-ms", "1500")],
    )
    .await;
    assert_eq!(a.status, 200);
    let body = a.body.unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert!(!body.contains("\"finish_reason\":\"length\""), "{body}");
    let event = body
        .split("\n\n")
        .find(|e| e.contains("\"error\""))
        .unwrap_or_else(|| panic!("no error event: {body}"));
    let v: serde_json::Value = serde_json::from_str(event.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "deadline_exceeded", "{event}");
    assert!(
        body.contains("\"text\":"),
        "the deadline passed before any text: {body}"
    );
    let m = get(&gw.url, "/metrics").await.body.unwrap();
    let decode = [("stage", "decode")];
    assert_eq!(
        metric(&m, "sluice_gateway_deadline_exceeded_total", &decode),
        1.0
    );
    wait_until(&r.url, "the blocks freed", |m| {
        metric(m, "vllm:num_requests_running", &[]) == 0.0
            && metric(m, "vllm:kv_cache_usage_perc", &[]) == 0.0
    })
    .await;
}

async fn wait_until(url: &str, what: &str, cond: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = get(url, "/metrics").await.body.unwrap();
        if cond(&m) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that leaves while its stream runs on the replica it was resumed on aborts the
/// generation there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_leaving_a_resumed_stream_aborts_it() {
    let _serial = SERIAL.lock().await;
    let mut rs = [replica(&[]), replica(&[])];
    for r in &rs {
        wait_ready(&r.url, Duration::from_secs(120)).await;
    }
    let gw = gateway(&rs.iter().collect::<Vec<_>>());
    wait_ready(&gw.url, Duration::from_secs(30)).await;
    let long = serde_json::json!({"model": MODEL, "prompt": "Once upon a time",
        "max_tokens": 900, "ignore_eos": true, "temperature": 0, "stream": true})
    .to_string();
    let req = hyper::Request::post(format!("{}/v1/completions", gw.url))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(long)))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let first = resp.headers()["x-sluice-replica"]
        .to_str()
        .unwrap()
        .to_string();
    let port = |u: &str| {
        u.trim_end_matches('/')
            .rsplit(':')
            .next()
            .unwrap()
            .to_string()
    };
    let (victim, other) = match port(&first) == port(&rs[0].url) {
        true => (0, 1),
        false => (1, 0),
    };
    let mut body = resp.into_body();
    let mut seen = 0;
    while seen < 5 {
        let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
        seen += std::str::from_utf8(&data)
            .unwrap()
            .matches("data: ")
            .count();
    }
    rs[victim].child.kill().unwrap();
    let _ = rs[victim].child.wait();
    let other_url = rs[other].url.clone();
    wait_until(&other_url, "the continuation running", |m| {
        metric(m, "vllm:num_requests_running", &[]) == 1.0
    })
    .await;
    // More text comes from the continuation; then the client leaves.
    let data = body.frame().await.unwrap().unwrap();
    assert!(data.is_data());
    drop(body);
    wait_until(&other_url, "the continuation aborted", |m| {
        metric(m, "vllm:num_requests_running", &[]) == 0.0
            && metric(m, "vllm:kv_cache_usage_perc", &[]) == 0.0
            && metric(
                m,
                "vllm:request_success_total",
                &[("finished_reason", "abort")],
            ) == 1.0
    })
    .await;
}

/// A streamed completion's piece: text, token ids, log-probability offsets.
type Piece = (String, Vec<u64>, Vec<u64>);

/// Choice `index`'s pieces of a streamed completion as a replica sends them to a gateway, and
/// its finishing chunk's usage.
fn pieces(body: &str, index: u64) -> (Vec<Piece>, serde_json::Value) {
    let mut out = Vec::new();
    let mut usage = serde_json::Value::Null;
    for e in body
        .split("\n\n")
        .filter(|e| !e.is_empty() && *e != "data: [DONE]")
    {
        let v: serde_json::Value = serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap();
        let choices = v["choices"].as_array().unwrap();
        let Some(c) = choices.iter().find(|c| c["index"] == index) else {
            continue;
        };
        if !c["sluice_usage"].is_null() {
            usage = c["sluice_usage"].clone();
        }
        let nums = |x: &serde_json::Value| -> Vec<u64> {
            x.as_array()
                .map(|a| a.iter().map(|n| n.as_u64().unwrap()).collect())
                .unwrap_or_default()
        };
        if c["finish_reason"].is_null() {
            let text = c["text"].as_str().unwrap().to_string();
            out.push((
                text,
                nums(&c["token_ids"]),
                nums(&c["logprobs"]["text_offset"]),
            ));
        }
    }
    (out, usage)
}

/// The replica's side of resumption: token ids on request, and a continuation that goes on
/// exactly where the output stopped (text, token ids, log-probability offsets, usage), also
/// after an echoed prompt, which the continuation does not repeat but counts in its offsets
/// (the prompt of the choice it continues, the second here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_continuation_request_goes_on_where_the_output_stopped() {
    let _serial = SERIAL.lock().await;
    let r = replica(&[]);
    wait_ready(&r.url, Duration::from_secs(120)).await;
    let count = "Count: one, two, three,";
    continues_where_it_stopped(&r.url, serde_json::json!(count), 0, false).await;
    continues_where_it_stopped(&r.url, serde_json::json!(count), 0, true).await;
    let two = serde_json::json!(["Hello there", count]);
    continues_where_it_stopped(&r.url, two, 1, true).await;
}

/// Choice `index` of a request for `prompt` cut halfway and continued.
async fn continues_where_it_stopped(url: &str, prompt: serde_json::Value, index: u64, echo: bool) {
    let mut body = serde_json::json!({"model": MODEL, "prompt": prompt,
        "max_tokens": 24, "ignore_eos": true, "temperature": 0, "stream": true, "logprobs": 1,
        "echo": echo});
    let ids_header = [("x-sluice-token-ids", "1")];
    let whole = post(url, "/v1/completions", body.to_string(), &ids_header).await;
    assert_eq!(whole.headers["x-sluice-token-ids"], "1");
    let (whole, usage) = pieces(whole.body.as_ref().unwrap(), index);
    assert_eq!(usage["completion_tokens"], 24);
    let echoed = whole[0].0 == "Count: one, two, three,";
    assert_eq!(echoed, echo, "the prompt is echoed first only when asked");
    let cut = whole.len() / 2;
    let sent: Vec<u64> = whole[..cut].iter().flat_map(|p| p.1.clone()).collect();
    body["sluice_resume"] = serde_json::json!({"index": index, "token_ids": sent});
    // Without its header the field is ignored: the answer starts from the beginning.
    let plain = post(url, "/v1/completions", body.to_string(), &ids_header).await;
    assert_eq!(pieces(plain.body.as_ref().unwrap(), index).0, whole);
    let headers = [("x-sluice-token-ids", "1"), ("x-sluice-resume", "1")];
    let rest = post(url, "/v1/completions", body.to_string(), &headers).await;
    // The continuation streams its one choice as choice 0.
    let (rest, usage) = pieces(rest.body.as_ref().unwrap(), 0);
    let text =
        |p: &[(String, Vec<u64>, Vec<u64>)]| p.iter().map(|p| p.0.clone()).collect::<String>();
    let flat = |p: &[Piece], i: usize| -> Vec<u64> {
        p.iter()
            .flat_map(|p| if i == 1 { p.1.clone() } else { p.2.clone() })
            .collect()
    };
    assert_eq!(text(&rest), text(&whole[cut..]));
    assert_eq!(flat(&rest, 1), flat(&whole[cut..], 1));
    assert_eq!(flat(&rest, 2), flat(&whole[cut..], 2));
    assert_eq!(usage["completion_tokens"], 24);
}
