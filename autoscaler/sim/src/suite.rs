//! The trace suite: seeded synthetic families plus the shared real traces, every policy run
//! over each, one table of trace × policy and one SVG per trace.
//!
//! The families cover what a policy tuned on one trace has not seen: steady Poisson arrivals,
//! gamma-distributed gaps with shape below one (bursts and lulls), a flash crowd (×10 for two
//! minutes), a diurnal swing, code-like traffic (long prompts, short outputs), long-output chat,
//! a mixture of these, sessions separated by long idle gaps (where a pool may go to zero), a
//! slow stream of very long, heavy-tailed prompts (where the tail, not the rate, sets the
//! fleet), and bursty code completion whose level drifts by multiples within a start-up.
//! Each is generated from a seed, so the suite is the same every run.

use std::path::{Path, PathBuf};

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Gamma, LogNormal};
use serde::{Deserialize, Serialize};

use sluice_policy::timeline::Request;

use crate::error::{Error, Result};
use crate::report::{self, Summary, Timeline};
use crate::scenario::{self, Scenario};
use crate::{plot, trace};

/// A synthetic traffic family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// Poisson arrivals of conversation-like requests.
    Poisson,
    /// Gamma-distributed gaps, shape 0.25: bursts and lulls at the same mean rate.
    GammaBursts,
    /// Poisson, with the rate ×10 for two minutes at 40 % of the trace.
    FlashCrowd,
    /// Poisson with a rate swinging ±80 % over the trace (a day compressed).
    Diurnal,
    /// Code assistance: prompts of ~3k tokens, outputs of ~60.
    CodeLike,
    /// Chat with long answers: prompts of ~300 tokens, outputs of ~900.
    LongOutput,
    /// Conversation Poisson + code-like gamma bursts + a flash crowd of long outputs.
    Mixture,
    /// Poisson sessions of five minutes separated by twenty idle minutes: what scale to zero
    /// saves, and what its cold starts cost.
    IdleGaps,
    /// About one request a second (swinging ±60 % over the trace) of very long prompts (median
    /// 5k tokens, mean ~9k, a tail to 120k) and chat-length answers: a replica's prefill is
    /// mostly idle, but blocked for seconds by the longest prompts now and then.
    LongPrompts,
    /// Code completion whose level drifts: gamma gaps (shape 0.3) under a rate that takes a
    /// log-normal step (σ 0.55) every one to three minutes, held within 0.2–3× its base. Swings
    /// of ×3 or more within one start-up, in either direction, that no trend sees coming.
    CodeDrift,
    /// Code completion at a steady rate plus batches sent within one second (a client fanning
    /// out, a batch job): every ~60 s on average, exponentially many requests (mean 60 at the
    /// default rate). No rate over any window shows them; a fleet sized for the rate prefills
    /// a large batch far past the TTFT target.
    Batches,
    /// Reasoning-style answers: prompts of ~660 tokens, outputs with a median of 2,000 and a
    /// heavy tail (mean ~3,300, cv² 1.7, up to 32k), at a rate swinging ±50 % over the trace.
    /// Requests decode for minutes, and the longest outputs hold most of the KV cache, which
    /// sets how many run at once.
    Reasoning,
}

/// [`Family::IdleGaps`]: a session's length and the idle gap after it, seconds.
pub const IDLE_SESSION_S: f64 = 300.0;
pub const IDLE_GAP_S: f64 = 1200.0;

impl Family {
    pub const ALL: [Family; 12] = [
        Family::Poisson,
        Family::GammaBursts,
        Family::FlashCrowd,
        Family::Diurnal,
        Family::CodeLike,
        Family::LongOutput,
        Family::Mixture,
        Family::IdleGaps,
        Family::LongPrompts,
        Family::CodeDrift,
        Family::Batches,
        Family::Reasoning,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Poisson => "poisson",
            Family::GammaBursts => "gamma-bursts",
            Family::FlashCrowd => "flash-crowd",
            Family::Diurnal => "diurnal",
            Family::CodeLike => "code-like",
            Family::LongOutput => "long-output",
            Family::Mixture => "mixture",
            Family::IdleGaps => "idle-gaps",
            Family::LongPrompts => "long-prompts",
            Family::CodeDrift => "code-drift",
            Family::Batches => "batches",
            Family::Reasoning => "reasoning",
        }
    }
}

