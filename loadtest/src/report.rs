//! What a run says: the final table on stdout, `--json` with vLLM bench's key names plus the
//! configuration, `--per-request` JSON lines. Nothing here measures; it formats [`Summary`].

use std::io::Write;
use std::path::Path;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use serde_json::{json, Map, Value};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::{Record, Stats, Summary};
use crate::prompt::Calibration;

/// One load level's figures (a sweep has several).
#[derive(Debug, Clone)]
pub struct Point {
    pub label: String,
    /// The open-loop rate asked for, if any.
    pub offered_rate: Option<f64>,
    pub summary: Summary,
    pub records: Vec<Record>,
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct Report {
    pub config: Config,
    pub model: String,
    pub dataset: String,
    pub calibration: Calibration,
    /// Statements about approximations and scaling, printed and kept in the JSON.
    pub notes: Vec<String>,
    pub points: Vec<Point>,
}

fn stat_keys(m: &mut Map<String, Value>, name: &str, s: &Stats) {
    m.insert(format!("mean_{name}_ms"), json!(s.mean));
    m.insert(format!("median_{name}_ms"), json!(s.median));
    m.insert(format!("std_{name}_ms"), json!(s.std));
    m.insert(format!("p50_{name}_ms"), json!(s.median));
    m.insert(format!("p90_{name}_ms"), json!(s.p90));
    m.insert(format!("p95_{name}_ms"), json!(s.p95));
    m.insert(format!("p99_{name}_ms"), json!(s.p99));
    m.insert(format!("max_{name}_ms"), json!(s.max));
}

/// `key:count` pairs, space-separated.
fn counts(m: &std::collections::BTreeMap<String, u64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A summary as vLLM bench's flat JSON keys.
pub fn vllm_keys(p: &Point) -> Map<String, Value> {
    let s = &p.summary;
    let mut m = Map::new();
    m.insert("label".into(), json!(p.label));
    m.insert("request_rate".into(), json!(p.offered_rate));
    m.insert("completed".into(), json!(s.completed));
    m.insert("failed".into(), json!(s.failed));
    m.insert("duration".into(), json!(s.duration));
    m.insert("total_input_tokens".into(), json!(s.total_input_tokens));
    m.insert("total_output_tokens".into(), json!(s.total_output_tokens));
    m.insert("request_throughput".into(), json!(s.request_throughput));
    m.insert("request_goodput".into(), json!(s.request_goodput));
    m.insert("output_throughput".into(), json!(s.output_throughput));
    m.insert(
        "total_token_throughput".into(),
        json!(s.total_token_throughput),
    );
    m.insert("max_concurrency_observed".into(), json!(s.max_in_flight));
    stat_keys(&mut m, "ttft", &s.ttft);
    stat_keys(&mut m, "tpot", &s.tpot);
    stat_keys(&mut m, "itl", &s.itl);
    stat_keys(&mut m, "e2el", &s.e2el);
    m.insert("errors".into(), json!(s.errors));
    m.insert("error_types".into(), json!(s.error_types));
    m.insert("output_token_source".into(), json!(s.token_sources));
    m.insert("itl_exact_requests".into(), json!(s.itl_exact_requests));
    m.insert("retried_stale_connection".into(), json!(s.retried_stale));
    m
}

impl Report {
    /// The `--json` document: a single run's keys at the top level (as vLLM writes them), a
    /// sweep's points under `sweep`; the configuration and notes alongside.
    pub fn to_json(&self) -> Value {
        let mut top = if self.points.len() == 1 {
            vllm_keys(&self.points[0])
        } else {
            let mut m = Map::new();
            m.insert(
                "sweep".into(),
                Value::Array(
                    self.points
                        .iter()
                        .map(|p| Value::Object(vllm_keys(p)))
                        .collect(),
                ),
            );
            m
        };
        top.insert("model_id".into(), json!(self.model));
        top.insert("dataset".into(), json!(self.dataset));
        top.insert("prompt_lengths".into(), json!(self.calibration));
        top.insert("notes".into(), json!(self.notes));
        top.insert(
            "config".into(),
            serde_json::to_value(&self.config).unwrap_or(Value::Null),
        );
        Value::Object(top)
    }

    /// The human report: header lines, then one table (a column per point).
    pub fn render(&self) -> String {
        let mut out = format!(
            "model: {}  endpoint: {:?}  stream: {}\n",
            self.model, self.config.endpoint, self.config.stream
        );
        out.push_str(&format!("dataset: {}\n", self.dataset));
        out.push_str(&format!("prompt lengths: {}\n", self.calibration));
        for n in &self.notes {
            out.push_str(n);
            out.push('\n');
        }
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        let mut header = vec![Cell::new("")];
        header.extend(self.points.iter().map(|p| Cell::new(&p.label)));
        t.set_header(header);
        self.throughput_rows(&mut t);
        self.latency_rows(&mut t);
        self.count_rows(&mut t);
        out.push_str(&t.to_string());
        out.push('\n');
        out
    }

    /// One table row: `name`, then `f` of each point's summary.
    fn row(&self, t: &mut Table, name: &str, f: impl Fn(&Summary) -> String) {
        let mut r = vec![Cell::new(name)];
        r.extend(
            self.points
                .iter()
                .map(|p| Cell::new(f(&p.summary)).set_alignment(CellAlignment::Right)),
        );
        t.add_row(r);
    }

    fn any(&self, f: impl Fn(&Summary) -> bool) -> bool {
        self.points.iter().any(|p| f(&p.summary))
    }

    fn throughput_rows(&self, t: &mut Table) {
        self.row(t, "completed / failed", |s| {
            format!("{} / {}", s.completed, s.failed)
        });
        self.row(t, "duration (s)", |s| format!("{:.2}", s.duration));
        self.row(t, "request throughput (req/s)", |s| {
            format!("{:.2}", s.request_throughput)
        });
        self.row(t, "output throughput (tok/s)", |s| {
            format!("{:.1}", s.output_throughput)
        });
        self.row(t, "total token throughput (tok/s)", |s| {
            format!("{:.1}", s.total_token_throughput)
        });
        if self.any(|s| s.request_goodput.is_some()) {
            self.row(t, "request goodput (req/s)", |s| {
                s.request_goodput.map_or("-".into(), |g| format!("{g:.2}"))
            });
        }
        self.row(t, "input / output tokens", |s| {
            format!("{} / {}", s.total_input_tokens, s.total_output_tokens)
        });
    }

    fn latency_rows(&self, t: &mut Table) {
        for (name, get) in [
            ("TTFT", (|s: &Summary| s.ttft) as fn(&Summary) -> Stats),
            ("TPOT", |s: &Summary| s.tpot),
            ("ITL", |s: &Summary| s.itl),
            ("E2E", |s: &Summary| s.e2el),
        ] {
            self.row(t, &format!("{name} mean ± std (ms)"), |s| {
                let v = get(s);
                if v.count == 0 {
                    "-".into()
                } else {
                    format!("{:.2} ± {:.2}", v.mean, v.std)
                }
            });
            self.row(t, &format!("{name} p50/p90/p95/p99 (ms)"), |s| {
                let v = get(s);
                if v.count == 0 {
                    "-".into()
                } else {
                    format!("{:.1}/{:.1}/{:.1}/{:.1}", v.median, v.p90, v.p95, v.p99)
                }
            });
        }
    }

    fn count_rows(&self, t: &mut Table) {
        self.row(t, "output tokens counted by", |s| counts(&s.token_sources));
        self.row(t, "ITL tokens per chunk exact", |s| {
            format!("{} req", s.itl_exact_requests)
        });
        self.row(t, "max in flight", |s| s.max_in_flight.to_string());
        self.row(t, "errors", |s| {
            if s.errors.is_empty() {
                "none".into()
            } else {
                counts(&s.errors)
            }
        });
        if self.any(|s| !s.error_types.is_empty()) {
            self.row(t, "errors by server type", |s| counts(&s.error_types));
        }
        if self.any(|s| s.retried_stale > 0) {
            self.row(t, "retried after a stale keep-alive connection", |s| {
                format!("{} req (not failures)", s.retried_stale)
            });
        }
    }

    /// Writes `--json`.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.to_json()).expect("serialisable");
        std::fs::write(path, text).map_err(|source| Error::Write {
            path: path.to_owned(),
            source,
        })
    }

    /// Writes `--per-request`: one JSON object per request, with its point's label.
    pub fn write_per_request(&self, path: &Path) -> Result<()> {
        let err = |source| Error::Write {
            path: path.to_owned(),
            source,
        };
        let f = std::fs::File::create(path).map_err(err)?;
        let mut w = std::io::BufWriter::new(f);
        for (label, r) in crate::session::all_records(self) {
            let mut v = serde_json::to_value(r).expect("serialisable");
            v["point"] = json!(label);
            serde_json::to_writer(&mut w, &v).expect("serialisable");
            w.write_all(b"\n").map_err(err)?;
        }
        w.flush().map_err(err)
    }

    /// Whether any point's error rate is above `--max-error-rate`.
    pub fn error_rate_exceeded(&self) -> Option<f64> {
        let limit = self.config.max_error_rate?;
        self.points
            .iter()
            .map(|p| p.summary.error_rate())
            .find(|&r| r > limit)
    }
}
