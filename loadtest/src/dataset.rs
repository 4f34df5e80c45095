//! What each request asks for: prompt (as a recipe, rendered to text by [`crate::prompt`]) and
//! output length, plus, for trace replay, when it is due. ShareGPT JSON is parsed here, request
//! traces by [`sluice_traces`]; nothing here talks to a server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::Deserialize;

use crate::error::{Error, Result};

/// Tokens in one Mooncake prompt block (the trace's `hash_ids` each name 512 tokens).
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// How the random dataset spreads lengths around `--input-len` / `--output-len`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LenDist {
    /// Every request has exactly the given lengths.
    Fixed,
    /// Each length is the given one times a factor drawn uniformly from `[lo, hi]`.
    Uniform { lo: f64, hi: f64 },
    /// Each length is the given one times a factor drawn from `N(mean, sd)` (clamped to ≥ 1 token).
    Normal { mean: f64, sd: f64 },
}

impl std::str::FromStr for LenDist {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidArg {
            flag: "--len-dist",
            reason: format!("`{s}`: {reason} (want fixed, uniform:LO,HI or normal:MEAN,SD)"),
        };
        if s == "fixed" {
            return Ok(Self::Fixed);
        }
        let (kind, params) = s.split_once(':').ok_or_else(|| bad("no parameters"))?;
        let (a, b) = params
            .split_once(',')
            .ok_or_else(|| bad("two numbers needed"))?;
        let a: f64 = a.trim().parse().map_err(|_| bad("not a number"))?;
        let b: f64 = b.trim().parse().map_err(|_| bad("not a number"))?;
        match kind {
            "uniform" if 0.0 < a && a <= b => Ok(Self::Uniform { lo: a, hi: b }),
            "normal" if a > 0.0 && b >= 0.0 => Ok(Self::Normal { mean: a, sd: b }),
            "uniform" => Err(bad("need 0 < LO <= HI")),
            "normal" => Err(bad("need MEAN > 0, SD >= 0")),
            _ => Err(bad("unknown distribution")),
        }
    }
}

impl LenDist {
    fn draw(self, base: u32, rng: &mut ChaCha8Rng) -> u32 {
        let factor = match self {
            Self::Fixed => 1.0,
            Self::Uniform { lo, hi } => rng.random_range(lo..=hi),
            Self::Normal { mean, sd } => Normal::new(mean, sd).expect("sd >= 0").sample(rng),
        };
        (base as f64 * factor).round().max(1.0) as u32
    }
}

/// The prompt a request should carry, before it is rendered to text.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// `tokens` tokens of filler drawn from a seed unique to the request (no shared prefixes).
    Synthetic { tokens: u32, seed: u64 },
    /// Mooncake prefix blocks: block `i` is `block_tokens` of filler seeded by `ids[i]`, so equal
    /// ids render to equal text and a prefix cache sees the trace's sharing; the last block is cut
    /// so the prompt totals `tokens`.
    Blocks {
        ids: Arc<[u64]>,
        tokens: u32,
        block_tokens: u32,
    },
    /// A given text (ShareGPT); its token count is known only if it was counted.
    Text { text: Arc<str>, tokens: Option<u32> },
}

/// One request of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub input: Input,
    /// `max_tokens` to ask for.
    pub output_len: u32,
    /// Trace replay: when it is due, in trace seconds from the trace's start (unscaled).
    pub trace_time_s: Option<f64>,
}

/// The source of requests: generated on demand (random) or a list read from a file.
#[derive(Debug, Clone)]
pub enum Dataset {
    Random {
        input_len: u32,
        output_len: u32,
        dist: LenDist,
        seed: u64,
    },
    List {
        specs: Vec<Spec>,
        /// What the list came from, for the report.
        origin: String,
    },
}

impl Dataset {
    /// Request `i`, or `None` when a finite dataset is exhausted. Random requests are a pure
    /// function of `(seed, i)`, so a rerun with the same seed sends the same prompts.
    pub fn get(&self, i: usize) -> Option<Spec> {
        match self {
            Self::Random {
                input_len,
                output_len,
                dist,
                seed,
            } => {
                let req_seed = splitmix(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut rng = ChaCha8Rng::seed_from_u64(req_seed);
                Some(Spec {
                    input: Input::Synthetic {
                        tokens: dist.draw(*input_len, &mut rng),
                        seed: req_seed,
                    },
                    output_len: dist.draw(*output_len, &mut rng),
                    trace_time_s: None,
                })
            }
            Self::List { specs, .. } => specs.get(i).cloned(),
        }
    }

    /// How many requests a finite dataset has.
    pub fn len(&self) -> Option<usize> {
        match self {
            Self::Random { .. } => None,
            Self::List { specs, .. } => Some(specs.len()),
        }
    }

    /// Whether a finite dataset has no requests.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        match self {
            Self::Random {
                input_len,
                output_len,
                dist,
                ..
            } => format!("random: input {input_len}, output {output_len} tokens, {dist:?}"),
            Self::List { specs, origin } => format!("{origin}: {} requests", specs.len()),
        }
    }
}

