//! OpenAI's request and response bodies, as serde types. The OpenAPI document is generated
//! from these (utoipa), so the schema and the parser cannot drift apart.
//!
//! Requests keep out-of-range values as parsed (wider integer types, `f64`) so validation can
//! name the field and the allowed range instead of failing with a serde type error. Fields the
//! server does not implement are captured as raw JSON so their presence is refused by name.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Declares a request struct with the sampling fields both endpoints accept, written out in
/// each struct (not `#[serde(flatten)]`, which would lose the field name from type errors).
macro_rules! with_sampling_fields {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
            #[schema(minimum = 1)]
            pub max_tokens: Option<i64>,
            #[schema(minimum = 0, maximum = 2)]
            pub temperature: Option<f64>,
            #[schema(exclusive_minimum = 0, maximum = 1)]
            pub top_p: Option<f64>,
            /// Extension (vLLM): keep the k most likely tokens; 0 or -1 disables.
            pub top_k: Option<i64>,
            /// Extension (vLLM): drop tokens below min_p × the most likely one's probability.
            #[schema(minimum = 0, maximum = 1)]
            pub min_p: Option<f64>,
            #[schema(minimum = 1, maximum = 16)]
            pub n: Option<i64>,
            pub stop: Option<StopSpec>,
            pub seed: Option<i64>,
            #[schema(minimum = -2, maximum = 2)]
            pub presence_penalty: Option<f64>,
            #[schema(minimum = -2, maximum = 2)]
            pub frequency_penalty: Option<f64>,
            /// Extension (vLLM): the CTRL repetition penalty (1 disables).
            #[schema(exclusive_minimum = 0, maximum = 10)]
            pub repetition_penalty: Option<f64>,
            /// Token id (as a string, as OpenAI sends it) → bias in -100..100.
            pub logit_bias: Option<HashMap<String, f64>>,
            pub stream: Option<bool>,
            pub stream_options: Option<StreamOptions>,
            pub user: Option<String>,
            /// Extension (vLLM): keep generating past end-of-sequence tokens.
            pub ignore_eos: Option<bool>,
            /// Extension (vLLM): no end-of-sequence or stop before this many tokens.
            pub min_tokens: Option<i64>,
            /// Extension: higher is served first; negative is sheddable under load.
            pub priority: Option<i64>,
            /// Extension (vLLM): token ids that end a choice.
            pub stop_token_ids: Option<Vec<i64>>,
            /// Extension (vLLM): leave special tokens out of the text (default true).
            pub skip_special_tokens: Option<bool>,
            /// Extension (vLLM): the output is JSON valid against this schema (an object or
            /// a string holding one).
            #[schema(value_type = Option<Object>)]
            pub guided_json: Option<Value>,
            /// Extension (vLLM): the output matches this regular expression in full.
            #[schema(value_type = Option<String>)]
            pub guided_regex: Option<Value>,
            /// Extension (vLLM): the output is exactly one of these strings.
            #[schema(value_type = Option<Vec<String>>)]
            pub guided_choice: Option<Value>,
            /// Extension (vLLM): the output follows this grammar (llguidance's Lark dialect).
            #[schema(value_type = Option<String>)]
            pub guided_grammar: Option<Value>,
            /// Extension (vLLM): which guided-decoding library; sluice has one (llguidance),
            /// so any value is accepted and changes nothing.
            #[schema(value_type = Option<String>)]
            pub guided_decoding_backend: Option<Value>,
            /// Extension (vLLM): JSON whitespace; refused (sluice writes JSON compactly).
            #[schema(value_type = Option<String>)]
            pub guided_whitespace_pattern: Option<Value>,
            /// Extension (vLLM ≥ 0.10): `{"json" | "regex" | "choice" | "grammar" |
            /// "json_object": …}`, the same constraints in one object.
            #[schema(value_type = Option<Object>)]
            pub structured_outputs: Option<Value>,
            /// Extension (vLLM): keep the stop string that ended a choice in its text.
            pub include_stop_str_in_output: Option<bool>,
            /// Extension (vLLM): each prompt token's log-probability, rank and this many
            /// most likely alternatives (0..=20), as `prompt_logprobs` (per choice on
            /// completions, beside the choices on chat). Not streamed.
            pub prompt_logprobs: Option<i64>,
            /// Extension (vLLM): log-probabilities name tokens `token_id:<id>`, not by text.
            pub return_tokens_as_token_ids: Option<bool>,
            /// Extension (vLLM): keep only the prompt's last k tokens (-1: the model's
            /// context length), cut after rendering and tokenising.
            pub truncate_prompt_tokens: Option<i64>,
            /// Extension (vLLM): words the output never holds (each as it starts a text and
            /// after a space, tokenised).
            pub bad_words: Option<Vec<String>>,
            /// Extension (vLLM): only these token ids may be sampled.
            pub allowed_token_ids: Option<Vec<i64>>,
            /// Extension (vLLM): beam search with `n` beams (at most 10), the `n` best
            /// answers returned, best first; scored by log-probability over length to the
            /// power `length_penalty` (default 1). Not streamed.
            pub use_beam_search: Option<bool>,
            pub length_penalty: Option<f64>,
        }

        impl $name {
            /// The fields both endpoints share, for validation in one place.
            pub fn sampling_fields(&self) -> SamplingFields {
                SamplingFields {
                    max_tokens: self.max_tokens,
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    min_p: self.min_p,
                    n: self.n,
                    stop: self.stop.clone(),
                    seed: self.seed,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    repetition_penalty: self.repetition_penalty,
                    logit_bias: self.logit_bias.clone(),
                    stream: self.stream,
                    stream_options: self.stream_options.clone(),
                    ignore_eos: self.ignore_eos,
                    min_tokens: self.min_tokens,
                    priority: self.priority,
                    stop_token_ids: self.stop_token_ids.clone(),
                    skip_special_tokens: self.skip_special_tokens,
                    include_stop_str_in_output: self.include_stop_str_in_output,
                    prompt_logprobs: self.prompt_logprobs,
                    return_tokens_as_token_ids: self.return_tokens_as_token_ids,
                    truncate_prompt_tokens: self.truncate_prompt_tokens,
                    bad_words: self.bad_words.clone(),
                    allowed_token_ids: self.allowed_token_ids.clone(),
                    use_beam_search: self.use_beam_search,
                    length_penalty: self.length_penalty,
                }
            }

            /// vLLM's structured-output fields, for [`crate::api::guided`].
            pub fn guided_fields(&self) -> GuidedFields<'_> {
                GuidedFields {
                    json: self.guided_json.as_ref(),
                    regex: self.guided_regex.as_ref(),
                    choice: self.guided_choice.as_ref(),
                    grammar: self.guided_grammar.as_ref(),
                    whitespace_pattern: self.guided_whitespace_pattern.as_ref(),
                    structured_outputs: self.structured_outputs.as_ref(),
                }
            }
        }
    };
}

