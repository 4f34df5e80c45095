//! [`RequestScope`]: what lives exactly as long as one generation request — its in-flight
//! count (drain waits on it), its [`Gate`] (admission permit and rate reservation, released
//! and refunded when the scope ends), and the one log line and metrics written when it ends:
//! a routed request's demand series too ([`crate::demand`]), from its arrival to whether the
//! fleet served it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::gate::Gate;
use crate::error::ApiError;
use crate::metrics::GatewayMetrics;

/// Requests being answered; drain waits for zero.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

impl InFlight {
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self.clone())
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Resolves when nothing is in flight.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Debug)]
pub struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Outcome {
    status: u16,
    /// Why it failed (`ApiError::metric_label`), or `replica_status` for a replica's answer
    /// passed on; empty for a success.
    reason: &'static str,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl Outcome {
    fn new(status: u16, reason: &'static str) -> Self {
        Self {
            status,
            reason,
            prompt_tokens: 0,
            completion_tokens: 0,
        }
    }
}

pub struct RequestScope {
    pub id: String,
    pub tenant: String,
    /// When the request must be done (`X-Sluice-Deadline-Ms` or the tenant's default).
    pub deadline: Option<Instant>,
    route: &'static str,
    started: Instant,
    first_token: Option<Instant>,
    outcome: Option<Outcome>,
    metrics: GatewayMetrics,
    gate: Option<Gate>,
    /// The model this request is demand for, once it passed its tenant's limits on its way to
    /// a replica ([`RequestScope::arrived`]).
    demand: Option<String>,
    _in_flight: InFlightGuard,
}

impl std::fmt::Debug for RequestScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestScope")
            .field("id", &self.id)
            .field("tenant", &self.tenant)
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

impl RequestScope {
    pub fn new(
        id: String,
        tenant: String,
        route: &'static str,
        started: Instant,
        metrics: GatewayMetrics,
        in_flight: InFlightGuard,
    ) -> Self {
        metrics.in_flight.with_label_values(&[&tenant]).inc();
        Self {
            id,
            tenant,
            deadline: None,
            route,
            started,
            first_token: None,
            outcome: None,
            metrics,
            gate: None,
            demand: None,
            _in_flight: in_flight,
        }
    }

    /// When the request was received.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }

    /// The request, bound for a replica of `model` with a prompt of about `prompt_tokens`,
    /// passed its tenant's limits: from here it is demand for the model, counted as arrived,
    /// in its second's prompt burst, and at its end as served or not.
    pub fn arrived(&mut self, model: &str, prompt_tokens: u64) {
        self.metrics.prompt_bursts.record(model, prompt_tokens);
        self.metrics.demand.arrived(model);
        self.demand = Some(model.to_string());
    }

    /// Holds the request's gate until the request ends.
    pub fn hold(&mut self, gate: Gate) {
        self.gate = Some(gate);
    }

    pub fn first_token(&mut self) {
        if self.first_token.is_none() {
            let now = Instant::now();
            self.first_token = Some(now);
            let seconds = (now - self.started).as_secs_f64();
            self.metrics
                .ttft
                .with_label_values(&[self.route])
                .observe(seconds);
            if let Some(model) = &self.demand {
                self.metrics.demand.first_token(model, seconds);
            }
        }
    }

    pub fn succeed(&mut self, completion_tokens: usize, prompt_tokens: usize) {
        self.outcome = Some(Outcome {
            prompt_tokens,
            completion_tokens,
            ..Outcome::new(200, "")
        });
    }

    pub fn fail(&mut self, e: &ApiError) {
        self.metrics
            .rejections
            .with_label_values(&[e.metric_label()])
            .inc();
        if let ApiError::DeadlineExceeded { stage } = e {
            self.metrics
                .deadline_exceeded
                .with_label_values(&[stage])
                .inc();
        }
        self.outcome = Some(Outcome::new(e.status().as_u16(), e.metric_label()));
    }

    /// Ended with a replica's answer passed on as it came, status and all (the gateway does
    /// not parse it, so token counts are unknown).
    pub fn ended(&mut self, status: u16) {
        self.outcome = Some(Outcome::new(status, "replica_status"));
    }

    /// The client closed the connection (nginx's 499).
    pub fn client_gone(&mut self) {
        self.outcome.get_or_insert(Outcome::new(499, "client_gone"));
    }
}

impl Drop for RequestScope {
    fn drop(&mut self) {
        // A scope dropped without an outcome was cancelled: the client went away.
        let o = self.outcome.unwrap_or(Outcome::new(499, "client_gone"));
        if let (Some(model), None) = (&self.demand, self.first_token) {
            self.metrics
                .demand
                .ended_unserved(model, o.status, o.reason);
        }
        let elapsed = self.started.elapsed();
        self.metrics
            .e2e
            .with_label_values(&[self.route])
            .observe(elapsed.as_secs_f64());
        self.metrics
            .requests
            .with_label_values(&[self.route, &o.status.to_string()])
            .inc();
        self.metrics
            .in_flight
            .with_label_values(&[&self.tenant])
            .dec();
        if let Some(mut gate) = self.gate.take() {
            gate.generated(o.completion_tokens);
        }
        tracing::info!(
            request_id = %self.id,
            tenant = %self.tenant,
            route = self.route,
            status = o.status,
            prompt_tokens = o.prompt_tokens,
            completion_tokens = o.completion_tokens,
            ttft_ms = self.first_token.map(|t| (t - self.started).as_millis() as u64),
            duration_ms = elapsed.as_millis() as u64,
            "request"
        );
    }
}
