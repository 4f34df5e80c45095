//! The generation endpoints, one pipeline for both ([`Endpoint`] is what differs):
//!
//! 1. parse: the body, read within the limits (refused while draining, before it is read);
//! 2. resolve: the [`Target`] — the local engine when this process serves the model, else the
//!    router (a model nobody serves is a 404 before its fields are judged);
//! 3. check: every field, with the target's vocabulary when it is local (a remote model's
//!    vocabulary, tokenizer and template are its replica's);
//! 4. gate: the tenant's rate limit and the admission queue ([`Gate`]), held by the request's
//!    scope until the response ends;
//! 5. run: locally, submit to the engine and render its events as JSON or SSE
//!    (`super::generate`); remotely, send the body as it came and pass the replica's bytes
//!    through (`super::proxy`).

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use sluice_engine::{EventStream, Request as EngineRequest, Resume, SamplingParams, SubmitError};
use sluice_models::Model;

use super::beam::{self, BeamRun};
use super::body::{parse_json, read_body};
use super::endpoint::Endpoint;
use super::gate::{Ask, Gate};
use super::generate::{self, Echoed, Generation, Head, Render};
use super::internal::{self, Internal, ResumeSpec};
use super::proxy::{self, Forward};
use super::resume::Resumption;
use super::scope::RequestScope;
use super::state::{AppState, RequestId};
use super::tools;
use super::types::*;
use super::validate::{self, Beam, Checked, Echo};
use crate::backend::{LocalBackend, Target};
use crate::error::ApiError;
use crate::router::dispatch::Routed;
use crate::router::queue::QueueClass;
use crate::router::Router;
use crate::tenants::Tenant;

