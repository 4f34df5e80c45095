//! A parser for the Prometheus text exposition format (0.0.4, and the OpenMetrics lines a scrape
//! of vLLM may carry). Readers here need samples — a name, labels and a value — and nothing
//! else: `# HELP`, `# TYPE` and other comments are skipped, and a histogram is read from its
//! `_bucket` series and their `le` label.
//!
//! Two entry points over one line parser:
//! - [`samples`] iterates [`SampleRef`]s borrowed from the text, one `Result` per sample line.
//!   Nothing is allocated for a good line (label values are unescaped only when asked for, and
//!   only if they hold an escape), so the gateway can parse every replica's `/metrics` at each
//!   poll and skip the lines it cannot read.
//! - [`parse`] collects owned [`Sample`]s and fails on the first bad line, naming it, so a
//!   scrape of something that is not `/metrics` fails loudly instead of reading as an idle
//!   replica.
//!
//! Strict where the format is unambiguous (a name, an optional label set with quoted values
//! and the escapes `\\`, `\"` and `\n`, a value, an optional timestamp), lenient where
//! exporters differ (spaces inside the label set, a trailing comma, an OpenMetrics exemplar
//! after the value, `NaN`/`+Inf`/`-Inf` values).
//!
//! Written here rather than taken from a crate. `prometheus-parse` (0.2.5) matches metric names
//! with `\w+`, which has no `:`, so it silently drops every `vllm:*` sample; it also splits
//! label sets on `,` and `=` without decoding escapes (a value holding `,`, `=` or `}` breaks),
//! and allocates a `HashMap` and strings per sample after a regex per line, pulling in regex,
//! chrono and itertools. `openmetrics-parser` is LGPL-3.0 (this workspace is Apache-2.0) and
//! builds the whole family tree through a pest grammar. The `prometheus` crate only encodes.

use std::borrow::Cow;
use std::fmt;

/// One sample line, borrowed from the text: `name{label="value",...} value [timestamp]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRef<'a> {
    pub name: &'a str,
    /// The label set as written, from after `{` up to and including `}` (already checked);
    /// empty when the line has none.
    raw_labels: &'a str,
    pub value: f64,
    /// The timestamp as written: milliseconds in the Prometheus format, seconds in OpenMetrics.
    pub timestamp: Option<f64>,
}

impl<'a> SampleRef<'a> {
    /// The labels in the order they appear, values unescaped.
    pub fn labels(&self) -> Labels<'a> {
        Labels {
            rest: self.raw_labels,
        }
    }

    /// The value of label `key`, if present (borrowed unless it holds an escape).
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        self.labels().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// An owned copy, labels unescaped.
    pub fn to_sample(&self) -> Sample {
        Sample {
            name: self.name.to_string(),
            labels: self
                .labels()
                .map(|(k, v)| (k.to_string(), v.into_owned()))
                .collect(),
            value: self.value,
        }
    }
}

/// The labels of a [`SampleRef`]: `(name, unescaped value)` in the order written.
#[derive(Debug, Clone)]
pub struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, Cow<'a, str>);

    fn next(&mut self) -> Option<Self::Item> {
        // The set was checked when the line was parsed, so this never meets an error.
        let (key, raw, rest) = next_label(self.rest).ok().flatten()?;
        self.rest = rest;
        Some((key, unescape(raw)))
    }
}

/// One sample, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// Label pairs in the order they appear, values unescaped.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if present.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl fmt::Display for Sample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        if !self.labels.is_empty() {
            let l: Vec<String> = self
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect();
            write!(f, "{{{}}}", l.join(","))?;
        }
        write!(f, " {}", self.value)
    }
}

/// A line that is not a comment, blank, or a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based.
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// The samples of an exposition body in order, each line's own `Result`: a caller may skip
/// bad lines or stop at the first.
pub fn samples(text: &str) -> Samples<'_> {
    samples_named(text, |_| true)
}

/// The samples whose name `keep` accepts. Other lines are skipped after their name is read,
/// unchecked: a reader that wants a few series out of hundreds does not pay for the rest.
pub fn samples_named(text: &str, keep: fn(&str) -> bool) -> Samples<'_> {
    Samples {
        lines: text.lines().enumerate(),
        keep,
    }
}

/// Parses a whole exposition body into owned samples; the first bad line is the error.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    samples(text).map(|s| s.map(|s| s.to_sample())).collect()
}

