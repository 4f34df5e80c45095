//! The Prometheus signal source against a **real Prometheus server** (Debian's 2.42 package,
//! fetched by `scripts/fetch-prometheus.sh` into `target/prometheus`, or `SLUICE_PROMETHEUS`),
//! scraping in-process fake replicas every second. The replicas serve sluice's own exposition
//! (vLLM names, `model_name` label) with counters that grow at known rates; Prometheus adds the
//! `namespace` and `pod` labels a PodMonitoring would. So every PromQL query the source sends
//! is parsed and evaluated by Prometheus itself, and the figures it derives are checked against
//! the rates the fakes were given.
//!
//! Wall-clock time only paces the scrapes; no assertion is about how long anything took.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_autoscaler::controller::prometheus::{PrometheusConfig, PrometheusSource};
use sluice_autoscaler::controller::source::{Load, Query, Reading, ReplicaPod, SignalSource};
use sluice_autoscaler::crd::ServingPoolSpec;
use sluice_autoscaler::scrape::TtftTarget;

use sluice_policy::profile::CapacityType;

/// How one fake replica's series grow: per-second rates and constant gauges.
#[derive(Clone, Copy)]
struct Shape {
    model: &'static str,
    running: f64,
    waiting: f64,
    kv: f64,
    /// Requests finished per second.
    rps: f64,
    /// Their TTFT's bucket: all observations fall in `(lo, le]`.
    ttft_le: f64,
}

fn exposition(s: Shape, t: f64) -> String {
    let m = format!("model_name=\"{}\"", s.model);
    let n = s.rps * t;
    let mut out = String::new();
    let mut line = |l: String| {
        out.push_str(&l);
        out.push('\n');
    };
    line("# TYPE vllm:num_requests_running gauge".into());
    line(format!("vllm:num_requests_running{{{m}}} {}", s.running));
    line("# TYPE vllm:num_requests_waiting gauge".into());
    line(format!("vllm:num_requests_waiting{{{m}}} {}", s.waiting));
    line("# TYPE vllm:kv_cache_usage_perc gauge".into());
    line(format!("vllm:kv_cache_usage_perc{{{m}}} {}", s.kv));
    line("# TYPE vllm:prompt_tokens_total counter".into());
    line(format!("vllm:prompt_tokens_total{{{m}}} {}", 200.0 * n));
    line("# TYPE vllm:generation_tokens_total counter".into());
    line(format!("vllm:generation_tokens_total{{{m}}} {}", 50.0 * n));
    line("# TYPE vllm:e2e_request_latency_seconds histogram".into());
    line(format!(
        "vllm:e2e_request_latency_seconds_bucket{{{m},le=\"+Inf\"}} {n}"
    ));
    line(format!(
        "vllm:e2e_request_latency_seconds_sum{{{m}}} {}",
        2.0 * n
    ));
    line(format!("vllm:e2e_request_latency_seconds_count{{{m}}} {n}"));
    line("# TYPE vllm:time_to_first_token_seconds histogram".into());
    for le in [0.05, 0.1, 0.5] {
        let c = if le >= s.ttft_le { n } else { 0.0 };
        line(format!(
            "vllm:time_to_first_token_seconds_bucket{{{m},le=\"{le}\"}} {c}"
        ));
    }
    line(format!(
        "vllm:time_to_first_token_seconds_bucket{{{m},le=\"+Inf\"}} {n}"
    ));
    line(format!("vllm:time_to_first_token_seconds_count{{{m}}} {n}"));
    line(format!(
        "vllm:time_to_first_token_seconds_sum{{{m}}} {}",
        s.ttft_le * n
    ));
    // sluice exports inter-token latency, the last of the TPOT names the source tries.
    line("# TYPE vllm:inter_token_latency_seconds histogram".into());
    line(format!(
        "vllm:inter_token_latency_seconds_bucket{{{m},le=\"0.02\"}} 0"
    ));
    line(format!(
        "vllm:inter_token_latency_seconds_bucket{{{m},le=\"0.04\"}} {}",
        50.0 * n
    ));
    line(format!(
        "vllm:inter_token_latency_seconds_bucket{{{m},le=\"+Inf\"}} {}",
        50.0 * n
    ));
    line(format!(
        "vllm:inter_token_latency_seconds_count{{{m}}} {}",
        50.0 * n
    ));
    line(format!(
        "vllm:inter_token_latency_seconds_sum{{{m}}} {}",
        1.5 * n
    ));
    line("# TYPE vllm:request_prompt_tokens histogram".into());
    line(format!(
        "vllm:request_prompt_tokens_bucket{{{m},le=\"128\"}} 0"
    ));
    line(format!(
        "vllm:request_prompt_tokens_bucket{{{m},le=\"256\"}} {n}"
    ));
    line(format!(
        "vllm:request_prompt_tokens_bucket{{{m},le=\"+Inf\"}} {n}"
    ));
    line(format!("vllm:request_prompt_tokens_count{{{m}}} {n}"));
    line(format!(
        "vllm:request_prompt_tokens_sum{{{m}}} {}",
        200.0 * n
    ));
    // Outputs: every other request ~50 tokens, the rest ~1,500 (cv² ≈ 0.87).
    line("# TYPE vllm:request_generation_tokens histogram".into());
    let short = (n / 2.0).floor();
    for (le, c) in [("100", short), ("1000", short), ("2000", n), ("+Inf", n)] {
        line(format!(
            "vllm:request_generation_tokens_bucket{{{m},le=\"{le}\"}} {c}"
        ));
    }
    line(format!("vllm:request_generation_tokens_count{{{m}}} {n}"));
    line(format!(
        "vllm:request_generation_tokens_sum{{{m}}} {}",
        50.0 * short + 1500.0 * (n - short)
    ));
    out
}

