//! What a caller submits: prompt tokens and how to sample the continuation.

use std::collections::HashMap;

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
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
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
            max_tokens: None,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            skip_special_tokens: true,
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
        let invalid = |m: String| Err(SubmitError::InvalidRequest(m));
        let p = &self.sampling;
        if self.prompt.is_empty() {
            return invalid("the prompt is empty: at least one token is needed".into());
        }
        if let Some(bad) = self
            .prompt
            .iter()
            .find(|&&t| t as usize >= limits.vocab_size)
        {
            return invalid(format!(
                "prompt token {bad} is outside the vocabulary of {}",
                limits.vocab_size
            ));
        }
        if !(p.temperature.is_finite() && p.temperature >= 0.0) {
            return invalid(format!("temperature {} must be ≥ 0", p.temperature));
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return invalid(format!("top_p {} must be in (0, 1]", p.top_p));
        }
        if !(0.0..=1.0).contains(&p.min_p) {
            return invalid(format!("min_p {} must be in [0, 1]", p.min_p));
        }
        for (name, v) in [
            ("presence_penalty", p.presence_penalty),
            ("frequency_penalty", p.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return invalid(format!("{name} {v} must be in [-2, 2]"));
            }
        }
        if !(p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0) {
            return invalid(format!(
                "repetition_penalty {} must be > 0",
                p.repetition_penalty
            ));
        }
        for (&t, &b) in &p.logit_bias {
            if t as usize >= limits.vocab_size {
                return invalid(format!(
                    "logit_bias token {t} is outside the vocabulary of {}",
                    limits.vocab_size
                ));
            }
            if !(-100.0..=100.0).contains(&b) {
                return invalid(format!(
                    "logit_bias {b} for token {t} must be in [-100, 100]"
                ));
            }
        }
        if p.n == 0 || p.n > limits.max_n {
            return invalid(format!("n {} must be in 1..={}", p.n, limits.max_n));
        }
        if let Some(k) = p.logprobs {
            if k > MAX_TOP_LOGPROBS {
                return invalid(format!(
                    "top_logprobs {k} must be at most {MAX_TOP_LOGPROBS}"
                ));
            }
        }
        if let Some(bad) = p
            .stop_token_ids
            .iter()
            .find(|&&t| t as usize >= limits.vocab_size)
        {
            return invalid(format!("stop token {bad} is outside the vocabulary"));
        }
        if p.stop.iter().any(String::is_empty) {
            return invalid("stop strings must not be empty".into());
        }
        let prompt = self.prompt.len();
        if prompt >= limits.max_model_len {
            return Err(SubmitError::ContextLength {
                max_model_len: limits.max_model_len,
                prompt_tokens: prompt,
                max_tokens: p.max_tokens.unwrap_or(1),
            });
        }
        let max_tokens = match p.max_tokens {
            Some(0) => return invalid("max_tokens must be at least 1".into()),
            Some(m) if prompt + m > limits.max_model_len => {
                return Err(SubmitError::ContextLength {
                    max_model_len: limits.max_model_len,
                    prompt_tokens: prompt,
                    max_tokens: m,
                })
            }
            Some(m) => m,
            None => limits.max_model_len - prompt,
        };
        if p.min_tokens > max_tokens {
            return invalid(format!(
                "min_tokens {} exceeds max_tokens {max_tokens}",
                p.min_tokens
            ));
        }
        Ok(max_tokens)
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
            priority: 0,
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
                max_tokens: 41
            }
        );
        assert!(matches!(
            req(50, SamplingParams::default()).validate(&LIMITS),
            Err(SubmitError::ContextLength { .. })
        ));
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
