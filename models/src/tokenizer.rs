//! Text ⇄ token ids for the models this runtime serves.
//!
//! The tokenizer is rebuilt from the vocabulary embedded in a GGUF file so that prompts tokenise
//! exactly as llama.cpp tokenises them (the reference our golden files come from). Only
//! byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) are supported; the
//! pre-tokenizer (how text is cut into words before BPE) is chosen by `tokenizer.ggml.pre`
//! following llama.cpp's table, and a value we cannot reproduce exactly is an error rather than a
//! guess, because a near-miss tokenizer silently degrades every answer of the model.
//!
//! A `tokenizer.json` in the Hugging Face format can be loaded instead with
//! [`Tokenizer::from_json_file`].

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{ModelError, Result};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Token texts that end an assistant turn in the chat formats we know. Generation stops at any of
/// them that exist in the vocabulary, in addition to the model's declared EOS (the same list
/// llama.cpp uses to auto-detect end-of-generation tokens).
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
];

/// llama.cpp's GPT-2 word-splitting regex.
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// llama.cpp's Llama 3 regex (the case-insensitive contractions spelled out, as llama.cpp does).
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's Qwen2 regex: like Llama 3 but every digit is its own word.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How llama.cpp cuts text into words before BPE, for the `tokenizer.ggml.pre` values we
/// reproduce exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreKind {
    /// Plain GPT-2 regex.
    Gpt2,
    /// Every digit on its own, then the GPT-2 regex (SmolLM, StarCoder, ...).
    DigitsGpt2,
    /// Llama 3 regex; `ignore_merges` says whether a word found whole in the vocabulary is
    /// emitted as one token without running merges (true for the Llama 3 family proper).
    Llama3 { ignore_merges: bool },
    /// Qwen2 regex.
    Qwen2,
    /// Falcon: punctuation runs, GPT-2 regex, then groups of three ASCII digits.
    Falcon,
    /// llama.cpp's "default" BPE pre-tokenizer (only when the file names it explicitly).
    Default,
}

impl PreKind {
    /// Maps a `tokenizer.ggml.pre` value to its splitting rules (names as in llama.cpp's
    /// `llama_vocab::impl::load`). Unknown names are an error: llama.cpp would fall back to its
    /// "default" rules with a warning, which is a guess we refuse to make.
    fn from_name(pre: &str) -> Result<Self> {
        Ok(match pre {
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling"
            | "exaone4" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
            | "a.x-4.0" | "mellum" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => Self::DigitsGpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => Self::Llama3 {
                ignore_merges: true,
            },
            "dbrx" | "smaug-bpe" => Self::Llama3 {
                ignore_merges: false,
            },
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" | "hunyuan" => {
                Self::Qwen2
            }
            "falcon" => Self::Falcon,
            "default" => Self::Default,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "tokenizer.ggml.pre = '{other}' is not a pre-tokenizer this runtime reproduces"
                )))
            }
        })
    }

    /// Whether llama.cpp adds a BOS token by default for this pre-tokenizer (the GGUF key
    /// `tokenizer.ggml.add_bos_token` overrides it).
    fn default_add_bos(self) -> bool {
        matches!(
            self,
            Self::Llama3 {
                ignore_merges: true
            }
        )
    }

    fn ignore_merges(self) -> bool {
        matches!(
            self,
            Self::Llama3 {
                ignore_merges: true
            }
        )
    }

    /// The equivalent Hugging Face pre-tokenizer. llama.cpp applies its regexes one after the
    /// other, each splitting the pieces left by the previous one and keeping the unmatched gaps
    /// as pieces, which is exactly `Split` with `Isolated` behaviour; the byte-level mapping
    /// comes last.
    fn build(self) -> Result<PreTokenizerWrapper> {
        // `ByteLevel` with `use_regex` applies the GPT-2 regex itself (the same pattern as ours).
        let byte_level_gpt2 = ByteLevel::new(false, true, true);
        let byte_level_only = ByteLevel::new(false, true, false);
        let steps: Vec<PreTokenizerWrapper> = match self {
            Self::Gpt2 => vec![byte_level_gpt2.into()],
            Self::DigitsGpt2 => vec![Digits::new(true).into(), byte_level_gpt2.into()],
            Self::Llama3 { .. } => vec![split(LLAMA3_REGEX)?, byte_level_only.into()],
            Self::Qwen2 => vec![split(QWEN2_REGEX)?, byte_level_only.into()],
            Self::Falcon => vec![
                split(r"[\p{P}\$\+<=>\^~\|`]+")?,
                split(GPT2_REGEX)?,
                split("[0-9][0-9][0-9]")?,
                byte_level_only.into(),
            ],
            Self::Default => vec![
                split(r"[\p{P}\$\+<=>\^~\|]+")?,
                split(GPT2_REGEX)?,
                split(r"\p{N}+")?,
                split("[0-9][0-9][0-9]")?,
                byte_level_only.into(),
            ],
        };
        Ok(Sequence::new(steps).into())
    }
}

