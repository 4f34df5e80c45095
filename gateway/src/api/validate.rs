//! From parsed OpenAI requests to engine requests: JSON values to engine types, unsupported
//! fields refused by name, message rendering and tokenisation. The ranges of the sampling
//! fields are the engine's (`SamplingParams::check`); its errors name the engine's field, which
//! [`Params`] turns into the OpenAI parameter.

use serde_json::Value;
use sluice_engine::{SamplingParams, MAX_N};
use sluice_models::chat_template::{encode_chat, ChatEnd, ChatMessage, ChatTemplate};
use sluice_models::tokenizer::Tokenizer;
use sluice_models::{Model, ModelError};

use crate::api::guided::{self, AnswerFormat};
use crate::api::tools::{self, Output, ToolSet};
use crate::api::types::{
    ChatCompletionRequest, ChatMessageIn, CompletionRequest, MessageContent, PromptSpec,
    SamplingFields, StopSpec,
};
use crate::error::{ApiError, Params};

/// Completions' default `max_tokens`, as OpenAI's.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// The OpenAI names of chat's endpoint-specific fields.
pub const CHAT_PARAMS: Params = Params {
    prompt: "messages",
    logprobs: "top_logprobs",
};
/// The OpenAI names of completions' endpoint-specific fields.
pub const COMPLETION_PARAMS: Params = Params {
    prompt: "prompt",
    logprobs: "logprobs",
};

/// A count sent as a JSON integer; how large it may be is the engine's rule.
fn count(v: i64, name: &str) -> Result<usize, ApiError> {
    usize::try_from(v).map_err(|_| {
        ApiError::bad(
            format!("{v} is not a valid value for '{name}': it must not be negative"),
            name,
        )
    })
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

/// vLLM's `top_k`: -1 or 0 is off, a positive count keeps that many (at most the vocabulary).
fn top_k(k: Option<i64>, vocab: Option<usize>) -> Result<usize, ApiError> {
    match k {
        None | Some(-1) | Some(0) => Ok(0),
        Some(k) if k > 0 => Ok(k.min(vocab.map_or(i64::MAX, |v| v as i64)) as usize),
        Some(k) => Err(ApiError::bad(
            format!("{k} is not a valid value for 'top_k': use -1 or 0 (off) or a positive count"),
            "top_k",
        )),
    }
}

/// `logit_bias`: token ids as strings (as OpenAI sends them) to biases.
fn logit_bias(f: &SamplingFields) -> Result<std::collections::HashMap<u32, f32>, ApiError> {
    f.logit_bias
        .iter()
        .flatten()
        .map(|(k, &b)| {
            let id: i64 = k.trim().parse().map_err(|_| {
                ApiError::bad(
                    format!("'logit_bias' key '{k}' is not a token id"),
                    "logit_bias",
                )
            })?;
            Ok((vocab_id(id, None, "logit_bias")?, b as f32))
        })
        .collect()
}

/// Sampling parameters from the shared fields, converted but not yet range-checked: the
/// endpoint adds its log-probability field, then [`checked`] runs the engine's checks.
fn sampling(
    f: &SamplingFields,
    vocab: Option<usize>,
    max_tokens: Option<i64>,
) -> Result<SamplingParams, ApiError> {
    let stop = match &f.stop {
        None => Vec::new(),
        Some(StopSpec::One(s)) => vec![s.clone()],
        Some(StopSpec::Many(v)) => v.clone(),
    };
    let stop_token_ids = f
        .stop_token_ids
        .iter()
        .flatten()
        .map(|&t| vocab_id(t, None, "stop_token_ids"))
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(SamplingParams {
        temperature: f.temperature.unwrap_or(1.0) as f32,
        top_p: f.top_p.unwrap_or(1.0) as f32,
        top_k: top_k(f.top_k, vocab)?,
        min_p: f.min_p.unwrap_or(0.0) as f32,
        presence_penalty: f.presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0) as f32,
        repetition_penalty: f.repetition_penalty.unwrap_or(1.0) as f32,
        logit_bias: logit_bias(f)?,
        // OpenAI's seed is a signed 64-bit integer; every value names one stream.
        seed: f.seed.map(|s| s as u64),
        n: count(f.n.unwrap_or(1), "n")?,
        logprobs: None,
        prompt_logprobs: f
            .prompt_logprobs
            .map(|k| count(k, "prompt_logprobs"))
            .transpose()?,
        max_tokens: max_tokens.map(|m| count(m, "max_tokens")).transpose()?,
        min_tokens: count(f.min_tokens.unwrap_or(0), "min_tokens")?,
        ignore_eos: f.ignore_eos.unwrap_or(false),
        stop_token_ids,
        stop,
        // Tokenised once the model is known (`bad_word_ids`).
        bad_words: Vec::new(),
        allowed_token_ids: allowed_ids(f, vocab)?,
        skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
        include_stop_str: f.include_stop_str_in_output.unwrap_or(false),
        constraint: None,
    })
}

