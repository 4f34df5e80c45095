//! `sluice-autoscaler`: `simulate` replays a trace through every policy; `profiles` prints
//! each variant's capacity at SLO; `explain` runs the sluice policy on signals from a JSON file;
//! `run --local` scales `sluice serve` replica processes on this machine.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use sluice_policy::capacity::{self, Slo, Workload};
use sluice_policy::policy::{plan, Policy, Sluice, SluiceConfig, VariantLimits};
use sluice_policy::profile::{CapacityType, Profile};
use sluice_policy::signals::Signals;
use sluice_policy::timeline::Request;
use sluice_sim::report::{self, Report};
use sluice_sim::scenario::{self, Scenario, POLICIES};
use sluice_sim::targets;
use sluice_sim::{plot, trace};

#[derive(Parser)]
#[command(
    name = "sluice-autoscaler",
    version,
    about = "SLO- and cost-aware autoscaling for GPU replicas"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace through a fleet model under each policy and compare them.
    Simulate(Box<SimulateArgs>),
    /// Print each variant's capacity and cost per request at SLO for a request shape.
    Profiles(ProfilesArgs),
    /// Run the sluice policy once on signals read from a JSON file and print the decision.
    Explain(ExplainArgs),
    /// Run the autoscaler: the Kubernetes controller (ServingPools' Deployments and node
    /// pools), or with `--local` `sluice serve` processes on this machine.
    Run(Box<RunFlags>),
    /// Print the ServingPool CustomResourceDefinition (YAML).
    Crd,
}

/// `run`'s flags: the Kubernetes controller's, and local mode's (chosen by `--local`).
#[derive(Args)]
struct RunFlags {
    #[command(flatten)]
    k8s: sluice_autoscaler::controller::cli::RunArgs,
    #[command(flatten)]
    local: sluice_autoscaler::local::cli::LocalArgs,
}

#[derive(Args)]
struct Common {
    /// Built-in profile (`llama-3-8b`, `llama-3-70b`, `cpu`) or a TOML file.
    #[arg(long, env = "SLUICE_AUTOSCALER_PROFILE", default_value = "llama-3-8b")]
    profile: String,
    /// Variants to use, comma-separated (default: L4 and H100 for llama-3-8b, all otherwise).
    #[arg(long, env = "SLUICE_AUTOSCALER_VARIANTS", value_delimiter = ',')]
    variants: Vec<String>,
    /// TTFT SLO, p99, seconds.
    #[arg(long, env = "SLUICE_AUTOSCALER_TTFT_SLO", default_value_t = 2.0)]
    ttft_slo: f64,
    /// TPOT SLO, p99, seconds.
    #[arg(long, env = "SLUICE_AUTOSCALER_TPOT_SLO", default_value_t = 0.1)]
    tpot_slo: f64,
}

impl Common {
    fn profile(&self) -> Result<Profile> {
        let p = Profile::load(&self.profile)?;
        let names = if !self.variants.is_empty() {
            self.variants.clone()
        } else if self.profile == "llama-3-8b" {
            vec!["nvidia-l4".into(), "nvidia-h100-80gb".into()]
        } else {
            p.variant_names()
        };
        Ok(p.restrict(&names)?)
    }

    fn slo(&self) -> Result<Slo> {
        let slo = Slo {
            ttft_p99_s: self.ttft_slo,
            tpot_p99_s: self.tpot_slo,
        };
        anyhow::ensure!(
            slo.is_valid(),
            "--ttft-slo and --tpot-slo must be positive seconds (got {} and {})",
            self.ttft_slo,
            self.tpot_slo
        );
        Ok(slo)
    }
}

