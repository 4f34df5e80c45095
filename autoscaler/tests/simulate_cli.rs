//! `sluice-autoscaler simulate` as an operator runs it: a trace file in the Azure format, the
//! table, the JSON report and every tick's decision (`--decisions`), through the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A scratch directory under the target directory, emptied first.
fn scratch(name: &str) -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice-autoscaler"));
    let dir = exe.parent().unwrap().join("simulate-cli").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Ten minutes of a conversation-like trace in the Azure LLM 2023 CSV format: ~4 req/s with
/// a step to ~12 req/s at minute five, so the policy has something to decide.
fn write_trace(path: &Path) {
    let mut csv = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    let mut t = 0.0f64;
    let mut i = 0u64;
    while t < 600.0 {
        let rate = if t < 300.0 { 4.0 } else { 12.0 };
        // Deterministic spacing with a little jitter; lengths cycle through a spread.
        t += (1.0 + 0.5 * ((i % 7) as f64 / 7.0 - 0.25)) / rate;
        let (m, s) = ((t / 60.0) as u64, t % 60.0);
        let prompt = 300 + (i * 397) % 2400;
        let output = 40 + (i * 131) % 400;
        csv.push_str(&format!(
            "2023-11-16 18:{m:02}:{s:010.7},{prompt},{output}\n"
        ));
        i += 1;
    }
    std::fs::write(path, csv).unwrap();
}

fn simulate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice-autoscaler"))
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

/// A ten-minute suite of the traces named in `only` (comma-separated) with sluice and static
/// peak, its files under `dir`.
fn short_suite(only: &str, dir: &Path) -> Vec<String> {
    let traces = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/traces");
    let args = [
        "--suite",
        "--suite-only",
        only,
        "--suite-duration",
        "600",
        "--traces-dir",
        traces.to_str().unwrap(),
        "--suite-dir",
        dir.to_str().unwrap(),
        "--policies",
        "sluice,static-peak",
    ];
    args.iter().map(|s| s.to_string()).collect()
}