/// A stateless 64-bit mixer (SplitMix64), so per-request and per-block seeds are independent.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

fn parse_err(path: &Path, line: usize, reason: impl Into<String>) -> Error {
    Error::Parse {
        path: path.to_owned(),
        line,
        reason: reason.into(),
    }
}

/// Scales a token count, keeping at least one token.
pub fn scale_tokens(n: u32, scale: f64) -> u32 {
    ((n as f64) * scale).round().max(1.0) as u32
}

/// Reads a trace ([`sluice_traces`]: the Azure LLM inference CSVs of 2023 and 2024, BurstGPT,
/// Mooncake JSON lines), lengths multiplied by `token_scale`, times in seconds from the first
/// row. Mooncake's prompt blocks are kept, scaled too (`512 × token_scale` tokens each), so the
/// sharing pattern holds at the smaller size; other prompts are synthetic, seeded by their row.
/// `text` is the file at `path`.
fn trace_specs(path: &Path, text: &str, token_scale: f64) -> Result<Vec<Spec>> {
    let rows = sluice_traces::read(text).map_err(|e| parse_err(path, e.line, e.message.clone()))?;
    let block_tokens = scale_tokens(MOONCAKE_BLOCK_TOKENS, token_scale);
    let Some(t0) = rows.first().map(|r| r.at) else {
        return Ok(Vec::new());
    };
    Ok(rows
        .into_iter()
        .map(|row| {
            let tokens = scale_tokens(row.prompt_tokens, token_scale);
            let input = if row.hash_ids.is_empty() {
                Input::Synthetic {
                    tokens,
                    seed: splitmix(row.line as u64 - 1),
                }
            } else {
                Input::Blocks {
                    ids: row.hash_ids.into(),
                    tokens,
                    block_tokens,
                }
            };
            Spec {
                input,
                output_len: scale_tokens(row.output_tokens, token_scale),
                trace_time_s: Some(row.at.seconds_since(t0)),
            }
        })
        .collect())
}

/// Reads a trace (see [`trace_specs`]), its format told by content.
pub fn trace(path: &Path, token_scale: f64) -> Result<Dataset> {
    let text = read(path)?;
    Ok(Dataset::List {
        specs: trace_specs(path, &text, token_scale)?,
        origin: format!(
            "{} {}",
            sluice_traces::Format::of(&text).name(),
            path.display()
        ),
    })
}

#[derive(Deserialize)]
struct ShareGptConv {
    #[serde(default)]
    conversations: Vec<ShareGptTurn>,
}

#[derive(Deserialize)]
struct ShareGptTurn {
    #[serde(default)]
    value: String,
}

