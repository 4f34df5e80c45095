//! Log-probabilities in the response shapes: chat's `logprobs.content`, the legacy
//! completions lists (with an echoed prompt's tokens), and vLLM's `prompt_logprobs`.

use std::collections::HashMap;

use sluice_engine::{PromptLogprobs, TokenLogprob};
use sluice_models::tokenizer::Tokenizer;

use crate::api::types::{
    ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, RankedLogprob, TopLogprobOut,
};

/// A token's text (its piece of the output), whatever the request asked its name to be.
pub fn piece(tok: &Tokenizer, id: u32) -> String {
    tok.token_to_piece(id).unwrap_or_default()
}

/// How log-probabilities name tokens: by their text, or with vLLM's
/// `return_tokens_as_token_ids` as `token_id:<id>` (exact where a piece of text is not: a
/// token that is part of a character, or two tokens with the same text).
#[derive(Clone, Copy)]
pub struct Names<'a> {
    pub tok: &'a Tokenizer,
    pub ids: bool,
}

impl Names<'_> {
    fn name(&self, id: u32) -> String {
        match self.ids {
            true => format!("token_id:{id}"),
            false => piece(self.tok, id),
        }
    }

    /// The name's UTF-8 bytes; by text, the token's own bytes (a part of a character
    /// included), as OpenAI's `bytes`.
    fn bytes(&self, id: u32, name: &str) -> Vec<u8> {
        match self.ids {
            true => name.as_bytes().to_vec(),
            false => self.tok.token_bytes(id).0,
        }
    }

    /// A token's alternatives by name.
    fn top(&self, lp: &TokenLogprob) -> HashMap<String, f32> {
        lp.top.iter().map(|&(id, l)| (self.name(id), l)).collect()
    }
}

pub fn chat_logprobs(names: Names<'_>, lps: &[TokenLogprob]) -> ChatLogprobs {
    let out = |id: u32, logprob: f32| {
        let token = names.name(id);
        TopLogprobOut {
            bytes: names.bytes(id, &token),
            token,
            logprob,
        }
    };
    let content = lps.iter().map(|lp| {
        let own = out(lp.token, lp.logprob);
        ChatTokenLogprob {
            token: own.token,
            bytes: own.bytes,
            logprob: lp.logprob,
            top_logprobs: lp.top.iter().map(|&(id, l)| out(id, l)).collect(),
        }
    });
    ChatLogprobs {
        content: content.collect(),
    }
}

/// Appends tokens to the completions logprobs shape; `offset` is the text length so far.
pub fn completion_logprobs(
    names: Names<'_>,
    lps: &[TokenLogprob],
    offset: &mut usize,
    out: &mut CompletionLogprobs,
) {
    for lp in lps {
        out.text_offset.push(*offset);
        *offset += piece(names.tok, lp.token).len();
        out.tokens.push(names.name(lp.token));
        out.token_logprobs.push(Some(lp.logprob));
        out.top_logprobs.push(Some(names.top(lp)));
    }
}

/// An echoed prompt's tokens in the completions logprobs shape: the first has no
/// log-probability (nothing comes before it), the others `lps`' (the engine's, from the
/// second token on). Offsets run over the tokens' text from 0.
pub fn echoed_prompt(
    names: Names<'_>,
    ids: &[u32],
    lps: &[TokenLogprob],
    out: &mut CompletionLogprobs,
) {
    let mut offset = 0;
    for (j, &id) in ids.iter().enumerate() {
        out.text_offset.push(offset);
        offset += piece(names.tok, id).len();
        out.tokens.push(names.name(id));
        let lp = j.checked_sub(1).and_then(|k| lps.get(k));
        out.token_logprobs.push(lp.map(|lp| lp.logprob));
        out.top_logprobs.push(lp.map(|lp| names.top(lp)));
    }
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
