//! Request traces as they are published, read into [`Row`]s: when each request came and how
//! many tokens it sent and got back. The autoscaler's simulator and the load tester both replay
//! them; this is the one reader of their formats.
//!
//! - **CSV**, columns found by their header's names (case and spacing aside): the Azure LLM
//!   inference traces' `TIMESTAMP,ContextTokens,GeneratedTokens` (2023, and 2024 with an
//!   offset on each time), BurstGPT's `Timestamp,…,Request tokens,Response tokens,…` (seconds),
//!   or Mooncake's and OpenAI's usage names. A file without a header is read in Azure's order.
//! - **JSON lines** (Mooncake): `{"timestamp": ms, "input_length", "output_length",
//!   "hash_ids"?}`.
//!
//! [`read`] tells the two apart by content ([`Format::of`]): JSON lines open with `{`.

use serde::Deserialize;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Its line in the file (1-based), for messages.
    pub line: usize,
    pub at: Instant,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Mooncake's prompt blocks (512 tokens each; equal ids are equal blocks), else empty.
    pub hash_ids: Vec<u64>,
}

/// A time in a trace: whole seconds and the fraction apart, since an `f64` of Unix seconds
/// keeps only about a fifth of a microsecond and the Azure traces have tenths of one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Instant {
    pub secs: i64,
    pub frac: f64,
}

impl Instant {
    fn from_seconds(s: f64) -> Self {
        let secs = s.floor();
        Self {
            secs: secs as i64,
            frac: s - secs,
        }
    }

    /// Seconds from `earlier` to `self`.
    pub fn seconds_since(self, earlier: Instant) -> f64 {
        (self.secs - earlier.secs) as f64 + (self.frac - earlier.frac)
    }
}

/// Why a line could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for TraceError {}

type Result<T> = std::result::Result<T, TraceError>;

fn bad(line: usize, message: impl Into<String>) -> TraceError {
    TraceError {
        line,
        message: message.into(),
    }
}

/// A trace's format, told by its content: JSON lines open with `{`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    MooncakeJsonl,
}

impl Format {
    pub fn of(text: &str) -> Format {
        if text.trim_start().starts_with('{') {
            Format::MooncakeJsonl
        } else {
            Format::Csv
        }
    }

    /// The format's name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Csv => "csv trace",
            Format::MooncakeJsonl => "mooncake trace",
        }
    }
}

/// Reads a trace, CSV or JSON lines by its content ([`Format::of`]), in file order.
pub fn read(text: &str) -> Result<Vec<Row>> {
    match Format::of(text) {
        Format::MooncakeJsonl => read_jsonl(text),
        Format::Csv => read_csv(text),
    }
}

/// A trace's time: a number of seconds (BurstGPT), an RFC 3339 / ISO 8601 instant with its
/// offset (`2024-05-10 00:00:00.009930+00:00`), or a civil date and time read as UTC
/// (`2023-11-16 18:15:46.6805900`).
pub fn parse_time(s: &str) -> Option<Instant> {
    if let Ok(secs) = s.parse::<f64>() {
        return secs.is_finite().then(|| Instant::from_seconds(secs));
    }
    let instant = s.parse::<jiff::Timestamp>().ok().or_else(|| {
        let civil = s.parse::<jiff::civil::DateTime>().ok()?;
        civil
            .to_zoned(jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp())
    })?;
    let nanos = instant.as_nanosecond();
    Some(Instant {
        secs: nanos.div_euclid(1_000_000_000) as i64,
        frac: nanos.rem_euclid(1_000_000_000) as f64 * 1e-9,
    })
}