/// A routing gateway's per-second prompt sums: for the pool's model one second of 3,000
/// tokens every second (all in the `(2048, 4096]` bucket); for another model, 100 k.
fn gateway_exposition(t: f64) -> String {
    let n = t.floor();
    let name = "sluice_gateway_prompt_tokens_per_second";
    let mut out = format!("# TYPE {name} histogram\n");
    for (model, tokens) in [("smollm2", 3000.0), ("another", 100_000.0)] {
        for le in ["2048", "4096", "131072", "+Inf"] {
            let within = le == "+Inf" || le.parse::<f64>().unwrap() >= tokens;
            let c = if within { n } else { 0.0 };
            out.push_str(&format!(
                "{name}_bucket{{model=\"{model}\",le=\"{le}\"}} {c}\n"
            ));
        }
        out.push_str(&format!("{name}_sum{{model=\"{model}\"}} {}\n", tokens * n));
        out.push_str(&format!("{name}_count{{model=\"{model}\"}} {n}\n"));
    }
    // The other model's front door: 55 requests a second arrive, 10 go unserved, 5 are
    // refused as too long (4 of 3,000 tokens, 1 of 200,000), 40 get their first token within
    // 0.05 s (its replica, `c`, counts the 40 it serves).
    let m = "model=\"another\"";
    out.push_str(&format!(
        "sluice_gateway_model_arrivals_total{{{m}}} {}\n",
        55.0 * n
    ));
    let refused = "sluice_gateway_model_refused_prompt_tokens";
    let buckets = [
        ("2048", 0.0),
        ("4096", 4.0),
        ("65536", 4.0),
        ("262144", 5.0),
    ];
    for (le, per_s) in buckets {
        let c = per_s * n;
        out.push_str(&format!("{refused}_bucket{{{m},le=\"{le}\"}} {c}\n"));
    }
    out.push_str(&format!(
        "{refused}_bucket{{{m},le=\"+Inf\"}} {}\n",
        5.0 * n
    ));
    out.push_str(&format!("{refused}_sum{{{m}}} {}\n", 212_000.0 * n));
    out.push_str(&format!("{refused}_count{{{m}}} {}\n", 5.0 * n));
    out.push_str(&format!(
        "sluice_gateway_model_unserved_total{{{m},reason=\"queue_full\"}} {}\n",
        10.0 * n
    ));
    let ttft = "sluice_gateway_model_time_to_first_token_seconds";
    for le in ["0.05", "1", "+Inf"] {
        out.push_str(&format!("{ttft}_bucket{{{m},le=\"{le}\"}} {}\n", 40.0 * n));
    }
    out.push_str(&format!("{ttft}_count{{{m}}} {}\n", 40.0 * n));
    out
}

/// A fake replica on a loopback port; aborting its task takes it away.
async fn replica(shape: Shape, epoch: Instant) -> (u16, tokio::task::JoinHandle<()>) {
    serve(move || exposition(shape, epoch.elapsed().as_secs_f64())).await
}