/// The sampling fields of either request, as parsed.
#[derive(Debug, Clone, Default)]
pub struct SamplingFields {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub n: Option<i64>,
    pub stop: Option<StopSpec>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub priority: Option<i64>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub skip_special_tokens: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
    pub prompt_logprobs: Option<i64>,
    pub return_tokens_as_token_ids: Option<bool>,
    pub truncate_prompt_tokens: Option<i64>,
    pub bad_words: Option<Vec<String>>,
    pub allowed_token_ids: Option<Vec<i64>>,
    pub use_beam_search: Option<bool>,
    pub length_penalty: Option<f64>,
}

/// vLLM's structured-output fields of either request, as parsed.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuidedFields<'a> {
    pub json: Option<&'a Value>,
    pub regex: Option<&'a Value>,
    pub choice: Option<&'a Value>,
    pub grammar: Option<&'a Value>,
    pub whitespace_pattern: Option<&'a Value>,
    pub structured_outputs: Option<&'a Value>,
}

/// A chat message's content: a string or text parts.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

with_sampling_fields! {
    #[derive(Debug, Clone, Deserialize, ToSchema)]
    pub struct ChatCompletionRequest {
        pub model: String,
        pub messages: Vec<ChatMessageIn>,
        /// Newer name for `max_tokens`; wins when both are given.
        pub max_completion_tokens: Option<i64>,
        pub logprobs: Option<bool>,
        pub top_logprobs: Option<i64>,
        /// Function definitions the model may call (`type: function`).
        #[schema(value_type = Option<Object>)]
        pub tools: Option<Value>,
        /// Calls several functions in one answer (default true).
        pub parallel_tool_calls: Option<bool>,
        #[schema(value_type = Option<Object>)]
        pub tool_choice: Option<Value>,
        #[schema(value_type = Option<Object>)]
        pub functions: Option<Value>,
        #[schema(value_type = Option<Object>)]
        pub function_call: Option<Value>,
        /// `text`, `json_object`, or `json_schema` (`{"name", "schema", "strict"}`).
        #[schema(value_type = Option<Object>)]
        pub response_format: Option<Value>,
        #[schema(value_type = Option<Object>)]
        pub audio: Option<Value>,
        #[schema(value_type = Option<Object>)]
        pub prediction: Option<Value>,
        #[schema(value_type = Option<Object>)]
        pub web_search_options: Option<Value>,
        /// Extension (vLLM): end the prompt with the assistant's turn opened (default true).
        pub add_generation_prompt: Option<bool>,
        /// Extension (vLLM): end the prompt inside the final message, right after its text,
        /// so the reply continues it (a reply the caller began); the reply holds only the
        /// continuation. Not with `add_generation_prompt: true`, nor with a response format
        /// or tool calls (their grammar holds a reply from its start).
        pub continue_final_message: Option<bool>,
        /// Extension (vLLM): further variables for the chat template (`enable_thinking`, …).
        #[schema(value_type = Option<Object>)]
        pub chat_template_kwargs: Option<Value>,
        /// Output modalities: only `["text"]`.
        #[schema(value_type = Option<Vec<String>>)]
        pub modalities: Option<Value>,
        /// Extension (vLLM): when the last message is the assistant's, the reply begins with
        /// its text (with `continue_final_message`: the whole message). Not with tool calls.
        pub echo: Option<bool>,
        /// Extension (vLLM): a chat template for this request in place of the model's (only
        /// when the server runs with `--trust-request-chat-template`).
        pub chat_template: Option<String>,
        /// Extension (vLLM): documents for a template that reads them (retrieval-augmented
        /// templates), as its `documents` variable: a list of objects, such as `{"title",
        /// "text"}`. A template that does not read them ignores them.
        #[schema(value_type = Option<Vec<Object>>)]
        pub documents: Option<Value>,
    }
}