/// Where a CSV's time, prompt and output columns are.
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
    /// Azure's order, for a file without a header.
    const AZURE: Columns = Columns {
        time: 0,
        prompt: 1,
        output: 2,
    };

    /// The columns a header line names; `Ok(None)` when the line is data, not a header.
    fn from_header(line: &str) -> std::result::Result<Option<Columns>, String> {
        let first = line.split(',').next().unwrap_or("").trim();
        if parse_time(first).is_some() {
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

/// Reads a request CSV (see the crate's doc).
pub fn read_csv(text: &str) -> Result<Vec<Row>> {
    let mut cols = Columns::AZURE;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let (n, line) = (i + 1, line.trim());
        if line.is_empty() {
            continue;
        }
        if i == 0 {
            if let Some(header) = Columns::from_header(line).map_err(|m| bad(n, m))? {
                cols = header;
                continue;
            }
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |k: usize, what: &str| {
            fields
                .get(k)
                .copied()
                .ok_or_else(|| bad(n, format!("no {what} (column {})", k + 1)))
        };
        let ts = field(cols.time, "timestamp")?;
        let at = parse_time(ts).ok_or_else(|| bad(n, format!("bad timestamp {ts:?}")))?;
        let count = |k: usize, what: &str| -> Result<u32> {
            let v = field(k, what)?;
            token_count(v).ok_or_else(|| bad(n, format!("bad {what} {v:?}")))
        };
        out.push(Row {
            line: n,
            at,
            prompt_tokens: count(cols.prompt, "prompt tokens")?,
            output_tokens: count(cols.output, "output tokens")?,
            hash_ids: Vec::new(),
        });
    }
    Ok(out)
}

/// A token count, written as an integer or (rounded) as a float.
fn token_count(v: &str) -> Option<u32> {
    v.parse::<u32>().ok().or_else(|| {
        v.parse::<f64>()
            .ok()
            .filter(|x| (0.0..=f64::from(u32::MAX)).contains(x))
            .map(|x| x.round() as u32)
    })
}

#[derive(Deserialize)]
struct MooncakeRecord {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Reads Mooncake JSON lines (`timestamp` in milliseconds).
pub fn read_jsonl(text: &str) -> Result<Vec<Row>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: MooncakeRecord = serde_json::from_str(line)
            .map_err(|e| bad(i + 1, format!("not a Mooncake trace record: {e}")))?;
        if !r.timestamp.is_finite() {
            return Err(bad(i + 1, "the timestamp is not a finite number"));
        }
        out.push(Row {
            line: i + 1,
            at: Instant::from_seconds(r.timestamp / 1000.0),
            prompt_tokens: r.input_length,
            output_tokens: r.output_length,
            hash_ids: r.hash_ids,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: &str) -> f64 {
        parse_time(s)
            .unwrap()
            .seconds_since(Instant { secs: 0, frac: 0.0 })
    }

    #[test]
    fn times_parse_with_or_without_an_offset_and_as_seconds() {
        assert_eq!(secs("1970-01-01 00:00:01"), 1.0);
        let t = parse_time("2023-11-16 18:15:46.6805900").unwrap();
        assert_eq!(t.secs, 1_700_158_546);
        assert!((t.frac - 0.68059).abs() < 1e-12, "{t:?}");
        let utc = parse_time("2024-05-10 00:00:00.009930+00:00").unwrap();
        assert_eq!(utc.secs, 1_715_299_200);
        assert!((utc.frac - 0.00993).abs() < 1e-12, "{utc:?}");
        assert_eq!(secs("2024-05-10T02:00:00+02:00"), 1_715_299_200.0);
        assert_eq!(secs("2024-05-10T00:00:00Z"), 1_715_299_200.0);
        assert_eq!(
            parse_time("7.25"),
            Some(Instant {
                secs: 7,
                frac: 0.25
            })
        );
        for bad in ["inf", "not a time", "2023-13-01 00:00:00"] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    fn rows(text: &str) -> Result<Vec<(f64, u32, u32)>> {
        let r = read(text)?;
        let t0 = r[0].at;
        Ok(r.iter()
            .map(|q| (q.at.seconds_since(t0), q.prompt_tokens, q.output_tokens))
            .collect())
    }

    /// The 2024 Azure traces (offsets on each time), BurstGPT (seconds, columns by name in
    /// another order) and a bare file read as the 2023 format does.
    #[test]
    fn columns_are_found_by_their_header() {
        let azure23 = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
            2023-11-16 18:15:46.5,374,44\n2023-11-16 18:15:47.5,10,2\n";
        assert_eq!(rows(azure23).unwrap(), vec![(0.0, 374, 44), (1.0, 10, 2)]);
        let azure24 = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
            2024-05-10 00:00:00.5+00:00,2048,20\n2024-05-10 00:00:02+00:00,100,7\n";
        assert_eq!(rows(azure24).unwrap(), vec![(0.0, 2048, 20), (1.5, 100, 7)]);
        let burst = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
            5,ChatGPT,472,18,490,Conversation log\n7.25,GPT-4,1087.0,0,1087,API log\n";
        assert_eq!(rows(burst).unwrap(), vec![(0.0, 472, 18), (2.25, 1087, 0)]);
        let bare = "2023-11-16 18:15:46,10,2\n2023-11-16 18:15:50,20,3\n";
        assert_eq!(rows(bare).unwrap(), vec![(0.0, 10, 2), (4.0, 20, 3)]);
    }

    #[test]
    fn bad_lines_are_named() {
        let e = read("when,prompt,completion\n1,2,3\n").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("no timestamp column"), "{e}");
        let e =
            read("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47,x,2\n").unwrap_err();
        assert_eq!((e.line, e.message.as_str()), (2, "bad prompt tokens \"x\""));
        let e =
            read("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47,1\n").unwrap_err();
        assert!(e.message.contains("column 3"), "{e}");
        let e = read("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{oops\n")
            .unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn mooncake_lines_keep_their_blocks() {
        let text = "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 5, \
                    \"hash_ids\": [1, 2]}\n\n{\"timestamp\": 1500, \"input_length\": 7, \
                    \"output_length\": 3}\n";
        let r = read(text).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].hash_ids.clone(), r[1].line), (vec![1, 2], 3));
        assert_eq!(r[1].at.seconds_since(r[0].at), 1.5);
    }
}
