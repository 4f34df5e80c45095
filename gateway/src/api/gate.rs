//! [`Gate`]: what a generation request holds from the moment it passes the tenant's limits
//! until it ends — the rate-limit reservation and the admission permit. [`Gate::enter`] takes
//! both (the rate limit first: a request over its tenant's budget never queues) and records the
//! queue's depth and wait; dropping the gate frees the permit and refunds what the request did
//! not use. The request's scope holds it, so it ends when the response body ends or the client
//! goes away.

use std::sync::Arc;
use std::time::Instant;

use super::scope::RequestScope;
use crate::admission::{Admission, Permit};
use crate::error::ApiError;
use crate::metrics::GatewayMetrics;
use crate::rate_limit::{RateLimiter, Reservation};
use crate::tenants::Tenant;

/// What a request asks of the gate.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    pub priority: i32,
    /// Tokens reserved from the tenant's budget: the prompt plus what the request may generate.
    pub reserve_tokens: u64,
    /// The prompt's tokens when known. With them, the unused part of the reservation is
    /// refunded when the request ends; without (a proxied request, whose answer the gateway does
    /// not parse), the whole reservation stands as the request's cost.
    pub prompt_tokens: Option<u64>,
    /// For a request routed to a replica, its prompt's tokens as the gateway estimates them
    /// (bytes / 4): what it adds to its model's second ([`crate::prompt_bursts`]) when it
    /// arrives as demand ([`RequestScope::arrived`]). `None` for a
    /// request this process serves itself: a replica behind a gateway sees its share of a
    /// burst, which summed with the gateway's count would count the burst twice.
    pub burst_tokens: Option<u64>,
}

/// The rate reservation and admission permit of one request, held until it ends.
#[derive(Debug)]
pub struct Gate {
    reservation: Option<Reservation>,
    prompt_tokens: Option<u64>,
    completion_tokens: u64,
    _permit: Permit,
}

/// The queue-depth gauge of one priority, raised while a request waits (a request whose client
/// leaves while queued lowers it too).
struct Waiting<'a> {
    metrics: &'a GatewayMetrics,
    priority: &'a str,
}

impl<'a> Waiting<'a> {
    fn new(metrics: &'a GatewayMetrics, priority: &'a str) -> Self {
        metrics.queue_depth.with_label_values(&[priority]).inc();
        Self { metrics, priority }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.metrics
            .queue_depth
            .with_label_values(&[self.priority])
            .dec();
    }
}

impl Gate {
    /// Takes `ask.reserve_tokens` from the tenant's rate limits, counts a routed request as
    /// arrived for `model` in its scope (a request over its budget is no demand), then waits
    /// in the admission queue.
    pub async fn enter(
        limiter: &RateLimiter,
        admission: &Admission,
        scope: &mut RequestScope,
        (tenant, model): (&Arc<Tenant>, &str),
        ask: Ask,
    ) -> Result<Gate, ApiError> {
        let reservation = limiter.check(tenant, ask.reserve_tokens, Instant::now())?;
        if let Some(tokens) = ask.burst_tokens {
            scope.arrived(model, tokens);
        }
        let metrics = scope.metrics();
        let priority = ask.priority.to_string();
        let permit = {
            let _waiting = Waiting::new(metrics, &priority);
            admission.admit(tenant, ask.priority).await?
        };
        metrics
            .queue_wait
            .with_label_values(&[&priority])
            .observe(permit.waited().as_secs_f64());
        Ok(Gate {
            reservation: Some(reservation),
            prompt_tokens: ask.prompt_tokens,
            completion_tokens: 0,
            _permit: permit,
        })
    }

    /// Records the tokens generated, for the refund when the gate is dropped.
    pub fn generated(&mut self, completion_tokens: usize) {
        self.completion_tokens = completion_tokens as u64;
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let (Some(r), Some(prompt)) = (self.reservation.take(), self.prompt_tokens) else {
            // Nothing to refund: the reservation stands as the request's cost.
            return;
        };
        let unused = r.tokens().saturating_sub(prompt + self.completion_tokens);
        r.refund(unused, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::AdmissionConfig;
    use crate::api::scope::InFlight;
    use crate::tenants::Tenants;

    fn limited() -> (Tenants, Arc<Tenant>) {
        let dir = std::env::temp_dir().join(format!("sluice-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys.toml");
        std::fs::write(
            &path,
            "[[tenants]]\nname = \"t\"\ntokens_per_minute = 1000\n\
             [[keys]]\nkey = \"sk-gate-test-0123456789\"\ntenant = \"t\"\n",
        )
        .unwrap();
        let tenants = Tenants::from_file(&path).unwrap();
        let t = tenants.get("t").unwrap().clone();
        (tenants, t)
    }

    #[tokio::test]
    async fn dropping_the_stream_that_holds_the_gate_frees_permit_and_refunds() {
        let (tenants, tenant) = limited();
        let limiter = RateLimiter::new(&tenants);
        let admission = Admission::new(AdmissionConfig {
            max_in_flight: 1,
            max_queue: 4,
            queue_timeout: std::time::Duration::from_secs(1),
            late_after: None,
        });
        let metrics = GatewayMetrics::register(&prometheus::Registry::new()).unwrap();
        let in_flight = Arc::new(InFlight::default());
        let mut scope = RequestScope::new(
            "id".into(),
            "t".into(),
            "/v1/completions",
            std::time::Instant::now(),
            metrics.clone(),
            in_flight.enter(),
        );
        let ask = Ask {
            priority: 0,
            reserve_tokens: 900,
            prompt_tokens: Some(100),
            burst_tokens: None,
        };
        let mut gate = Gate::enter(&limiter, &admission, &mut scope, (&tenant, "m"), ask)
            .await
            .unwrap();
        assert_eq!(admission.in_flight(), 1);
        assert_eq!(metrics.queue_depth.with_label_values(&["0"]).get(), 0);
        // The budget is spent while the request runs.
        let more = Ask {
            reserve_tokens: 200,
            ..ask
        };
        assert!(matches!(
            Gate::enter(&limiter, &admission, &mut scope, (&tenant, "m"), more).await,
            Err(ApiError::TooManyRequests { .. })
        ));
        gate.generated(50);
        // A response body owns the gate; the client leaving drops the body.
        let body = futures_util::stream::once(async move {
            let _held = gate;
            Ok::<_, std::io::Error>(axum::body::Bytes::new())
        });
        drop(axum::body::Body::from_stream(body));
        assert_eq!(admission.in_flight(), 0);
        // 900 reserved, 150 used: 750 refunded, so 850 are free again.
        let again = Ask {
            reserve_tokens: 800,
            ..ask
        };
        let g = Gate::enter(&limiter, &admission, &mut scope, (&tenant, "m"), again).await;
        assert!(g.is_ok(), "{g:?}");
    }
}
