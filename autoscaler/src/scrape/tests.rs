//! The scraper against real sluice `/metrics` text (captured from `sluice serve --model` with
//! SmolLM2-135M: idle after three requests, then with six more arriving) and against a small
//! HTTP server that misbehaves on request.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const IDLE: &str = include_str!("testdata/replica-idle.metrics");
const BUSY: &str = include_str!("testdata/replica-busy.metrics");

fn snap(text: &str) -> Snapshot {
    Snapshot::from_samples(&exposition::parse(text).expect("a real exposition parses"))
}

fn cfg() -> ScrapeConfig {
    ScrapeConfig {
        timeout: Duration::from_millis(300),
        path: "/metrics".into(),
        window_s: 10.0,
        short_window_s: 2.0,
        latency_window_s: 10.0,
        ..ScrapeConfig::default()
    }
}

#[test]
fn a_real_sluice_replica_is_read() {
    let idle = snap(IDLE);
    assert_eq!(idle.running, Some(0.0));
    assert_eq!(idle.waiting, Some(0.0));
    assert_eq!(idle.kv_usage, Some(0.0));
    assert_eq!(idle.finished, Some(3.0));
    assert_eq!(idle.prompt_tokens, Some(96.0));
    assert_eq!(idle.generation_tokens, Some(24.0));
    assert_eq!(idle.ttft.as_ref().map(Histogram::count), Some(3.0));
    // sluice exports per-token ITL, not per-request TPOT: that is what `tpot` reads.
    assert_eq!(idle.tpot.as_ref().map(Histogram::count), Some(21.0));
    // Its own admission queue (the replica is a `sluice serve`).
    assert_eq!(idle.gateway_queue, Some(0.0));
    let busy = snap(BUSY);
    assert_eq!((busy.running, busy.waiting), (Some(1.0), Some(5.0)));
    assert!(busy.kv_usage.unwrap() > 0.0);
}

#[test]
fn windows_over_real_snapshots_give_rates_queue_and_load() {
    let mut s = Scraper::new(cfg());
    let a = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:1/");
    let b = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:2");
    let targets = [a.clone(), b.clone()];
    let o = s.record(&targets, vec![Ok(snap(IDLE)), Ok(snap(IDLE))], 100.0);
    assert_eq!(
        o.arrivals.requests_per_s, 0.0,
        "one sample measures nothing"
    );
    assert!(!o.any_stale());
    // Four seconds later replica a has six requests (one running, five waiting).
    let o = s.record(&targets, vec![Ok(snap(BUSY)), Ok(snap(IDLE))], 104.0);
    assert!((o.arrivals.requests_per_s - 6.0 / 4.0).abs() < 1e-9);
    // 11 prompt tokens were prefilled (107 − 96) over the four seconds.
    assert!((o.arrivals.prompt_tokens_per_s - 11.0 / 4.0).abs() < 1e-9);
    // The short window (2 s) holds only the last step, still six arrivals.
    assert!((o.arrivals.short_requests_per_s - 3.0).abs() < 1e-9);
    assert_eq!(o.queue.waiting, 5);
    assert_eq!(o.queue.running, 1);
    let v = &o.variants[&("cpu".to_string(), CapacityType::OnDemand)];
    assert_eq!((v.fresh, v.stale), (2, 0));
    assert_eq!(v.waiting_per_replica, 2.5);
    assert_eq!(v.running_per_replica, 0.5);
    // Into the policy's signals: the load fields of the matching entry.
    let mut sig = Signals {
        variants: vec![sluice_policy::signals::VariantSignals {
            variant: "cpu".into(),
            ready: 2,
            ..Default::default()
        }],
        ..Default::default()
    };
    o.apply("m", &mut sig);
    assert_eq!(sig.time_s, 104.0);
    assert_eq!(sig.queue.waiting, 5);
    assert_eq!(sig.variants[0].ready, 2, "fleet counts are the actuator's");
    assert_eq!(sig.variants[0].waiting_per_replica, 2.5);
    assert_eq!(sig.arrivals.window_s, 10.0);
    // The shape window counts the same six arrivals and eleven prompt tokens.
    let wide = sig
        .arrivals
        .wide
        .as_ref()
        .expect("the shape window is read");
    assert_eq!(wide.window_s, cfg().shape_window_s);
    assert_eq!((wide.requests, wide.prompt_tokens), (6.0, 11.0));
}