/// Request lengths: log-normal prompt and output tokens with these medians and spread (of
/// their logarithms), prompts at most `prompt_max` and outputs at most `output_max`.
#[derive(Debug, Clone, Copy)]
struct Shape {
    prompt_median: f64,
    output_median: f64,
    sigma: f64,
    prompt_max: f64,
    output_max: f64,
}

const CONVERSATION: Shape = Shape {
    prompt_median: 800.0,
    output_median: 180.0,
    sigma: 0.8,
    prompt_max: 32_000.0,
    output_max: 4_000.0,
};
const CODE: Shape = Shape {
    prompt_median: 3000.0,
    output_median: 60.0,
    sigma: 0.6,
    prompt_max: 32_000.0,
    output_max: 4_000.0,
};
const LONG_OUTPUT: Shape = Shape {
    prompt_median: 300.0,
    output_median: 900.0,
    sigma: 0.5,
    prompt_max: 32_000.0,
    output_max: 4_000.0,
};

const REASONING: Shape = Shape {
    prompt_median: 400.0,
    output_median: 2000.0,
    sigma: 1.0,
    prompt_max: 32_000.0,
    output_max: 32_000.0,
};

const LONG_PROMPT: Shape = Shape {
    prompt_median: 5000.0,
    output_median: 250.0,
    sigma: 1.1,
    prompt_max: 120_000.0,
    output_max: 4_000.0,
};

impl Shape {
    fn draw(&self, rng: &mut ChaCha8Rng) -> (u32, u32) {
        let p = LogNormal::new(self.prompt_median.ln(), self.sigma).expect("valid");
        let o = LogNormal::new(self.output_median.ln(), self.sigma).expect("valid");
        let clamp = |x: f64, hi: f64| x.round().clamp(1.0, hi) as u32;
        (
            clamp(p.sample(rng), self.prompt_max),
            clamp(o.sample(rng), self.output_max),
        )
    }
}

/// Arrival times of a Poisson process whose rate swings once over `[0, duration_s)` around
/// `mean` by ±`amplitude` of it: lowest at the ends, highest halfway (a day compressed).
fn swinging(rng: &mut ChaCha8Rng, duration_s: f64, mean: f64, amplitude: f64) -> Vec<f64> {
    let rate = |t: f64| {
        let phase = 2.0 * std::f64::consts::PI * t / duration_s;
        mean * (1.0 - amplitude * phase.cos())
    };
    poisson(rng, duration_s, mean * (1.0 + amplitude), rate)
}

/// Arrival times of a Poisson process with rate `rate(t)` (at most `peak`) over
/// `[0, duration_s)`, by thinning.
fn poisson(
    rng: &mut ChaCha8Rng,
    duration_s: f64,
    peak: f64,
    rate: impl Fn(f64) -> f64,
) -> Vec<f64> {
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += -rng.random::<f64>().max(1e-12).ln() / peak;
        if t >= duration_s {
            return out;
        }
        if rng.random::<f64>() * peak < rate(t) {
            out.push(t);
        }
    }
}

/// Arrival times with gamma gaps of shape `k` and mean `1 / rate`.
fn gamma_gaps(rng: &mut ChaCha8Rng, duration_s: f64, rate: f64, k: f64) -> Vec<f64> {
    let g = Gamma::new(k, 1.0 / (k * rate)).expect("valid");
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += g.sample(rng);
        if t >= duration_s {
            return out;
        }
        out.push(t);
    }
}

fn with_shape(rng: &mut ChaCha8Rng, times: Vec<f64>, shape: Shape) -> Vec<Request> {
    times
        .into_iter()
        .map(|arrival_s| {
            let (prompt_tokens, output_tokens) = shape.draw(rng);
            Request {
                arrival_s,
                prompt_tokens,
                output_tokens,
            }
        })
        .collect()
}

