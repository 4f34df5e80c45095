//! Each model's queue in the gateway (routing mode): a generation request waits here until a
//! replica serving its model has room, and only then is it bound to one (late binding). A
//! replica that becomes ready, or one whose load drops, takes the backlog at once: the queue is
//! woken by every change that may make room (a replica added or passing its health check, a
//! poll, a request ending), with a poll-interval timer as a floor.
//!
//! The order among waiting requests is the admission queue's own (`crate::admission`): priority
//! classes, then start-time fair queuing between tenants, a bounded queue that sheds sheddable
//! requests for normal ones. Each model queue *is* an [`Admission`] with one permit: its holder
//! is the head of the line, which waits for a replica with room, binds to it and passes the
//! permit on, so the next request in fair order becomes the head. One owner per rule: the
//! ordering lives in `admission`, room in `load`, the choice among replicas with room in
//! `policy`.
//!
//! A request ends its wait in one of four ways besides being bound:
//! - its deadline passes: [`RouteError::DeadlineInQueue`] (stage `queue`);
//! - no replica of its model has been ready for `hold_timeout` since it arrived:
//!   [`RouteError::HoldTimeout`] (a pool at zero that did not come back in time);
//! - replicas are ready but none had room for `queue_timeout`: an admission `QueueTimeout`;
//! - the queue is full, or it is shed: the admission errors.
//!
//! With [`Binding::Early`] a replica has "room" whenever it is below `replica_max_in_flight`,
//! which is dispatch-at-once: the request waits on the replica instead. Either way a request for
//! a known model with no ready replica is held here.
//!
//! Metrics per model: `sluice_gateway_queue_depth{priority,model}`,
//! `sluice_gateway_queue_held{model}` (requests waiting while no ready replica serves the model),
//! `sluice_gateway_queue_oldest_wait_seconds{model}`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::admission::{Admission, AdmissionConfig, Permit};
use crate::metrics::QueueMetrics;
use crate::router::bounds;
use crate::router::dispatch::{ProxyRequest, RouteError};
use crate::router::replica::{InFlightHere, Replica};
use crate::router::{Binding, Router, RouterConfig};
use crate::tenants::Tenant;

/// Who a queued request is, for the queue's order.
#[derive(Debug, Clone)]
pub struct QueueClass {
    /// Higher first; negative is sheddable.
    pub priority: i32,
    pub tenant: Arc<Tenant>,
}

/// One model's queue.
#[derive(Debug)]
pub struct ModelQueue {
    model: String,
    /// The order of the line; its one permit marks the head.
    order: Admission,
    /// Every waiting request's arrival, oldest first.
    waiting: Mutex<BTreeSet<(Instant, u64)>>,
    next_id: AtomicU64,
    /// The head's last finding: no ready replica serves the model.
    held: AtomicBool,
    metrics: QueueMetrics,
}

/// What the head of a queue found among the replicas.
enum Found {
    Bound(Arc<Replica>),
    /// No ready replica serves the model.
    Held,
    /// Ready replicas, none with room.
    Full,
    /// Every ready replica is at `replica_max_in_flight`: refused at once, as without a queue.
    AtCap,
}

impl ModelQueue {
    fn new(model: &str, cfg: &RouterConfig, metrics: QueueMetrics) -> Self {
        Self {
            model: model.to_string(),
            order: Admission::new(AdmissionConfig {
                max_in_flight: 1,
                max_queue: cfg.max_queue,
                // The router ends every wait itself (`Router::verdict`); this is a backstop.
                queue_timeout: cfg.queue_timeout.max(cfg.hold_timeout) + Duration::from_secs(3600),
                late_after: cfg.queue_late_after,
            }),
            waiting: Mutex::default(),
            next_id: AtomicU64::new(0),
            held: AtomicBool::new(false),
            metrics,
        }
    }

    /// Requests waiting now.
    pub fn depth(&self) -> usize {
        self.waiting.lock().unwrap().len()
    }

    /// Sets the held and oldest-wait gauges from the queue as it is now.
    fn publish(&self) {
        let (depth, oldest) = {
            let w = self.waiting.lock().unwrap();
            (w.len(), w.first().map(|(t, _)| t.elapsed()))
        };
        let held = if self.held.load(Ordering::Relaxed) {
            depth
        } else {
            0
        };
        self.metrics
            .held
            .with_label_values(&[&self.model])
            .set(held as i64);
        self.metrics
            .oldest(&self.model)
            .set(oldest.unwrap_or_default().as_secs_f64());
    }
}

/// A request's place in its queue's figures, from arrival until bound or refused.
struct Waiting<'a> {
    queue: &'a ModelQueue,
    key: (Instant, u64),
    priority: String,
}

