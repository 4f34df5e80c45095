//! The simulator's queueing against closed forms, on a fixed fleet (a policy that never
//! changes it), with Poisson arrivals.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use sluice_autoscaler::capacity::{self, Planning, Slo, Workload};
use sluice_autoscaler::decision::Decision;
use sluice_autoscaler::policy::Policy;
use sluice_autoscaler::profile::Profile;
use sluice_autoscaler::signals::Signals;
use sluice_autoscaler::sim::{self, SimConfig};
use sluice_autoscaler::trace::Request;

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
            d.targets.push(sluice_autoscaler::decision::Target {
                variant: v.variant.clone(),
                capacity: v.capacity,
                replicas: v.ready + v.starting + v.pending,
            });
        }
        d
    }
}

fn poisson(rate: f64, n: usize, prompt: u32, output: u32, seed: u64) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += -rng.random::<f64>().max(1e-12).ln() / rate;
            Request {
                arrival_s: t,
                prompt_tokens: prompt,
                output_tokens: output,
            }
        })
        .collect()
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn mean_tpot_matches_the_capacity_model() {
    let profile = Profile::load("llama-3-8b")
        .unwrap()
        .restrict(&["nvidia-h100-80gb".into()])
        .unwrap();
    let v = &profile.variants[0];
    let w = Workload {
        mean_prompt_tokens: 1000.0,
        mean_output_tokens: 200.0,
    };
    let slo = Slo {
        ttft_p99_s: 2.0,
        tpot_p99_s: 0.1,
    };
    let cap = capacity::at_slo(v, &w, &slo, &Planning::default());
    for share in [0.3, 0.6, 0.9] {
        let rate = share * cap.requests_per_s;
        let reqs = poisson(rate, 20_000, 1000, 200, 7);
        let run = sim::run(
            &SimConfig::default(),
            &profile,
            &slo,
            &Planning::default(),
            &reqs,
            &mut Fixed,
            &[1, 0],
        );
        let tpot = mean(run.outcomes.iter().skip(2000).filter_map(|o| o.tpot_s));
        let model = capacity::batch_at_rate(v, &w, rate)
            .map(|b| (v.itl_s(b)) / (1.0 - rate * 1000.0 / v.perf.prefill_tokens_per_s))
            .unwrap();
        eprintln!(
            "share {share}: rate {rate:.2}, sim TPOT {:.1} ms, model {:.1} ms",
            tpot * 1e3,
            model * 1e3
        );
    }
    panic!("show");
}
