//! `--tokenizer FILE`: a local tokenizer for prompt lengths when the server has no `/tokenize`
//! (or `--no-tokenize` says not to ask it), so runs against llama.cpp, TGI or an offline
//! replay still send prompts of exactly the requested length.
//!
//! Two formats: a Hugging Face `tokenizer.json` (loaded whole by the `tokenizers` crate), or a
//! `.gguf` model file, whose `tokenizer.ggml.*` metadata is read by [`crate::gguf`] and rebuilt
//! as a byte-level BPE. Only `tokenizer.ggml.model = "gpt2"` (byte-level BPE: GPT-2, Llama 3,
//! SmolLM, Qwen2 and kin) can be rebuilt; other models (SentencePiece `llama`, `bert`, ...) are
//! an error naming the model, since a different algorithm would count differently.
//!
//! The pre-tokenizer (how text is cut into words before BPE) follows `tokenizer.ggml.pre` for
//! the families listed in [`PreTokenizer::from_name`]; another name falls back to the GPT-2
//! rules and [`LocalTokenizer::describe`] says so. For the load tester's filler prompts (runs of
//! space-led lowercase words) every family cuts identically, so only free text (ShareGPT) could
//! count a token or two differently in that case.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::gguf::{self, Value};

/// The GPT-2 word regex (contractions, letter runs, digit runs, other runs, spaces).
const GPT2_WORDS: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// The Llama 3 word regex: case-insensitive contractions, a letter run with at most one
/// leading non-letter, digits in groups of up to three, newlines kept apart.
const LLAMA3_WORDS: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2: the Llama 3 rules with every digit its own word.
const QWEN2_WORDS: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Word-splitting rules of the byte-level BPE families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreTokenizer {
    Gpt2,
    /// Each digit alone, then GPT-2 (SmolLM, StarCoder).
    DigitsThenGpt2,
    /// Llama 3; `whole_words`: a word found whole in the vocabulary is one token.
    Llama3 {
        whole_words: bool,
    },
    Qwen2,
}

impl PreTokenizer {
    /// The family of a `tokenizer.ggml.pre` name; `None` for names not listed here.
    fn from_name(pre: &str) -> Option<Self> {
        Some(match pre {
            "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" => Self::DigitsThenGpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
                Self::Llama3 { whole_words: true }
            }
            "dbrx" | "smaug-bpe" => Self::Llama3 { whole_words: false },
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" => Self::Qwen2,
            _ => return None,
        })
    }

    fn build(self) -> std::result::Result<PreTokenizerWrapper, String> {
        let regex_then_bytes = |re: &str| -> std::result::Result<PreTokenizerWrapper, String> {
            let split = Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| format!("pre-tokenizer regex: {e}"))?;
            Ok(Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into())
        };
        Ok(match self {
            Self::Gpt2 => regex_then_bytes(GPT2_WORDS)?,
            Self::DigitsThenGpt2 => Sequence::new(vec![
                Digits::new(true).into(),
                regex_then_bytes(GPT2_WORDS)?,
            ])
            .into(),
            Self::Llama3 { .. } => regex_then_bytes(LLAMA3_WORDS)?,
            Self::Qwen2 => regex_then_bytes(QWEN2_WORDS)?,
        })
    }
}

/// A tokenizer read from a local file, used only to count tokens.
#[derive(Debug)]
pub struct LocalTokenizer {
    tok: tokenizers::Tokenizer,
    /// Tokens added to every text (a GGUF's BOS); `tokenizer.json` adds its own in `encode`.
    added: usize,
    describe: String,
}

