//! Grammar-constrained decoding: a choice whose output must match a JSON schema or a Lark
//! grammar samples only tokens the grammar allows at each step.
//!
//! [llguidance](https://github.com/guidance-ai/llguidance) does the work: a [`Vocabulary`]
//! (the tokenizer's bytes in a trie, built once per engine) compiles a [`Grammar`] into a
//! [`Constraint`], shared by every choice of a request; each choice runs its own matcher
//! ([`ChoiceMatcher`]), which yields the allowed-token mask for the next step and consumes the
//! token sampled. Masks are computed by the engine beside the forward pass when a core
//! is free for them (a GPU forward, or a CPU forward on fewer threads than cores), else right
//! after it on the engine thread (see `engine::masks_beside`).
//!
//! Compiling is bounded: the grammar's size, the lexer's start-up work and each step's work
//! have llguidance's limits ([`Vocabulary::new`]), so a hostile schema fails instead of
//! stalling the engine thread; a step that would exceed them ends the choice with an error.

use std::fmt;
use std::sync::{Arc, Mutex};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use sluice_models::Model;
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// What a caller constrains the output to.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid against this JSON schema (`{"type": "object"}` for any object).
    JsonSchema(Value),
    /// A Lark grammar in llguidance's dialect (`%json { … }` embeds a schema).
    Lark(String),
    /// Text that this regular expression (Rust `regex` syntax) matches in full.
    Regex(String),
}

/// Why a grammar does not compile: the schema or grammar is invalid, uses a feature that is
/// not supported, or is too large or complex to compile within the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarError(pub String);

impl fmt::Display for GrammarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GrammarError {}

/// The tokenizer's vocabulary as llguidance reads it (every token's bytes in a trie, special
/// tokens marked) and the factory that compiles grammars against it. Built once per model.
pub struct Vocabulary {
    factory: ParserFactory,
}

impl fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vocabulary")
            .field(
                "vocab_size",
                &self.factory.tok_env().tok_trie().vocab_size(),
            )
            .finish_non_exhaustive()
    }
}

/// `TokenizerEnv` over the model's tokenizer: the trie, and plain-text encoding for the
/// grammar's literal strings.
struct Env {
    trie: TokTrie,
    model: Arc<Model>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.model
                .tokenizer()
                .encode(text, false)
                .unwrap_or_default()
        })
    }
}

/// Per-step limits: a step may spend about 15 ms of lexer work and 50 000 parser items
/// (llguidance's own defaults, a few milliseconds each), and a grammar may have at most
/// 200 000 symbols (a schema of about a megabyte). Exceeding them is an error, not a stall.
fn limits() -> ParserLimits {
    ParserLimits {
        max_grammar_size: 200_000,
        ..ParserLimits::default()
    }
}

impl Vocabulary {
    /// The vocabulary of `model`'s tokenizer, padded to the model's vocabulary size (the
    /// logits' width) with ids no grammar allows. `eos` are the ids that end a choice: the
    /// grammar allows them once its text is complete.
    pub fn new(model: Arc<Model>, eos: &[u32]) -> Result<Self, GrammarError> {
        let tokenizer = model.tokenizer();
        let vocab_size = model.config().vocab_size;
        let mut words: Vec<Vec<u8>> = tokenizer
            .vocabulary_bytes()
            .into_iter()
            .map(|(bytes, special)| {
                if special {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend(bytes);
                    marked
                } else {
                    bytes
                }
            })
            .collect();
        while words.len() < vocab_size {
            let mut name = format!(".<[{}]>", words.len()).into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(name);
        }
        let first_eos = eos.first().copied().unwrap_or(tokenizer.eos_id());
        let mut info = TokRxInfo::new(words.len() as u32, first_eos);
        info.tok_bos = tokenizer.bos_id();
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(eos);
        }
        let env: TokEnv = Arc::new(Env { trie, model });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Self { factory })
    }

    /// Compiles `grammar`. JSON is written compactly (`", "` and `": "` separators, no
    /// free whitespace) so a model cannot pad it forever.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let top = match grammar {
            Grammar::JsonSchema(schema) => {
                let mut schema = schema.clone();
                if let Value::Object(m) = &mut schema {
                    m.entry("x-guidance")
                        .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            Grammar::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError(clean(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError(clean(&e)));
        }
        Ok(Constraint {
            start: Mutex::new(matcher),
        })
    }
}

/// llguidance's message without its parser-state dump.
fn clean(msg: &str) -> String {
    msg.lines().next().unwrap_or(msg).trim().to_string()
}

/// A compiled grammar in its start state; every choice starts its own [`ChoiceMatcher`] from it.
pub struct Constraint {
    start: Mutex<Matcher>,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint").finish_non_exhaustive()
    }
}

impl Constraint {
    /// A matcher for one choice, at the grammar's start.
    pub(crate) fn start(&self) -> ChoiceMatcher {
        let m = self.start.lock().unwrap_or_else(|p| p.into_inner());
        ChoiceMatcher(m.deep_clone())
    }
}

/// One choice's position in its grammar.
pub(crate) struct ChoiceMatcher(Matcher);

impl fmt::Debug for ChoiceMatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChoiceMatcher")
            .field("stopped", &self.0.is_stopped())
            .finish_non_exhaustive()
    }
}

/// Why a choice's grammar failed when no token can extend its output.
const DEAD_END: &str = "the grammar allows no token after the output so far";

/// The tokens a choice may sample next.
pub(crate) type Mask = SimpleVob;

impl ChoiceMatcher {
    /// The tokens the grammar allows next (end-of-sequence ids once it is complete).
    pub fn mask(&mut self) -> Result<Mask, String> {
        let mask = self.0.compute_mask().map_err(|e| {
            let e = clean(&e.to_string());
            // llguidance's name for a state that no token extends.
            match e.contains("NoExtensionBias") {
                true => DEAD_END.to_string(),
                false => e,
            }
        })?;
        if mask.is_zero() {
            return Err(DEAD_END.into());
        }
        Ok(mask)
    }

    /// Advances past `token`; `Ok(true)` when the grammar is complete and allows nothing more.
    pub fn consume(&mut self, token: u32) -> Result<bool, String> {
        self.0
            .consume_token(token)
            .map_err(|e| clean(&e.to_string()))?;
        Ok(self.0.is_stopped())
    }
}

/// Sets every logit the mask does not allow to −∞.
pub(crate) fn apply(mask: &Mask, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits >> b & 1 == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}