/// Serves `text()` as `/metrics` on a loopback port.
async fn serve(
    text: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> (u16, tokio::task::JoinHandle<()>) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || async move { text() }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (port, task)
}

/// The Prometheus process, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    log: PathBuf,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn prometheus_binary() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_PROMETHEUS") {
        return PathBuf::from(p);
    }
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/prometheus/usr/bin/prometheus");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-prometheus.sh (make test does) or set SLUICE_PROMETHEUS",
        p.display()
    );
    p
}

/// Starts Prometheus scraping `targets` (port, namespace, pod) every second.
fn start_prometheus(targets: &[(u16, &str, &str)]) -> Prometheus {
    let dir = std::env::temp_dir().join(format!(
        "sluice-prometheus-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: replicas\n    static_configs:\n",
    );
    for (port, ns, pod) in targets {
        cfg.push_str(&format!(
            "      - targets: ['127.0.0.1:{port}']\n        labels: {{namespace: '{ns}', pod: '{pod}'}}\n"
        ));
    }
    std::fs::write(dir.join("prometheus.yml"), cfg).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let log = dir.join("prometheus.log");
    let child = Command::new(prometheus_binary())
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("prometheus starts");
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        log,
        _dir: TempDir(dir),
    }
}

const SPEC: &str = r#"
model: smollm2
profile: cpu
slo:
  ttft: {percentile: 50, targetSeconds: 1.0}
  tpot: {targetSeconds: 0.1}
variants:
  - {name: l4, deployment: replica-l4, profileVariant: cpu, maxReplicas: 4}
signals:
  prometheusUrl: PROM
policy:
  windowSeconds: 6
  shortWindowSeconds: 3
  shapeWindowSeconds: 8
"#;

fn target(pod: &str) -> ReplicaPod {
    ReplicaPod {
        pod: pod.into(),
        variant: "l4".into(),
        profile_variant: "cpu".into(),
        capacity: CapacityType::OnDemand,
        url: String::new(),
        path: String::new(),
    }
}

/// First tokens within 0.1 s count as in time; every prompt is feasible.
const IN_TIME: TtftTarget = TtftTarget {
    target_s: 0.1,
    longest_prompt_tokens: 1e6,
};

async fn read(src: &PrometheusSource, spec: &ServingPoolSpec, targets: &[ReplicaPod]) -> Reading {
    read_for(src, spec, targets, IN_TIME).await
}

async fn read_for(
    src: &PrometheusSource,
    spec: &ServingPoolSpec,
    targets: &[ReplicaPod],
    ttft_target: TtftTarget,
) -> Reading {
    src.read(Query {
        pool: "llm/smollm2",
        namespace: "llm",
        spec,
        targets,
        now_s: 0.0,
        ttft_target,
    })
    .await
    .expect("a well-formed URL reads")
}

