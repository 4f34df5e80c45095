//! The local control loop: one tick = poll processes, announce the ready ones, scrape, build
//! the signals, decide with the sluice policy, and move the fleet towards the decision —
//! starting replicas, draining and stopping surplus ones, replacing those that died.
//!
//! Each tick prints one JSON line on stdout (time, desired and actual replicas by phase, the
//! queue, the arrival rates, the mode, stale targets): the record of what the loop saw and
//! did, read by the end-to-end test and handy to plot. Logs go to stderr.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;

use sluice_policy::decision::{Decision, Mode};
use sluice_policy::policy::{Policy, Sluice, SluiceConfig, VariantLimits};
use sluice_policy::profile::CapacityType;
use sluice_policy::signals::{Signals, VariantSignals};

use super::announce::Announcer;
use super::status::{self, Shared};
use super::supervisor::{Event, Phase, Supervisor};
use super::{LocalConfig, LocalError};
use crate::scrape::{Endpoint, Observation, ScrapeConfig, Scraper, TtftTarget};

/// Longest back-off between start attempts after consecutive failed starts.
const MAX_START_BACKOFF: Duration = Duration::from_secs(30);

/// One tick's record (the JSON line on stdout).
#[derive(Debug, Clone, Serialize)]
pub struct TickRecord {
    pub t: f64,
    /// What the policy asked for, and what the loop aims for after limits and holds.
    pub decided: u32,
    pub desired: u32,
    pub ready: u32,
    pub starting: u32,
    pub draining: u32,
    pub stopping: u32,
    pub waiting: u64,
    pub running: u64,
    /// Requests the gateway has for the model, waiting for room or held at zero replicas.
    pub held: u64,
    /// The arrival rates the policy read: the replicas' count, or the gateway's front door
    /// when larger.
    pub rate: f64,
    pub short_rate: f64,
    /// The most prompt tokens the gateway saw arrive within one second over the shape window
    /// (its bucket's upper bound); 0 without a gateway or arrivals.
    pub busiest_second_tokens: f64,
    /// The longest prompt over the window the policy read: the replicas' (their prompt-length
    /// histogram's bucket bound, which also gives the prompts' spread) or one the gateway saw
    /// refused as too long that the variant serves in time; 0 without either.
    pub max_prompt_tokens: u64,
    pub mode: Mode,
    pub stale: usize,
    /// Replica URLs in the discovery file.
    pub announced: Vec<String>,
    /// Why (the decision's reasons), when the desired count changed this tick.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// The loop's state.
#[derive(Debug)]
pub struct LocalAutoscaler {
    cfg: LocalConfig,
    sup: Supervisor,
    announcer: Announcer,
    scraper: Scraper,
    policy: Sluice,
    epoch: Instant,
    failed_starts: u32,
    next_start: Instant,
    desired: u32,
    status: Shared,
}

impl LocalAutoscaler {
    pub fn new(cfg: LocalConfig) -> Result<LocalAutoscaler, LocalError> {
        let limits = vec![VariantLimits {
            variant: cfg.variant.clone(),
            min: cfg.min_replicas,
            max: cfg.max_replicas,
            // With traffic recent, at least one replica even at --min-replicas 0.
            keep_warm: cfg.min_replicas.max(1),
        }];
        let mut pc = SluiceConfig::new(cfg.slo, limits);
        pc.scale_down_window_s = cfg.scale_down_window_s;
        if cfg.min_replicas == 0 {
            pc.scale_to_zero_after_s = cfg.scale_to_zero_after_s;
        }
        pc.panic_window_s = cfg.panic_window_s;
        let profile = cfg.profile.restrict(std::slice::from_ref(&cfg.variant))?;
        let scraper = Scraper::new(ScrapeConfig {
            timeout: cfg.scrape_timeout,
            path: "/metrics".into(),
            window_s: cfg.window_s,
            short_window_s: cfg.short_window_s,
            latency_window_s: cfg.latency_window_s,
            ttft_target: Some(TtftTarget::new(&profile, &cfg.slo)),
            ..ScrapeConfig::default()
        });
        Ok(LocalAutoscaler {
            sup: Supervisor::new(cfg.replica.clone())?,
            announcer: Announcer::new(cfg.discovery_file.clone(), vec![cfg.served_model.clone()]),
            scraper,
            policy: Sluice::new(profile, pc),
            epoch: Instant::now(),
            failed_starts: 0,
            next_start: Instant::now(),
            desired: cfg.min_replicas,
            status: Shared::default(),
            cfg,
        })
    }

