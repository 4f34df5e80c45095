//! The admission queue in front of saturated backends: who gets the next free slot.
//!
//! The backends can run `max_in_flight` requests at once; beyond that, requests wait here rather
//! than pile up in the engines, where they would all slow down together and be impossible to
//! shed. While a slot is free a request is admitted at once. Otherwise it queues and is ordered
//!
//! 1. by **priority class** (the request's `priority`, higher first), and
//! 2. within a class, by **weighted fair share** between tenants — start-time fair queuing: a
//!    tenant's next request gets the virtual start `max(V, tenant's last finish)` and the finish
//!    `start + 1/weight`; the smallest finish goes first, FIFO within a tenant, and `V` (the
//!    class's virtual time) moves to the start of each request admitted. A tenant with weight 3
//!    thus gets three permits for every one of a weight-1 tenant while both are backlogged, and a
//!    tenant that arrives while another floods starts at `V`, not behind the flood.
//!
//! 3. With `late_after` set (a little below a deployment's TTFT target), a waiter that has waited longer than
//!    it yields, within its class, to the waiters that have not: they are ordered among
//!    themselves as above, and the late ones, in the same order, once none is on time. Under
//!    an overload the queue then serves requests that can still meet the target instead of
//!    making every later one late too (a backlog served in arrival order delays each arrival
//!    after it by the whole backlog); the late ones are still served, first among themselves,
//!    as soon as a slot finds no on-time waiter, or they reach `queue_timeout`.
//!
//! A class's virtual clock and tags are forgotten when its queue empties: fairness is about
//! sharing contention, so a tenant is not charged later for what it used while nobody waited.
//! Requests admitted without queueing take no tags for the same reason.
//!
//! A tenant at its `max_concurrent` is skipped (its requests keep their tags and go first once
//! one of its permits is released). When the queue is full, a non-sheddable newcomer
//! (`priority >= 0`) evicts the lowest-priority, most recently queued *sheddable* request
//! (`priority < 0`, the Gateway API Inference Extension's convention); a sheddable newcomer never
//! evicts — churning one sheddable request for another only throws away the time the first one
//! waited — and is refused like any newcomer that finds the queue full and nothing to shed.
//!
//! Every state change happens under one `std::sync::Mutex` (never held across an `.await`), and
//! each waiter owns a `oneshot` through which it receives its permit or its eviction. Granting
//! happens eagerly, inside the release of a permit or the removal of a waiter, so there is no
//! polling and no dispatcher task. Invariant: whenever a slot is free, no eligible request is
//! queued.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::tenants::Tenant;

/// The `Retry-After` hint of [`AdmissionError::QueueFull`]. A full queue drains at the backends'
/// completion rate, typically several requests a second, so a second is long enough not to hammer
/// the gateway and short enough not to idle a client once it has drained.
pub const QUEUE_FULL_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Sizes and timeouts of the admission queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Requests the backends run at once; permits beyond this queue. Must be ≥ 1.
    pub max_in_flight: usize,
    /// Requests that may wait; a newcomer beyond this sheds a sheddable one or is refused.
    pub max_queue: usize,
    /// The longest a request waits before it is refused with [`AdmissionError::QueueTimeout`].
    pub queue_timeout: Duration,
    /// Waiters queued longer than this yield to those that are not (see the module doc);
    /// `None`: fair order only.
    pub late_after: Option<Duration>,
}

/// Why a request was not admitted: each maps to an OpenAI-style 429.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// The backends are saturated and the queue is full of requests it would not shed.
    #[error(
        "The server is overloaded and its request queue is full. Please try again in {}s.",
        retry_after.as_secs_f64().ceil()
    )]
    QueueFull { retry_after: Duration },
    /// The request waited `queue_timeout` without a slot coming free for it.
    #[error(
        "The server is overloaded: the request waited {:.1}s in the queue without being \
         admitted. Please try again later.",
        waited.as_secs_f64()
    )]
    QueueTimeout { waited: Duration },
    /// A sheddable request evicted from the full queue by a more important one.
    #[error(
        "The request was shed from the queue to make room for higher-priority requests. \
         Please try again later."
    )]
    Shed,
}

