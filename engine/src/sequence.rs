//! One choice of a request as the engine tracks it: its tokens, how many are in the KV cache,
//! its blocks, and the output path (sampler state, detokeniser, stop matcher).

use std::sync::Arc;
use std::time::Instant;

use sluice_models::tokenizer::Tokenizer;
use sluice_models::{Adjust, Pick};
use tokio::sync::mpsc::UnboundedSender;

use crate::block_manager::BlockHash;
use crate::constraint::ChoiceMatcher;
use crate::detokenizer::Detokenizer;
use crate::event::{Delta, Event, FinishReason, MatchedStop, PromptLogprobs, TokenLogprob};
use crate::request::SamplingParams;
use crate::sampler::SamplerState;
use crate::stop::StopMatcher;

/// What all choices of one request share.
#[derive(Debug)]
pub(crate) struct RequestInfo {
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub priority: i32,
    pub prompt_len: usize,
    pub arrival: Instant,
    /// Arrival order, for first-come-first-served within a priority.
    pub arrival_seq: u64,
    pub events: UnboundedSender<Event>,
    /// End-of-sequence ids that stop this request (empty with `ignore_eos`).
    pub eos: Vec<u32>,
    /// With `ignore_eos` and a grammar: the ids its mask allows once complete, kept out while
    /// the grammar allows anything else (so the output runs on where the grammar permits).
    pub grammar_eos: Vec<u32>,
    /// When the request must be done.
    pub deadline: Option<Instant>,
    /// Added to a choice's index for its random stream: a resumed choice keeps the stream of
    /// its index in the original request (0 otherwise).
    pub choice_base: usize,
}

/// A choice's timestamps, for the latency histograms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
}

#[derive(Debug)]
pub(crate) struct Seq {
    pub req: Arc<RequestInfo>,
    /// The choice index.
    pub index: usize,
    /// Prompt then output.
    pub tokens: Vec<u32>,
    /// Tokens whose K and V are in the cache.
    pub num_computed: usize,
    /// The block table: block `i` holds positions `i·B..(i+1)·B`.
    pub blocks: Vec<u32>,
    /// Hashes of the leading full, computed blocks (registered in the prefix cache).
    pub hashes: Vec<BlockHash>,
    /// Order of admission to the running set (the newest is preempted first).
    pub admitted: u64,
    /// Prompt tokens that came from the prefix cache at first admission.
    pub cached_prompt: Option<usize>,
    /// Choices still to fork from this one when its prompt is done (choice 0 of n > 1).
    pub forks_left: usize,
    pub sampler: SamplerState,
    /// The choice's position in its grammar, when the request has one. It lives with the
    /// choice, so preemption (which recomputes the KV cache, not the output) leaves it as is.
    pub matcher: Option<ChoiceMatcher>,
    /// While the request's prompt log-probabilities are gathered (choice 0 only): entry `j`
    /// is token `j + 1`'s under the tokens before it. Taken when sent.
    prompt_logprobs: Option<PromptLogprobs>,
    detok: Detokenizer,
    stop: StopMatcher,
    /// Output tokens whose text has not been released yet, with their log-probabilities.
    pending_ids: Vec<u32>,
    pending_logprobs: Vec<TokenLogprob>,
    /// Replaying output the caller already has: nothing is sent.
    muted: bool,
    pub timing: Timing,
}

/// How a choice ended.
#[derive(Debug)]
pub(crate) struct Ended {
    pub reason: FinishReason,
    pub matched: Option<MatchedStop>,
}

