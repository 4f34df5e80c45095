//! Structured outputs and tool calling on `/v1/chat/completions`: `response_format` and
//! `tools`/`tool_choice`/`parallel_tool_calls` into an engine [`Grammar`], tool definitions
//! into the prompt, and the model's tool calls back into OpenAI's `tool_calls`.
//!
//! # The tool-call format
//! Where the chat template reads `tools`, it gets the definitions as given. Where it does not
//! (the default model's template), they go into the system message, after its text:
//!
//! ```text
//! # Tools
//!
//! You may call one or more functions. Their signatures, one JSON object a line:
//! <tools>
//! {"type": "function", "function": {"name": …, "description": …, "parameters": …}}
//! </tools>
//!
//! To call a function, answer with one block per call, and nothing else:
//! <tool_call>
//! {"name": <function-name>, "arguments": <arguments-json-object>}
//! </tool_call>
//! ```
//!
//! Whatever the template, the model answers a call in that block form (constrained by the
//! grammar for `required`, a named function and `auto`): `<tool_call>\n{"name":"f",
//! "arguments":{…}}\n</tool_call>` (compact JSON), blocks separated by a newline. Assistant messages that
//! carry `tool_calls` are written back in the same form when the template does not render
//! `tool_calls` itself; `tool` messages keep their role.
//!
//! # What `auto` allows
//! With `tool_choice: auto` the output is either calls or an answer. An output that opens
//! with the call marker `<tool_call>\n` is calls, held to the tools' schemas; any other
//! output is the answer: free text (which may start with `<`, as HTML does), or, when the
//! request also has a JSON `response_format`, JSON valid for it. With `required` or a named
//! function the output is calls only, and `response_format` does not apply to it (OpenAI's
//! `response_format` shapes the assistant's answer, and a call is not one); with `none` the
//! output follows `response_format` alone.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_engine::{Constraint, Grammar};
use sluice_models::chat_template::{ChatMessage, FunctionCall, ToolCall};

use crate::api::guided::AnswerFormat;
use crate::api::schema::enforceable;
use crate::api::types::{FunctionOut, ToolCallDelta, ToolCallOut};
use crate::backend::LocalBackend;
use crate::error::ApiError;

/// Opens a call in the model's output.
pub const CALL_OPEN: &str = "<tool_call>\n";
/// Closes a call; what precedes it is the call's JSON.
pub const CALL_CLOSE: &str = "\n</tool_call>";
/// The JSON of a call up to its arguments (compact, as the grammar writes it).
const NAME_KEY: &str = "{\"name\":\"";
const ARGS_KEY: &str = "\",\"arguments\":";
/// What follows a call's arguments.
const ARGS_END: &str = "}\n</tool_call>";

/// A function the caller offers.
#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    /// Its parameters' JSON schema; none given, an empty parameter list (arguments `{}`), as
    /// OpenAI defines it.
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The request's tools as the rest of the pipeline needs them.
#[derive(Debug, Clone)]
pub struct ToolSet {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// The definitions as sent, for the template's `tools` variable.
    pub definitions: Value,
}

/// What the chat's output must be: the grammar, and the request field it came from.
#[derive(Debug, Clone)]
pub struct Output {
    pub grammar: Option<Grammar>,
    /// The field a grammar error names (`response_format`, `tools`).
    pub param: &'static str,
    /// Whether the output is read back as tool calls.
    pub tool_calls: bool,
}

impl Output {
    pub fn text() -> Self {
        Self::answer(None)
    }

    /// An answer without calls: held to `format` (`response_format` or a vLLM field) if any.
    pub fn answer(format: Option<AnswerFormat>) -> Self {
        let (grammar, param) = match format {
            Some(f) => (Some(f.grammar), f.param),
            None => (None, "response_format"),
        };
        Self {
            grammar,
            param,
            tool_calls: false,
        }
    }
}

fn bad(message: impl Into<String>, param: impl Into<String>) -> ApiError {
    ApiError::bad(message, param)
}

/// JSON mode (`response_format: json_object`, vLLM's `guided_json_object`): any JSON object.
pub fn any_json_object() -> Grammar {
    Grammar::JsonSchema(json!({"type": "object"}))
}