#[derive(Args)]
struct SimulateArgs {
    /// Trace file: a request CSV (`.csv`: the Azure LLM inference traces of 2023 or 2024, or
    /// BurstGPT; columns found by their header) or Mooncake JSONL (`.jsonl`).
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_TRACE",
        required_unless_present = "suite"
    )]
    trace: Option<PathBuf>,
    /// Run the trace suite (synthetic families and the shared traces) instead of one trace.
    #[arg(long, env = "SLUICE_AUTOSCALER_SUITE", conflicts_with = "trace")]
    suite: bool,
    /// Where the suite reads the shared traces.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_TRACES_DIR",
        default_value = "../shared/data/traces"
    )]
    traces_dir: PathBuf,
    /// Where the suite writes one SVG per trace.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_SUITE_DIR",
        default_value = "suite-plots"
    )]
    suite_dir: PathBuf,
    /// Length of the suite's synthetic traces, seconds.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_SUITE_DURATION",
        default_value_t = 3600.0
    )]
    suite_duration: f64,
    /// Run only the suite's traces whose names start with one of these (comma-separated:
    /// `diurnal,azure`); all of them by default.
    #[arg(long, env = "SLUICE_AUTOSCALER_SUITE_ONLY", value_delimiter = ',')]
    suite_only: Vec<String>,
    /// Run the suite once per seed (`1-8`, `1,3,5`: as `--seed` each) and print the mean and
    /// the worst seed per trace and policy, and the targets seed by seed; no plots.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_SEEDS",
        requires = "suite",
        conflicts_with_all = ["trace", "seed", "suite_decisions", "zero_savings"],
        value_parser = sluice_sim::seeds::SeedList::parse
    )]
    seeds: Option<sluice_sim::seeds::SeedList>,
    #[command(flatten)]
    common: Common,
    /// Multiply the trace's arrival rate (copies shifted by up to ±30 s; below 1 thins it).
    #[arg(long, env = "SLUICE_AUTOSCALER_RATE_SCALE", default_value_t = 4.0)]
    rate_scale: f64,
    /// Policies to compare, comma-separated.
    #[arg(long, env = "SLUICE_AUTOSCALER_POLICIES", value_delimiter = ',', default_values_t = POLICIES.iter().map(|s| s.to_string()))]
    policies: Vec<String>,
    /// Buy Spot capacity (sluice: Spot first, on-demand fallback; baselines: all Spot).
    #[arg(long, env = "SLUICE_AUTOSCALER_SPOT")]
    spot: bool,
    /// Spot reclaims per node-hour.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_SPOT_PREEMPTIONS",
        default_value_t = 0.0
    )]
    spot_preemptions_per_hour: f64,
    /// Seconds between policy ticks.
    #[arg(long, env = "SLUICE_AUTOSCALER_TICK", default_value_t = 15.0)]
    tick: f64,
    /// Most replicas of any one variant.
    #[arg(long, env = "SLUICE_AUTOSCALER_MAX_REPLICAS", default_value_t = 200)]
    max_replicas: u32,
    /// Fewest replicas sluice and KPA keep (on the baseline variant); 0 lets them go to zero.
    #[arg(long, env = "SLUICE_AUTOSCALER_MIN_REPLICAS", default_value_t = 0)]
    min_replicas: u32,
    /// At min 0, let sluice go to zero whenever it is idle, as KPA does; by default it goes
    /// only when the cold start fits the SLO's error budget (1 % of a day's requests).
    #[arg(long, env = "SLUICE_AUTOSCALER_ZERO_WHEN_IDLE")]
    zero_when_idle: bool,
    /// Model a gateway queue served first come, first served; by default it runs as
    /// deploy/k8s sets it (`--queue-late-after` at 3/4 of the TTFT target: requests that
    /// waited longer yield to those still on time).
    #[arg(long, env = "SLUICE_AUTOSCALER_FIFO_QUEUE")]
    fifo_queue: bool,
    /// Requests the modelled gateway queue holds before refusing newcomers (`sluice serve
    /// --max-queue`); 0: unbounded.
    #[arg(long, env = "SLUICE_AUTOSCALER_MAX_QUEUE", default_value_t = 1024)]
    max_queue: usize,
    /// Seconds a request waits in the modelled gateway queue while replicas are ready before
    /// it is refused (`sluice serve --queue-timeout`); 0: no limit.
    #[arg(long, env = "SLUICE_AUTOSCALER_QUEUE_TIMEOUT", default_value_t = 30.0)]
    queue_timeout: f64,
    /// Seconds a request is held while no replica is ready before it is refused (`sluice
    /// serve --hold-timeout`); 0: no limit.
    #[arg(long, env = "SLUICE_AUTOSCALER_HOLD_TIMEOUT", default_value_t = 60.0)]
    hold_timeout: f64,
    /// Model replicas that refuse longer prompts (`sluice serve --max-prompt-tokens`): a
    /// token count, `feasible` for the longest prompt some variant serves alone within the
    /// SLO (`profiles` prints it), or `per-gpu` for each variant's own (its `prompts ≤ N tok
    /// in SLO`; the gateway routes a prompt only to replicas that take it). Refused prompts
    /// take no prefill; the policy's signals count their arrival, and the length of those
    /// some variant serves, as the gateway and replicas export them.
    #[arg(long, env = "SLUICE_AUTOSCALER_MAX_PROMPT_TOKENS")]
    max_prompt_tokens: Option<String>,
    /// Also run sluice and KPA at min 0 and at min 1 and print what going to zero saves over
    /// the trace's idle periods, and its cold starts.
    #[arg(long, env = "SLUICE_AUTOSCALER_ZERO_SAVINGS")]
    zero_savings: bool,
    /// The variant single-variant baselines (HPA, KPA) scale; default: cheapest per request.
    #[arg(long, env = "SLUICE_AUTOSCALER_BASELINE_VARIANT")]
    baseline_variant: Option<String>,
    /// Seed for rate scaling and Spot reclaims.
    #[arg(long, env = "SLUICE_AUTOSCALER_SEED", default_value_t = 1)]
    seed: u64,
    /// Write the JSON report here (with `--suite`: every trace's).
    #[arg(long, env = "SLUICE_AUTOSCALER_JSON")]
    json: Option<PathBuf>,
    /// Write an SVG of replicas and demand over time here.
    #[arg(long, env = "SLUICE_AUTOSCALER_PLOT")]
    plot: Option<PathBuf>,
    /// Write every tick's decision of each policy here, one JSON object a line
    /// (`{"policy": …, "decision": …}`): the demand it planned, the targets and the reasons.
    #[arg(long, env = "SLUICE_AUTOSCALER_DECISIONS", conflicts_with = "suite")]
    decisions: Option<PathBuf>,
    /// With `--suite`: write each trace's decisions beside its SVG
    /// (`<suite-dir>/<trace>.decisions.jsonl`, as `--decisions` writes them).
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_SUITE_DECISIONS",
        requires = "suite",
        conflicts_with = "trace"
    )]
    suite_decisions: bool,
}