impl Seq {
    pub fn new(req: Arc<RequestInfo>, index: usize, tokens: Vec<u32>) -> Self {
        let p = &req.params;
        let sampler = SamplerState::new(p.seed, index + req.choice_base, &tokens[..req.prompt_len]);
        let detok = Detokenizer::new(p.skip_special_tokens);
        let stop = StopMatcher::new(p.stop.clone(), p.include_stop_str);
        let forks_left = if index == 0 { p.n - 1 } else { 0 };
        let matcher = p.constraint.as_ref().map(|c| c.start());
        let prompt_logprobs = (index == 0 && p.prompt_logprobs.is_some()).then(|| PromptLogprobs {
            logprobs: Vec::new(),
            ranks: Vec::new(),
        });
        Self {
            req,
            index,
            tokens,
            num_computed: 0,
            blocks: Vec::new(),
            hashes: Vec::new(),
            admitted: 0,
            cached_prompt: None,
            forks_left,
            sampler,
            matcher,
            prompt_logprobs,
            detok,
            stop,
            pending_ids: Vec::new(),
            pending_logprobs: Vec::new(),
            muted: false,
            timing: Timing {
                first_scheduled: None,
                first_token: None,
                last_token: None,
            },
        }
    }

    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.req.prompt_len
    }

    /// Tokens still to feed before the next sample (1 for a decode).
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// The first position whose row of logits the prompt's log-probabilities still need (row
    /// `p` gives token `p + 1`'s), while some are missing. The prefix cache may supply only
    /// positions before it.
    pub fn prompt_rows_from(&self) -> Option<usize> {
        let found = self.prompt_logprobs.as_ref()?.logprobs.len();
        (found + 1 < self.req.prompt_len).then_some(found)
    }

    /// Gathers the prompt log-probabilities a step's rows give (`row(j)`: position `start +
    /// j`'s, for `j < n`) and sends them once all are found, before any output: a prompt of
    /// one token has none to find and sends an empty list on its first step.
    pub fn gather_prompt_logprobs<'a>(
        &mut self,
        (start, n): (usize, usize),
        row: impl Fn(usize) -> &'a [f32],
    ) {
        let (prompt_len, k) = (
            self.req.prompt_len,
            self.req.params.prompt_logprobs.unwrap_or(0),
        );
        let Some(found) = self.prompt_logprobs.as_mut() else {
            return;
        };
        let mut p = found.logprobs.len();
        while p + 1 < prompt_len && (start..start + n).contains(&p) {
            let (r, token) = (row(p - start), self.tokens[p + 1]);
            found.logprobs.push(crate::sampler::logprob_of(r, token, k));
            found.ranks.push(sluice_models::logits::rank_of(r, token));
            p += 1;
        }
        if p + 1 >= prompt_len {
            let found = self.prompt_logprobs.take().expect("gathering");
            if !self.muted {
                let _ = self.req.events.send(Event::Prompt(found));
            }
        }
    }

    /// The token the model may choose on its device for the next draw, over the ids below
    /// `below` ([`crate::sampler::device_pick`]), when the draw reads nothing else of its row:
    /// no grammar and no choices to fork from the row. With it, when `changes` asks (a model
    /// that picks on its device), what the request's bias and penalties and the tokens held
    /// back until `min_tokens` change in the row first ([`crate::sampler::adjustment`]).
    pub fn device_pick(&self, below: u32, changes: bool) -> Option<(Pick, Option<Adjust>)> {
        if self.matcher.is_some() || self.forks_left > 0 {
            return None;
        }
        let (p, state, suppress) = (&self.req.params, &self.sampler, self.suppressed());
        let pick = crate::sampler::device_pick(p, state, &suppress, below)?;
        let adjust = changes
            .then(|| crate::sampler::adjustment(p, state, &suppress))
            .flatten();
        Some((pick, adjust))
    }

    /// Tokens that must not be sampled now: until `min_tokens` exist, the end-of-sequence
    /// and stop tokens; the token that would complete a bad word.
    pub fn suppressed(&self) -> Vec<u32> {
        let p = &self.req.params;
        let mut s = if self.matcher.is_some() {
            self.req.grammar_eos.clone()
        } else {
            Vec::new()
        };
        if self.output_len() < p.min_tokens {
            s.extend_from_slice(&self.req.eos);
            s.extend_from_slice(&p.stop_token_ids);
        }
        let output = &self.tokens[self.req.prompt_len..];
        for word in &p.bad_words {
            if let Some((&last, rest)) = word.split_last() {
                if output.ends_with(rest) {
                    s.push(last);
                }
            }
        }
        s
    }

    /// Appends a sampled token, streams the text it releases, and says whether the choice
    /// ended.
    pub fn append(
        &mut self,
        tok: &Tokenizer,
        token: u32,
        logprob: Option<TokenLogprob>,
    ) -> Option<Ended> {
        self.tokens.push(token);
        self.sampler.push(token);
        let p = &self.req.params;
        let stop_token = self.req.eos.contains(&token) || p.stop_token_ids.contains(&token);
        if stop_token {
            // Not part of the text (vLLM's and OpenAI's behaviour). Before `min_tokens` these
            // tokens are suppressed, so they cannot arrive here early.
            self.flush_text(tok);
            return Some(Ended {
                reason: FinishReason::Stop,
                matched: Some(MatchedStop::Token(token)),
            });
        }
        self.pending_ids.push(token);
        self.pending_logprobs.extend(logprob);
        let text = match self.detok.push(tok, token) {
            Ok(t) => t,
            Err(e) => {
                return Some(Ended {
                    reason: FinishReason::Error(format!("detokenising: {e}")),
                    matched: None,
                })
            }
        };
        if !text.is_empty() {
            // Stop strings apply once `min_tokens` exist.
            let m = if self.output_len() >= p.min_tokens {
                self.stop.push(&text)
            } else {
                crate::stop::Matched {
                    emit: self.stop.flush() + &text,
                    stop: None,
                }
            };
            if let Some(s) = m.stop {
                self.emit(m.emit, true);
                return Some(Ended {
                    reason: FinishReason::Stop,
                    matched: Some(MatchedStop::Text(s)),
                });
            }
            self.emit(m.emit, false);
        }
        if self.output_len() >= self.req.max_tokens {
            self.flush_text(tok);
            return Some(Ended {
                reason: FinishReason::Length,
                matched: None,
            });
        }
        None
    }

    /// Replays output generated before (a resumed choice) as if it had been sampled here,
    /// sending nothing: the sampler's penalties and position, the grammar, the detokeniser
    /// and the stop matcher end up as in the uninterrupted run, so text held back there (a
    /// split character, a possible stop string) is held back here. Returns the end when the
    /// output already ends the choice.
    pub fn replay(&mut self, tok: &Tokenizer, output: &[u32]) -> Option<Ended> {
        self.muted = true;
        let mut end = None;
        for &t in output {
            let complete = match self.matcher.as_mut().map(|m| m.consume(t)) {
                Some(Err(e)) => {
                    end = Some(Ended {
                        reason: FinishReason::Grammar(e),
                        matched: None,
                    });
                    break;
                }
                Some(Ok(complete)) => complete,
                None => false,
            };
            end = self.append(tok, t, None);
            self.sampler.skip();
            if end.is_none() && complete {
                end = Some(self.grammar_done(tok));
            }
            if end.is_some() {
                break;
            }
        }
        self.muted = false;
        end
    }

    /// Ends the choice because its grammar is complete (a stop, like an end-of-sequence
    /// token), releasing the text held back.
    pub fn grammar_done(&mut self, tok: &Tokenizer) -> Ended {
        self.flush_text(tok);
        Ended {
            reason: FinishReason::Stop,
            matched: None,
        }
    }

    /// Releases everything held back (generation ended for a reason other than a stop
    /// string).
    fn flush_text(&mut self, tok: &Tokenizer) {
        let tail = self.detok.flush(tok).unwrap_or_default();
        let text = self.stop.flush() + &tail;
        self.emit(text, true);
    }

    /// Sends text with the tokens waiting for it. Empty text waits, unless `last`.
    fn emit(&mut self, text: String, last: bool) {
        // Tokens without text (a trailing special token) still go out with the last delta.
        if text.is_empty() && (!last || self.pending_ids.is_empty()) {
            return;
        }
        let delta = Delta {
            index: self.index,
            text,
            token_ids: std::mem::take(&mut self.pending_ids),
            logprobs: std::mem::take(&mut self.pending_logprobs),
        };
        if self.muted {
            return;
        }
        // A closed stream is noticed (and the choice aborted) at the next step.
        let _ = self.req.events.send(Event::Delta(delta));
    }
}
