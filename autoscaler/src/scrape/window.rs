//! Each target's recent snapshots, and the figures over a window that come from them: counter
//! increases (arrivals, tokens), histogram increases (latency percentiles), as Prometheus's
//! `increase()` computes them — pairwise, a counter that falls meaning a restart.
//!
//! Arrivals are not a series replicas export: they are requests finished in the window plus
//! the change in requests on the replicas (running + waiting) over it — conservation. Summed
//! over replicas it is exact for requests retried from one replica to another; requests that
//! leave the fleet unfinished (aborted, refused after queueing) are missed.

use std::collections::{BTreeMap, VecDeque};

use sluice_policy::signals::WindowShape;

use super::front_door::{FrontDoor, FrontDoorWindows};
use super::snapshot::{Histogram, Snapshot, SummedHistogram};

/// Snapshots of one target, oldest first, each with the scraper's time in seconds.
#[derive(Debug, Clone, Default)]
pub struct History {
    samples: VecDeque<(f64, Snapshot)>,
}

/// What one target contributed over one window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Increase {
    pub arrivals: f64,
    pub finished: f64,
    pub prompt_tokens: f64,
    pub generation_tokens: f64,
    pub preemptions: f64,
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub prompt_len: Histogram,
    pub output_len: Histogram,
}

impl History {
    pub fn push(&mut self, t: f64, s: Snapshot) {
        self.samples.push_back((t, s));
    }

    pub fn latest(&self) -> Option<&(f64, Snapshot)> {
        self.samples.back()
    }

    /// Drops samples no window of length `keep_s` ending at `now` or later can use: all but
    /// the newest one at or before `now − keep_s`.
    pub fn prune(&mut self, now: f64, keep_s: f64) {
        while self.samples.len() > 1 && self.samples[1].0 <= now - keep_s {
            self.samples.pop_front();
        }
    }

    /// The samples a window `(now − window_s, now]` reads: the newest one at or before its
    /// start (the base), then every later one.
    fn window(&self, now: f64, window_s: f64) -> impl Iterator<Item = &(f64, Snapshot)> {
        let start = now - window_s;
        let first_inside = self.samples.iter().position(|(t, _)| *t > start);
        let from = match first_inside {
            Some(0) => 0,
            Some(i) => i - 1,
            None => self.samples.len().saturating_sub(1),
        };
        self.samples.iter().skip(from)
    }

