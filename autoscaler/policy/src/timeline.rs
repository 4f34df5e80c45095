//! Arrivals as the policies that know the future read them: [`Request`]s counted into a
//! [`Timeline`] of fixed buckets. The oracle and the static-peak sizing look at windows of it;
//! the simulator replays the same requests.

use serde::{Deserialize, Serialize};

use crate::capacity::{Moments, Workload};

/// One request of a trace: when it arrives and how long it is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Request {
    /// Seconds from the trace's first arrival.
    pub arrival_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// Arrivals counted in fixed buckets, for looking at windows of the future.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub bucket_s: f64,
    requests: Vec<f64>,
    prompt: Vec<Moments>,
    output: Vec<Moments>,
}

impl Timeline {
    pub fn new(requests: &[Request], bucket_s: f64) -> Timeline {
        let end = requests.last().map_or(0.0, |r| r.arrival_s);
        let n = (end / bucket_s).floor() as usize + 1;
        let mut t = Timeline {
            bucket_s,
            requests: vec![0.0; n],
            prompt: vec![Moments::default(); n],
            output: vec![Moments::default(); n],
        };
        for r in requests {
            let b = ((r.arrival_s / bucket_s).floor() as usize).min(n - 1);
            t.requests[b] += 1.0;
            t.prompt[b].add(r.prompt_tokens);
            t.output[b].add(r.output_tokens);
        }
        t
    }

    pub fn end_s(&self) -> f64 {
        self.requests.len() as f64 * self.bucket_s
    }

    /// Rate (requests/s) and mean shape of the arrivals in `[from, to)`, by whole buckets;
    /// `None` if none arrived.
    pub fn window(&self, from: f64, to: f64) -> Option<(f64, Workload)> {
        let a = ((from / self.bucket_s).floor().max(0.0) as usize).min(self.requests.len());
        let b = ((to / self.bucket_s).ceil().max(0.0) as usize).clamp(a, self.requests.len());
        let n: f64 = self.requests[a..b].iter().sum();
        if n == 0.0 {
            return None;
        }
        let prompt: Moments = self.prompt[a..b].iter().copied().sum();
        let output: Moments = self.output[a..b].iter().copied().sum();
        let span = (to - from).max(self.bucket_s);
        Some((n / span, Workload::from_moments(n, &prompt, &output)))
    }
}