/// Arrival times with gamma gaps of shape `k` under a level that random-walks: every one to
/// three minutes it is multiplied by `e^(σZ)`, kept within `[lo, hi]` × `rate`.
fn drifting_gaps(rng: &mut ChaCha8Rng, duration_s: f64, rate: f64, k: f64) -> Vec<f64> {
    let (sigma, lo, hi) = (0.55, 0.2, 3.0);
    let step = LogNormal::new(0.0, sigma).expect("valid");
    let mut out = Vec::new();
    let (mut from, mut level) = (0.0, 1.0);
    while from < duration_s {
        let to = (from + rng.random_range(60.0..180.0)).min(duration_s);
        let g = Gamma::new(k, 1.0 / (k * rate * level)).expect("valid");
        let mut t = from;
        loop {
            t += g.sample(rng);
            if t >= to {
                break;
            }
            out.push(t);
        }
        level = (level * step.sample(rng)).clamp(lo, hi);
        from = to;
    }
    out
}

/// Arrival times of batches: every `every_s` on average (exponential gaps), exponentially many
/// requests (mean `mean`, at least one) sent within one second.
fn batches(rng: &mut ChaCha8Rng, duration_s: f64, every_s: f64, mean: f64) -> Vec<f64> {
    let gap = Exp::new(1.0 / every_s).expect("valid");
    let size = Exp::new(1.0 / mean).expect("valid");
    let mut out = Vec::new();
    let mut at = gap.sample(rng);
    while at < duration_s {
        let n = (size.sample(rng) as usize).max(1);
        out.extend(
            (0..n)
                .map(|_| at + rng.random::<f64>())
                .filter(|&t| t < duration_s),
        );
        at += gap.sample(rng);
    }
    out
}

/// Requests of a family over `duration_s` seconds at a mean `rate` (requests/s, conversation
/// shape; the other shapes are scaled to similar GPU load), sorted by arrival.
pub fn generate(family: Family, seed: u64, duration_s: f64, rate: f64) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let d = duration_s;
    let flash = |t: f64| (0.4 * d..0.4 * d + 120.0).contains(&t);
    let mut out = match family {
        Family::Poisson => {
            let t = poisson(&mut rng, d, rate, |_| rate);
            with_shape(&mut rng, t, CONVERSATION)
        }
        Family::GammaBursts => {
            let t = gamma_gaps(&mut rng, d, rate, 0.25);
            with_shape(&mut rng, t, CONVERSATION)
        }
        Family::FlashCrowd => {
            let t = poisson(&mut rng, d, 10.0 * rate, |t| {
                if flash(t) {
                    10.0 * rate
                } else {
                    rate
                }
            });
            with_shape(&mut rng, t, CONVERSATION)
        }
        Family::Diurnal => {
            let t = swinging(&mut rng, d, rate, 0.8);
            with_shape(&mut rng, t, CONVERSATION)
        }
        Family::CodeLike => {
            let t = poisson(&mut rng, d, 0.4 * rate, |_| 0.4 * rate);
            with_shape(&mut rng, t, CODE)
        }
        Family::LongOutput => {
            let t = poisson(&mut rng, d, 0.3 * rate, |_| 0.3 * rate);
            with_shape(&mut rng, t, LONG_OUTPUT)
        }
        Family::Mixture => {
            let chat = poisson(&mut rng, d, 0.5 * rate, |_| 0.5 * rate);
            let mut all = with_shape(&mut rng, chat, CONVERSATION);
            let code = gamma_gaps(&mut rng, d, 0.2 * rate, 0.3);
            all.extend(with_shape(&mut rng, code, CODE));
            let crowd = poisson(&mut rng, d, 1.5 * rate, |t| {
                if flash(t) {
                    1.5 * rate
                } else {
                    0.0
                }
            });
            all.extend(with_shape(&mut rng, crowd, LONG_OUTPUT));
            all
        }
        Family::IdleGaps => {
            let on = |t: f64| t % (IDLE_SESSION_S + IDLE_GAP_S) < IDLE_SESSION_S;
            let t = poisson(&mut rng, d, rate, |t| if on(t) { rate } else { 0.0 });
            with_shape(&mut rng, t, CONVERSATION)
        }
        Family::LongPrompts => {
            let t = swinging(&mut rng, d, 0.07 * rate, 0.6);
            with_shape(&mut rng, t, LONG_PROMPT)
        }
        Family::CodeDrift => {
            let t = drifting_gaps(&mut rng, d, 0.3 * rate, 0.3);
            with_shape(&mut rng, t, CODE)
        }
        Family::Batches => {
            let mut t = poisson(&mut rng, d, 0.25 * rate, |_| 0.25 * rate);
            t.extend(batches(&mut rng, d, 60.0, 4.0 * rate));
            with_shape(&mut rng, t, CODE)
        }
        Family::Reasoning => {
            let t = swinging(&mut rng, d, 0.15 * rate, 0.5);
            with_shape(&mut rng, t, REASONING)
        }
    };
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    out
}