    /// Runs until `shutdown` resolves, then stops every replica. The discovery file is
    /// emptied first, so the gateway stops routing before the replicas drain.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), LocalError> {
        self.announcer.announce(&[])?;
        let server = match self.cfg.listen {
            Some(addr) => {
                let l = status::bind(addr).await?;
                tracing::info!(addr = %l.local_addr().map_or(addr, |a| a), "serving /healthz and /metrics");
                Some(tokio::spawn(status::serve(
                    l,
                    self.status.clone(),
                    self.cfg.tick,
                )))
            }
            None => None,
        };
        let mut tick = tokio::time::interval(self.cfg.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        let result = loop {
            tokio::select! {
                _ = &mut shutdown => break Ok(()),
                _ = tick.tick() => {
                    match self.tick().await {
                        Ok(rec) => {
                            if let Ok(line) = serde_json::to_string(&rec) {
                                println!("{line}");
                            }
                        }
                        Err(e) => break Err(e),
                    }
                }
            }
        };
        tracing::info!("stopping: emptying the discovery file, then the replicas");
        let emptied = self.announcer.withdraw();
        // Give the gateway a moment to re-read the file before the replicas refuse work.
        if self.cfg.gateway.is_some() || !self.sup.replicas().is_empty() {
            tokio::time::sleep(self.cfg.tick.min(Duration::from_secs(1))).await;
        }
        for e in self.sup.shutdown().await {
            log_event(&e);
        }
        if let Some(s) = server {
            s.abort();
        }
        result.and(emptied)
    }

    /// One tick.
    pub async fn tick(&mut self) -> Result<TickRecord, LocalError> {
        let now = Instant::now();
        let events = self.sup.poll().await;
        self.count_events(&events);
        for e in events {
            log_event(&e);
            match e {
                Event::Ready { .. } => self.failed_starts = 0,
                Event::StartFailed { .. } => {
                    self.failed_starts += 1;
                    let backoff =
                        Duration::from_secs(1u64 << self.failed_starts.min(5).saturating_sub(1))
                            .min(MAX_START_BACKOFF);
                    self.next_start = now + backoff;
                }
                _ => {}
            }
        }
        self.announce()?;
        let t = self.epoch.elapsed().as_secs_f64();
        let obs = self.scraper.scrape(&self.targets(), t).await;
        for st in obs.targets.iter().filter(|s| s.is_stale()) {
            tracing::warn!(
                target = %st.target.url,
                "stale metrics: {}",
                st.error.as_deref().unwrap_or("")
            );
        }
        let signals = self.signals(&obs);
        let decision = self.policy.decide(&signals);
        let decided = decision.replicas_of(&self.cfg.variant);
        let (want, woken) = self.want(decided, &obs);
        let reasons = if want != self.desired {
            tracing::info!(from = self.desired, to = want, "scaling");
            let mut reasons: Vec<String> =
                decision.reasons.iter().map(ToString::to_string).collect();
            reasons.extend(woken);
            for r in &reasons {
                tracing::info!("  {r}");
            }
            reasons
        } else {
            Vec::new()
        };
        self.desired = want;
        self.reconcile(want, &obs, now)?;
        self.announce()?;
        self.progress_drains(&obs);
        let rec = self.record(t, decided, &obs, &signals, &decision, reasons);
        let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
        st.counters.ticks += 1;
        st.counters.stale_scrapes += rec.stale as u64;
        st.last = Some((Instant::now(), rec.clone()));
        Ok(rec)
    }

    /// The replica count to aim for: the decision within the limits, held on stale metrics,
    /// and at zero replicas one at once when the gateway holds requests for the model (not
    /// waiting for the policy's windows); with the sentence that says so when it woke.
    fn want(&self, decided: u32, obs: &Observation) -> (u32, Option<String>) {
        let active = self.active();
        let mut want = decided.clamp(self.cfg.min_replicas, self.cfg.max_replicas);
        if obs.any_stale() && want < active {
            tracing::info!(want, active, "stale metrics: holding the fleet");
            want = active;
        }
        let held = self.held(obs);
        if active == 0 && want == 0 && held > 0 && self.cfg.max_replicas > 0 {
            let why = format!(
                "{held} requests for {} held in the gateway at zero replicas: starting one now",
                self.cfg.served_model
            );
            return (1, Some(why));
        }
        (want, None)
    }

    /// Requests the gateway has for the served model, waiting or held.
    fn held(&self, obs: &Observation) -> u64 {
        obs.gateway_queue_of(&self.cfg.served_model).total().round() as u64
    }

    /// The shared status the `--listen` endpoint serves.
    pub fn status(&self) -> Shared {
        self.status.clone()
    }

    fn count_events(&self, events: &[Event]) {
        let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let c = &mut st.counters;
        for e in events {
            match e {
                Event::Ready { .. } => {}
                Event::StartFailed { .. } => c.failed_starts += 1,
                Event::Died { .. } => c.deaths += 1,
                Event::Stopped { killed, .. } => {
                    c.stops += 1;
                    c.sigkills += u64::from(*killed);
                }
            }
        }
    }

