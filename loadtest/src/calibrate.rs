//! Who counts prompt tokens, and the calibration that makes prompt lengths exact.
//!
//! Precedence (the issue's): the server's `/tokenize` when it has one, since it counts with the
//! very tokenizer the server runs; else the local `--tokenizer FILE`; else the stated
//! approximation of ~4 characters per token. `--no-tokenize` skips the server, so
//! `--no-tokenize --tokenizer FILE` forces the local file (offline runs, or a server whose
//! `/tokenize` is slow). [`crate::prompt::Calibration`] records which one was used.

use std::sync::Arc;

use crate::client::Client;
use crate::tokenizer::LocalTokenizer;

/// Something that can count the tokens of a prompt.
#[derive(Debug, Clone)]
pub enum Counter {
    /// `POST /tokenize` on the server under test.
    Server(Box<Client>),
    /// A `tokenizer.json` or GGUF file given with `--tokenizer`.
    Local(Arc<LocalTokenizer>),
}

impl Counter {
    /// The tokens `text` becomes as a prompt (special tokens such as BOS included).
    pub async fn count(&self, text: &str) -> Result<i64, String> {
        match self {
            Self::Server(c) => c.tokenize(text).await,
            Self::Local(t) => t.count(text).map(|n| n as i64),
        }
    }

    /// For the report.
    pub fn describe(&self) -> String {
        match self {
            Self::Server(_) => "server /tokenize".into(),
            Self::Local(t) => t.describe().to_string(),
        }
    }
}

/// Finds filler words the counter counts as exactly one token each (see [`crate::prompt`]),
/// and the tokens the counter adds to any text (BOS and the like). A word qualifies when
/// `" w w"` counts one more than `" w"`: then it neither merges with its neighbour nor splits.
/// `Err` says why the counter cannot be used for this.
pub async fn calibrate(counter: &Counter) -> Result<(Vec<String>, i64), String> {
    let mut words = Vec::new();
    let mut overheads = Vec::new();
    for w in crate::prompt::CANDIDATES {
        let one = format!(" {w}");
        let c1 = counter.count(&one).await?;
        let c2 = counter.count(&format!("{one}{one}")).await?;
        if c2 - c1 == 1 {
            words.push(one);
            overheads.push(c1 - 1);
        }
    }
    if words.len() < 16 {
        return Err(format!(
            "only {} filler words count as one token",
            words.len()
        ));
    }
    overheads.sort_unstable();
    Ok((words, overheads[overheads.len() / 2]))
}
