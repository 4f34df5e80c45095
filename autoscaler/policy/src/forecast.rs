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
    state: Option<State>,
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
            state: None,
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
                let level = self.alpha * x + (1.0 - self.alpha) * predicted;
                let trend = self.beta * (level - s.level) / dt + (1.0 - self.beta) * s.trend;
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
