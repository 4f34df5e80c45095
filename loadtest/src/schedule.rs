//! When each request is due. An open-loop run is fixed *before* it starts: the send offsets come
//! from here, never from how fast the server answers, so latency can be measured from the
//! scheduled time and a slow server cannot hide its queueing (no coordinated omission).

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Gamma};

/// How inter-arrival gaps are drawn at a given mean rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// Exponential gaps (a Poisson process): what independent users produce.
    Poisson,
    /// Equal gaps of `1/rate`: the easiest load a rate can be.
    Constant,
    /// Gamma gaps with shape `k` and mean `1/rate` (vLLM's `--burstiness`): `k < 1` is burstier
    /// than Poisson, `k > 1` smoother, `k = 1` is Poisson.
    Gamma { shape: f64 },
}

/// The send offsets (from the run's start) of `n` requests at `rate` requests/s. Deterministic
/// for a given seed, so two runs of the same flags offer the same load.
pub fn offsets(n: usize, rate: f64, arrival: Arrival, seed: u64) -> Vec<Duration> {
    assert!(
        rate > 0.0 && rate.is_finite(),
        "rate must be positive and finite"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mean = 1.0 / rate;
    let mut t = 0.0f64;
    let mut out = Vec::with_capacity(n);
    // The first request goes at t = 0: a run should not open with an idle gap.
    for i in 0..n {
        if i > 0 {
            let gap = match arrival {
                Arrival::Constant => mean,
                Arrival::Poisson => Exp::new(rate).expect("rate > 0").sample(&mut rng),
                Arrival::Gamma { shape } => Gamma::new(shape, mean / shape)
                    .expect("shape > 0")
                    .sample(&mut rng),
            };
            t += gap;
        }
        out.push(Duration::from_secs_f64(t));
    }
    out
}

/// A trace's own timestamps, shifted to start at zero and divided by `time_scale`
/// (`2.0` replays twice as fast). Order is kept; equal timestamps stay equal.
pub fn from_trace(timestamps_s: &[f64], time_scale: f64) -> Vec<Duration> {
    assert!(time_scale > 0.0, "time scale must be positive");
    let t0 = timestamps_s.iter().copied().fold(f64::INFINITY, f64::min);
    timestamps_s
        .iter()
        .map(|&t| Duration::from_secs_f64(((t - t0) / time_scale).max(0.0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(offs: &[Duration]) -> Vec<f64> {
        offs.windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect()
    }

    fn mean_var(x: &[f64]) -> (f64, f64) {
        let m = x.iter().sum::<f64>() / x.len() as f64;
        let v = x.iter().map(|g| (g - m).powi(2)).sum::<f64>() / (x.len() - 1) as f64;
        (m, v)
    }

    #[test]
    fn poisson_gaps_have_exponential_mean_and_variance() {
        // Rate 20/s: gaps have mean 1/20 = 0.05 s and variance 1/400 = 0.0025 s^2.
        let offs = offsets(50_001, 20.0, Arrival::Poisson, 7);
        let (m, v) = mean_var(&gaps(&offs));
        assert!((m - 0.05).abs() / 0.05 < 0.02, "mean {m}");
        assert!((v - 0.0025).abs() / 0.0025 < 0.05, "variance {v}");
    }

    #[test]
    fn seeded_schedules_are_reproducible_and_seed_dependent() {
        let a = offsets(100, 5.0, Arrival::Poisson, 1);
        assert_eq!(a, offsets(100, 5.0, Arrival::Poisson, 1));
        assert_ne!(a, offsets(100, 5.0, Arrival::Poisson, 2));
        assert_eq!(a[0], Duration::ZERO);
    }

    #[test]
    fn constant_gaps_are_exact() {
        let offs = offsets(5, 4.0, Arrival::Constant, 0);
        let want: Vec<_> = (0..5)
            .map(|i| Duration::from_secs_f64(i as f64 * 0.25))
            .collect();
        assert_eq!(offs, want);
    }

    #[test]
    fn gamma_shape_sets_burstiness() {
        // Gamma(k, θ = mean/k): mean = 1/rate, variance = mean^2 / k.
        for k in [0.5, 1.0, 4.0] {
            let offs = offsets(50_001, 10.0, Arrival::Gamma { shape: k }, 3);
            let (m, v) = mean_var(&gaps(&offs));
            let want_v = 0.01 / k;
            assert!((m - 0.1).abs() / 0.1 < 0.03, "k={k} mean {m}");
            assert!(
                (v - want_v).abs() / want_v < 0.08,
                "k={k} variance {v} want {want_v}"
            );
        }
    }

    #[test]
    fn trace_offsets_keep_inter_arrivals_under_the_scale() {
        let ts = [100.0, 100.5, 101.5, 101.5, 105.0];
        let offs = from_trace(&ts, 2.0);
        let got: Vec<f64> = offs.iter().map(Duration::as_secs_f64).collect();
        assert_eq!(got, vec![0.0, 0.25, 0.75, 0.75, 2.5]);
    }
}