    /// Ready and starting replicas: the fleet the decision is compared with.
    fn active(&self) -> u32 {
        self.sup
            .count(|p| matches!(p, Phase::Ready | Phase::Starting))
    }

    fn announce(&mut self) -> Result<(), LocalError> {
        let urls: Vec<String> = self
            .sup
            .replicas()
            .iter()
            .filter(|r| r.phase == Phase::Ready)
            .filter_map(|r| r.url.clone())
            .collect();
        if self.announcer.announce(&urls)? {
            tracing::info!(replicas = ?urls, "discovery file updated");
        }
        Ok(())
    }

    /// Ready and draining replicas (draining ones must be seen to go idle), and the gateway.
    fn targets(&self) -> Vec<Endpoint> {
        let mut t: Vec<Endpoint> = self
            .sup
            .replicas()
            .iter()
            .filter(|r| matches!(r.phase, Phase::Ready | Phase::Draining { .. }))
            .filter_map(|r| r.url.as_deref())
            .map(|u| Endpoint::replica(&self.cfg.variant, CapacityType::OnDemand, u))
            .collect();
        if let Some(g) = &self.cfg.gateway {
            t.push(Endpoint::gateway(g));
        }
        t
    }

    fn signals(&self, obs: &Observation) -> Signals {
        let mut s = Signals {
            model: self.cfg.profile.model.name.clone(),
            variants: vec![VariantSignals {
                variant: self.cfg.variant.clone(),
                capacity: CapacityType::OnDemand,
                ready: self.sup.count(|p| *p == Phase::Ready),
                starting: self.sup.count(|p| *p == Phase::Starting),
                draining: self
                    .sup
                    .count(|p| matches!(p, Phase::Draining { .. } | Phase::Stopping { .. })),
                ..VariantSignals::default()
            }],
            ..Signals::default()
        };
        obs.apply(&self.cfg.served_model, &mut s);
        s
    }

