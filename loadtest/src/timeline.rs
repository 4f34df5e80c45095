//! The run over time, from the per-request records: completed requests and output tokens per
//! time bucket, and requests in flight as a step function. This is what shows a warm-up ramp, a
//! stall, or a server that falls behind an open-loop rate, which end-of-run averages hide.
//!
//! A token is placed when it arrived: the first at TTFT, each later one after its ITL sample
//! (so a chunk that carried `k` tokens places them `gap/k` apart; see [`crate::metrics`]).
//! Tokens the stream did not show (unstreamed responses, or usage counting more than the
//! chunks) are placed at the end of their request. Failed requests count in flight but add
//! neither requests nor tokens, as in the summary's throughput.

use crate::metrics::Record;

/// Throughput per bucket and in-flight steps of one run. Times are seconds from the run's start.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// Width of every bucket, s.
    pub bucket_s: f64,
    /// Successful completions per second in each bucket.
    pub requests_per_s: Vec<f64>,
    /// Output tokens per second in each bucket.
    pub tokens_per_s: Vec<f64>,
    /// `(time, requests in flight from then on)`, one entry per change, time-ordered.
    pub in_flight: Vec<(f64, u64)>,
}

/// Buckets a plot of `duration_s` gets: enough to see shape, few enough to keep counts per
/// bucket meaningful.
const BUCKETS: f64 = 50.0;

impl Timeline {
    /// The timeline of `records` over a run that lasted `duration_s`.
    pub fn of(records: &[Record], duration_s: f64) -> Self {
        let end = records
            .iter()
            .map(|r| r.scheduled_s + r.e2el_ms / 1e3)
            .fold(duration_s, f64::max)
            .max(1e-3);
        let bucket_s = end / BUCKETS;
        let n = BUCKETS as usize;
        let slot = |t: f64| ((t / bucket_s) as usize).min(n - 1);
        let mut requests = vec![0u64; n];
        let mut tokens = vec![0u64; n];
        for r in records.iter().filter(|r| r.ok) {
            let finish = r.scheduled_s + r.e2el_ms / 1e3;
            requests[slot(finish)] += 1;
            let mut placed = 0u64;
            if let Some(ttft) = r.ttft_ms {
                let mut t = r.scheduled_s + ttft / 1e3;
                tokens[slot(t)] += 1;
                placed = 1;
                for gap in r
                    .itl_ms
                    .iter()
                    .take(r.output_tokens.saturating_sub(1) as usize)
                {
                    t += gap / 1e3;
                    tokens[slot(t)] += 1;
                    placed += 1;
                }
            }
            tokens[slot(finish)] += r.output_tokens.saturating_sub(placed);
        }
        let rate = |v: Vec<u64>| v.into_iter().map(|c| c as f64 / bucket_s).collect();
        Self {
            bucket_s,
            requests_per_s: rate(requests),
            tokens_per_s: rate(tokens),
            in_flight: in_flight_steps(records),
        }
    }
}

/// Requests in flight (sent, not yet ended) after every send and end. At equal times ends come
/// first, so back-to-back requests of a closed loop do not count twice.
pub fn in_flight_steps(records: &[Record]) -> Vec<(f64, u64)> {
    let mut ev: Vec<(f64, i64)> = Vec::with_capacity(records.len() * 2);
    for r in records {
        ev.push((r.scheduled_s + r.send_delay_ms / 1e3, 1));
        ev.push((r.scheduled_s + r.e2el_ms / 1e3, -1));
    }
    ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut level = 0i64;
    let mut out = vec![(0.0, 0)];
    for (t, d) in ev {
        level += d;
        out.push((t, level.max(0) as u64));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::TokenSource;

    fn rec(scheduled_s: f64, ttft: Option<f64>, itl: Vec<f64>, e2e: f64, out: u64) -> Record {
        Record {
            id: 0,
            scheduled_s,
            send_delay_ms: 0.0,
            ok: true,
            retried: false,
            error: None,
            error_message: None,
            error_type: None,
            ttft_ms: ttft,
            tpot_ms: None,
            e2el_ms: e2e,
            input_tokens: 1,
            output_tokens: out,
            max_tokens: out as u32,
            token_source: TokenSource::Usage,
            itl_exact: true,
            itl_ms: itl,
        }
    }

    #[test]
    fn tokens_land_when_they_arrived_and_totals_are_kept() {
        // Run of 1 s → 20 ms buckets. Request A: tokens at 100, 300, 500 ms, ends at 500 ms.
        // Request B: unstreamed, 4 tokens at its end (900 ms). Request C failed.
        let mut failed = rec(0.0, None, vec![], 200.0, 0);
        failed.ok = false;
        let recs = vec![
            rec(0.0, Some(100.0), vec![200.0, 200.0], 500.0, 3),
            rec(0.4, None, vec![], 500.0, 4),
            failed,
        ];
        let t = Timeline::of(&recs, 1.0);
        assert!((t.bucket_s - 0.02).abs() < 1e-12);
        let count = |v: &[f64], i: usize| (v[i] * t.bucket_s).round() as u64;
        assert_eq!(count(&t.tokens_per_s, 5), 1);
        assert_eq!(count(&t.tokens_per_s, 15), 1);
        assert_eq!(count(&t.tokens_per_s, 25), 1);
        assert_eq!(count(&t.tokens_per_s, 45), 4);
        let total: f64 = t.tokens_per_s.iter().map(|r| r * t.bucket_s).sum();
        assert!((total - 7.0).abs() < 1e-9);
        let reqs: f64 = t.requests_per_s.iter().map(|r| r * t.bucket_s).sum();
        assert!(
            (reqs - 2.0).abs() < 1e-9,
            "failed requests are not throughput"
        );
        assert_eq!(count(&t.requests_per_s, 25), 1);
    }

    #[test]
    fn in_flight_counts_overlap_and_closed_loop_handoffs_once() {
        let recs = vec![
            rec(0.0, None, vec![], 100.0, 1),
            rec(0.1, None, vec![], 100.0, 1), // starts as the first ends
            rec(0.15, None, vec![], 10.0, 1), // overlaps the second
        ];
        let steps = in_flight_steps(&recs);
        let max = steps.iter().map(|s| s.1).max().unwrap();
        assert_eq!(max, 2);
        assert_eq!(steps.last().unwrap(), &(0.2, 0));
    }
}
