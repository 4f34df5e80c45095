//! A request's JSON schema as the grammar compiles it (`response_format` and each tool's
//! `parameters`): the string `format`s the grammar cannot enforce are dropped, and objects
//! that list their `properties` are closed to other keys.
//!
//! # Closed objects
//! JSON Schema lets an object carry any key its schema does not forbid, so
//! `{"properties": {"name": …}}` admits `{"name": "x", "note": …, "more": …}`. A sampled model
//! takes that freedom: the default model, asked for one field, writes a dozen invented ones
//! until `max_tokens` cuts the JSON off. An object schema that names its `properties` and says
//! nothing of other keys (no `additionalProperties`, `patternProperties` or
//! `unevaluatedProperties`) is therefore compiled with `"additionalProperties": false`, as
//! OpenAI's strict mode requires of every schema and as vLLM's default grammar backend
//! (XGrammar) does. Every output still validates against the schema as given; a caller who
//! wants other keys says so with `"additionalProperties": true` or a schema for them.
//!
//! An object is left open where closing it would change what the schema accepts, not just
//! narrow it to the listed keys:
//! - it combines with other schemas (`allOf`, `anyOf`, `oneOf`, or `$ref` beside its own
//!   keywords): their properties are allowed too;
//! - it is one of the schemas `allOf` intersects, or a branch of an object's `anyOf`/`oneOf`
//!   (the parent's properties are allowed), or the definition a `$ref` in such a place names;
//! - `required` or `minProperties` asks for keys beyond its `properties`.
//!
//! A `$ref` in such a place that does not name a definition (`#/$defs/…`,
//! `#/definitions/…`) leaves the whole schema as given.

use std::collections::HashSet;

use serde_json::{Map, Value};

/// The string `format`s the grammar enforces (llguidance's). JSON Schema treats `format` as an
/// annotation unless a validator opts in, so any other format (OpenAPI's `byte`, `binary` or
/// `password`, `uri-reference`, a vendor's own) is dropped before compiling rather than
/// refusing the schema: the output is still held to everything else the schema says.
const ENFORCED_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
    "uri",
];

/// Keywords whose value is one schema.
const ONE_SCHEMA: &[&str] = &[
    "additionalProperties",
    "items",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
];

/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// `schema` as the grammar compiles it (see the module's doc). The values of `const`, `enum`,
/// `default` and `examples` are data, not schemas, and stay as they are.
pub fn enforceable(schema: &Value) -> Value {
    let mut schema = schema.clone();
    strip_formats(&mut schema);
    for pointer in objects_to_close(&schema) {
        if let Some(Value::Object(m)) = schema.pointer_mut(&pointer) {
            m.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    schema
}

fn strip_formats(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let unenforced = m
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| !ENFORCED_FORMATS.contains(&f));
            if unenforced {
                m.remove("format");
            }
            m.iter_mut()
                .filter(|(k, _)| !matches!(k.as_str(), "const" | "enum" | "default" | "examples"))
                .for_each(|(_, child)| strip_formats(child));
        }
        Value::Array(items) => items.iter_mut().for_each(strip_formats),
        _ => {}
    }
}

/// JSON pointers of the object schemas to close: first the definitions that must stay open
/// (named by a `$ref` from an open place), then every closable schema elsewhere.
fn objects_to_close(root: &Value) -> Vec<String> {
    let mut refs = Vec::new();
    visit(root, String::new(), false, &|_| false, &mut |m, _, open| {
        if let Some(r) = m.get("$ref").and_then(Value::as_str) {
            if open || m.contains_key("properties") {
                refs.push(r.to_string());
            }
        }
    });
    let Some(open_defs) = open_definitions(root, refs) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let is_open = |p: &str| open_defs.contains(p);
    visit(
        root,
        String::new(),
        false,
        &is_open,
        &mut |m, pointer, open| {
            if !open && closable(m) {
                out.push(pointer.to_string());
            }
        },
    );
    out
}

/// What [`visit`] calls for each schema: its keywords, its JSON pointer, whether its place
/// keeps it open.
type Visitor<'a> = dyn FnMut(&Map<String, Value>, &str, bool) + 'a;