    /// Starts or drains replicas so that ready + starting reaches `want`.
    fn reconcile(&mut self, want: u32, obs: &Observation, now: Instant) -> Result<(), LocalError> {
        let active = self.active();
        if want > active {
            if now < self.next_start {
                return Ok(());
            }
            // After failed starts, one attempt per back-off period.
            let n = if self.failed_starts > 0 {
                1
            } else {
                want - active
            };
            for _ in 0..n {
                match self.sup.start() {
                    Ok(_) => {
                        let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
                        st.counters.starts += 1;
                    }
                    Err(e @ LocalError::NoFreePort(_)) => {
                        tracing::warn!("cannot start a replica: {e}");
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        } else if want < active {
            let mut surplus = active - want;
            // Starting replicas first (they serve nothing yet, and were never announced).
            let starting: Vec<u64> = self
                .sup
                .replicas()
                .iter()
                .rev()
                .filter(|r| r.phase == Phase::Starting)
                .map(|r| r.id)
                .collect();
            for id in starting.into_iter().take(surplus as usize) {
                tracing::info!(id, "stopping a replica that is not ready yet");
                self.sup.terminate(id);
                surplus -= 1;
            }
            // Then the least loaded ready ones (newest on a tie): out of the file, draining.
            let mut ready: Vec<(f64, u64)> = self
                .sup
                .replicas()
                .iter()
                .filter(|r| r.phase == Phase::Ready)
                .map(|r| {
                    let load = r
                        .url
                        .as_deref()
                        .and_then(|u| obs.target(u))
                        .and_then(|st| st.last.as_ref())
                        .map_or(f64::INFINITY, |s| s.in_system());
                    (load, r.id)
                })
                .collect();
            ready.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
            for (_, id) in ready.into_iter().take(surplus as usize) {
                tracing::info!(id, "draining a replica: out of the discovery file");
                self.sup.drain(id);
            }
        }
        Ok(())
    }

    /// SIGTERM for draining replicas the gateway no longer routes to and that hold no
    /// request (or that passed the drain timeout).
    fn progress_drains(&mut self, obs: &Observation) {
        let mut stop = Vec::new();
        for r in self.sup.replicas() {
            let Phase::Draining { since } = r.phase else {
                continue;
            };
            let Some(url) = r.url.as_deref() else {
                stop.push((r.id, "no URL"));
                continue;
            };
            let unrouted = match &self.cfg.gateway {
                Some(_) => obs.routed.as_ref().is_some_and(|set| !set.contains(url)),
                None => since.elapsed() >= self.cfg.unrouted_after,
            };
            let idle = obs
                .target(url)
                .filter(|st| !st.is_stale())
                .and_then(|st| st.last.as_ref())
                .is_some_and(|s| s.in_system() == 0.0);
            if unrouted && idle {
                stop.push((r.id, "unrouted and idle"));
            } else if since.elapsed() > self.cfg.drain_timeout {
                stop.push((r.id, "drain timeout"));
            }
        }
        for (id, why) in stop {
            tracing::info!(id, why, "SIGTERM");
            self.sup.terminate(id);
        }
    }

    /// What the tick shows: the decision, the fleet, the queue from `obs`, the arrivals as the
    /// policy read them (`s`: the gateway's front door folded in).
    fn record(
        &self,
        t: f64,
        decided: u32,
        obs: &Observation,
        s: &Signals,
        d: &Decision,
        reasons: Vec<String>,
    ) -> TickRecord {
        TickRecord {
            t,
            decided,
            desired: self.desired,
            ready: self.sup.count(|p| *p == Phase::Ready),
            starting: self.sup.count(|p| *p == Phase::Starting),
            draining: self.sup.count(|p| matches!(p, Phase::Draining { .. })),
            stopping: self.sup.count(|p| matches!(p, Phase::Stopping { .. })),
            waiting: obs.queue.waiting,
            running: obs.queue.running,
            held: self.held(obs),
            rate: s.arrivals.requests_per_s,
            short_rate: s.arrivals.short_requests_per_s,
            busiest_second_tokens: obs
                .prompt_bursts
                .get(&self.cfg.served_model)
                .and_then(|b| b.hist.max_bound())
                .unwrap_or(0.0),
            max_prompt_tokens: s.arrivals.max_prompt_tokens,
            mode: d.mode,
            stale: obs.targets.iter().filter(|s| s.is_stale()).count(),
            announced: self.announcer.current().to_vec(),
            reasons,
        }
    }
}

fn log_event(e: &Event) {
    match e {
        Event::Ready { .. } => {}
        Event::StartFailed { id, reason } => {
            tracing::warn!(id, "replica failed to start: {reason}")
        }
        Event::Died { id, url, status } => {
            tracing::warn!(id, ?url, %status, "replica died; it will be replaced")
        }
        Event::Stopped {
            id,
            url,
            status,
            killed,
        } => tracing::info!(id, ?url, %status, killed, "replica stopped"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::local::cli::LocalArgs;
    use crate::scrape::{exposition, Snapshot};

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: LocalArgs,
    }

    fn gateway_saying(text: &str) -> Observation {
        let snap = Snapshot::from_samples(&exposition::parse(text).unwrap());
        let mut scraper = Scraper::new(ScrapeConfig::default());
        let gw = Endpoint::gateway("http://127.0.0.1:9");
        scraper.record(&[gw], vec![Ok(snap)], 0.0)
    }

    /// At zero replicas, a request the gateway holds for the served model starts one replica
    /// at once (whatever the policy decided); nothing held, or held for another model, leaves
    /// the pool at zero. Held requests count as waiting for the policy too.
    #[test]
    fn held_requests_at_zero_start_one_replica_at_once() {
        let dir = std::env::temp_dir().join(format!("sluice-wake-{}", std::process::id()));
        let args = T::try_parse_from([
            "t",
            "--local",
            "--discovery-file",
            dir.join("replicas").to_str().unwrap(),
            "--log-dir",
            dir.join("logs").to_str().unwrap(),
            "--gateway",
            "http://127.0.0.1:9",
            "--min-replicas",
            "0",
        ])
        .unwrap();
        let cfg = args.a.validate().unwrap();
        assert_eq!(cfg.served_model, "smollm2-135m-instruct");
        assert_eq!(cfg.scale_to_zero_after_s, cfg.scale_down_window_s);
        let a = LocalAutoscaler::new(cfg).unwrap();
        let held = gateway_saying("sluice_gateway_queue_held{model=\"smollm2-135m-instruct\"} 1\n");
        let (want, why) = a.want(0, &held);
        assert_eq!(want, 1);
        assert!(why.unwrap().contains("held"));
        assert_eq!(held.queue.waiting, 1, "the policy sees it waiting");
        let queued = gateway_saying(
            "sluice_gateway_queue_depth{model=\"smollm2-135m-instruct\",priority=\"0\"} 2\n",
        );
        assert_eq!(a.want(0, &queued).0, 1);
        let other = gateway_saying("sluice_gateway_queue_held{model=\"other\"} 3\n");
        assert_eq!(a.want(0, &other), (0, None));
        let idle = gateway_saying("sluice_gateway_queue_held{model=\"smollm2-135m-instruct\"} 0\n");
        assert_eq!(a.want(0, &idle), (0, None));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