    /// Increases over the window; zero from fewer than two samples.
    pub fn increase(&self, now: f64, window_s: f64) -> Increase {
        let mut out = Increase::default();
        let samples: Vec<&(f64, Snapshot)> = self.window(now, window_s).collect();
        let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
            return out;
        };
        for pair in samples.windows(2) {
            let (a, b) = (&pair[0].1, &pair[1].1);
            out.finished += counter_step(a.finished, b.finished);
            out.prompt_tokens += counter_step(a.prompt_tokens, b.prompt_tokens);
            out.generation_tokens += counter_step(a.generation_tokens, b.generation_tokens);
            out.preemptions += counter_step(a.preemptions, b.preemptions);
            hist_step(&mut out.ttft, &a.ttft, &b.ttft);
            hist_step(&mut out.tpot, &a.tpot, &b.tpot);
            hist_step(&mut out.prompt_len, &a.prompt_len, &b.prompt_len);
            hist_step(&mut out.output_len, &a.output_len, &b.output_len);
        }
        let restarted = samples
            .windows(2)
            .any(|p| p[1].1.finished.unwrap_or(0.0) < p[0].1.finished.unwrap_or(0.0));
        // Requests on a process that restarted were lost, not served: count from zero.
        let base_in_system = if restarted { 0.0 } else { first.1.in_system() };
        // Not clamped here: a request that left without finishing (an admission timeout, a
        // retry elsewhere) lowers this target's figure and raises another's; only the sum
        // over targets is a count (the scraper clamps that).
        out.arrivals = out.finished + last.1.in_system() - base_in_system;
        out
    }

    /// A gateway's per-second prompt sums over the window, per model: the increase of each
    /// bucket and of the sum, pairwise (a count that falls meaning a restart).
    pub fn burst_increase(&self, now: f64, window_s: f64) -> BTreeMap<String, SummedHistogram> {
        self.model_increase(now, window_s, |s| s.prompt_bursts.as_ref())
    }

    /// A gateway's front-door series over the window, per model, pairwise as above.
    pub fn front_door_increase(&self, now: f64, window_s: f64) -> BTreeMap<String, FrontDoor> {
        self.model_increase(now, window_s, |s| s.front_door.as_ref())
    }

    /// A gateway's front door per model over the long, short, latency and shape windows
    /// ending at `now`; the spans are left at zero for the caller (who knows how long it has
    /// read). A latency window as long as the long one (the controller's) is stepped through
    /// once.
    pub fn front_door_windows(
        &self,
        now: f64,
        (long_s, short_s, latency_s, shape_s): (f64, f64, f64, f64),
    ) -> BTreeMap<String, FrontDoorWindows> {
        let long = self.front_door_increase(now, long_s);
        let latency = if latency_s == long_s {
            long.clone()
        } else {
            self.front_door_increase(now, latency_s)
        };
        let mut out: BTreeMap<String, FrontDoorWindows> = BTreeMap::new();
        for (model, d) in long {
            out.entry(model).or_default().long.0 = d;
        }
        for (model, d) in self.front_door_increase(now, short_s) {
            out.entry(model).or_default().short.0 = d;
        }
        for (model, d) in latency {
            out.entry(model).or_default().latency = d;
        }
        for (model, d) in self.front_door_increase(now, shape_s) {
            out.entry(model).or_default().wide = d;
        }
        out
    }

    fn model_increase<T: Cumulative>(
        &self,
        now: f64,
        window_s: f64,
        of: impl Fn(&Snapshot) -> Option<&BTreeMap<String, T>>,
    ) -> BTreeMap<String, T> {
        let mut out: BTreeMap<String, T> = BTreeMap::new();
        let samples: Vec<&(f64, Snapshot)> = self.window(now, window_s).collect();
        for pair in samples.windows(2) {
            let (a, b) = (&pair[0].1, &pair[1].1);
            for (model, later) in of(b).into_iter().flatten() {
                let step = match of(a).and_then(|m| m.get(model)) {
                    Some(earlier) => later.increase_since(earlier),
                    None => later.clone(),
                };
                out.entry(model.clone()).or_default().add(&step);
            }
        }
        out
    }
}

/// A gateway's per-model series: cumulative as exported, stepped pairwise and summed.
trait Cumulative: Clone + Default {
    fn increase_since(&self, earlier: &Self) -> Self;
    fn add(&mut self, o: &Self);
}

impl Cumulative for SummedHistogram {
    fn increase_since(&self, earlier: &Self) -> Self {
        SummedHistogram::increase_since(self, earlier)
    }
    fn add(&mut self, o: &Self) {
        SummedHistogram::add(self, o);
    }
}

impl Cumulative for FrontDoor {
    fn increase_since(&self, earlier: &Self) -> Self {
        FrontDoor::increase_since(self, earlier)
    }
    fn add(&mut self, o: &Self) {
        FrontDoor::add(self, o);
    }
}

/// One step of a counter: its rise, or its whole value after a restart.
fn counter_step(a: Option<f64>, b: Option<f64>) -> f64 {
    match (a, b) {
        (Some(a), Some(b)) if b >= a => b - a,
        (_, Some(b)) => b,
        _ => 0.0,
    }
}

fn hist_step(acc: &mut Histogram, a: &Option<Histogram>, b: &Option<Histogram>) {
    let Some(b) = b else { return };
    let step = match a {
        Some(a) => b.increase_since(a),
        None => b.clone(),
    };
    acc.add(&step);
}

impl Increase {
    /// The requests that arrived over the window (`window_s` long) and their tokens.
    pub fn shape(&self, window_s: f64) -> WindowShape {
        WindowShape {
            window_s,
            requests: self.arrivals.max(0.0),
            prompt_tokens: self.prompt_tokens.max(0.0),
            output_tokens: self.generation_tokens.max(0.0),
            prompt_tokens_cv2: self.prompt_len.mean_cv2().map_or(0.0, |p| p.1),
            output_tokens_cv2: self.output_len.mean_cv2().map_or(0.0, |p| p.1),
        }
    }

