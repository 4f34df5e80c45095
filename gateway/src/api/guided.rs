//! The format an answer is held to: OpenAI's `response_format`, or one of vLLM's
//! structured-output extensions, which clients written for vLLM send (`guided_json`,
//! `guided_regex`, `guided_choice`, `guided_grammar`, or the newer `structured_outputs`
//! object). Both endpoints take them; a request gives at most one. Without this, the extension
//! fields would be ignored like any unknown field and the caller would get unconstrained text
//! it believed constrained.
//!
//! - `guided_json`: a JSON schema (an object, or a string holding one), as `response_format`'s
//!   `json_schema` (see [`super::schema`]).
//! - `guided_regex`: the whole output matches the regular expression (Rust `regex` syntax).
//! - `guided_choice`: the output is exactly one of the strings.
//! - `guided_grammar`: a grammar in llguidance's Lark dialect (vLLM's `guidance` backend
//!   takes the same; its other backends take GBNF, which is not accepted).
//! - `structured_outputs`: `{"json" | "regex" | "choice" | "grammar": …}` or
//!   `{"json_object": true}`; its flags `disable_any_whitespace`,
//!   `disable_additional_properties` and `disable_fallback` describe what sluice does anyway
//!   and are accepted.
//! - `guided_decoding_backend` is accepted and changes nothing (llguidance is the one
//!   library); `guided_whitespace_pattern` is refused (JSON is written compactly).

use serde_json::Value;
use sluice_engine::Grammar;

use super::schema::enforceable;
use super::tools;
use super::types::GuidedFields;
use super::validate::unsupported;
use crate::error::ApiError;

/// The grammar an answer is held to, with the request field its errors name.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerFormat {
    pub grammar: Grammar,
    pub param: &'static str,
}

impl AnswerFormat {
    fn new(grammar: Grammar, param: &'static str) -> Self {
        Self { grammar, param }
    }
}