#[derive(Args)]
struct ProfilesArgs {
    #[command(flatten)]
    common: Common,
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_PROMPT_TOKENS",
        default_value_t = 1000.0
    )]
    prompt_tokens: f64,
    #[arg(long, env = "SLUICE_AUTOSCALER_OUTPUT_TOKENS", default_value_t = 200.0)]
    output_tokens: f64,
}

#[derive(Args)]
struct ExplainArgs {
    /// Signals as JSON (the `Signals` type).
    #[arg(long, env = "SLUICE_AUTOSCALER_SIGNALS")]
    signals: PathBuf,
    #[command(flatten)]
    common: Common,
    #[arg(long, env = "SLUICE_AUTOSCALER_MAX_REPLICAS", default_value_t = 200)]
    max_replicas: u32,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Simulate(a) => simulate(*a),
        Command::Profiles(a) => profiles(a),
        Command::Explain(a) => explain(a),
        Command::Run(a) if a.local.local => run_local(a.local),
        Command::Run(a) => {
            let scrape_timeout = a.local.scrape_timeout;
            run_controller(a.k8s, scrape_timeout)
        }
        Command::Crd => {
            print!("{}", sluice_autoscaler::crd::crd_yaml()?);
            Ok(())
        }
    }
}

fn run_local(a: sluice_autoscaler::local::cli::LocalArgs) -> Result<()> {
    let cfg = a.validate()?;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(async {
            let controller = sluice_autoscaler::local::control::LocalAutoscaler::new(cfg)?;
            controller.run(shutdown_signal()).await
        })?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot listen for SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

fn run_controller(
    a: sluice_autoscaler::controller::cli::RunArgs,
    scrape_timeout: f64,
) -> Result<()> {
    use sluice_autoscaler::controller::cli;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async {
        let source = std::sync::Arc::new(a.source(scrape_timeout)?);
        cli::run(a, source).await
    })?;
    Ok(())
}

