//! From parsed OpenAI requests to engine requests: every range check, every unsupported
//! field, message rendering and tokenisation. Errors name the field (`param`) and the range.

use serde_json::Value;
use sluice_engine::{SamplingParams, MAX_TOP_LOGPROBS};
use sluice_models::chat_template::ChatMessage;
use sluice_models::Model;

use crate::api::types::{
    ChatCompletionRequest, ChatMessageIn, CompletionRequest, MessageContent, PromptSpec,
    SamplingFields, StopSpec,
};
use crate::error::ApiError;

/// Most stop strings per request.
pub const MAX_STOP: usize = 8;
/// Most choices per request.
pub const MAX_N: i64 = 16;
/// Completions' default `max_tokens`, as OpenAI's.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// A request ready for the engine.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// One prompt per engine request (completions may send several).
    pub prompts: Vec<Vec<u32>>,
    pub sampling: SamplingParams,
    pub priority: i32,
    pub stream: bool,
    pub include_usage: bool,
}

fn range_f(v: Option<f64>, name: &str, lo: f64, hi: f64, lo_open: bool) -> Result<(), ApiError> {
    if let Some(x) = v {
        let ok = x.is_finite() && (if lo_open { x > lo } else { x >= lo }) && x <= hi;
        if !ok {
            let l = if lo_open { "(" } else { "[" };
            return Err(ApiError::bad(
                format!("{x} is not a valid value for '{name}': it must be in {l}{lo}, {hi}]"),
                name,
            ));
        }
    }
    Ok(())
}

/// A token id, checked against the vocabulary when the gateway knows it (a remote model's
/// vocabulary is the replica's to check).
fn vocab_id(v: i64, vocab: Option<usize>, name: &str) -> Result<u32, ApiError> {
    let limit = vocab.map_or(u32::MAX as u64 + 1, |n| n as u64);
    if v < 0 || v as u64 >= limit {
        let range = vocab.map_or_else(|| "a u32".to_string(), |n| format!("0..{n}"));
        return Err(ApiError::bad(
            format!("token id {v} in '{name}' is outside the vocabulary ({range})"),
            name,
        ));
    }
    Ok(v as u32)
}