/// One trace of the suite.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub requests: Vec<Request>,
}

/// How to build the suite.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// Synthetic trace length.
    pub duration_s: f64,
    /// Mean conversation-shaped arrival rate of the synthetic families.
    pub rate: f64,
    pub seed: u64,
    pub families: Vec<Family>,
    /// Shared traces to add, with their rate scales (`(file, scale)`), read from `traces_dir`.
    pub shared: Vec<(String, f64)>,
    pub traces_dir: PathBuf,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        SuiteConfig {
            duration_s: 3600.0,
            rate: 15.0,
            seed: 1,
            families: Family::ALL.to_vec(),
            shared: vec![
                ("azure-llm-2023-conv.csv".into(), 4.0),
                ("azure-llm-2023-conv.csv".into(), 1.0),
                ("mooncake-synthetic.jsonl".into(), 1.0),
            ],
            traces_dir: PathBuf::from("../shared/data/traces"),
        }
    }
}

/// The suite's traces: the synthetic families, then the shared traces. A duration that is
/// not a positive number of seconds is refused (an empty trace would read as met), as is one
/// whose traces would not fit in memory ([`trace::MAX_SCALED_REQUESTS`]).
pub fn entries(cfg: &SuiteConfig) -> Result<Vec<Entry>> {
    let d = cfg.duration_s;
    if !(d > 0.0 && d * cfg.rate <= trace::MAX_SCALED_REQUESTS) {
        return Err(Error::Scenario(format!(
            "suite duration {d} s: the synthetic traces need a positive duration, at most \
             {:.0} s at {} req/s",
            trace::MAX_SCALED_REQUESTS / cfg.rate,
            cfg.rate
        )));
    }
    let mut out: Vec<Entry> = cfg
        .families
        .iter()
        .enumerate()
        .map(|(i, &f)| Entry {
            name: f.name().to_string(),
            requests: generate(f, cfg.seed.wrapping_add(i as u64), cfg.duration_s, cfg.rate),
        })
        .collect();
    for (file, scale) in &cfg.shared {
        let raw = trace::load(&cfg.traces_dir.join(file))?;
        let stem = Path::new(file)
            .file_stem()
            .map_or(file.clone(), |s| s.to_string_lossy().into_owned());
        out.push(Entry {
            name: format!("{stem} ×{scale}"),
            requests: trace::scale(&raw, *scale, cfg.seed)?,
        });
    }
    Ok(out)
}

/// One trace's results: a summary per policy (× oracle filled in), the oracle's note, and each
/// policy's run over time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceResult {
    pub trace: String,
    pub requests: usize,
    pub summaries: Vec<(String, Summary)>,
    pub notes: Vec<String>,
    pub timelines: Vec<(String, Timeline)>,
}

/// `simulate --suite --json`: the scenario as printed and every trace's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuiteReport {
    pub scenario: serde_json::Value,
    pub traces: Vec<TraceResult>,
    /// sluice against the targets, trace by trace ([`crate::targets`]).
    #[serde(default)]
    pub targets: Vec<crate::targets::Target>,
    pub elapsed_s: f64,
}

/// The entries whose names start with one of `only` (all of them when `only` is empty).
pub fn select(entries: Vec<Entry>, only: &[String]) -> Vec<Entry> {
    entries
        .into_iter()
        .filter(|e| only.is_empty() || only.iter().any(|o| e.name.starts_with(o.as_str())))
        .collect()
}

/// Where [`run`] writes its per-trace files: `<dir>/<trace>.svg`, and with `decisions`
/// `<dir>/<trace>.decisions.jsonl` ([`report::write_decisions`]).
#[derive(Debug, Clone, Copy)]
pub struct Files<'a> {
    pub dir: &'a Path,
    pub decisions: bool,
}