impl<'a> Waiting<'a> {
    fn new(queue: &'a ModelQueue, priority: i32, at: Instant) -> Self {
        let key = (at, queue.next_id.fetch_add(1, Ordering::Relaxed));
        queue.waiting.lock().unwrap().insert(key);
        let priority = priority.to_string();
        queue.metrics.depth.of_model(&priority, &queue.model).inc();
        queue.publish();
        Self {
            queue,
            key,
            priority,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let q = self.queue;
        q.waiting.lock().unwrap().remove(&self.key);
        q.metrics.depth.of_model(&self.priority, &q.model).dec();
        q.publish();
    }
}

impl Router {
    /// The queue of `model`, created on first use.
    pub fn queue(&self, model: &str) -> Arc<ModelQueue> {
        let mut queues = self.queues.lock().unwrap();
        queues
            .entry(model.to_string())
            .or_insert_with(|| {
                Arc::new(ModelQueue::new(
                    model,
                    &self.cfg,
                    self.metrics.queue.clone(),
                ))
            })
            .clone()
    }

    /// Waits in the model's queue until a replica has room for `req` (see the module doc);
    /// returns the request counted in flight there.
    pub async fn bind(
        &self,
        req: &ProxyRequest,
        class: &QueueClass,
    ) -> Result<InFlightHere, RouteError> {
        let q = self.queue(&req.model);
        let arrived = Instant::now();
        let _waiting = Waiting::new(&q, class.priority, arrived);
        let mut admit = std::pin::pin!(q.order.admit(&class.tenant, class.priority));
        let mut head: Option<Permit> = None;
        loop {
            let notified = self.wake.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if head.is_some() {
                match self.find_room(req) {
                    // The in-flight count is taken before the permit passes on.
                    Found::Bound(r) => return Ok(r.begin()),
                    Found::AtCap => return Err(RouteError::AllAtCap(req.model.clone())),
                    Found::Held => q.held.store(true, Ordering::Relaxed),
                    Found::Full => q.held.store(false, Ordering::Relaxed),
                }
                q.publish();
            }
            if let Some(e) = self.verdict(req, arrived) {
                return Err(e);
            }
            let next = self.next_check(req, arrived, head.is_some());
            tokio::select! {
                r = &mut admit, if head.is_none() => head = Some(r.map_err(RouteError::Queue)?),
                _ = &mut notified, if head.is_some() => {}
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }

    /// The replica the head of its model's queue, `req`, goes to now, or why none: only
    /// replicas that take its prompt count (`bounds::taking`).
    fn find_room(&self, req: &ProxyRequest) -> Found {
        let now = std::time::Instant::now();
        let all = self.replicas();
        let ready: Vec<&Arc<Replica>> = all
            .values()
            .filter(|r| r.serves(&req.model) && r.eligible(now))
            .collect();
        if ready.is_empty() {
            return Found::Held;
        }
        let ready = bounds::taking(ready, &req.model, req.prompt_tokens);
        let cap = self.cfg.replica_max_in_flight;
        let open: Vec<&Arc<Replica>> = ready
            .iter()
            .copied()
            .filter(|r| match self.cfg.binding {
                Binding::Early => r.in_flight() < cap,
                Binding::Late => r.has_room(now, self.cfg.stale_after, cap),
            })
            .collect();
        if open.is_empty() {
            return if ready.iter().all(|r| r.in_flight() >= cap) {
                Found::AtCap
            } else {
                Found::Full
            };
        }
        Found::Bound(self.choose(&open, req.key, now).0)
    }

    /// Why a request waiting since `arrived` must stop waiting now, if it must.
    fn verdict(&self, req: &ProxyRequest, arrived: Instant) -> Option<RouteError> {
        let now = Instant::now();
        if req.deadline.is_some_and(|d| now >= d) {
            // Counted once, where the error reaches the client (`api::scope`).
            return Some(RouteError::DeadlineInQueue);
        }
        let waited = now.duration_since(arrived);
        let held = !self.ready_for(&req.model, std::time::Instant::now());
        if held && waited >= self.cfg.hold_timeout {
            return Some(RouteError::HoldTimeout {
                model: req.model.clone(),
                waited,
            });
        }
        if !held && waited >= self.cfg.queue_timeout {
            return Some(RouteError::Queue(
                crate::admission::AdmissionError::QueueTimeout { waited },
            ));
        }
        None
    }

    /// When a waiting request next looks again: at its deadline or a timeout, and the head at
    /// least every poll interval (an ejection that ends, metrics that go stale, are changes
    /// without an event).
    fn next_check(&self, req: &ProxyRequest, arrived: Instant, head: bool) -> Instant {
        let now = Instant::now();
        let mut times = vec![
            arrived + self.cfg.queue_timeout,
            arrived + self.cfg.hold_timeout,
        ];
        times.extend(req.deadline);
        if head {
            times.push(now + self.cfg.poll_interval);
        }
        times
            .into_iter()
            .filter(|&t| t > now)
            .min()
            .unwrap_or(now + self.cfg.poll_interval)
    }
}