/// A request whose every field is checked, before tokenisation.
#[derive(Debug, Clone)]
pub struct Checked {
    pub sampling: SamplingParams,
    pub priority: i32,
    pub stream: bool,
    pub include_usage: bool,
    /// `echo`.
    pub echo: Option<Echo>,
    /// vLLM's `prompt_logprobs`: the alternatives each prompt token's entry lists.
    pub ranked_prompt: Option<usize>,
    /// vLLM's `return_tokens_as_token_ids`.
    pub token_names_as_ids: bool,
    /// vLLM's `truncate_prompt_tokens`.
    pub truncate: Option<Truncate>,
    /// vLLM's `bad_words`, tokenised with the model into `sampling.bad_words`
    /// ([`bad_word_ids`]).
    pub bad_words: Vec<String>,
    /// vLLM's `use_beam_search`: the request runs as a beam search (`api::beam`).
    pub beam: Option<Beam>,
}

/// A beam search's shape: `width` beams kept and answered (the request's `n`), each scored
/// by its log-probability over its length (prompt included, as vLLM counts it) to the power
/// `length_penalty`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Beam {
    pub width: usize,
    pub length_penalty: f64,
}

/// Most beams: each step reads twice the width of candidates per beam, and a row reports at
/// most 20 alternatives.
pub const MAX_BEAM_WIDTH: usize = 10;

/// `use_beam_search` and `length_penalty`: the beam, when asked; refused beside what a beam
/// search does not do here (streaming, log-probabilities, a grammar, stop strings, a minimum
/// length), and a `length_penalty` without it.
fn beam(f: &SamplingFields, sampling: &SamplingParams) -> Result<Option<Beam>, ApiError> {
    let length_penalty = f.length_penalty.unwrap_or(1.0);
    if !f.use_beam_search.unwrap_or(false) {
        if length_penalty != 1.0 {
            let message = "'length_penalty' applies only with 'use_beam_search'";
            return Err(ApiError::bad(message, "length_penalty"));
        }
        return Ok(None);
    }
    if !length_penalty.is_finite() {
        return Err(ApiError::bad(
            "'length_penalty' must be finite",
            "length_penalty",
        ));
    }
    let beside = [
        ("stream", f.stream.unwrap_or(false)),
        ("logprobs", sampling.logprobs.is_some()),
        ("prompt_logprobs", sampling.prompt_logprobs.is_some()),
        (
            "stop",
            !sampling.stop.is_empty() || !sampling.stop_token_ids.is_empty(),
        ),
        ("min_tokens", sampling.min_tokens > 0),
        ("allowed_token_ids", sampling.allowed_token_ids.is_some()),
        (
            "bad_words",
            f.bad_words.as_ref().is_some_and(|w| !w.is_empty()),
        ),
    ];
    if let Some((field, _)) = beside.iter().find(|(_, asked)| *asked) {
        return Err(ApiError::bad(
            format!("'use_beam_search' cannot be combined with '{field}' here"),
            "use_beam_search",
        ));
    }
    if sampling.n > MAX_BEAM_WIDTH {
        return Err(ApiError::bad(
            format!("'use_beam_search' takes at most {MAX_BEAM_WIDTH} beams ('n')"),
            "n",
        ));
    }
    Ok(Some(Beam {
        width: sampling.n,
        length_penalty,
    }))
}

