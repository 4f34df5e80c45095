//! Rendering a chat into the prompt text the model was trained on.
//!
//! Chat models ship a Jinja template (`tokenizer.chat_template` in GGUF) written for Python's
//! Jinja2 as used by Hugging Face `transformers` and llama.cpp's Python bindings. We render it
//! with minijinja configured to behave like that environment: `trim_blocks` and
//! `lstrip_blocks` on, Python string/dict methods through minijinja-contrib's pycompat,
//! `raise_exception`, `strftime_now` and a Python-style `tojson`.
//!
//! The template comes from a model file, so it is untrusted code: rendering is bounded by an
//! instruction budget (minijinja "fuel", scaled with the number of messages), minijinja's
//! recursion limit, and a cap on the size of the output (see [`ChatTemplate::render`]).

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use candle_core::quantized::gguf_file::Content;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// Name under which the template is stored in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// Instruction budget every render gets, whatever the chat. Real templates (including long
/// tool-calling ones) spend a few hundred to a few thousand instructions on their preamble.
const FUEL_BASE: u64 = 1_000_000;
/// Extra budget per message: real templates spend tens to a few hundred instructions on each.
const FUEL_PER_MESSAGE: u64 = 10_000;
/// Output size allowed whatever the chat.
const OUTPUT_BASE_LIMIT: usize = 4 << 20;
/// Extra output allowed per byte of message text: a template may repeat a message a few times
/// (for tool calls, say), but nothing legitimate multiplies it further.
const OUTPUT_PER_INPUT_BYTE: usize = 8;

/// One message of a chat, as the template sees it (`message['role']`, `message['content']`,
/// and for tool calling `message['tool_calls']`, `message['tool_call_id']`, `message['name']`,
/// absent when not given so that `is defined` tests in templates work).
///
/// `content` also deserialises from OpenAI-style content parts (`[{"type": "text", "text":
/// ...}]`, joined with `\n`, as vLLM does) and from `null` (an empty string); other part types
/// are rejected since this runtime is text-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ... (the template decides which it accepts).
    pub role: String,
    /// The text of the message.
    #[serde(default, deserialize_with = "content_text")]
    pub content: String,
    /// The calls an assistant message made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The author's name (a `tool` message's function name, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with the given role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    /// The message with every text it carries passed through `guard` (content, name, tool call
    /// names and arguments), for [`encode_chat`].
    fn guarded(&self, guard: &impl Fn(&str) -> String) -> Self {
        Self {
            role: self.role.clone(),
            content: guard(&self.content),
            tool_calls: self.tool_calls.as_ref().map(|calls| {
                calls
                    .iter()
                    .map(|c| ToolCall {
                        id: guard(&c.id),
                        kind: c.kind.clone(),
                        function: FunctionCall {
                            name: guard(&c.function.name),
                            arguments: guard_json(&c.function.arguments, guard),
                        },
                    })
                    .collect()
            }),
            tool_call_id: self.tool_call_id.as_deref().map(guard),
            name: self.name.as_deref().map(guard),
        }
    }
}

/// One call in an assistant message, as Hugging Face templates read it
/// (`tool_call.function.name`, `tool_call.function.arguments` as a mapping).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// A called function: its name and arguments (the parsed JSON object when the arguments
/// parse, else the string as sent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