/// The iterator [`samples`] and [`samples_named`] return.
#[derive(Debug, Clone)]
pub struct Samples<'a> {
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
    keep: fn(&str) -> bool,
}

impl<'a> Iterator for Samples<'a> {
    type Item = Result<SampleRef<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        for (i, raw) in self.lines.by_ref() {
            let line = raw.trim_ascii();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let sample = match split_name(line) {
                Ok((name, _)) if !(self.keep)(name) => continue,
                Ok((name, rest)) => parse_rest(name, rest),
                Err(e) => Err(e),
            };
            return Some(sample.map_err(|message| ParseError {
                line: i + 1,
                message,
            }));
        }
        None
    }
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn is_name_char(c: u8) -> bool {
    is_name_start(c) || c.is_ascii_digit()
}

/// Splits a trimmed, non-comment line into its metric name and the rest.
fn split_name(line: &str) -> Result<(&str, &str), String> {
    let bytes = line.as_bytes();
    let name_end = match bytes.first() {
        Some(&c) if is_name_start(c) => bytes
            .iter()
            .position(|&c| !is_name_char(c))
            .unwrap_or(bytes.len()),
        _ => 0,
    };
    if name_end == 0 {
        return Err(format!(
            "{:?} does not start with a metric name",
            clip(line)
        ));
    }
    // `name_end` is at an ASCII byte or the first byte of a character.
    Ok(line.split_at(name_end))
}

/// Parses what follows a sample's name: labels, value, timestamp.
fn parse_rest<'a>(name: &'a str, mut rest: &'a str) -> Result<SampleRef<'a>, String> {
    let mut raw_labels = "";
    if let Some(body) = rest.trim_ascii_start().strip_prefix('{') {
        (raw_labels, rest) = check_labels(body)?;
    }
    // An OpenMetrics exemplar (` # {trace_id="..."} 1.0`) follows the value: drop it.
    if rest.as_bytes().contains(&b'#') {
        if let Some(i) = rest.find(" # ") {
            rest = &rest[..i];
        }
    }
    let mut fields = rest.split_ascii_whitespace();
    let v = fields.next().ok_or_else(|| format!("{name}: no value"))?;
    let value = parse_value(v).ok_or_else(|| format!("{name}: {v:?} is not a number"))?;
    let timestamp = match fields.next() {
        Some(ts) => Some(
            ts.parse::<f64>()
                .map_err(|_| format!("{name}: {ts:?} is not a timestamp"))?,
        ),
        None => None,
    };
    if let Some(extra) = fields.next() {
        return Err(format!("{name}: unexpected {extra:?} after the value"));
    }
    Ok(SampleRef {
        name,
        raw_labels,
        value,
        timestamp,
    })
}

/// Checks the label set `body` opens (the text after `{`) and returns it up to and including
/// its `}`, and what follows.
fn check_labels(body: &str) -> Result<(&str, &str), String> {
    let mut s = body;
    while let Some((_, _, rest)) = next_label(s)? {
        s = rest;
    }
    // `next_label` stopped at the closing brace.
    let close = body.len() - s.trim_ascii_start().len();
    Ok((&body[..=close], &body[close + 1..]))
}

/// The next `key="value"` of a label set and the text after it (past a `,`); `None` at the
/// closing `}`. The value is returned as written, escapes checked but not decoded.
fn next_label(s: &str) -> Result<Option<(&str, &str, &str)>, String> {
    let s = s.trim_ascii_start();
    if s.starts_with('}') {
        return Ok(None);
    }
    let key_end = s
        .bytes()
        .position(|c| !is_name_char(c))
        .ok_or("unterminated label set")?;
    if key_end == 0 {
        return Err(format!("bad label name at {:?}", clip(s)));
    }
    let key = &s[..key_end];
    let s = s[key_end..]
        .trim_ascii_start()
        .strip_prefix('=')
        .ok_or_else(|| format!("label {key}: expected '='"))?
        .trim_ascii_start()
        .strip_prefix('"')
        .ok_or_else(|| format!("label {key}: value must be quoted"))?;
    let end = closing_quote(s).map_err(|e| format!("label {key}: {e}"))?;
    let value = &s[..end];
    let s = s[end + 1..].trim_ascii_start();
    let rest = match s.strip_prefix(',') {
        Some(after) => after,
        None if s.starts_with('}') => s,
        None => return Err(format!("expected ',' or '}}' at {:?}", clip(s))),
    };
    Ok(Some((key, value, rest)))
}