    pub fn add(&mut self, o: &Increase) {
        self.arrivals += o.arrivals;
        self.finished += o.finished;
        self.prompt_tokens += o.prompt_tokens;
        self.generation_tokens += o.generation_tokens;
        self.preemptions += o.preemptions;
        self.ttft.add(&o.ttft);
        self.tpot.add(&o.tpot);
        self.prompt_len.add(&o.prompt_len);
        self.output_len.add(&o.output_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(finished: f64, running: f64, waiting: f64, ttft_fast: f64, ttft_all: f64) -> Snapshot {
        Snapshot {
            finished: Some(finished),
            running: Some(running),
            waiting: Some(waiting),
            prompt_tokens: Some(finished * 100.0),
            ttft: Some(Histogram {
                buckets: vec![(0.5, ttft_fast), (f64::INFINITY, ttft_all)],
            }),
            ..Snapshot::default()
        }
    }

    #[test]
    fn arrivals_are_finished_plus_the_change_in_requests_on_the_replica() {
        let mut h = History::default();
        h.push(0.0, snap(10.0, 2.0, 0.0, 10.0, 10.0));
        h.push(5.0, snap(14.0, 4.0, 3.0, 12.0, 14.0));
        h.push(10.0, snap(20.0, 4.0, 1.0, 13.0, 20.0));
        // Window (0, 10]: base at 0; 10 finished, in system 2 → 5: 13 arrived.
        let w = h.increase(10.0, 10.0);
        assert_eq!(w.finished, 10.0);
        assert_eq!(w.arrivals, 13.0);
        assert_eq!(w.prompt_tokens, 1000.0);
        assert_eq!(
            w.ttft.buckets,
            vec![(0.5, 3.0), (f64::INFINITY, 10.0)],
            "the window's first tokens only"
        );
        // Window (5, 10]: base at 5.
        let short = h.increase(10.0, 5.0);
        assert_eq!(short.finished, 6.0);
        assert_eq!(short.arrivals, 6.0 + 5.0 - 7.0);
        // One sample: nothing measured yet.
        let mut one = History::default();
        one.push(0.0, snap(50.0, 3.0, 0.0, 1.0, 1.0));
        assert_eq!(one.increase(0.0, 10.0).arrivals, 0.0);
    }

    /// The shape's output spread comes from the window's own observations: forty ~50-token
    /// outputs before it, then ten more and ten of ~1,500 within it, read as half and half.
    #[test]
    fn the_shape_reads_the_output_spread_of_the_window() {
        let lengths = |short: f64, long: f64| Histogram {
            buckets: vec![
                (100.0, short),
                (2000.0, short + long),
                (f64::INFINITY, short + long),
            ],
        };
        let mut h = History::default();
        let at = |finished, short, long| Snapshot {
            output_len: Some(lengths(short, long)),
            ..snap(finished, 0.0, 0.0, 0.0, 0.0)
        };
        h.push(0.0, at(40.0, 40.0, 0.0));
        h.push(10.0, at(60.0, 50.0, 10.0));
        let shape = h.increase(10.0, 10.0).shape(10.0);
        // Ten at 50 and ten at 1,050 (the buckets' midpoints): mean 550, cv² 0.826; the whole
        // history would read 2.96.
        let cv2 = shape.output_tokens_cv2;
        assert!((cv2 - 0.826).abs() < 0.01, "{cv2}");
    }

    #[test]
    fn a_restart_counts_the_new_process_from_zero() {
        let mut h = History::default();
        h.push(0.0, snap(100.0, 5.0, 5.0, 90.0, 100.0));
        h.push(1.0, snap(3.0, 1.0, 0.0, 3.0, 3.0));
        let w = h.increase(1.0, 10.0);
        assert_eq!(w.finished, 3.0);
        // The ten requests on the old process were lost; the new one saw 3 + 1.
        assert_eq!(w.arrivals, 4.0);
        assert_eq!(w.ttft.buckets, vec![(0.5, 3.0), (f64::INFINITY, 3.0)]);
    }

    #[test]
    fn pruning_keeps_the_base_of_the_longest_window() {
        let mut h = History::default();
        for t in 0..20 {
            h.push(f64::from(t), snap(f64::from(t), 0.0, 0.0, 0.0, 0.0));
        }
        h.prune(19.0, 5.0);
        assert_eq!(h.samples.front().unwrap().0, 14.0);
        assert_eq!(h.increase(19.0, 5.0).finished, 5.0);
    }
}
