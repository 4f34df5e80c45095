//! A routing gateway's view of each model's demand (`sluice_gateway_model_*`): the requests
//! that arrived for it, their first tokens as the clients waited for them, and those it
//! refused or could not get served.
//!
//! The replicas' series alone understate an overload behind a gateway that holds requests
//! until a replica has room and refuses them past its bounds: arrivals counted on replicas are
//! what the fleet already takes in, a replica's TTFT starts when the gateway hands the request
//! over, and a refused request leaves no trace anywhere but here. Where a gateway exports
//! these series, the arrival rates are the larger of its count and the replicas' (a replica
//! may also take traffic that bypasses the gateway), and the TTFT figures are the client's,
//! every unserved request counted as later than any first token.

use std::collections::BTreeMap;

use sluice_metrics::exposition::Sample;
use sluice_metrics::{gateway, vllm};
use sluice_policy::signals::{Arrivals, Latency};

use super::snapshot::{order_key, parse_le, Buckets, Histogram, TtftTarget};

/// One model's front-door series, cumulative as exported or an increase over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrontDoor {
    /// Requests that arrived (`sluice_gateway_model_arrivals_total`).
    pub arrivals: f64,
    /// Requests that ended without a first token for want of capacity
    /// (`sluice_gateway_model_unserved_total`, every reason).
    pub unserved: f64,
    /// Arrival to first token, as the client waited
    /// (`sluice_gateway_model_time_to_first_token_seconds`).
    pub ttft: Histogram,
}

impl FrontDoor {
    /// The increase from `earlier` to `self`; a count that fell means the gateway restarted,
    /// and the whole of `self` is the increase.
    pub fn increase_since(&self, earlier: &FrontDoor) -> FrontDoor {
        let reset = self.arrivals < earlier.arrivals;
        let step = |now: f64, before: f64| if reset { now } else { (now - before).max(0.0) };
        FrontDoor {
            arrivals: step(self.arrivals, earlier.arrivals),
            unserved: step(self.unserved, earlier.unserved),
            ttft: self.ttft.increase_since(&earlier.ttft),
        }
    }

    pub fn add(&mut self, o: &FrontDoor) {
        self.arrivals += o.arrivals;
        self.unserved += o.unserved;
        self.ttft.add(&o.ttft);
    }

    /// The first tokens with every unserved request counted in `+Inf`: later than any.
    fn ttft_with_unserved(&self) -> Histogram {
        let mut h = self.ttft.clone();
        if self.unserved > 0.0 {
            h.add(&Histogram {
                buckets: vec![(f64::INFINITY, self.unserved)],
            });
        }
        h
    }
}

/// The front-door series of one scrape as they are parsed, per model.
#[derive(Default)]
pub(super) struct FrontDoors(BTreeMap<String, (f64, f64, Buckets)>);

impl FrontDoors {
    /// Takes `x` if it is one of the front-door series (true), else leaves it (false).
    pub(super) fn record(&mut self, x: &Sample) -> bool {
        let ttft_bucket = x
            .name
            .strip_prefix(gateway::TIME_TO_FIRST_TOKEN_SECONDS)
            .map(|suffix| suffix == "_bucket");
        let is_ours = x.name == gateway::ARRIVALS_TOTAL
            || x.name == gateway::UNSERVED_TOTAL
            || ttft_bucket.is_some();
        if !is_ours {
            return false;
        }
        let Some(model) = x.label(gateway::MODEL) else {
            return true;
        };
        let e = self.0.entry(model.to_string()).or_default();
        if x.name == gateway::ARRIVALS_TOTAL {
            e.0 += x.value;
        } else if x.name == gateway::UNSERVED_TOTAL {
            e.1 += x.value;
        } else if let (Some(true), Some(le)) = (ttft_bucket, x.label(vllm::LE).and_then(parse_le)) {
            e.2.entry(order_key(le)).or_insert((le, 0.0)).1 += x.value;
        }
        true
    }

    pub(super) fn finish(self) -> Option<BTreeMap<String, FrontDoor>> {
        (!self.0.is_empty()).then(|| {
            self.0
                .into_iter()
                .map(|(model, (arrivals, unserved, buckets))| {
                    let ttft = Histogram {
                        buckets: buckets.into_values().collect(),
                    };
                    let door = FrontDoor {
                        arrivals,
                        unserved,
                        ttft,
                    };
                    (model, door)
                })
                .collect()
        })
    }
}

