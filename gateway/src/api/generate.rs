//! Engine events → OpenAI responses: one JSON body, or SSE chunks ending in `data: [DONE]`.
//! What differs between chat and completions is a [`Render`]; the loops over events are
//! written once.
//!
//! Choices are numbered prompt-major (`prompt · n + choice`), as OpenAI numbers completions of
//! several prompts. Dropping the response (the client left) drops the engine streams, which
//! aborts the sequences within one engine step, and the request's scope with its gate.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use sluice_engine::{Delta, Event, EventStream, FinishReason, PromptLogprobs, TokenLogprob, Usage};
use sluice_models::tokenizer::Tokenizer;
use sluice_models::Model;

use crate::api::logprobs::{self, chat_logprobs, completion_logprobs, piece, Names};
use crate::api::scope::RequestScope;
use crate::api::sse;
use crate::api::tools::{self, CallReader};
use crate::api::types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta,
    Completion, CompletionChoice, CompletionLogprobs, PromptTokensDetails, RankedLogprob, UsageOut,
};
use crate::error::ApiError;

/// What every response of one request repeats.
#[derive(Debug, Clone)]
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub logprobs: bool,
    pub include_usage: bool,
    /// For turning log-probability token ids into text.
    pub tokenizer: Arc<Model>,
    /// Chat output read as tool calls: `Some(true)` calls only, `Some(false)` text or calls.
    pub tool_calls: Option<bool>,
    /// Streamed choices carry their token ids and usage (`X-Sluice-Token-Ids`).
    pub token_ids: bool,
    /// A continuation (`X-Sluice-Resume`): the client has had the opening already.
    pub resumed: bool,
    /// Completions' `echo` (never on a continuation: the client has had the prompt).
    pub echo: Option<Echoed>,
    /// vLLM's `prompt_logprobs`: the alternatives each prompt token's entry lists.
    pub ranked_prompt: Option<usize>,
    /// vLLM's `return_tokens_as_token_ids`: log-probabilities name tokens `token_id:<id>`.
    pub token_names_as_ids: bool,
}

/// Completions' `echo`, as the answer needs it.
#[derive(Debug, Clone)]
pub struct Echoed {
    /// Each prompt's text as sent (a prompt of token ids: decoded) and its token ids.
    pub prompts: Vec<(String, Vec<u32>)>,
    /// The prompt alone (`max_tokens: 0`): the engine's one token is dropped.
    pub only: bool,
}

impl Head {
    fn tok(&self) -> &Tokenizer {
        self.tokenizer.tokenizer()
    }

    fn names(&self) -> Names<'_> {
        Names {
            tok: self.tok(),
            ids: self.token_names_as_ids,
        }
    }

    /// vLLM's `prompt_logprobs` of a choice's prompt, when the request asked.
    fn ranked(&self, a: &Acc) -> Option<Vec<Option<HashMap<String, RankedLogprob>>>> {
        let k = self.ranked_prompt?;
        a.prompt
            .as_ref()
            .map(|p| logprobs::ranked_prompt(self.tok(), p, k))
    }

    /// `"usage": null` on every chunk when usage is asked for, absent otherwise.
    fn usage_field(&self) -> Option<Option<UsageOut>> {
        self.include_usage.then_some(None)
    }
}