impl AdmissionError {
    /// The reason label for a rejection counter.
    pub fn metric_label(&self) -> &'static str {
        match self {
            AdmissionError::QueueFull { .. } => "queue_full",
            AdmissionError::QueueTimeout { .. } => "queue_timeout",
            AdmissionError::Shed => "shed",
        }
    }

    /// The `Retry-After` to send, where the queue has one to offer.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AdmissionError::QueueFull { retry_after } => Some(*retry_after),
            AdmissionError::QueueTimeout { .. } | AdmissionError::Shed => None,
        }
    }
}

/// What a waiter receives: its permit, or its eviction.
type Grant = Result<Permit, AdmissionError>;

struct Waiter {
    id: u64,
    tenant: Arc<Tenant>,
    start: f64,
    finish: f64,
    enqueued: Instant,
    tx: oneshot::Sender<Grant>,
}

/// One tenant's waiters in one class, FIFO (so their finish tags increase front to back).
#[derive(Default)]
struct TenantQueue {
    waiters: VecDeque<Waiter>,
    /// The finish tag of the tenant's latest request in this class.
    last_finish: f64,
}

/// One priority class. Exists only while it has waiters.
#[derive(Default)]
struct Class {
    vtime: f64,
    tenants: HashMap<String, TenantQueue>,
    len: usize,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    /// Permits held per tenant name; absent = 0.
    running: HashMap<String, usize>,
    classes: BTreeMap<i32, Class>,
    queued: usize,
    next_id: u64,
}

struct Shared {
    cfg: AdmissionConfig,
    state: Mutex<State>,
}