/// `allowed_token_ids` as the engine takes them: ids of the vocabulary, sorted, once each.
fn allowed_ids(f: &SamplingFields, vocab: Option<usize>) -> Result<Option<Vec<u32>>, ApiError> {
    let Some(ids) = &f.allowed_token_ids else {
        return Ok(None);
    };
    let mut out = ids
        .iter()
        .map(|&t| vocab_id(t, vocab, "allowed_token_ids"))
        .collect::<Result<Vec<u32>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(Some(out))
}

/// Most words `bad_words` may hold.
const MAX_BAD_WORDS: usize = 64;

/// `words` as the token sequences the engine holds back: each as it starts a text and after a
/// space (the two ways a word is usually tokenised), leading spaces trimmed, duplicates once.
pub fn bad_word_ids(words: &[String], tok: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    for w in words.iter().map(|w| w.trim_start()) {
        for text in [w.to_string(), format!(" {w}")] {
            let ids = tok.encode(&text, false).map_err(|e| {
                tracing::error!("tokenising a bad word: {e}");
                ApiError::Internal
            })?;
            if !ids.is_empty() && !out.contains(&ids) {
                out.push(ids);
            }
        }
    }
    Ok(out)
}

/// `bad_words` as sent: at most [`MAX_BAD_WORDS`], none empty.
fn bad_words(f: &SamplingFields) -> Result<Vec<String>, ApiError> {
    let words = f.bad_words.clone().unwrap_or_default();
    if words.len() > MAX_BAD_WORDS {
        let n = words.len();
        let message = format!("'bad_words' has {n} words: at most {MAX_BAD_WORDS} are allowed");
        return Err(ApiError::bad(message, "bad_words"));
    }
    if words.iter().any(|w| w.trim().is_empty()) {
        return Err(ApiError::bad(
            "'bad_words' must not hold an empty word",
            "bad_words",
        ));
    }
    Ok(words)
}

/// vLLM's `truncate_prompt_tokens`: keep only a prompt's last tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncate {
    /// This many.
    To(usize),
    /// As many as the model's context holds (`-1`).
    ToContext,
}

impl Truncate {
    fn of(v: Option<i64>) -> Result<Option<Self>, ApiError> {
        match v {
            None => Ok(None),
            Some(-1) => Ok(Some(Self::ToContext)),
            Some(k) if k >= 1 => Ok(Some(Self::To(k as usize))),
            Some(k) => Err(ApiError::bad(
                format!("{k} is not a valid value for 'truncate_prompt_tokens': it must be -1 or at least 1"),
                "truncate_prompt_tokens",
            )),
        }
    }

    /// `prompt` cut to its last tokens, refusing a count beyond the model's context (as
    /// vLLM does: such a prompt could not run whole anyway).
    pub fn apply(self, mut prompt: Vec<u32>, max_model_len: usize) -> Result<Vec<u32>, ApiError> {
        let keep = match self {
            Self::To(k) if k > max_model_len => {
                return Err(ApiError::bad(
                    format!("'truncate_prompt_tokens' {k} exceeds this model's maximum context length of {max_model_len} tokens"),
                    "truncate_prompt_tokens",
                ))
            }
            Self::To(k) => k,
            Self::ToContext => max_model_len,
        };
        let cut = prompt.len().saturating_sub(keep);
        prompt.drain(..cut);
        Ok(prompt)
    }
}

/// `echo`: on completions each choice's text begins with its prompt; on chat with the last
/// message's, when it is the assistant's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// The prompt, then the completion.
    Prompt,
    /// `max_tokens: 0`: the prompt alone. The engine makes one token, which is dropped (a
    /// step computes the prompt's log-probabilities and samples one token together).
    PromptOnly,
}

