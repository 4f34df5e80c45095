//! A routing gateway's view of each model's demand (`sluice_gateway_model_*`): the requests
//! that arrived for it, their first tokens as the clients waited for them, those it refused
//! or could not get served, and the lengths of the prompts refused as too long.
//!
//! The replicas' series alone understate an overload behind a gateway that holds requests
//! until a replica has room and refuses them past its bounds: arrivals counted on replicas are
//! what the fleet already takes in, a replica's TTFT starts when the gateway hands the request
//! over, and a refused request leaves no trace anywhere but here. Where a gateway exports
//! these series, the arrival rates are the larger of its count and the replicas' (a replica
//! may also take traffic that bypasses the gateway), and the TTFT figures are the client's,
//! every unserved request counted as later than any first token.
//!
//! A prompt refused as too long while no ready replica takes it (per-GPU
//! `--max-prompt-tokens`: an L4-only fleet refuses what an H100 serves in time) joins the
//! request shape and the per-second prompt sums when some variant serves it within the TTFT
//! target. The policy sizes prefill and picks its GPUs from them (it keeps slow-prefill
//! variants out of a mix whose prompts they cannot serve); without this it saw only the
//! prompts the fleet already takes. Prompts no variant serves in time stay out: no GPU buys
//! them back.

use std::collections::BTreeMap;

use sluice_metrics::exposition::Sample;
use sluice_metrics::{gateway, vllm};
use sluice_policy::signals::{Arrivals, Latency, SecondSums, WindowShape};

