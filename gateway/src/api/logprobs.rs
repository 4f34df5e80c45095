//! Log-probabilities in the response shapes: chat's `logprobs.content`, the legacy
//! completions lists (with an echoed prompt's tokens), and vLLM's `prompt_logprobs`.

use std::collections::HashMap;

use sluice_engine::{PromptLogprobs, TokenLogprob};
use sluice_models::tokenizer::Tokenizer;

use crate::api::types::{
    ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, RankedLogprob, TopLogprobOut,
};

pub fn piece(tok: &Tokenizer, id: u32) -> String {
    tok.token_to_piece(id).unwrap_or_default()
}

pub fn chat_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> ChatLogprobs {
    ChatLogprobs {
        content: lps
            .iter()
            .map(|lp| {
                let token = piece(tok, lp.token);
                ChatTokenLogprob {
                    bytes: tok.token_bytes(lp.token).0,
                    token,
                    logprob: lp.logprob,
                    top_logprobs: lp
                        .top
                        .iter()
                        .map(|&(id, l)| {
                            let t = piece(tok, id);
                            TopLogprobOut {
                                bytes: tok.token_bytes(id).0,
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
pub fn completion_logprobs(
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
        out.token_logprobs.push(Some(lp.logprob));
        out.top_logprobs.push(Some(top_pieces(tok, lp)));
    }
}

/// An echoed prompt's tokens in the completions logprobs shape: the first has no
/// log-probability (nothing comes before it), the others `lps`' (the engine's, from the
/// second token on). Offsets run over the tokens' text from 0.
pub fn echoed_prompt(
    tok: &Tokenizer,
    ids: &[u32],
    lps: &[TokenLogprob],
    out: &mut CompletionLogprobs,
) {
    let mut offset = 0;
    for (j, &id) in ids.iter().enumerate() {
        let t = piece(tok, id);
        out.text_offset.push(offset);
        offset += t.len();
        out.tokens.push(t);
        let lp = j.checked_sub(1).and_then(|k| lps.get(k));
        out.token_logprobs.push(lp.map(|lp| lp.logprob));
        out.top_logprobs.push(lp.map(|lp| top_pieces(tok, lp)));
    }
}

/// A token's alternatives by their text.
fn top_pieces(tok: &Tokenizer, lp: &TokenLogprob) -> HashMap<String, f32> {
    lp.top.iter().map(|&(id, l)| (piece(tok, id), l)).collect()
}

/// vLLM's `prompt_logprobs`: `null` for the first prompt token (nothing comes before it),
/// then per token a map from token id to its log-probability, rank and text, holding the
/// token itself and its position's `k` most likely.
pub fn ranked_prompt(
    tok: &Tokenizer,
    p: &PromptLogprobs,
    k: usize,
) -> Vec<Option<HashMap<String, RankedLogprob>>> {
    let ranked = |id: u32, logprob: f32, rank: u32| {
        let out = RankedLogprob {
            logprob,
            rank,
            decoded_token: piece(tok, id),
        };
        (id.to_string(), out)
    };
    let positions = p.logprobs.iter().zip(&p.ranks).map(|(lp, &rank)| {
        let top = lp.top.iter().take(k).zip(1..);
        let mut m: HashMap<_, _> = top.map(|(&(id, l), r)| ranked(id, l, r)).collect();
        // The token's own rank wins over its place in the list (they differ only on ties).
        let (id, own) = ranked(lp.token, lp.logprob, rank);
        m.insert(id, own);
        Some(m)
    });
    std::iter::once(None).chain(positions).collect()
}