/// The engine's range checks on `sampling`, and the request's streaming and priority fields
/// around it.
fn checked(
    f: &SamplingFields,
    sampling: SamplingParams,
    vocab: Option<usize>,
    params: Params,
) -> Result<Checked, ApiError> {
    sampling.check(vocab).map_err(|e| params.invalid(&e))?;
    let stream = f.stream.unwrap_or(false);
    if stream && f.prompt_logprobs.is_some() {
        return Err(ApiError::bad(
            "'prompt_logprobs' are not available when 'stream' is true (as in vLLM)",
            "prompt_logprobs",
        ));
    }
    Ok(Checked {
        priority: priority(f)?,
        // In range: `sampling` took it through `count` and the engine's check.
        ranked_prompt: f.prompt_logprobs.map(|k| k as usize),
        token_names_as_ids: f.return_tokens_as_token_ids.unwrap_or(false),
        truncate: Truncate::of(f.truncate_prompt_tokens)?,
        bad_words: bad_words(f)?,
        beam: beam(f, &sampling)?,
        stream,
        include_usage: f
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        sampling,
        echo: None,
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

/// `modalities`: sluice produces text only, so anything that asks for more is refused by name
/// (never silently ignored, which would answer something other than what was asked); absent,
/// `null`, `false` or the text modality alone ask for nothing.
fn text_modality_only(v: Option<&Value>) -> Result<(), ApiError> {
    let asks_nothing = match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::Array(a)) => a == &[Value::from("text")],
        Some(_) => false,
    };
    if asks_nothing {
        Ok(())
    } else {
        Err(unsupported("modalities", "not implemented"))
    }
}

pub(crate) fn unsupported(field: &str, what: &str) -> ApiError {
    ApiError::BadRequest {
        message: format!("'{field}' is not supported by this server: {what}"),
        param: Some(field.to_string()),
        code: Some("unsupported_parameter"),
    }
}

/// The messages in the template's form: text, an assistant's `tool_calls`, a `tool`
/// message's `tool_call_id`.
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
        .map(|(i, m)| chat_message(i, m))
        .collect()
}

fn chat_message(i: usize, m: &ChatMessageIn) -> Result<ChatMessage, ApiError> {
    let role = match m.role.as_str() {
        "system" | "user" | "assistant" | "tool" => m.role.clone(),
        // OpenAI's newer name for system instructions.
        "developer" => "system".to_string(),
        "function" => {
            return Err(unsupported(
                &format!("messages[{i}].role"),
                "the legacy 'function' role; use 'tool' messages",
            ))
        }
        other => {
            return Err(ApiError::bad(
                format!("'{other}' is not a valid role for messages[{i}]: use system, developer, user, assistant or tool"),
                format!("messages[{i}].role"),
            ))
        }
    };
    // As OpenAI's API: only an assistant message that calls tools may leave out its content.
    if m.content.is_none() && !(m.role == "assistant" && present(&m.tool_calls)) {
        let what = if m.role == "assistant" {
            "an assistant message without 'tool_calls'".to_string()
        } else {
            format!("a '{}' message", m.role)
        };
        return Err(ApiError::bad(
            format!("'messages[{i}].content' is required for {what}"),
            format!("messages[{i}].content"),
        ));
    }
    let mut out = ChatMessage::new(role, message_text(i, m)?);
    if present(&m.tool_calls) {
        if m.role != "assistant" {
            return Err(ApiError::bad(
                format!(
                    "only assistant messages carry 'tool_calls' (messages[{i}] is '{}')",
                    m.role
                ),
                format!("messages[{i}].tool_calls"),
            ));
        }
        let calls = m.tool_calls.as_ref().expect("present");
        out.tool_calls = Some(tools::message_tool_calls(i, calls)?);
    }
    if m.role == "tool" {
        let id = m.tool_call_id.clone().ok_or_else(|| {
            ApiError::bad(
                format!("'messages[{i}].tool_call_id' is required for a tool message"),
                format!("messages[{i}].tool_call_id"),
            )
        })?;
        out.tool_call_id = Some(id);
    }
    out.name = m.name.clone();
    Ok(out)
}