use super::snapshot::{order_key, parse_le, Buckets, Histogram, SummedHistogram, TtftTarget};

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
    /// Estimated lengths of the prompts refused as too long with no ready replica taking
    /// longer ones (`sluice_gateway_model_refused_prompt_tokens`), and their tokens.
    pub refused_prompts: SummedHistogram,
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
            refused_prompts: self
                .refused_prompts
                .increase_since(&earlier.refused_prompts),
        }
    }

    pub fn add(&mut self, o: &FrontDoor) {
        self.arrivals += o.arrivals;
        self.unserved += o.unserved;
        self.ttft.add(&o.ttft);
        self.refused_prompts.add(&o.refused_prompts);
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
pub(super) struct FrontDoors(BTreeMap<String, Parsed>);

/// One model's front-door series as they are parsed.
#[derive(Default)]
struct Parsed {
    arrivals: f64,
    unserved: f64,
    ttft: Buckets,
    refused: Buckets,
    refused_tokens: f64,
}

impl FrontDoors {
    /// Takes `x` if it is one of the front-door series (true), else leaves it (false).
    pub(super) fn record(&mut self, x: &Sample) -> bool {
        let ttft = x.name.strip_prefix(gateway::TIME_TO_FIRST_TOKEN_SECONDS);
        let refused = x.name.strip_prefix(gateway::REFUSED_PROMPT_TOKENS);
        let is_ours = x.name == gateway::ARRIVALS_TOTAL
            || x.name == gateway::UNSERVED_TOTAL
            || ttft.is_some()
            || refused.is_some();
        if !is_ours {
            return false;
        }
        let Some(model) = x.label(gateway::MODEL) else {
            return true;
        };
        let e = self.0.entry(model.to_string()).or_default();
        let le = x.label(vllm::LE).and_then(parse_le);
        let bucket =
            |b: &mut Buckets, le: f64| b.entry(order_key(le)).or_insert((le, 0.0)).1 += x.value;
        match (ttft, refused, le) {
            (Some("_bucket"), _, Some(le)) => bucket(&mut e.ttft, le),
            (_, Some("_bucket"), Some(le)) => bucket(&mut e.refused, le),
            (_, Some("_sum"), _) => e.refused_tokens += x.value,
            _ if x.name == gateway::ARRIVALS_TOTAL => e.arrivals += x.value,
            _ if x.name == gateway::UNSERVED_TOTAL => e.unserved += x.value,
            _ => {}
        }
        true
    }

    pub(super) fn finish(self) -> Option<BTreeMap<String, FrontDoor>> {
        let hist = |b: Buckets| Histogram {
            buckets: b.into_values().collect(),
        };
        (!self.0.is_empty()).then(|| {
            self.0
                .into_iter()
                .map(|(model, p)| {
                    let door = FrontDoor {
                        arrivals: p.arrivals,
                        unserved: p.unserved,
                        ttft: hist(p.ttft),
                        refused_prompts: SummedHistogram {
                            hist: hist(p.refused),
                            sum: p.refused_tokens,
                        },
                    };
                    (model, door)
                })
                .collect()
        })
    }
}

/// The refused prompts of a window no longer than some variant serves in time.
#[derive(Debug, Clone, Default, PartialEq)]
struct RefusedPrompts {
    requests: f64,
    tokens: f64,
    /// Sum of the squared lengths (from the buckets' midpoints).
    squares: f64,
    /// The upper bound of the highest bucket kept (at most the cut).
    longest: f64,
    /// Their lengths: the buckets below the cut, then the cut holding them all.
    lengths: Histogram,
}

impl RefusedPrompts {
    /// Those of `refused` no longer than `longest`, the bucket holding it split linearly (as
    /// [`Histogram::share_at_most`] reads it). Their tokens are the exported sum while none
    /// is cut, else the midpoints'.
    fn within(refused: &SummedHistogram, longest: f64) -> RefusedPrompts {
        let h = &refused.hist;
        let total = h.count();
        let kept = h.share_at_most(longest).unwrap_or(0.0) * total;
        if kept <= 0.0 {
            return RefusedPrompts::default();
        }
        let mut buckets: Vec<(f64, f64)> = h
            .buckets
            .iter()
            .copied()
            .filter(|&(le, _)| le < longest)
            .collect();
        buckets.extend([(longest, kept), (f64::INFINITY, kept)]);
        let cut = Histogram { buckets };
        let (mid_mean, cv2) = cut.mean_cv2().unwrap_or_default();
        let whole = kept >= total * (1.0 - 1e-9);
        let mean = if whole && refused.sum > 0.0 {
            refused.sum / total
        } else {
            mid_mean
        };
        RefusedPrompts {
            requests: kept,
            tokens: mean * kept,
            squares: kept * mean * mean * (1.0 + cv2),
            longest: cut.max_bound().unwrap_or(0.0),
            lengths: cut,
        }
    }

    /// Adds them to the per-second prompt sums, which held only what the gateway sent on;
    /// which second each came in is not exported ([`SecondSums::add_unsummed`] places them).
    fn add_to_seconds(&self, sums: &mut SecondSums) {
        sums.add_unsummed(self.requests, self.tokens, |x| {
            self.lengths.share_at_most(x).unwrap_or(0.0)
        });
    }

    /// Adds them to `shape` as requests: its prompt tokens and spread take theirs in; its
    /// output tokens grow with the count at the served requests' mean (`fallback_output` per
    /// request when the shape holds none).
    fn join(&self, shape: &mut WindowShape, fallback_output: f64) {
        if self.requests <= 0.0 {
            return;
        }
        let served = shape.requests.max(0.0);
        let served_squares = if served > 0.0 {
            let mean = shape.prompt_tokens / served;
            served * mean * mean * (1.0 + shape.prompt_tokens_cv2)
        } else {
            0.0
        };
        let requests = served + self.requests;
        let output_mean = if served > 0.0 {
            shape.output_tokens / served
        } else {
            fallback_output
        };
        shape.prompt_tokens += self.tokens;
        let mean = shape.prompt_tokens / requests;
        shape.prompt_tokens_cv2 = if mean > 0.0 {
            ((served_squares + self.squares) / requests / (mean * mean) - 1.0).max(0.0)
        } else {
            0.0
        };
        shape.output_tokens = output_mean * requests;
        shape.requests = requests;
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
/// the source is young), the latency window and the request shape's wider window, summed
/// over the gateways read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrontDoorWindows {
    pub long: (FrontDoor, f64),
    pub short: (FrontDoor, f64),
    pub latency: FrontDoor,
    /// Read for its refused prompts only ([`Arrivals::wide`]'s window).
    pub wide: FrontDoor,
}

impl FrontDoorWindows {
    /// No counts yet, over arrival windows of `long_s` and `short_s` seconds read by a source
    /// that has seen `seen_s`: each spans no more than that.
    pub fn spanning(long_s: f64, short_s: f64, seen_s: f64) -> FrontDoorWindows {
        let span = |window_s: f64| window_s.min(seen_s.max(0.0)).max(1e-3);
        FrontDoorWindows {
            long: (FrontDoor::default(), span(long_s)),
            short: (FrontDoor::default(), span(short_s)),
            ..FrontDoorWindows::default()
        }
    }

    /// Adds another gateway's counts (the spans stay this one's).
    pub fn add(&mut self, o: &FrontDoorWindows) {
        self.long.0.add(&o.long.0);
        self.short.0.add(&o.short.0);
        self.latency.add(&o.latency);
        self.wide.add(&o.wide);
    }

    /// Folds the gateway's view into what the replicas showed (see the module doc).
    pub fn apply(&self, a: &mut Arrivals, l: &mut Latency, rule: &LatencyRule) {
        if let Some((target, _)) = rule.target {
            self.apply_refused(a, target.longest_prompt_tokens);
        }
        self.apply_arrivals(a);
        self.apply_latency(l, rule);
    }

    /// The refused prompts no longer than `longest` (the longest some variant serves within
    /// the TTFT target) join the long and wide windows' request shapes, as requests with
    /// their prompts and the served requests' mean output, and the per-second prompt sums
    /// (over the wide window).
    fn apply_refused(&self, a: &mut Arrivals, longest: f64) {
        // Before the wide window takes them in: its mean output stands in for the long
        // window's when nothing reached a replica in it.
        let fallback_output = a
            .wide
            .as_ref()
            .map_or(0.0, |w| w.workload().mean_output_tokens);
        let long = RefusedPrompts::within(&self.long.0.refused_prompts, longest);
        if long.requests > 0.0 {
            let span = self.long.1.max(1e-3);
            let mut shape = WindowShape {
                window_s: a.window_s,
                requests: a.requests_per_s * span,
                prompt_tokens: a.prompt_tokens_per_s * span,
                output_tokens: a.output_tokens_per_s * span,
                prompt_tokens_cv2: a.prompt_tokens_cv2,
                output_tokens_cv2: a.output_tokens_cv2,
            };
            long.join(&mut shape, fallback_output);
            a.requests_per_s = shape.requests / span;
            a.prompt_tokens_per_s = shape.prompt_tokens / span;
            a.output_tokens_per_s = shape.output_tokens / span;
            a.prompt_tokens_cv2 = shape.prompt_tokens_cv2;
            a.max_prompt_tokens = a.max_prompt_tokens.max(long.longest.round() as u64);
        }
        let wide = RefusedPrompts::within(&self.wide.refused_prompts, longest);
        if let Some(shape) = a.wide.as_mut() {
            wide.join(shape, 0.0);
        }
        if let Some(sums) = a.per_second.as_mut() {
            wide.add_to_seconds(sums);
        }
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
            ..FrontDoor::default()
        }
    }

    /// `short` refused prompts of 3,000 tokens (bucket `(2048, 4096]`) and `long` of 20,000
    /// (`(16384, 32768]`), with their exact sum.
    fn refused(short: f64, long: f64) -> SummedHistogram {
        SummedHistogram {
            hist: Histogram {
                buckets: vec![
                    (2048.0, 0.0),
                    (4096.0, short),
                    (16384.0, short),
                    (32768.0, short + long),
                    (f64::INFINITY, short + long),
                ],
            },
            sum: 3000.0 * short + 20_000.0 * long,
        }
    }

    /// 300 requests of 1,000 prompt and 200 output tokens served in the minute, 50 in the
    /// short window's 10 s.
    fn served_minute() -> Arrivals {
        Arrivals::from_shape(
            &WindowShape {
                window_s: 60.0,
                requests: 300.0,
                prompt_tokens: 300.0 * 1000.0,
                output_tokens: 300.0 * 200.0,
                ..WindowShape::default()
            },
            60.0,
            (10.0, 5.0),
        )
    }

    /// [`served_minute`] with its largest prompt, per-second sums and wider window.
    fn served() -> Arrivals {
        let mut a = served_minute();
        a.max_prompt_tokens = 1024;
        // 420 seconds with arrivals, each of 1,000 prompt tokens.
        a.per_second = Some(SecondSums {
            buckets: vec![
                (512.0, 0.0),
                (1024.0, 420.0),
                (4096.0, 420.0),
                (f64::INFINITY, 420.0),
            ],
            sum: 420_000.0,
        });
        a.wide = Some(WindowShape {
            window_s: 420.0,
            requests: 2100.0,
            prompt_tokens: 2100.0 * 1000.0,
            output_tokens: 2100.0 * 200.0,
            ..WindowShape::default()
        });
        a
    }

    /// Prompts refused as too long that some variant serves (up to the rule's 8,000 tokens)
    /// join the request shape: 60 of 3,000 tokens beside 300 of 1,000 raise the mean prompt
    /// to 1,333 and its spread, and keep the served requests' 200 output tokens; the 30 of
    /// 20,000, which no variant serves in time, stay out.
    #[test]
    fn refused_prompts_some_variant_serves_join_the_request_shape() {
        let mut a = served();
        let w = FrontDoorWindows {
            long: (
                FrontDoor {
                    arrivals: 390.0,
                    refused_prompts: refused(60.0, 30.0),
                    ..FrontDoor::default()
                },
                60.0,
            ),
            wide: FrontDoor {
                refused_prompts: refused(420.0, 210.0),
                ..FrontDoor::default()
            },
            ..FrontDoorWindows::default()
        };
        w.apply(&mut a, &mut Latency::default(), &rule());
        // The gateway's 390 arrivals over the 360 the shape now holds: its rate, the shape's
        // means.
        assert!((a.requests_per_s - 6.5).abs() < 1e-9);
        let mean_prompt = a.prompt_tokens_per_s / a.requests_per_s;
        let mean_output = a.output_tokens_per_s / a.requests_per_s;
        // Cut at 8,000, the refused read at their bucket's midpoint, 3,072.
        let expect = (300.0 * 1000.0 + 60.0 * 3072.0) / 360.0;
        assert!((mean_prompt - expect).abs() < 1e-6, "{mean_prompt}");
        assert!((mean_output - 200.0).abs() < 1e-9, "{mean_output}");
        assert!(a.prompt_tokens_cv2 > 0.2, "{}", a.prompt_tokens_cv2);
        assert_eq!(a.max_prompt_tokens, 4096);
        let wide = a.wide.unwrap().workload();
        assert!((wide.mean_prompt_tokens - expect).abs() < 1e-6);
        assert!((wide.mean_output_tokens - 200.0).abs() < 1e-9);
        // The wider window's 420 refused prompts of 2,048–4,096 tokens each join a second of
        // 1,000: about half of those seconds are still within 4,096.
        let sums = a.per_second.unwrap();
        let counts: Vec<f64> = sums.buckets.iter().map(|b| b.1).collect();
        let within = 420.0 * (4096.0 - 1000.0 - 2048.0) / 2048.0;
        assert_eq!(counts, vec![0.0, 0.0, within, 420.0]);
        assert!((sums.sum - (420_000.0 + 420.0 * 3072.0)).abs() < 1e-6);
    }

    /// With none cut, the refused prompts' tokens are the exported sum; with no TTFT target
    /// (nothing says what some variant serves) none joins.
    #[test]
    fn the_exported_sum_counts_when_none_is_cut_and_nothing_joins_without_a_target() {
        let w = FrontDoorWindows {
            long: (
                FrontDoor {
                    refused_prompts: refused(60.0, 0.0),
                    ..FrontDoor::default()
                },
                60.0,
            ),
            ..FrontDoorWindows::default()
        };
        let mut a = served();
        w.apply(&mut a, &mut Latency::default(), &rule());
        let expect = (300.0 * 1000.0 + 60.0 * 3000.0) / 60.0;
        assert!((a.prompt_tokens_per_s - expect).abs() < 1e-6);
        let mut b = served();
        let no_target = LatencyRule {
            target: None,
            ..rule()
        };
        w.apply(&mut b, &mut Latency::default(), &no_target);
        assert_eq!(b, served());
    }

    /// Every request of the window refused (a fleet of small GPUs, long prompts): the shape is
    /// the refused prompts with the wider window's output length.
    #[test]
    fn a_window_of_refusals_alone_takes_the_wider_windows_output() {
        let mut a = served();
        a.requests_per_s = 0.0;
        a.prompt_tokens_per_s = 0.0;
        a.output_tokens_per_s = 0.0;
        let w = FrontDoorWindows {
            long: (
                FrontDoor {
                    arrivals: 60.0,
                    refused_prompts: refused(60.0, 0.0),
                    ..FrontDoor::default()
                },
                60.0,
            ),
            ..FrontDoorWindows::default()
        };
        w.apply(&mut a, &mut Latency::default(), &rule());
        assert_eq!(a.requests_per_s, 1.0);
        assert_eq!(a.prompt_tokens_per_s, 3000.0);
        assert_eq!(a.output_tokens_per_s, 200.0);
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
        let mut a = served_minute();
        let mut l = Latency {
            ttft_p99_s: Some(0.4),
            ttft_attainment: Some(1.0),
            ..Latency::default()
        };
        let w = FrontDoorWindows {
            long: (door(600.0, 200.0, 300.0, 0.0), 60.0),
            short: (door(150.0, 0.0, 0.0, 0.0), 10.0),
            latency: door(600.0, 200.0, 300.0, 100.0),
            ..FrontDoorWindows::default()
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
            ..FrontDoorWindows::default()
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