/// One endpoint's response shapes. The stream's chunks differ only in their choices, so an
/// endpoint writes those and the chunk around them; the rest is shared.
pub trait Render: Send + Sized + 'static {
    /// A choice within a streamed chunk.
    type Choice;

    fn new(head: Head, choices: usize) -> Self;
    fn head(&self) -> &Head;
    /// One SSE chunk holding `choices`.
    fn chunk(&self, choices: Vec<Self::Choice>, usage: Option<Option<UsageOut>>) -> Bytes;
    /// The choice carrying new text of choice `i`.
    fn delta_choice(&mut self, i: usize, d: Delta) -> Self::Choice;
    /// The choice that finishes choice `i`, with its usage when the gateway asked for it.
    fn finish_choice(i: usize, reason: &'static str, usage: Option<UsageOut>) -> Self::Choice;
    /// The whole answer as one JSON body.
    fn body(self, choices: Vec<Acc>, usage: UsageOut) -> Response;

    /// Chunks before any token.
    fn opening(&self, _choices: usize) -> Option<Bytes> {
        None
    }

    /// Choice `i` continues output another replica sent (`ids`, after the echoed prompt's
    /// `echoed` text): later pieces go on from it.
    fn resumed(&mut self, _i: usize, _echoed: &str, _ids: &[u32]) {}

    /// The chunk carrying prompt `p`'s log-probabilities, if the answer shows them.
    fn prompt(&mut self, _p: usize, _lps: &PromptLogprobs) -> Option<Bytes> {
        None
    }

    /// The chunk carrying `d`; `None` when it carries nothing to send yet.
    fn delta(&mut self, i: usize, d: Delta) -> Option<Bytes> {
        let choice = self.delta_choice(i, d);
        Some(self.chunk(vec![choice], self.head().usage_field()))
    }

    fn finish(&self, i: usize, reason: &'static str, usage: &Usage) -> Bytes {
        let usage = self.head().token_ids.then(|| usage_out(usage));
        self.chunk(
            vec![Self::finish_choice(i, reason, usage)],
            self.head().usage_field(),
        )
    }

    /// The last chunk before `[DONE]`, with the request's usage, when it was asked for.
    fn usage(&self, u: UsageOut) -> Option<Bytes> {
        self.head()
            .include_usage
            .then(|| self.chunk(Vec::new(), Some(Some(u))))
    }
}

/// `/v1/chat/completions`' shapes. With tools, each choice's text goes through a
/// [`CallReader`], so calls stream as `delta.tool_calls` and answer as `message.tool_calls`.
#[derive(Debug)]
pub struct ChatRender {
    head: Head,
    readers: Vec<CallReader>,
}

impl ChatRender {
    /// `finish_reason`: `tool_calls` when a choice that called a function stopped.
    fn label(reason: &'static str, called: bool) -> &'static str {
        if called && reason == "stop" {
            "tool_calls"
        } else {
            reason
        }
    }

    /// Echoed, the last message's text (empty when it is not the assistant's); else empty.
    fn echoed(&self) -> &str {
        let echo = self.head.echo.as_ref().and_then(|e| e.prompts.first());
        echo.map_or("", |(text, _)| text)
    }

    fn message(&self, a: Acc) -> (AssistantMessage, Option<&'static str>) {
        let finish = a.finish.as_ref().map(finish_label);
        let Some(calls_only) = self.head.tool_calls else {
            let message = AssistantMessage {
                role: "assistant",
                content: Some(self.echoed().to_string() + &a.text),
                tool_calls: Vec::new(),
            };
            return (message, finish);
        };
        let (calls, rest) = tools::read_all(&a.text, calls_only);
        let finish = finish.map(|f| Self::label(f, !calls.is_empty()));
        let content = (calls.is_empty() || !rest.is_empty()).then_some(rest);
        let message = AssistantMessage {
            role: "assistant",
            content,
            tool_calls: calls,
        };
        (message, finish)
    }
}

impl Render for ChatRender {
    type Choice = ChatChunkChoice;

    fn new(head: Head, choices: usize) -> Self {
        let readers = match head.tool_calls {
            Some(only) => (0..choices).map(|_| CallReader::new(only)).collect(),
            None => Vec::new(),
        };
        Self { head, readers }
    }

    fn head(&self) -> &Head {
        &self.head
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Option<UsageOut>>) -> Bytes {
        sse::event(&ChatCompletionChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk",
            created: self.head.created,
            model: self.head.model.clone(),
            choices,
            usage,
            system_fingerprint: None,
        })
    }