/// Reads ShareGPT JSON (an array of `{"conversations": [{"from", "value"}, ...]}`): the first
/// turn is the prompt and the second's length, at ~4 characters a token unless counted later,
/// is the output length (vLLM's convention). Conversations with fewer than two turns are
/// skipped; the rest are shuffled by `seed`.
pub fn sharegpt(path: &Path, seed: u64) -> Result<(Vec<Spec>, Vec<Arc<str>>)> {
    let text = read(path)?;
    let convs: Vec<ShareGptConv> =
        serde_json::from_str(&text).map_err(|e| parse_err(path, e.line(), e.to_string()))?;
    let mut pairs: Vec<(Arc<str>, Arc<str>)> = convs
        .into_iter()
        .filter(|c| c.conversations.len() >= 2 && !c.conversations[0].value.is_empty())
        .map(|c| {
            (
                Arc::from(c.conversations[0].value.as_str()),
                Arc::from(c.conversations[1].value.as_str()),
            )
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in (1..pairs.len()).rev() {
        pairs.swap(i, rng.random_range(0..=i));
    }
    let replies = pairs.iter().map(|(_, r)| r.clone()).collect();
    let specs = pairs
        .into_iter()
        .map(|(p, r)| Spec {
            input: Input::Text {
                text: p,
                tokens: None,
            },
            output_len: approx_tokens(&r),
            trace_time_s: None,
        })
        .collect();
    Ok((specs, replies))
}

/// The stated approximation when no tokenizer is at hand: ~4 characters per token.
pub fn approx_tokens(text: &str) -> u32 {
    (text.chars().count() as u32).div_ceil(4).max(1)
}

/// Where a dataset flag points, resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Random,
    ShareGpt(PathBuf),
    Trace(PathBuf),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared sample traces, beside the repository (`../shared/data/traces`).
    const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/traces");

    /// BurstGPT's columns (found by name, in its order, times in seconds) read as Azure's do.
    #[test]
    fn burstgpt_columns_are_found_by_name() {
        let dir = std::env::temp_dir().join(format!("sluice-lt-burst-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("burst.csv");
        std::fs::write(
            &p,
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
             5,ChatGPT,472,18,490,Conversation log\n7.5,GPT-4,1087,1,1088,API log\n",
        )
        .unwrap();
        let specs = trace_specs(&p, &read(&p).unwrap(), 1.0).unwrap();
        let got: Vec<_> = specs
            .iter()
            .map(|s| (s.trace_time_s, s.output_len))
            .collect();
        assert_eq!(got, vec![(Some(0.0), 18), (Some(2.5), 1)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn len_dist_parses_and_rejects() {
        assert_eq!("fixed".parse::<LenDist>().unwrap(), LenDist::Fixed);
        assert_eq!(
            "uniform:0.5,1.5".parse::<LenDist>().unwrap(),
            LenDist::Uniform { lo: 0.5, hi: 1.5 }
        );
        assert_eq!(
            "normal:1,0.2".parse::<LenDist>().unwrap(),
            LenDist::Normal { mean: 1.0, sd: 0.2 }
        );
        assert!("uniform:2,1".parse::<LenDist>().is_err());
        assert!("zipf:1,2".parse::<LenDist>().is_err());
    }

    #[test]
    fn random_dataset_is_seeded_and_within_range() {
        let d = Dataset::Random {
            input_len: 100,
            output_len: 10,
            dist: LenDist::Uniform { lo: 0.5, hi: 1.5 },
            seed: 9,
        };
        assert_eq!(d.get(3), d.get(3));
        for i in 0..200 {
            let s = d.get(i).unwrap();
            let Input::Synthetic { tokens, .. } = s.input else {
                panic!()
            };
            assert!((50..=150).contains(&tokens), "{tokens}");
            assert!((5..=15).contains(&s.output_len));
        }
    }

    #[test]
    fn azure_sample_parses() {
        let path = format!("{TRACES}/azure-llm-2023-conv.csv");
        let specs = trace_specs(Path::new(&path), &read(Path::new(&path)).unwrap(), 1.0).unwrap();
        // 19,366 data rows after the header (the README's count is `wc -l`, which misses the last
        // line: the file has no final newline).
        assert_eq!(specs.len(), 19_366);
        assert_eq!(
            specs[0].input,
            Input::Synthetic {
                tokens: 374,
                seed: splitmix(1)
            }
        );
        assert_eq!(specs[0].output_len, 44);
        let t0 = specs[0].trace_time_s.unwrap();
        let t1 = specs[1].trace_time_s.unwrap();
        assert!((t1 - t0 - (50.995169 - 46.68059)).abs() < 1e-6);
        // The file spans one hour.
        let last = specs.last().unwrap().trace_time_s.unwrap();
        assert!((3000.0..3700.0).contains(&(last - t0)), "{}", last - t0);
    }

    #[test]
    fn mooncake_sample_parses_with_shared_blocks() {
        let path = format!("{TRACES}/mooncake-synthetic.jsonl");
        let specs = trace_specs(Path::new(&path), &read(Path::new(&path)).unwrap(), 0.25).unwrap();
        assert_eq!(specs.len(), 3_993);
        let Input::Blocks {
            ids,
            tokens,
            block_tokens,
        } = &specs[0].input
        else {
            panic!()
        };
        assert_eq!((ids.len(), *tokens, *block_tokens), (79, 10_040, 128));
        assert_eq!(specs[0].output_len, 2); // 6 × 0.25 rounded
        assert_eq!(specs[2].trace_time_s, Some(0.04));
        // Some block id appears in more than one request: the trace shares prefixes.
        let mut seen = std::collections::HashMap::new();
        for s in &specs {
            if let Input::Blocks { ids, .. } = &s.input {
                *seen.entry(ids[0]).or_insert(0) += 1;
            }
        }
        assert!(seen.values().any(|&n| n > 1));
    }

    #[test]
    fn trace_detects_format() {
        let d = trace(
            Path::new(&format!("{TRACES}/mooncake-synthetic.jsonl")),
            1.0,
        )
        .unwrap();
        assert!(d.describe().starts_with("mooncake trace"));
        let d = trace(Path::new(&format!("{TRACES}/azure-llm-2023-conv.csv")), 1.0).unwrap();
        assert!(d.describe().starts_with("csv trace"));
    }

    #[test]
    fn sharegpt_takes_first_two_turns() {
        let dir = std::env::temp_dir().join(format!("sharegpt-{}.json", std::process::id()));
        std::fs::write(
            &dir,
            r#"[{"conversations":[{"from":"human","value":"hello there"},{"from":"gpt","value":"12345678"}]},
                {"conversations":[{"from":"human","value":"alone"}]}]"#,
        )
        .unwrap();
        let (specs, replies) = sharegpt(&dir, 0).unwrap();
        std::fs::remove_file(&dir).ok();
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].output_len, 2);
        assert_eq!(&*replies[0], "12345678");
    }
}