/// Every string in `v` (keys included) passed through `guard`.
fn guard_json(v: &serde_json::Value, guard: &impl Fn(&str) -> String) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        J::String(s) => J::String(guard(s)),
        J::Array(a) => J::Array(a.iter().map(|x| guard_json(x, guard)).collect()),
        J::Object(o) => J::Object(
            o.iter()
                .map(|(k, x)| (guard(k), guard_json(x, guard)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Where a rendered chat ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatEnd {
    /// With the template's opening of a new assistant turn (`add_generation_prompt`).
    NewTurn,
    /// Where the template leaves the last message, closed.
    Closed,
    /// Inside the last message, right after its content, so that the model continues it
    /// (vLLM's `continue_final_message`: a reply the caller has begun, "prefilled").
    ContinueFinal,
}

/// Marks the end of the last message's content while a chat is rendered to be continued
/// ([`ChatEnd::ContinueFinal`]): the prompt is cut there. A Unicode noncharacter, like the
/// tokenizer's guards: never in a vocabulary, never meaningful in a chat.
const CONTINUE_MARK: char = '\u{FDD2}';

/// Renders `messages` (and `tools`, when the template reads them) with `template` and encodes
/// the prompt: the template's own markers are special tokens, while every text that came
/// from the caller (message content, names, tool calls' arguments, tool definitions) is
/// encoded as plain text, so that no message can forge a turn marker.
/// `kwargs` are extra template variables (vLLM's `chat_template_kwargs`, such as
/// `enable_thinking`), caller text too. `end` says where the prompt stops.
pub fn encode_chat(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    end: ChatEnd,
    kwargs: Option<&serde_json::Value>,
) -> Result<Vec<u32>> {
    let guard = |s: &str| tokenizer.guard_text(s).into_owned();
    let mut guarded: Vec<ChatMessage> = messages.iter().map(|m| m.guarded(&guard)).collect();
    if end == ChatEnd::ContinueFinal {
        let last = guarded
            .last_mut()
            .ok_or_else(|| ModelError::Template("there is no final message to continue".into()))?;
        last.content.push(CONTINUE_MARK);
    }
    let tools = tools.map(|t| guard_json(t, &guard));
    let kwargs = kwargs.map(|k| guard_json(k, &guard));
    let rendered = template.render_with_tools(
        &guarded,
        tools.as_ref(),
        end == ChatEnd::NewTurn,
        kwargs.as_ref(),
    )?;
    let prompt = match end {
        ChatEnd::ContinueFinal => cut_at_continue_mark(&rendered)?,
        ChatEnd::NewTurn | ChatEnd::Closed => &rendered,
    };
    tokenizer.encode_chat(prompt)
}

/// The rendered chat up to the end of its last message's content: everything before the
/// one [`CONTINUE_MARK`]. A template that drops the content, or renders it more than once
/// (or a chat whose text already holds the mark), cannot be continued: an error rather
/// than a prompt that is not the chat.
fn cut_at_continue_mark(rendered: &str) -> Result<&str> {
    let mut at = rendered.match_indices(CONTINUE_MARK).map(|(i, _)| i);
    match (at.next(), at.next()) {
        (Some(i), None) => Ok(&rendered[..i]),
        (None, _) => Err(ModelError::Template(
            "the chat template does not render the final message's content, so it cannot be \
             continued"
                .into(),
        )),
        (Some(_), Some(_)) => Err(ModelError::Template(
            "the final message's content appears more than once in the rendered chat, so it \
             cannot be continued"
                .into(),
        )),
    }
}

fn content_text<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        text: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
        Null(()),
    }
    match Content::deserialize(d)? {
        Content::Text(s) => Ok(s),
        Content::Null(()) => Ok(String::new()),
        Content::Parts(parts) => {
            let texts = parts
                .into_iter()
                .map(|p| match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => Ok(t),
                    (kind, _) => Err(serde::de::Error::custom(format!(
                        "unsupported content part of type '{kind}' (only text parts are supported)"
                    ))),
                })
                .collect::<std::result::Result<Vec<_>, D::Error>>()?;
            Ok(texts.join("\n"))
        }
    }
}