fn message_text(i: usize, m: &ChatMessageIn) -> Result<String, ApiError> {
    Ok(match &m.content {
        None => String::new(),
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                if p.kind != "text" {
                    return Err(unsupported(
                        &format!("messages[{i}].content[{j}].type"),
                        &format!(
                            "'{}' parts are not accepted; this model reads text only",
                            p.kind
                        ),
                    ));
                }
                text.push_str(p.text.as_deref().unwrap_or(""));
            }
            text
        }
    })
}

/// A chat request's prompt as the checks leave it: its messages, its tools, what its output
/// must be, and how the template renders it.
#[derive(Debug, Clone)]
pub struct ChatPrompt {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<ToolSet>,
    pub output: Output,
    /// Where the prompt ends ([`chat_end`]).
    pub end: ChatEnd,
    /// `chat_template_kwargs` and `documents`: further template variables (an object).
    pub template_kwargs: Option<Value>,
    /// The request's own `chat_template`, when it brings one.
    pub template: Option<String>,
}

/// The template's further variables: `chat_template_kwargs` (an object), and `documents`
/// (a list of objects), which wins over a key of the same name there.
pub fn template_kwargs(
    kwargs: Option<&Value>,
    documents: Option<&Value>,
) -> Result<Option<Value>, ApiError> {
    let mut kwargs = kwargs.filter(|v| !v.is_null()).cloned();
    if kwargs.as_ref().is_some_and(|v| !v.is_object()) {
        return Err(ApiError::bad(
            "'chat_template_kwargs' must be an object",
            "chat_template_kwargs",
        ));
    }
    let Some(docs) = documents.filter(|v| !v.is_null()) else {
        return Ok(kwargs);
    };
    if !docs
        .as_array()
        .is_some_and(|a| a.iter().all(Value::is_object))
    {
        return Err(ApiError::bad(
            "'documents' must be a list of objects (such as {\"title\": …, \"text\": …})",
            "documents",
        ));
    }
    let all = kwargs.get_or_insert_with(|| Value::Object(Default::default()));
    if let Some(o) = all.as_object_mut() {
        o.insert("documents".into(), docs.clone());
    }
    Ok(kwargs)
}

/// Renders and tokenises chat messages with the model's template: the template's markers are
/// special tokens, every text from the caller is plain text (`encode_chat`). Tools go to the
/// template's `tools` variable when it reads it, else into the system message; assistant
/// tool calls go into the content when the template does not render `tool_calls`.
pub fn chat_prompt(
    (model, own): (&Model, Option<&str>),
    messages: &[ChatMessage],
    tools: Option<&ToolSet>,
    end: ChatEnd,
    template_kwargs: Option<&Value>,
) -> Result<Vec<u32>, ApiError> {
    let compiled = own
        .map(|src| ChatTemplate::for_tokenizer(src, model.tokenizer()))
        .transpose()
        .map_err(|e| {
            ApiError::bad(
                format!("the request's 'chat_template' does not compile: {e}"),
                "chat_template",
            )
        })?;
    let template = compiled.as_ref().or(model.chat_template()).ok_or_else(|| {
        ApiError::bad(
            "this model has no chat template: use /v1/completions",
            "messages",
        )
    })?;
    let mut messages = messages.to_vec();
    if !template.reads_tool_calls() {
        messages.iter_mut().for_each(tools::inline_tool_calls);
    }
    let defs = tools.and_then(ToolSet::template_tools);
    let defs = match (defs, tools) {
        (Some(d), _) if template.reads_tools() => Some(d),
        (Some(_), Some(set)) => {
            tools::add_system_text(&mut messages, &set.system_text());
            None
        }
        _ => None,
    };
    encode_chat(
        template,
        model.tokenizer(),
        &messages,
        defs,
        end,
        template_kwargs,
    )
    .map_err(|e| match e {
        ModelError::Template(e) => ApiError::bad(
            format!("the chat template rejected the messages: {e}"),
            "messages",
        ),
        e => {
            tracing::error!("tokenising a rendered chat: {e}");
            ApiError::Internal
        }
    })
}

