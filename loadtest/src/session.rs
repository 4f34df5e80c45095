//! One invocation from validated [`Config`] to [`Report`]: resolve the model, calibrate prompt
//! lengths, load the dataset, warm up, run (or sweep), aggregate. Printing and files are
//! [`crate::report`]'s.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::calibrate::{self, Counter};
use crate::client::{Client, Target};
use crate::config::{Config, Mode};
use crate::dataset::{self, Dataset, Input, Source};
use crate::error::Result;
use crate::load::{self, Bounds, Counters, Load, Shared};
use crate::metrics::{Record, Summary};
use crate::prompt::PromptMaker;
use crate::report::{Point, Report};
use crate::stop::Stop;
use crate::tokenizer::LocalTokenizer;

/// Runs everything `cfg` asks for.
pub async fn execute(cfg: Config) -> Result<Report> {
    execute_until(cfg, Stop::default()).await
}

/// Runs what `cfg` asks for, or as much of it as runs before `stop` is set: after that no
/// request is sent (a sweep runs no further point), those in flight finish, and the report
/// covers what ran, with a note.
pub async fn execute_until(cfg: Config, stop: Stop) -> Result<Report> {
    let client = connect(&cfg).await?;
    let mut notes = Vec::new();
    let (maker, counter) = prompt_lengths(&cfg, &client, &mut notes).await?;
    let dataset = load_dataset(&cfg, counter.as_ref(), &mut notes).await?;
    if dataset.is_empty() {
        return Err(crate::Error::InvalidArg {
            flag: "--dataset",
            reason: "the dataset has no usable requests".into(),
        });
    }
    let mut shared = Shared {
        client,
        dataset: Arc::new(dataset),
        maker: Arc::new(maker),
        seed: cfg.seed,
        counters: Arc::new(Counters::default()),
        stop,
    };
    warm_up(&mut shared, &cfg).await;
    let points = match cfg.mode {
        Mode::Sweep { steps } => sweep(&mut shared, &cfg, steps, &mut notes).await,
        mode => {
            let (load, label, rate) = single_load(&cfg, mode);
            let bounds = measured_bounds(&cfg);
            let recs = run_point(&mut shared, &cfg, &label, load, bounds, cfg.warmup).await;
            vec![point(&label, rate, recs, &cfg)]
        }
    };
    Ok(report(cfg, &shared, notes, points))
}

/// The client for `cfg`'s target, with the model `/v1/models` names first when none was given.
async fn connect(cfg: &Config) -> Result<Client> {
    let mut target = Target {
        base: cfg.base_url.clone(),
        endpoint: cfg.endpoint,
        model: cfg.model.clone().unwrap_or_default(),
        stream: cfg.stream,
        ignore_eos: cfg.ignore_eos,
        api_key: cfg.api_key.clone(),
        headers: cfg.headers.clone(),
        timeout: Duration::from_secs_f64(cfg.timeout_s),
    };
    if cfg.model.is_none() {
        target.model = Client::new(target.clone())?.first_model().await?;
    }
    Client::new(target)
}

/// `--warmup N`: a closed loop whose records are dropped.
async fn warm_up(shared: &mut Shared, cfg: &Config) {
    if cfg.warmup == 0 {
        return;
    }
    let concurrency = match cfg.mode {
        Mode::Closed { concurrency } => concurrency,
        _ => cfg.max_concurrency.unwrap_or(8),
    };
    let bounds = Bounds {
        requests: Some(cfg.warmup),
        duration: None,
    };
    let load = Load::Closed { concurrency };
    run_point(shared, cfg, "warmup", load, bounds, 0).await;
}

fn measured_bounds(cfg: &Config) -> Bounds {
    Bounds {
        requests: cfg.requests,
        duration: cfg.duration(),
    }
}