#[test]
fn a_target_that_fails_is_stale_and_its_last_load_still_counts() {
    let mut s = Scraper::new(cfg());
    let a = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:1");
    let b = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:2");
    let targets = [a.clone(), b.clone()];
    s.record(&targets, vec![Ok(snap(BUSY)), Ok(snap(IDLE))], 0.0);
    let failed = || {
        Err(ScrapeError::Status {
            url: a.url.clone(),
            status: 503,
        })
    };
    let o = s.record(&targets, vec![failed(), Ok(snap(IDLE))], 1.0);
    assert!(o.any_stale());
    let st = o.target("http://127.0.0.1:1/").unwrap();
    assert!(st.is_stale());
    assert!(st.error.as_deref().unwrap().contains("HTTP 503"));
    // Never read as idle: its five waiting requests are still in the queue.
    assert_eq!(o.queue.waiting, 5);
    let v = &o.variants[&("cpu".to_string(), CapacityType::OnDemand)];
    assert_eq!((v.fresh, v.stale), (1, 1));
    assert_eq!(v.waiting_per_replica, 0.0, "means over fresh replicas only");
    // A target that never answered is stale with nothing known.
    let c = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:3");
    let o = s.record(
        std::slice::from_ref(&c),
        vec![Err(ScrapeError::Url { url: c.url.clone() })],
        2.0,
    );
    assert!(o.targets[0].is_stale() && o.targets[0].last.is_none());
}

#[test]
fn departed_targets_count_until_they_leave_the_window() {
    let mut s = Scraper::new(cfg());
    let a = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:1");
    s.record(std::slice::from_ref(&a), vec![Ok(snap(IDLE))], 0.0);
    s.record(std::slice::from_ref(&a), vec![Ok(snap(BUSY))], 1.0);
    // a was removed: its six arrivals still count in the 10 s window...
    let o = s.record(&[], vec![], 2.0);
    assert!((o.arrivals.requests_per_s - 6.0 / 2.0).abs() < 1e-9);
    assert_eq!(
        o.queue.waiting, 0,
        "...but not its queue: it is no target now"
    );
    // ...and are forgotten once the window has passed.
    let o = s.record(&[], vec![], 12.5);
    assert_eq!(o.arrivals.requests_per_s, 0.0);
}

#[test]
fn a_gateway_target_gives_its_queue_and_routed_replicas() {
    let mut s = Scraper::new(cfg());
    let g = Endpoint::gateway("http://127.0.0.1:9");
    let text = "sluice_gateway_queue_depth{priority=\"0\"} 4\n\
                sluice_gateway_replica_eligible{replica=\"http://127.0.0.1:7001\"} 1\n";
    let o = s.record(std::slice::from_ref(&g), vec![Ok(snap(text))], 0.0);
    assert_eq!(o.queue.waiting, 4);
    assert_eq!(
        o.routed,
        Some(BTreeSet::from(["http://127.0.0.1:7001".to_string()]))
    );
    // A gateway whose scrape failed says nothing about routing.
    let o = s.record(
        std::slice::from_ref(&g),
        vec![Err(ScrapeError::Url { url: g.url.clone() })],
        1.0,
    );
    assert_eq!(o.routed, None);
    // A fresh gateway without replica series routes to none.
    let text = "sluice_gateway_queue_depth{priority=\"0\"} 0\n";
    let o = s.record(std::slice::from_ref(&g), vec![Ok(snap(text))], 2.0);
    assert_eq!(o.routed, Some(BTreeSet::new()));
}

