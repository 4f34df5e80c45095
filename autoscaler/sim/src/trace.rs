//! Request traces: request CSVs (Azure LLM inference 2023/2024, BurstGPT) and Mooncake JSONL,
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
    /// A request CSV, columns found by their header (see [`Columns`]): Azure LLM inference
    /// `TIMESTAMP,ContextTokens,GeneratedTokens` (2023, 2024), BurstGPT.
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

/// The columns of a request CSV, found by header name (case and spacing aside): the Azure LLM
/// inference traces' `TIMESTAMP,ContextTokens,GeneratedTokens` (2023 and 2024), BurstGPT's
/// `Timestamp,…,Request tokens,Response tokens,…`, or the same names as Mooncake and the
/// OpenAI usage fields (`timestamp`, `input_length`/`prompt_tokens`,
/// `output_length`/`completion_tokens`). Without a header the first three columns are taken
/// in the Azure order.
struct Columns {
    time: usize,
    prompt: usize,
    output: usize,
}

impl Columns {
    const TIME: &'static [&'static str] = &["timestamp", "time", "arrivaltime"];
    const PROMPT: &'static [&'static str] = &[
        "contexttokens",
        "requesttokens",
        "inputlength",
        "inputtokens",
        "prompttokens",
    ];
    const OUTPUT: &'static [&'static str] = &[
        "generatedtokens",
        "responsetokens",
        "outputlength",
        "outputtokens",
        "completiontokens",
    ];

    /// The columns a header line names; `Ok(None)` when the line is data, not a header.
    fn from_header(line: &str) -> Result<Option<Columns>, String> {
        let first = line.split(',').next().unwrap_or("").trim();
        if parse_timestamp(first).is_some() {
            return Ok(None);
        }
        let names: Vec<String> = line
            .split(',')
            .map(|c| {
                c.chars()
                    .filter(|ch| ch.is_alphanumeric())
                    .flat_map(char::to_lowercase)
                    .collect()
            })
            .collect();
        let find = |wanted: &[&str], what: &str| {
            names
                .iter()
                .position(|n| wanted.contains(&n.as_str()))
                .ok_or_else(|| format!("no {what} column in the header (one of {wanted:?})"))
        };
        Ok(Some(Columns {
            time: find(Self::TIME, "timestamp")?,
            prompt: find(Self::PROMPT, "prompt tokens")?,
            output: find(Self::OUTPUT, "output tokens")?,
        }))
    }
}

fn parse_azure(path: &Path, text: &str) -> Result<Vec<Request>> {
    let bad = |line: usize, message: String| Error::TraceLine {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut cols = Columns {
        time: 0,
        prompt: 1,
        output: 2,
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if i == 0 {
            if let Some(header) = Columns::from_header(line).map_err(|m| bad(1, m))? {
                cols = header;
                continue;
            }
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |k: usize, what: &str| {
            fields
                .get(k)
                .copied()
                .ok_or_else(|| bad(i + 1, format!("no {what} (column {})", k + 1)))
        };
        let ts = field(cols.time, "timestamp")?;
        let arrival_s =
            parse_timestamp(ts).ok_or_else(|| bad(i + 1, format!("bad timestamp {ts:?}")))?;
        let count = |k: usize, what: &str| -> Result<u32> {
            let v = field(k, what)?;
            v.parse::<u32>()
                .ok()
                .or_else(|| {
                    v.parse::<f64>()
                        .ok()
                        .filter(|x| *x >= 0.0)
                        .map(|x| x.round() as u32)
                })
                .ok_or_else(|| bad(i + 1, format!("bad {what} {v:?}")))
        };
        out.push(Request {
            arrival_s,
            prompt_tokens: count(cols.prompt, "prompt tokens")?,
            output_tokens: count(cols.output, "output tokens")?,
        });
    }
    Ok(out)
}

/// A trace's time in seconds: a number of seconds (BurstGPT), an RFC 3339 / ISO 8601 instant
/// with its offset (`2024-05-10 00:00:00.009930+00:00`), or a civil date and time read as
/// UTC (`2023-11-16 18:15:46.6805900`, the 2023 Azure traces).
fn parse_timestamp(s: &str) -> Option<f64> {
    if let Ok(secs) = s.parse::<f64>() {
        return secs.is_finite().then_some(secs);
    }
    let instant = s.parse::<jiff::Timestamp>().ok().or_else(|| {
        let civil = s.parse::<jiff::civil::DateTime>().ok()?;
        civil
            .to_zoned(jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp())
    })?;
    Some(instant.as_second() as f64 + f64::from(instant.subsec_nanosecond()) * 1e-9)
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
    fn instants_with_offsets_and_plain_seconds_parse() {
        let utc = parse_timestamp("2024-05-10 00:00:00.009930+00:00").unwrap();
        assert!((utc - 1_715_299_200.009_93).abs() < 1e-6, "{utc}");
        let east = parse_timestamp("2024-05-10T02:00:00+02:00").unwrap();
        assert!((east - 1_715_299_200.0).abs() < 1e-6, "{east}");
        assert_eq!(
            parse_timestamp("2024-05-10T00:00:00Z"),
            Some(1_715_299_200.0)
        );
        assert_eq!(parse_timestamp("12.5"), Some(12.5));
        assert_eq!(parse_timestamp("inf"), None);
    }

    /// The 2024 Azure traces (offsets on each time) and BurstGPT (seconds, columns by name,
    /// another order) read as the 2023 format does.
    #[test]
    fn columns_are_found_by_their_header() {
        let dir = std::env::temp_dir().join(format!("sluice-cols-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let read = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            load(&p).map(|r| {
                r.iter()
                    .map(|q| (q.arrival_s, q.prompt_tokens, q.output_tokens))
                    .collect::<Vec<_>>()
            })
        };
        let azure24 = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
            2024-05-10 00:00:00.5+00:00,2048,20\n2024-05-10 00:00:02+00:00,100,7\n";
        assert_eq!(
            read("a24.csv", azure24).unwrap(),
            vec![(0.0, 2048, 20), (1.5, 100, 7)]
        );
        let burst = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
            5,ChatGPT,472,18,490,Conversation log\n7.25,GPT-4,1087,0,1087,API log\n";
        assert_eq!(
            read("burst.csv", burst).unwrap(),
            vec![(0.0, 472, 18), (2.25, 1087, 0)]
        );
        let bare = "2023-11-16 18:15:46,10,2\n2023-11-16 18:15:50,20,3\n";
        assert_eq!(
            read("bare.csv", bare).unwrap(),
            vec![(0.0, 10, 2), (4.0, 20, 3)]
        );
        let err = read("odd.csv", "when,prompt,completion\n1,2,3\n").unwrap_err();
        assert!(err.to_string().contains("no timestamp column"), "{err}");
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