/// [`simulate`], asserting that it succeeded; its standard output.
fn simulate_ok(args: &[&str]) -> String {
    let out = simulate(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn decisions_are_written_one_a_tick_per_policy_with_their_reasons() {
    let dir = scratch("decisions");
    let trace = dir.join("trace.csv");
    write_trace(&trace);
    let decisions = dir.join("decisions.jsonl");
    let report = dir.join("report.json");
    let stdout = simulate_ok(&[
        "--trace",
        trace.to_str().unwrap(),
        "--rate-scale",
        "1",
        "--policies",
        "sluice,static-peak",
        "--decisions",
        decisions.to_str().unwrap(),
        "--json",
        report.to_str().unwrap(),
    ]);
    assert!(
        stdout.contains("sluice") && stdout.contains("static-peak"),
        "{stdout}"
    );

    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    // sluice against the targets on this trace: the SLO goal and static peak (no oracle ran),
    // printed and in the report.
    let targets = report["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2, "{targets:?}");
    for t in targets {
        assert_eq!(t["checked"], 1, "{t}");
        let name = t["name"].as_str().unwrap();
        assert!(stdout.contains(&format!("- {name}: met on ")), "{stdout}");
    }
    let lines = std::fs::read_to_string(&decisions).unwrap();
    let parsed: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for policy in ["sluice", "static-peak"] {
        let ds: Vec<&Value> = parsed
            .iter()
            .filter(|v| v["policy"] == policy)
            .map(|v| &v["decision"])
            .collect();
        // One decision a tick: as many as the report's timeline has ticks, 15 s apart.
        let ticks = report["timelines"][policy]["ticks"].as_array().unwrap();
        assert_eq!(ds.len(), ticks.len(), "{policy}");
        assert!(ds.len() >= 40, "{policy}: {}", ds.len());
        for (d, tick) in ds.iter().zip(ticks) {
            assert_eq!(d["time_s"], tick["time_s"], "{policy}");
        }
        for w in ds.windows(2) {
            let dt = w[1]["time_s"].as_f64().unwrap() - w[0]["time_s"].as_f64().unwrap();
            assert!((dt - 15.0).abs() < 1e-9, "{policy}: {dt}");
        }
        // Every decision names a target per variant and capacity type.
        assert!(ds
            .iter()
            .all(|d| !d["targets"].as_array().unwrap().is_empty()));
    }
    // sluice says why: after the step it plans for more than it saw before, with reasons.
    let sluice: Vec<&Value> = parsed
        .iter()
        .filter(|v| v["policy"] == "sluice")
        .map(|v| &v["decision"])
        .collect();
    let planned = |d: &Value| d["demand"]["planned_requests_per_s"].as_f64().unwrap();
    let early = sluice.iter().find(|d| d["time_s"] == 240.0).unwrap();
    let late = sluice.iter().find(|d| d["time_s"] == 540.0).unwrap();
    assert!(planned(late) > 2.0 * planned(early), "{early}\n{late}");
    assert!(sluice
        .iter()
        .any(|d| !d["reasons"].as_array().unwrap().is_empty()));
}

#[test]
fn decisions_are_refused_beside_the_suite() {
    let dir = scratch("suite");
    let out = simulate(&[
        "--suite",
        "--decisions",
        dir.join("d.jsonl").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--decisions"), "{stderr}");
}

#[test]
fn the_suite_writes_each_traces_decisions_beside_its_plot() {
    let dir = scratch("suite-decisions");
    let mut args = short_suite("long-output,poisson", &dir);
    args.push("--suite-decisions".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = simulate_ok(&args);
    for trace in ["long-output", "poisson"] {
        assert!(dir.join(format!("{trace}.svg")).is_file(), "{trace}");
        let text = std::fs::read_to_string(dir.join(format!("{trace}.decisions.jsonl"))).unwrap();
        let policies: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["policy"].clone())
            .collect();
        // Ten minutes at 15 s ticks for each policy, sluice's first.
        let sluice = policies.iter().filter(|p| *p == "sluice").count();
        assert!(sluice >= 40, "{trace}: {sluice}");
        assert_eq!(policies.len(), 2 * sluice, "{trace}");
        assert_eq!(policies[0], "sluice");
    }
    // Below the table, sluice against the targets over both traces (no oracle ran: no cost
    // ratio to check).
    let targets: Vec<&str> = stdout
        .lines()
        .skip_while(|l| *l != "targets:")
        .skip(1)
        .take_while(|l| l.starts_with("- "))
        .collect();
    assert_eq!(targets.len(), 2, "{stdout}");
    assert!(targets[0].starts_with("- sluice ≥ 99 % of feasible requests in SLO: met on "));
    assert!(targets[1].starts_with("- sluice no dearer than static-peak at an SLO"));
    assert!(
        targets.iter().all(|l| l.contains(" of 2 traces")),
        "{targets:?}"
    );
}

/// `--seeds` runs the suite once per seed, as `--seed` does each, and summarises: the mean
/// and the worst seed per trace and policy, and the targets seed by seed.
#[test]
fn the_suite_over_seeds_is_each_seeds_suite_summarised() {
    let dir = scratch("suite-seeds");
    let run = |extra: &[&str], json: &str| {
        let path = dir.join(json);
        let mut args = short_suite("long-output,code-drift", &dir);
        args.extend(["--json", path.to_str().unwrap()].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stdout = simulate_ok(&args);
        let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        (stdout, json)
    };
    let (stdout, seeds) = run(&["--seeds", "1-2"], "seeds.json");
    let (_, second) = run(&["--seed", "2"], "seed2.json");
    // Each seed's run is that seed's suite: seed 2's figures are `--seed 2`'s.
    let runs = seeds["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (runs[0]["seed"].as_u64(), runs[1]["seed"].as_u64()),
        (Some(1), Some(2))
    );
    let sluice_on = |suite: &Value, trace: &str| -> Value {
        let t = suite["traces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["trace"] == trace)
            .unwrap()
            .clone();
        t["summaries"][0][1].clone()
    };
    for trace in ["long-output", "code-drift"] {
        assert_eq!(
            sluice_on(&runs[1], trace),
            sluice_on(&second, trace),
            "{trace}"
        );
    }
    // The spread is the mean and the lowest of the seeds' figures.
    let slo = |suite: &Value| {
        sluice_on(suite, "code-drift")["slo_attainment"]
            .as_f64()
            .unwrap()
    };
    let (a, b) = (slo(&runs[0]), slo(&runs[1]));
    let row = seeds["spread"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["trace"] == "code-drift" && r["policy"] == "sluice")
        .unwrap();
    assert!((row["slo_mean"].as_f64().unwrap() - (a + b) / 2.0).abs() < 1e-12);
    assert_eq!(row["slo_min"].as_f64().unwrap(), a.min(b));
    assert_eq!(row["seeds"], 2);
    // On screen: a row per trace and policy, then each target seed by seed.
    let rows = stdout
        .lines()
        .filter(|l| l.starts_with('│') && l.contains(" of 2 "))
        .count();
    assert_eq!(rows, 4, "{stdout}");
    let targets: Vec<&str> = stdout
        .lines()
        .skip_while(|l| *l != "targets over 2 seeds:")
        .skip(1)
        .take_while(|l| l.starts_with("- "))
        .collect();
    assert_eq!(targets.len(), 2, "{stdout}");
    assert!(
        targets
            .iter()
            .all(|l| l.contains(" of 2 traces (seed 1: ") && l.contains(", seed 2: ")),
        "{targets:?}"
    );
}

#[test]
fn seeds_are_refused_outside_the_suite_and_when_malformed() {
    let refused = |args: &[&str], says: &str| {
        let out = simulate(args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    refused(&["--trace", "t.csv", "--seeds", "1-3"], "--trace");
    refused(
        &["--suite", "--seeds", "1-3", "--zero-savings"],
        "--zero-savings",
    );
    refused(
        &["--suite", "--seeds", "1-3", "--seed", "2"],
        "--seed <SEED>",
    );
    refused(
        &["--suite", "--seeds", "3-1"],
        "a range runs from low to high",
    );
    refused(&["--suite", "--seeds", "1,x"], "`x` in `1,x` is not a seed");
}

/// Settings no replay can honour end in one clear line and exit status 1, not in a failed
/// allocation (a rate scale whose copies would not fit in memory aborted the process) or a
/// table of empty traces read as met (a suite of zero seconds).
#[test]
fn settings_no_replay_can_honour_are_refused_with_their_figures() {
    let dir = scratch("refused");
    let trace = dir.join("trace.csv");
    write_trace(&trace);
    let trace = trace.to_str().unwrap();
    let refused = |args: &[&str], says: &str| {
        let out = simulate(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    };
    refused(
        &["--trace", trace, "--rate-scale", "1e9"],
        "at most 1e8 are replayed",
    );
    refused(&["--trace", trace, "--rate-scale", "inf"], "rate scale inf");
    refused(
        &["--trace", trace, "--ttft-slo", "0"],
        "--ttft-slo and --tpot-slo must be positive seconds",
    );
    refused(
        &["--suite", "--suite-duration", "0"],
        "suite duration 0 s: the synthetic traces need a positive duration",
    );
    for bound in ["0", "4.5", "lots"] {
        refused(
            &["--trace", trace, "--max-prompt-tokens", bound],
            "--max-prompt-tokens must be a positive token count, `feasible` or `per-gpu`",
        );
    }
}

/// `--max-prompt-tokens`: the scenario names the bound and how many requests it refuses, as
/// a count or as the profile's longest feasible prompt (45,565 tokens on the default H100), or
/// each variant's own bound.
#[test]
fn a_prompt_bound_is_modelled_and_counted() {
    let dir = scratch("prompt-bound");
    let trace = dir.join("trace.csv");
    write_trace(&trace);
    let text = std::fs::read_to_string(&trace).unwrap();
    let over_2000 = text
        .lines()
        .skip(1)
        .filter(|l| l.split(',').nth(1).unwrap().parse::<u32>().unwrap() > 2000)
        .count();
    assert!(over_2000 > 0);
    let base = [
        "--trace",
        trace.to_str().unwrap(),
        "--rate-scale",
        "1",
        "--policies",
        "sluice",
    ];
    let bounded = simulate_ok(&[&base[..], &["--max-prompt-tokens", "2000"]].concat());
    assert!(
        bounded.contains(&format!(
            "replicas refuse over 2000 tokens (--max-prompt-tokens): {over_2000} requests"
        )),
        "{bounded}"
    );
    let feasible = simulate_ok(&[&base[..], &["--max-prompt-tokens", "feasible"]].concat());
    assert!(
        feasible.contains("replicas refuse over 45565 tokens (--max-prompt-tokens): 0 requests"),
        "{feasible}"
    );
    let per_gpu = simulate_ok(&[&base[..], &["--max-prompt-tokens", "per-gpu"]].concat());
    assert!(
        per_gpu.contains(
            "each variant's replicas refuse past their own bound (tokens): \
             nvidia-l4 3758, nvidia-h100-80gb 45565"
        ),
        "{per_gpu}"
    );
}