/// The load, label and offered rate of a mode that is not a sweep.
fn single_load(cfg: &Config, mode: Mode) -> (Load, String, Option<f64>) {
    let max_concurrency = cfg.max_concurrency;
    match mode {
        Mode::Closed { concurrency } => (
            Load::Closed { concurrency },
            format!("concurrency {concurrency}"),
            None,
        ),
        Mode::Open { rate, .. } => (
            Load::Open {
                rate,
                arrival: cfg.arrival,
                max_concurrency,
            },
            format!("rate {rate}/s"),
            Some(rate),
        ),
        Mode::Burst => (Load::Burst { max_concurrency }, "rate inf".into(), None),
        Mode::Trace { time_scale } => (
            Load::Trace {
                time_scale,
                max_concurrency,
            },
            format!("trace ÷{time_scale}"),
            None,
        ),
        Mode::Sweep { .. } => unreachable!("a sweep runs several loads"),
    }
}

/// A sweep: synchronous, max throughput, then `steps` open-loop rates between the two, in the
/// order of offered load. Stops after the point during which `stop` was set.
async fn sweep(
    shared: &mut Shared,
    cfg: &Config,
    steps: usize,
    notes: &mut Vec<String>,
) -> Vec<Point> {
    let bounds = measured_bounds(cfg);
    let n = cfg.requests.unwrap_or(100);
    // Random prompts are fresh per point (no prefix-cache help); lists are replayed.
    let stride = if shared.dataset.len().is_none() { n } else { 0 };
    let first = cfg.warmup;
    let sync = Load::Closed { concurrency: 1 };
    let recs = run_point(shared, cfg, "synchronous", sync, bounds, first).await;
    let mut points = vec![point("synchronous", None, recs, cfg)];
    if shared.stop.is_set() {
        return points;
    }
    let burst = Load::Burst {
        max_concurrency: cfg.max_concurrency,
    };
    let recs = run_point(shared, cfg, "throughput", burst, bounds, first + stride).await;
    let throughput = point("throughput", None, recs, cfg);
    if shared.stop.is_set() {
        points.push(throughput);
        return points;
    }
    let sync_rate = points[0].summary.request_throughput;
    let max_rate = throughput.summary.request_throughput;
    if max_rate <= sync_rate {
        notes.push(format!(
            "sweep: max-throughput run ({max_rate:.2} req/s) was not faster than the \
             synchronous one ({sync_rate:.2} req/s); rates span the two the other way \
             round (more requests per point give a steadier curve)"
        ));
    }
    let (lo, hi) = (sync_rate.min(max_rate), sync_rate.max(max_rate));
    for i in 1..=steps {
        let rate = lo + (hi - lo) * i as f64 / (steps + 1) as f64;
        let label = format!("{i}: {rate:.2}/s");
        let load = Load::Open {
            rate: rate.max(1e-3),
            arrival: cfg.arrival,
            max_concurrency: cfg.max_concurrency,
        };
        let at = first + (i + 1) * stride;
        let recs = run_point(shared, cfg, &label, load, bounds, at).await;
        points.push(point(&label, Some(rate), recs, cfg));
        if shared.stop.is_set() {
            break;
        }
    }
    points.push(throughput);
    points
}

/// The report of the points that ran; a note says so when a signal cut the run short.
fn report(cfg: Config, shared: &Shared, mut notes: Vec<String>, points: Vec<Point>) -> Report {
    if shared.stop.is_set() {
        let sent: usize = points.iter().map(|p| p.records.len()).sum();
        notes.push(format!(
            "stopped early by a signal: nothing was sent after it; the {sent} requests sent \
             before it finished and are counted"
        ));
    }
    Report {
        config: cfg,
        model: shared.client.target().model.clone(),
        dataset: shared.dataset.describe(),
        calibration: shared.maker.calibration().clone(),
        notes,
        points,
    }
}

fn point(label: &str, offered_rate: Option<f64>, run: load::RunResult, cfg: &Config) -> Point {
    let summary = Summary::of(&run.records, run.duration, &cfg.slo);
    Point {
        label: label.to_string(),
        offered_rate,
        summary,
        records: run.records,
    }
}

