//! Beam search (vLLM's `use_beam_search`), run over the engine one token at a time, as vLLM's
//! server runs it: each step asks every live beam's next-token candidates (a one-token
//! request with twice the width of alternatives; the prefix cache holds what the beams
//! share), extends the beams by them, and keeps the best `width`; a candidate that ends the
//! sequence finishes its beam. The `width` best of the finished and the live are the answer.
//!
//! Scores are vLLM's: the cumulative log-probability over the sequence's length (prompt
//! included, a final end-of-sequence token not) to the power `length_penalty`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use axum::response::{IntoResponse, Response};
use sluice_engine::{Event, FinishReason, Request, SamplingParams, TokenLogprob, Usage};

use crate::api::generate::{usage_out, Acc, Render};
use crate::api::scope::RequestScope;
use crate::api::validate::Beam;
use crate::backend::LocalBackend;
use crate::error::{ApiError, Params};

/// One beam: its tokens (prompt then output) and their summed log-probability.
#[derive(Debug, Clone)]
struct Hypothesis {
    tokens: Vec<u32>,
    logprob: f64,
    /// Ended by an end-of-sequence token (which `tokens` holds last).
    ended: bool,
}

impl Hypothesis {
    fn score(&self, length_penalty: f64) -> f64 {
        let len = self.tokens.len() - usize::from(self.ended);
        self.logprob / (len as f64).powf(length_penalty)
    }
}

/// A beam search to run for an admitted request: its prompts and how the steps go.
#[derive(Debug)]
pub struct BeamRun {
    pub backend: Arc<LocalBackend>,
    pub prompts: Vec<Vec<u32>>,
    pub beam: Beam,
    /// Each prompt's most output tokens.
    pub max_tokens: Vec<usize>,
    pub priority: i32,
    pub deadline: Option<Instant>,
    pub params: Params,
}

/// Runs the searches and answers with one JSON body: `width` choices a prompt, best first.
pub async fn respond<R: Render>(render: R, run: BeamRun, mut scope: RequestScope) -> Response {
    match search_all(&run).await {
        Ok((answers, completion_tokens)) => {
            let prompt_tokens = run.prompts.iter().map(Vec::len).sum();
            scope.first_token();
            scope.succeed(completion_tokens, prompt_tokens);
            let usage = usage_out(&Usage {
                prompt_tokens,
                completion_tokens,
                cached_prompt_tokens: 0,
            });
            render.body(answers, usage)
        }
        Err(e) => {
            scope.fail(&e);
            e.into_response()
        }
    }
}

/// Every prompt's search: the answers as the renderers take them, and the output tokens
/// they hold.
async fn search_all(run: &BeamRun) -> Result<(Vec<Acc>, usize), ApiError> {
    let tok = run.backend.model().tokenizer();
    let eos: BTreeSet<u32> = tok.eos_ids().clone();
    let mut answers = Vec::new();
    let mut completion_tokens = 0;
    for (prompt, &max_tokens) in run.prompts.iter().zip(&run.max_tokens) {
        let prompt_len = prompt.len();
        for h in search(run, prompt.clone(), max_tokens, &eos).await? {
            let output = &h.tokens[prompt_len..h.tokens.len() - usize::from(h.ended)];
            completion_tokens += h.tokens.len() - prompt_len;
            let text = tok.decode(output, true).map_err(|e| {
                tracing::error!("decoding a beam: {e}");
                ApiError::Internal
            })?;
            answers.push(Acc {
                text,
                finish: Some(match h.ended {
                    true => FinishReason::Stop,
                    false => FinishReason::Length,
                }),
                ..Acc::default()
            });
        }
    }
    Ok((answers, completion_tokens))
}

/// One prompt's beam search: the `width` best hypotheses, best first.
async fn search(
    run: &BeamRun,
    prompt: Vec<u32>,
    max_tokens: usize,
    eos: &BTreeSet<u32>,
) -> Result<Vec<Hypothesis>, ApiError> {
    let beam = run.beam;
    let by_score = |a: &Hypothesis, b: &Hypothesis| {
        let p = beam.length_penalty;
        b.score(p).total_cmp(&a.score(p))
    };
    let mut live = vec![Hypothesis {
        tokens: prompt,
        logprob: 0.0,
        ended: false,
    }];
    let mut done: Vec<Hypothesis> = Vec::new();
    for _ in 0..max_tokens {
        let mut next = Vec::new();
        for (h, candidates) in live.iter().zip(candidates(run, &live).await?) {
            for (token, logprob) in candidates.top {
                let mut grown = h.clone();
                grown.tokens.push(token);
                grown.logprob += f64::from(logprob);
                grown.ended = eos.contains(&token);
                match grown.ended {
                    true => done.push(grown),
                    false => next.push(grown),
                }
            }
        }
        next.sort_by(by_score);
        next.truncate(beam.width);
        live = next;
        if live.is_empty() {
            break;
        }
    }
    done.extend(live);
    done.sort_by(by_score);
    done.truncate(beam.width);
    Ok(done)
}

/// Each live beam's next-token candidates: its `2 × width` most likely, from a one-token
/// request per beam, all in the engine at once.
async fn candidates(run: &BeamRun, live: &[Hypothesis]) -> Result<Vec<TokenLogprob>, ApiError> {
    let mut sampling = SamplingParams::greedy(1);
    sampling.logprobs = Some(2 * run.beam.width);
    // The candidates are read from the alternatives: an end-of-sequence token is one of them.
    sampling.ignore_eos = true;
    let streams = live
        .iter()
        .map(|h| {
            run.backend.submit(Request {
                prompt: h.tokens.clone(),
                sampling: sampling.clone(),
                priority: run.priority,
                deadline: run.deadline,
                resume: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| run.params.submit_error(e))?;
    let mut out = Vec::with_capacity(streams.len());
    for mut s in streams {
        let mut found = None;
        while let Some(ev) = s.next_event().await {
            match ev {
                Event::Delta(d) => found = found.or(d.logprobs.into_iter().next()),
                Event::Finish(f) => match f.reason {
                    FinishReason::Length => break,
                    FinishReason::Deadline(stage) => {
                        return Err(ApiError::DeadlineExceeded {
                            stage: stage.as_str(),
                        })
                    }
                    other => {
                        tracing::error!("a beam's step ended {other:?}");
                        return Err(ApiError::Internal);
                    }
                },
                Event::Prompt(_) => {}
            }
        }
        out.push(found.ok_or(ApiError::Internal)?);
    }
    Ok(out)
}
