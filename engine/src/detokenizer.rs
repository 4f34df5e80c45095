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
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// The default model's tokenizer (byte-level BPE, which splits multi-byte characters).
    fn tokenizer() -> Tokenizer {
        let dir = std::env::var_os("SLUICE_MODEL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/cache"));
        let loc =
            sluice_models::registry::resolve(sluice_models::registry::default_model().name, &dir)
                .expect("the default model is cached (make model)");
        let file = sluice_models::gguf::GgufFile::open(&loc.path).unwrap();
        Tokenizer::from_gguf(file.content()).unwrap()
    }

    /// Feeds `ids` one by one and returns the deltas, flush included.
    fn deltas(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
        let mut d = Detokenizer::new(true);
        let mut out: Vec<String> = ids.iter().map(|&i| d.push(tok, i).unwrap()).collect();
        out.push(d.flush(tok).unwrap());
        out
    }

    #[test]
    fn multibyte_characters_are_held_until_whole() {
        let tok = tokenizer();
        for text in [
            "plain ascii words",
            "crab 🦀 and 🦀🦀, 日本語のテキスト, café, naïve ✓ — done",
            "👩‍👩‍👧 family emoji and 🇫🇷 flag",
            "\u{1F600}\u{1F601} ключ 한국어",
        ] {
            let ids = tok.encode(text, false).unwrap();
            let d = deltas(&tok, &ids);
            assert_eq!(d.concat(), tok.decode(&ids, true).unwrap(), "{text}");
            assert_eq!(d.concat(), text);
            for piece in &d {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "{text}: broken delta {piece:?}"
                );
            }
            if text.chars().any(|c| c.len_utf8() > 2) {
                assert!(
                    d.iter().any(String::is_empty),
                    "{text}: something was held back"
                );
            }
        }
    }

    #[test]
    fn an_incomplete_character_at_the_end_is_flushed_as_the_whole_decodes_it() {
        let tok = tokenizer();
        let ids = tok.encode("ok 🦀", false).unwrap();
        // Drop the last byte token: the crab is incomplete.
        let cut = &ids[..ids.len() - 1];
        let d = deltas(&tok, cut);
        assert_eq!(d.concat(), tok.decode(cut, true).unwrap());
        assert!(d.last().unwrap().contains('\u{FFFD}'));
    }
}