fn simulate(a: SimulateArgs) -> Result<()> {
    let started = Instant::now();
    let profile = a.common.profile()?;
    let mut scn = Scenario::default_for(profile);
    scn.slo = a.common.slo()?;
    scn.rate_scale = a.rate_scale;
    scn.spot = a.spot;
    scn.max_replicas_per_variant = a.max_replicas;
    scn.min_replicas = a.min_replicas;
    if a.zero_when_idle {
        scn.zero_rule = sluice_policy::zero::ZeroRule::Idle;
    }
    scn.baseline_variant = a.baseline_variant.clone();
    scn.sim.tick_s = a.tick;
    scn.sim.seed = a.seed;
    let bound = |s: f64| (s != 0.0).then_some(s);
    scn.sim.queue_limits = sluice_sim::sim::QueueLimits {
        max_queue: (a.max_queue > 0).then_some(a.max_queue),
        queue_timeout_s: bound(a.queue_timeout),
        hold_timeout_s: bound(a.hold_timeout),
    };
    if a.fifo_queue {
        scn.sim.queue_late_after_share = None;
    }
    match a.max_prompt_tokens.as_deref() {
        Some("per-gpu") => scn.sim.per_variant_prompt_bounds = true,
        Some(bound) => scn.sim.max_prompt_tokens = Some(max_prompt_tokens(bound, &scn)?),
        None => {}
    }
    scn.sim.spot_preemptions_per_node_hour = a.spot_preemptions_per_hour;
    scn.validate()?;
    let Some(trace_path) = a.trace.clone() else {
        return simulate_suite(&a, &scn, started);
    };
    let raw = trace::load(&trace_path)?;
    let requests = trace::scale(&raw, scn.rate_scale, scn.sim.seed)?;
    let mean = scenario::mean_shape(&requests);
    let (base, base_cap) = scn.baseline_choice(&mean)?;
    print_scenario(
        &trace_path,
        &scn,
        raw.len(),
        &requests,
        &mean,
        &base,
        &base_cap,
    );
    let prepared = scenario::prepare(&scn, &requests, &a.policies)?;
    let notes: Vec<String> = prepared.iter().filter_map(|p| p.note.clone()).collect();
    // After `prepare`: the oracle's search replays the trace and reads only outcomes.
    scn.sim.record_decisions = a.decisions.is_some();
    let runs = scenario::run_all(&scn, &requests, prepared);
    let mut summaries: Vec<(String, report::Summary)> = runs
        .iter()
        .map(|r| (r.policy.clone(), report::summarise(r, &scn.slo, scn.goal)))
        .collect();
    report::relate_to_oracle(&mut summaries);
    let elapsed = started.elapsed().as_secs_f64();
    println!("\n{}", report::table(&summaries));
    if let Some((_, s)) = summaries.first() {
        println!("{}", report::feasibility_line(s));
    }
    for n in &notes {
        println!("{n}");
    }
    let name = format!("{} ×{}", trace_path.display(), scn.rate_scale);
    let targets = targets::check_runs([(name.as_str(), summaries.as_slice())], "sluice");
    print_targets(&targets);
    println!("{} policies in {:.2} s", runs.len(), elapsed);
    if a.zero_savings {
        print_zero_savings(&scn, &requests, &a.policies)?;
    }
    if let Some(path) = &a.json {
        let rep = Report {
            scenario: serde_json::to_value(&scn).context("scenario to JSON")?,
            policies: summaries.iter().cloned().collect(),
            order: summaries.iter().map(|(n, _)| n.clone()).collect(),
            elapsed_s: elapsed,
            timelines: report::timelines(&runs, &scn.slo).into_iter().collect(),
            targets,
        };
        report::write_json(path, &rep)?;
    }
    if let Some(path) = &a.plot {
        plot::write_svg(path, &runs)?;
    }
    if let Some(path) = &a.decisions {
        report::write_decisions(path, &runs)?;
    }
    Ok(())
}