impl Shared {
    /// Every update is a few assignments that cannot panic halfway in a way that matters more
    /// than refusing all traffic would, so a poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn running_of(&self, tenant: &str) -> usize {
        self.running.get(tenant).copied().unwrap_or(0)
    }

    fn below_cap(&self, tenant: &Tenant) -> bool {
        tenant
            .max_concurrent
            .is_none_or(|max| self.running_of(&tenant.name) < max)
    }

    fn acquire(&mut self, tenant: &str) {
        self.in_flight += 1;
        *self.running.entry(tenant.to_string()).or_insert(0) += 1;
    }

    fn release(&mut self, tenant: &str) {
        self.in_flight -= 1;
        if let Some(n) = self.running.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.running.remove(tenant);
            }
        }
    }

    fn enqueue(
        &mut self,
        tenant: &Arc<Tenant>,
        priority: i32,
        enqueued: Instant,
    ) -> (u64, oneshot::Receiver<Grant>) {
        let id = self.next_id;
        self.next_id += 1;
        // `Tenants` guarantees a finite weight > 0; a hand-built tenant without one is treated
        // as weight 1 rather than given an infinite or negative share.
        let weight = if tenant.weight.is_finite() && tenant.weight > 0.0 {
            tenant.weight
        } else {
            1.0
        };
        let class = self.classes.entry(priority).or_default();
        let queue = class.tenants.entry(tenant.name.clone()).or_default();
        let start = class.vtime.max(queue.last_finish);
        let finish = start + 1.0 / weight;
        queue.last_finish = finish;
        let (tx, rx) = oneshot::channel();
        queue.waiters.push_back(Waiter {
            id,
            tenant: tenant.clone(),
            start,
            finish,
            enqueued,
            tx,
        });
        class.len += 1;
        self.queued += 1;
        (id, rx)
    }

    /// The class, tenant and place in the tenant's queue of the next waiter to admit: the
    /// highest class with an eligible waiter, and in it the eligible tenant whose candidate has
    /// the smallest finish tag (ties by arrival, so the order never depends on hash order). A
    /// tenant's candidate is its oldest waiter still on time (queued at most `late_after`
    /// before `now`) while any tenant of the class has one, else its head.
    fn pick(&self, now: Instant, late_after: Option<Duration>) -> Option<(i32, String, usize)> {
        for (&priority, class) in self.classes.iter().rev() {
            let eligible = || {
                class
                    .tenants
                    .iter()
                    .filter(|(_, q)| q.waiters.front().is_some_and(|w| self.below_cap(&w.tenant)))
            };
            let best = |place: &dyn Fn(&TenantQueue) -> Option<usize>| {
                eligible()
                    .filter_map(|(name, q)| place(q).map(|i| (name, i, &q.waiters[i])))
                    .min_by(|a, b| a.2.finish.total_cmp(&b.2.finish).then(a.2.id.cmp(&b.2.id)))
                    .map(|(name, i, _)| (priority, name.clone(), i))
            };
            let on_time = |q: &TenantQueue| {
                let late = late_after?;
                // Waiters are in arrival order: the late ones are a prefix.
                let i = q
                    .waiters
                    .partition_point(|w| now.saturating_duration_since(w.enqueued) > late);
                (i < q.waiters.len()).then_some(i)
            };
            if let Some(found) = best(&on_time).or_else(|| best(&|_| Some(0))) {
                return Some(found);
            }
        }
        None
    }

    /// Removes a waiter from its class (dropping the class when it empties).
    fn take(&mut self, priority: i32, tenant: &str, id: u64) -> Option<Waiter> {
        let class = self.classes.get_mut(&priority)?;
        let queue = class.tenants.get_mut(tenant)?;
        let pos = queue.waiters.iter().position(|w| w.id == id)?;
        let waiter = queue.waiters.remove(pos)?;
        if pos == queue.waiters.len() {
            // It was the tenant's latest: hand its virtual time back, so a request that left
            // the queue does not count against the tenant's share.
            queue.last_finish = waiter.start;
        }
        class.len -= 1;
        self.queued -= 1;
        if class.len == 0 {
            self.classes.remove(&priority);
        }
        Some(waiter)
    }

    /// Admits eligible waiters while slots are free; restores the invariant after any change.
    fn dispatch(&mut self, shared: &Arc<Shared>) {
        let now = Instant::now();
        while self.in_flight < shared.cfg.max_in_flight {
            let Some((priority, name, place)) = self.pick(now, shared.cfg.late_after) else {
                break;
            };
            let class = self
                .classes
                .get_mut(&priority)
                .expect("picked class exists");
            let queue = class.tenants.get_mut(&name).expect("picked tenant exists");
            let waiter = queue
                .waiters
                .remove(place)
                .expect("picked waiter is queued");
            class.vtime = class.vtime.max(waiter.start);
            class.len -= 1;
            self.queued -= 1;
            if class.len == 0 {
                self.classes.remove(&priority);
            }
            self.acquire(&name);
            let permit = Permit {
                shared: Some(shared.clone()),
                tenant: waiter.tenant,
                priority,
                waited: waiter.enqueued.elapsed(),
            };
            // A waiter leaves the queue before its receiver is dropped, so this cannot fail;
            // if it ever did, the slot is taken back here (dropping the permit would re-lock).
            if let Err(Ok(mut permit)) = waiter.tx.send(Ok(permit)) {
                permit.shared = None;
                self.release(&name);
            }
        }
    }

    /// Evicts the lowest-priority, most recently queued sheddable waiter below `priority`.
    fn shed_one(&mut self, priority: i32) -> bool {
        let Some((&class_priority, class)) = self.classes.iter().next() else {
            return false;
        };
        if class_priority >= 0 || class_priority >= priority {
            return false;
        }
        let (name, id) = class
            .tenants
            .iter()
            .filter_map(|(name, q)| q.waiters.back().map(|w| (name.clone(), w.id)))
            .max_by_key(|&(_, id)| id)
            .expect("a class that exists has waiters");
        let victim = self
            .take(class_priority, &name, id)
            .expect("victim is queued");
        let _ = victim.tx.send(Err(AdmissionError::Shed));
        true
    }
}

/// The admission queue. Cheap to clone; clones share one queue.
#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Admission")
            .field("cfg", &self.shared.cfg)
            .field("in_flight", &st.in_flight)
            .field("queued", &st.queued)
            .finish()
    }
}

/// A slot on the backends, held for the life of a request. Dropping it frees the slot and the
/// tenant's concurrency count, and admits the next eligible waiter.
pub struct Permit {
    /// `None` only for a permit that was never handed out (see `State::dispatch`).
    shared: Option<Arc<Shared>>,
    tenant: Arc<Tenant>,
    priority: i32,
    waited: Duration,
}

impl Permit {
    /// How long the request waited in the queue (zero if admitted at once).
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The priority the request was admitted with.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// The tenant holding the permit.
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("tenant", &self.tenant.name)
            .field("priority", &self.priority)
            .field("waited", &self.waited)
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let mut st = shared.lock();
            st.release(&self.tenant.name);
            st.dispatch(&shared);
        }
    }
}

