//! What a caller submits: prompt tokens and how to sample the continuation.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::constraint::Constraint;

use crate::error::SubmitError;

/// Most `top_logprobs` per token, as OpenAI allows.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generation request, already tokenised.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Higher runs first; equal priorities are served in arrival order.
    pub priority: i32,
    /// When the request must be done. A sequence still running (or waiting) past it is
    /// stopped at the next step, its blocks freed, and finishes with
    /// [`FinishReason::Deadline`](crate::FinishReason::Deadline).
    pub deadline: Option<Instant>,
    /// Continue one choice from output generated before (on a replica that failed), instead
    /// of starting afresh; `sampling.n` must be 1.
    pub resume: Option<Resume>,
}

/// A choice continued from its output so far: the prompt and `output` are prefilled, the
/// output replayed through the sampler, detokeniser and stop matcher without being sent
/// again, and generation goes on from there. With greedy or seeded sampling on batch
/// invariant kernels the continuation is the uninterrupted run's, token for token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    /// The choice's index in the original request: it keys the choice's random stream.
    pub choice: usize,
    /// The output tokens the caller already has.
    pub output: Vec<u32>,
}

/// How each choice of a request is sampled and when it stops.
#[derive(Debug, Clone)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose mass reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` × the most likely one's probability (0 = off).
    pub min_p: f32,
    /// OpenAI's: subtract once from every token already generated.
    pub presence_penalty: f32,
    /// OpenAI's: subtract per occurrence in the generated text.
    pub frequency_penalty: f32,
    /// The CTRL/llama.cpp penalty on tokens of the prompt and output (1 = off): positive
    /// logits are divided by it, negative ones multiplied.
    pub repetition_penalty: f32,
    /// Added to the logit of each listed token.
    pub logit_bias: HashMap<u32, f32>,
    /// Makes sampling reproducible: the same seed and request give the same tokens whatever
    /// else runs in the batch.
    pub seed: Option<u64>,
    /// Choices to generate from one prompt.
    pub n: usize,
    /// Return the chosen token's log-probability and this many alternatives (`Some(0)`: the
    /// chosen token's only).
    pub logprobs: Option<usize>,
    /// The prompt's tokens' log-probabilities, each with this many alternatives, sent once
    /// before any output ([`crate::Event::Prompt`]; vLLM's `prompt_logprobs`, completions'
    /// `echo` with `logprobs`). The prompt is computed whole: the prefix cache skips none of
    /// it, and a step feeds at most `PROMPT_LOGPROB_ROWS` (256) such prompt tokens across
    /// requests (each a whole row of logits).
    pub prompt_logprobs: Option<usize>,
    /// Completion tokens at most; `None`: whatever the context leaves.
    pub max_tokens: Option<usize>,
    /// End-of-sequence and stop tokens are suppressed until this many tokens exist.
    pub min_tokens: usize,
    /// Keep generating past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Token ids that end the choice (not emitted).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end the choice; the text is cut before the match.
    pub stop: Vec<String>,
    /// Token sequences the output never ends with (vLLM's `bad_words`, tokenised): a
    /// sequence's last token is held back whenever the output ends with the rest of it (a
    /// one-token sequence always). Each is non-empty.
    pub bad_words: Vec<Vec<u32>>,
    /// Only these ids may be sampled (vLLM's `allowed_token_ids`; sorted, no duplicates, not
    /// empty): every other id of the row is held back, end-of-sequence ids included unless
    /// listed. The row is read on the host.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Keep the stop string that ended the choice at the end of its text (vLLM's
    /// `include_stop_str_in_output`).
    pub include_stop_str: bool,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// A grammar every choice's output must match (compiled with
    /// [`EngineHandle::compile`](crate::EngineHandle::compile)); each choice runs its own
    /// matcher, and the grammar's mask applies before temperature, top-k, top-p and min-p.
    pub constraint: Option<Arc<Constraint>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: HashMap::new(),
            seed: None,
            n: 1,
            logprobs: None,
            prompt_logprobs: None,
            max_tokens: None,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            bad_words: Vec::new(),
            allowed_token_ids: None,
            include_stop_str: false,
            skip_special_tokens: true,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            ..Self::default()
        }
    }

    /// Greedy: no randomness at all, whatever the other fields say.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Most choices per request.