async fn run_point(
    shared: &mut Shared,
    cfg: &Config,
    label: &str,
    load: Load,
    bounds: Bounds,
    first: usize,
) -> load::RunResult {
    shared.counters = Arc::new(Counters::default());
    let total = match (bounds.requests, shared.dataset.len()) {
        (Some(n), Some(len)) => Some(n.min(len.saturating_sub(first))),
        (Some(n), None) => Some(n),
        (None, len) if bounds.duration.is_none() => len.map(|l| l.saturating_sub(first)),
        _ => None,
    };
    let bar = if cfg.quiet {
        ProgressBar::hidden()
    } else {
        let b = total.map_or_else(ProgressBar::new_spinner, |t| ProgressBar::new(t as u64));
        b.set_style(
            ProgressStyle::with_template(
                "{prefix:>14} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            )
            .expect("valid template"),
        );
        b.set_prefix(label.to_string());
        b
    };
    let ticker = {
        let (bar, counters) = (bar.clone(), shared.counters.clone());
        tokio::spawn(async move {
            // "Current" rate: completions over the last few seconds, not since the start, so a
            // stall shows at once.
            let mut window = std::collections::VecDeque::from([(std::time::Instant::now(), 0)]);
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let done = counters.done.load(Ordering::Relaxed);
                let now = std::time::Instant::now();
                window.push_back((now, done));
                while window.len() > 2 && now - window[0].0 > Duration::from_secs(5) {
                    window.pop_front();
                }
                let (t0, d0) = window[0];
                let rate = (done - d0) as f64 / (now - t0).as_secs_f64().max(1e-3);
                bar.set_position(done);
                bar.set_message(format!(
                    "in flight {} · {rate:.1} req/s · errors {}",
                    counters.in_flight.load(Ordering::Relaxed),
                    counters.failed.load(Ordering::Relaxed),
                ));
            }
        })
    };
    let result = load::run(shared, load, bounds, first).await;
    ticker.abort();
    bar.set_position(result.records.len() as u64);
    bar.finish_and_clear();
    result
}

/// Chooses who counts prompt tokens ([`crate::calibrate`] has the precedence) and calibrates
/// the filler words with it. Returns the prompt maker and the counter, if any.
async fn prompt_lengths(
    cfg: &Config,
    client: &Client,
    notes: &mut Vec<String>,
) -> Result<(PromptMaker, Option<Counter>)> {
    // Load the local file first: a bad --tokenizer is an error even if the server could count.
    let local = match &cfg.tokenizer {
        Some(path) => {
            let path = path.clone();
            let tok = tokio::task::spawn_blocking(move || LocalTokenizer::load(&path))
                .await
                .expect("tokenizer loading does not panic")?;
            Some(Counter::Local(Arc::new(tok)))
        }
        None => None,
    };
    let mut tried = Vec::new();
    if cfg.use_tokenize {
        tried.push(Counter::Server(Box::new(client.clone())));
    }
    tried.extend(local);
    for counter in tried {
        match calibrate::calibrate(&counter).await {
            Ok((words, overhead)) => {
                let mut maker = PromptMaker::calibrated(words, overhead, counter.describe());
                let probe = Input::Synthetic {
                    tokens: 256,
                    seed: 1,
                };
                let (text, want) = maker.render(&probe);
                if let Ok(got) = counter.count(&text).await {
                    maker.set_verified(want, got - overhead);
                }
                return Ok((maker, Some(counter)));
            }
            Err(why) => notes.push(format!("{} not usable ({why})", counter.describe())),
        }
    }
    Ok((PromptMaker::approx(), None))
}

