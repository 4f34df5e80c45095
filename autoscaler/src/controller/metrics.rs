//! The controller's own metrics (`sluice_autoscaler_*`) and its `/metrics` + `/healthz` server.
//!
//! `/healthz` answers 200 while the control loop has run recently (as leader or standby), so a
//! wedged loop gets the pod restarted; `sluice_autoscaler_leader` says which replica acts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Every metric the controller exports, registered in one registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub desired: IntGaugeVec,
    pub current: IntGaugeVec,
    pub decisions: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_duration: HistogramVec,
    pub scale_actions: IntCounterVec,
    pub leader: IntGauge,
    started: Instant,
    /// Milliseconds since `started` at the loop's last turn.
    heartbeat_ms: Arc<AtomicU64>,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let pv = &["namespace", "pool", "variant"];
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let desired = gauges(
            "sluice_autoscaler_desired_replicas",
            "Replicas the controller wants per variant",
            pv,
        );
        let current = gauges(
            "sluice_autoscaler_current_replicas",
            "The Deployment's spec.replicas per variant",
            pv,
        );
        let decisions = counters(
            "sluice_autoscaler_decisions_total",
            "Policy decisions, by reason they carried",
            &["namespace", "pool", "reason"],
        );
        let reconcile_errors = counters(
            "sluice_autoscaler_reconcile_errors_total",
            "Failed reconciles, by reason",
            &["namespace", "pool", "reason"],
        );
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "sluice_autoscaler_reconcile_duration_seconds",
                "Time per reconcile",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["namespace", "pool"],
        )
        .expect("valid metric");
        let scale_actions = counters(
            "sluice_autoscaler_scale_actions_total",
            "Deployments scaled, by direction",
            &["namespace", "pool", "variant", "direction"],
        );
        let leader = IntGauge::new(
            "sluice_autoscaler_leader",
            "1 while this replica holds the lease",
        )
        .expect("valid metric");
        for c in [
            Box::new(desired.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(current.clone()),
            Box::new(decisions.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(reconcile_duration.clone()),
            Box::new(scale_actions.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Metrics {
            registry,
            desired,
            current,
            decisions,
            reconcile_errors,
            reconcile_duration,
            scale_actions,
            leader,
            started: Instant::now(),
            heartbeat_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The loop turned: `/healthz` stays green.
    pub fn beat(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.heartbeat_ms.store(ms, Ordering::Relaxed);
    }

    fn since_beat(&self) -> Duration {
        let now = self.started.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.heartbeat_ms.load(Ordering::Relaxed)))
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    stale_after: Duration,
}

/// `/metrics` and `/healthz`; `/healthz` fails once the loop has not turned for `stale_after`.
pub fn app(metrics: Metrics, stale_after: Duration) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(healthz))
        .with_state(AppState {
            metrics,
            stale_after,
        })
}

async fn render(State(s): State<AppState>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    let since = s.metrics.since_beat();
    if since <= s.stale_after {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("control loop idle for {:.0} s\n", since.as_secs_f64()),
        )
    }
}
