//! Request traces: Azure LLM inference CSV and Mooncake JSONL, read into
//! [`Request`]s, and rate scaling.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use sluice_policy::timeline::Request;

use crate::error::{Error, Result};

/// Trace formats, told apart by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference trace 2023).
    AzureCsv,
    /// `{"timestamp": ms, "input_length", "output_length", ...}` per line (Mooncake).
    MooncakeJsonl,
}

impl Format {
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") | Some("json") => Format::MooncakeJsonl,
            _ => Format::AzureCsv,
        }
    }
}

/// Reads a trace, sorted by arrival, times from its first request.
pub fn load(path: &Path) -> Result<Vec<Request>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = match Format::of(path) {
        Format::AzureCsv => parse_azure(path, &text)?,
        Format::MooncakeJsonl => parse_mooncake(path, &text)?,
    };
    if out.is_empty() {
        return Err(Error::EmptyTrace(path.to_path_buf()));
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    let t0 = out[0].arrival_s;
    for r in &mut out {
        r.arrival_s -= t0;
    }
    Ok(out)
}

fn parse_azure(path: &Path, text: &str) -> Result<Vec<Request>> {
    let bad = |line: usize, message: String| Error::TraceLine {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (i == 0 && line.starts_with("TIMESTAMP")) {
            continue;
        }
        let mut f = line.split(',');
        let (Some(ts), Some(p), Some(o)) = (f.next(), f.next(), f.next()) else {
            return Err(bad(
                i + 1,
                "expected TIMESTAMP,ContextTokens,GeneratedTokens".into(),
            ));
        };
        let arrival_s = parse_timestamp(ts.trim())
            .ok_or_else(|| bad(i + 1, format!("bad timestamp {ts:?}")))?;
        let prompt_tokens = p
            .trim()
            .parse()
            .map_err(|_| bad(i + 1, format!("bad ContextTokens {p:?}")))?;
        let output_tokens = o
            .trim()
            .parse()
            .map_err(|_| bad(i + 1, format!("bad GeneratedTokens {o:?}")))?;
        out.push(Request {
            arrival_s,
            prompt_tokens,
            output_tokens,
        });
    }
    Ok(out)
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` in UTC to seconds since the Unix epoch.
fn parse_timestamp(s: &str) -> Option<f64> {
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let (h, mi, sec) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + mi * 60.0 + sec)
}

#[derive(Deserialize)]
struct MooncakeRecord {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
}

fn parse_mooncake(path: &Path, text: &str) -> Result<Vec<Request>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: MooncakeRecord = serde_json::from_str(line).map_err(|source| Error::TraceJson {
            path: path.to_path_buf(),
            line: i + 1,
            source,
        })?;
        out.push(Request {
            arrival_s: r.timestamp / 1000.0,
            prompt_tokens: r.input_length,
            output_tokens: r.output_length,
        });
    }
    Ok(out)
}

/// Spread of the extra copies a rate scale above one makes, in seconds.
pub const COPY_SPREAD_S: f64 = 60.0;

/// Multiplies the arrival rate by `scale` while keeping the trace's duration and its
/// minute-scale shape: each request becomes ⌊scale⌋ copies, plus one more with probability
/// `scale − ⌊scale⌋` (so a scale below one thins the trace); copies after the first are shifted
/// by a uniform 0–60 s, so they do not arrive in lockstep. Seeded: the same seed, the same
/// trace.
pub fn scale(requests: &[Request], scale: f64, seed: u64) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let whole = scale.floor() as u32;
    let frac = scale - f64::from(whole);
    let end = requests.last().map_or(0.0, |r| r.arrival_s);
    let mut out = Vec::with_capacity((requests.len() as f64 * scale.max(0.0)).ceil() as usize);
    for r in requests {
        let n = whole + u32::from(frac > 0.0 && rng.random::<f64>() < frac);
        for k in 0..n {
            let shift = if k == 0 {
                0.0
            } else {
                rng.random::<f64>() * COPY_SPREAD_S
            };
            out.push(Request {
                arrival_s: (r.arrival_s + shift).min(end),
                ..*r
            });
        }
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::timeline::Timeline;

    #[test]
    fn azure_timestamps_parse_to_epoch_seconds() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0.0));
        let t = parse_timestamp("2023-11-16 18:15:46.6805900").unwrap();
        assert!((t - 1_700_158_546.680_59).abs() < 1e-4, "{t}");
        assert_eq!(parse_timestamp("not a time"), None);
    }

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
        let four = scale(&base, 4.0, 1);
        assert_eq!(four.len(), 4000);
        assert!(four.last().unwrap().arrival_s <= base.last().unwrap().arrival_s);
        let half = scale(&base, 0.5, 1);
        assert!((400..600).contains(&half.len()), "{}", half.len());
        assert_eq!(scale(&base, 2.5, 9), scale(&base, 2.5, 9));
        let tl = Timeline::new(&four, 10.0);
        let (rate, w) = tl.window(600.0, 1200.0).unwrap();
        assert!((rate - 4.0 / 3.6).abs() < 0.1, "{rate}");
        assert_eq!(w.mean_prompt_tokens, 100.0);
    }
}