/// Sampling parameters from the shared fields.
fn sampling(
    f: &SamplingFields,
    vocab: Option<usize>,
    max_tokens: Option<i64>,
) -> Result<SamplingParams, ApiError> {
    range_f(f.temperature, "temperature", 0.0, 2.0, false)?;
    range_f(f.top_p, "top_p", 0.0, 1.0, true)?;
    range_f(f.min_p, "min_p", 0.0, 1.0, false)?;
    range_f(f.presence_penalty, "presence_penalty", -2.0, 2.0, false)?;
    range_f(f.frequency_penalty, "frequency_penalty", -2.0, 2.0, false)?;
    range_f(f.repetition_penalty, "repetition_penalty", 0.0, 10.0, true)?;
    let top_k = match f.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k.min(vocab.map_or(i64::MAX, |v| v as i64)) as usize,
        Some(k) => {
            return Err(ApiError::bad(
                format!(
                    "{k} is not a valid value for 'top_k': use -1 or 0 (off) or a positive count"
                ),
                "top_k",
            ))
        }
    };
    let n = f.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad(
            format!("{n} is not a valid value for 'n': it must be in 1..={MAX_N}"),
            "n",
        ));
    }
    let max_tokens = match max_tokens {
        None => None,
        Some(m) if m >= 1 => Some(m as usize),
        Some(m) => {
            return Err(ApiError::bad(
                format!("{m} is not a valid value for 'max_tokens': it must be at least 1"),
                "max_tokens",
            ))
        }
    };
    let min_tokens = match f.min_tokens {
        None => 0,
        Some(m) if m >= 0 => m as usize,
        Some(m) => {
            return Err(ApiError::bad(
                format!("{m} is not a valid value for 'min_tokens': it must be ≥ 0"),
                "min_tokens",
            ))
        }
    };
    if let Some(m) = max_tokens {
        if min_tokens > m {
            return Err(ApiError::bad(
                format!("min_tokens ({min_tokens}) must not exceed max_tokens ({m})"),
                "min_tokens",
            ));
        }
    }
    let stop = match &f.stop {
        None => Vec::new(),
        Some(StopSpec::One(s)) => vec![s.clone()],
        Some(StopSpec::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOP {
        return Err(ApiError::bad(
            format!(
                "'stop' has {} strings; at most {MAX_STOP} are allowed",
                stop.len()
            ),
            "stop",
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("'stop' strings must not be empty", "stop"));
    }
    let mut logit_bias = std::collections::HashMap::new();
    for (k, &b) in f.logit_bias.iter().flatten() {
        let id: i64 = k.trim().parse().map_err(|_| {
            ApiError::bad(
                format!("'logit_bias' key '{k}' is not a token id"),
                "logit_bias",
            )
        })?;
        let id = vocab_id(id, vocab, "logit_bias")?;
        if !(-100.0..=100.0).contains(&b) {
            return Err(ApiError::bad(
                format!("'logit_bias' value {b} for token {id} must be in [-100, 100]"),
                "logit_bias",
            ));
        }
        logit_bias.insert(id, b as f32);
    }
    let stop_token_ids = f
        .stop_token_ids
        .iter()
        .flatten()
        .map(|&t| vocab_id(t, vocab, "stop_token_ids"))
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(SamplingParams {
        temperature: f.temperature.unwrap_or(1.0) as f32,
        top_p: f.top_p.unwrap_or(1.0) as f32,
        top_k,
        min_p: f.min_p.unwrap_or(0.0) as f32,
        presence_penalty: f.presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0) as f32,
        repetition_penalty: f.repetition_penalty.unwrap_or(1.0) as f32,
        logit_bias,
        // OpenAI's seed is a signed 64-bit integer; every value names one stream.
        seed: f.seed.map(|s| s as u64),
        n: n as usize,
        logprobs: None,
        max_tokens,
        min_tokens,
        ignore_eos: f.ignore_eos.unwrap_or(false),
        stop_token_ids,
        stop,
        skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
    })
}

/// A request whose every field is checked, before tokenisation.
#[derive(Debug, Clone)]
pub struct Checked {
    pub sampling: SamplingParams,
    pub priority: i32,
    pub stream: bool,
    pub include_usage: bool,
}

impl Checked {
    fn with_prompts(self, prompts: Vec<Vec<u32>>) -> Prepared {
        Prepared {
            prompts,
            sampling: self.sampling,
            priority: self.priority,
            stream: self.stream,
            include_usage: self.include_usage,
        }
    }
}

/// The request's streaming and priority fields around its sampling.
fn checked(f: &SamplingFields, sampling: SamplingParams) -> Result<Checked, ApiError> {
    Ok(Checked {
        priority: priority(f)?,
        stream: f.stream.unwrap_or(false),
        include_usage: f
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        sampling,
    })
}

fn priority(f: &SamplingFields) -> Result<i32, ApiError> {
    match f.priority {
        None => Ok(0),
        Some(p) => i32::try_from(p)
            .map_err(|_| ApiError::bad(format!("'priority' {p} is out of range"), "priority")),
    }
}

fn present(v: &Option<Value>) -> bool {
    !matches!(v, None | Some(Value::Null))
}

fn unsupported(field: &str, what: &str) -> ApiError {
    ApiError::BadRequest {
        message: format!("'{field}' is not supported by this server: {what}"),
        param: Some(field.to_string()),
        code: Some("unsupported_parameter"),
    }
}

/// The messages in the template's form.
pub fn chat_messages(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad(
            "'messages' must contain at least one message",
            "messages",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" => m.role.clone(),
                // OpenAI's newer name for system instructions.
                "developer" => "system".to_string(),
                "tool" | "function" => {
                    return Err(unsupported(
                        &format!("messages[{i}].role"),
                        "tool and function messages need tool calling, which is not available",
                    ))
                }
                other => {
                    return Err(ApiError::bad(
                        format!("'{other}' is not a valid role for messages[{i}]: use system, developer, user or assistant"),
                        format!("messages[{i}].role"),
                    ))
                }
            };
            if present(&m.tool_calls) {
                return Err(unsupported(&format!("messages[{i}].tool_calls"), "no tool calling"));
            }
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        if p.kind != "text" {
                            return Err(unsupported(
                                &format!("messages[{i}].content[{j}].type"),
                                &format!("'{}' parts are not accepted; this model reads text only", p.kind),
                            ));
                        }
                        text.push_str(p.text.as_deref().unwrap_or(""));
                    }
                    text
                }
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// Renders and tokenises chat messages with the model's template.
pub fn chat_prompt(
    model: &Model,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
    let template = model.chat_template().ok_or_else(|| {
        ApiError::bad(
            "this model has no chat template: use /v1/completions",
            "messages",
        )
    })?;
    let rendered = template
        .render(messages, add_generation_prompt)
        .map_err(|e| {
            ApiError::bad(
                format!("the chat template rejected the messages: {e}"),
                "messages",
            )
        })?;
    model.tokenizer().encode(&rendered, true).map_err(|e| {
        tracing::error!("tokenising a rendered chat: {e}");
        ApiError::Internal
    })
}