/// A queued request's place, owned by its `admit` future. Dropping it before the outcome was
/// taken (the client left, the future was cancelled) removes the entry at once; a permit that
/// was sent but never received sits in `rx` and is dropped with it, which hands the slot on.
struct Queued<'a> {
    shared: &'a Shared,
    id: u64,
    priority: i32,
    tenant: &'a str,
    rx: oneshot::Receiver<Grant>,
    settled: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.settled {
            // Removing a waiter frees no slot, so there is nothing to dispatch; the lock is
            // released before `rx` (and any permit in it) is dropped.
            let removed = self.shared.lock().take(self.priority, self.tenant, self.id);
            drop(removed);
        }
    }
}

impl Admission {
    /// # Panics
    /// If `cfg.max_in_flight` is 0 (nothing could ever be admitted; the config layer refuses
    /// it with a proper message first).
    pub fn new(cfg: AdmissionConfig) -> Admission {
        assert!(cfg.max_in_flight > 0, "max_in_flight must be at least 1");
        Admission {
            shared: Arc::new(Shared {
                cfg,
                state: Mutex::new(State::default()),
            }),
        }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.shared.cfg
    }

    /// Waits for a slot for a request of `tenant` with `priority` (higher first; negative =
    /// sheddable). Dropping the future while it waits gives up its place at once. Must run
    /// inside a tokio runtime with the time driver (the queue timeout is a tokio timer, so
    /// tests can use the paused clock).
    pub async fn admit(
        &self,
        tenant: &Arc<Tenant>,
        priority: i32,
    ) -> Result<Permit, AdmissionError> {
        let shared = &self.shared;
        let enqueued = Instant::now();
        let (id, rx) = {
            let mut st = shared.lock();
            if st.in_flight < shared.cfg.max_in_flight && st.below_cap(tenant) {
                // Nothing eligible can be waiting while a slot is free (the invariant), so
                // nobody is overtaken here.
                debug_assert!(st.pick(enqueued, shared.cfg.late_after).is_none());
                st.acquire(&tenant.name);
                return Ok(Permit {
                    shared: Some(shared.clone()),
                    tenant: tenant.clone(),
                    priority,
                    waited: Duration::ZERO,
                });
            }
            if st.queued >= shared.cfg.max_queue && (priority < 0 || !st.shed_one(priority)) {
                return Err(AdmissionError::QueueFull {
                    retry_after: QUEUE_FULL_RETRY_AFTER,
                });
            }
            st.enqueue(tenant, priority, enqueued)
        };
        let mut queued = Queued {
            shared,
            id,
            priority,
            tenant: &tenant.name,
            rx,
            settled: false,
        };
        let deadline = enqueued + shared.cfg.queue_timeout;
        let outcome = match tokio::time::timeout_at(deadline, Pin::new(&mut queued.rx)).await {
            Ok(Ok(grant)) => grant,
            // Senders are dropped unsent only by `Queued` itself; treat the impossible as shed.
            Ok(Err(_closed)) => Err(AdmissionError::Shed),
            Err(_elapsed) => {
                let removed = shared.lock().take(priority, &tenant.name, id);
                match removed {
                    Some(_) => Err(AdmissionError::QueueTimeout {
                        waited: enqueued.elapsed(),
                    }),
                    // Admitted or shed just as the deadline passed: that outcome stands.
                    None => queued.rx.try_recv().unwrap_or(Err(AdmissionError::Shed)),
                }
            }
        };
        queued.settled = true;
        outcome
    }