fn split(regex: &str) -> Result<PreTokenizerWrapper> {
    Split::new(
        SplitPattern::Regex(regex.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map(Into::into)
    .map_err(|e| ModelError::Tokenizer(format!("compiling pre-tokenizer regex {regex:?}: {e}")))
}

/// Which ids play which role, for tokenizers whose file does not say (a `tokenizer.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning-of-sequence token, if the model has one.
    pub bos: Option<u32>,
    /// End-of-sequence token.
    pub eos: u32,
    /// Whether prompts should start with BOS (callers add it; `encode` never does).
    pub add_bos: bool,
}

impl SpecialIds {
    /// Reads bos/eos/add_bos from GGUF metadata, for pairing a GGUF model with an external
    /// `tokenizer.json`.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        Self::from_metadata(&content.metadata)
    }

    /// Like [`SpecialIds::from_gguf`] but from the metadata map alone.
    pub fn from_metadata(md: &HashMap<String, Value>) -> Result<Self> {
        Ok(Self {
            bos: opt_u32(md, "tokenizer.ggml.bos_token_id")?,
            eos: opt_u32(md, "tokenizer.ggml.eos_token_id")?.ok_or_else(|| {
                ModelError::Metadata("tokenizer.ggml.eos_token_id is missing".into())
            })?,
            add_bos: opt_bool(md, "tokenizer.ggml.add_bos_token")?.unwrap_or(false),
        })
    }
}

/// A thread-safe tokenizer: share it with `Arc<Tokenizer>`.
pub struct Tokenizer {
    /// Configured to recognise special-token text (`<|im_start|>`) as the special token.
    parse_special: tokenizers::Tokenizer,
    /// The same tokenizer with special tokens encoded as ordinary text. Two instances because
    /// the switch (`set_encode_special_tokens`) is mutable state inside `tokenizers`; flipping
    /// it per call would race between threads.
    plain: tokenizers::Tokenizer,
    vocab_size: usize,
    bos: Option<u32>,
    eos: u32,
    eos_ids: BTreeSet<u32>,
    add_bos: bool,
    /// The texts `parse_special` reads as special tokens, with their ids, longest first.
    specials: Vec<(String, u32)>,
    /// Whether some special token's text starts with this byte (a quick filter for scans).
    special_first: [bool; 256],
}

/// Opens and closes a special token's text inside message text ([`Tokenizer::guard_text`]).
/// Unicode noncharacters: never in a vocabulary and never meaningful in a chat.
pub const GUARD_OPEN: char = '\u{FDD0}';
/// See [`GUARD_OPEN`].
pub const GUARD_CLOSE: char = '\u{FDD1}';

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The inner tokenizers would print the whole vocabulary.
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eos_ids", &self.eos_ids)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

/// `tokenizer.ggml.tokens`, empty entries renamed as llama.cpp does.
fn gguf_tokens(md: &HashMap<String, Value>) -> Result<Vec<String>> {
    let tokens = req_array(md, "tokenizer.ggml.tokens")?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let s = v
                .to_string()
                .map_err(|e| ModelError::Metadata(format!("tokenizer.ggml.tokens[{i}]: {e}")))?;
            // llama.cpp renames empty entries so that every id has a distinct text.
            Ok(if s.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                s.clone()
            })
        })
        .collect::<Result<Vec<String>>>()?;
    let n_vocab = tokens.len();
    if n_vocab == 0 || u32::try_from(n_vocab).is_err() {
        return Err(ModelError::Metadata(format!(
            "tokenizer.ggml.tokens has {n_vocab} entries"
        )));
    }
    Ok(tokens)
}

