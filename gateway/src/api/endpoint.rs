//! [`Endpoint`]: what differs between `/v1/chat/completions` and `/v1/completions` — the body
//! type, its checks, how its prompt is tokenised or keyed for routing, and how its answers are
//! shaped. The pipeline in `super::pipeline` is written once over it.

use serde::de::DeserializeOwned;
use sluice_engine::Grammar;
use sluice_models::Model;

use super::generate::{ChatRender, Render, TextRender};
use super::guided::AnswerFormat;
use super::tools::ToolChoice;
use super::types::{ChatCompletionRequest, CompletionRequest, PromptSpec};
use super::validate::{self, ChatPrompt, Checked, CHAT_PARAMS, COMPLETION_PARAMS};
use crate::error::{ApiError, Params};
use crate::router::affinity;

/// What the router needs to know about a request it cannot tokenise.
#[derive(Debug)]
pub struct Routing {
    /// The prompt's leading text (or token bytes), for prefix affinity.
    pub affinity: Vec<u8>,
    /// The prompts' size in bytes (token ids count four bytes: one token).
    pub prompt_bytes: usize,
    /// The longest prompt's size in bytes, counted alike.
    pub longest_prompt_bytes: usize,
    /// Prompts in the request (completions may send several).
    pub prompts: usize,
}

/// A generation endpoint.
pub trait Endpoint: DeserializeOwned + Send + 'static {
    const ROUTE: &'static str;
    /// Prefix of the response id (`chatcmpl-`, `cmpl-`).
    const ID_PREFIX: &'static str;
    /// The OpenAI names of the fields errors name.
    const PARAMS: Params;
    /// The prompt as the checks leave it, for tokenising or routing.
    type Prompt: Send;
    type Render: Render;

    fn model(&self) -> &str;
    /// Writes the prompt to the log (`--log-prompts`).
    fn log_prompt(&self, request_id: &str);
    /// Every check that needs no tokenizer; `vocab` when the model is known.
    fn check(&self, vocab: Option<usize>) -> Result<(Checked, Self::Prompt), ApiError>;
    /// The engine prompts, tokenised with the local model.
    fn encode(&self, prompt: Self::Prompt, model: &Model) -> Result<Vec<Vec<u32>>, ApiError>;
    fn routing(&self, prompt: &Self::Prompt) -> Routing;
    /// The grammar the output must match, with the request field its errors name.
    fn grammar(_prompt: &Self::Prompt) -> Option<(Grammar, &'static str)> {
        None
    }
    /// Whether the output is read as tool calls: `Some(true)` calls only, `Some(false)` text
    /// or calls.
    fn tool_calls(_prompt: &Self::Prompt) -> Option<bool> {
        None
    }
    /// Whether the request brings its own chat template (run only where the server trusts
    /// request templates).
    fn own_template(_prompt: &Self::Prompt) -> bool {
        false
    }
    /// The engine prompts' text as an echo shows it: decoded from their ids, unless the
    /// request sent it as text.
    fn prompt_texts(&self, prompts: &[Vec<u32>], model: &Model) -> Result<Vec<String>, ApiError> {
        prompts.iter().map(|ids| decoded(ids, model)).collect()
    }
}

/// A prompt's ids as text, special tokens included.
fn decoded(ids: &[u32], model: &Model) -> Result<String, ApiError> {
    model.tokenizer().decode(ids, false).map_err(|e| {
        tracing::error!("decoding a prompt: {e}");
        ApiError::Internal
    })
}

impl Endpoint for ChatCompletionRequest {
    const ROUTE: &'static str = "/v1/chat/completions";
    const ID_PREFIX: &'static str = "chatcmpl-";
    const PARAMS: Params = CHAT_PARAMS;
    type Prompt = ChatPrompt;
    type Render = ChatRender;

    fn model(&self) -> &str {
        &self.model
    }

    fn log_prompt(&self, request_id: &str) {
        tracing::info!(request_id, messages = ?self.messages, "prompt");
    }

    fn check(&self, vocab: Option<usize>) -> Result<(Checked, Self::Prompt), ApiError> {
        validate::chat_checked(self, vocab)
    }