    /// Permits held now.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().in_flight
    }

    /// Requests waiting now.
    pub fn queue_depth(&self) -> usize {
        self.shared.lock().queued
    }

    /// Requests waiting per priority class, highest priority first; only non-empty classes.
    pub fn queue_depth_by_priority(&self) -> Vec<(i32, usize)> {
        let st = self.shared.lock();
        st.classes.iter().rev().map(|(&p, c)| (p, c.len)).collect()
    }

    /// Permits held now by the tenant of that name.
    pub fn in_flight_of(&self, tenant: &str) -> usize {
        self.shared.lock().running_of(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    fn tenant(name: &str, weight: f64, max_concurrent: Option<usize>) -> Arc<Tenant> {
        Arc::new(Tenant {
            name: name.into(),
            weight,
            requests_per_minute: None,
            tokens_per_minute: None,
            max_concurrent,
            deadline_ms: None,
        })
    }

    fn admission(max_in_flight: usize, max_queue: usize) -> Admission {
        Admission::new(AdmissionConfig {
            max_in_flight,
            max_queue,
            queue_timeout: Duration::from_secs(30),
            late_after: None,
        })
    }

    type AdmitFuture<'a> = Pin<Box<dyn Future<Output = Grant> + Send + 'a>>;

    /// Unconstrained: the tests poll hundreds of futures from one task without yielding, and
    /// tokio's cooperative budget would otherwise start answering `Pending` for ready receivers.
    fn admit<'a>(adm: &'a Admission, t: &'a Arc<Tenant>, priority: i32) -> AdmitFuture<'a> {
        Box::pin(tokio::task::unconstrained(adm.admit(t, priority)))
    }

    /// Polls once without a real waker: queued futures are driven explicitly by the tests, so
    /// every step is deterministic.
    fn poll(fut: &mut AdmitFuture<'_>) -> Poll<Grant> {
        fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    }

    fn pending(fut: &mut AdmitFuture<'_>) {
        assert!(poll(fut).is_pending(), "expected the request to queue");
    }

    fn ready(fut: &mut AdmitFuture<'_>) -> Grant {
        match poll(fut) {
            Poll::Ready(g) => g,
            Poll::Pending => panic!("expected an outcome"),
        }
    }

    #[test]
    fn permits_and_futures_are_send() {
        fn send<T: Send>() {}
        send::<Permit>();
        send::<Admission>();
        send::<AdmitFuture<'static>>();
    }

    #[tokio::test]
    async fn grants_at_once_below_capacity_and_queues_when_saturated() {
        let adm = admission(2, 10);
        let a = tenant("a", 1.0, None);
        let p1 = adm.admit(&a, 0).await.unwrap();
        let p2 = adm.admit(&a, 3).await.unwrap();
        assert_eq!((p1.waited(), p2.priority()), (Duration::ZERO, 3));
        assert_eq!((adm.in_flight(), adm.in_flight_of("a")), (2, 2));
        let mut f = admit(&adm, &a, 0);
        pending(&mut f);
        assert_eq!(adm.queue_depth(), 1);
        assert_eq!(adm.queue_depth_by_priority(), [(0, 1)]);
        // Dropping a permit admits the next waiter.
        drop(p1);
        let p3 = ready(&mut f).unwrap();
        assert_eq!((adm.in_flight(), adm.queue_depth()), (2, 0));
        assert!(adm.queue_depth_by_priority().is_empty());
        drop((p2, p3));
        assert_eq!((adm.in_flight(), adm.in_flight_of("a")), (0, 0));
    }

    #[tokio::test]
    async fn higher_priority_classes_go_first_fifo_within() {
        let adm = admission(1, 10);
        let t = tenant("t", 1.0, None);
        let blocker = adm.admit(&t, 0).await.unwrap();
        let mut futs: Vec<_> = [0, 5, -1, 5, 1, 0]
            .into_iter()
            .map(|p| (p, admit(&adm, &t, p)))
            .collect();
        for (_, f) in &mut futs {
            pending(f);
        }
        assert_eq!(
            adm.queue_depth_by_priority(),
            [(5, 2), (1, 1), (0, 2), (-1, 1)]
        );
        drop(blocker);
        assert_eq!(grant_order(futs), [5, 5, 1, 0, 0, -1]);
        assert_eq!(adm.in_flight(), 0);
    }

    /// Drains `futs` one grant at a time (`poll` consumes each outcome, and the permit it
    /// carried, dropped at once, admits the next); returns the labels in grant order.
    fn grant_order<T>(mut futs: Vec<(T, AdmitFuture<'_>)>) -> Vec<T> {
        let mut order = Vec::new();
        while !futs.is_empty() {
            let i = futs
                .iter_mut()
                .position(|(_, f)| poll(f).is_ready())
                .expect("one request holds the slot");
            order.push(futs.remove(i).0);
        }
        order
    }

    /// With `late_after`, waiters queued longer yield to those that can still be served in
    /// time, fairly among those; the late ones follow in fair order. Priority classes stay
    /// strict: a late request of a higher class still goes before an on-time lower one.
    #[tokio::test(start_paused = true)]
    async fn late_waiters_yield_to_on_time_ones_within_a_class() {
        let order = |late_after: Option<Duration>| async move {
            let adm = Admission::new(AdmissionConfig {
                max_in_flight: 1,
                max_queue: 10,
                queue_timeout: Duration::from_secs(30),
                late_after,
            });
            let (a, b) = (tenant("a", 1.0, None), tenant("b", 1.0, None));
            let blocker = adm.admit(&a, 0).await.unwrap();
            let mut futs = vec![
                ("a0", admit(&adm, &a, 0)),
                ("a1", admit(&adm, &a, 0)),
                ("hi", admit(&adm, &a, 1)),
            ];
            // A request queues when first polled.
            for (_, f) in &mut futs {
                pending(f);
            }
            tokio::time::advance(Duration::from_secs(3)).await;
            for (label, who) in [("b0", &b), ("a2", &a)] {
                let mut f = admit(&adm, who, 0);
                pending(&mut f);
                futs.push((label, f));
            }
            drop(blocker);
            let order = grant_order(futs);
            assert_eq!((adm.in_flight(), adm.queue_depth()), (0, 0));
            order
        };
        // Fair arrival order: a's first two, then b's (its first tag ties a0's), then a2.
        assert_eq!(order(None).await, ["hi", "a0", "b0", "a1", "a2"]);
        // After 3 s, a0 and a1 are late at a 2 s target: b0 and a2 go first (b0's tag first),
        // then the late ones in their order.
        let late = order(Some(Duration::from_secs(2))).await;
        assert_eq!(late, ["hi", "b0", "a2", "a0", "a1"]);
        // A target none has reached: the fair order.
        assert_eq!(order(Some(Duration::from_secs(5))).await, order(None).await);
    }

    /// Capacity 1, each tenant keeping 8 requests queued: each round, every request is polled
    /// (so all but the one holding the slot are queued behind it), then the permit is dropped,
    /// which admits the next, and its tenant asks again. Returns the tenant index of each grant.
    fn flood(adm: &Admission, tenants: &[Arc<Tenant>], grants: usize) -> Vec<usize> {
        let mut slots: Vec<(usize, AdmitFuture<'_>)> = Vec::new();
        for (i, t) in tenants.iter().enumerate() {
            for _ in 0..8 {
                slots.push((i, admit(adm, t, 0)));
            }
        }
        let mut order = Vec::new();
        while order.len() < grants {
            let mut held = None;
            for (i, fut) in slots.iter_mut() {
                if let Poll::Ready(grant) = poll(fut) {
                    assert!(held.is_none(), "capacity 1 admits one at a time");
                    held = Some(grant.unwrap());
                    order.push(*i);
                    *fut = admit(adm, &tenants[*i], 0);
                }
            }
            assert!(held.is_some(), "a flood never stalls");
            assert!(adm.queue_depth() >= 14);
        }
        order
    }

    #[tokio::test]
    async fn weighted_fair_share_one_to_three() {
        let adm = admission(1, 100);
        let tenants = [tenant("light", 1.0, None), tenant("heavy", 3.0, None)];
        let order = flood(&adm, &tenants, 400);
        let heavy = order.iter().filter(|&&i| i == 1).count();
        let light = order.len() - heavy;
        let ratio = heavy as f64 / light as f64;
        assert!((2.7..=3.3).contains(&ratio), "{heavy}:{light} is not 3:1");
        // The share holds over any stretch of the flood, not just on average.
        let window = &order[200..];
        let heavy = window.iter().filter(|&&i| i == 1).count();
        assert!((135..=165).contains(&heavy), "{heavy} of 200");
    }

    #[tokio::test]
    async fn a_light_tenant_is_served_promptly_while_another_floods() {
        let adm = admission(1, 1_000);
        let heavy = tenant("heavy", 1.0, None);
        let light = tenant("light", 1.0, None);
        let blocker = adm.admit(&heavy, 0).await.unwrap();
        let mut flood: Vec<_> = (0..200).map(|_| admit(&adm, &heavy, 0)).collect();
        for f in &mut flood {
            pending(f);
        }
        let mut holder = Some(blocker);
        // Let the flood run for a while, then the light tenant asks once.
        for f in flood.iter_mut().take(20) {
            drop(holder.take());
            holder = Some(ready(f).unwrap());
        }
        let mut l = admit(&adm, &light, 0);
        pending(&mut l);
        drop(holder.take());
        // Heavy's next request had its tag long before; light starts at the current virtual
        // time and is at most one grant behind.
        let mut served_after = 0;
        let mut rest = flood.iter_mut().skip(20);
        loop {
            if let Poll::Ready(g) = poll(&mut l) {
                drop(g.unwrap());
                break;
            }
            let p = ready(rest.next().unwrap()).unwrap();
            served_after += 1;
            drop(p);
        }
        assert!(
            served_after <= 1,
            "light waited {served_after} heavy grants"
        );
    }

    #[tokio::test]
    async fn tenant_max_concurrent_is_skipped_not_blocking() {
        let adm = admission(4, 10);
        let capped = tenant("capped", 1.0, Some(2));
        let other = tenant("other", 1.0, None);
        let c1 = adm.admit(&capped, 0).await.unwrap();
        let _c2 = adm.admit(&capped, 0).await.unwrap();
        // A free slot, but the tenant is at its cap: it queues...
        let mut c3 = admit(&adm, &capped, 0);
        pending(&mut c3);
        assert_eq!((adm.in_flight(), adm.queue_depth()), (2, 1));
        // ...and others pass it.
        let _o1 = adm.admit(&other, 0).await.unwrap();
        let _o2 = adm.admit(&other, 0).await.unwrap();
        // Saturated now; another `other` queues behind `capped` in fair order.
        let mut o3 = admit(&adm, &other, 0);
        pending(&mut o3);
        // Releasing a capped permit admits the capped waiter (its tag is older).
        drop(c1);
        let c3 = ready(&mut c3).unwrap();
        assert_eq!(adm.in_flight_of("capped"), 2);
        pending(&mut o3);
        drop(c3);
        drop(ready(&mut o3).unwrap());
        assert_eq!(adm.in_flight(), 3);
    }

    #[tokio::test]
    async fn a_capped_head_does_not_hold_back_other_tenants_when_a_slot_frees() {
        let adm = admission(2, 10);
        let capped = tenant("capped", 1.0, Some(1));
        let other = tenant("other", 1.0, None);
        let c1 = adm.admit(&capped, 0).await.unwrap();
        let o1 = adm.admit(&other, 0).await.unwrap();
        let mut c2 = admit(&adm, &capped, 0);
        let mut o2 = admit(&adm, &other, 0);
        pending(&mut c2);
        pending(&mut o2);
        // `other`'s slot frees: capped's waiter is first in line but at its cap, so other goes.
        drop(o1);
        pending(&mut c2);
        let o2 = ready(&mut o2).unwrap();
        drop(c1);
        let c2 = ready(&mut c2).unwrap();
        drop((o2, c2));
        assert_eq!(adm.in_flight(), 0);
    }

    #[tokio::test]
    async fn full_queue_sheds_the_lowest_most_recent_sheddable() {
        let adm = admission(1, 3);
        let t = tenant("t", 1.0, None);
        let _blocker = adm.admit(&t, 0).await.unwrap();
        let mut low_old = admit(&adm, &t, -5);
        let mut low_new = admit(&adm, &t, -5);
        let mut mid = admit(&adm, &t, -1);
        for f in [&mut low_old, &mut low_new, &mut mid] {
            pending(f);
        }
        // A sheddable newcomer evicts nobody.
        let err = adm.admit(&t, -2).await.unwrap_err();
        assert_eq!(
            err,
            AdmissionError::QueueFull {
                retry_after: QUEUE_FULL_RETRY_AFTER
            }
        );
        // A normal newcomer evicts the most recent of the lowest class...
        let mut n1 = admit(&adm, &t, 0);
        pending(&mut n1);
        assert_eq!(ready(&mut low_new).unwrap_err(), AdmissionError::Shed);
        pending(&mut low_old);
        // ...then the older one, then the next class up.
        let mut n2 = admit(&adm, &t, 0);
        pending(&mut n2);
        assert_eq!(ready(&mut low_old).unwrap_err(), AdmissionError::Shed);
        let mut n3 = admit(&adm, &t, 0);
        pending(&mut n3);
        assert_eq!(ready(&mut mid).unwrap_err(), AdmissionError::Shed);
        assert_eq!(adm.queue_depth_by_priority(), [(0, 3)]);
        // Nothing sheddable left: refused.
        let err = adm.admit(&t, 7).await.unwrap_err();
        assert_eq!(err.metric_label(), "queue_full");
        assert_eq!(AdmissionError::Shed.metric_label(), "shed");
        assert_eq!(adm.queue_depth(), 3);
    }

    #[tokio::test]
    async fn queue_full_rejects_and_sheddable_requests_queue_when_there_is_room() {
        let adm = admission(1, 1);
        let t = tenant("t", 1.0, None);
        let blocker = adm.admit(&t, 0).await.unwrap();
        let mut s = admit(&adm, &t, -3);
        pending(&mut s);
        let mut n = admit(&adm, &t, 0);
        pending(&mut n);
        assert_eq!(ready(&mut s).unwrap_err(), AdmissionError::Shed);
        let err = adm.admit(&t, 0).await.unwrap_err();
        assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(
            err.to_string(),
            "The server is overloaded and its request queue is full. Please try again in 1s."
        );
        drop(blocker);
        drop(ready(&mut n).unwrap());
        // With no queue at all, a saturated gateway refuses at once.
        let adm = admission(1, 0);
        let _p = adm.admit(&t, 0).await.unwrap();
        assert!(matches!(
            adm.admit(&t, 100).await,
            Err(AdmissionError::QueueFull { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_times_out_after_queue_timeout() {
        let adm = admission(1, 10);
        let t = tenant("t", 1.0, None);
        let _blocker = adm.admit(&t, 0).await.unwrap();
        let start = Instant::now();
        let err = adm.admit(&t, 0).await.unwrap_err();
        let waited = Duration::from_secs(30);
        assert_eq!(err, AdmissionError::QueueTimeout { waited });
        assert_eq!(start.elapsed(), waited);
        assert_eq!(err.metric_label(), "queue_timeout");
        assert_eq!(err.retry_after(), None);
        assert_eq!(
            err.to_string(),
            "The server is overloaded: the request waited 30.0s in the queue without being \
             admitted. Please try again later."
        );
        assert_eq!((adm.queue_depth(), adm.in_flight()), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_reports_how_long_it_waited() {
        let adm = admission(1, 10);
        let t = tenant("t", 1.0, None);
        let blocker = adm.admit(&t, 0).await.unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            drop(blocker);
        });
        let p = adm.admit(&t, 2).await.unwrap();
        assert_eq!(
            (p.waited(), p.priority()),
            (Duration::from_millis(2_500), 2)
        );
        assert_eq!(p.tenant().name, "t");
    }

    #[tokio::test]
    async fn dropping_a_queued_future_removes_it_and_leaks_nothing() {
        let adm = admission(1, 10);
        let t = tenant("t", 1.0, None);
        let blocker = adm.admit(&t, 0).await.unwrap();
        let mut f = admit(&adm, &t, 0);
        pending(&mut f);
        assert_eq!(adm.queue_depth(), 1);
        drop(f);
        assert_eq!((adm.queue_depth(), adm.in_flight()), (0, 1));
        assert!(adm.queue_depth_by_priority().is_empty());
        drop(blocker);
        assert_eq!(adm.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_permit_granted_but_never_received_passes_to_the_next_waiter() {
        let adm = admission(1, 10);
        let t = tenant("t", 1.0, None);
        let blocker = adm.admit(&t, 0).await.unwrap();
        let mut first = admit(&adm, &t, 0);
        let mut second = admit(&adm, &t, 0);
        pending(&mut first);
        pending(&mut second);
        // The slot goes to `first`, which is gone before it looks.
        drop(blocker);
        assert_eq!((adm.in_flight(), adm.queue_depth()), (1, 1));
        drop(first);
        assert_eq!((adm.in_flight(), adm.queue_depth()), (1, 0));
        let p = ready(&mut second).unwrap();
        drop(p);
        assert_eq!((adm.in_flight(), adm.in_flight_of("t")), (0, 0));
    }

    #[tokio::test]
    async fn many_tasks_leave_no_capacity_behind() {
        let adm = admission(3, 1_000);
        let ts = [tenant("a", 1.0, Some(2)), tenant("b", 2.0, None)];
        let mut tasks = Vec::new();
        for i in 0..200 {
            let adm = adm.clone();
            let t = ts[i % 2].clone();
            tasks.push(tokio::spawn(async move {
                let p = adm.admit(&t, (i % 3) as i32 - 1).await;
                tokio::task::yield_now().await;
                drop(p);
            }));
        }
        // Cancel every fourth task wherever it is.
        for (i, task) in tasks.iter().enumerate() {
            if i % 4 == 0 {
                task.abort();
            }
        }
        for task in tasks {
            let _ = task.await;
        }
        assert_eq!((adm.in_flight(), adm.queue_depth()), (0, 0));
    }
}