    /// Chat streams open each choice with the assistant role, as OpenAI's do (and, echoed,
    /// the last message's text).
    fn opening(&self, choices: usize) -> Option<Bytes> {
        let opening = (0..choices)
            .map(|i| ChatChunkChoice {
                index: i,
                delta: ChatDelta {
                    role: Some("assistant"),
                    content: Some(self.echoed().to_string()),
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: None,
                token_ids: None,
                sluice_usage: None,
            })
            .collect();
        Some(self.chunk(opening, self.head.usage_field()))
    }

    fn delta_choice(&mut self, i: usize, d: Delta) -> ChatChunkChoice {
        let logprobs = self
            .head
            .logprobs
            .then(|| chat_logprobs(self.head.names(), &d.logprobs));
        let delta = match self.readers.get_mut(i) {
            None => ChatDelta {
                role: None,
                content: Some(d.text),
                tool_calls: None,
            },
            Some(reader) => {
                let read = reader.push(&d.text);
                ChatDelta {
                    role: None,
                    content: (!read.content.is_empty()).then_some(read.content),
                    tool_calls: (!read.calls.is_empty()).then_some(read.calls),
                }
            }
        };
        ChatChunkChoice {
            index: i,
            delta,
            logprobs,
            finish_reason: None,
            token_ids: self.head.token_ids.then_some(d.token_ids),
            sluice_usage: None,
        }
    }

    /// A call reader reads the text sent before, so calls continue where they were (their
    /// ids are new: call ids are random).
    fn resumed(&mut self, i: usize, _echoed: &str, ids: &[u32]) {
        if let Some(reader) = self.readers.get_mut(i) {
            let text = self.head.tok().decode(ids, true).unwrap_or_default();
            reader.push(&text);
        }
    }

    fn finish_choice(i: usize, reason: &'static str, usage: Option<UsageOut>) -> ChatChunkChoice {
        ChatChunkChoice {
            index: i,
            delta: ChatDelta::default(),
            logprobs: None,
            finish_reason: Some(reason),
            token_ids: None,
            sluice_usage: usage,
        }
    }

    /// With tools, a piece of output that completes nothing (a call's name still coming, an
    /// argument's end held back) sends no chunk, unless it carries token ids for a gateway.
    fn delta(&mut self, i: usize, d: Delta) -> Option<Bytes> {
        let choice = self.delta_choice(i, d);
        let empty = choice.delta.content.is_none() && choice.delta.tool_calls.is_none();
        if empty && choice.logprobs.is_none() && choice.token_ids.is_none() {
            return None;
        }
        Some(self.chunk(vec![choice], self.head.usage_field()))
    }

    fn finish(&self, i: usize, reason: &'static str, usage: &Usage) -> Bytes {
        let called = self.readers.get(i).is_some_and(|r| r.calls() > 0);
        let usage = self.head.token_ids.then(|| usage_out(usage));
        let mut choice = Self::finish_choice(i, Self::label(reason, called), usage);
        // Text held back as a possible call marker that the output ended on is content.
        choice.delta.content = self
            .readers
            .get(i)
            .map(CallReader::undecided)
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        self.chunk(vec![choice], self.head.usage_field())
    }

    fn body(self, choices: Vec<Acc>, usage: UsageOut) -> Response {
        let ranked = choices.first().and_then(|a| self.head.ranked(a));
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                let logprobs = self
                    .head
                    .logprobs
                    .then(|| chat_logprobs(self.head.names(), &a.lps));
                let (message, finish_reason) = self.message(a);
                ChatChoice {
                    index: i,
                    logprobs,
                    message,
                    finish_reason,
                }
            })
            .collect();
        let head = self.head;
        Json(ChatCompletion {
            object: "chat.completion",
            choices,
            usage,
            system_fingerprint: None,
            prompt_logprobs: ranked,
            id: head.id,
            created: head.created,
            model: head.model,
        })
        .into_response()
    }
}

/// `/v1/completions`' shapes; text offsets of log-probabilities run on per choice (after
/// the prompt's text, when echoed).
#[derive(Debug)]
pub struct TextRender {
    head: Head,
    offsets: Vec<usize>,
}