/// `tokenizer.ggml.token_type`, one per token (all normal when absent).
fn gguf_token_types(md: &HashMap<String, Value>, n_vocab: usize) -> Result<Vec<i32>> {
    Ok(match md.get("tokenizer.ggml.token_type") {
        Some(v) => {
            let arr = v
                .to_vec()
                .map_err(|e| ModelError::Metadata(format!("tokenizer.ggml.token_type: {e}")))?;
            if arr.len() != n_vocab {
                return Err(ModelError::Metadata(format!(
                    "tokenizer.ggml.token_type has {} entries for {n_vocab} tokens",
                    arr.len()
                )));
            }
            arr.iter()
                .enumerate()
                .map(|(i, v)| {
                    v.to_i32().map_err(|e| {
                        ModelError::Metadata(format!("tokenizer.ggml.token_type[{i}]: {e}"))
                    })
                })
                .collect::<Result<Vec<i32>>>()?
        }
        None => vec![1; n_vocab],
    })
}

/// `tokenizer.ggml.merges` as pairs.
fn gguf_merges(md: &HashMap<String, Value>) -> Result<Vec<(String, String)>> {
    req_array(md, "tokenizer.ggml.merges")?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let s = v
                .to_string()
                .map_err(|e| ModelError::Metadata(format!("tokenizer.ggml.merges[{i}]: {e}")))?;
            // Byte-level tokens never contain a literal space, so the first one separates.
            s.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    ModelError::Metadata(format!("tokenizer.ggml.merges[{i}] = {s:?}: no space"))
                })
        })
        .collect::<Result<Vec<_>>>()
}