/// A gateway's `sluice_gateway_prompt_tokens_per_second` for model `m`: `small` seconds of
/// 1,000 tokens and `big` of 50,000 so far.
fn bursts_text(small: f64, big: f64) -> String {
    let name = sluice_metrics::gateway::PROMPT_TOKENS_PER_SECOND;
    let n = small + big;
    format!(
        "{name}_bucket{{model=\"m\",le=\"1024\"}} {small}\n\
         {name}_bucket{{model=\"m\",le=\"65536\"}} {n}\n\
         {name}_bucket{{model=\"m\",le=\"+Inf\"}} {n}\n\
         {name}_sum{{model=\"m\"}} {}\n\
         {name}_count{{model=\"m\"}} {n}\n\
         {name}_bucket{{model=\"other\",le=\"+Inf\"}} 7\n\
         {name}_sum{{model=\"other\"}} 7\n",
        small * 1000.0 + big * 50_000.0
    )
}

#[test]
fn a_gateway_gives_each_model_its_prompt_tokens_per_second_over_the_shape_window() {
    let mut s = Scraper::new(ScrapeConfig {
        shape_window_s: 20.0,
        ..cfg()
    });
    let g = Endpoint::gateway("http://127.0.0.1:9");
    let at = |s: &mut Scraper, t: f64, text: String| {
        s.record(std::slice::from_ref(&g), vec![Ok(snap(&text))], t)
    };
    at(&mut s, 0.0, bursts_text(100.0, 0.0));
    at(&mut s, 10.0, bursts_text(108.0, 1.0));
    let o = at(&mut s, 20.0, bursts_text(116.0, 2.0));
    // Over (0, 20]: 16 seconds of 1,000 and two of 50,000.
    let m = &o.prompt_bursts["m"];
    assert_eq!(
        m.hist.buckets,
        vec![(1024.0, 16.0), (65536.0, 18.0), (f64::INFINITY, 18.0)]
    );
    assert_eq!(m.sum, 116_000.0);
    assert_eq!(o.prompt_bursts_of("m"), Some(m.sums()));
    // The other model's series did not move: nothing arrived for it in the window.
    assert_eq!(o.prompt_bursts_of("other").map(|o| o.sum), Some(0.0));
    assert_eq!(o.prompt_bursts_of("nobody"), None);
    // The gateway restarts: its counts start again from zero and count whole.
    let o = at(&mut s, 30.0, bursts_text(3.0, 1.0));
    let m = &o.prompt_bursts["m"];
    assert_eq!(m.hist.buckets.last(), Some(&(f64::INFINITY, 9.0 + 4.0)));
    assert_eq!(m.sum, 8000.0 + 50_000.0 + 53_000.0);
}

/// Serves one canned answer per connection: `Some((status, body))`, or `None` to hang.
async fn server(answer: Option<(u16, String)>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = l.accept().await else {
                return;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                match answer {
                    Some((status, body)) => {
                        let head = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        let _ = sock.write_all(head.as_bytes()).await;
                        let _ = sock.write_all(body.as_bytes()).await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(30)).await,
                }
            });
        }
    });
    url
}