impl TextRender {
    /// The choices each echoed prompt has (`n`), when echoing.
    fn per_prompt(&self) -> Option<usize> {
        let prompts = self.head.echo.as_ref()?.prompts.len();
        Some((self.offsets.len() / prompts.max(1)).max(1))
    }

    /// Choice `i`'s echoed prompt: its text and ids.
    fn echoed(&self, i: usize) -> Option<&(String, Vec<u32>)> {
        let n = self.per_prompt()?;
        self.head.echo.as_ref()?.prompts.get(i / n)
    }

    /// The choice carrying choice `i`'s echoed prompt, with its tokens' log-probabilities
    /// when the answer shows them (`lps`: the prompt's, from its second token on).
    fn echo_choice(&self, i: usize, lps: &[TokenLogprob]) -> Option<CompletionChoice> {
        let (text, ids) = self.echoed(i)?;
        Some(CompletionChoice {
            index: i,
            text: text.clone(),
            logprobs: self.head.logprobs.then(|| {
                let mut out = CompletionLogprobs::default();
                logprobs::echoed_prompt(self.head.names(), ids, lps, &mut out);
                out
            }),
            finish_reason: None,
            prompt_logprobs: None,
            token_ids: None,
            sluice_usage: None,
        })
    }

    /// Choices `range`' echoes as one chunk.
    fn echo_chunk(&self, range: std::ops::Range<usize>, lps: &[TokenLogprob]) -> Option<Bytes> {
        let choices: Vec<_> = range.filter_map(|i| self.echo_choice(i, lps)).collect();
        (!choices.is_empty()).then(|| self.chunk(choices, self.head.usage_field()))
    }
}

impl Render for TextRender {
    type Choice = CompletionChoice;

    fn new(head: Head, choices: usize) -> Self {
        let mut r = Self {
            head,
            offsets: vec![0; choices],
        };
        r.offsets = (0..choices)
            .map(|i| r.echoed(i).map_or(0, |(text, _)| text.len()))
            .collect();
        r
    }

    /// Echoed without log-probabilities, every choice's prompt at once; with them, each
    /// prompt's when its log-probabilities come ([`Render::prompt`]).
    fn opening(&self, choices: usize) -> Option<Bytes> {
        match self.head.logprobs {
            true => None,
            false => self.echo_chunk(0..choices, &[]),
        }
    }

    fn prompt(&mut self, p: usize, lps: &PromptLogprobs) -> Option<Bytes> {
        let n = self.per_prompt()?;
        self.head
            .logprobs
            .then(|| self.echo_chunk(p * n..(p + 1) * n, &lps.logprobs))
            .flatten()
    }

    fn head(&self) -> &Head {
        &self.head
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Option<UsageOut>>) -> Bytes {
        sse::event(&Completion {
            object: "text_completion",
            choices,
            usage,
            system_fingerprint: None,
            id: self.head.id.clone(),
            created: self.head.created,
            model: self.head.model.clone(),
        })
    }

    fn delta_choice(&mut self, i: usize, d: Delta) -> CompletionChoice {
        let logprobs = self.head.logprobs.then(|| {
            let mut out = CompletionLogprobs::default();
            completion_logprobs(
                self.head.names(),
                &d.logprobs,
                &mut self.offsets[i],
                &mut out,
            );
            out
        });
        CompletionChoice {
            index: i,
            text: d.text,
            logprobs,
            finish_reason: None,
            prompt_logprobs: None,
            token_ids: self.head.token_ids.then_some(d.token_ids),
            sluice_usage: None,
        }
    }

    /// Log-probability text offsets go on from the text sent before: the echoed prompt's and
    /// the output's.
    fn resumed(&mut self, i: usize, echoed: &str, ids: &[u32]) {
        let tok = self.head.tok();
        self.offsets[i] += echoed.len() + ids.iter().map(|&id| piece(tok, id).len()).sum::<usize>();
    }