/// What the output must be: with tools, what `tool_choice` allows (calls, or an answer in
/// the answer format: see `tools`); without, the answer format (`response_format` or a vLLM
/// field), else text.
fn chat_output(req: &ChatCompletionRequest, tools: Option<&ToolSet>) -> Result<Output, ApiError> {
    let format = guided::answer_format(req.response_format.as_ref(), req.guided_fields())?;
    match tools {
        Some(set) => set.output(format.as_ref()),
        None => Ok(Output::answer(format)),
    }
}

/// Every check of a chat request that needs no tokenizer, and its messages in the template's
/// form. A routing gateway runs this for remote models, then proxies the body as it came.
pub fn chat_checked(
    req: &ChatCompletionRequest,
    vocab: Option<usize>,
) -> Result<(Checked, ChatPrompt), ApiError> {
    let tools = tools::tool_set(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
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
    text_modality_only(req.modalities.as_ref())?;
    let template_kwargs =
        template_kwargs(req.chat_template_kwargs.as_ref(), req.documents.as_ref())?;
    let output = chat_output(req, tools.as_ref())?;
    let messages = chat_messages(&req.messages)?;
    let end = chat_end(
        req.add_generation_prompt,
        req.continue_final_message,
        &messages,
    )?;
    let echo = req.echo.unwrap_or(false);
    if echo && output.tool_calls {
        return Err(ApiError::bad(
            "'echo' cannot be combined with tool calls: a reply read as calls has no text to \
             begin with the last message's",
            "echo",
        ));
    }
    if end == ChatEnd::ContinueFinal && (output.grammar.is_some() || output.tool_calls) {
        return Err(ApiError::bad(
            format!(
                "'continue_final_message' cannot be combined with '{}': its grammar holds a \
                 reply from its start, not from inside a message",
                output.param
            ),
            "continue_final_message",
        ));
    }
    let f = req.sampling_fields();
    let max = req.max_completion_tokens.or(f.max_tokens);
    let mut sampling = sampling(&f, vocab, max)?;
    sampling.logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (false, Some(_)) => {
            return Err(ApiError::bad(
                "'top_logprobs' needs 'logprobs' set to true",
                "top_logprobs",
            ))
        }
        (true, k) => Some(count(k.unwrap_or(0), "top_logprobs")?),
        (false, None) => None,
    };
    let mut checked = checked(&f, sampling, vocab, CHAT_PARAMS)?;
    checked.echo = echo.then_some(Echo::Prompt);
    let prompt = ChatPrompt {
        messages,
        tools,
        output,
        end,
        template_kwargs,
        template: req.chat_template.clone(),
    };
    Ok((checked, prompt))
}

/// Where a chat's prompt ends, from vLLM's two fields: a new assistant turn unless
/// `add_generation_prompt` is false; inside the final message with `continue_final_message`,
/// which opens no turn, so asking for both is an error (as in vLLM), and which cannot go on
/// from a message that made tool calls (the template writes them after its text).
pub fn chat_end(
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    messages: &[ChatMessage],
) -> Result<ChatEnd, ApiError> {
    if !continue_final_message.unwrap_or(false) {
        return Ok(match add_generation_prompt.unwrap_or(true) {
            true => ChatEnd::NewTurn,
            false => ChatEnd::Closed,
        });
    }
    let refuse = |why: &str| {
        Err(ApiError::bad(
            format!("'continue_final_message' {why}"),
            "continue_final_message",
        ))
    };
    if add_generation_prompt == Some(true) {
        return refuse(
            "and 'add_generation_prompt' cannot both be true: a continued message opens no \
             new turn",
        );
    }
    if messages.last().is_some_and(|m| m.tool_calls.is_some()) {
        return refuse("cannot continue a message that made tool calls");
    }
    Ok(ChatEnd::ContinueFinal)
}

/// A request's own `chat_template` (`asked`) runs only on a server that trusts them
/// (`--trust-request-chat-template`).
pub fn request_template_allowed(asked: bool, trusted: bool) -> Result<(), ApiError> {
    if asked && !trusted {
        return Err(ApiError::bad(
            "a request's 'chat_template' runs only on a server started with \
             --trust-request-chat-template",
            "chat_template",
        ));
    }
    Ok(())
}