pub const MAX_N: usize = 16;
/// Most stop strings per request.
pub const MAX_STOP: usize = 8;

/// Most token sequences `bad_words` may hold (each word is tokenised as it starts a text and
/// after a space: two per word).
pub const MAX_BAD_WORDS: usize = 256;

/// A request field the engine checks, named in [`Invalid`] so that a caller can report it under
/// its own API's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    Prompt,
    Temperature,
    TopP,
    MinP,
    PresencePenalty,
    FrequencyPenalty,
    RepetitionPenalty,
    LogitBias,
    N,
    /// `SamplingParams::logprobs`: the alternatives returned per token.
    Logprobs,
    /// `SamplingParams::prompt_logprobs`.
    PromptLogprobs,
    BadWords,
    AllowedTokenIds,
    MaxTokens,
    MinTokens,
    Stop,
    StopTokenIds,
}

impl Field {
    /// The name used in the engine's messages (OpenAI's chat names).
    pub fn name(self) -> &'static str {
        match self {
            Self::Prompt => "prompt",
            Self::Temperature => "temperature",
            Self::TopP => "top_p",
            Self::MinP => "min_p",
            Self::PresencePenalty => "presence_penalty",
            Self::FrequencyPenalty => "frequency_penalty",
            Self::RepetitionPenalty => "repetition_penalty",
            Self::LogitBias => "logit_bias",
            Self::N => "n",
            Self::Logprobs => "top_logprobs",
            Self::PromptLogprobs => "prompt_logprobs",
            Self::BadWords => "bad_words",
            Self::AllowedTokenIds => "allowed_token_ids",
            Self::MaxTokens => "max_tokens",
            Self::MinTokens => "min_tokens",
            Self::Stop => "stop",
            Self::StopTokenIds => "stop_token_ids",
        }
    }
}

/// A field out of its range: the field, the offending value (empty when the field as a whole
/// is at fault) and the rule it breaks, e.g. `temperature 2.5 must be in [0, 2]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    field: Field,
    value: String,
    rule: String,
    message: String,
}

impl Invalid {
    fn new(field: Field, value: impl ToString, rule: impl Into<String>) -> Self {
        let (value, rule) = (value.to_string(), rule.into());
        let message = match value.as_str() {
            "" => format!("{} {rule}", field.name()),
            v => format!("{} {v} {rule}", field.name()),
        };
        Self {
            field,
            value,
            rule,
            message,
        }
    }

    pub fn field(&self) -> Field {
        self.field
    }