    fn finish_choice(i: usize, reason: &'static str, usage: Option<UsageOut>) -> CompletionChoice {
        CompletionChoice {
            index: i,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(reason),
            prompt_logprobs: None,
            token_ids: None,
            sluice_usage: usage,
        }
    }

    fn body(self, choices: Vec<Acc>, usage: UsageOut) -> Response {
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                let prompt = a.prompt.as_ref().map_or(&[][..], |p| &p.logprobs[..]);
                let echo = self.echo_choice(i, prompt);
                let mut logprobs = echo.as_ref().and_then(|e| e.logprobs.clone());
                if self.head.logprobs {
                    let out = logprobs.get_or_insert_with(CompletionLogprobs::default);
                    let mut offset = self.offsets[i];
                    completion_logprobs(self.head.names(), &a.lps, &mut offset, out);
                }
                CompletionChoice {
                    index: i,
                    logprobs,
                    prompt_logprobs: self.head.ranked(&a),
                    text: echo.map_or(String::new(), |e| e.text) + &a.text,
                    finish_reason: a.finish.as_ref().map(finish_label),
                    token_ids: None,
                    sluice_usage: None,
                }
            })
            .collect();
        let head = self.head;
        Json(Completion {
            id: head.id,
            object: "text_completion",
            created: head.created,
            model: head.model,
            choices,
            usage: Some(Some(usage)),
            system_fingerprint: None,
        })
        .into_response()
    }
}

fn finish_label(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// The engine's usage in the API's shape.
pub(crate) fn usage_out(u: &Usage) -> UsageOut {
    UsageOut {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: u.cached_prompt_tokens,
        },
    }
}

/// Usage over every prompt (counted once each) and every choice.
#[derive(Debug, Default, Clone, Copy)]
struct UsageSum {
    total: Usage,
}

impl UsageSum {
    fn add(&mut self, u: &Usage, first_choice_of_prompt: bool) {
        if first_choice_of_prompt {
            self.total.prompt_tokens += u.prompt_tokens;
            self.total.cached_prompt_tokens += u.cached_prompt_tokens;
        }
        self.total.completion_tokens += u.completion_tokens;
    }
}

/// All prompts' events in one stream, tagged with the prompt's index.
fn merged(streams: Vec<EventStream>) -> impl futures_util::Stream<Item = (usize, Event)> + Send {
    stream::select_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(p, s)| s.map(move |e| (p, e)).boxed()),
    )
}

/// The request's events in arrival order, with the request deadline and the engine's failure
/// finishes turned into errors, so the JSON and SSE paths handle them alike.
struct Events<S> {
    inner: S,
    until: Option<tokio::time::Instant>,
    deadline: Duration,
    /// The request field a grammar failure names (`response_format` or `tools`).
    grammar_param: &'static str,
}

impl<S: futures_util::Stream<Item = (usize, Event)> + Unpin> Events<S> {
    fn new(inner: S, deadline: Option<Duration>, grammar_param: &'static str) -> Self {
        Self {
            inner,
            until: deadline.map(|d| tokio::time::Instant::now() + d),
            deadline: deadline.unwrap_or_default(),
            grammar_param,
        }
    }

    /// The next event of prompt `p`: a delta, or a finish that ended normally.
    async fn next(&mut self) -> Result<(usize, Event), ApiError> {
        let next = match self.until {
            Some(t) => tokio::time::timeout_at(t, self.inner.next())
                .await
                .map_err(|_| ApiError::Timeout(self.deadline))?,
            None => self.inner.next().await,
        };
        let Some((p, ev)) = next else {
            tracing::error!("an engine stream ended before every choice finished");
            return Err(ApiError::Internal);
        };
        if let Event::Finish(f) = &ev {
            match &f.reason {
                FinishReason::Error(m) => {
                    tracing::error!("generation failed: {m}");
                    return Err(ApiError::Internal);
                }
                FinishReason::Grammar(m) => return Err(grammar_failed(self.grammar_param, m)),
                FinishReason::Abort => {
                    return Err(ApiError::Unavailable(
                        "The server stopped before the request finished".into(),
                    ))
                }
                FinishReason::Deadline(stage) => {
                    return Err(ApiError::DeadlineExceeded {
                        stage: stage.as_str(),
                    })
                }
                FinishReason::Stop | FinishReason::Length => {}
            }
        }
        Ok((p, ev))
    }
}

