//! Request traces (read by [`sluice_traces`]) as the simulator's [`Request`]s, and rate
//! scaling.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sluice_policy::timeline::Request;

use crate::error::{Error, Result};

/// Reads a trace (any format [`sluice_traces`] reads), sorted by arrival, times from its first
/// request.
pub fn load(path: &Path) -> Result<Vec<Request>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let rows = sluice_traces::read(&text).map_err(|e| Error::TraceLine {
        path: path.to_path_buf(),
        line: e.line,
        message: e.message,
    })?;
    let Some(t0) = rows
        .iter()
        .map(|r| r.at)
        .min_by(|a, b| a.secs.cmp(&b.secs).then(a.frac.total_cmp(&b.frac)))
    else {
        return Err(Error::EmptyTrace(path.to_path_buf()));
    };
    let mut out: Vec<Request> = rows
        .iter()
        .map(|r| Request {
            arrival_s: r.at.seconds_since(t0),
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
        })
        .collect();
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(out)
}

/// Spread of the extra copies a rate scale above one makes, in seconds.
pub const COPY_SPREAD_S: f64 = 60.0;

/// The most requests a scaled trace may hold. A replay keeps every request's outcome per
/// policy (~350 bytes a request with all six policies: a week at ×4, 12.1 M requests, took
/// 4.2 GB), so this is ~35 GB; a rate scale past it is refused with its figures rather than
/// ending the process when the allocation fails.
pub const MAX_SCALED_REQUESTS: f64 = 1e8;

/// Multiplies the arrival rate by `scale` while keeping the trace's duration and its
/// minute-scale shape: each request becomes ⌊scale⌋ copies, plus one more with probability
/// `scale − ⌊scale⌋` (so a scale below one thins the trace); copies after the first are shifted
/// by a uniform ±30 s, so they do not arrive in lockstep, and mirrored at the trace's ends.
/// Seeded: the same seed, the same trace. A scale that would make more than
/// [`MAX_SCALED_REQUESTS`] requests is refused.
pub fn scale(requests: &[Request], scale: f64, seed: u64) -> Result<Vec<Request>> {
    let expected = requests.len() as f64 * scale;
    if expected.is_nan() || expected > MAX_SCALED_REQUESTS {
        return Err(Error::Scenario(format!(
            "rate scale {scale} makes ~{expected:.3e} requests of the trace's {}; at most \
             {MAX_SCALED_REQUESTS:.0e} are replayed (each keeps its outcome per policy)",
            requests.len()
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let whole = scale.floor() as u32;
    let frac = scale - f64::from(whole);
    let end = requests.last().map_or(0.0, |r| r.arrival_s);
    let mut out = Vec::with_capacity((requests.len() as f64 * scale.max(0.0)).ceil() as usize);
    for r in requests {
        let n = whole + u32::from(frac > 0.0 && rng.random::<f64>() < frac);
        for k in 0..n {
            // Copies after the first land within half the spread either side of the original;
            // one that would fall outside the trace is mirrored back into it, which keeps the
            // rate of a steady trace even up to both ends (clamped to the end, the last
            // minute's copies piled up there as a burst the trace lacks).
            let arrival_s = if k == 0 {
                r.arrival_s
            } else {
                let t = r.arrival_s + (rng.random::<f64>() - 0.5) * COPY_SPREAD_S;
                let mirrored = if t < 0.0 {
                    -t
                } else if t > end {
                    2.0 * end - t
                } else {
                    t
                };
                mirrored.clamp(0.0, end)
            };
            out.push(Request { arrival_s, ..*r });
        }
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::timeline::Timeline;

    #[test]
    fn both_formats_parse_and_start_at_zero() {
        let dir = std::env::temp_dir().join(format!("sluice-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("t.csv");
        std::fs::write(&csv, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47.5,10,2\n2023-11-16 18:15:46.5,374,44\n").unwrap();
        let r = load(&csv).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].arrival_s, r[0].prompt_tokens), (0.0, 374));
        assert!((r[1].arrival_s - 1.0).abs() < 1e-6);
        let jsonl = dir.join("t.jsonl");
        std::fs::write(&jsonl, "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 5, \"hash_ids\": [1]}\n{\"timestamp\": 1500, \"input_length\": 7, \"output_length\": 3}\n").unwrap();
        let r = load(&jsonl).unwrap();
        assert_eq!(r[1].arrival_s, 1.5);
        std::fs::write(
            &csv,
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47,x,2\n",
        )
        .unwrap();
        assert!(load(&csv).unwrap_err().to_string().contains("line 2"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn scaling_multiplies_the_rate_and_keeps_the_span() {
        let base: Vec<Request> = (0..1000)
            .map(|i| Request {
                arrival_s: f64::from(i) * 3.6,
                prompt_tokens: 100,
                output_tokens: 10,
            })
            .collect();
        let four = scale(&base, 4.0, 1).unwrap();
        assert_eq!(four.len(), 4000);
        assert!(four.last().unwrap().arrival_s <= base.last().unwrap().arrival_s);
        let half = scale(&base, 0.5, 1).unwrap();
        assert!((400..600).contains(&half.len()), "{}", half.len());
        assert_eq!(scale(&base, 2.5, 9).unwrap(), scale(&base, 2.5, 9).unwrap());
        // A scale whose copies would not fit in memory is refused, with its figures.
        let e = scale(&base, 1e9, 1).unwrap_err().to_string();
        assert!(
            e.contains("rate scale 1000000000 makes ~1.000e12 requests"),
            "{e}"
        );
        assert!(scale(&base, f64::INFINITY, 1).is_err());
        let tl = Timeline::new(&four, 10.0);
        let (rate, w) = tl.window(600.0, 1200.0).unwrap();
        assert!((rate - 4.0 / 3.6).abs() < 0.1, "{rate}");
        assert_eq!(w.mean_prompt_tokens, 100.0);
        // The last minute keeps the rate too: no copies piled up at the last instant.
        let end = base.last().unwrap().arrival_s;
        let at_end = four.iter().filter(|r| r.arrival_s >= end - 1.0).count();
        assert!(at_end <= 8, "{at_end} copies in the last second");
        for (from, to) in [(0.0, 60.0), (end - 60.0, end)] {
            let (rate, _) = tl.window(from, to).unwrap();
            assert!((rate - 4.0 / 3.6).abs() < 0.25, "{from}..{to}: {rate}");
        }
    }
}