/// Runs every policy over every entry, writing the per-trace `files` when given.
pub fn run(
    scn: &Scenario,
    entries: &[Entry],
    policies: &[String],
    files: Option<Files<'_>>,
) -> Result<Vec<TraceResult>> {
    if let Some(f) = &files {
        std::fs::create_dir_all(f.dir).map_err(|source| Error::Write {
            path: f.dir.to_path_buf(),
            source,
        })?;
    }
    // The oracle's search (in `prepare`) replays with `scn` as it is: it reads outcomes only.
    let mut recording = scn.clone();
    recording.sim.record_decisions = files.as_ref().is_some_and(|f| f.decisions);
    let mut out = Vec::new();
    for e in entries {
        let prepared = scenario::prepare(scn, &e.requests, policies)?;
        let notes = prepared.iter().filter_map(|p| p.note.clone()).collect();
        let runs = scenario::run_all(&recording, &e.requests, prepared);
        let mut summaries: Vec<(String, Summary)> = runs
            .iter()
            .map(|r| (r.policy.clone(), report::summarise(r, &scn.slo, scn.goal)))
            .collect();
        report::relate_to_oracle(&mut summaries);
        if let Some(f) = &files {
            let name = file_name(&e.name);
            plot::write_svg(&f.dir.join(format!("{name}.svg")), &runs)?;
            if f.decisions {
                report::write_decisions(&f.dir.join(format!("{name}.decisions.jsonl")), &runs)?;
            }
        }
        out.push(TraceResult {
            trace: e.name.clone(),
            requests: e.requests.len(),
            summaries,
            notes,
            timelines: report::timelines(&runs, &scn.slo),
        });
    }
    Ok(out)
}