async fn load_dataset(
    cfg: &Config,
    counter: Option<&Counter>,
    notes: &mut Vec<String>,
) -> Result<Dataset> {
    Ok(match &cfg.source {
        Source::Random => Dataset::Random {
            input_len: cfg.input_len,
            output_len: cfg.output_len.unwrap_or(128),
            dist: cfg.len_dist,
            seed: cfg.seed,
        },
        Source::ShareGpt(path) => {
            let (mut specs, replies) = dataset::sharegpt(path, cfg.seed)?;
            let points = match cfg.mode {
                Mode::Sweep { steps } => steps + 2,
                _ => 1,
            };
            let used = cfg
                .requests
                .map_or(specs.len(), |n| (cfg.warmup + n * points).min(specs.len()));
            specs.truncate(used);
            // With a counter, prompts and replies are counted; a failure falls back to the
            // ~4 characters per token estimate for the rest.
            let mut counted = counter.is_some();
            for (spec, reply) in specs.iter_mut().zip(&replies) {
                let Some(c) = counter.filter(|_| counted) else {
                    break;
                };
                if let Input::Text { text, tokens } = &mut spec.input {
                    match c.count(text).await {
                        Ok(n) => *tokens = Some(n.max(1) as u32),
                        Err(_) => counted = false,
                    }
                }
                if cfg.output_len.is_none() && counted {
                    match c.count(reply).await {
                        Ok(n) => spec.output_len = n.max(1) as u32,
                        Err(_) => counted = false,
                    }
                }
            }
            if let Some(n) = cfg.output_len {
                specs.iter_mut().for_each(|s| s.output_len = n);
            }
            let by = counter.map_or("~4 characters per token".into(), Counter::describe);
            notes.push(if !counted {
                "sharegpt: token counts approximate (~4 characters per token)".into()
            } else if cfg.output_len.is_some() {
                format!("sharegpt: prompts counted by {by}; output length from --output-len")
            } else {
                format!("sharegpt: prompts and replies counted by {by}")
            });
            Dataset::List {
                specs,
                origin: format!("sharegpt {}", path.display()),
            }
        }
        Source::Trace(path) => {
            let d = dataset::trace(path, cfg.token_scale)?;
            if let (Dataset::List { specs, .. }, Mode::Trace { time_scale }) = (&d, cfg.mode) {
                let used = cfg
                    .requests
                    .map_or(specs.len(), |n| (cfg.warmup + n).min(specs.len()));
                notes.push(scaling_statement(
                    &specs[..used],
                    time_scale,
                    cfg.token_scale,
                ));
            }
            d
        }
    })
}

/// The printed statement of how a trace was scaled.
pub fn scaling_statement(specs: &[dataset::Spec], time_scale: f64, token_scale: f64) -> String {
    let times: Vec<f64> = specs.iter().filter_map(|s| s.trace_time_s).collect();
    let span = times.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        - times.iter().copied().fold(f64::INFINITY, f64::min);
    let rate = if span > 0.0 {
        (times.len() - 1) as f64 / span
    } else {
        f64::INFINITY
    };
    let blocks = if specs
        .iter()
        .any(|s| matches!(s.input, Input::Blocks { .. }))
    {
        let block = dataset::scale_tokens(dataset::MOONCAKE_BLOCK_TOKENS, token_scale);
        format!(
            " (Mooncake blocks {} → {block} tokens)",
            dataset::MOONCAKE_BLOCK_TOKENS
        )
    } else {
        String::new()
    };
    format!(
        "trace scaling: {} requests; time ÷{time_scale} (span {span:.1} s → {:.1} s, \
         {rate:.2} → {:.2} req/s); token counts ×{token_scale}{blocks}",
        specs.len(),
        span / time_scale,
        rate * time_scale,
    )
}

/// Records of all points, for `--per-request`.
pub fn all_records(report: &Report) -> impl Iterator<Item = (&str, &Record)> {
    report
        .points
        .iter()
        .flat_map(|p| p.records.iter().map(move |r| (p.label.as_str(), r)))
}