/// The index of the `"` that closes a label value starting at `s`, checking its escapes.
fn closing_quote(s: &str) -> Result<usize, String> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => return Ok(i),
            b'\\' => match b.get(i + 1) {
                Some(b'\\' | b'"' | b'n') => i += 2,
                Some(_) => {
                    let c = s[i + 1..].chars().next().unwrap_or('?');
                    return Err(format!("unknown escape \\{c}"));
                }
                None => break,
            },
            _ => i += 1,
        }
    }
    Err("unterminated value".into())
}

/// Decodes a label value's escapes (checked by [`closing_quote`]).
fn unescape(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(c) => out.push(c),
            None => {}
        }
    }
    Cow::Owned(out)
}

/// A value as Prometheus writes it (Go's float syntax: `NaN`, `+Inf`, `-Inf` too).
pub fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => v.parse().ok(),
    }
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_labels_escapes_timestamps_and_exemplars() {
        let text = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
up 1 1700000000000
vllm:ttft_bucket{le="+Inf",model_name="a \"b\" \\ c\nd",} 7 # {trace_id="x"} 0.5
weird { a = "1" , b="2"} -Inf
nan_metric NaN
"#;
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].label("model_name"), Some("m"));
        assert_eq!(s[0].value, 3.0);
        assert_eq!((s[1].name.as_str(), s[1].value), ("up", 1.0));
        assert_eq!(s[2].label("le"), Some("+Inf"));
        assert_eq!(s[2].label("model_name"), Some("a \"b\" \\ c\nd"));
        assert_eq!(s[2].value, 7.0);
        assert_eq!(
            s[3].labels,
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert_eq!(s[3].value, f64::NEG_INFINITY);
        assert!(s[4].value.is_nan());
    }

    #[test]
    fn bad_lines_are_errors_that_name_the_line() {
        for (text, line, needle) in [
            ("ok 1\n<html>", 2, "metric name"),
            ("a{b=\"1\" 2", 1, "expected ','"),
            ("a{b=1} 2", 1, "quoted"),
            ("a{b=\"1} 2", 1, "unterminated"),
            ("a{b=\"\\t\"} 2", 1, "escape"),
            ("a", 1, "no value"),
            ("a one", 1, "not a number"),
            ("a 1 2 3", 1, "unexpected"),
            ("a 1 noon", 1, "timestamp"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn an_empty_body_has_no_samples() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("# EOF\n\n").unwrap().is_empty());
    }

    #[test]
    fn borrowed_samples_keep_timestamps_and_borrow_plain_labels() {
        let text = "a{x=\"1\",y=\"q\\\"}\"} 2 1700000000000\nb{} 3\n";
        let s: Vec<_> = samples(text).collect::<Result<_, _>>().unwrap();
        assert_eq!(s[0].timestamp, Some(1.7e12));
        assert!(matches!(s[0].label("x"), Some(Cow::Borrowed("1"))));
        // A `}` inside a quoted value does not close the set.
        assert_eq!(s[0].label("y").as_deref(), Some("q\"}"));
        assert_eq!(s[0].label("z"), None);
        assert_eq!(
            (s[1].name, s[1].value, s[1].labels().count()),
            ("b", 3.0, 0)
        );
        assert_eq!(s[1].timestamp, None);
    }

    #[test]
    fn a_bad_line_does_not_stop_the_iterator() {
        let got: Vec<_> = samples("a 1\n<html>\nb 2\n")
            .map(|r| r.map(|s| s.name).map_err(|e| e.line))
            .collect();
        assert_eq!(got, vec![Ok("a"), Err(2), Ok("b")]);
    }

    #[test]
    fn lines_whose_name_is_not_kept_are_skipped_unchecked() {
        let text = "a 1\nb{x=1} ?\nc 2\n<html>\nd\n";
        let got: Vec<_> = samples_named(text, |n| n != "b" && n != "c")
            .map(|r| r.map(|s| s.name).map_err(|e| e.line))
            .collect();
        assert_eq!(got, vec![Ok("a"), Err(4), Err(5)]);
    }

    #[test]
    fn display_writes_a_sample_back() {
        let s = parse("m{a=\"x\\\"y\"} 1.5").unwrap();
        assert_eq!(s[0].to_string(), r#"m{a="x\"y"} 1.5"#);
    }
}