/// A choice whose output grammar failed mid-generation: the request's own constraint could
/// not be followed (a step over the grammar's limits, a state allowing no token), so it is
/// the request's error, a 400 naming the field, not the server's.
fn grammar_failed(param: &'static str, why: &str) -> ApiError {
    tracing::warn!("an output grammar failed: {why}");
    ApiError::BadRequest {
        message: format!("The output could not be held to '{param}': its grammar failed during generation: {why}"),
        param: Some(param.to_string()),
        code: Some("grammar_failed"),
    }
}

/// The choice index of an event of prompt `p`.
fn choice_index(p: usize, n: usize, index: usize) -> usize {
    p * n + index
}

/// One choice's text, log-probabilities and finish, gathered for a JSON answer.
#[derive(Debug, Default)]
pub struct Acc {
    pub text: String,
    pub lps: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    /// The prompt's log-probabilities, when the request asked (echo with logprobs, vLLM's
    /// `prompt_logprobs`).
    pub prompt: Option<PromptLogprobs>,
}

/// Everything needed to answer one accepted request.
#[derive(Debug)]
pub struct Generation<R> {
    pub render: R,
    /// One stream per prompt.
    pub streams: Vec<EventStream>,
    pub n: usize,
    pub deadline: Option<Duration>,
    pub scope: RequestScope,
}

/// The request's events with their choice index, and the count of choices still running.
struct Choices {
    events: Events<BoxStream<'static, (usize, Event)>>,
    n: usize,
    total: usize,
    finished: usize,
    usage: UsageSum,
    /// Echoing the prompt alone: the engine's token is dropped (`Echoed::only`).
    prompt_only: bool,
}

/// What one event means for the response.
enum Step {
    /// Prompt `p`'s log-probabilities.
    Prompt(usize, PromptLogprobs),
    Delta(usize, Delta),
    Finish(usize, FinishReason, Usage),
}

impl Choices {
    fn new(streams: Vec<EventStream>, n: usize, deadline: Option<Duration>, head: &Head) -> Self {
        let grammar_param = match head.tool_calls {
            Some(_) => "tools",
            None => "response_format",
        };
        Self {
            total: streams.len() * n,
            events: Events::new(merged(streams).boxed(), deadline, grammar_param),
            n,
            finished: 0,
            usage: UsageSum::default(),
            prompt_only: head.echo.as_ref().is_some_and(|e| e.only),
        }
    }

    fn done(&self) -> bool {
        self.finished == self.total
    }

    /// The next prompt's log-probabilities, delta or finish, numbered by choice; usage is
    /// summed as finishes arrive. Echoing the prompt alone, the one token made is dropped:
    /// no delta, no completion tokens, and the finish is `length` (`max_tokens: 0`).
    async fn next(&mut self) -> Result<Step, ApiError> {
        loop {
            let (p, ev) = self.events.next().await?;
            return Ok(match ev {
                Event::Prompt(lps) => Step::Prompt(p, lps),
                Event::Delta(_) if self.prompt_only => continue,
                Event::Delta(d) => Step::Delta(choice_index(p, self.n, d.index), d),
                Event::Finish(mut f) => {
                    if self.prompt_only {
                        f.usage.completion_tokens = 0;
                        f.reason = FinishReason::Length;
                    }
                    self.finished += 1;
                    self.usage.add(&f.usage, f.index == 0);
                    Step::Finish(choice_index(p, self.n, f.index), f.reason, f.usage)
                }
            });
        }
    }
}