    /// The offending value as written in the message; empty when the field as a whole is at
    /// fault (an empty stop string, an empty prompt).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// What the value breaks, e.g. `must be in [0, 2]`.
    pub fn rule(&self) -> &str {
        &self.rule
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Invalid {}

/// Reads as its message.
impl std::ops::Deref for Invalid {
    type Target = str;

    fn deref(&self) -> &str {
        &self.message
    }
}

/// `x` within `lo..=hi` (`lo` excluded when `lo_open`), finite.
fn in_range(field: Field, x: f32, lo: f32, hi: f32, lo_open: bool) -> Result<(), Invalid> {
    let above = if lo_open { x > lo } else { x >= lo };
    if x.is_finite() && above && x <= hi {
        return Ok(());
    }
    let l = if lo_open { "(" } else { "[" };
    Err(Invalid::new(field, x, format!("must be in {l}{lo}, {hi}]")))
}

/// A token id within the vocabulary, when it is known.
fn in_vocab(field: Field, id: u32, vocab: Option<usize>) -> Result<(), Invalid> {
    match vocab {
        Some(n) if id as usize >= n => Err(Invalid::new(
            field,
            format!("token {id}"),
            format!("is outside the vocabulary of {n}"),
        )),
        _ => Ok(()),
    }
}

impl SamplingParams {
    /// Checks every sampling field against its range: OpenAI's ranges where OpenAI has the
    /// field, vLLM's otherwise. Token ids are checked against `vocab` when it is known (a
    /// routing gateway does not know a remote model's vocabulary).
    pub fn check(&self, vocab: Option<usize>) -> Result<(), Invalid> {
        in_range(Field::Temperature, self.temperature, 0.0, 2.0, false)?;
        in_range(Field::TopP, self.top_p, 0.0, 1.0, true)?;
        in_range(Field::MinP, self.min_p, 0.0, 1.0, false)?;
        in_range(
            Field::PresencePenalty,
            self.presence_penalty,
            -2.0,
            2.0,
            false,
        )?;
        in_range(
            Field::FrequencyPenalty,
            self.frequency_penalty,
            -2.0,
            2.0,
            false,
        )?;
        in_range(
            Field::RepetitionPenalty,
            self.repetition_penalty,
            0.0,
            10.0,
            true,
        )?;
        self.check_counts()?;
        self.check_stops(vocab)?;
        self.check_logit_bias(vocab)
    }

    fn check_counts(&self) -> Result<(), Invalid> {
        if !(1..=MAX_N).contains(&self.n) {
            return Err(Invalid::new(
                Field::N,
                self.n,
                format!("must be in 1..={MAX_N}"),
            ));
        }
        for (field, asked) in [
            (Field::Logprobs, self.logprobs),
            (Field::PromptLogprobs, self.prompt_logprobs),
        ] {
            if let Some(k) = asked.filter(|&k| k > MAX_TOP_LOGPROBS) {
                let rule = format!("must be at most {MAX_TOP_LOGPROBS}");
                return Err(Invalid::new(field, k, rule));
            }
        }
        match self.max_tokens {
            Some(0) => Err(Invalid::new(Field::MaxTokens, 0, "must be at least 1")),
            Some(m) if self.min_tokens > m => Err(Invalid::new(
                Field::MinTokens,
                self.min_tokens,
                format!("exceeds max_tokens {m}"),
            )),
            _ => Ok(()),
        }
    }

    fn check_stops(&self, vocab: Option<usize>) -> Result<(), Invalid> {
        if self.stop.len() > MAX_STOP {
            let n = self.stop.len();
            let rule = format!("has {n} strings: at most {MAX_STOP} are allowed");
            return Err(Invalid::new(Field::Stop, "", rule));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(Invalid::new(Field::Stop, "", "strings must not be empty"));
        }
        for &t in &self.stop_token_ids {
            in_vocab(Field::StopTokenIds, t, vocab)?;
        }
        if self.bad_words.len() > MAX_BAD_WORDS {
            let n = self.bad_words.len();
            let rule = format!("has {n} token sequences: at most {MAX_BAD_WORDS} are allowed");
            return Err(Invalid::new(Field::BadWords, "", rule));
        }
        if self.bad_words.iter().any(Vec::is_empty) {
            return Err(Invalid::new(
                Field::BadWords,
                "",
                "must not hold an empty word",
            ));
        }
        for &t in self.bad_words.iter().flatten() {
            in_vocab(Field::BadWords, t, vocab)?;
        }
        if let Some(allowed) = &self.allowed_token_ids {
            if allowed.is_empty() {
                return Err(Invalid::new(
                    Field::AllowedTokenIds,
                    "",
                    "must not be empty",
                ));
            }
            if !allowed.windows(2).all(|w| w[0] < w[1]) {
                let rule = "must be sorted without duplicates";
                return Err(Invalid::new(Field::AllowedTokenIds, "", rule));
            }
            for &t in allowed {
                in_vocab(Field::AllowedTokenIds, t, vocab)?;
            }
        }
        Ok(())
    }

    fn check_logit_bias(&self, vocab: Option<usize>) -> Result<(), Invalid> {
        for (&t, &b) in &self.logit_bias {
            in_vocab(Field::LogitBias, t, vocab)?;
            if !(-100.0..=100.0).contains(&b) {
                let rule = format!("must be in [-100, 100] (token {t})");
                return Err(Invalid::new(Field::LogitBias, b, rule));
            }
        }
        Ok(())
    }

    /// The context-length rule: the completion tokens a prompt of `prompt_tokens` may have
    /// (`max_tokens`, or whatever the context leaves), or why it does not fit.
    pub fn budget(&self, prompt_tokens: usize, max_model_len: usize) -> Result<usize, SubmitError> {
        let overflow = |max_tokens| SubmitError::ContextLength {
            max_model_len,
            prompt_tokens,
            max_tokens,
        };
        if prompt_tokens >= max_model_len {
            return Err(overflow(self.max_tokens));
        }
        match self.max_tokens {
            Some(m) if prompt_tokens + m > max_model_len => Err(overflow(Some(m))),
            Some(m) => Ok(m),
            None => Ok(max_model_len - prompt_tokens),
        }
    }
}

/// Limits a request is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub vocab_size: usize,
    pub max_model_len: usize,
    pub max_n: usize,
}

impl Request {
    /// Checks the request and returns its completion budget.
    pub(crate) fn validate(&self, limits: &Limits) -> Result<usize, SubmitError> {
        let vocab = limits.vocab_size;
        if self.prompt.is_empty() {
            let rule = "is empty: at least one token is needed";
            return Err(Invalid::new(Field::Prompt, "", rule).into());
        }
        if let Some(&bad) = self.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(in_vocab(Field::Prompt, bad, Some(vocab))
                .unwrap_err()
                .into());
        }
        self.sampling.check(Some(vocab))?;
        let n = self.sampling.n;
        if n > limits.max_n {
            let rule = format!("must be in 1..={}", limits.max_n);
            return Err(Invalid::new(Field::N, n, rule).into());
        }
        let budget = self
            .sampling
            .budget(self.prompt.len(), limits.max_model_len)?;
        if self.sampling.min_tokens > budget {
            let rule = format!("exceeds max_tokens {budget}");
            return Err(Invalid::new(Field::MinTokens, self.sampling.min_tokens, rule).into());
        }
        if let Some(r) = &self.resume {
            r.check(n, budget, vocab)?;
        }
        Ok(budget)
    }
}

