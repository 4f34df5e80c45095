//! Holt's linear trend on the arrival rate, to have capacity ready when the load arrives.
//!
//! A replica takes minutes to start, so sizing for the rate seen now is sizing for the past.
//! Holt's method keeps a level and a trend, each exponentially smoothed, and forecasts
//! `level + trend · h` for a horizon `h` (the start-up lead time). Observations may come at
//! irregular intervals: the trend is per second. A trend measured over a minute or two says
//! little about ten minutes ahead, so the forecast damps it (Gardner's damped trend, in
//! continuous time): `level + trend · τ · (1 − e^(−h/τ))`, which follows the trend for short
//! horizons and adds at most `trend · τ`.

use serde::{Deserialize, Serialize};

/// Holt's double exponential smoothing with time-aware trend.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Holt {
    /// Smoothing of the level per observation (0..1]: higher follows faster.
    pub alpha: f64,
    /// Smoothing of the trend per observation (0..1].
    pub beta: f64,
    /// Damping time constant τ of the trend, seconds (infinite: undamped).
    pub damping_s: f64,
    /// The interval `alpha` and `beta` are per, seconds: an observation `dt` after the last
    /// weighs as `dt / interval` of them compounded, so the smoothing's time constant does not
    /// change with the observation rate. Infinite: per observation, whatever its spacing.
    #[serde(default = "per_observation")]
    pub interval_s: f64,
    state: Option<State>,
}

