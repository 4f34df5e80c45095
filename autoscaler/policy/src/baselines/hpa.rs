//! Kubernetes' HorizontalPodAutoscaler (autoscaling/v2), on one metric.
//!
//! `desired = ⌈current × metric / target⌉`, no change while the ratio is within the tolerance
//! (10 %), scale-up limited to the larger of doubling and four pods per period (HPA's default
//! behaviour), scale-down to the highest recommendation of the last five minutes. On CPU it
//! fails for GPU inference: the serving process's CPU use is a busy scheduler loop and a little
//! tokenisation, nearly flat from idle to saturated, so utilisation never crosses a sensible
//! target and the fleet shrinks to its minimum while the GPU queue grows.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, Mode, ReasonKind};
use crate::policy::Policy;
use crate::profile::{CapacityType, Profile};
use crate::signals::Signals;

/// Which metric the HPA averages over ready replicas.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum HpaMetric {
    /// Container CPU utilisation (0..1 of its request).
    Cpu,
    /// Requests in flight (queued at the gateway or on replicas, and running) per replica.
    Concurrency,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HpaConfig {
    pub metric: HpaMetric,
    /// Target per replica: utilisation (0..1) or in-flight requests.
    pub target: f64,
    pub tolerance: f64,
    pub scale_down_window_s: f64,
    pub min: u32,
    pub max: u32,
    pub variant: String,
    pub capacity: CapacityType,
}

#[derive(Debug, Clone)]
pub struct Hpa {
    name: String,
    config: HpaConfig,
    profile: Profile,
    history: VecDeque<(f64, u32)>,
}

impl Hpa {
    pub fn new(profile: Profile, config: HpaConfig) -> Self {
        let name = match config.metric {
            HpaMetric::Cpu => "hpa-cpu",
            HpaMetric::Concurrency => "hpa-concurrency",
        };
        Hpa {
            name: name.into(),
            config,
            profile,
            history: VecDeque::new(),
        }
    }
}

impl Policy for Hpa {
    fn name(&self) -> &str {
        &self.name
    }

    fn decide(&mut self, s: &Signals) -> Decision {
        let c = &self.config;
        let v = s.variant(&c.variant, c.capacity);
        let ready = v.map_or(0, |v| v.ready);
        let spec = s.provisioned(&c.variant, c.capacity);
        let metric_total = match c.metric {
            HpaMetric::Cpu => v.map_or(0.0, |v| v.cpu_utilisation) * f64::from(ready),
            HpaMetric::Concurrency => (s.queue.waiting + s.queue.running) as f64,
        };
        // Metrics come from ready pods; pods still starting count as zero usage when scaling
        // up (HPA's rule for unready pods), so scale-up sizes the total against the target.
        let ratio = if ready == 0 {
            if metric_total > 0.0 {
                f64::INFINITY
            } else {
                0.0
            }
        } else {
            metric_total / f64::from(ready) / c.target
        };
        let mut rec = if (ratio - 1.0).abs() <= c.tolerance {
            spec
        } else if ratio.is_infinite() {
            spec.max(1)
        } else if ratio > 1.0 {
            (metric_total / c.target).ceil() as u32
        } else {
            (ratio * f64::from(ready)).ceil() as u32
        };
        let up_limit = (spec * 2).max(spec + 4);
        rec = rec.min(up_limit).clamp(c.min, c.max);
        if self.history.is_empty() {
            // Taking over a running fleet: its size counts as a recent recommendation.
            self.history.push_back((s.time_s, spec));
        }
        self.history.push_back((s.time_s, rec));
        while self
            .history
            .front()
            .is_some_and(|&(t, _)| t < s.time_s - c.scale_down_window_s)
        {
            self.history.pop_front();
        }
        let desired = if rec >= spec {
            rec
        } else {
            self.history
                .iter()
                .map(|&(_, n)| n)
                .max()
                .unwrap_or(rec)
                .min(spec)
        };
        let mut d = super::single(
            s.time_s,
            &s.model,
            &self.profile,
            &c.variant,
            c.capacity,
            desired,
            Mode::Stable,
        );
        d.reason(
            ReasonKind::Baseline,
            Some(&c.variant),
            format!(
                "metric {:.2} per replica against target {:.2}: {desired}",
                metric_total / f64::from(ready.max(1)),
                c.target
            ),
        );
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::{Queue, VariantSignals};

    fn signals(t: f64, ready: u32, in_flight: u64, cpu: f64) -> Signals {
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
                cpu_utilisation: cpu,
                ..VariantSignals::default()
            }],
            ..Signals::default()
        }
    }

    fn hpa(metric: HpaMetric, target: f64) -> Hpa {
        Hpa::new(
            Profile::load("llama-3-8b").unwrap(),
            HpaConfig {
                metric,
                target,
                tolerance: 0.1,
                scale_down_window_s: 300.0,
                min: 1,
                max: 50,
                variant: "nvidia-l4".into(),
                capacity: CapacityType::OnDemand,
            },
        )
    }

    #[test]
    fn hpa_follows_its_formula_tolerance_and_scale_down_window() {
        let mut h = hpa(HpaMetric::Concurrency, 10.0);
        // 4 replicas at 25 in flight each: ⌈100 / 10⌉ = 10, limited to 2 × 4 = 8.
        assert_eq!(
            h.decide(&signals(0.0, 4, 100, 0.3))
                .replicas_of("nvidia-l4"),
            8
        );
        // Within tolerance (ratio 1.05): unchanged.
        assert_eq!(
            h.decide(&signals(15.0, 8, 84, 0.3))
                .replicas_of("nvidia-l4"),
            8
        );
        // Load falls: the window keeps the earlier 8 for five minutes, then follows.
        assert_eq!(
            h.decide(&signals(30.0, 8, 20, 0.3))
                .replicas_of("nvidia-l4"),
            8
        );
        assert_eq!(
            h.decide(&signals(400.0, 8, 20, 0.3))
                .replicas_of("nvidia-l4"),
            2
        );
    }

    #[test]
    fn hpa_on_cpu_shrinks_a_saturated_gpu_fleet_because_cpu_stays_flat() {
        let mut h = hpa(HpaMetric::Cpu, 0.6);
        // Saturated GPUs (a thousand in flight) but the process uses 30 % of its CPU request.
        let mut n = 10;
        let mut most = n;
        for i in 0..200 {
            n = h
                .decide(&signals(f64::from(i) * 15.0, n, 1000, 0.3))
                .replicas_of("nvidia-l4");
            most = most.max(n);
        }
        assert_eq!(most, 10, "never scales up");
        assert_eq!(
            n, 1,
            "ends at its minimum with a thousand requests in flight"
        );
    }
}