/// A compiled chat template. Compiled once; `render` takes `&self` and may be called from many
/// threads at once.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is a [`ModelError::Template`] naming the problem.
    /// `bos_token`/`eos_token` are the texts the template sees under those names.
    pub fn new(source: &str, bos_token: String, eos_token: String) -> Result<Self> {
        let mut env = Environment::new();
        // Hugging Face and llama-cpp-python render with these Jinja2 settings.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_fuel(Some(FUEL_BASE));
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ModelError::Template(format!("compiling: {}", describe(&e))))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token,
            eos_token,
        })
    }

    /// The template stored in a GGUF file (`tokenizer.chat_template`), with the tokenizer's
    /// BOS/EOS texts; `None` when the file has no template.
    pub fn from_gguf(content: &Content, tokenizer: &Tokenizer) -> Result<Option<Self>> {
        let Some(value) = content.metadata.get("tokenizer.chat_template") else {
            return Ok(None);
        };
        let source = value
            .to_string()
            .map_err(|e| ModelError::Metadata(format!("tokenizer.chat_template: {e}")))?;
        Self::for_tokenizer(source, tokenizer).map(Some)
    }

    /// Compiles `source` with `tokenizer`'s BOS/EOS texts: the model's own template, or one
    /// given to the server (`--chat-template`) or in a request.
    pub fn for_tokenizer(source: &str, tokenizer: &Tokenizer) -> Result<Self> {
        let bos = match tokenizer.bos_id() {
            Some(id) => tokenizer.token_to_piece(id)?,
            None => String::new(),
        };
        let eos = tokenizer.token_to_piece(tokenizer.eos_id())?;
        Self::new(source, bos, eos)
    }

    /// Renders `messages`; with `add_generation_prompt` the prompt ends with the opening of an
    /// assistant turn. See [`ChatTemplate::render_with_tools`].
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt, None)
    }

    /// Whether the template reads the `tools` variable (tool definitions); a template that
    /// does not is given them in a system message instead (the gateway's choice).
    pub fn reads_tools(&self) -> bool {
        self.env
            .get_template(TEMPLATE_NAME)
            .map(|t| t.undeclared_variables(false).contains("tools"))
            .unwrap_or(false)
    }

    /// Whether the template renders assistant messages' `tool_calls` itself.
    pub fn reads_tool_calls(&self) -> bool {
        self.source.contains("tool_calls")
    }

    /// Renders `messages` with `tools` (a list of OpenAI tool definitions) as the template's
    /// `tools` variable, undefined when `None`, and `kwargs`' keys as further variables.
    ///
    /// Limits: at most `FUEL_BASE + FUEL_PER_MESSAGE × messages` template instructions, and at
    /// most `OUTPUT_BASE_LIMIT + OUTPUT_PER_INPUT_BYTE × (bytes of roles and contents)` bytes of
    /// output (4 MiB + 8× the chat). Exceeding either, a `raise_exception` in the template, or
    /// any other template error is a [`ModelError::Template`].
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Value>,
    ) -> Result<String> {
        let input_bytes: usize = messages
            .iter()
            .map(|m| m.role.len() + m.content.len() + tool_call_bytes(m))
            .sum::<usize>()
            + tools.map_or(0, |t| t.to_string().len())
            + kwargs.map_or(0, |k| k.to_string().len());
        let fuel = FUEL_BASE.saturating_add(FUEL_PER_MESSAGE.saturating_mul(messages.len() as u64));
        let limit =
            OUTPUT_BASE_LIMIT.saturating_add(OUTPUT_PER_INPUT_BYTE.saturating_mul(input_bytes));

        // Fuel is a setting of the environment; a clone shares the compiled template (it is
        // reference counted) and costs a few microseconds.
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ModelError::Template(describe(&e)))?;
        // The template's own variables win over a keyword argument of the same name.
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            tools => tools.map(Value::from_serialize),
            ..kwargs.map(Value::from_serialize).unwrap_or_default()
        };
        let mut out = CappedWriter {
            buf: Vec::new(),
            limit,
            overflowed: false,
        };
        if let Err(e) = template.render_captured_to(ctx, &mut out) {
            return Err(ModelError::Template(if out.overflowed {
                format!("rendered prompt exceeds the limit of {limit} bytes")
            } else if e.kind() == ErrorKind::OutOfFuel {
                format!(
                    "rendering exceeded the budget of {fuel} template instructions \
                     (runaway loop in the template?)"
                )
            } else {
                describe(&e)
            }));
        }
        String::from_utf8(out.buf)
            .map_err(|e| ModelError::Template(format!("rendered prompt is not UTF-8: {e}")))
    }
}

/// Bytes of a message's tool calls, for the output cap.
fn tool_call_bytes(m: &ChatMessage) -> usize {
    m.tool_calls
        .iter()
        .flatten()
        .map(|c| c.function.name.len() + c.function.arguments.to_string().len())
        .sum()
}