/// `response_format`: `text`, `json_object` or `json_schema` (with `json_schema.schema`).
pub fn response_format(rf: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let Some(rf) = rf.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = rf.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(any_json_object())),
        Some("json_schema") => {
            let js = rf.get("json_schema").ok_or_else(|| {
                bad(
                    "'response_format.json_schema' is required for type 'json_schema'",
                    "response_format.json_schema",
                )
            })?;
            if !js.get("name").is_none_or(Value::is_string) {
                return Err(bad(
                    "'response_format.json_schema.name' must be a string",
                    "response_format.json_schema.name",
                ));
            }
            match js.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(Grammar::JsonSchema(enforceable(s))))
                }
                None => Ok(Some(Grammar::JsonSchema(json!({})))),
                Some(_) => Err(bad(
                    "'response_format.json_schema.schema' must be a JSON schema object",
                    "response_format.json_schema.schema",
                )),
            }
        }
        _ => Err(bad(
            format!(
                "{} is not a valid 'response_format.type': use 'text', 'json_object' or 'json_schema'",
                kind.map_or_else(|| "a missing type".to_string(), |k| format!("'{k}'"))
            ),
            "response_format.type",
        )),
    }
}

/// A function name as OpenAI allows it: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One tool definition; its errors name `tools` (the message says where inside).
fn parse_tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let at = |f: &str| format!("tools[{i}]{f}");
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad(
            format!("'{}' must be 'function'", at(".type")),
            "tools",
        ));
    }
    let f = t
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| bad(format!("'{}' is required", at(".function")), "tools"))?;
    let name = f.get("name").and_then(Value::as_str).unwrap_or("");
    if !valid_name(name) {
        return Err(bad(
            format!(
                "'{}' must be 1 to 64 letters, digits, '_' or '-'",
                at(".function.name")
            ),
            "tools",
        ));
    }
    let parameters = match f.get("parameters") {
        // OpenAI: omitting `parameters` defines a function with an empty parameter list.
        None | Some(Value::Null) => {
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        }
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(bad(
                format!(
                    "'{}' must be a JSON schema object",
                    at(".function.parameters")
                ),
                "tools",
            ))
        }
    };
    Ok(Tool {
        name: name.to_string(),
        parameters,
    })
}

fn tool_choice(v: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    let choice = match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(
                    format!("'{other}' is not a valid 'tool_choice': use 'none', 'auto', 'required' or a named function"),
                    "tool_choice",
                ))
            }
        },
        Some(o) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad(
                        "'tool_choice' must name a function as {\"type\": \"function\", \"function\": {\"name\": …}}",
                        "tool_choice",
                    )
                })?;
            ToolChoice::Named(name.to_string())
        }
    };
    if let ToolChoice::Named(name) = &choice {
        if !tools.iter().any(|t| &t.name == name) {
            return Err(bad(
                format!("'tool_choice' names the function '{name}', which is not in 'tools'"),
                "tool_choice.function.name",
            ));
        }
    }
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(bad(
            "'tool_choice' asks for a tool call but 'tools' is empty",
            "tool_choice",
        ));
    }
    Ok(choice)
}

/// `tools`, `tool_choice` and `parallel_tool_calls`; `None` without tools.
pub fn tool_set(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolSet>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(_) => return Err(bad("'tools' must be a list", "tools")),
    };
    let parsed = list
        .iter()
        .enumerate()
        .map(|(i, t)| parse_tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    let choice = tool_choice(choice, &parsed)?;
    if parsed.is_empty() {
        return Ok(None);
    }
    Ok(Some(ToolSet {
        tools: parsed,
        choice,
        parallel: parallel.unwrap_or(true),
        definitions: Value::Array(list.to_vec()),
    }))
}

/// The schema of one call to `tool`: its name, then its arguments.
fn call_schema(tool: &Tool) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": enforceable(&tool.parameters)},
        "required": ["name", "arguments"],
        "additionalProperties": false,
    })
}

/// `schema` as the grammar embeds it: an object, with JSON written compactly.
fn compact_schema(schema: &Value) -> Value {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        other => other.clone(),
    };
    if let Value::Object(m) = &mut schema {
        m.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
    }
    schema
}