/// How the latency figures are read: the SLO's TTFT quantile, and the attainment's target
/// with the share of the window's prompts some variant serves alone within it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyRule {
    pub ttft_quantile: f64,
    pub target: Option<(TtftTarget, f64)>,
}

/// A model's front door over the arrival windows (with the seconds each spans, shorter while
/// the source is young) and the latency window, summed over the gateways read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrontDoorWindows {
    pub long: (FrontDoor, f64),
    pub short: (FrontDoor, f64),
    pub latency: FrontDoor,
}

impl FrontDoorWindows {
    /// No counts yet, over arrival windows of `long_s` and `short_s` seconds read by a source
    /// that has seen `seen_s`: each spans no more than that.
    pub fn spanning(long_s: f64, short_s: f64, seen_s: f64) -> FrontDoorWindows {
        let span = |window_s: f64| window_s.min(seen_s.max(0.0)).max(1e-3);
        FrontDoorWindows {
            long: (FrontDoor::default(), span(long_s)),
            short: (FrontDoor::default(), span(short_s)),
            latency: FrontDoor::default(),
        }
    }

    /// Adds another gateway's counts (the spans stay this one's).
    pub fn add(&mut self, o: &FrontDoorWindows) {
        self.long.0.add(&o.long.0);
        self.short.0.add(&o.short.0);
        self.latency.add(&o.latency);
    }

    /// Folds the gateway's view into what the replicas showed (see the module doc).
    pub fn apply(&self, a: &mut Arrivals, l: &mut Latency, rule: &LatencyRule) {
        self.apply_arrivals(a);
        self.apply_latency(l, rule);
    }

    /// The long and short rates become the larger of the two counts'; tokens per request stay
    /// the replicas' (over the long window, else the wider one), which the gateway cannot
    /// count for requests it never sent on.
    fn apply_arrivals(&self, a: &mut Arrivals) {
        let rate = |(door, span): &(FrontDoor, f64)| door.arrivals / span.max(1e-3);
        let long = rate(&self.long);
        if long > a.requests_per_s {
            let (prompt, output) = if a.requests_per_s > 0.0 {
                let n = a.requests_per_s;
                (a.prompt_tokens_per_s / n, a.output_tokens_per_s / n)
            } else {
                a.wide
                    .as_ref()
                    .filter(|w| w.requests > 0.0)
                    .map_or((0.0, 0.0), |w| {
                        let m = w.workload();
                        (m.mean_prompt_tokens, m.mean_output_tokens)
                    })
            };
            a.requests_per_s = long;
            a.prompt_tokens_per_s = long * prompt;
            a.output_tokens_per_s = long * output;
        }
        a.short_requests_per_s = a.short_requests_per_s.max(rate(&self.short));
    }