/// sluice against the targets, one line each, below a table.
fn print_targets(targets: &[targets::Target]) {
    if targets.is_empty() {
        return;
    }
    println!("\ntargets:");
    for t in targets {
        println!("- {}", t.line());
    }
}

/// The suite's traces for `seed`, as `--suite-only` selects them.
fn suite_entries(a: &SimulateArgs, seed: u64) -> Result<Vec<sluice_sim::suite::Entry>> {
    let cfg = sluice_sim::suite::SuiteConfig {
        duration_s: a.suite_duration,
        seed,
        traces_dir: a.traces_dir.clone(),
        ..Default::default()
    };
    let entries = sluice_sim::suite::select(sluice_sim::suite::entries(&cfg)?, &a.suite_only);
    if entries.is_empty() {
        anyhow::bail!(
            "--suite-only {}: no trace of the suite has such a name",
            a.suite_only.join(",")
        );
    }
    Ok(entries)
}

/// `simulate --suite`: every policy over the suite's traces, one table, one SVG per trace.
fn simulate_suite(a: &SimulateArgs, scn: &Scenario, started: Instant) -> Result<()> {
    if let Some(seeds) = &a.seeds {
        return simulate_seeds(a, scn, &seeds.0, started);
    }
    let entries = suite_entries(a, a.seed)?;
    let files = sluice_sim::suite::Files {
        dir: &a.suite_dir,
        decisions: a.suite_decisions,
    };
    let results = sluice_sim::suite::run(scn, &entries, &a.policies, Some(files))?;
    println!("{}", sluice_sim::suite::table(&results));
    for r in &results {
        for n in &r.notes {
            println!("{}: {n}", r.trace);
        }
    }
    let targets = targets::check(&results, "sluice");
    print_targets(&targets);
    if a.zero_savings {
        for e in &entries {
            println!("\n{}:", e.name);
            print_zero_savings(scn, &e.requests, &a.policies)?;
        }
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    println!(
        "{} traces in {elapsed_s:.1} s; plots in {}",
        results.len(),
        a.suite_dir.display()
    );
    if let Some(path) = &a.json {
        let rep = sluice_sim::suite::SuiteReport {
            scenario: serde_json::to_value(scn).context("scenario to JSON")?,
            traces: results,
            targets,
            elapsed_s,
        };
        report::write_json(path, &rep)?;
    }
    Ok(())
}

/// `simulate --suite --seeds`: the suite once per seed (synthetic families drawn again, the
/// shared traces' copies and Spot reclaims as `--seed` draws them), then the mean and the
/// worst seed per trace and policy, and sluice's targets seed by seed.
fn simulate_seeds(a: &SimulateArgs, scn: &Scenario, seeds: &[u64], started: Instant) -> Result<()> {
    let mut runs = Vec::with_capacity(seeds.len());
    for &seed in seeds {
        let mut scn = scn.clone();
        scn.sim.seed = seed;
        let entries = suite_entries(a, seed)?;
        let results = sluice_sim::suite::run(&scn, &entries, &a.policies, None)?;
        runs.push(sluice_sim::seeds::SeedRun::new(seed, results, "sluice"));
        eprintln!("seed {seed}: {:.1} s", started.elapsed().as_secs_f64());
    }
    let spread = sluice_sim::seeds::spread(&runs);
    println!("{}", sluice_sim::seeds::table(&spread));
    let lines = sluice_sim::seeds::target_lines(&runs);
    if !lines.is_empty() {
        println!("\ntargets over {} seeds:", runs.len());
        for l in &lines {
            println!("- {l}");
        }
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    println!("{} seeds in {elapsed_s:.1} s", runs.len());
    if let Some(path) = &a.json {
        let rep = sluice_sim::seeds::SeedsReport {
            scenario: serde_json::to_value(scn).context("scenario to JSON")?,
            runs,
            spread,
            elapsed_s,
        };
        report::write_json(path, &rep)?;
    }
    Ok(())
}

/// `--zero-savings`: each policy that may go to zero against itself at min 1.
fn print_zero_savings(scn: &Scenario, requests: &[Request], policies: &[String]) -> Result<()> {
    let rows = sluice_sim::zero::compare(scn, requests, policies)?;
    println!("\n{}", sluice_sim::zero::table(&rows));
    println!(
        "saved: cost at min 1 minus cost at min 0 (idle periods: gaps of at least {:.0} s); \
         a request arriving at zero waits for a cold start, counted in its TTFT",
        sluice_sim::zero::idle_threshold_s(scn)
    );
    Ok(())
}

/// The scenario header `simulate` prints before its table.
fn print_scenario(
    trace_path: &std::path::Path,
    scn: &Scenario,
    raw_rows: usize,
    requests: &[Request],
    mean: &Workload,
    base: &str,
    base_cap: &capacity::Capacity,
) {
    let duration = requests.last().map_or(0.0, |r| r.arrival_s);
    println!("scenario");
    println!(
        "  trace        {} ({} rows) × rate {} = {} requests over {:.0} s ({:.2} req/s)",
        trace_path.display(),
        raw_rows,
        scn.rate_scale,
        requests.len(),
        duration,
        requests.len() as f64 / duration.max(1.0)
    );
    println!(
        "  model        {} on {}",
        scn.profile.model.name,
        scn.profile.variant_names().join(", ")
    );
    println!(
        "  SLO          TTFT ≤ {:.2} s and TPOT ≤ {:.0} ms per request (report p99s)",
        scn.slo.ttft_p99_s,
        scn.slo.tpot_p99_s * 1e3
    );
    println!(
        "  mean request {:.0} prompt + {:.0} output tokens",
        mean.mean_prompt_tokens, mean.mean_output_tokens
    );
    // As the policies see them: a variant leaving too many prompts late on its own is out.
    let limits = scn.limits();
    let (caps, _) = plan::capacities(&scn.profile, &limits, mean, &scn.slo, &scn.planning);
    for (v, c) in scn.profile.variants.iter().zip(caps) {
        let ct = if scn.spot {
            CapacityType::Spot
        } else {
            CapacityType::OnDemand
        };
        println!(
            "  {:<22} {:>6.2} req/s per replica at SLO ({:?}-bound), ${:.3}/h, ${} per 1k requests, start-up {:.0} s",
            v.name, c.requests_per_s, c.bound, v.replica_price_per_hour(ct),
            per_thousand(v.replica_price_per_hour(ct), c.requests_per_s),
            v.startup_s(true)
        );
    }
    println!(
        "  baselines    hpa-*/kpa scale {base} (target {:.0} in flight per replica)",
        base_cap.batch
    );
    println!(
        "  capacity     {}, tick {:.0} s, Spot reclaims {}/node-h",
        if scn.spot { "Spot" } else { "on demand" },
        scn.sim.tick_s,
        scn.sim.spot_preemptions_per_node_hour
    );
    if let Some(max) = scn.sim.max_prompt_tokens {
        let refused = requests
            .iter()
            .filter(|r| scn.sim.refuses_prompt(r))
            .count();
        println!(
            "  prompts      replicas refuse over {max} tokens (--max-prompt-tokens): {refused} requests"
        );
    }
    if scn.sim.per_variant_prompt_bounds {
        let bounds: Vec<String> = scn
            .profile
            .variants
            .iter()
            .map(|v| {
                format!(
                    "{} {:.0}",
                    v.name,
                    scn.profile.longest_prompt_served(v, &scn.slo)
                )
            })
            .collect();
        println!(
            "  prompts      each variant's replicas refuse past their own bound (tokens): {}",
            bounds.join(", ")
        );
    }
}

/// `--max-prompt-tokens`: a positive token count, or `feasible` for the profile's longest
/// feasible prompt at the scenario's SLO.
fn max_prompt_tokens(arg: &str, scn: &Scenario) -> Result<u32> {
    if arg == "feasible" {
        let longest = scn.profile.longest_feasible_prompt(&scn.slo).floor();
        anyhow::ensure!(
            longest >= 1.0,
            "--max-prompt-tokens feasible: no variant of {} serves any prompt within the SLO",
            scn.profile.model.name
        );
        return Ok(longest as u32);
    }
    arg.parse::<u32>().ok().filter(|&n| n > 0).with_context(|| {
        format!(
            "--max-prompt-tokens must be a positive token count, `feasible` or `per-gpu` \
             (got {arg:?})"
        )
    })
}

/// Dollars per thousand requests at a price per hour and a rate, `-` when it serves none.
fn per_thousand(price_per_hour: f64, requests_per_s: f64) -> String {
    if requests_per_s > 0.0 {
        format!("{:.3}", price_per_hour / requests_per_s / 3.6)
    } else {
        "-".into()
    }
}

fn profiles(a: ProfilesArgs) -> Result<()> {
    let profile = a.common.profile()?;
    let w = Workload::uniform(a.prompt_tokens, a.output_tokens);
    let slo = a.common.slo()?;
    let plan = capacity::Planning::default();
    println!(
        "{}: {:.0} prompt + {:.0} output tokens, TTFT ≤ {} s, TPOT ≤ {} ms",
        profile.model.name,
        w.mean_prompt_tokens,
        w.mean_output_tokens,
        slo.ttft_p99_s,
        slo.tpot_p99_s * 1e3
    );
    for v in &profile.variants {
        let c = capacity::at_slo(v, &w, &slo, &plan);
        let price = v.replica_price_per_hour(CapacityType::OnDemand);
        println!(
            "  {:<22} batch {:>6.1}  TPOT {:>5.1} ms  {:>7.2} req/s  {:>8.0} out tok/s  ${:>6.3}/h  ${}/1k req  bound {:?}  prompts ≤ {:.0} tok in SLO",
            v.name, c.batch, c.tpot_s * 1e3, c.requests_per_s, c.output_tokens_per_s, price,
            per_thousand(price, c.requests_per_s), c.bound, profile.longest_prompt_served(v, &slo).floor()
        );
    }
    println!(
        "longer prompts miss the SLO on any fleet: `sluice serve --max-prompt-tokens {:.0}` refuses them \
         (`simulate --max-prompt-tokens feasible` models it)",
        profile.longest_feasible_prompt(&slo).floor()
    );
    Ok(())
}

fn explain(a: ExplainArgs) -> Result<()> {
    let profile = a.common.profile()?;
    let text = std::fs::read_to_string(&a.signals)
        .with_context(|| format!("reading {}", a.signals.display()))?;
    let signals: Signals =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", a.signals.display()))?;
    let limits = profile
        .variants
        .iter()
        .map(|v| VariantLimits::new(&v.name, a.max_replicas))
        .collect();
    let mut policy = Sluice::new(profile, SluiceConfig::new(a.common.slo()?, limits));
    let d = policy.decide(&signals);
    println!("{}", serde_json::to_string_pretty(&d)?);
    for r in &d.reasons {
        eprintln!("{r}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand's flags are consistent (clap checks names and groups only when a
    /// subcommand is built, so a clash would otherwise surface as a panic at run time).
    #[test]
    fn flags_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["sluice-autoscaler", "run", "--dry-run", "--period", "2"])
            .unwrap();
        assert!(matches!(cli.command, Command::Run(ref a) if a.k8s.dry_run && !a.local.local));
        let cli = Cli::try_parse_from(["sluice-autoscaler", "run", "--local"]).unwrap();
        assert!(matches!(cli.command, Command::Run(ref a) if a.local.local));
    }
}
