//! The simulator's queueing against closed forms, on a fixed fleet (a policy that never
//! changes it) fed Poisson arrivals.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use sluice_policy::capacity::{self, Planning, Slo, Workload};
use sluice_policy::decision::{Decision, Target};
use sluice_policy::policy::Policy;
use sluice_policy::profile::Profile;
use sluice_policy::signals::Signals;
use sluice_policy::timeline::Request;
use sluice_sim::sim::{self, SimConfig};

/// Keeps whatever fleet the run started with.
#[derive(Debug)]
struct Fixed;

impl Policy for Fixed {
    fn name(&self) -> &str {
        "fixed"
    }

    fn decide(&mut self, s: &Signals) -> Decision {
        let mut d = Decision::default();
        for v in &s.variants {
            d.targets.push(Target {
                variant: v.variant.clone(),
                capacity: v.capacity,
                replicas: v.ready + v.starting + v.pending,
            });
        }
        d
    }
}

const SLO: Slo = Slo {
    ttft_p99_s: 2.0,
    tpot_p99_s: 0.1,
};

fn arrivals(
    rate: f64,
    n: usize,
    seed: u64,
    mut shape: impl FnMut(&mut ChaCha8Rng) -> (u32, u32),
) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += -rng.random::<f64>().max(1e-12).ln() / rate;
            let (prompt_tokens, output_tokens) = shape(&mut rng);
            Request {
                arrival_s: t,
                prompt_tokens,
                output_tokens,
            }
        })
        .collect()
}

/// A run of `reqs` on one replica of the profile's first variant, kept as it is.
fn one_replica(cfg: &SimConfig, profile: &Profile, reqs: &[Request]) -> sim::Run {
    sim::run(
        cfg,
        profile,
        &SLO,
        &Planning::default(),
        reqs,
        &mut Fixed,
        sim::Start::cold(&[1, 0]),
    )
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// One server that only prefills, at 1,000 prompt tokens/s with no step overhead.
fn prefill_only() -> Profile {
    Profile::parse("mg1", prefill_only_text()).unwrap()
}

fn prefill_only_text() -> &'static str {
    r#"
        [model]
        name = "mg1"
        max_context_tokens = 1000000
        [[variant]]
        name = "server"
        accelerator = "test"
        gpus_per_replica = 1
        gpus_per_node = 1
        gpu_memory_gib = 1.0
        [variant.perf]
        itl_alpha_ms = 0.000001
        itl_beta_ms = 0.0
        prefill_tokens_per_s = 1000.0
        kv_cache_tokens = 100000000
        max_num_seqs = 100000
        max_batched_tokens = 100000
        [variant.price]
        on_demand_per_gpu_hour = 1.0
        on_demand_host_per_node_hour = 0.0
        spot_per_gpu_hour = 1.0
        spot_host_per_node_hour = 0.0
        [variant.startup]
        node_provision_s = 0.0
        image_pull_s = 0.0
        model_load_s = 0.0
        "#
}

/// A replica that only prefills (one output token, so a request ends at its first token), with
/// no per-step overhead and a step budget larger than any prompt, is a single FIFO server whose
/// service time is prompt / prefill rate: an M/G/1 queue. The mean time to first token must be
/// Pollaczek–Khinchine's `E[S] + λE[S²] / (2(1 − ρ))`, with the moments of the service times
/// actually drawn.
#[test]
fn a_prefill_only_replica_is_an_mg1_queue() {
    let profile = prefill_only();
    for (rate, seed) in [(4.0, 1), (7.0, 2)] {
        // Exponential prompts of mean 100 tokens: service mean 0.1 s.
        let reqs = arrivals(rate, 60_000, seed, |rng| {
            (
                (-rng.random::<f64>().max(1e-12).ln() * 100.0)
                    .round()
                    .max(1.0) as u32,
                1,
            )
        });
        let run = one_replica(&SimConfig::default(), &profile, &reqs);
        let s: Vec<f64> = reqs
            .iter()
            .map(|r| f64::from(r.prompt_tokens) / 1000.0)
            .collect();
        let s2: Vec<f64> = s.iter().map(|x| x * x).collect();
        let lambda = reqs.len() as f64 / reqs.last().unwrap().arrival_s;
        let rho = lambda * mean(&s);
        let expected = mean(&s) + lambda * mean(&s2) / (2.0 * (1.0 - rho));
        let ttft: Vec<f64> = run.outcomes.iter().map(|o| o.ttft_s.unwrap()).collect();
        let got = mean(&ttft);
        assert!(
            (got / expected - 1.0).abs() < 0.06,
            "ρ {rho:.2}: mean TTFT {got:.4} s, M/G/1 {expected:.4} s"
        );
        assert!(run
            .outcomes
            .iter()
            .all(|o| !o.failed && o.tpot_s == Some(0.0)));
    }
}