impl LocalTokenizer {
    /// Loads `path`: a GGUF file (recognised by its magic bytes) or a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let read_err = |source| Error::Read {
            path: path.to_owned(),
            source,
        };
        let mut magic = [0u8; 4];
        let n = std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut magic))
            .map_err(read_err)?;
        if n == 4 && &magic == b"GGUF" {
            Self::from_gguf_metadata(&gguf::read_metadata(path)?, path)
        } else {
            let tok = tokenizers::Tokenizer::from_file(path)
                .map_err(|e| tok_err(path, format!("not a tokenizer.json or GGUF file: {e}")))?;
            Ok(Self {
                tok,
                added: 0,
                describe: format!("local tokenizer.json {}", path.display()),
            })
        }
    }

    /// Rebuilds the byte-level BPE a GGUF file's metadata describes.
    pub fn from_gguf_metadata(md: &HashMap<String, Value>, path: &Path) -> Result<Self> {
        let bad = |reason: String| tok_err(path, reason);
        let get_str = |key: &str| md.get(key).and_then(Value::as_str);
        let model = get_str("tokenizer.ggml.model")
            .ok_or_else(|| bad("no tokenizer.ggml.model in the GGUF metadata".into()))?;
        if model != "gpt2" {
            return Err(bad(format!(
                "tokenizer.ggml.model = \"{model}\": only byte-level BPE (\"gpt2\") vocabularies \
                 are rebuilt; give a tokenizer.json instead"
            )));
        }
        let strings = |key: &str| -> Result<Vec<&str>> {
            md.get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("no {key} array in the GGUF metadata")))?
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| bad(format!("{key} has a non-string")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        // Later duplicates win, as a plain id lookup table would have it.
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let merges = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                // Byte-level symbols never hold a literal space, so the first one separates.
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| bad(format!("merge {m:?} has no space")))
            })
            .collect::<Result<Vec<_>>>()?;
        let pre_name = get_str("tokenizer.ggml.pre").unwrap_or("gpt2");
        let (pre, known) = match PreTokenizer::from_name(pre_name) {
            Some(p) => (p, true),
            None => (PreTokenizer::Gpt2, false),
        };
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(matches!(pre, PreTokenizer::Llama3 { whole_words: true }))
            .build()
            .map_err(|e| bad(format!("building the BPE: {e}")))?;
        let mut tok = tokenizers::Tokenizer::new(bpe);
        tok.with_pre_tokenizer(Some(pre.build().map_err(bad)?));
        let add_bos = md
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(matches!(pre, PreTokenizer::Llama3 { whole_words: true }))
            && md.contains_key("tokenizer.ggml.bos_token_id");
        let describe = format!(
            "local GGUF tokenizer {} (byte-level BPE, {} tokens, pre-tokenizer {}{})",
            path.display(),
            tokens.len(),
            pre_name,
            if known {
                String::new()
            } else {
                " not known here: GPT-2 word rules used, free text may count slightly off".into()
            }
        );
        Ok(Self {
            tok,
            added: usize::from(add_bos),
            describe,
        })
    }

    /// Token ids of `text`, without anything added (no BOS).
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, String> {
        self.tok
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// Tokens a server would see for `text` as a prompt, BOS and the like included.
    pub fn count(&self, text: &str) -> std::result::Result<usize, String> {
        let enc = self
            .tok
            .encode_fast(text, true)
            .map_err(|e| e.to_string())?;
        Ok(enc.len() + self.added)
    }

    /// What was loaded, for the report.
    pub fn describe(&self) -> &str {
        &self.describe
    }
}

fn tok_err(path: &Path, reason: String) -> Error {
    Error::Tokenizer {
        path: PathBuf::from(path),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tests::{encode, str_array, str_bytes};

    fn tiny(model: &str, pre: &str) -> Vec<u8> {
        encode(&[
            ("tokenizer.ggml.model", 8, str_bytes(model)),
            ("tokenizer.ggml.pre", 8, str_bytes(pre)),
            (
                "tokenizer.ggml.tokens",
                9,
                str_array(&["a", "b", "Ġ", "1", "2", "ab", "Ġab"]),
            ),
            ("tokenizer.ggml.merges", 9, str_array(&["a b", "Ġ ab"])),
            (
                "tokenizer.ggml.bos_token_id",
                4,
                0u32.to_le_bytes().to_vec(),
            ),
            ("tokenizer.ggml.add_bos_token", 7, vec![1]),
        ])
    }

    fn load_bytes(bytes: &[u8]) -> Result<LocalTokenizer> {
        let md = gguf::read_metadata_from(bytes, Path::new("tiny.gguf"))?;
        LocalTokenizer::from_gguf_metadata(&md, Path::new("tiny.gguf"))
    }

    #[test]
    fn tiny_gguf_bpe_merges_splits_digits_and_adds_bos() {
        let t = load_bytes(&tiny("gpt2", "smollm")).unwrap();
        assert_eq!(t.encode("ab ab").unwrap(), vec![5, 6]);
        // SmolLM splits digits one by one.
        assert_eq!(t.encode("12").unwrap(), vec![3, 4]);
        assert_eq!(t.count("ab ab").unwrap(), 3, "BOS counted");
        assert!(t.describe().contains("pre-tokenizer smollm"));
        let t = load_bytes(&tiny("gpt2", "mystery")).unwrap();
        assert!(t.describe().contains("not known here"), "{}", t.describe());
    }

    #[test]
    fn tokenizer_json_is_loaded_with_its_own_special_tokens() {
        let path = std::env::temp_dir().join(format!("lt-tok-{}.json", std::process::id()));
        std::fs::write(
            &path,
            r#"{"version":"1.0","truncation":null,"padding":null,
                "added_tokens":[{"id":3,"content":"<s>","single_word":false,"lstrip":false,
                  "rstrip":false,"normalized":false,"special":true}],
                "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},
                "post_processor":{"type":"TemplateProcessing",
                  "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
                  "pair":[{"Sequence":{"id":"A","type_id":0}}],
                  "special_tokens":{"<s>":{"id":"<s>","ids":[3],"tokens":["<s>"]}}},
                "decoder":null,
                "model":{"type":"WordLevel","vocab":{"a":0,"b":1,"[UNK]":2,"<s>":3},"unk_token":"[UNK]"}}"#,
        )
        .unwrap();
        let t = LocalTokenizer::load(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(t.encode("a b zz").unwrap(), vec![0, 1, 2]);
        assert_eq!(
            t.count("a b zz").unwrap(),
            4,
            "the post-processor's BOS counts"
        );
        assert!(t.describe().starts_with("local tokenizer.json"));
    }

    #[test]
    fn other_tokenizer_models_are_named_in_the_error() {
        let e = load_bytes(&tiny("llama", "default"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"llama\"") && e.contains("tokenizer.json"),
            "{e}"
        );
    }
}