impl Tokenizer {
    /// Builds the tokenizer embedded in a GGUF file.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        Self::from_gguf_metadata(&content.metadata)
    }

    /// Builds the tokenizer from GGUF metadata (the `tokenizer.ggml.*` keys).
    pub fn from_gguf_metadata(md: &HashMap<String, Value>) -> Result<Self> {
        let model = req_str(md, "tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(ModelError::Unsupported(format!(
                "tokenizer.ggml.model = '{model}': only byte-level BPE ('gpt2') vocabularies are supported"
            )));
        }
        let pre = match md.get("tokenizer.ggml.pre") {
            Some(v) => v
                .to_string()
                .map_err(|e| ModelError::Metadata(format!("tokenizer.ggml.pre: {e}")))?
                .as_str(),
            None => {
                return Err(ModelError::Unsupported(
                    "tokenizer.ggml.pre is missing; the pre-tokenizer cannot be determined \
                     (re-convert the model with a current llama.cpp)"
                        .into(),
                ))
            }
        };
        let pre = PreKind::from_name(pre)?;

        let tokens = gguf_tokens(md)?;
        let token_types = gguf_token_types(md, tokens.len())?;
        let merges = gguf_merges(md)?;

        // Later duplicates win, as in llama.cpp's `token_to_id[word] = i`.
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre.ignore_merges())
            .build()
            .map_err(|e| ModelError::Tokenizer(format!("building BPE from GGUF: {e}")))?;

        let mut tok = tokenizers::Tokenizer::new(bpe);
        tok.with_pre_tokenizer(Some(pre.build()?));
        tok.with_decoder(Some(ByteLevelDecoder::default()));
        // Control tokens are "special" (skipped by `decode(.., true)`, recognised only when
        // parsing specials); user-defined tokens are always recognised, as in llama.cpp.
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&token_types)
            .filter(|(_, &ty)| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED)
            .map(|(t, &ty)| {
                let special = ty == TOKEN_TYPE_CONTROL;
                AddedToken::from(t.clone(), special).normalized(false)
            })
            .collect();
        tok.add_tokens(added)
            .map_err(|e| ModelError::Tokenizer(format!("adding special tokens: {e}")))?;

        let bos = opt_u32(md, "tokenizer.ggml.bos_token_id")?;
        let eos = opt_u32(md, "tokenizer.ggml.eos_token_id")?
            .ok_or_else(|| ModelError::Metadata("tokenizer.ggml.eos_token_id is missing".into()))?;
        let add_bos =
            opt_bool(md, "tokenizer.ggml.add_bos_token")?.unwrap_or(pre.default_add_bos());
        let mut extra_eog = Vec::new();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            extra_eog.extend(opt_u32(md, key)?);
        }
        Self::assemble(tok, SpecialIds { bos, eos, add_bos }, &extra_eog)
    }

    /// Loads a Hugging Face `tokenizer.json`. The file does not say which token is BOS/EOS
    /// (that lives in `tokenizer_config.json` or the GGUF), so the caller passes them, e.g.
    /// from [`SpecialIds::from_gguf`] or by looking names up with [`Tokenizer::token_to_id`]
    /// on a first load.
    ///
    /// Unlike [`Tokenizer::from_gguf`], the file's own post-processor is kept but never run:
    /// `encode` adds no BOS/EOS.
    pub fn from_json_file(path: impl AsRef<Path>, specials: SpecialIds) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_bytes(&bytes, specials)
    }

    /// Like [`Tokenizer::from_json_file`] from the file's contents.
    pub fn from_json_bytes(json: &[u8], specials: SpecialIds) -> Result<Self> {
        let tok = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| ModelError::Tokenizer(format!("parsing tokenizer.json: {e}")))?;
        Self::assemble(tok, specials, &[])
    }

    /// Validates the special ids, works out the end-of-generation set and makes the two
    /// instances.
    fn assemble(
        parse_special: tokenizers::Tokenizer,
        specials: SpecialIds,
        extra_eog: &[u32],
    ) -> Result<Self> {
        let vocab_size = parse_special.get_vocab_size(true);
        for (name, id) in [("bos", specials.bos), ("eos", Some(specials.eos))] {
            if let Some(id) = id {
                if id as usize >= vocab_size {
                    return Err(ModelError::Metadata(format!(
                        "{name} token id {id} is outside the vocabulary of {vocab_size}"
                    )));
                }
            }
        }
        let mut eos_ids = BTreeSet::from([specials.eos]);
        eos_ids.extend(
            extra_eog
                .iter()
                .copied()
                .filter(|&id| (id as usize) < vocab_size),
        );
        eos_ids.extend(
            END_OF_TURN_TOKENS
                .iter()
                .filter_map(|t| parse_special.token_to_id(t)),
        );
        let mut plain = parse_special.clone();
        plain.set_encode_special_tokens(true);
        let mut texts: Vec<(String, u32)> = parse_special
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special && !t.content.is_empty())
            .map(|(id, t)| (t.content, id))
            .collect();
        texts.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut special_first = [false; 256];
        for (s, _) in &texts {
            special_first[usize::from(s.as_bytes()[0])] = true;
        }
        Ok(Self {
            specials: texts,
            special_first,
            parse_special,
            plain,
            vocab_size,
            bos: specials.bos,
            eos: specials.eos,
            eos_ids,
            add_bos: specials.add_bos,
        })
    }

    /// Tokenises `text`. Never adds BOS/EOS (callers and chat templates decide). With
    /// `parse_special`, the text of control tokens such as `<|im_start|>` becomes that token;
    /// without, it is tokenised like any other text, which is what user-supplied text needs so
    /// that it cannot forge turn markers. User-defined tokens are recognised either way.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let tok = if parse_special {
            &self.parse_special
        } else {
            &self.plain
        };
        let enc = tok
            .encode_fast(text, false)
            .map_err(|e| ModelError::Tokenizer(format!("encoding: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encodes a prompt the model reads as given (a completion's prompt, `/tokenize`): BOS
    /// first when the model wants it ([`Tokenizer::add_bos`]), then the text with control
    /// tokens read as plain text, so that a user's text can neither forge turn markers nor add a
    /// second BOS. Chat prompts are different: their template writes BOS and the markers.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let text_ids = self.encode(text, false)?;
        let bos = self.bos.filter(|_| self.add_bos);
        let mut ids = Vec::with_capacity(text_ids.len() + 1);
        ids.extend(bos);
        ids.extend(text_ids);
        Ok(ids)
    }

    /// The longest special token whose text starts `text`.
    fn special_at(&self, text: &str) -> Option<&(String, u32)> {
        let first = *text.as_bytes().first()?;
        if !self.special_first[usize::from(first)] {
            return None;
        }
        self.specials
            .iter()
            .find(|(s, _)| text.starts_with(s.as_str()))
    }

    /// Marks every special token's text in `text` (message content, a tool's arguments or
    /// result) as text: each occurrence is wrapped in [`GUARD_OPEN`] … [`GUARD_CLOSE`], which
    /// [`Tokenizer::encode_chat`] reads as "encode this as plain text" and removes. Text with
    /// no special token's text is returned as it is.
    pub fn guard_text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(first) = self.find_special(text, 0) else {
            return Cow::Borrowed(text);
        };
        let mut out = String::with_capacity(text.len() + 16);
        let mut at = 0;
        let mut next = Some(first);
        while let Some((start, len)) = next {
            out.push_str(&text[at..start]);
            out.push(GUARD_OPEN);
            out.push_str(&text[start..start + len]);
            out.push(GUARD_CLOSE);
            at = start + len;
            next = self.find_special(text, at);
        }
        out.push_str(&text[at..]);
        Cow::Owned(out)
    }

    /// The first special token's text in `text` at or after byte `from`: (start, length).
    fn find_special(&self, text: &str, from: usize) -> Option<(usize, usize)> {
        if self.specials.is_empty() {
            return None;
        }
        text[from..]
            .char_indices()
            .filter(|&(i, _)| self.special_first[usize::from(text.as_bytes()[from + i])])
            .find_map(|(i, _)| {
                self.special_at(&text[from + i..])
                    .map(|(s, _)| (from + i, s.len()))
            })
    }

    /// Encodes a rendered chat prompt: the template's own special-token texts become those
    /// tokens, while the spans [`Tokenizer::guard_text`] marked in message text are encoded as
    /// plain text (and the marks dropped), so that a message can never forge a turn marker.
    /// Without marks this is `encode(rendered, true)`.
    pub fn encode_chat(&self, rendered: &str) -> Result<Vec<u32>> {
        if !rendered.contains(GUARD_OPEN) {
            return self.encode(rendered, true);
        }
        let mut ids = Vec::new();
        let mut text = String::new();
        let mut rest = rendered;
        while let Some(c) = rest.chars().next() {
            if let Some(guarded) = rest.strip_prefix(GUARD_OPEN) {
                if let Some((s, _)) = self.special_at(guarded) {
                    if guarded[s.len()..].starts_with(GUARD_CLOSE) {
                        text.push_str(s);
                        rest = &guarded[s.len() + GUARD_CLOSE.len_utf8()..];
                        continue;
                    }
                }
            }
            if let Some((s, id)) = self.special_at(rest) {
                ids.extend(self.encode(&text, false)?);
                text.clear();
                ids.push(*id);
                rest = &rest[s.len()..];
                continue;
            }
            text.push(c);
            rest = &rest[c.len_utf8()..];
        }
        ids.extend(self.encode(&text, false)?);
        Ok(ids)
    }

    /// Turns ids back into text; bytes that do not form valid UTF-8 (a character cut between
    /// tokens) become U+FFFD. With `skip_special`, control tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        // `tokenizers` silently drops unknown ids; an out-of-range id is a caller bug.
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(ModelError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        self.parse_special
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenizer(format!("decoding: {e}")))
    }

    /// The text one token stands for (special tokens included), e.g. `" the"` for `Ġthe`.
    pub fn token_to_piece(&self, id: u32) -> Result<String> {
        self.decode(&[id], false)
    }

    /// Every id's bytes, with whether it is a special token (whose bytes are its text): what a
    /// grammar matcher needs to know which tokens can continue a text (see
    /// [`Tokenizer::token_bytes`]).
    pub fn vocabulary_bytes(&self) -> Vec<(Vec<u8>, bool)> {
        (0..self.vocab_size as u32)
            .map(|id| self.token_bytes(id))
            .collect()
    }

    /// The bytes one token stands for, with whether it is a special token (whose bytes are its
    /// text). Unlike [`Tokenizer::token_to_piece`], a token holding part of a UTF-8 character
    /// keeps its bytes (OpenAI's logprobs `bytes`, which a client joins across tokens).
    /// Byte-level vocabularies are mapped back to bytes; others (SentencePiece-style
    /// `tokenizer.json`) decode the entry, reading `<0xNN>` as the byte.
    pub fn token_bytes(&self, id: u32) -> (Vec<u8>, bool) {
        let added = self.parse_special.get_added_vocabulary();
        if let Some(t) = added.get_added_tokens_decoder().get(&id) {
            return (t.content.clone().into_bytes(), t.special);
        }
        let Some(entry) = self.parse_special.id_to_token(id) else {
            return (Vec::new(), false);
        };
        let byte_level = matches!(
            self.parse_special.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        let bytes = if byte_level {
            let map = byte_level_chars();
            entry
                .chars()
                .map(|c| map.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| entry.clone().into_bytes())
        } else {
            sentencepiece_bytes(&entry)
        };
        (bytes, false)
    }

    /// The vocabulary entry of `id` as stored (byte-level form, e.g. `"Ġthe"`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.parse_special.id_to_token(id)
    }

    /// The id of a vocabulary entry (byte-level form) or added token, if present.
    /// The tokenizer as a Hugging Face `tokenizer.json` (for writing a model directory).
    pub fn to_json(&self) -> Result<String> {
        self.parse_special
            .to_string(true)
            .map_err(|e| ModelError::Tokenizer(format!("serialising: {e}")))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.parse_special.token_to_id(token)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// Whether prompts for this model should start with BOS (`tokenizer.ggml.add_bos_token`,
    /// else llama.cpp's default for the pre-tokenizer). `encode` never adds it itself.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The model's declared end-of-sequence id.
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// Every id that ends generation: the declared EOS, the GGUF's `eot`/`eom` ids if given, and
    /// any of the usual end-of-turn tokens (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`,
    /// `<end_of_turn>`, ... see `END_OF_TURN_TOKENS`) present in the vocabulary — the rule
    /// llama.cpp uses, because chat models often end a turn with a token other than the EOS
    /// their config declares.
    pub fn eos_ids(&self) -> &BTreeSet<u32> {
        &self.eos_ids
    }

    /// Whether `id` ends generation (a member of [`Tokenizer::eos_ids`]).
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }
}