/// A trace name as a file name.
fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The suite table: one row per trace and policy.
pub fn table(results: &[TraceResult]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "trace",
        "policy",
        "SLO (feasible)",
        "infeasible",
        "cost $",
        "× oracle",
        "worst recovery s",
    ]);
    for r in results {
        for (name, s) in &r.summaries {
            let row = [
                r.trace.clone(),
                name.clone(),
                format!("{:.2} %", s.slo_attainment * 100.0),
                s.infeasible.to_string(),
                format!("{:.2}", s.cost_usd),
                s.cost_vs_oracle.map_or("-".into(), |x| format!("{x:.2}")),
                format!("{:.0}", s.recovery_s_max),
            ];
            t.add_row(report::figures_row(row, 2));
        }
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_are_selected_by_the_start_of_their_names() {
        let entry = |name: &str| Entry {
            name: name.into(),
            requests: Vec::new(),
        };
        let all = || {
            vec![
                entry("diurnal"),
                entry("azure-llm-2023-conv ×4"),
                entry("mixture"),
            ]
        };
        let names = |es: Vec<Entry>| es.into_iter().map(|e| e.name).collect::<Vec<_>>();
        assert_eq!(names(select(all(), &[])).len(), 3);
        let only = ["azure".to_string(), "mix".to_string()];
        assert_eq!(
            names(select(all(), &only)),
            ["azure-llm-2023-conv ×4", "mixture"]
        );
        assert!(select(all(), &["urnal".to_string()]).is_empty());
    }

    /// A suite of empty traces would be met on every one: a duration that is not a positive
    /// number of seconds, or one past what fits in memory, is refused before any is made.
    #[test]
    fn a_suite_duration_out_of_range_is_refused() {
        for d in [0.0, -60.0, f64::NAN, 1e12] {
            let cfg = SuiteConfig {
                duration_s: d,
                shared: Vec::new(),
                ..SuiteConfig::default()
            };
            let Err(e) = entries(&cfg) else {
                panic!("{d}: accepted");
            };
            assert!(e.to_string().contains("suite duration"), "{d}: {e}");
        }
        let short = SuiteConfig {
            duration_s: 5.0,
            shared: Vec::new(),
            ..SuiteConfig::default()
        };
        assert_eq!(entries(&short).unwrap().len(), Family::ALL.len());
    }

    #[test]
    fn families_are_seeded_and_shaped() {
        for f in Family::ALL {
            let a = generate(f, 7, 1200.0, 10.0);
            assert_eq!(a, generate(f, 7, 1200.0, 10.0), "{f:?} is deterministic");
            assert!(!a.is_empty(), "{f:?}");
            assert!(a.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
            assert!(a
                .iter()
                .all(|r| r.arrival_s < 1200.0 && r.prompt_tokens > 0));
        }
        let count = |v: &[Request], from: f64, to: f64| {
            v.iter()
                .filter(|r| (from..to).contains(&r.arrival_s))
                .count() as f64
        };
        // The flash crowd: ten times the rate for two minutes at 40 %.
        let f = generate(Family::FlashCrowd, 1, 3000.0, 5.0);
        let inside = count(&f, 1200.0, 1320.0) / 120.0;
        let before = count(&f, 0.0, 1200.0) / 1200.0;
        assert!((inside / before - 10.0).abs() < 2.0, "{inside} vs {before}");
        // Gamma gaps of shape 0.25 keep the mean rate but bunch arrivals: the count per 10 s
        // varies far more than Poisson's.
        let g = generate(Family::GammaBursts, 1, 3000.0, 5.0);
        let p = generate(Family::Poisson, 1, 3000.0, 5.0);
        let var = |v: &[Request]| {
            let c: Vec<f64> = (0..300)
                .map(|i| count(v, f64::from(i) * 10.0, f64::from(i + 1) * 10.0))
                .collect();
            let m = c.iter().sum::<f64>() / c.len() as f64;
            c.iter().map(|x| (x - m).powi(2)).sum::<f64>() / c.len() as f64 / m
        };
        assert!((g.len() as f64 / 15_000.0 - 1.0).abs() < 0.1, "{}", g.len());
        assert!(var(&g) > 2.0 * var(&p), "{} vs {}", var(&g), var(&p));
        // Code-like prompts are long and outputs short; long-output chat the reverse.
        let mean = |v: &[Request], f: fn(&Request) -> u32| {
            v.iter().map(|r| f64::from(f(r))).sum::<f64>() / v.len() as f64
        };
        let code = generate(Family::CodeLike, 1, 1200.0, 10.0);
        let long = generate(Family::LongOutput, 1, 1200.0, 10.0);
        assert!(mean(&code, |r| r.prompt_tokens) > 10.0 * mean(&code, |r| r.output_tokens));
        assert!(mean(&long, |r| r.output_tokens) > 2.0 * mean(&long, |r| r.prompt_tokens));
        // Idle gaps: arrivals only in the sessions, nothing for twenty minutes after each.
        let idle = generate(Family::IdleGaps, 1, 3600.0, 2.0);
        assert_eq!(count(&idle, 300.0, 1500.0), 0.0);
        assert_eq!(count(&idle, 1800.0, 3000.0), 0.0);
        assert!((count(&idle, 0.0, 300.0) / 600.0 - 1.0).abs() < 0.15);
        // Long prompts: a mean near 9k tokens, a tail past 50k, a request a second at 15.
        let lp = generate(Family::LongPrompts, 1, 3600.0, 15.0);
        let m = mean(&lp, |r| r.prompt_tokens);
        assert!((7_000.0..11_000.0).contains(&m), "{m}");
        assert!(lp.iter().any(|r| r.prompt_tokens > 50_000));
        assert!((lp.len() as f64 / 3780.0 - 1.0).abs() < 0.1, "{}", lp.len());
        // Code drift: code-sized prompts, and the busiest three minutes several times the
        // quietest.
        let cd = generate(Family::CodeDrift, 1, 3600.0, 15.0);
        assert!(mean(&cd, |r| r.prompt_tokens) > 10.0 * mean(&cd, |r| r.output_tokens));
        let per3: Vec<f64> = (0..20)
            .map(|i| count(&cd, f64::from(i) * 180.0, f64::from(i + 1) * 180.0))
            .collect();
        let (lo, hi) = per3.iter().fold((f64::INFINITY, 0.0_f64), |(lo, hi), &c| {
            (lo.min(c), hi.max(c))
        });
        assert!(hi > 3.0 * lo.max(1.0), "{lo} .. {hi}");
    }
}