#[tokio::test]
async fn over_http_fresh_and_every_kind_of_failure() {
    let ok = server(Some((200, BUSY.to_string()))).await;
    let status = server(Some((500, "boom".into()))).await;
    let html = server(Some((200, "<html>not metrics</html>".into()))).await;
    let hang = server(None).await;
    // A port nobody listens on: bind one and drop it.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let urls = [&ok, &status, &html, &hang, &closed];
    let targets: Vec<Endpoint> = urls
        .iter()
        .map(|u| Endpoint::replica("cpu", CapacityType::OnDemand, u))
        .collect();
    let mut s = Scraper::new(cfg());
    let started = std::time::Instant::now();
    let o = s.scrape(&targets, 0.0).await;
    // All at once: the hanging one costs one timeout, not one per target.
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!o.targets[0].is_stale());
    assert_eq!(o.queue.waiting, 5);
    let err = |i: usize| o.targets[i].error.clone().unwrap_or_default();
    assert!(err(1).contains("HTTP 500"), "{}", err(1));
    assert!(
        err(2).contains("not the Prometheus text format"),
        "{}",
        err(2)
    );
    assert!(err(3).contains("no answer within"), "{}", err(3));
    assert!(err(4).contains("request failed"), "{}", err(4));
    let v = &o.variants[&("cpu".to_string(), CapacityType::OnDemand)];
    assert_eq!((v.fresh, v.stale), (1, 4));
    let bad = Endpoint::replica("cpu", CapacityType::OnDemand, "ftp://x");
    let o = s.scrape(&[bad], 1.0).await;
    assert!(o.targets[0]
        .error
        .as_deref()
        .unwrap()
        .contains("not a valid URL"));
}

#[test]
fn a_request_retried_on_another_replica_arrives_once() {
    let mut s = Scraper::new(cfg());
    let a = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:1");
    let b = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:2");
    let at = |finished: f64, waiting: f64| Snapshot {
        finished: Some(finished),
        waiting: Some(waiting),
        running: Some(0.0),
        ..Snapshot::default()
    };
    let targets = [a, b];
    s.record(&targets, vec![Ok(at(0.0, 0.0)), Ok(at(0.0, 0.0))], 0.0);
    // One request queues on a...
    s.record(&targets, vec![Ok(at(0.0, 1.0)), Ok(at(0.0, 0.0))], 1.0);
    // ...is refused there after a timeout, retried on b, and finishes.
    let o = s.record(&targets, vec![Ok(at(0.0, 0.0)), Ok(at(1.0, 0.0))], 2.0);
    assert!((o.arrivals.requests_per_s - 1.0 / 2.0).abs() < 1e-9);
}

/// A gateway's front door for model `m`: `arrived` so far, `refused` of them, `served` first
/// tokens within half a second.
fn door_text(arrived: u32, refused: u32, served: u32) -> String {
    use sluice_metrics::gateway::{ARRIVALS_TOTAL, TIME_TO_FIRST_TOKEN_SECONDS, UNSERVED_TOTAL};
    let t = TIME_TO_FIRST_TOKEN_SECONDS;
    format!(
        "{ARRIVALS_TOTAL}{{model=\"m\"}} {arrived}\n\
         {UNSERVED_TOTAL}{{model=\"m\",reason=\"queue_timeout\"}} {refused}\n\
         {t}_bucket{{model=\"m\",le=\"0.5\"}} {served}\n\
         {t}_bucket{{model=\"m\",le=\"+Inf\"}} {served}\n\
         {t}_sum{{model=\"m\"}} 1\n\
         {t}_count{{model=\"m\"}} {served}\n"
    )
}

/// Everything the gateway took in for `m` was refused or answered, none of it visible on a
/// replica: the signals carry its arrival rate and count the refused as late first tokens.
#[test]
fn a_gateways_front_door_is_the_models_demand_and_its_refusals_are_misses() {
    let target = TtftTarget {
        target_s: 2.0,
        longest_prompt_tokens: 8000.0,
    };
    let mut s = Scraper::new(ScrapeConfig {
        ttft_target: Some(target),
        ..cfg()
    });
    let g = Endpoint::gateway("http://127.0.0.1:9");
    let at = |s: &mut Scraper, t: f64, text: String| {
        s.record(std::slice::from_ref(&g), vec![Ok(snap(&text))], t)
    };
    at(&mut s, 0.0, door_text(1000, 10, 990));
    at(&mut s, 5.0, door_text(1030, 20, 1010));
    let o = at(&mut s, 10.0, door_text(1060, 30, 1030));
    let mut sig = Signals::default();
    o.apply("m", &mut sig);
    // Over (0, 10]: 60 arrived, 20 refused, 40 served within 0.5 s.
    assert_eq!(sig.arrivals.requests_per_s, 6.0);
    assert_eq!(sig.arrivals.short_requests_per_s, 30.0 / 2.0);
    let att = sig.latency.ttft_attainment.unwrap();
    assert!((att - 40.0 / 60.0).abs() < 1e-9, "{att}");
    // Another model's signals are the replicas' alone.
    let mut other = Signals::default();
    o.apply("other", &mut other);
    assert_eq!(other.arrivals.requests_per_s, 0.0);
    assert_eq!(other.latency.ttft_attainment, None);
}

