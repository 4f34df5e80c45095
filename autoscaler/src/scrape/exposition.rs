//! A parser for the Prometheus text exposition format (0.0.4, and the OpenMetrics lines a
//! scrape of vLLM may carry), small enough to own: the scraper needs samples — a name, labels
//! and a value — and nothing else (`# HELP`/`# TYPE` are skipped: histograms are recognised
//! by their `_bucket`/`le` series, which is all the windows need).
//!
//! Written here rather than taken from a crate: the `prometheus` crate in the workspace only
//! encodes, and the parsing crates (`prometheus-parse`) pull in regex and chrono for what is
//! a hundred lines. Strict where the format is unambiguous (a line that is not a sample is an
//! error naming its line number, so a scrape of something that is not `/metrics` fails loudly
//! instead of reading as an idle replica), lenient where exporters differ (timestamps and
//! exemplars are accepted and ignored, values may be `NaN`/`+Inf`).

use std::fmt;

/// One sample line: `name{label="value",...} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
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

/// A line that is not a comment, blank, or a sample.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// Parses a whole exposition body.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).map_err(|message| ParseError {
            line: i + 1,
            message,
        })?);
    }
    Ok(out)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    is_name_start(c) || c.is_ascii_digit()
}

fn parse_line(line: &str) -> Result<Sample, String> {
    let name_end = line
        .char_indices()
        .find(|&(i, c)| {
            if i == 0 {
                !is_name_start(c)
            } else {
                !is_name_char(c)
            }
        })
        .map_or(line.len(), |(i, _)| i);
    if name_end == 0 {
        return Err(format!(
            "{:?} does not start with a metric name",
            clip(line)
        ));
    }
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.trim_start().strip_prefix('{') {
        let (parsed, after) = parse_labels(body)?;
        labels = parsed;
        rest = after;
    }
    // An OpenMetrics exemplar (` # {trace_id="..."} 1.0`) follows the value: drop it.
    let rest = rest.split(" # ").next().unwrap_or(rest);
    let mut fields = rest.split_whitespace();
    let value = fields
        .next()
        .ok_or_else(|| format!("{name}: no value"))
        .and_then(|v| parse_value(v).ok_or_else(|| format!("{name}: {v:?} is not a number")))?;
    if let Some(ts) = fields.next() {
        if ts.parse::<f64>().is_err() {
            return Err(format!("{name}: {ts:?} is not a timestamp"));
        }
    }
    if let Some(extra) = fields.next() {
        return Err(format!("{name}: unexpected {extra:?} after the value"));
    }
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// Parses `key="value",...}` and returns the labels and what follows the `}`.
/// Label pairs in the order they appear.
type Labels = Vec<(String, String)>;

fn parse_labels(mut s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let key_end = s
            .find(|c: char| !is_name_char(c))
            .ok_or("unterminated label set")?;
        if key_end == 0 {
            return Err(format!("bad label name at {:?}", clip(s)));
        }
        let key = s[..key_end].to_string();
        s = s[key_end..].trim_start();
        s = s
            .strip_prefix('=')
            .ok_or_else(|| format!("label {key}: expected '='"))?
            .trim_start();
        s = s
            .strip_prefix('"')
            .ok_or_else(|| format!("label {key}: value must be quoted"))?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("label {key}: unterminated value")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    Some((_, c)) => return Err(format!("label {key}: unknown escape \\{c}")),
                    None => return Err(format!("label {key}: unterminated value")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((key, value));
        s = s[end + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err(format!("expected ',' or '}}' at {:?}", clip(s)));
        }
    }
}

fn parse_value(v: &str) -> Option<f64> {
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
}
