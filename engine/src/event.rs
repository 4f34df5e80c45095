//! What a request's stream yields: text deltas per choice, then one finish per choice.

/// One item of a request's event stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The prompt's log-probabilities, once, before any delta (only when the request asked,
    /// `SamplingParams::prompt_logprobs`).
    Prompt(PromptLogprobs),
    Delta(Delta),
    Finish(Finish),
}

/// Each prompt token's log-probability under the tokens before it, from the second token on
/// (the first has nothing before it), with the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobs {
    pub logprobs: Vec<TokenLogprob>,
    /// Per entry of `logprobs`, its token's rank in the vocabulary at its position (1: the
    /// most likely; ties share the better rank), as vLLM reports it.
    pub ranks: Vec<u32>,
}

/// New output of one choice. `text` never ends inside a UTF-8 character and never contains
/// any part of a matched stop string; concatenating a choice's deltas gives its whole text.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// The choice (0..n).
    pub index: usize,
    pub text: String,
    /// The tokens whose text this delta releases (held-back tokens come with later text).
    pub token_ids: Vec<u32>,
    /// Per token of `token_ids`, when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprob>,
}

/// The log-probability of a sampled token under the model (before penalties, bias and
/// temperature), and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// Most likely first; as many as the request asked for.
    pub top: Vec<(u32, f32)>,
}

/// Why a choice ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token, a stop token or a stop string.
    Stop,
    /// `max_tokens` reached (or the model's context).
    Length,
    /// The caller dropped the stream, or the engine shut down before it could finish.
    Abort,
    /// The engine failed on this request; the message says why.
    Error(String),
    /// The output grammar (`SamplingParams::constraint`) failed on this choice: a step over
    /// the grammar's limits, a state that allows no token, or a resumed output it rejects.
    /// The message says why; the choice's blocks are freed as for any finish.
    Grammar(String),
    /// The request's deadline passed; the stage it was in then.
    Deadline(Stage),
}

/// Where a request was when its deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for admission (never scheduled).
    Queue,
    /// Scheduled, no token sampled yet.
    Prefill,
    /// Generating.
    Decode,
}

impl Stage {
    /// `queue`, `prefill` or `decode`: the `stage` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

impl FinishReason {
    /// The `finished_reason` label (and OpenAI's `finish_reason` for the first two).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error(_) => "error",
            Self::Grammar(_) => "grammar",
            Self::Deadline(_) => "deadline",
        }
    }
}

/// Token counts for one choice. The prompt is shared by every choice of a request: add up
/// `completion_tokens` across choices, take the prompt figures once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache instead of being computed.
    pub cached_prompt_tokens: usize,
}

/// The end of one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub index: usize,
    pub reason: FinishReason,
    pub usage: Usage,
    /// The stop string or token that ended it, if one did.
    pub matched_stop: Option<MatchedStop>,
}

/// What matched, for callers that report it (vLLM's `stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchedStop {
    Token(u32),
    Text(String),
}