/// The gateway's prompts refused as too long for model `m` so far: `short` of 3,000 tokens
/// and `long` of 200,000.
fn refused_text(short: u32, long: u32) -> String {
    let r = sluice_metrics::gateway::REFUSED_PROMPT_TOKENS;
    let (all, sum) = (short + long, 3000 * short + 200_000 * long);
    format!(
        "{r}_bucket{{model=\"m\",le=\"2048\"}} 0\n\
         {r}_bucket{{model=\"m\",le=\"4096\"}} {short}\n\
         {r}_bucket{{model=\"m\",le=\"8192\"}} {short}\n\
         {r}_bucket{{model=\"m\",le=\"262144\"}} {all}\n\
         {r}_bucket{{model=\"m\",le=\"+Inf\"}} {all}\n\
         {r}_sum{{model=\"m\"}} {sum}\n\
         {r}_count{{model=\"m\"}} {all}\n"
    )
}

/// A replica served 20 requests of 1,000 prompt tokens while the gateway refused 8 prompts
/// of 3,000 tokens (a larger GPU the pool lacks serves them in time) and 2 of 200,000 (none
/// does): the request shape holds the 20 and the 8, the arrival rate is the gateway's 30.
#[test]
fn prompts_the_gateway_refused_that_some_variant_serves_are_in_the_shape() {
    let mut s = Scraper::new(ScrapeConfig {
        ttft_target: Some(TtftTarget {
            target_s: 2.0,
            longest_prompt_tokens: 8000.0,
        }),
        ..cfg()
    });
    let r = Endpoint::replica("cpu", CapacityType::OnDemand, "http://127.0.0.1:1");
    let g = Endpoint::gateway("http://127.0.0.1:9");
    let served = |n: f64| Snapshot {
        finished: Some(n),
        running: Some(0.0),
        waiting: Some(0.0),
        prompt_tokens: Some(n * 1000.0),
        generation_tokens: Some(n * 100.0),
        ..Snapshot::default()
    };
    let targets = [r, g];
    let gateway = |arrived, served, short, long| {
        snap(&(door_text(arrived, 0, served) + &refused_text(short, long)))
    };
    s.record(
        &targets,
        vec![Ok(served(0.0)), Ok(gateway(0, 0, 0, 0))],
        0.0,
    );
    let o = s.record(
        &targets,
        vec![Ok(served(20.0)), Ok(gateway(30, 20, 8, 2))],
        10.0,
    );
    let mut sig = Signals::default();
    o.apply("m", &mut sig);
    let a = &sig.arrivals;
    assert!(
        (a.requests_per_s - 3.0).abs() < 1e-9,
        "{}",
        a.requests_per_s
    );
    // The 8 read at their bucket's midpoint (3,072): the 2 past 8,000 were cut.
    let mean = a.prompt_tokens_per_s / a.requests_per_s;
    let expect = (20.0 * 1000.0 + 8.0 * 3072.0) / 28.0;
    assert!((mean - expect).abs() < 1e-6, "{mean} vs {expect}");
    assert!((a.output_tokens_per_s / a.requests_per_s - 100.0).abs() < 1e-9);
    assert_eq!(a.max_prompt_tokens, 4096);
    let wide = a.wide.as_ref().unwrap().workload();
    assert!((wide.mean_prompt_tokens - expect).abs() < 1e-6);
}
