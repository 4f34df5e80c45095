//! Arrivals as the policies that know the future read them: [`Request`]s counted into a
//! [`Timeline`] of fixed buckets. The oracle and the static-peak sizing look at windows of it;
//! the simulator replays the same requests.

use serde::{Deserialize, Serialize};

use crate::capacity::{cv2, Workload};

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
    prompt: Vec<f64>,
    prompt_sq: Vec<f64>,
    output: Vec<f64>,
    output_sq: Vec<f64>,
}

impl Timeline {
    pub fn new(requests: &[Request], bucket_s: f64) -> Timeline {
        let end = requests.last().map_or(0.0, |r| r.arrival_s);
        let n = (end / bucket_s).floor() as usize + 1;
        let mut t = Timeline {
            bucket_s,
            requests: vec![0.0; n],
            prompt: vec![0.0; n],
            prompt_sq: vec![0.0; n],
            output: vec![0.0; n],
            output_sq: vec![0.0; n],
        };
        for r in requests {
            let b = ((r.arrival_s / bucket_s).floor() as usize).min(n - 1);
            t.requests[b] += 1.0;
            t.prompt[b] += f64::from(r.prompt_tokens);
            t.prompt_sq[b] += f64::from(r.prompt_tokens).powi(2);
            t.output[b] += f64::from(r.output_tokens);
            t.output_sq[b] += f64::from(r.output_tokens).powi(2);
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
        let p: f64 = self.prompt[a..b].iter().sum();
        let o: f64 = self.output[a..b].iter().sum();
        let p2: f64 = self.prompt_sq[a..b].iter().sum();
        let o2: f64 = self.output_sq[a..b].iter().sum();
        let span = (to - from).max(self.bucket_s);
        let w = Workload {
            mean_prompt_tokens: p / n,
            mean_output_tokens: o / n,
            prompt_cv2: cv2(n, p, p2),
            output_cv2: cv2(n, o, o2),
        };
        Some((n / span, w))
    }
}