/// A minijinja error with its cause chain, on one line.
fn describe(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// Collects output and fails once it would exceed `limit` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("rendered prompt too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `raise_exception(msg)`: templates call it to reject a chat (wrong role order, say).
fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(format)`: the current date in UTC (Hugging Face uses local time; servers run
/// in UTC). Supports `%Y %y %m %d %-d %e %H %M %S %j %b %B %a %A %p %%`; anything else is an
/// error rather than a silently wrong date.
fn strftime_now(format: String) -> std::result::Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs).map(Value::from)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats a UNIX time (UTC) like Python's `strftime`, for the fields listed at `strftime_now`.
fn strftime(format: &str, unix_secs: u64) -> std::result::Result<String, Error> {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let is_leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let day_of_year = {
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        CUM[month as usize - 1] + day + u32::from(is_leap && month > 2)
    };
    let month_name = MONTHS[month as usize - 1];
    let weekday_name = WEEKDAYS[weekday];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let spec = match chars.next() {
            Some('-') => match chars.next() {
                Some('d') => {
                    out.push_str(&day.to_string());
                    continue;
                }
                other => format!("-{}", other.map(String::from).unwrap_or_default()),
            },
            Some(s) => s.to_string(),
            None => String::new(),
        };
        match spec.as_str() {
            "Y" => out.push_str(&year.to_string()),
            "y" => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            "m" => out.push_str(&format!("{month:02}")),
            "d" => out.push_str(&format!("{day:02}")),
            "e" => out.push_str(&format!("{day:>2}")),
            "H" => out.push_str(&format!("{hour:02}")),
            "M" => out.push_str(&format!("{minute:02}")),
            "S" => out.push_str(&format!("{second:02}")),
            "j" => out.push_str(&format!("{day_of_year:03}")),
            "b" => out.push_str(&month_name[..3]),
            "B" => out.push_str(month_name),
            "a" => out.push_str(&weekday_name[..3]),
            "A" => out.push_str(weekday_name),
            "p" => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            "%" => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported format field '%{other}'"),
                ))
            }
        }
    }
    Ok(out)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `tojson` as Hugging Face defines it (`json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`): Python's `", "`/`": "` separators, no HTML
/// escaping (minijinja's built-in escapes `<`, `>`, `&`, `'`, which changes prompts).
/// `sort_keys` and `ensure_ascii` are accepted; maps already serialise in key order.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ))
        }
        // Python drops the space after ',' when indenting.
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let mut out = Vec::new();
    let formatter = PyFormatter {
        indent,
        item_sep,
        key_sep,
        level: 0,
        has_value: false,
    };
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut ser).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            "tojson: cannot serialise value",
        )
        .with_source(e)
    })?;
    let s = String::from_utf8(out).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            "tojson: produced invalid UTF-8",
        )
        .with_source(e)
    })?;
    Ok(Value::from(s))
}

/// A serde_json formatter reproducing Python's `json.dumps` layout.
struct PyFormatter {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    level: usize,
    has_value: bool,
}