/// Calls `f(schema, its JSON pointer, whether its place keeps it open)` for `v` and every
/// schema under it. The root's definitions are open where `open_def` says of their pointer;
/// definitions deeper down are left open (a `$ref` names them from the root, which
/// [`open_definitions`] does not follow).
fn visit(
    v: &Value,
    pointer: String,
    open: bool,
    open_def: &dyn Fn(&str) -> bool,
    f: &mut Visitor<'_>,
) {
    let Value::Object(m) = v else {
        return;
    };
    f(m, &pointer, open);
    let root = pointer.is_empty();
    let has_properties = m.contains_key("properties");
    for (k, child) in m {
        let at = format!("{pointer}/{}", escape(k));
        match (k.as_str(), child) {
            ("items" | "prefixItems" | "allOf" | "anyOf" | "oneOf", Value::Array(a)) => {
                // allOf intersects its members; an object's anyOf/oneOf branches add to its
                // own properties; tuple items stand alone.
                let open = match k.as_str() {
                    "allOf" => true,
                    "anyOf" | "oneOf" => has_properties,
                    _ => false,
                };
                for (i, s) in a.iter().enumerate() {
                    visit(s, format!("{at}/{i}"), open, open_def, f);
                }
            }
            (k, Value::Object(map)) if SCHEMA_MAPS.contains(&k) => {
                for (name, s) in map {
                    let here = format!("{at}/{}", escape(name));
                    let open = matches!(k, "$defs" | "definitions") && (!root || open_def(&here));
                    visit(s, here, open, open_def, f);
                }
            }
            (k, s) if ONE_SCHEMA.contains(&k) => visit(s, at, false, open_def, f),
            _ => {}
        }
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Whether closing `m` only narrows it to its listed keys (see the module's doc).
fn closable(m: &Map<String, Value>) -> bool {
    let Some(Value::Object(props)) = m.get("properties") else {
        return false;
    };
    let open_or_combined = [
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
        "allOf",
        "anyOf",
        "oneOf",
        "$ref",
        "$dynamicRef",
        "if",
        "dependentSchemas",
        "dependencies",
    ]
    .iter()
    .any(|k| m.contains_key(*k));
    let required_listed = match m.get("required") {
        Some(Value::Array(r)) => r
            .iter()
            .all(|n| n.as_str().is_some_and(|n| props.contains_key(n))),
        _ => true,
    };
    let min_listed = m
        .get("minProperties")
        .and_then(Value::as_u64)
        .is_none_or(|n| n <= props.len() as u64);
    !open_or_combined && required_listed && min_listed
}

/// The JSON pointers of the root's definitions that `refs` name, following definitions that
/// are themselves a `$ref`. `None` when one of them names anything but a root definition
/// (`#/$defs/…`, `#/definitions/…`): then nothing is closed.
fn open_definitions(root: &Value, mut refs: Vec<String>) -> Option<HashSet<String>> {
    let mut open = HashSet::new();
    while let Some(r) = refs.pop() {
        let pointer = r.strip_prefix('#')?;
        let mut parts = pointer.split('/').skip(1);
        let (kind, name, rest) = (parts.next(), parts.next(), parts.next());
        if !matches!(kind, Some("$defs" | "definitions")) || name.is_none() || rest.is_some() {
            return None;
        }
        let target = root.pointer(pointer)?;
        if open.insert(pointer.to_string()) {
            if let Some(next) = target.get("$ref").and_then(Value::as_str) {
                refs.push(next.to_string());
            }
        }
    }
    Some(open)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn formats_the_grammar_cannot_enforce_are_annotations() {
        let schema = json!({
            "type": "object",
            "properties": {
                "secret": {"type": "string", "format": "password"},
                "when": {"type": "string", "format": "date-time"},
                "blob": {"type": "array", "items": {"type": "string", "format": "byte"}},
                "format": {"type": "string", "format": "uuid"},
                "fixed": {"const": {"format": "password"}, "default": {"format": "x"}},
            },
        });
        let out = enforceable(&schema);
        let p = &out["properties"];
        assert!(p["secret"].get("format").is_none());
        assert_eq!(p["when"]["format"], "date-time");
        assert!(p["blob"]["items"].get("format").is_none());
        assert_eq!(p["format"]["format"], "uuid");
        assert_eq!(p["fixed"]["const"], json!({"format": "password"}));
        assert_eq!(p["fixed"]["default"], json!({"format": "x"}));
    }

    fn closed(v: &Value) -> bool {
        v.get("additionalProperties") == Some(&Value::Bool(false))
    }

    #[test]
    fn objects_that_list_their_properties_are_closed_everywhere() {
        let schema = json!({
            "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "type": "object",
            "properties": {
                "at": {"$ref": "#/$defs/Point"},
                "tags": {"type": "array", "items": {"properties": {"k": {}}, "required": ["k"]}},
                "maybe": {"anyOf": [{"properties": {"a": {}}}, {"type": "null"}]},
                "free": {"type": "object"},
                "open": {"properties": {"a": {}}, "additionalProperties": true},
                "typed": {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
                "patterned": {"properties": {"a": {}}, "patternProperties": {"^x": {}}},
            },
        });
        let out = enforceable(&schema);
        let p = &out["properties"];
        assert!(closed(&out));
        assert!(closed(&out["$defs"]["Point"]));
        assert!(closed(&p["tags"]["items"]));
        assert!(
            closed(&p["maybe"]["anyOf"][0]),
            "a branch of a schema with no properties"
        );
        assert!(
            p["free"].get("additionalProperties").is_none(),
            "no properties: a map"
        );
        assert_eq!(p["open"]["additionalProperties"], true);
        assert_eq!(
            p["typed"]["additionalProperties"],
            json!({"type": "integer"})
        );
        assert!(p["patterned"].get("additionalProperties").is_none());
    }

    #[test]
    fn objects_that_combine_with_others_stay_open() {
        let schema = json!({
            "$defs": {
                "Base": {"properties": {"id": {"type": "integer"}}, "required": ["id"]},
                "Alias": {"$ref": "#/$defs/Base2"},
                "Base2": {"properties": {"kind": {}}},
                "Used": {"properties": {"u": {}}},
            },
            "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"name": {}}}],
            "properties": {
                "extended": {"$ref": "#/$defs/Alias", "properties": {"more": {}}},
                "tagged": {
                    "properties": {"kind": {"enum": ["a", "b"]}},
                    "oneOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
                },
                "needs": {"properties": {"a": {}}, "required": ["a", "b"]},
                "many": {"properties": {"a": {}}, "minProperties": 2},
                "used": {"$ref": "#/$defs/Used"},
            },
        });
        let out = enforceable(&schema);
        let p = &out["properties"];
        assert!(!closed(&out), "the root combines with allOf");
        assert!(!closed(&out["allOf"][1]), "an allOf member");
        assert!(!closed(&out["$defs"]["Base"]), "named from allOf");
        assert!(
            !closed(&out["$defs"]["Base2"]),
            "named through an alias beside properties"
        );
        assert!(!closed(&p["extended"]));
        assert!(!closed(&p["tagged"]) && !closed(&p["tagged"]["oneOf"][0]));
        assert!(!closed(&p["needs"]) && !closed(&p["many"]));
        assert!(
            closed(&out["$defs"]["Used"]),
            "a plain reference closes its definition"
        );
    }

    #[test]
    fn a_combining_reference_outside_the_definitions_leaves_everything_open() {
        let schema = json!({
            "properties": {"a": {"properties": {"x": {}}}},
            "items": {"allOf": [{"$ref": "#/properties/a"}, {"properties": {"y": {}}}]},
        });
        assert_eq!(enforceable(&schema), schema);
    }

    #[test]
    fn keys_that_need_escaping_are_closed_at_the_right_place() {
        let schema = json!({"$defs": {"a/b~c": {"properties": {"v": {}}}},
                            "properties": {"x/y": {"properties": {"z": {}}}}});
        let out = enforceable(&schema);
        assert!(closed(&out["$defs"]["a/b~c"]));
        assert!(closed(&out["properties"]["x/y"]));
    }
}