/// The answer `auto` allows besides calls: any text that does not open with the call
/// marker, or JSON for the answer format's schema. Another format (a regular expression or a
/// grammar from vLLM's fields) could match a call's text, so it is refused here.
fn auto_answer(format: Option<&AnswerFormat>) -> Result<String, ApiError> {
    match format.map(|f| (&f.grammar, f.param)) {
        None => {
            // Every non-empty text but those opening with the marker (which are calls).
            Ok("answer: TEXT\nTEXT: /(?s:.+)/ & ~/<tool_call>\\n(?s:.*)/\n".to_string())
        }
        Some((Grammar::JsonSchema(s), _)) => Ok(format!("answer: %json {}\n", compact_schema(s))),
        Some((_, param)) => Err(bad(
            format!(
                "'{param}' cannot be combined with tools under tool_choice 'auto': only a \
                 JSON format can be told apart from a call"
            ),
            param,
        )),
    }
}

impl ToolSet {
    /// The output's grammar and how it is read: calls only (`required`, named), an answer
    /// or calls (`auto`; the answer is text, or JSON for `format`, the `response_format`),
    /// or the answer alone (`none`). Under `auto` the format must be JSON (see
    /// [`auto_answer`]).
    pub fn output(&self, format: Option<&AnswerFormat>) -> Result<Output, ApiError> {
        let tools: Vec<&Tool> = match &self.choice {
            ToolChoice::None => return Ok(Output::answer(format.cloned())),
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
            _ => self.tools.iter().collect(),
        };
        let schemas: Vec<Value> = tools.iter().map(|t| call_schema(t)).collect();
        let schema = compact_schema(&match schemas.as_slice() {
            [one] => one.clone(),
            _ => json!({"anyOf": schemas}),
        });
        let calls = if self.parallel && !matches!(self.choice, ToolChoice::Named(_)) {
            "call (\"\\n\" call)*"
        } else {
            "call"
        };
        let start = if self.choice == ToolChoice::Auto {
            format!("start: calls | answer\n{}", auto_answer(format)?)
        } else {
            "start: calls\n".to_string()
        };
        let lark = format!(
            "{start}calls: {calls}\ncall: \"<tool_call>\\n\" %json {schema} \"\\n</tool_call>\"\n"
        );
        Ok(Output {
            grammar: Some(Grammar::Lark(lark)),
            param: "tools",
            tool_calls: true,
        })
    }

    /// The definitions for a template that reads `tools` (none for `tool_choice: none`).
    pub fn template_tools(&self) -> Option<&Value> {
        (self.choice != ToolChoice::None).then_some(&self.definitions)
    }

    /// The system-message text describing the tools, for templates without `tools`.
    pub fn system_text(&self) -> String {
        let lines: Vec<String> = match &self.definitions {
            Value::Array(a) => a.iter().map(Value::to_string).collect(),
            _ => Vec::new(),
        };
        format!(
            "# Tools\n\nYou may call one or more functions. Their signatures, one JSON object a line:\n<tools>\n{}\n</tools>\n\nTo call a function, answer with one block per call, and nothing else:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <arguments-json-object>}}\n</tool_call>",
            lines.join("\n")
        )
    }
}

/// Puts the tools' description into the system message (first, added when there is none).
pub fn add_system_text(messages: &mut Vec<ChatMessage>, text: &str) {
    match messages.first_mut() {
        Some(m) if m.role == "system" => {
            if !m.content.is_empty() {
                m.content.push_str("\n\n");
            }
            m.content.push_str(text);
        }
        _ => messages.insert(0, ChatMessage::new("system", text)),
    }
}

/// An assistant message's calls written into its content in the block form, for templates
/// that do not render `tool_calls`.
pub fn inline_tool_calls(m: &mut ChatMessage) {
    let Some(calls) = m.tool_calls.take() else {
        return;
    };
    let blocks: Vec<String> = calls
        .iter()
        .map(|c| {
            let call = json!({"name": c.function.name, "arguments": c.function.arguments});
            format!("{CALL_OPEN}{}{CALL_CLOSE}", compact(&call))
        })
        .collect();
    if !m.content.is_empty() {
        m.content.push('\n');
    }
    m.content.push_str(&blocks.join("\n"));
}

/// JSON without spaces, as the grammar writes it.
fn compact(v: &Value) -> String {
    v.to_string()
}

/// An incoming assistant message's `tool_calls` in the template's form.
pub fn message_tool_calls(i: usize, v: &Value) -> Result<Vec<ToolCall>, ApiError> {
    let at = format!("messages[{i}].tool_calls");
    let list = v
        .as_array()
        .ok_or_else(|| bad(format!("'{at}' must be a list"), at.clone()))?;
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            let f = c.get("function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            let (Some(name), Some(f)) = (name, f) else {
                return Err(bad(
                    format!("'{at}[{j}].function.name' is required"),
                    format!("{at}[{j}].function.name"),
                ));
            };
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                }
                Some(other) => other.clone(),
                None => json!({}),
            };
            Ok(ToolCall {
                id: c
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                kind: "function".into(),
                function: FunctionCall {
                    name: name.to_string(),
                    arguments,
                },
            })
        })
        .collect()
}

