//! Local mode's own HTTP endpoint (`--listen`): `/healthz` (200 while the loop ticks, 503 once
//! it has missed three ticks) and `/metrics` with `sluice_autoscaler_local_*` series, written
//! by hand from the last tick's record and a few counters (a handful of lines does not need a
//! registry). Kept in this module so the Kubernetes controller's `sluice_autoscaler_*` series
//! stay its own.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use sluice_policy::decision::Mode;

use super::control::TickRecord;

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub ticks: u64,
    pub starts: u64,
    pub failed_starts: u64,
    pub deaths: u64,
    pub stops: u64,
    pub sigkills: u64,
    pub stale_scrapes: u64,
}

/// What the endpoint serves; the loop updates it each tick.
#[derive(Debug, Default)]
pub struct Status {
    pub last: Option<(Instant, TickRecord)>,
    pub counters: Counters,
}

pub type Shared = Arc<Mutex<Status>>;

/// Prometheus text for the status.
pub fn render(s: &Status) -> String {
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, lines: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, v) in lines {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    if let Some((_, r)) = &s.last {
        let phases = [
            ("ready", r.ready),
            ("starting", r.starting),
            ("draining", r.draining),
            ("stopping", r.stopping),
        ];
        gauge(
            "sluice_autoscaler_local_replicas",
            "Replica processes by phase.",
            &phases
                .iter()
                .map(|(p, n)| (format!("{{phase=\"{p}\"}}"), f64::from(*n)))
                .collect::<Vec<_>>(),
        );
        gauge(
            "sluice_autoscaler_local_desired_replicas",
            "Replicas the loop aims for (the policy's answer within limits and holds).",
            &[(String::new(), f64::from(r.desired))],
        );
        gauge(
            "sluice_autoscaler_local_decided_replicas",
            "Replicas the policy asked for.",
            &[(String::new(), f64::from(r.decided))],
        );
        gauge(
            "sluice_autoscaler_local_arrival_rate",
            "Requests per second over the long window, as the policy read it (the gateway's front door when larger).",
            &[(String::new(), r.rate)],
        );
        gauge(
            "sluice_autoscaler_local_queue_waiting",
            "Requests waiting on the replicas and the gateway.",
            &[(String::new(), r.waiting as f64)],
        );
        gauge(
            "sluice_autoscaler_local_panic",
            "1 while the policy is in panic mode.",
            &[(String::new(), if r.mode == Mode::Panic { 1.0 } else { 0.0 })],
        );
    }
    let c = s.counters;
    for (name, help, v) in [
        ("ticks", "Control loop ticks.", c.ticks),
        ("replica_starts", "Replica processes started.", c.starts),
        (
            "replica_failed_starts",
            "Replicas that exited or timed out before ready.",
            c.failed_starts,
        ),
        (
            "replica_deaths",
            "Replicas that exited while ready or draining, unasked.",
            c.deaths,
        ),
        ("replica_stops", "Replicas stopped by the loop.", c.stops),
        ("replica_sigkills", "Stops that needed SIGKILL.", c.sigkills),
        (
            "stale_scrapes",
            "Target scrapes that failed (stale metrics).",
            c.stale_scrapes,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP sluice_autoscaler_local_{name}_total {help}\n# TYPE sluice_autoscaler_local_{name}_total counter\nsluice_autoscaler_local_{name}_total {v}"
        );
    }
    out
}

/// Whether the loop ticked within three tick periods (or has not had time to tick yet).
pub fn healthy(s: &Status, tick: Duration, started: Instant, now: Instant) -> bool {
    let last = s.last.as_ref().map_or(started, |(t, _)| *t);
    now.duration_since(last) <= tick * 3 + Duration::from_secs(1)
}