/// Decoding replicas: the simulator's mean TPOT agrees with the capacity model's step-time
/// formula `(α + β·b) / (1 − λP/R)` with `b` from Little's law, from light to heavy load.
#[test]
fn mean_tpot_matches_the_capacity_model() {
    let profile = Profile::load("llama-3-8b")
        .unwrap()
        .restrict(&["nvidia-h100-80gb".into()])
        .unwrap();
    let v = &profile.variants[0];
    let w = Workload::uniform(1000.0, 200.0);
    let cap = capacity::at_slo(v, &w, &SLO, &Planning::default());
    for share in [0.3, 0.6, 0.9] {
        let rate = share * cap.requests_per_s;
        let reqs = arrivals(rate, 20_000, 7, |_| (1000, 200));
        let run = one_replica(&SimConfig::default(), &profile, &reqs);
        let tpot: Vec<f64> = run
            .outcomes
            .iter()
            .skip(2000)
            .filter_map(|o| o.tpot_s)
            .collect();
        let b = capacity::batch_at_rate(v, &w, rate).unwrap();
        let model = v.itl_s(b) / (1.0 - rate * 1000.0 / v.perf.prefill_tokens_per_s);
        let got = mean(&tpot);
        assert!(
            (got / model - 1.0).abs() < 0.1,
            "load {share}: sim {:.2} ms, model {:.2} ms",
            got * 1e3,
            model * 1e3
        );
    }
    // Billing: one H100 node for the whole run.
    let reqs = arrivals(1.0, 3600, 3, |_| (100, 10));
    let run = one_replica(&SimConfig::default(), &profile, &reqs);
    assert!((run.cost_usd - run.end_s / 3600.0 * 9.88).abs() < 1e-6);
    assert!((run.gpu_hours - run.end_s / 3600.0).abs() < 1e-9);
}

/// A backlog of 100 prompts (10 s of prefill) at once, then 2 requests/s for a minute, on one
/// prefill-only server. First come, first served, everything arriving in the backlog's first
/// ~8 s queues behind it and misses a 2 s TTFT; with late requests yielding (the gateway's
/// `--queue-late-after`, here 1.5 s), the arrivals after the backlog are served on time and
/// the backlog in the gaps between them. Every request is still served.
#[test]
fn late_requests_yield_to_those_still_on_time() {
    let profile = prefill_only();
    let mut reqs: Vec<Request> = (0..100)
        .map(|i| Request {
            arrival_s: f64::from(i) * 1e-3,
            prompt_tokens: 100,
            output_tokens: 1,
        })
        .collect();
    reqs.extend(
        arrivals(2.0, 120, 5, |_| (100, 1))
            .into_iter()
            .map(|r| Request {
                arrival_s: r.arrival_s + 1.0,
                ..r
            }),
    );
    let after_backlog = |share: Option<f64>| {
        let cfg = SimConfig {
            queue_late_after_share: share,
            ..SimConfig::default()
        };
        let run = one_replica(&cfg, &profile, &reqs);
        assert!(run.outcomes.iter().all(|o| !o.failed && o.ttft_s.is_some()));
        let later = &run.outcomes[100..];
        let met = later
            .iter()
            .filter(|o| o.ttft_s.unwrap() <= SLO.ttft_p99_s)
            .count();
        met as f64 / later.len() as f64
    };
    let fifo = after_backlog(None);
    let yielding = after_backlog(Some(0.75));
    assert!(fifo < 0.9, "first come, first served: {fifo}");
    assert!(yielding > 0.99, "late requests yielding: {yielding}");
}