/// Waits for every choice and answers with one JSON body.
pub async fn respond<R: Render>(g: Generation<R>) -> Result<Response, ApiError> {
    let Generation {
        render,
        streams,
        n,
        deadline,
        mut scope,
    } = g;
    let mut choices = Choices::new(streams, n, deadline, render.head());
    let mut acc: Vec<Acc> = (0..choices.total).map(|_| Acc::default()).collect();
    while !choices.done() {
        match choices.next().await {
            Ok(Step::Delta(i, d)) => {
                scope.first_token();
                acc[i].text.push_str(&d.text);
                acc[i].lps.extend(d.logprobs);
            }
            Ok(Step::Finish(i, reason, _)) => acc[i].finish = Some(reason),
            Ok(Step::Prompt(p, lps)) => {
                for a in &mut acc[p * n..(p + 1) * n] {
                    a.prompt = Some(lps.clone());
                }
            }
            Err(e) => {
                scope.fail(&e);
                return Err(e);
            }
        }
    }
    let total = choices.usage.total;
    scope.succeed(total.completion_tokens, total.prompt_tokens);
    Ok(render.body(acc, usage_out(&total)))
}

/// The state of one SSE response.
struct Streaming<R> {
    render: R,
    choices: Option<Choices>,
    scope: RequestScope,
}

impl<R: Render> Streaming<R> {
    /// The next chunk to send; `None` once `[DONE]` has been sent.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            let choices = self.choices.as_mut()?;
            if choices.done() {
                return Some(self.end());
            }
            if let Some(chunk) = self.advance().await {
                return Some(chunk);
            }
        }
    }

    /// The chunk for the next event, if it makes one.
    async fn advance(&mut self) -> Option<Bytes> {
        let choices = self.choices.as_mut()?;
        match choices.next().await {
            Ok(Step::Delta(i, d)) => {
                self.scope.first_token();
                self.render.delta(i, d)
            }
            Ok(Step::Finish(i, reason, usage)) => {
                Some(self.render.finish(i, finish_label(&reason), &usage))
            }
            Ok(Step::Prompt(p, lps)) => self.render.prompt(p, &lps),
            Err(e) => {
                // Dropping the engine streams now aborts whatever is left.
                self.choices = None;
                self.scope.fail(&e);
                Some(sse::error_ending(&e))
            }
        }
    }

    /// The usage chunk if asked for, and `[DONE]`.
    fn end(&mut self) -> Bytes {
        let total = self
            .choices
            .take()
            .map(|c| c.usage.total)
            .unwrap_or_default();
        self.scope
            .succeed(total.completion_tokens, total.prompt_tokens);
        match self.render.usage(usage_out(&total)) {
            None => Bytes::from_static(sse::DONE),
            Some(usage) => {
                let mut last = usage.to_vec();
                last.extend_from_slice(sse::DONE);
                Bytes::from(last)
            }
        }
    }
}

/// Streams chunks as SSE. Errors after the first byte end the stream with an error event and
/// `[DONE]`.
pub fn stream<R: Render>(g: Generation<R>) -> Response {
    let choices = Choices::new(g.streams, g.n, g.deadline, g.render.head());
    let token_ids = g.render.head().token_ids;
    let opening = match g.render.head().resumed {
        false => g.render.opening(choices.total),
        true => None,
    };
    let state = Streaming {
        render: g.render,
        choices: Some(choices),
        scope: g.scope,
    };
    let rest = stream::unfold(state, |mut s| async move {
        s.next().await.map(|chunk| (chunk, s))
    });
    let body = stream::iter(opening)
        .chain(rest)
        .map(Ok::<_, std::convert::Infallible>);
    let mut resp = sse::response(Body::from_stream(body));
    if token_ids {
        // Says the chunks carry token ids: the gateway may resume this stream elsewhere.
        let (name, value) = super::resume::token_ids_header();
        resp.headers_mut().insert(name, value);
    }
    resp
}

/// Seconds since the Unix epoch, for `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
