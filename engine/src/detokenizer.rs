//! Incremental detokenisation: text for each new token as soon as it is whole.
//!
//! Decoding token by token breaks characters that span tokens (byte-level BPE splits emoji and
//! CJK into byte tokens). Each step decodes a short window — the tokens since the last
//! emitted text plus a few before them for context — and emits the new text only when it does
//! not end in U+FFFD, the replacement for an incomplete character. The window's start moves on
//! only after a complete emission, so text never starts inside a character either.

use sluice_models::tokenizer::Tokenizer;
use sluice_models::ModelError;

#[derive(Debug)]
pub(crate) struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the decode window (context whose text was already emitted).
    prefix: usize,
    /// End of the text already emitted.
    read: usize,
    /// Bytes emitted so far.
    emitted: usize,
    skip_special: bool,
}

impl Detokenizer {
    pub fn new(skip_special: bool) -> Self {
        Self {
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            emitted: 0,
            skip_special,
        }
    }

    /// Adds a token and returns the text it completes (often empty while a character is
    /// incomplete).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, ModelError> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let now = tok.decode(&self.ids[self.prefix..], self.skip_special)?;
        if now.len() <= before.len() || !now.starts_with(&before) || now.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let delta = now[before.len()..].to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        self.emitted += delta.len();
        Ok(delta)
    }

    /// The text not yet emitted, at the end of generation: whatever the whole output decodes
    /// to past what was emitted (an incomplete character comes out as U+FFFD, as in the
    /// whole).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, ModelError> {
        let whole = tok.decode(&self.ids, self.skip_special)?;
        let rest = match whole.get(self.emitted..) {
            Some(r) => r.to_string(),
            None => String::new(),
        };
        self.emitted += rest.len();
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(rest)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Feeds `ids` one by one and returns the deltas, flush included.
    pub fn deltas(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
        let mut d = Detokenizer::new(true);
        let mut out: Vec<String> = ids.iter().map(|&i| d.push(tok, i).unwrap()).collect();
        out.push(d.flush(tok).unwrap());
        out
    }
}