/// How long compiling a request's grammar may take before the request is refused. Compiling
/// runs on a blocking thread, never on the engine's; llguidance's own limits (grammar size,
/// lexer work) usually refuse a hostile schema far sooner.
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(5);

/// Compiles `grammar` for the local engine; a schema it cannot enforce is a 400 naming
/// `param` and llguidance's reason (an unsupported keyword, an invalid schema, a limit).
pub async fn compile(
    backend: &LocalBackend,
    grammar: Grammar,
    param: &'static str,
) -> Result<Arc<Constraint>, ApiError> {
    let engine = backend.engine().clone();
    let task = tokio::task::spawn_blocking(move || engine.compile(&grammar));
    match tokio::time::timeout(COMPILE_TIMEOUT, task).await {
        Err(_) => Err(ApiError::BadRequest {
            message: format!(
                "'{param}' is too complex: its grammar did not compile within {} s",
                COMPILE_TIMEOUT.as_secs()
            ),
            param: Some(param.to_string()),
            code: Some("invalid_schema"),
        }),
        Ok(Err(e)) => {
            tracing::error!("compiling a grammar panicked: {e}");
            Err(ApiError::Internal)
        }
        Ok(Ok(Err(e))) => {
            let unsupported = e.0.contains("Unimplemented") || e.0.contains("not supported");
            Err(ApiError::BadRequest {
                message: format!("'{param}' cannot be enforced: {e}"),
                param: Some(param.to_string()),
                code: Some(if unsupported {
                    "unsupported_schema_feature"
                } else {
                    "invalid_schema"
                }),
            })
        }
        Ok(Ok(Ok(c))) => Ok(c),
    }
}

/// A new call id, `call_` and 24 letters and digits.
pub fn call_id() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

/// Reads a choice's text as tool calls as it streams: first the id and name of each call,
/// then its arguments in pieces. In `auto` mode, text that does not open a call is content.
#[derive(Debug, Default)]
pub struct CallReader {
    buf: String,
    /// Bytes of `buf` already read.
    pos: usize,
    /// Undecided (`auto`, nothing seen yet), or reading text rather than calls.
    text: Option<bool>,
    /// The current call's arguments start here, and how much of them went out.
    args: Option<(usize, usize)>,
    calls: usize,
}

/// What a piece of output means.
#[derive(Debug, Default, PartialEq)]
pub struct Read {
    pub content: String,
    pub calls: Vec<ToolCallDelta>,
}