pub fn chat(req: &ChatCompletionRequest, model: &Model) -> Result<Prepared, ApiError> {
    let (checked, messages) = chat_checked(req, Some(model.config().vocab_size))?;
    let prompt = chat_prompt(model, &messages, true)?;
    Ok(checked.with_prompts(vec![prompt]))
}

/// Every check of a chat request that needs no tokenizer, and its messages in the template's
/// form. A routing gateway runs this for remote models, then proxies the body as it came.
pub fn chat_checked(
    req: &ChatCompletionRequest,
    vocab: Option<usize>,
) -> Result<(Checked, Vec<ChatMessage>), ApiError> {
    // An empty tool list is what some clients always send: nothing to refuse.
    let empty_tools = matches!(&req.tools, Some(Value::Array(a)) if a.is_empty());
    if present(&req.tools) && !empty_tools {
        return Err(unsupported("tools", "this server does not do tool calling"));
    }
    if let Some(tc) = &req.tool_choice {
        if !matches!(tc, Value::Null) && tc.as_str() != Some("none") {
            return Err(unsupported(
                "tool_choice",
                "this server does not do tool calling",
            ));
        }
    }
    for (field, v) in [
        ("functions", &req.functions),
        ("function_call", &req.function_call),
        ("audio", &req.audio),
        ("prediction", &req.prediction),
        ("web_search_options", &req.web_search_options),
    ] {
        if present(v) {
            return Err(unsupported(field, "not implemented"));
        }
    }
    if let Some(rf) = &req.response_format {
        let kind = rf.get("type").and_then(Value::as_str);
        if !matches!(rf, Value::Null) && kind != Some("text") {
            return Err(unsupported(
                "response_format",
                "only {\"type\": \"text\"} is available (no JSON mode or schemas)",
            ));
        }
    }
    let f = req.sampling_fields();
    let max = req.max_completion_tokens.or(f.max_tokens);
    let mut sampling = sampling(&f, vocab, max)?;
    match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(k)) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
            return Err(ApiError::bad(
                format!(
                "{k} is not a valid value for 'top_logprobs': it must be in 0..={MAX_TOP_LOGPROBS}"
            ),
                "top_logprobs",
            ))
        }
        (false, Some(_)) => {
            return Err(ApiError::bad(
                "'top_logprobs' needs 'logprobs' set to true",
                "top_logprobs",
            ))
        }
        (true, k) => sampling.logprobs = Some(k.unwrap_or(0) as usize),
        (false, None) => {}
    }
    let messages = chat_messages(&req.messages)?;
    Ok((checked(&f, sampling)?, messages))
}