/// Waits (polling Prometheus) until pod `a` has `samples` samples in the last `span` seconds.
async fn wait_for_history(src: &PrometheusSource, prom: &Prometheus, samples: usize, span: u32) {
    let q = format!("count_over_time(vllm:num_requests_running{{pod=\"a\"}}[{span}s])");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let got = src.query(&prom.url, &q, now, None).await;
        if let Ok(v) = &got {
            if v.first().is_some_and(|s| s.value >= samples as f64) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped {samples} samples ({got:?}); up: {:?}; its log:\n{}",
            src.query(&prom.url, "up", now, None).await,
            std::fs::read_to_string(&prom.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_from_a_real_prometheus_match_the_replicas_rates() {
    let epoch = Instant::now();
    let (prom, tb) = pool_and_strangers(epoch).await;
    let src = PrometheusSource::new(PrometheusConfig {
        max_age: Duration::from_secs(5),
        ..PrometheusConfig::default()
    })
    .unwrap();
    let spec: ServingPoolSpec = serde_yaml::from_str(&SPEC.replace("PROM", &prom.url)).unwrap();
    spec.validate().unwrap();
    // Enough history that both windows hold several samples of every replica.
    wait_for_history(&src, &prom, 7, 8).await;
    let targets = [target("a"), target("b")];

    let Reading::Fresh(load) = read(&src, &spec, &targets).await else {
        panic!("fresh figures expected");
    };
    assert_gauges_and_rates(&load);
    assert_wide_shape(&load);
    assert_prompt_bursts(&load);
    assert_latency(&load);
    // Prompts over 192 tokens (half of the (128, 256] bucket) infeasible: the half in time
    // is all of the feasible half.
    let short = TtftTarget {
        longest_prompt_tokens: 192.0,
        ..IN_TIME
    };
    let Reading::Fresh(feasible) = read_for(&src, &spec, &targets, short).await else {
        panic!("fresh figures expected");
    };
    let att = feasible.latency.ttft_attainment.unwrap();
    assert!(att > 0.9, "attainment over feasible prompts {att}");

    // The SLO's percentile, not a fixed p99: at p99 the TTFT sits in the upper bucket.
    let mut p99 = spec.clone();
    p99.slo.ttft.percentile = 99.0;
    let Reading::Fresh(load99) = read(&src, &p99, &targets).await else {
        panic!("fresh figures expected");
    };
    let t99 = load99.latency.ttft_p99_s.unwrap();
    assert!((0.4..=0.5).contains(&t99), "ttft p99 {t99}");

    assert_front_door(&src, &spec).await;

    assert_stale_readings(&src, &spec, &targets, tb).await;

    assert_errors(&src, &spec, &prom, &targets).await;
}

/// The pool's two ready pods (a, b), a pod of its Deployment that has left the ready set, and
/// two replicas that are not the pool's (another namespace, another model), each serving its
/// fixed traffic; Prometheus scraping all five. Returns Prometheus and b's task (to stop b).
async fn pool_and_strangers(epoch: Instant) -> (Prometheus, tokio::task::JoinHandle<()>) {
    let base = Shape {
        model: "smollm2",
        running: 0.0,
        waiting: 0.0,
        kv: 0.0,
        rps: 0.0,
        ttft_le: 0.1,
    };
    // a, b: the pool's ready pods. replica-l4-old: a pod of its Deployment that has left the
    // ready set (window figures only). other-ns, other-model: not the pool's.
    let a = Shape {
        running: 3.0,
        waiting: 1.0,
        kv: 0.5,
        rps: 2.0,
        ..base
    };
    let b = Shape {
        running: 1.0,
        kv: 0.25,
        rps: 1.0,
        ttft_le: 0.5,
        ..base
    };
    let old = Shape {
        running: 7.0,
        waiting: 5.0,
        kv: 0.9,
        rps: 1.0,
        ttft_le: 0.5,
        ..base
    };
    let other = Shape {
        running: 50.0,
        waiting: 50.0,
        kv: 1.0,
        rps: 40.0,
        ttft_le: 0.05,
        ..base
    };
    let other_model = Shape {
        model: "another",
        ..other
    };
    let (pa, ta) = replica(a, epoch).await;
    let (pb, tb) = replica(b, epoch).await;
    let (po, to) = replica(old, epoch).await;
    let (px, tx) = replica(other, epoch).await;
    let (pm, tm) = replica(other_model, epoch).await;
    let (pg, tg) = serve(move || gateway_exposition(epoch.elapsed().as_secs_f64())).await;
    // The other replicas serve until the test ends (their tasks are detached).
    drop((ta, to, tx, tm, tg));
    let prom = start_prometheus(&[
        (pa, "llm", "a"),
        (pb, "llm", "b"),
        (po, "llm", "replica-l4-5d8c9-xk2p1"),
        (px, "elsewhere", "a-twin"),
        (pm, "llm", "c"),
        (pg, "gateways", "sluice-gateway-0"),
    ]);
    (prom, tb)
}

/// Gauges of the ready pods only (a + b), not the departed pod's nor the other pools'; rates
/// over the windows from all of the pool's pods.
fn assert_gauges_and_rates(load: &Load) {
    // Gauges: the ready pods only (a + b), not the departed pod nor the other pools'.
    assert_eq!(load.queue.running, 4);
    assert_eq!(load.queue.waiting, 1);
    let v = &load.variants["l4"];
    assert_eq!(v.running_per_replica, 2.0);
    assert_eq!(v.waiting_per_replica, 0.5);
    assert!(
        (v.kv_cache_usage - 0.375).abs() < 1e-9,
        "{}",
        v.kv_cache_usage
    );
    // Rates over the windows: a 2/s + b 1/s + the departed pod 1/s = 4 requests/s (Prometheus
    // extrapolates increases to the window's edges, so within a scrape's worth).
    let r = load.arrivals.requests_per_s;
    assert!((3.6..=4.4).contains(&r), "arrivals {r}/s, expected ~4");
    let rs = load.arrivals.short_requests_per_s;
    assert!(
        (3.5..=4.5).contains(&rs),
        "short-window arrivals {rs}/s, expected ~4"
    );
    let pt = load.arrivals.prompt_tokens_per_s;
    assert!(
        (pt / r - 200.0).abs() < 20.0,
        "{pt} prompt tokens/s for {r} requests/s"
    );
    let ot = load.arrivals.output_tokens_per_s;
    assert!(
        (ot / r - 50.0).abs() < 5.0,
        "{ot} output tokens/s for {r} requests/s"
    );
    assert_eq!(load.arrivals.window_s, 6.0);
    assert_eq!(load.arrivals.max_prompt_tokens, 256);
}

/// The request shape's wider window: the same traffic over 8 s (less what Prometheus does
/// not extrapolate before a series' first sample), the same 200-token prompts.
fn assert_wide_shape(load: &Load) {
    let wide = load
        .arrivals
        .wide
        .as_ref()
        .expect("the shape window is read");
    assert_eq!(wide.window_s, 8.0);
    assert!(
        (2.8..=4.6).contains(&(wide.requests / 8.0)),
        "{} requests in the shape window",
        wide.requests
    );
    let mean_prompt = wide.prompt_tokens / wide.requests;
    assert!(
        (mean_prompt - 200.0).abs() < 20.0,
        "mean prompt {mean_prompt}"
    );
    assert!(wide.prompt_tokens_cv2 < 0.2, "{}", wide.prompt_tokens_cv2);
    // Outputs half short, half long: spread, from the output-length histogram.
    for cv2 in [wide.output_tokens_cv2, load.arrivals.output_tokens_cv2] {
        assert!((0.6..1.2).contains(&cv2), "output cv² {cv2}");
    }
}

/// The gateway's per-second prompt sums for the pool's model (its own `model` label, in its
/// own namespace) over the shape window: about eight seconds of 3,000 tokens each.
fn assert_prompt_bursts(load: &Load) {
    let sums = load
        .arrivals
        .per_second
        .as_ref()
        .expect("the gateway's per-second sums are read");
    let seconds = sums.seconds();
    assert!(
        (5.0..=11.0).contains(&seconds),
        "{seconds} seconds in {sums:?}"
    );
    assert!((sums.sum / seconds - 3000.0).abs() < 1.0, "{sums:?}");
    let below = sums.buckets.iter().find(|b| b.0 == 2048.0).map(|b| b.1);
    assert_eq!(below, Some(0.0), "{sums:?}");
    // The other model's 100k-token seconds are not the pool's.
    assert_eq!(sums.excess_share(4096.0), Some(0.0), "{sums:?}");
}

/// A pool of the other model, whose gateway leaves a fifth of its traffic unserved and refuses
/// a few prompts as too long: the arrival rate, once the controller folds the front door in,
/// is the gateway's 55/s, not the 40/s its replica counts; an unserved request is a late first
/// token; the refused prompts of 3,000 tokens, which some variant serves (the target's
/// longest is 50,000), join the request shape, the 200,000-token one does not. The pool
/// above, whose model has no front door, kept its replicas' figures.
async fn assert_front_door(src: &PrometheusSource, spec: &ServingPoolSpec) {
    let other = ServingPoolSpec {
        model: "another".into(),
        ..spec.clone()
    };
    let Reading::Fresh(mut load) = read(src, &other, &[target("c")]).await else {
        panic!("fresh figures expected");
    };
    assert!(load.front_door.is_some(), "the gateway's series were read");
    let r = load.arrivals.requests_per_s;
    assert!(
        (35.0..=45.0).contains(&r),
        "the replica's {r}/s before the fold"
    );
    let served_max = load.arrivals.max_prompt_tokens;
    let target = TtftTarget {
        longest_prompt_tokens: 50_000.0,
        ..IN_TIME
    };
    load.fold_front_door(other.slo.ttft.percentile / 100.0, target);
    assert!(load.front_door.is_none(), "folded once");
    let r = load.arrivals.requests_per_s;
    assert!((50.0..=60.0).contains(&r), "arrivals {r}/s, expected ~55");
    let rs = load.arrivals.short_requests_per_s;
    assert!((50.0..=60.0).contains(&rs), "short-window {rs}/s");
    // 40 served of 200 prompt tokens and 4 refused read at their bucket's midpoint, 3,072.
    let expect = (40.0 * 200.0 + 4.0 * 3072.0) / 44.0;
    let pt = load.arrivals.prompt_tokens_per_s / r;
    assert!((pt - expect).abs() < 40.0, "{pt} prompt tokens a request");
    let wide = load.arrivals.wide.as_ref().unwrap().workload();
    let wpt = wide.mean_prompt_tokens;
    assert!((wpt - expect).abs() < 40.0, "{wpt} over the wider window");
    assert_eq!(load.arrivals.max_prompt_tokens, served_max.max(4096));
    let att = load.latency.ttft_attainment.unwrap();
    assert!(
        (0.78..=0.82).contains(&att),
        "attainment {att}, expected 0.8"
    );
    let p50 = load.latency.ttft_p50_s.unwrap();
    assert!(p50 <= 0.05, "the client's median first token {p50}");
}

/// TTFT and TPOT at the SLO's percentiles, and the attainment at the target.
fn assert_latency(load: &Load) {
    // TTFT: half the requests (a's) in (0.05, 0.1], half in (0.1, 0.5]. The SLO names p50, so
    // the SLO field holds the median; p99 is near the top of the upper bucket.
    let lat = &load.latency;
    let slo_q = lat.ttft_p99_s.unwrap();
    assert_eq!(Some(slo_q), lat.ttft_p50_s);
    assert!((0.08..=0.2).contains(&slo_q), "ttft p50 {slo_q}");
    // TPOT from inter-token latency (the SLO's default p99): all in (0.02, 0.04].
    let tpot = lat.tpot_p99_s.unwrap();
    assert!((0.039..=0.04).contains(&tpot), "tpot p99 {tpot}");
    let v = &load.variants["l4"];
    assert!(v.ttft_p99_s.is_some() && v.tpot_p99_s.is_some());
    // Attainment: a's half of the first tokens came within 0.1 s.
    let att = lat.ttft_attainment.unwrap();
    assert!((0.45..=0.55).contains(&att), "attainment {att}");
}

/// A ready pod without series, then a replica Prometheus can no longer scrape (`b`, stopped
/// here): both make the reading stale, naming the pod.
async fn assert_stale_readings(
    src: &PrometheusSource,
    spec: &ServingPoolSpec,
    targets: &[ReplicaPod],
    tb: tokio::task::JoinHandle<()>,
) {
    // A ready pod Prometheus has no series for: stale, naming it.
    let with_new = [target("a"), target("b"), target("replica-l4-5d8c9-new01")];
    match read(src, spec, &with_new).await {
        Reading::Stale(why) => assert!(why.contains("replica-l4-5d8c9-new01 (no series)"), "{why}"),
        Reading::Fresh(_) => panic!("a pod without series must make the reading stale"),
    }

    // A replica Prometheus can no longer scrape: its series go stale and so does the reading.
    tb.abort();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match read(src, spec, targets).await {
            Reading::Stale(why) => {
                assert!(why.contains("b ("), "{why}");
                break;
            }
            Reading::Fresh(_) => {
                assert!(Instant::now() < deadline, "b's series never went stale");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// Prometheus's own errors come back with its words; a Prometheus that does not answer is
/// stale; a URL that is not one is an error.
async fn assert_errors(
    src: &PrometheusSource,
    spec: &ServingPoolSpec,
    prom: &Prometheus,
    targets: &[ReplicaPod],
) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let e = src.query(&prom.url, "sum(", now, None).await.unwrap_err();
    assert!(e.to_string().contains("bad_data"), "{e}");
    let mut gone = spec.clone();
    gone.signals.prometheus_url = Some("http://127.0.0.1:1".into());
    match read(src, &gone, targets).await {
        Reading::Stale(why) => assert!(why.contains("prometheus http://127.0.0.1:1"), "{why}"),
        Reading::Fresh(_) => panic!("an unreachable Prometheus cannot be fresh"),
    }
    let mut ftp = spec.clone();
    ftp.signals.prometheus_url = Some("ftp://prom".into());
    let err = src
        .read(Query {
            pool: "llm/smollm2",
            namespace: "llm",
            spec: &ftp,
            targets,
            now_s: 0.0,
            ttft_target: IN_TIME,
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ftp://prom"), "{err}");
}