impl PyFormatter {
    fn newline<W: ?Sized + io::Write>(&self, w: &mut W) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.level {
                w.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + io::Write>(&mut self, w: &mut W, c: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(c)
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, c: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        self.has_value = true;
        w.write_all(c)
    }

    fn item<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(self.item_sep.as_bytes())?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(self.key_sep.as_bytes())
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const SMOL: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn tpl(src: &str) -> Result<ChatTemplate> {
        ChatTemplate::new(src, "<s>".into(), "</s>".into())
    }

    #[test]
    fn renders_smollm_template() {
        let t = tpl(SMOL).unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t
            .render(
                &[
                    ChatMessage::new("system", "S"),
                    ChatMessage::new("user", "U"),
                ],
                false,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        );
    }

    #[test]
    fn keyword_arguments_are_variables_the_template_own_ones_win() {
        let src = "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}{{ messages[0].content }}{% if add_generation_prompt %}>{% endif %}";
        let t = tpl(src).unwrap();
        let m = [ChatMessage::new("user", "Hi")];
        let kw = serde_json::json!({"enable_thinking": false, "add_generation_prompt": false});
        let out = t.render_with_tools(&m, None, true, Some(&kw)).unwrap();
        assert_eq!(out, "/no_think Hi>");
        assert_eq!(t.render_with_tools(&m, None, true, None).unwrap(), "Hi>");
    }

    #[test]
    fn jinja2_whitespace_and_python_methods() {
        // trim_blocks eats the newline after a block tag, lstrip_blocks the indent before one.
        let src = "{% for m in messages %}\n  {% if true %}{{ bos_token }}{{ m.content.strip() }}|{{ m.role.upper() }}{% endif %}\n{% endfor %}{{ eos_token }}{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}";
        let out = tpl(src)
            .unwrap()
            .render(&[ChatMessage::new("user", "  x  ")], false)
            .unwrap();
        assert_eq!(out, "<s>x|USER</s>a=1");
    }

    #[test]
    fn raise_exception_reports_its_message() {
        let t = tpl(
            "{% if messages[0].role != 'user' %}{{ raise_exception('bad role') }}{% endif %}ok",
        )
        .unwrap();
        let err = t
            .render(&[ChatMessage::new("tool", "x")], true)
            .unwrap_err();
        assert!(
            matches!(&err, ModelError::Template(m) if m.contains("bad role")),
            "{err}"
        );
        assert_eq!(
            t.render(&[ChatMessage::new("user", "x")], true).unwrap(),
            "ok"
        );
    }

    #[test]
    fn runaway_loops_stop_quickly() {
        for src in [
            "{% for i in range(100000000) %}x{% endfor %}",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        ] {
            let start = Instant::now();
            let err = tpl(src).unwrap().render(&[], true).unwrap_err();
            assert!(matches!(err, ModelError::Template(_)), "{err}");
            assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
        }
        let err =
            tpl("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
                .unwrap()
                .render(&[], true)
                .unwrap_err();
        assert!(err.to_string().contains("budget"), "{err}");
    }

    #[test]
    fn output_is_capped() {
        let src = "{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}";
        let err = tpl(src).unwrap().render(&[], true).unwrap_err();
        assert!(err.to_string().contains("exceeds the limit"), "{err}");
    }

    #[test]
    fn long_conversation_fits_the_budget() {
        let msgs: Vec<ChatMessage> = (0..2000)
            .map(|i| {
                ChatMessage::new(
                    if i % 2 == 0 { "user" } else { "assistant" },
                    "hello ".repeat(50),
                )
            })
            .collect();
        let out = tpl(SMOL).unwrap().render(&msgs, true).unwrap();
        assert!(out.len() > 2000 * 300);
    }

    #[test]
    fn compile_errors_are_template_errors() {
        let err = tpl("{% for m in messages %}").unwrap_err();
        assert!(matches!(err, ModelError::Template(_)), "{err}");
    }

    #[test]
    fn tojson_is_python_style() {
        let t = tpl("{{ {'a': [1, 'é<'], 'b': none} | tojson }}|{{ [1, 2] | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}").unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            "{\"a\": [1, \"é<\"], \"b\": null}|[\n  1,\n  2\n]|[]"
        );
    }

    #[test]
    fn strftime_formats_known_fields() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %-d, %y %H:%M:%S %j %p %%", t).unwrap(),
            "Thursday February 29, 24 13:05:09 060 PM %"
        );
        assert!(strftime("%Q", t).is_err());
        assert!(tpl("{{ strftime_now('%Y') }}")
            .unwrap()
            .render(&[], false)
            .is_ok());
    }

    #[test]
    fn message_content_forms() {
        let m: ChatMessage = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).unwrap();
        assert_eq!(m, ChatMessage::new("user", "hi"));
        let m: ChatMessage = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(m.content, "a\nb");
        let m: ChatMessage =
            serde_json::from_str(r#"{"role":"assistant","content":null}"#).unwrap();
        assert_eq!(m.content, "");
        assert!(serde_json::from_str::<ChatMessage>(
            r#"{"role":"user","content":[{"type":"image_url","image_url":{}}]}"#
        )
        .is_err());
    }

    #[test]
    fn template_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
    }
}