/// The gateway's bounds, as `sluice serve` sets them: a burst larger than its queue is
/// refused past `--max-queue`, and what waited past `--queue-timeout` is refused too, so the
/// arrivals after the burst are served on time instead of behind it. Unbounded, every request
/// is served, the later ones late. First come, first served in both, to see the bounds alone.
#[test]
fn the_gateways_queue_bounds_refuse_a_backlog_no_target_could_meet() {
    let profile = prefill_only();
    // 300 one-second prompts at once, then one every two seconds from 5 s on.
    let mut reqs: Vec<Request> = (0..300)
        .map(|i| Request {
            arrival_s: f64::from(i) * 1e-4,
            prompt_tokens: 1000,
            output_tokens: 1,
        })
        .collect();
    reqs.extend(
        arrivals(0.5, 100, 3, |_| (100, 1))
            .into_iter()
            .map(|r| Request {
                arrival_s: r.arrival_s + 5.0,
                ..r
            }),
    );
    let run = |limits: sim::QueueLimits| {
        let cfg = SimConfig {
            queue_late_after_share: None,
            queue_limits: limits,
            ..SimConfig::default()
        };
        one_replica(&cfg, &profile, &reqs)
    };
    let in_time_after = |r: &sim::Run, from_s: f64| {
        let later: Vec<_> = r.outcomes[300..]
            .iter()
            .filter(|o| o.arrival_s >= from_s)
            .collect();
        let met = later
            .iter()
            .filter(|o| o.ttft_s.is_some_and(|t| t <= SLO.ttft_p99_s))
            .count();
        met as f64 / later.len() as f64
    };
    let open = run(sim::QueueLimits::NONE);
    assert!(open.outcomes.iter().all(|o| !o.failed));
    assert!(in_time_after(&open, 60.0) < 0.5, "behind the backlog");

    let bounded = run(sim::QueueLimits {
        max_queue: Some(100),
        queue_timeout_s: Some(30.0),
        hold_timeout_s: Some(60.0),
    });
    let refused: Vec<usize> = (0..reqs.len())
        .filter(|&i| bounded.outcomes[i].failed)
        .collect();
    // The burst past the queue's hundred at once, and the rest of it after 30 s of waiting:
    // about 30 served, the other ~270 refused; nothing after the burst.
    assert!((250..=280).contains(&refused.len()), "{}", refused.len());
    assert!(refused.iter().all(|&i| i < 300));
    assert!(in_time_after(&bounded, 60.0) > 0.99);
}

/// Keeps its fleet, as [`Fixed`], and every tick's signals.
#[derive(Debug, Default)]
struct Watching(Vec<Signals>);

impl Policy for Watching {
    fn name(&self) -> &str {
        "watching"
    }

    fn decide(&mut self, s: &Signals) -> Decision {
        self.0.push(s.clone());
        Fixed.decide(s)
    }
}

/// A run of `reqs` from a cold `fleet` kept as it is, with the signals of every tick.
fn watched(
    cfg: &SimConfig,
    profile: &Profile,
    reqs: &[Request],
    fleet: &[u32],
) -> (sim::Run, Vec<Signals>) {
    let mut watching = Watching::default();
    let start = sim::Start::cold(fleet);
    let run = sim::run(
        cfg,
        profile,
        &SLO,
        &Planning::default(),
        reqs,
        &mut watching,
        start,
    );
    (run, watching.0)
}

/// Prompts of 100 tokens at 0.5/s, and every 20 s one of 5,000 (5 s to prefill at 1,000
/// tokens/s, where the target is 2).
fn short_and_long_prompts() -> Vec<Request> {
    let mut reqs = arrivals(0.5, 600, 4, |_| (100, 1));
    reqs.extend((0..60).map(|i| Request {
        arrival_s: 10.0 + 20.0 * f64::from(i),
        prompt_tokens: 5000,
        output_tokens: 1,
    }));
    reqs.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    reqs
}