/// Creates a chat completion (OpenAI's schema; SSE when `stream` is true).
#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatCompletionRequest,
    responses((status = 200, body = ChatCompletion), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 429, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
pub(super) async fn chat_completions(call: Call) -> Response {
    generation::<ChatCompletionRequest>(call).await
}

/// Creates a text completion (OpenAI's legacy schema; SSE when `stream` is true).
#[utoipa::path(post, path = "/v1/completions", request_body = CompletionRequest,
    responses((status = 200, body = Completion), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 429, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
pub(super) async fn completions(call: Call) -> Response {
    generation::<CompletionRequest>(call).await
}

/// What a generation handler is given: the shared state, the authenticated tenant, the
/// request id, and the request's headers and body.
pub(super) struct Call {
    s: Arc<AppState>,
    tenant: Arc<Tenant>,
    id: RequestId,
    headers: HeaderMap,
    body: Body,
}

impl FromRequest<Arc<AppState>> for Call {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &Arc<AppState>) -> Result<Self, ApiError> {
        let (mut parts, body) = req.into_parts();
        // Both are set by middleware on every authenticated route.
        let tenant = parts.extensions.remove::<Arc<Tenant>>();
        let id = parts.extensions.remove::<RequestId>();
        let (Some(tenant), Some(id)) = (tenant, id) else {
            tracing::error!("a generation route without the authentication middleware");
            return Err(ApiError::Internal);
        };
        Ok(Call {
            s: s.clone(),
            tenant,
            id,
            headers: parts.headers,
            body,
        })
    }
}

/// One request, parsed, checked and admitted, ready to run.
enum Started<R> {
    Local(LocalRun<R>),
    Remote(Box<(Routed, Option<Resumption>)>),
}

/// The engine's streams for an admitted local request, and how to render them; or the beam
/// search it runs instead.
struct LocalRun<R> {
    render: R,
    streams: Vec<EventStream>,
    n: usize,
    stream: bool,
    beam: Option<BeamRun>,
}

async fn generation<E: Endpoint>(call: Call) -> Response {
    let Call {
        s,
        tenant,
        id,
        headers,
        body,
    } = call;
    let mut scope = RequestScope::new(
        id.0.clone(),
        tenant.name.clone(),
        E::ROUTE,
        Instant::now(),
        s.metrics.clone(),
        s.in_flight.enter(),
    );
    match start::<E>(&s, &tenant, &id, &headers, body, &mut scope).await {
        Ok(Started::Local(run)) => run_local(&s, run, scope).await,
        Ok(Started::Remote(routed)) => proxy::pass(*routed, scope, &s),
        Err(e) => {
            scope.fail(&e);
            e.into_response()
        }
    }
}

/// Parse, resolve, check and gate: everything before the request runs.
async fn start<E: Endpoint>(
    s: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    id: &RequestId,
    headers: &HeaderMap,
    body: Body,
    scope: &mut RequestScope,
) -> Result<Started<E::Render>, ApiError> {
    s.check_draining()?;
    let bytes = read_body(s, headers, body).await?;
    let req: E = parse_json(&bytes)?;
    if s.log_prompts {
        req.log_prompt(&scope.id);
    }
    scope.deadline = internal::deadline(headers, tenant, scope.started())?;
    match s.resolve(req.model())? {
        Target::Local(backend) => {
            let internal = Internal::of(headers, &bytes)?;
            start_local(s, tenant, id, (req, internal), backend, scope)
                .await
                .map(Started::Local)
        }
        Target::Remote(router) => start_remote(s, tenant, headers, bytes, req, &router, scope)
            .await
            .map(|r| Started::Remote(Box::new(r))),
    }
}

async fn gate(
    s: &AppState,
    who: (&Arc<Tenant>, &str),
    ask: Ask,
    scope: &mut RequestScope,
) -> Result<(), ApiError> {
    let deadline = scope.deadline;
    let enter = Gate::enter(&s.limiter, &s.admission, scope, who, ask);
    let gate = match deadline {
        // Leaving the queue at the deadline drops the wait (and the place in the queue).
        Some(d) => tokio::time::timeout_at(d.into(), enter)
            .await
            .map_err(|_| ApiError::DeadlineExceeded { stage: "queue" })??,
        None => enter.await?,
    };
    scope.hold(gate);
    Ok(())
}

/// Checks and tokenises with the local model, gates, and submits to the engine.
async fn start_local<E: Endpoint>(
    s: &AppState,
    tenant: &Arc<Tenant>,
    id: &RequestId,
    (req, internal): (E, Internal),
    backend: Arc<LocalBackend>,
    scope: &mut RequestScope,
) -> Result<LocalRun<E::Render>, ApiError> {
    let model = backend.model();
    let (mut checked, prompt) = req.check(Some(model.config().vocab_size))?;
    let grammar = E::grammar(&prompt);
    let tool_calls = E::tool_calls(&prompt);
    validate::request_template_allowed(E::own_template(&prompt), s.trust_request_chat_template)?;
    let mut prompts = req.encode(prompt, model)?;
    checked.sampling.bad_words = validate::bad_word_ids(&checked.bad_words, model.tokenizer())?;
    if let Some(t) = checked.truncate {
        let max = backend.max_model_len();
        prompts = prompts
            .into_iter()
            .map(|p| t.apply(p, max))
            .collect::<Result<_, _>>()?;
    }
    validate::prompts_within(&prompts, s.max_prompt_tokens, E::PARAMS.prompt)?;
    let echo = checked
        .echo
        .map(|e| echoed(&req, &prompts, model, e))
        .transpose()?;
    let (prompts, resume) = resumed(prompts, &mut checked, internal.resume)?;
    // A continuation's client has had its echoed prompt: the text only moves offsets on.
    let (echo, had) = match &resume {
        Some((p, _)) => (None, echo.and_then(|e| e.prompts.into_iter().nth(*p))),
        None => (echo, None),
    };
    let resume = resume.map(|(_, r)| r);
    if checked.beam.is_some() && (grammar.is_some() || echo.is_some() || resume.is_some()) {
        return Err(ApiError::bad(
            "'use_beam_search' cannot be combined with a response format, tool calls or echo",
            "use_beam_search",
        ));
    }
    if let Some((grammar, param)) = grammar {
        checked.sampling.constraint = Some(tools::compile(&backend, grammar, param).await?);
    }
    // Fail on context length before spending any of the tenant's budget.
    let refused = |e| match checked.echo {
        Some(Echo::PromptOnly) => E::PARAMS.prompt_only_error(e),
        _ => E::PARAMS.submit_error(e),
    };
    let reserve =
        reservation(&checked.sampling, &prompts, backend.max_model_len()).map_err(refused)?;
    let prompt_tokens = prompts.iter().map(Vec::len).sum::<usize>() as u64;
    let ask = Ask {
        priority: checked.priority,
        reserve_tokens: reserve,
        prompt_tokens: Some(prompt_tokens),
        burst_tokens: None,
    };
    gate(s, (tenant, backend.model_id()), ask, scope).await?;
    let resumed = resume.as_ref().map(|r| r.output.clone());
    let (streams, beam) = match checked.beam {
        None => {
            let streams = submit(&backend, prompts, &checked, (scope.deadline, resume))
                .map_err(|e| E::PARAMS.submit_error(e))?;
            (streams, None)
        }
        Some(beam) => (
            Vec::new(),
            Some(beam_run::<E>(&backend, prompts, &checked, beam, scope)?),
        ),
    };
    let head = Head {
        id: format!("{}{}", E::ID_PREFIX, id.0),
        created: generate::unix_now(),
        model: backend.model_id().to_string(),
        logprobs: checked.sampling.logprobs.is_some(),
        include_usage: checked.include_usage,
        tokenizer: model.clone(),
        tool_calls,
        token_ids: internal.token_ids,
        resumed: resumed.is_some(),
        echo,
        ranked_prompt: checked.ranked_prompt,
        token_names_as_ids: checked.token_names_as_ids,
    };
    let n = checked.sampling.n;
    let mut render = E::Render::new(head, streams.len() * n);
    if let Some(output) = resumed {
        render.resumed(0, had.as_ref().map_or("", |(text, _)| text), &output);
    }
    Ok(LocalRun {
        render,
        streams,
        n,
        stream: checked.stream,
        beam,
    })
}

/// A beam search for `prompts`, each to its output budget.
fn beam_run<E: Endpoint>(
    backend: &Arc<LocalBackend>,
    prompts: Vec<Vec<u32>>,
    checked: &Checked,
    beam: Beam,
    scope: &RequestScope,
) -> Result<BeamRun, ApiError> {
    let max_len = backend.max_model_len();
    let max_tokens = prompts
        .iter()
        .map(|p| checked.sampling.budget(p.len(), max_len))
        .collect::<Result<_, _>>()
        .map_err(|e| E::PARAMS.submit_error(e))?;
    Ok(BeamRun {
        backend: backend.clone(),
        prompts,
        beam,
        max_tokens,
        priority: checked.priority,
        deadline: scope.deadline,
        params: E::PARAMS,
    })
}

/// Tokens to reserve: every prompt and the completions it may have (the engine's
/// context-length rule, which refuses what does not fit).
fn reservation(
    sampling: &SamplingParams,
    prompts: &[Vec<u32>],
    max_model_len: usize,
) -> Result<u64, SubmitError> {
    let mut total = 0;
    for p in prompts {
        total += p.len() + sampling.n * sampling.budget(p.len(), max_model_len)?;
    }
    Ok(total as u64)
}

/// Completions' `echo`: each prompt's text as sent, with its ids.
fn echoed<E: Endpoint>(
    req: &E,
    prompts: &[Vec<u32>],
    model: &Model,
    echo: Echo,
) -> Result<Echoed, ApiError> {
    let texts = req.prompt_texts(prompts, model)?;
    Ok(Echoed {
        prompts: texts.into_iter().zip(prompts.to_vec()).collect(),
        only: echo == Echo::PromptOnly,
    })
}

/// A continuation: the index of the prompt it continues, and where its choice stopped.
type Continuation = (usize, Resume);

/// A continuation's one prompt and choice: prompt `index / n` (returned beside it), choice
/// `index % n`, run as a request of one choice that resumes from `token_ids`.
fn resumed(
    mut prompts: Vec<Vec<u32>>,
    checked: &mut Checked,
    spec: Option<ResumeSpec>,
) -> Result<(Vec<Vec<u32>>, Option<Continuation>), ApiError> {
    let Some(spec) = spec else {
        return Ok((prompts, None));
    };
    let n = checked.sampling.n;
    let p = spec.index / n;
    if p >= prompts.len() {
        let message = format!("sluice_resume.index {} has no choice", spec.index);
        return Err(ApiError::bad(message, "sluice_resume"));
    }
    checked.sampling.n = 1;
    let resume = Resume {
        choice: spec.index % n,
        output: spec.token_ids,
    };
    Ok((vec![prompts.swap_remove(p)], Some((p, resume))))
}

fn submit(
    backend: &LocalBackend,
    prompts: Vec<Vec<u32>>,
    checked: &Checked,
    (deadline, resume): (Option<Instant>, Option<Resume>),
) -> Result<Vec<EventStream>, SubmitError> {
    prompts
        .into_iter()
        .map(|prompt| {
            backend.submit(EngineRequest {
                prompt,
                sampling: checked.sampling.clone(),
                priority: checked.priority,
                deadline,
                resume: resume.clone(),
            })
        })
        .collect()
}

async fn run_local<R: Render>(s: &AppState, run: LocalRun<R>, scope: RequestScope) -> Response {
    if let Some(beam) = run.beam {
        return beam::respond(run.render, beam, scope).await;
    }
    let g = Generation {
        render: run.render,
        streams: run.streams,
        n: run.n,
        deadline: s.limits.request_timeout,
        scope,
    };
    if run.stream {
        generate::stream(g)
    } else {
        generate::respond(g)
            .await
            .unwrap_or_else(IntoResponse::into_response)
    }
}

/// Checks what the gateway can without the model, gates, and sends the body to a replica.
async fn start_remote<E: Endpoint>(
    s: &AppState,
    tenant: &Arc<Tenant>,
    headers: &HeaderMap,
    body: Bytes,
    req: E,
    router: &Arc<Router>,
    scope: &mut RequestScope,
) -> Result<(Routed, Option<Resumption>), ApiError> {
    let (checked, prompt) = req.check(None)?;
    let routing = req.routing(&prompt);
    let sampling = &checked.sampling;
    let generated = sampling.max_tokens.unwrap_or(0) * sampling.n * routing.prompts;
    // The proxied prompt is not tokenised here: bytes / 4 estimates its tokens.
    let prompt_tokens = routing.prompt_bytes.div_ceil(4);
    let longest = routing.longest_prompt_bytes.div_ceil(4);
    // Past every replica's `--max-prompt-tokens` (or context) it will be refused: no prefill
    // for the autoscaler to size a fleet for, so it stays out of the per-second prompt sums.
    let refused = router
        .prompt_bound(req.model())
        .is_some_and(|bound| longest > bound);
    let ask = Ask {
        priority: checked.priority,
        reserve_tokens: (prompt_tokens + generated) as u64,
        // The answer is not parsed: the reservation stands as the request's cost.
        prompt_tokens: None,
        burst_tokens: (!refused).then_some(prompt_tokens as u64),
    };
    gate(s, (tenant, req.model()), ask, scope).await?;
    let forward = Forward {
        path: E::ROUTE,
        model: req.model().to_string(),
        affinity: &routing.affinity,
        request_id: &scope.id,
        class: QueueClass {
            priority: checked.priority,
            tenant: tenant.clone(),
        },
        deadline: scope.deadline,
        prompt_tokens: longest,
        stream: checked
            .stream
            .then_some((sampling.n, routing.prompts, checked.include_usage)),
    };
    proxy::forward(s, router, headers, body, forward).await
}