    fn encode(&self, prompt: Self::Prompt, model: &Model) -> Result<Vec<Vec<u32>>, ApiError> {
        let tools = prompt.tools.as_ref();
        Ok(vec![validate::chat_prompt(
            (model, prompt.template.as_deref()),
            &prompt.messages,
            tools,
            prompt.end,
            prompt.template_kwargs.as_ref(),
        )?])
    }

    fn grammar(prompt: &Self::Prompt) -> Option<(Grammar, &'static str)> {
        let o = &prompt.output;
        o.grammar.clone().map(|g| (g, o.param))
    }

    fn tool_calls(prompt: &Self::Prompt) -> Option<bool> {
        let set = prompt.tools.as_ref()?;
        prompt
            .output
            .tool_calls
            .then(|| set.choice != ToolChoice::Auto)
    }

    fn own_template(prompt: &Self::Prompt) -> bool {
        prompt.template.is_some()
    }

    /// vLLM's chat `echo` shows the last message's text when it is the assistant's (the
    /// reply's role), nothing otherwise.
    fn prompt_texts(&self, prompts: &[Vec<u32>], _: &Model) -> Result<Vec<String>, ApiError> {
        let messages = validate::chat_messages(&self.messages)?;
        let last = messages
            .last()
            .filter(|m| m.role == "assistant")
            .map_or(String::new(), |m| m.content.clone());
        Ok(vec![last; prompts.len()])
    }

    fn routing(&self, prompt: &Self::Prompt) -> Routing {
        let text = affinity::chat_text(
            prompt
                .messages
                .iter()
                .map(|m| (m.role.as_str(), m.content.as_str())),
        );
        Routing {
            prompt_bytes: text.len(),
            longest_prompt_bytes: text.len(),
            affinity: text,
            prompts: 1,
        }
    }
}

impl Endpoint for CompletionRequest {
    const ROUTE: &'static str = "/v1/completions";
    const ID_PREFIX: &'static str = "cmpl-";
    const PARAMS: Params = COMPLETION_PARAMS;
    /// The prompt stays in the request; what the checks leave is the answer's format.
    type Prompt = Option<AnswerFormat>;
    type Render = TextRender;

    fn model(&self) -> &str {
        &self.model
    }

    fn log_prompt(&self, request_id: &str) {
        tracing::info!(request_id, prompt = ?self.prompt, "prompt");
    }

    fn check(&self, vocab: Option<usize>) -> Result<(Checked, Self::Prompt), ApiError> {
        validate::completion_checked(self, vocab)
    }

    fn encode(&self, _: Self::Prompt, model: &Model) -> Result<Vec<Vec<u32>>, ApiError> {
        validate::completion_prompts(self, model)
    }

    fn grammar(format: &Self::Prompt) -> Option<(Grammar, &'static str)> {
        format.clone().map(|f| (f.grammar, f.param))
    }

    fn prompt_texts(&self, prompts: &[Vec<u32>], model: &Model) -> Result<Vec<String>, ApiError> {
        match &self.prompt {
            PromptSpec::Text(t) => Ok(vec![t.clone()]),
            PromptSpec::Texts(ts) => Ok(ts.clone()),
            PromptSpec::Tokens(_) | PromptSpec::TokenLists(_) => {
                prompts.iter().map(|ids| decoded(ids, model)).collect()
            }
        }
    }

    fn routing(&self, _: &Self::Prompt) -> Routing {
        let first = |bytes: Option<Vec<u8>>| bytes.unwrap_or_default();
        let (affinity, sizes): (Vec<u8>, Vec<usize>) = match &self.prompt {
            PromptSpec::Text(t) => (t.as_bytes().to_vec(), vec![t.len()]),
            PromptSpec::Texts(ts) => (
                first(ts.first().map(|t| t.as_bytes().to_vec())),
                ts.iter().map(String::len).collect(),
            ),
            PromptSpec::Tokens(t) => (affinity::token_bytes(t), vec![t.len() * 4]),
            PromptSpec::TokenLists(ls) => (
                first(ls.first().map(|l| affinity::token_bytes(l))),
                ls.iter().map(|l| l.len() * 4).collect(),
            ),
        };
        Routing {
            affinity,
            prompt_bytes: sizes.iter().sum(),
            longest_prompt_bytes: sizes.iter().copied().max().unwrap_or(0),
            prompts: sizes.len(),
        }
    }
}