/// Each prompt within the server's `--max-prompt-tokens`, checked after tokenising (and any
/// `truncate_prompt_tokens`) and before a budget is spent or a prefill runs. `param` is the
/// endpoint's prompt parameter (`messages` or `prompt`).
pub fn prompts_within(
    prompts: &[Vec<u32>],
    max_prompt_tokens: Option<usize>,
    param: &str,
) -> Result<(), ApiError> {
    let (Some(max), Some(longest)) = (max_prompt_tokens, prompts.iter().map(Vec::len).max()) else {
        return Ok(());
    };
    if longest <= max {
        return Ok(());
    }
    let which = if prompts.len() > 1 {
        "the longest of these"
    } else {
        "this one"
    };
    Err(ApiError::BadRequest {
        message: format!(
            "this server takes prompts of at most {max} tokens (longer ones cannot meet its \
             latency target), and {which} has {longest}. Please reduce the length of the prompt."
        ),
        param: Some(param.to_string()),
        code: Some("context_length_exceeded"),
    })
}

/// A checked completion request's prompts as token ids: text encoded as the model reads a
/// prompt (`Tokenizer::encode_prompt`), ids checked against the vocabulary.
pub fn completion_prompts(
    req: &CompletionRequest,
    model: &Model,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let vocab = model.config().vocab_size;
    let encode = |text: &str| -> Result<Vec<u32>, ApiError> {
        model.tokenizer().encode_prompt(text).map_err(|e| {
            tracing::error!("tokenising a prompt: {e}");
            ApiError::Internal
        })
    };
    let ids = |v: &[i64]| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|&t| vocab_id(t, Some(vocab), "prompt"))
            .collect()
    };
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        PromptSpec::Text(t) => vec![encode(t)?],
        PromptSpec::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        PromptSpec::Tokens(t) => vec![ids(t)?],
        PromptSpec::TokenLists(ls) => ls.iter().map(|l| ids(l)).collect::<Result<_, _>>()?,
    };
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::bad("'prompt' must not be empty", "prompt"));
    }
    Ok(prompts)
}

/// Every check of a completion request that needs no tokenizer: its fields, and the prompt's
/// shape (not empty, not too many, token ids in the vocabulary when it is known); with the
/// format the text is held to, if any.
pub fn completion_checked(
    req: &CompletionRequest,
    vocab: Option<usize>,
) -> Result<(Checked, Option<AnswerFormat>), ApiError> {
    if present(&req.suffix) {
        return Err(unsupported("suffix", "no fill-in-the-middle"));
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
    let asked = f
        .max_tokens
        .unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS as i64);
    let echo = match (req.echo.unwrap_or(false), asked) {
        (false, _) => None,
        (true, 0) => Some(Echo::PromptOnly),
        (true, _) => Some(Echo::Prompt),
    };
    let max = if echo == Some(Echo::PromptOnly) {
        1
    } else {
        asked
    };
    let mut sampling = sampling(&f, vocab, Some(max))?;
    sampling.logprobs = req.logprobs.map(|k| count(k, "logprobs")).transpose()?;
    // Echoed with log-probabilities: the prompt's tokens carry theirs (as many alternatives
    // as either field asks).
    if let Some(k) = echo.and(sampling.logprobs) {
        sampling.prompt_logprobs = Some(sampling.prompt_logprobs.map_or(k, |v| v.max(k)));
    }
    let mut checked = checked(&f, sampling, vocab, COMPLETION_PARAMS)?;
    checked.echo = echo;
    let format = guided::answer_format(req.response_format.as_ref(), req.guided_fields())?;
    let (prompts, empty) = match &req.prompt {
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
    if prompts == 0 {
        return Err(ApiError::bad(
            "'prompt' must not be an empty list",
            "prompt",
        ));
    }
    if empty {
        return Err(ApiError::bad("'prompt' must not be empty", "prompt"));
    }
    if prompts * checked.sampling.n > MAX_N * 4 {
        return Err(ApiError::bad(
            format!(
                "{} prompts × n {} is more choices than one request may ask for",
                prompts, checked.sampling.n
            ),
            "prompt",
        ));
    }
    Ok((checked, format))
}
