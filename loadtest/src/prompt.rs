//! Turns an [`Input`] recipe into prompt text of a requested token length, without a hub
//! tokenizer. Filler is a sequence of space-led common words (` the`, ` time`, ...). Tokenizers
//! that split on spaces before merging (GPT-2/Llama-3-style BPE, most SentencePiece vocabularies)
//! never merge across such a boundary, so when a counter (the server's `/tokenize` or a local
//! `--tokenizer`, see [`crate::calibrate`]) says a word is exactly one token, `n` such words are
//! exactly `n` tokens, blocks concatenate exactly, and equal Mooncake hash ids give equal token
//! blocks. Without a counter the words are three letters plus a space: the stated approximation
//! of ~4 characters per token.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::dataset::{splitmix, Input};

/// How prompt lengths were made, for the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Calibration {
    /// Words a tokenizer counts as one token each. `by` names the tokenizer (the server's
    /// `/tokenize` or a local file); `overhead` is what it adds to any prompt (BOS and the
    /// like), `verified` a check of a whole rendered prompt (tokens wanted, tokens counted less
    /// the overhead).
    Counted {
        by: String,
        words: usize,
        overhead: i64,
        verified: Option<(u32, i64)>,
    },
    /// ~4 characters per token; no tokenizer was at hand.
    Approx4Chars,
}

impl Calibration {
    /// Whether lengths were counted by the server's own `/tokenize`.
    pub fn by_server(&self) -> bool {
        matches!(self, Self::Counted { by, .. } if by == "server /tokenize")
    }
}

impl std::fmt::Display for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Counted {
                by,
                words,
                overhead,
                verified,
            } => {
                write!(f, "{by}: {words} one-token filler words")?;
                if let Some((want, got)) = verified {
                    write!(
                        f,
                        "; a {want}-token prompt counted {got} (+{overhead} special)"
                    )?;
                }
                Ok(())
            }
            Self::Approx4Chars => write!(
                f,
                "approximate: ~4 characters per token (no /tokenize, no --tokenizer)"
            ),
        }
    }
}

/// Candidate filler words; the server-calibrated set keeps those that tokenize to one token.
pub const CANDIDATES: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "over",
    "new",
    "sound",
    "take",
    "only",
    "little",
    "work",
    "know",
    "place",
    "year",
    "live",
    "me",
    "back",
    "give",
    "most",
    "very",
    "after",
    "thing",
    "our",
    "just",
    "name",
    "good",
    "man",
    "think",
    "say",
    "great",
    "where",
    "help",
    "through",
    "much",
    "before",
    "line",
    "right",
    "too",
    "mean",
    "old",
    "any",
    "same",
    "tell",
    "boy",
    "follow",
    "came",
    "want",
    "show",
    "also",
    "around",
    "form",
    "three",
    "small",
    "set",
    "put",
    "end",
    "does",
    "another",
    "well",
    "large",
    "must",
    "big",
    "even",
    "such",
    "because",
    "turn",
    "here",
    "why",
    "ask",
    "went",
    "men",
    "read",
    "need",
    "land",
    "different",
    "home",
    "us",
    "move",
    "try",
    "kind",
    "hand",
    "picture",
    "again",
    "change",
    "off",
    "play",
    "spell",
    "air",
    "away",
    "animal",
    "house",
    "point",
    "page",
    "letter",
    "mother",
    "answer",
    "found",
    "study",
    "still",
    "learn",
];

/// Renders inputs to text with one calibrated word list.
#[derive(Debug, Clone)]
pub struct PromptMaker {
    /// Each entry includes its leading space.
    words: Vec<String>,
    calibration: Calibration,
}

impl PromptMaker {
    /// The approximation: three-letter words, ` xxx` = 4 characters ≈ 1 token.
    pub fn approx() -> Self {
        let words = CANDIDATES
            .iter()
            .filter(|w| w.len() == 3)
            .map(|w| format!(" {w}"))
            .collect();
        Self {
            words,
            calibration: Calibration::Approx4Chars,
        }
    }

    /// Words already known to be one token each (from [`crate::calibrate::calibrate`]), as
    /// counted by `by`.
    pub fn calibrated(words: Vec<String>, overhead: i64, by: String) -> Self {
        assert!(!words.is_empty());
        Self {
            calibration: Calibration::Counted {
                by,
                words: words.len(),
                overhead,
                verified: None,
            },
            words,
        }
    }

    /// Records the result of counting one rendered prompt.
    pub fn set_verified(&mut self, want: u32, got: i64) {
        if let Calibration::Counted { verified, .. } = &mut self.calibration {
            *verified = Some((want, got));
        }
    }

    /// How lengths were made.
    pub fn calibration(&self) -> &Calibration {
        &self.calibration
    }

    /// Whether token counts of rendered prompts are exact (calibrated) or approximate.
    pub fn exact(&self) -> bool {
        matches!(self.calibration, Calibration::Counted { .. })
    }

    fn filler(&self, out: &mut String, tokens: u32, seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..tokens {
            out.push_str(&self.words[rng.random_range(0..self.words.len())]);
        }
    }

    /// The prompt text, and its intended token count.
    pub fn render(&self, input: &Input) -> (String, u32) {
        match input {
            Input::Synthetic { tokens, seed } => {
                let mut s = String::with_capacity(*tokens as usize * 6);
                self.filler(&mut s, *tokens, *seed);
                (s, *tokens)
            }
            Input::Blocks {
                ids,
                tokens,
                block_tokens,
            } => {
                let mut s = String::with_capacity(*tokens as usize * 6);
                let mut left = *tokens;
                for (i, id) in ids.iter().enumerate() {
                    if left == 0 {
                        break;
                    }
                    // The last listed block absorbs any remainder so the prompt totals `tokens`.
                    let n = if i + 1 == ids.len() {
                        left
                    } else {
                        left.min(*block_tokens)
                    };
                    self.filler(&mut s, n, splitmix(id.wrapping_add(0x5EED)));
                    left -= n;
                }
                (s, *tokens)
            }
            Input::Text { text, tokens } => {
                let n = tokens.unwrap_or_else(|| crate::dataset::approx_tokens(text));
                (text.to_string(), n)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn approx_prompts_are_four_chars_a_token() {
        let m = PromptMaker::approx();
        let (s, n) = m.render(&Input::Synthetic {
            tokens: 100,
            seed: 1,
        });
        assert_eq!((s.len(), n), (400, 100));
        assert!(!m.exact());
    }

    #[test]
    fn equal_block_ids_render_equal_prefixes() {
        let m = PromptMaker::calibrated(
            vec![" a".into(), " b".into(), " c".into()],
            1,
            "test".into(),
        );
        let a = Input::Blocks {
            ids: Arc::from(vec![7, 8, 9]),
            tokens: 25,
            block_tokens: 10,
        };
        let b = Input::Blocks {
            ids: Arc::from(vec![7, 8, 3]),
            tokens: 30,
            block_tokens: 10,
        };
        let (sa, _) = m.render(&a);
        let (sb, _) = m.render(&b);
        assert_eq!(sa.len(), 50);
        assert_eq!(sb.len(), 60);
        assert_eq!(sa[..40], sb[..40]); // blocks 7 and 8: 20 words of 2 chars
        assert_ne!(sa[40..], sb[40..50]);
    }
}