fn per_observation() -> f64 {
    f64::INFINITY
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
struct State {
    time_s: f64,
    level: f64,
    /// Change per second.
    trend: f64,
}

impl Holt {
    pub fn new(alpha: f64, beta: f64) -> Self {
        Holt {
            alpha: alpha.clamp(1e-3, 1.0),
            beta: beta.clamp(0.0, 1.0),
            damping_s: f64::INFINITY,
            interval_s: f64::INFINITY,
            state: None,
        }
    }

    /// The same with `alpha` and `beta` per `interval_s` seconds rather than per observation.
    pub fn per_interval(mut self, interval_s: f64) -> Self {
        self.interval_s = if interval_s > 0.0 {
            interval_s
        } else {
            f64::INFINITY
        };
        self
    }

    /// A smoothing weight for an observation `dt` after the last: `w` per interval, compounded.
    fn weight(&self, w: f64, dt: f64) -> f64 {
        if self.interval_s.is_finite() {
            1.0 - (1.0 - w).powf(dt / self.interval_s)
        } else {
            w
        }
    }

    /// The same with the trend damped over `tau_s` seconds.
    pub fn damped(mut self, tau_s: f64) -> Self {
        self.damping_s = if tau_s > 0.0 { tau_s } else { f64::INFINITY };
        self
    }

    /// Takes an observation `x` at time `t` (seconds, increasing).
    pub fn observe(&mut self, t: f64, x: f64) {
        self.state = Some(match self.state {
            None => State {
                time_s: t,
                level: x,
                trend: 0.0,
            },
            Some(s) => {
                let dt = t - s.time_s;
                if dt <= 0.0 {
                    return;
                }
                let predicted = s.level + s.trend * dt;
                let (a, b) = (self.weight(self.alpha, dt), self.weight(self.beta, dt));
                let level = a * x + (1.0 - a) * predicted;
                let trend = b * (level - s.level) / dt + (1.0 - b) * s.trend;
                State {
                    time_s: t,
                    level,
                    trend,
                }
            }
        });
    }

    /// Forecast `h` seconds after the last observation (never negative); `None` before any.
    pub fn forecast(&self, h: f64) -> Option<f64> {
        let reach = if self.damping_s.is_finite() {
            self.damping_s * (1.0 - (-h / self.damping_s).exp())
        } else {
            h
        };
        self.state.map(|s| (s.level + s.trend * reach).max(0.0))
    }

    /// Trend per second, zero before two observations.
    pub fn trend(&self) -> f64 {
        self.state.map_or(0.0, |s| s.trend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linear_ramp_is_forecast_along_its_slope() {
        let mut h = Holt::new(0.5, 0.3);
        for i in 0..200 {
            let t = f64::from(i) * 15.0;
            h.observe(t, 10.0 + 0.02 * t);
        }
        let last = 10.0 + 0.02 * 199.0 * 15.0;
        let f = h.forecast(300.0).unwrap();
        assert!((f - (last + 6.0)).abs() < 0.05, "{f}");
        assert!((h.trend() - 0.02).abs() < 1e-4);
    }

    #[test]
    fn a_damped_trend_follows_short_horizons_and_is_bounded_for_long_ones() {
        let mut h = Holt::new(0.5, 0.3).damped(120.0);
        for i in 0..200 {
            let t = f64::from(i) * 15.0;
            h.observe(t, 10.0 + 0.02 * t);
        }
        let level = h.forecast(0.0).unwrap();
        // Ten seconds ahead: nearly the full slope.
        assert!((h.forecast(10.0).unwrap() - (level + 0.2)).abs() < 0.01);
        // An hour ahead: at most trend · τ = 2.4 above the level.
        let far = h.forecast(3600.0).unwrap();
        assert!(far > level + 2.3 && far <= level + 2.4 + 1e-9, "{far}");
    }

    #[test]
    fn smoothing_per_interval_does_not_depend_on_how_often_it_observes() {
        // A step from 0 to 10: without a trend, the level after 300 s is 10·(1 − 0.7^20)
        // whether it saw the step every 5, 15 or 30 s.
        let level_after = |every: f64| {
            let mut h = Holt::new(0.3, 0.0).per_interval(15.0);
            h.observe(0.0, 0.0);
            let mut t = 0.0;
            while t < 300.0 - 1e-9 {
                t += every;
                h.observe(t, 10.0);
            }
            h.forecast(0.0).unwrap()
        };
        let expect = 10.0 * (1.0 - 0.7f64.powi(20));
        for every in [5.0, 15.0, 30.0] {
            assert!((level_after(every) - expect).abs() < 1e-9, "{every}");
        }
        // Per observation, five-second observations follow three times as fast.
        let mut h = Holt::new(0.3, 0.0);
        h.observe(0.0, 0.0);
        h.observe(5.0, 10.0);
        assert!((h.forecast(0.0).unwrap() - 3.0).abs() < 1e-9);
        // A ramp with a trend: the forecast a lead ahead within 2 % across tick lengths.
        let ramp = |every: f64| {
            let mut h = Holt::new(0.3, 0.1).damped(600.0).per_interval(15.0);
            let mut t = 0.0;
            while t <= 1200.0 + 1e-9 {
                h.observe(t, 5.0 + 0.01 * t + (t / 45.0).sin());
                t += every;
            }
            h.forecast(420.0).unwrap()
        };
        let base = ramp(15.0);
        for every in [5.0, 10.0, 30.0] {
            let f = ramp(every);
            assert!((f - base).abs() < 0.02 * base, "{every}: {f} vs {base}");
        }
    }

    #[test]
    fn a_flat_series_stays_flat_and_a_fall_never_forecasts_below_zero() {
        let mut h = Holt::new(0.3, 0.1);
        assert_eq!(h.forecast(10.0), None);
        for i in 0..50 {
            h.observe(f64::from(i), 7.0);
        }
        assert!((h.forecast(600.0).unwrap() - 7.0).abs() < 1e-9);
        for i in 50..100 {
            h.observe(f64::from(i), 100.0 - f64::from(i));
        }
        assert_eq!(h.forecast(1e6).unwrap(), 0.0);
        // Irregular spacing: the same ramp sampled unevenly gives the same slope.
        let mut h = Holt::new(0.5, 0.3);
        let mut t = 0.0;
        for i in 0..300 {
            t += if i % 2 == 0 { 5.0 } else { 20.0 };
            h.observe(t, 2.0 * t);
        }
        assert!((h.trend() - 2.0).abs() < 0.01, "{}", h.trend());
    }
}