/// GPT-2's byte-level alphabet, reversed: the printable character each byte is stored as in a
/// byte-level vocabulary → the byte. Printable Latin-1 bytes stand for themselves; the others
/// (controls, space, DEL, NBSP, soft hyphen) take the characters from U+0100 on, in byte order.
fn byte_level_chars() -> &'static HashMap<char, u8> {
    static MAP: std::sync::LazyLock<HashMap<char, u8>> = std::sync::LazyLock::new(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 0x100u32;
        (0..=255u8)
            .map(|b| {
                let c = if printable(b) {
                    char::from(b)
                } else {
                    let c = char::from_u32(next).expect("U+0100..U+0143 are characters");
                    next += 1;
                    c
                };
                (c, b)
            })
            .collect()
    });
    &MAP
}

/// A SentencePiece-style entry's bytes: `<0xNN>` is that byte, `▁` a space.
fn sentencepiece_bytes(entry: &str) -> Vec<u8> {
    if let Some(hex) = entry.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    entry.replace('\u{2581}', " ").into_bytes()
}

fn req_str<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a str> {
    md.get(key)
        .ok_or_else(|| ModelError::Metadata(format!("{key} is missing")))?
        .to_string()
        .map(String::as_str)
        .map_err(|e| ModelError::Metadata(format!("{key}: {e}")))
}