impl Resume {
    /// A resumed choice is one choice, its output within the vocabulary and the completion
    /// budget (an output at its budget finishes at once: its finish was lost on the way).
    fn check(&self, n: usize, budget: usize, vocab: usize) -> Result<(), Invalid> {
        if n != 1 {
            return Err(Invalid::new(Field::N, n, "must be 1 to resume a choice"));
        }
        if let Some(&bad) = self.output.iter().find(|&&t| t as usize >= vocab) {
            return Err(in_vocab(Field::Prompt, bad, Some(vocab)).unwrap_err());
        }
        if self.output.len() > budget {
            let rule = format!(
                "leaves no room for the resumed output of {}",
                self.output.len()
            );
            return Err(Invalid::new(Field::MaxTokens, budget, rule));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        vocab_size: 100,
        max_model_len: 50,
        max_n: 4,
    };

    fn req(prompt: usize, sampling: SamplingParams) -> Request {
        Request {
            prompt: vec![1; prompt],
            sampling,
            ..Request::default()
        }
    }

    #[test]
    fn budget_defaults_to_what_the_context_leaves() {
        let r = req(10, SamplingParams::default());
        assert_eq!(r.validate(&LIMITS), Ok(40));
        assert_eq!(
            req(10, SamplingParams::greedy(40)).validate(&LIMITS),
            Ok(40)
        );
    }

    #[test]
    fn context_overflow_is_its_own_error() {
        let e = req(10, SamplingParams::greedy(41))
            .validate(&LIMITS)
            .unwrap_err();
        assert_eq!(
            e,
            SubmitError::ContextLength {
                max_model_len: 50,
                prompt_tokens: 10,
                max_tokens: Some(41)
            }
        );
        assert!(e
            .to_string()
            .ends_with("10 prompt tokens plus 41 completion tokens"));
        assert!(matches!(
            req(50, SamplingParams::default()).validate(&LIMITS),
            Err(SubmitError::ContextLength { .. })
        ));
    }

    #[test]
    fn the_failing_field_is_reported_and_ranges_are_openai_s() {
        let cases: Vec<(SamplingParams, Field)> = vec![
            (
                SamplingParams {
                    temperature: 2.5,
                    ..Default::default()
                },
                Field::Temperature,
            ),
            (
                SamplingParams {
                    repetition_penalty: 10.5,
                    ..Default::default()
                },
                Field::RepetitionPenalty,
            ),
            (
                SamplingParams {
                    frequency_penalty: f32::NAN,
                    ..Default::default()
                },
                Field::FrequencyPenalty,
            ),
            (
                SamplingParams {
                    n: MAX_N + 1,
                    ..Default::default()
                },
                Field::N,
            ),
            (
                SamplingParams {
                    stop: vec!["x".into(); MAX_STOP + 1],
                    ..Default::default()
                },
                Field::Stop,
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![100],
                    ..Default::default()
                },
                Field::StopTokenIds,
            ),
        ];
        for (params, field) in cases {
            let e = params.check(Some(100)).unwrap_err();
            assert_eq!(e.field(), field, "{e}");
            assert!(e.starts_with(field.name()), "{e}");
        }
        let e = SamplingParams {
            temperature: 2.5,
            ..Default::default()
        }
        .check(None)
        .unwrap_err();
        assert_eq!((e.value(), e.rule()), ("2.5", "must be in [0, 2]"));
        // A rule reads on from the value, or from the field when the field as a whole is at
        // fault: "stop has 9 strings: ...", "logit_bias 1000 must be in ... (token 1)".
        let e = SamplingParams {
            stop: vec!["x".into(); MAX_STOP + 1],
            ..Default::default()
        }
        .check(None)
        .unwrap_err();
        let rule = format!(
            "has {} strings: at most {MAX_STOP} are allowed",
            MAX_STOP + 1
        );
        assert_eq!((e.value(), e.rule()), ("", rule.as_str()));
        let e = SamplingParams {
            logit_bias: [(1, 1000.0)].into_iter().collect(),
            ..Default::default()
        }
        .check(None)
        .unwrap_err();
        assert_eq!(
            (e.value(), e.rule()),
            ("1000", "must be in [-100, 100] (token 1)")
        );
        // The vocabulary is checked only when known.
        let ids = SamplingParams {
            stop_token_ids: vec![100],
            logit_bias: HashMap::from([(100, 1.0)]),
            ..Default::default()
        };
        assert!(ids.check(None).is_ok());
        assert!(SamplingParams::default().check(Some(100)).is_ok());
        match req(3, SamplingParams::greedy(0)).validate(&LIMITS) {
            Err(SubmitError::InvalidRequest(e)) => assert_eq!(e.field(), Field::MaxTokens),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_budget_is_the_context_length_rule() {
        let p = SamplingParams::default();
        assert_eq!(p.budget(10, 50), Ok(40));
        assert_eq!(SamplingParams::greedy(40).budget(10, 50), Ok(40));
        assert!(matches!(
            SamplingParams::greedy(41).budget(10, 50),
            Err(SubmitError::ContextLength {
                max_tokens: Some(41),
                ..
            })
        ));
        let full = p.budget(50, 50).unwrap_err();
        assert!(matches!(
            full,
            SubmitError::ContextLength {
                max_tokens: None,
                ..
            }
        ));
        assert!(
            full.to_string()
                .ends_with("50 prompt tokens, which leave no room for a completion"),
            "{full}"
        );
    }

    #[test]
    fn out_of_range_parameters_are_named() {
        let cases: Vec<(SamplingParams, &str)> = vec![
            (
                SamplingParams {
                    temperature: -1.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    min_p: 1.5,
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    presence_penalty: 3.0,
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..Default::default()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    n: 5,
                    ..Default::default()
                },
                "n 5",
            ),
            (
                SamplingParams {
                    logprobs: Some(21),
                    ..Default::default()
                },
                "top_logprobs",
            ),
            (
                SamplingParams {
                    stop: vec![String::new()],
                    ..Default::default()
                },
                "stop",
            ),
            (
                SamplingParams {
                    max_tokens: Some(0),
                    ..Default::default()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    min_tokens: 9,
                    max_tokens: Some(8),
                    ..Default::default()
                },
                "min_tokens",
            ),
            (
                SamplingParams {
                    logit_bias: HashMap::from([(100, 1.0)]),
                    ..Default::default()
                },
                "logit_bias",
            ),
        ];
        for (params, needle) in cases {
            match req(3, params).validate(&LIMITS) {
                Err(SubmitError::InvalidRequest(m)) => assert!(m.contains(needle), "{m}"),
                other => panic!("{needle}: {other:?}"),
            }
        }
        let mut bad_token = req(3, SamplingParams::default());
        bad_token.prompt[1] = 100;
        assert!(matches!(
            bad_token.validate(&LIMITS),
            Err(SubmitError::InvalidRequest(_))
        ));
        assert!(matches!(
            req(0, SamplingParams::default()).validate(&LIMITS),
            Err(SubmitError::InvalidRequest(_))
        ));
    }
}