/// `prompt`: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PromptSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

with_sampling_fields! {
    #[derive(Debug, Clone, Deserialize, ToSchema)]
    pub struct CompletionRequest {
        pub model: String,
        pub prompt: PromptSpec,
        /// Top alternatives per token, 0..=20 (OpenAI: 0..=5).
        pub logprobs: Option<i64>,
        /// Each choice's text (and log-probabilities) begins with its prompt; with
        /// `max_tokens: 0`, the prompt alone (scoring a text: its tokens' log-probabilities).
        pub echo: Option<bool>,
        pub best_of: Option<i64>,
        #[schema(value_type = Option<String>)]
        pub suffix: Option<Value>,
        /// `text`, `json_object`, or `json_schema` (`{"name", "schema", "strict"}`), as on
        /// chat (vLLM takes it here too).
        #[schema(value_type = Option<Object>)]
        pub response_format: Option<Value>,
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageOut {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopLogprobOut {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprobOut>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the answer is tool calls only.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

/// A function call in an answer.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionOut,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FunctionOut {
    pub name: String,
    /// The arguments as a JSON string.
    pub arguments: String,
}

/// A piece of a streamed call: its index among the choice's calls; the id, type and name
/// come first, then the arguments in pieces.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

impl ToolCallDelta {
    /// A call's first piece: id, type, name, and empty arguments.
    pub fn opening(index: usize, id: String, name: String) -> Self {
        Self {
            index,
            id: Some(id),
            kind: Some("function"),
            function: FunctionDelta {
                name: Some(name),
                arguments: Some(String::new()),
            },
        }
    }

    /// A piece of a call's arguments.
    pub fn arguments(index: usize, piece: String) -> Self {
        Self {
            index,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments: Some(piece),
            },
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageOut,
    pub system_fingerprint: Option<String>,
    /// Extension (vLLM): the prompt's, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<HashMap<String, RankedLogprob>>>>,
}

/// One entry of vLLM's `prompt_logprobs`, keyed by token id.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RankedLogprob {
    pub logprob: f32,
    /// 1 for the most likely token at its position.
    pub rank: u32,
    pub decoded_token: String,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// Internal (`X-Sluice-Token-Ids`): the tokens of this piece, for a routing gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub token_ids: Option<Vec<u32>>,
    /// Internal (`X-Sluice-Token-Ids`): the choice's usage, on the chunk that finishes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub sluice_usage: Option<UsageOut>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    /// `null` on every chunk but the last when usage is asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageOut>>,
    pub system_fingerprint: Option<String>,
}

/// The legacy completions logprobs shape. With `echo` it begins with the prompt's tokens,
/// the first of which has no log-probability (`null`).
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<HashMap<String, f32>>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// Extension (vLLM): the prompt's, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<HashMap<String, RankedLogprob>>>>,
    /// Internal (`X-Sluice-Token-Ids`): the tokens of this piece, for a routing gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub token_ids: Option<Vec<u32>>,
    /// Internal (`X-Sluice-Token-Ids`): the choice's usage, on the chunk that finishes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub sluice_usage: Option<UsageOut>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageOut>>,
    pub system_fingerprint: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Extension (vLLM): the longest prompt + completion.
    pub max_model_len: usize,
    /// Extension (sluice): longer prompts are refused (`--max-prompt-tokens`); absent when
    /// only the context bounds them. A gateway reads it from its replicas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_prompt_tokens: Option<usize>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// `POST /tokenize`: text (rendered as a completion prompt) or chat messages.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    /// With `messages`: append the assistant turn's opening (default true).
    pub add_generation_prompt: Option<bool>,
    /// With `messages`: end inside the final message, as chat completions would.
    pub continue_final_message: Option<bool>,
    /// With `messages`, as chat completions take them: the request's own template (on a
    /// server that trusts them), its further variables and `documents`.
    pub chat_template: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<Value>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub documents: Option<Value>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenizeResponse {
    pub tokens: Vec<u32>,
    pub count: usize,
    pub max_model_len: usize,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// OpenAI's error body.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
}