fn req_array<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a Vec<Value>> {
    md.get(key)
        .ok_or_else(|| ModelError::Metadata(format!("{key} is missing")))?
        .to_vec()
        .map_err(|e| ModelError::Metadata(format!("{key}: {e}")))
}

/// An optional integer key; GGUF writers use several integer widths for ids.
fn opt_u32(md: &HashMap<String, Value>, key: &str) -> Result<Option<u32>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let n: i64 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => i64::try_from(*x).unwrap_or(-1),
        Value::I64(x) => *x,
        other => {
            return Err(ModelError::Metadata(format!(
                "{key}: expected an integer, got {:?}",
                other.value_type()
            )))
        }
    };
    u32::try_from(n)
        .map(Some)
        .map_err(|_| ModelError::Metadata(format!("{key} = {n} is not a valid token id")))
}

fn opt_bool(md: &HashMap<String, Value>, key: &str) -> Result<Option<bool>> {
    md.get(key)
        .map(|v| {
            v.to_bool()
                .map_err(|e| ModelError::Metadata(format!("{key}: {e}")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
    }

    /// A tiny byte-level vocabulary: all single characters of "hello world 12<|end|>" in
    /// byte-level form, some merges, and one control token.
    fn tiny_metadata(pre: &str) -> HashMap<String, Value> {
        let tokens = [
            "<|end|>", "h", "e", "l", "o", "Ġ", "w", "r", "d", "1", "2", "he", "ll", "hell",
            "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "12", "<", "|", ">", "n", "<|user|>",
        ];
        let mut types = vec![Value::I32(1); tokens.len()];
        types[0] = Value::I32(TOKEN_TYPE_CONTROL);
        types[25] = Value::I32(TOKEN_TYPE_USER_DEFINED);
        let merges = [
            "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2",
        ];
        HashMap::from([
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
            ("tokenizer.ggml.tokens".into(), strs(&tokens)),
            ("tokenizer.ggml.token_type".into(), Value::Array(types)),
            ("tokenizer.ggml.merges".into(), strs(&merges)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(0)),
        ])
    }

    #[test]
    fn a_token_holding_part_of_a_character_keeps_its_bytes() {
        // "é" is C3 A9 in UTF-8; in the byte-level alphabet each byte is its own token.
        let mut md = tiny_metadata("smollm");
        let Some(Value::Array(tokens)) = md.get_mut("tokenizer.ggml.tokens") else {
            unreachable!("tiny_metadata lists tokens");
        };
        tokens.extend([Value::String("Ã".into()), Value::String("©".into())]);
        let Some(Value::Array(types)) = md.get_mut("tokenizer.ggml.token_type") else {
            unreachable!("tiny_metadata lists token types");
        };
        types.extend([Value::I32(1), Value::I32(1)]);
        let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
        assert_eq!(tok.token_bytes(26), (vec![0xC3], false));
        assert_eq!(tok.token_bytes(27), (vec![0xA9], false));
        assert_eq!(tok.token_to_piece(26).unwrap(), "\u{FFFD}");
        assert_eq!(tok.decode(&[26, 27], false).unwrap(), "é");
        assert_eq!(tok.token_bytes(0), (b"<|end|>".to_vec(), true));
    }

    #[test]
    fn tiny_vocab_merges_and_digits() {
        let tok = Tokenizer::from_gguf_metadata(&tiny_metadata("smollm")).unwrap();
        assert_eq!(tok.encode("hello world", false).unwrap(), vec![14, 19]);
        // smollm splits digits individually, so the "1 2" merge never applies.
        assert_eq!(tok.encode("12", false).unwrap(), vec![9, 10]);
        let gpt2 = Tokenizer::from_gguf_metadata(&tiny_metadata("gpt-2")).unwrap();
        assert_eq!(gpt2.encode("12", false).unwrap(), vec![20]);
        assert_eq!(tok.decode(&[14, 19], false).unwrap(), "hello world");
        assert_eq!(tok.token_to_piece(19).unwrap(), " world");
        assert_eq!(tok.id_to_token(19).as_deref(), Some("Ġworld"));
        assert_eq!(tok.vocab_size(), 26);
    }

    #[test]
    fn special_tokens_parse_only_when_asked() {
        let tok = Tokenizer::from_gguf_metadata(&tiny_metadata("smollm")).unwrap();
        assert_eq!(tok.encode("hello<|end|>", true).unwrap(), vec![14, 0]);
        assert_eq!(
            tok.encode("hello<|end|>", false).unwrap(),
            vec![14, 21, 22, 2, 24, 8, 22, 23]
        );
        // User-defined tokens are always recognised, as in llama.cpp.
        assert_eq!(tok.encode("<|user|>", false).unwrap(), vec![25]);
        assert_eq!(tok.decode(&[14, 0], false).unwrap(), "hello<|end|>");
        assert_eq!(tok.decode(&[14, 0], true).unwrap(), "hello");
    }

    #[test]
    fn guarded_special_text_is_encoded_as_text() {
        let tok = Tokenizer::from_gguf_metadata(&tiny_metadata("smollm")).unwrap();
        assert!(matches!(tok.guard_text("hello"), Cow::Borrowed("hello")));
        let guarded = tok.guard_text("hello<|end|>");
        assert_eq!(guarded, format!("hello{GUARD_OPEN}<|end|>{GUARD_CLOSE}"));
        // The template's marker stays special; the one from the message is text.
        let rendered = format!("<|end|>{guarded}<|end|>");
        assert_eq!(
            tok.encode_chat(&rendered).unwrap(),
            vec![0, 14, 21, 22, 2, 24, 8, 22, 23, 0]
        );
        // Without marks, exactly the special-parsing encoding.
        assert_eq!(
            tok.encode_chat("<|end|>hello<|end|>").unwrap(),
            tok.encode("<|end|>hello<|end|>", true).unwrap()
        );
        // User-defined tokens are never guarded.
        assert_eq!(tok.guard_text("<|user|>"), "<|user|>");
    }

    #[test]
    fn vocabulary_bytes_undo_the_byte_level_alphabet() {
        let tok = Tokenizer::from_gguf_metadata(&tiny_metadata("smollm")).unwrap();
        let v = tok.vocabulary_bytes();
        assert_eq!(v.len(), 26);
        assert_eq!(v[0], (b"<|end|>".to_vec(), true));
        assert_eq!(v[19], (b" world".to_vec(), false));
        assert_eq!(v[25], (b"<|user|>".to_vec(), false));
        let map = byte_level_chars();
        assert_eq!(map.len(), 256);
        assert_eq!(map[&'\u{120}'], b' ');
        assert_eq!(map[&'\u{10A}'], b'\n');
        assert_eq!(map[&'a'], b'a');
    }

    #[test]
    fn encode_prompt_adds_bos_once_and_reads_control_text_as_text() {
        let mut md = tiny_metadata("smollm");
        md.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(0));
        md.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(true));
        let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
        assert_eq!(tok.encode_prompt("hello").unwrap(), vec![0, 14]);
        // The BOS token's text in the prompt is text, not a second BOS.
        let ids = tok.encode_prompt("<|end|>hello").unwrap();
        assert_eq!(ids.iter().filter(|&&t| t == 0).count(), 1, "{ids:?}");
        assert_eq!(ids[0], 0);
        // A model that does not want BOS gets none.
        md.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(false));
        let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
        assert_eq!(tok.encode_prompt("hello").unwrap(), vec![14]);
    }

    #[test]
    fn eos_set_includes_end_of_turn_tokens() {
        let mut md = tiny_metadata("smollm");
        md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(4));
        let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
        assert_eq!(tok.eos_id(), 4);
        assert_eq!(tok.eos_ids(), &BTreeSet::from([0, 4]));
        assert!(tok.is_eos(0) && !tok.is_eos(1));
    }

    #[test]
    fn unknown_or_missing_pre_is_an_error() {
        let err = Tokenizer::from_gguf_metadata(&tiny_metadata("mystery-bpe")).unwrap_err();
        assert!(matches!(&err, ModelError::Unsupported(m) if m.contains("mystery-bpe")));
        let mut md = tiny_metadata("smollm");
        md.remove("tokenizer.ggml.pre");
        assert!(matches!(
            Tokenizer::from_gguf_metadata(&md),
            Err(ModelError::Unsupported(_))
        ));
    }

    #[test]
    fn non_bpe_model_is_unsupported() {
        let mut md = tiny_metadata("smollm");
        md.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        let err = Tokenizer::from_gguf_metadata(&md).unwrap_err();
        assert!(matches!(&err, ModelError::Unsupported(m) if m.contains("llama")));
    }

    #[test]
    fn every_known_pre_builds() {
        for pre in [
            "gpt-2",
            "smollm",
            "llama-bpe",
            "dbrx",
            "qwen2",
            "falcon",
            "default",
        ] {
            let tok = Tokenizer::from_gguf_metadata(&tiny_metadata(pre)).unwrap();
            let ids = tok.encode("hello world", false).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), "hello world", "{pre}");
        }
    }

    #[test]
    fn bad_metadata_is_an_error_not_a_panic() {
        let mut md = tiny_metadata("smollm");
        md.insert("tokenizer.ggml.merges".into(), strs(&["nospace"]));
        assert!(matches!(
            Tokenizer::from_gguf_metadata(&md),
            Err(ModelError::Metadata(_))
        ));
        let mut md = tiny_metadata("smollm");
        md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(999));
        assert!(Tokenizer::from_gguf_metadata(&md).is_err());
        let tok = Tokenizer::from_gguf_metadata(&tiny_metadata("smollm")).unwrap();
        assert!(tok.decode(&[999], false).is_err());
    }

    #[test]
    fn json_round_trip() {
        let tok = Tokenizer::from_gguf_metadata(&tiny_metadata("smollm")).unwrap();
        let json = tok.parse_special.to_string(false).unwrap();
        let specials = SpecialIds {
            bos: None,
            eos: 0,
            add_bos: false,
        };
        let back = Tokenizer::from_json_bytes(json.as_bytes(), specials).unwrap();
        for text in ["hello world", "hello<|end|> 12"] {
            for parse in [false, true] {
                assert_eq!(
                    back.encode(text, parse).unwrap(),
                    tok.encode(text, parse).unwrap()
                );
            }
        }
        assert!(matches!(
            Tokenizer::from_json_file("/nonexistent/tokenizer.json", back_specials()),
            Err(ModelError::Io { .. })
        ));
    }

    fn back_specials() -> SpecialIds {
        SpecialIds {
            bos: None,
            eos: 0,
            add_bos: false,
        }
    }

    #[test]
    fn tokenizer_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
    }
}