/// Serves `/healthz` and `/metrics` on `listener` until the task is aborted.
pub async fn serve(listener: TcpListener, status: Shared, tick: Duration) {
    let started = Instant::now();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let status = status.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (code, body) = {
                    let s = status.lock().unwrap_or_else(|e| e.into_inner());
                    match req.uri().path() {
                        "/healthz" if healthy(&s, tick, started, Instant::now()) => {
                            (StatusCode::OK, "ok\n".to_string())
                        }
                        "/healthz" => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the control loop has stopped ticking\n".to_string(),
                        ),
                        "/metrics" => (StatusCode::OK, render(&s)),
                        _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
                    }
                };
                let mut resp = Response::new(Full::new(Bytes::from(body)));
                *resp.status_mut() = code;
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Binds `addr` (so a taken port is an error at start, not later).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, super::LocalError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| super::LocalError::Io {
            what: format!("binding --listen {addr}"),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TickRecord {
        TickRecord {
            t: 5.0,
            decided: 3,
            desired: 3,
            ready: 2,
            starting: 1,
            draining: 0,
            stopping: 0,
            waiting: 7,
            running: 4,
            held: 0,
            rate: 2.5,
            short_rate: 4.0,
            busiest_second_tokens: 0.0,
            max_prompt_tokens: 0,
            mode: Mode::Panic,
            stale: 0,
            announced: vec![],
            reasons: vec![],
        }
    }

    #[test]
    fn metrics_render_the_last_tick_and_the_counters() {
        let s = Status {
            last: Some((Instant::now(), record())),
            counters: Counters {
                starts: 3,
                ..Counters::default()
            },
        };
        let text = render(&s);
        let samples = crate::scrape::exposition::parse(&text).unwrap();
        let get = |name: &str, label: Option<&str>| {
            samples
                .iter()
                .find(|x| x.name == name && label.is_none_or(|l| x.label("phase") == Some(l)))
                .map(|x| x.value)
        };
        assert_eq!(
            get("sluice_autoscaler_local_replicas", Some("ready")),
            Some(2.0)
        );
        assert_eq!(
            get("sluice_autoscaler_local_replicas", Some("starting")),
            Some(1.0)
        );
        assert_eq!(
            get("sluice_autoscaler_local_desired_replicas", None),
            Some(3.0)
        );
        assert_eq!(get("sluice_autoscaler_local_panic", None), Some(1.0));
        assert_eq!(
            get("sluice_autoscaler_local_replica_starts_total", None),
            Some(3.0)
        );
        // Before the first tick: counters only, still valid exposition.
        let empty = render(&Status::default());
        assert!(crate::scrape::exposition::parse(&empty).is_ok());
        assert!(!empty.contains("sluice_autoscaler_local_replicas{"));
    }

    #[test]
    fn health_follows_the_ticks() {
        let t0 = Instant::now();
        let tick = Duration::from_secs(1);
        let mut s = Status::default();
        assert!(healthy(&s, tick, t0, t0 + Duration::from_secs(2)));
        assert!(!healthy(&s, tick, t0, t0 + Duration::from_secs(10)));
        s.last = Some((t0 + Duration::from_secs(9), record()));
        assert!(healthy(&s, tick, t0, t0 + Duration::from_secs(10)));
    }

    #[tokio::test]
    async fn serves_metrics_over_http_and_a_taken_port_is_an_error() {
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let status: Shared = Arc::default();
        status.lock().unwrap().last = Some((Instant::now(), record()));
        let server = tokio::spawn(serve(l, status.clone(), Duration::from_secs(1)));
        let mut scraper = crate::scrape::Scraper::new(crate::scrape::ScrapeConfig::default());
        let o = scraper
            .scrape(
                &[crate::scrape::Endpoint::gateway(&format!("http://{addr}"))],
                0.0,
            )
            .await;
        assert!(!o.targets[0].is_stale(), "{:?}", o.targets[0].error);
        // A taken port is an error that names the flag.
        let e = bind(addr).await.unwrap_err().to_string();
        assert!(e.contains("--listen"), "{e}");
        server.abort();
    }
}