/// The answer's format from `response_format` and vLLM's fields; `None` for free text.
pub fn answer_format(
    response_format: Option<&Value>,
    g: GuidedFields<'_>,
) -> Result<Option<AnswerFormat>, ApiError> {
    if g.whitespace_pattern.is_some_and(|v| !v.is_null()) {
        return Err(unsupported(
            "guided_whitespace_pattern",
            "JSON is written compactly",
        ));
    }
    let mut formats: Vec<(&'static str, Option<AnswerFormat>)> = Vec::new();
    if given(response_format).is_some() {
        let grammar = tools::response_format(response_format)?;
        formats.push((
            "response_format",
            grammar.map(|g| AnswerFormat::new(g, "response_format")),
        ));
    }
    let fields: [(&'static str, Option<&Value>, Parse); 4] = [
        ("guided_json", g.json, json),
        ("guided_regex", g.regex, regex),
        ("guided_choice", g.choice, choice),
        ("guided_grammar", g.grammar, grammar),
    ];
    for (param, v, parse) in fields {
        if let Some(v) = given(v) {
            formats.push((param, Some(AnswerFormat::new(parse(v, param)?, param))));
        }
    }
    if let Some(v) = given(g.structured_outputs) {
        formats.push(("structured_outputs", Some(structured_outputs(v)?)));
    }
    match formats.as_slice() {
        [] => Ok(None),
        [(_, one)] => Ok(one.clone()),
        [(first, _), (second, _), ..] => Err(ApiError::bad(
            format!("'{second}' and '{first}' both constrain the output: give one"),
            *second,
        )),
    }
}

type Parse = fn(&Value, &'static str) -> Result<Grammar, ApiError>;

/// A field that was sent: present and not `null`.
fn given(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

fn json(v: &Value, param: &'static str) -> Result<Grammar, ApiError> {
    let parsed;
    let schema = match v {
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s)
                .map_err(|e| ApiError::bad(format!("'{param}' is not valid JSON: {e}"), param))?;
            &parsed
        }
        other => other,
    };
    match schema {
        Value::Object(_) | Value::Bool(_) => Ok(Grammar::JsonSchema(enforceable(schema))),
        _ => Err(ApiError::bad(
            format!("'{param}' must be a JSON schema: an object, or a string holding one"),
            param,
        )),
    }
}

fn regex(v: &Value, param: &'static str) -> Result<Grammar, ApiError> {
    match v.as_str() {
        Some(rx) if !rx.is_empty() => Ok(Grammar::Regex(rx.to_string())),
        _ => Err(ApiError::bad(
            format!("'{param}' must be a non-empty regular expression"),
            param,
        )),
    }
}

fn choice(v: &Value, param: &'static str) -> Result<Grammar, ApiError> {
    let strings: Option<Vec<&str>> = v
        .as_array()
        .filter(|a| !a.is_empty())
        .and_then(|a| a.iter().map(Value::as_str).collect());
    let strings = strings.ok_or_else(|| {
        ApiError::bad(
            format!("'{param}' must be a non-empty list of strings"),
            param,
        )
    })?;
    let alternatives: Vec<String> = strings.iter().map(|s| regex_syntax::escape(s)).collect();
    Ok(Grammar::Regex(alternatives.join("|")))
}

fn grammar(v: &Value, param: &'static str) -> Result<Grammar, ApiError> {
    match v.as_str() {
        Some(g) if !g.trim().is_empty() => Ok(Grammar::Lark(g.to_string())),
        _ => Err(ApiError::bad(
            format!("'{param}' must be a grammar in llguidance's Lark syntax"),
            param,
        )),
    }
}

/// vLLM's `structured_outputs` object: exactly one constraint, and flags that describe what
/// sluice does anyway.
fn structured_outputs(v: &Value) -> Result<AnswerFormat, ApiError> {
    const P: &str = "structured_outputs";
    let Some(m) = v.as_object() else {
        return Err(ApiError::bad(format!("'{P}' must be an object"), P));
    };
    let mut found = Vec::new();
    for (k, val) in m.iter().filter(|(_, val)| !val.is_null()) {
        let grammar = match k.as_str() {
            "json" => json(val, P)?,
            "regex" => regex(val, P)?,
            "choice" => choice(val, P)?,
            "grammar" => grammar(val, P)?,
            "json_object" => match val {
                Value::Bool(true) => tools::any_json_object(),
                Value::Bool(false) => continue,
                _ => {
                    return Err(ApiError::bad(
                        format!("'{P}.json_object' must be a boolean"),
                        P,
                    ))
                }
            },
            "disable_any_whitespace" | "disable_additional_properties" | "disable_fallback" => {
                if !val.is_boolean() {
                    return Err(ApiError::bad(format!("'{P}.{k}' must be a boolean"), P));
                }
                continue;
            }
            other => return Err(unsupported(P, &format!("'{other}' is not implemented"))),
        };
        found.push(grammar);
    }
    match found.len() {
        1 => Ok(AnswerFormat::new(found.remove(0), P)),
        0 => Err(ApiError::bad(
            format!("'{P}' needs one of 'json', 'regex', 'choice', 'grammar' or 'json_object'"),
            P,
        )),
        _ => Err(ApiError::bad(
            format!("'{P}' gives more than one constraint: give one"),
            P,
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields<'a>(pairs: &'a [(&str, Value)]) -> GuidedFields<'a> {
        let get = |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
        GuidedFields {
            json: get("guided_json"),
            regex: get("guided_regex"),
            choice: get("guided_choice"),
            grammar: get("guided_grammar"),
            whitespace_pattern: get("guided_whitespace_pattern"),
            structured_outputs: get("structured_outputs"),
        }
    }

    fn format(pairs: &[(&str, Value)]) -> Result<Option<AnswerFormat>, ApiError> {
        answer_format(None, fields(pairs))
    }

    fn param(e: ApiError) -> Option<String> {
        match e {
            ApiError::BadRequest { param, .. } => param,
            other => panic!("not a 400: {other:?}"),
        }
    }

    #[test]
    fn each_field_becomes_its_grammar() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let closed = enforceable(&schema);
        for v in [schema.clone(), Value::String(schema.to_string())] {
            let f = format(&[("guided_json", v)]).unwrap().unwrap();
            assert_eq!(
                f,
                AnswerFormat::new(Grammar::JsonSchema(closed.clone()), "guided_json")
            );
        }
        let f = format(&[("guided_regex", json!("[0-9]{3}"))])
            .unwrap()
            .unwrap();
        assert_eq!(f.grammar, Grammar::Regex("[0-9]{3}".into()));
        let f = format(&[("guided_choice", json!(["yes", "no (1.5)"]))])
            .unwrap()
            .unwrap();
        assert_eq!(f.grammar, Grammar::Regex("yes|no \\(1\\.5\\)".into()));
        let f = format(&[("guided_grammar", json!("start: \"a\"+"))])
            .unwrap()
            .unwrap();
        assert_eq!(f.grammar, Grammar::Lark("start: \"a\"+".into()));
        let f = format(&[(
            "structured_outputs",
            json!({"choice": ["a"], "disable_fallback": true}),
        )])
        .unwrap()
        .unwrap();
        assert_eq!(
            f,
            AnswerFormat::new(Grammar::Regex("a".into()), "structured_outputs")
        );
        let f = format(&[("structured_outputs", json!({"json_object": true}))])
            .unwrap()
            .unwrap();
        assert_eq!(f.grammar, Grammar::JsonSchema(json!({"type": "object"})));
        assert_eq!(format(&[("guided_json", Value::Null)]).unwrap(), None);
    }

    #[test]
    fn bad_values_and_two_constraints_are_400s_naming_the_field() {
        let cases: Vec<(Vec<(&str, Value)>, &str)> = vec![
            (vec![("guided_json", json!(3))], "guided_json"),
            (vec![("guided_json", json!("{not json"))], "guided_json"),
            (vec![("guided_regex", json!(""))], "guided_regex"),
            (vec![("guided_choice", json!([]))], "guided_choice"),
            (vec![("guided_choice", json!(["a", 1]))], "guided_choice"),
            (vec![("guided_grammar", json!(" "))], "guided_grammar"),
            (
                vec![("guided_whitespace_pattern", json!("\\s*"))],
                "guided_whitespace_pattern",
            ),
            (
                vec![("structured_outputs", json!({}))],
                "structured_outputs",
            ),
            (
                vec![("structured_outputs", json!({"regex": "a", "choice": ["b"]}))],
                "structured_outputs",
            ),
            (
                vec![("structured_outputs", json!({"structural_tag": "x"}))],
                "structured_outputs",
            ),
            (
                vec![
                    ("guided_regex", json!("a")),
                    ("guided_choice", json!(["b"])),
                ],
                "guided_choice",
            ),
        ];
        for (pairs, want) in cases {
            let e = format(&pairs).expect_err(&format!("{pairs:?}"));
            assert_eq!(param(e).as_deref(), Some(want), "{pairs:?}");
        }
        let rf = json!({"type": "json_object"});
        let e = answer_format(Some(&rf), fields(&[("guided_regex", json!("a"))])).unwrap_err();
        assert_eq!(param(e).as_deref(), Some("guided_regex"));
    }
}