pub fn completion(req: &CompletionRequest, model: &Model) -> Result<Prepared, ApiError> {
    let vocab = model.config().vocab_size;
    let checked = completion_checked(req, Some(vocab))?;
    let tok = model.tokenizer();
    let encode = |text: &str| -> Result<Vec<u32>, ApiError> {
        // Prompts are plain text: control tokens in them are not parsed as such.
        let mut ids = Vec::new();
        if tok.add_bos() {
            ids.extend(tok.bos_id());
        }
        ids.extend(tok.encode(text, false).map_err(|e| {
            tracing::error!("tokenising a prompt: {e}");
            ApiError::Internal
        })?);
        Ok(ids)
    };
    let ids = |v: &[i64]| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|&t| vocab_id(t, Some(vocab), "prompt"))
            .collect()
    };
    let prompts = match &req.prompt {
        PromptSpec::Text(t) => vec![encode(t)?],
        PromptSpec::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        PromptSpec::Tokens(t) => vec![ids(t)?],
        PromptSpec::TokenLists(ls) => ls.iter().map(|l| ids(l)).collect::<Result<_, _>>()?,
    };
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::bad("'prompt' must not be empty", "prompt"));
    }
    Ok(checked.with_prompts(prompts))
}

/// Every check of a completion request that needs no tokenizer: its fields, and the prompt's
/// shape (not empty, not too many, token ids in the vocabulary when it is known).
pub fn completion_checked(
    req: &CompletionRequest,
    vocab: Option<usize>,
) -> Result<Checked, ApiError> {
    if present(&req.suffix) {
        return Err(unsupported("suffix", "no fill-in-the-middle"));
    }
    if req.echo.unwrap_or(false) {
        return Err(unsupported("echo", "the prompt is not returned"));
    }
    let f = req.sampling_fields();
    if let Some(b) = req.best_of {
        if b != f.n.unwrap_or(1) {
            return Err(unsupported(
                "best_of",
                "only best_of equal to n (every choice returned)",
            ));
        }
    }
    let max = Some(
        f.max_tokens
            .unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS as i64),
    );
    let mut sampling = sampling(&f, vocab, max)?;
    if let Some(k) = req.logprobs {
        if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) {
            return Err(ApiError::bad(
                format!(
                    "{k} is not a valid value for 'logprobs': it must be in 0..={MAX_TOP_LOGPROBS}"
                ),
                "logprobs",
            ));
        }
        sampling.logprobs = Some(k as usize);
    }
    let (count, empty) = match &req.prompt {
        // Whether a text prompt is empty depends on the tokenizer (a BOS token may be added):
        // the local path checks the ids, a replica checks its own.
        PromptSpec::Text(_) => (1, false),
        PromptSpec::Texts(ts) => (ts.len(), false),
        PromptSpec::Tokens(t) => {
            for &id in t {
                vocab_id(id, vocab, "prompt")?;
            }
            (1, t.is_empty())
        }
        PromptSpec::TokenLists(ls) => {
            for &id in ls.iter().flatten() {
                vocab_id(id, vocab, "prompt")?;
            }
            (ls.len(), ls.iter().any(Vec::is_empty))
        }
    };
    if count == 0 {
        return Err(ApiError::bad(
            "'prompt' must not be an empty list",
            "prompt",
        ));
    }
    if empty {
        return Err(ApiError::bad("'prompt' must not be empty", "prompt"));
    }
    if count * sampling.n > MAX_N as usize * 4 {
        return Err(ApiError::bad(
            format!(
                "{} prompts × n {} is more choices than one request may ask for",
                count, sampling.n
            ),
            "prompt",
        ));
    }
    checked(&f, sampling)
}