impl CallReader {
    /// A reader for calls only (`required`, named) or text or calls (`auto`).
    pub fn new(calls_only: bool) -> Self {
        Self {
            text: calls_only.then_some(false),
            ..Self::default()
        }
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Reads `text`, the choice's next piece of output.
    pub fn push(&mut self, text: &str) -> Read {
        self.buf.push_str(text);
        let mut out = Read::default();
        if self.text.is_none() && !CALL_OPEN.starts_with(self.buf.as_str()) {
            self.text = Some(!self.buf.starts_with(CALL_OPEN));
        }
        if self.text.is_none() {
            // Still a prefix of the call marker: wait for more.
            return out;
        }
        if self.text == Some(true) {
            out.content = self.buf[self.pos..].to_string();
            self.pos = self.buf.len();
            return out;
        }
        while self.step(&mut out) {}
        out
    }

    /// One advance in call mode; false when it needs more text.
    fn step(&mut self, out: &mut Read) -> bool {
        let rest = &self.buf[self.pos..];
        match self.args {
            None => {
                let rest = rest.strip_prefix('\n').unwrap_or(rest);
                let skipped = self.buf.len() - self.pos - rest.len();
                let Some(head) = rest.strip_prefix(CALL_OPEN) else {
                    return false;
                };
                let Some(named) = head.strip_prefix(NAME_KEY) else {
                    return false;
                };
                let Some(end) = named.find(ARGS_KEY) else {
                    return false;
                };
                let name = named[..end].to_string();
                let start =
                    self.pos + skipped + CALL_OPEN.len() + NAME_KEY.len() + end + ARGS_KEY.len();
                out.calls
                    .push(ToolCallDelta::opening(self.calls, call_id(), name));
                self.calls += 1;
                self.args = Some((start, start));
                self.pos = start;
                true
            }
            Some((start, sent)) => {
                let args = &self.buf[start..];
                let (upto, done) = match args.find(ARGS_END) {
                    Some(e) => (e, true),
                    None => (args.len() - held_back(args), false),
                };
                let upto = upto.max(sent - start);
                if upto > sent - start {
                    let piece = args[sent - start..upto].to_string();
                    out.calls
                        .push(ToolCallDelta::arguments(self.calls - 1, piece));
                }
                if done {
                    self.pos = start + upto + ARGS_END.len();
                    self.args = None;
                    return true;
                }
                self.args = Some((start, start + upto));
                false
            }
        }
    }

    /// Text held back while it could still open a call (`auto`, a prefix of the marker so
    /// far): content if the output ends there.
    pub fn undecided(&self) -> &str {
        match self.text {
            None => &self.buf,
            Some(_) => "",
        }
    }

    /// Whatever text was not read as calls (a call cut short, or stray text), for the end.
    pub fn leftover(&self) -> &str {
        if self.text == Some(true) {
            return "";
        }
        let rest = &self.buf[self.pos..];
        if rest.trim().is_empty() {
            ""
        } else {
            rest
        }
    }
}

/// Bytes at the end of `args` that may begin [`ARGS_END`] (held until the next piece).
fn held_back(args: &str) -> usize {
    (1..=ARGS_END.len().min(args.len()))
        .rev()
        .find(|&n| {
            args.is_char_boundary(args.len() - n) && ARGS_END.starts_with(&args[args.len() - n..])
        })
        .unwrap_or(0)
}

/// A whole output read as calls: the calls, and any text that was not a call.
pub fn read_all(text: &str, calls_only: bool) -> (Vec<ToolCallOut>, String) {
    let mut r = CallReader::new(calls_only);
    let read = r.push(text);
    let mut calls: Vec<ToolCallOut> = Vec::new();
    for d in read.calls {
        match d.id {
            Some(id) => calls.push(ToolCallOut {
                id,
                kind: "function",
                function: FunctionOut {
                    name: d.function.name.unwrap_or_default(),
                    arguments: String::new(),
                },
            }),
            None => {
                if let Some(c) = calls.get_mut(d.index) {
                    c.function.arguments += d.function.arguments.as_deref().unwrap_or("");
                }
            }
        }
    }
    // A call still open at the end was cut short: its text is content.
    if r.args.is_some() {
        calls.pop();
        let content = text[text.rfind(CALL_OPEN).unwrap_or(0)..].to_string();
        return (calls, read.content + &content);
    }
    (calls, read.content + r.leftover())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"n\":{\"a\":1}}}\n</tool_call>\n<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>";

    #[test]
    fn calls_are_read_whole_or_piece_by_piece() {
        let (calls, rest) = read_all(TWO, true);
        assert_eq!(rest, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(
            calls[0].function.arguments,
            "{\"city\":\"Paris\",\"n\":{\"a\":1}}"
        );
        assert_eq!(calls[1].function.arguments, "{}");
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
        // One character at a time gives the same calls, the name before any argument.
        let mut r = CallReader::new(true);
        let mut args = [String::new(), String::new()];
        let mut names = Vec::new();
        for c in TWO.chars() {
            for d in r.push(&c.to_string()).calls {
                if let Some(n) = d.function.name {
                    assert!(args[d.index].is_empty());
                    names.push(n);
                }
                args[d.index] += d.function.arguments.as_deref().unwrap_or("");
            }
        }
        assert_eq!(names, ["get_weather", "now"]);
        assert_eq!(args[0], calls[0].function.arguments);
        assert_eq!(args[1], "{}");
    }

    #[test]
    fn auto_text_is_content_and_cut_calls_are_text() {
        let (calls, rest) = read_all("Hello there", false);
        assert!(calls.is_empty());
        assert_eq!(rest, "Hello there");
        let cut = "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":";
        let (calls, rest) = read_all(cut, false);
        assert!(calls.is_empty());
        assert_eq!(rest, cut);
    }

    #[test]
    fn auto_text_may_open_with_a_less_than_sign() {
        let (calls, rest) = read_all("<b>bold</b>", false);
        assert!(calls.is_empty());
        assert_eq!(rest, "<b>bold</b>");
        // A prefix of the marker waits; once it is not the marker it is content.
        let mut r = CallReader::new(false);
        assert_eq!(r.push("<tool"), Read::default());
        assert_eq!(r.push("box>").content, "<toolbox>");
        let mut r = CallReader::new(false);
        assert_eq!(r.push("<tool_c"), Read::default());
        assert_eq!(r.undecided(), "<tool_c");
        let read = r.push("all>\n{\"name\":\"f\",\"arguments\":");
        assert_eq!(read.calls.len(), 1, "{read:?}");
        // Cut short at a marker prefix, the text is content at the end.
        let (calls, rest) = read_all("<tool_", false);
        assert!(calls.is_empty());
        assert_eq!(rest, "<tool_");
    }

    #[test]
    fn auto_grammars_allow_text_or_the_response_format() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let set = tool_set(Some(&tools), None, None).unwrap().unwrap();
        let Some(Grammar::Lark(g)) = set.output(None).unwrap().grammar else {
            panic!("a grammar");
        };
        assert!(g.contains("start: calls | answer\nanswer: TEXT\n"), "{g}");
        assert!(g.contains("~/<tool_call>\\n(?s:.*)/"), "{g}");
        let format = AnswerFormat {
            grammar: Grammar::JsonSchema(json!({"type": "object"})),
            param: "response_format",
        };
        let o = set.output(Some(&format)).unwrap();
        let Some(Grammar::Lark(g)) = o.grammar else {
            panic!("a grammar");
        };
        assert!(g.contains("answer: %json {"), "{g}");
        assert!(o.tool_calls);
        // `required` is calls only, whatever the format; `none` is the format alone.
        let required = tool_set(Some(&tools), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        let Some(Grammar::Lark(g)) = required.output(Some(&format)).unwrap().grammar else {
            panic!("a grammar");
        };
        assert!(
            g.starts_with("start: calls\n") && !g.contains("answer"),
            "{g}"
        );
        let none = tool_set(Some(&tools), Some(&json!("none")), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            none.output(Some(&format)).unwrap().grammar,
            Some(format.grammar)
        );
        // A regular expression could match a call's text: refused under `auto`, naming its
        // field; `none` takes it as the answer's format.
        let regex = AnswerFormat {
            grammar: Grammar::Regex("[0-9]+".into()),
            param: "guided_regex",
        };
        let Err(ApiError::BadRequest { param, .. }) = set.output(Some(&regex)) else {
            panic!("a 400");
        };
        assert_eq!(param.as_deref(), Some("guided_regex"));
        assert!(none.output(Some(&regex)).is_ok());
    }

    #[test]
    fn tool_choice_and_tools_are_checked() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let named = json!({"type": "function", "function": {"name": "g"}});
        let e = tool_set(Some(&tools), Some(&named), None).unwrap_err();
        assert!(
            matches!(e, ApiError::BadRequest { param: Some(p), .. } if p == "tool_choice.function.name")
        );
        let bad_name = json!([{"type": "function", "function": {"name": "a b"}}]);
        assert!(tool_set(Some(&bad_name), None, None).is_err());
        let set = tool_set(Some(&tools), Some(&json!("required")), Some(false))
            .unwrap()
            .unwrap();
        let Some(Grammar::Lark(g)) = set.output(None).unwrap().grammar else {
            panic!("a grammar");
        };
        assert!(g.starts_with("start: calls\ncalls: call\n"), "{g}");
        let none = tool_set(Some(&tools), Some(&json!("none")), None)
            .unwrap()
            .unwrap();
        assert!(none.output(None).unwrap().grammar.is_none() && none.template_tools().is_none());
    }

    #[test]
    fn inlined_calls_use_the_block_form() {
        let mut m = ChatMessage::new("assistant", "");
        m.tool_calls = Some(
            message_tool_calls(
                0,
                &json!([{"id": "x", "type": "function",
            "function": {"name": "now", "arguments": "{\"tz\":\"UTC\"}"}}]),
            )
            .unwrap(),
        );
        inline_tool_calls(&mut m);
        assert_eq!(
            m.content,
            "<tool_call>\n{\"name\":\"now\",\"arguments\":{\"tz\":\"UTC\"}}\n</tool_call>"
        );
    }
}
