//! Engine events → OpenAI responses: one JSON body, or SSE chunks ending in `data: [DONE]`.
//!
//! Choices are numbered prompt-major (`prompt · n + choice`), as OpenAI numbers completions of
//! several prompts. Dropping the response (the client left) drops the engine streams, which
//! aborts the sequences within one engine step.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde::Serialize;
use sluice_engine::{Event, EventStream, FinishReason, TokenLogprob, Usage};
use sluice_models::tokenizer::Tokenizer;

use crate::api::scope::RequestScope;
use crate::api::types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta,
    ChatLogprobs, ChatTokenLogprob, Completion, CompletionChoice, CompletionLogprobs,
    PromptTokensDetails, TopLogprobOut, UsageOut,
};
use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// Everything needed to answer one accepted request.
#[derive(Debug)]
pub struct Generation {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// One stream per prompt.
    pub streams: Vec<EventStream>,
    pub n: usize,
    pub logprobs: bool,
    pub include_usage: bool,
    pub deadline: Option<Duration>,
    pub tokenizer: std::sync::Arc<sluice_models::Model>,
    pub scope: RequestScope,
}

fn finish_label(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

fn usage_out(u: &Usage) -> UsageOut {
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

fn piece(tok: &Tokenizer, id: u32) -> String {
    tok.token_to_piece(id).unwrap_or_default()
}

fn chat_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> ChatLogprobs {
    ChatLogprobs {
        content: lps
            .iter()
            .map(|lp| {
                let token = piece(tok, lp.token);
                ChatTokenLogprob {
                    bytes: token.as_bytes().to_vec(),
                    token,
                    logprob: lp.logprob,
                    top_logprobs: lp
                        .top
                        .iter()
                        .map(|&(id, l)| {
                            let t = piece(tok, id);
                            TopLogprobOut {
                                bytes: t.as_bytes().to_vec(),
                                token: t,
                                logprob: l,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// Appends tokens to the completions logprobs shape; `offset` is the text length so far.
fn completion_logprobs(
    tok: &Tokenizer,
    lps: &[TokenLogprob],
    offset: &mut usize,
    out: &mut CompletionLogprobs,
) {
    for lp in lps {
        let t = piece(tok, lp.token);
        out.text_offset.push(*offset);
        *offset += t.len();
        out.tokens.push(t);
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs.push(
            lp.top
                .iter()
                .map(|&(id, l)| (piece(tok, id), l))
                .collect::<HashMap<_, _>>(),
        );
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
}

impl<S: futures_util::Stream<Item = (usize, Event)> + Unpin> Events<S> {
    fn new(inner: S, deadline: Option<Duration>) -> Self {
        Self {
            inner,
            until: deadline.map(|d| tokio::time::Instant::now() + d),
            deadline: deadline.unwrap_or_default(),
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
                FinishReason::Abort => {
                    return Err(ApiError::Unavailable(
                        "The server stopped before the request finished".into(),
                    ))
                }
                FinishReason::Stop | FinishReason::Length => {}
            }
        }
        Ok((p, ev))
    }
}

/// The choice index of an event of prompt `p`.
fn choice_index(p: usize, n: usize, index: usize) -> usize {
    p * n + index
}

#[derive(Debug, Default)]
struct Acc {
    text: String,
    lps: Vec<TokenLogprob>,
    finish: Option<FinishReason>,
}

/// Waits for every choice and answers with one JSON body.
pub async fn respond(g: Generation) -> Result<Response, ApiError> {
    let Generation {
        kind,
        id,
        created,
        model,
        streams,
        n,
        logprobs,
        deadline,
        tokenizer,
        mut scope,
        ..
    } = g;
    let total = streams.len() * n;
    let mut acc: Vec<Acc> = (0..total).map(|_| Acc::default()).collect();
    let mut usage = UsageSum::default();
    let mut events = Events::new(merged(streams).boxed(), deadline);
    let mut finished = 0;
    while finished < total {
        let (p, ev) = match events.next().await {
            Ok(x) => x,
            Err(e) => {
                scope.fail(&e);
                return Err(e);
            }
        };
        match ev {
            Event::Delta(d) => {
                scope.first_token();
                let a = &mut acc[choice_index(p, n, d.index)];
                a.text.push_str(&d.text);
                a.lps.extend(d.logprobs);
            }
            Event::Finish(f) => {
                finished += 1;
                usage.add(&f.usage, f.index == 0);
                acc[choice_index(p, n, f.index)].finish = Some(f.reason);
            }
        }
    }
    let tok = tokenizer.tokenizer();
    let u = usage_out(&usage.total);
    scope.succeed(usage.total.completion_tokens, usage.total.prompt_tokens);
    let body = match kind {
        Kind::Chat => Json(ChatCompletion {
            id,
            object: "chat.completion",
            created,
            model,
            choices: acc
                .into_iter()
                .enumerate()
                .map(|(i, a)| ChatChoice {
                    index: i,
                    logprobs: logprobs.then(|| chat_logprobs(tok, &a.lps)),
                    message: AssistantMessage {
                        role: "assistant",
                        content: a.text,
                    },
                    finish_reason: a.finish.as_ref().map(finish_label),
                })
                .collect(),
            usage: u,
            system_fingerprint: None,
        })
        .into_response(),
        Kind::Completion => Json(Completion {
            id,
            object: "text_completion",
            created,
            model,
            choices: acc
                .into_iter()
                .enumerate()
                .map(|(i, a)| {
                    let lp = logprobs.then(|| {
                        let mut out = CompletionLogprobs::default();
                        completion_logprobs(tok, &a.lps, &mut 0, &mut out);
                        out
                    });
                    CompletionChoice {
                        index: i,
                        text: a.text,
                        logprobs: lp,
                        finish_reason: a.finish.as_ref().map(finish_label),
                    }
                })
                .collect(),
            usage: Some(Some(u)),
            system_fingerprint: None,
        })
        .into_response(),
    };
    Ok(body)
}

fn sse_json(v: &impl Serialize) -> SseEvent {
    SseEvent::default().data(serde_json::to_string(v).expect("response types serialise"))
}

/// Streams chunks as SSE. Errors after the first byte become an SSE error event, then
/// `[DONE]`.
pub fn stream(g: Generation) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<SseEvent>(64);
    tokio::spawn(pump(g, tx));
    let body = stream::poll_fn(move |cx| rx.poll_recv(cx)).map(Ok::<_, Infallible>);
    Sse::new(body).into_response()
}

/// Reads engine events and sends SSE events until done or the client is gone.
async fn pump(g: Generation, tx: tokio::sync::mpsc::Sender<SseEvent>) {
    let Generation {
        kind,
        id,
        created,
        model,
        streams,
        n,
        logprobs,
        include_usage,
        deadline,
        tokenizer,
        mut scope,
    } = g;
    let tok = tokenizer.tokenizer();
    let total = streams.len() * n;
    // `"usage": null` on every chunk when usage is asked for, absent otherwise.
    let usage_field = || include_usage.then_some(None);
    let chat_chunk = |choices: Vec<ChatChunkChoice>, usage: Option<Option<UsageOut>>| {
        sse_json(&ChatCompletionChunk {
            id: id.clone(),
            object: "chat.completion.chunk",
            created,
            model: model.clone(),
            choices,
            usage,
            system_fingerprint: None,
        })
    };
    let text_chunk = |choices: Vec<CompletionChoice>, usage: Option<Option<UsageOut>>| {
        sse_json(&Completion {
            id: id.clone(),
            object: "text_completion",
            created,
            model: model.clone(),
            choices,
            usage,
            system_fingerprint: None,
        })
    };
    // Chat streams open each choice with the assistant role, as OpenAI's do.
    if kind == Kind::Chat {
        let opening = (0..total)
            .map(|i| ChatChunkChoice {
                index: i,
                delta: ChatDelta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                },
                logprobs: None,
                finish_reason: None,
            })
            .collect();
        if tx.send(chat_chunk(opening, usage_field())).await.is_err() {
            scope.client_gone();
            return;
        }
    }
    let mut offsets = vec![0usize; total];
    let mut usage = UsageSum::default();
    let mut events = Events::new(merged(streams).boxed(), deadline);
    let mut finished = 0;
    let mut failure: Option<ApiError> = None;
    while finished < total {
        let (p, ev) = match events.next().await {
            Ok(x) => x,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let chunk = match ev {
            Event::Delta(d) => {
                scope.first_token();
                let i = choice_index(p, n, d.index);
                match kind {
                    Kind::Chat => chat_chunk(
                        vec![ChatChunkChoice {
                            index: i,
                            delta: ChatDelta {
                                role: None,
                                content: Some(d.text),
                            },
                            logprobs: logprobs.then(|| chat_logprobs(tok, &d.logprobs)),
                            finish_reason: None,
                        }],
                        usage_field(),
                    ),
                    Kind::Completion => {
                        let lp = logprobs.then(|| {
                            let mut out = CompletionLogprobs::default();
                            completion_logprobs(tok, &d.logprobs, &mut offsets[i], &mut out);
                            out
                        });
                        text_chunk(
                            vec![CompletionChoice {
                                index: i,
                                text: d.text,
                                logprobs: lp,
                                finish_reason: None,
                            }],
                            usage_field(),
                        )
                    }
                }
            }
            Event::Finish(f) => {
                finished += 1;
                usage.add(&f.usage, f.index == 0);
                let i = choice_index(p, n, f.index);
                let reason = Some(finish_label(&f.reason));
                match kind {
                    Kind::Chat => chat_chunk(
                        vec![ChatChunkChoice {
                            index: i,
                            delta: ChatDelta::default(),
                            logprobs: None,
                            finish_reason: reason,
                        }],
                        usage_field(),
                    ),
                    Kind::Completion => text_chunk(
                        vec![CompletionChoice {
                            index: i,
                            text: String::new(),
                            logprobs: None,
                            finish_reason: reason,
                        }],
                        usage_field(),
                    ),
                }
            }
        };
        if tx.send(chunk).await.is_err() {
            scope.client_gone();
            return;
        }
    }
    // Dropping the engine streams now aborts whatever is left (after an error).
    drop(events);
    if let Some(e) = failure {
        scope.fail(&e);
        let _ = tx.send(sse_json(&e.body())).await;
        let _ = tx.send(SseEvent::default().data("[DONE]")).await;
        return;
    }
    if include_usage {
        let u = Some(Some(usage_out(&usage.total)));
        let last = match kind {
            Kind::Chat => chat_chunk(Vec::new(), u),
            Kind::Completion => text_chunk(Vec::new(), u),
        };
        let _ = tx.send(last).await;
    }
    let _ = tx.send(SseEvent::default().data("[DONE]")).await;
    scope.succeed(usage.total.completion_tokens, usage.total.prompt_tokens);
}

/// Seconds since the Unix epoch, for `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