/// Replicas run with `--max-prompt-tokens` (`SimConfig::max_prompt_tokens`): a prompt past it
/// is refused at arrival and takes no prefill, so the short prompts behind it keep their
/// time. The policy sees what a controller would: the gateway counts the refused request's
/// arrival but not its prompt in the per-second sums, the replicas' token counters and
/// largest prompt leave it out.
#[test]
fn prompts_past_the_replicas_bound_are_refused_and_take_no_prefill() {
    let profile = prefill_only();
    let reqs = short_and_long_prompts();
    let run = |bound: Option<u32>| {
        let cfg = SimConfig {
            max_prompt_tokens: bound,
            ..SimConfig::default()
        };
        watched(&cfg, &profile, &reqs, &[1])
    };
    let short_in_time = |r: &sim::Run| {
        let short: Vec<_> = reqs
            .iter()
            .zip(&r.outcomes)
            .filter(|(q, _)| q.prompt_tokens == 100)
            .collect();
        let met = short
            .iter()
            .filter(|(_, o)| o.ttft_s.is_some_and(|t| t <= SLO.ttft_p99_s))
            .count();
        met as f64 / short.len() as f64
    };
    // The signals of the tick at 300 s: a full minute's window holding three long prompts.
    let at_300 = |seen: &[Signals]| {
        seen.iter()
            .find(|s| s.time_s >= 300.0)
            .unwrap()
            .arrivals
            .clone()
    };

    let (open, seen) = run(None);
    assert!(open.outcomes.iter().all(|o| !o.failed));
    assert!(short_in_time(&open) < 0.95, "{}", short_in_time(&open));
    let open_arrivals = at_300(&seen);
    assert_eq!(open_arrivals.max_prompt_tokens, 5000);

    let (bounded, seen) = run(Some(2000));
    for (r, o) in reqs.iter().zip(&bounded.outcomes) {
        assert_eq!(o.failed, r.prompt_tokens > 2000, "{r:?}");
    }
    assert!(
        short_in_time(&bounded) > 0.99,
        "{}",
        short_in_time(&bounded)
    );
    let a = at_300(&seen);
    assert_eq!(
        a.requests_per_s, open_arrivals.requests_per_s,
        "the gateway counts every arrival"
    );
    assert_eq!(a.max_prompt_tokens, 100);
    assert!(a.prompt_tokens_per_s < open_arrivals.prompt_tokens_per_s / 3.0);
    let per_second = |a: &sluice_policy::signals::Arrivals| a.per_second.as_ref().unwrap().sum;
    assert!(per_second(&a) > 0.0);
    assert!(per_second(&a) < per_second(&open_arrivals) / 3.0);
}

/// Two servers that only prefill, one at 1,000 prompt tokens/s and one at 4,000: within the
/// 2 s target they take prompts of about 2,000 and 8,000 tokens.
fn slow_and_fast() -> Profile {
    let text = prefill_only_text();
    let fast = text
        .split("[[variant]]")
        .nth(1)
        .unwrap()
        .replace("name = \"server\"", "name = \"fast\"")
        .replace(
            "prefill_tokens_per_s = 1000.0",
            "prefill_tokens_per_s = 4000.0",
        );
    Profile::parse("two", &format!("{text}\n[[variant]]{fast}")).unwrap()
}

/// Each variant's replicas run their own `--max-prompt-tokens`
/// (`SimConfig::per_variant_prompt_bounds`): a prompt of 5,000 tokens goes to the fast
/// server only, so the short prompts on the slow one keep their time. With the slow server
/// alone it is refused, and the policy sees what a controller would: the prompt's length in the
/// request shape and in the per-second sums (from the gateway's refused-prompt histogram: the
/// fast variant serves it), where the gateway left it out.
#[test]
fn per_variant_bounds_send_each_prompt_to_a_replica_that_takes_it() {
    let profile = slow_and_fast();
    let reqs = short_and_long_prompts();
    let cfg = SimConfig {
        per_variant_prompt_bounds: true,
        ..SimConfig::default()
    };
    let run = |fleet: &[u32]| {
        let (run, seen) = watched(&cfg, &profile, &reqs, fleet);
        let at_300 = seen.into_iter().find(|s| s.time_s >= 300.0).unwrap();
        (run, at_300.arrivals)
    };
    let in_time = |r: &sim::Run| {
        r.outcomes
            .iter()
            .filter(|o| o.ttft_s.is_some_and(|t| t <= SLO.ttft_p99_s))
            .count()
    };

    // Keys: slow on demand, slow on Spot, fast on demand, fast on Spot.
    let (both, both_seen) = run(&[1, 0, 1, 0]);
    assert!(both.outcomes.iter().all(|o| !o.failed));
    assert_eq!(
        in_time(&both),
        reqs.len(),
        "each prompt on a server that takes it"
    );

    let (slow, slow_seen) = run(&[1, 0, 0, 0]);
    for (r, o) in reqs.iter().zip(&slow.outcomes) {
        assert_eq!(o.failed, r.prompt_tokens > 2000, "{r:?}");
    }
    assert_eq!(slow_seen.max_prompt_tokens, 5000, "in the shape");
    assert_eq!(slow_seen.prompt_tokens_per_s, both_seen.prompt_tokens_per_s);
    let (slow_sums, both_sums) = (slow_seen.per_second.unwrap(), both_seen.per_second.unwrap());
    assert!((slow_sums.sum - both_sums.sum).abs() < 1e-6);
    // The long prompts' seconds are past what one server prefills in the target either way.
    let late = |s: &sluice_policy::signals::SecondSums| s.excess_share(2000.0).unwrap();
    assert!(
        (late(&slow_sums) - late(&both_sums)).abs() < 0.05,
        "{} vs {}",
        late(&slow_sums),
        late(&both_sums)
    );
    assert!(late(&slow_sums) > 0.3);
}