    /// With any first token or unserved request at the gateway in the window, the TTFT
    /// quantiles and attainment are the client's, unserved requests counted as late.
    fn apply_latency(&self, l: &mut Latency, rule: &LatencyRule) {
        let ttft = self.latency.ttft_with_unserved();
        if ttft.count() <= 0.0 {
            return;
        }
        l.ttft_p50_s = ttft.quantile(0.5);
        l.ttft_p99_s = ttft.quantile(rule.ttft_quantile);
        if let Some((target, feasible)) = rule.target {
            l.ttft_attainment = target.attainment_of(&ttft, feasible);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::signals::WindowShape;

    fn door(arrivals: f64, unserved: f64, within: f64, late: f64) -> FrontDoor {
        FrontDoor {
            arrivals,
            unserved,
            ttft: Histogram {
                buckets: vec![
                    (2.0, within),
                    (10.0, within + late),
                    (f64::INFINITY, within + late),
                ],
            },
        }
    }

    fn rule() -> LatencyRule {
        let target = TtftTarget {
            target_s: 2.0,
            longest_prompt_tokens: 8000.0,
        };
        LatencyRule {
            ttft_quantile: 0.99,
            target: Some((target, 0.9)),
        }
    }

    /// An overload the gateway sheds: 600 arrived in the minute, 300 reached replicas (which
    /// served them quickly), 200 were refused. The rate is the gateway's, the request shape
    /// the replicas'; the attainment counts the refused as late.
    #[test]
    fn a_shed_overload_reads_as_the_demand_and_the_misses_it_is() {
        let mut a = Arrivals::from_shape(
            &WindowShape {
                window_s: 60.0,
                requests: 300.0,
                prompt_tokens: 300.0 * 1000.0,
                output_tokens: 300.0 * 200.0,
                ..WindowShape::default()
            },
            60.0,
            (10.0, 5.0),
        );
        let mut l = Latency {
            ttft_p99_s: Some(0.4),
            ttft_attainment: Some(1.0),
            ..Latency::default()
        };
        let w = FrontDoorWindows {
            long: (door(600.0, 200.0, 300.0, 0.0), 60.0),
            short: (door(150.0, 0.0, 0.0, 0.0), 10.0),
            latency: door(600.0, 200.0, 300.0, 100.0),
        };
        w.apply(&mut a, &mut l, &rule());
        assert_eq!(a.requests_per_s, 10.0);
        assert_eq!(a.prompt_tokens_per_s, 10_000.0);
        assert_eq!(a.output_tokens_per_s, 2_000.0);
        assert_eq!(a.short_requests_per_s, 15.0);
        // 300 of 600 within 2 s, over the 90 % feasible share.
        let att = l.ttft_attainment.unwrap();
        assert!((att - 0.5 / 0.9).abs() < 1e-9, "{att}");
        // A third are unserved: the p99 is past every finite bound's rank, the highest bound.
        assert_eq!(l.ttft_p99_s, Some(10.0));
    }

    /// Traffic that bypasses the gateway (or gateway pods not read) keeps the replicas'
    /// larger count; a window without a first token or a refusal at the gateway keeps the
    /// replicas' latency.
    #[test]
    fn the_larger_count_wins_and_an_empty_window_changes_no_latency() {
        let shape = WindowShape {
            window_s: 60.0,
            requests: 600.0,
            prompt_tokens: 600.0,
            ..WindowShape::default()
        };
        let mut a = Arrivals::from_shape(&shape, 60.0, (10.0, 12.0));
        let before = a.clone();
        let mut l = Latency {
            ttft_p99_s: Some(0.4),
            ..Latency::default()
        };
        let quiet = FrontDoorWindows {
            long: (door(60.0, 0.0, 0.0, 0.0), 60.0),
            short: (door(10.0, 0.0, 0.0, 0.0), 10.0),
            latency: FrontDoor::default(),
        };
        quiet.apply(&mut a, &mut l, &rule());
        assert_eq!(a, before);
        assert_eq!(l.ttft_p99_s, Some(0.4));
    }

    /// Nothing reached a replica (a pool at zero, or every request refused): the shape comes
    /// from the wider window.
    #[test]
    fn with_no_replica_arrivals_the_shape_is_the_wider_windows() {
        let mut a = Arrivals {
            window_s: 60.0,
            wide: Some(WindowShape {
                window_s: 420.0,
                requests: 10.0,
                prompt_tokens: 5000.0,
                output_tokens: 1000.0,
                ..WindowShape::default()
            }),
            ..Arrivals::default()
        };
        let w = FrontDoorWindows {
            long: (door(120.0, 120.0, 0.0, 0.0), 60.0),
            ..FrontDoorWindows::default()
        };
        w.apply(&mut a, &mut Latency::default(), &rule());
        assert_eq!(
            (
                a.requests_per_s,
                a.prompt_tokens_per_s,
                a.output_tokens_per_s
            ),
            (2.0, 1000.0, 200.0)
        );
    }

    #[test]
    fn increases_handle_a_gateway_restart() {
        let (a, b) = (
            door(100.0, 10.0, 80.0, 10.0),
            door(130.0, 12.0, 100.0, 18.0),
        );
        let step = b.increase_since(&a);
        assert_eq!((step.arrivals, step.unserved), (30.0, 2.0));
        assert_eq!(step.ttft.count(), 28.0);
        let restarted = door(5.0, 1.0, 4.0, 0.0);
        assert_eq!(restarted.increase_since(&b), restarted);
    }
}
