//! Knative's Pod Autoscaler (KPA): concurrency averaged over a stable and a panic window.
//!
//! `desired = ⌈average concurrency / (target × utilisation)⌉` over the stable window (60 s);
//! the same over the panic window (6 s) and, when that asks for at least twice the ready
//! replicas, panic mode: for a stable window the fleet only grows. Idle past the grace period,
//! it scales to zero. Concurrency is requests in flight, queued included (Knative's activator
//! and queue-proxy count them).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, Mode, ReasonKind};
use crate::policy::Policy;
use crate::profile::{CapacityType, Profile};
use crate::signals::Signals;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KpaConfig {
    /// Target in-flight requests per replica (`container-concurrency` or the soft target).
    pub target: f64,
    /// `target-utilization-percentage` / 100.
    pub utilisation: f64,
    pub stable_window_s: f64,
    pub panic_window_s: f64,
    /// Panic when the panic window asks for this many times the ready replicas.
    pub panic_threshold: f64,
    pub scale_to_zero_grace_s: f64,
    /// At most this factor down per decision (Knative's `max-scale-down-rate`, 2).
    pub max_scale_down_rate: f64,
    /// Never fewer replicas (Knative's `min-scale`; 0 lets it scale to zero).
    #[serde(default)]
    pub min: u32,
    pub max: u32,
    pub variant: String,
    pub capacity: CapacityType,
}

#[derive(Debug, Clone)]
pub struct Kpa {
    config: KpaConfig,
    profile: Profile,
    samples: VecDeque<(f64, f64)>,
    panic_until: f64,
    last_traffic_s: f64,
}

impl Kpa {
    pub fn new(profile: Profile, config: KpaConfig) -> Self {
        Kpa {
            config,
            profile,
            samples: VecDeque::new(),
            panic_until: f64::NEG_INFINITY,
            last_traffic_s: 0.0,
        }
    }

    fn average(&self, since: f64) -> f64 {
        let xs: Vec<f64> = self
            .samples
            .iter()
            .filter(|&&(t, _)| t >= since)
            .map(|&(_, x)| x)
            .collect();
        if xs.is_empty() {
            0.0
        } else {
            xs.iter().sum::<f64>() / xs.len() as f64
        }
    }
}

impl Policy for Kpa {
    fn name(&self) -> &str {
        "kpa"
    }

    fn decide(&mut self, s: &Signals) -> Decision {
        let c = self.config.clone();
        let t = s.time_s;
        let in_flight = (s.queue.waiting + s.queue.running) as f64;
        if in_flight > 0.0 || s.arrivals.requests_per_s > 0.0 {
            self.last_traffic_s = t;
        }
        self.samples.push_back((t, in_flight));
        while self
            .samples
            .front()
            .is_some_and(|&(x, _)| x < t - c.stable_window_s)
        {
            self.samples.pop_front();
        }
        let per = c.target * c.utilisation;
        // The stable window always holds the latest sample; the panic window may hold only it
        // when ticks are longer than the window.
        let stable = (self.average(t - c.stable_window_s) / per).ceil() as u32;
        let panic_want = (self.average(t - c.panic_window_s) / per).ceil() as u32;
        let ready = s.variant(&c.variant, c.capacity).map_or(0, |v| v.ready);
        let spec = s.provisioned(&c.variant, c.capacity);
        if f64::from(panic_want) >= c.panic_threshold * f64::from(ready.max(1))
            && panic_want > ready
        {
            self.panic_until = t + c.stable_window_s;
        }
        let panic = t < self.panic_until;
        let mut n = if panic {
            panic_want.max(stable).max(spec)
        } else {
            stable
        };
        if t - self.last_traffic_s < c.scale_to_zero_grace_s && in_flight > 0.0 {
            n = n.max(1);
        }
        // The scale-down rate never keeps the last replica: going to zero is the grace
        // period's to decide (idle that long, nothing in flight).
        let idle = t - self.last_traffic_s >= c.scale_to_zero_grace_s && in_flight == 0.0;
        let rate_floor = if idle && spec <= 1 {
            0
        } else {
            (f64::from(spec) / c.max_scale_down_rate).ceil() as u32
        };
        n = n.max(rate_floor).max(c.min).min(c.max);
        let mode = if panic { Mode::Panic } else { Mode::Stable };
        let mut d = super::single(t, &s.model, &self.profile, &c.variant, c.capacity, n, mode);
        d.reason(
            ReasonKind::Baseline,
            Some(&c.variant),
            format!(
                "concurrency {in_flight:.0} against {per:.1} per replica{}",
                if panic { " (panic)" } else { "" }
            ),
        );
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::{Queue, VariantSignals};

    fn signals(t: f64, ready: u32, in_flight: u64) -> Signals {
        Signals {
            time_s: t,
            queue: Queue {
                waiting: 0,
                waiting_prompt_tokens: 0,
                running: in_flight,
            },
            variants: vec![VariantSignals {
                variant: "nvidia-l4".into(),
                ready,
                ..VariantSignals::default()
            }],
            ..Signals::default()
        }
    }

    #[test]
    fn panic_grows_at_once_and_blocks_scale_down_for_a_stable_window() {
        let mut k = Kpa::new(
            Profile::load("llama-3-8b").unwrap(),
            KpaConfig {
                target: 10.0,
                utilisation: 1.0,
                stable_window_s: 60.0,
                panic_window_s: 6.0,
                panic_threshold: 2.0,
                scale_to_zero_grace_s: 30.0,
                max_scale_down_rate: 2.0,
                min: 0,
                max: 100,
                variant: "nvidia-l4".into(),
                capacity: CapacityType::OnDemand,
            },
        );
        for i in 0..6 {
            assert_eq!(
                k.decide(&signals(f64::from(i) * 10.0, 2, 20))
                    .replicas_of("nvidia-l4"),
                2
            );
        }
        // A spike to 100 in flight: the 6 s window wants 10 ≥ 2 × 2 ready → panic, 10 now.
        let d = k.decide(&signals(60.0, 2, 100));
        assert_eq!(d.mode, Mode::Panic);
        assert_eq!(d.replicas_of("nvidia-l4"), 10);
        // The spike ends; panic holds the fleet for a stable window...
        let mut s = signals(65.0, 10, 10);
        s.variants[0].ready = 10;
        assert_eq!(k.decide(&s).replicas_of("nvidia-l4"), 10);
        // ...then the stable average decides, halving at most per decision.
        let mut last = 10;
        for i in 0..30 {
            let s = signals(130.0 + f64::from(i) * 5.0, last, 10);
            let next = k.decide(&s).replicas_of("nvidia-l4");
            assert!(next * 2 >= last, "{last} → {next}");
            last = next;
        }
        assert_eq!(last, 1);
    }
}
