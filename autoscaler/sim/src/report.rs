//! Per-policy figures from a run, the table, and the JSON report.

use std::path::Path;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use serde::{Deserialize, Serialize};

use sluice_policy::capacity::Slo;

use crate::error::{Error, Result};
use crate::sim::{Outcome, Run, Sample};

/// Requests are grouped by arrival into buckets this long to find bursts the fleet missed.
pub const BURST_BUCKET_S: f64 = 30.0;

/// One policy's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub requests: usize,
    /// Requests no variant could serve within the SLO even alone and idle; reported apart.
    pub infeasible: usize,
    /// Share of the feasible requests meeting both the TTFT and the TPOT SLO (refused, cut and
    /// unfinished requests miss).
    pub slo_attainment: f64,
    /// Share of all requests, infeasible ones included, meeting both.
    pub raw_slo_attainment: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub tpot_p50_s: f64,
    pub tpot_p99_s: f64,
    pub gpu_hours: f64,
    pub cost_usd: f64,
    /// Cost over the oracle's, when the oracle ran.
    pub cost_vs_oracle: Option<f64>,
    /// Ticks × pools whose replica count the policy changed.
    pub scale_events: usize,
    pub replicas_started: usize,
    pub failed: usize,
    pub unfinished: usize,
    pub spot_preemptions: usize,
    /// Episodes of consecutive 30-second arrival buckets below the attainment goal.
    pub bursts: usize,
    /// Longest and mean such episode: the time the fleet took to recover.
    pub recovery_s_max: f64,
    pub recovery_s_mean: f64,
}

/// The JSON report: the scenario as printed, a summary per policy, and each policy's run over
/// time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub scenario: serde_json::Value,
    pub policies: std::collections::BTreeMap<String, Summary>,
    pub order: Vec<String>,
    pub elapsed_s: f64,
    #[serde(default)]
    pub timelines: std::collections::BTreeMap<String, Timeline>,
    /// sluice against the targets on this trace ([`crate::targets`]).
    #[serde(default)]
    pub targets: Vec<crate::targets::Target>,
}

/// One policy's run over time: what the fleet held at each tick and how the feasible requests
/// arriving in each 30 s bucket fared, so a miss can be read against the fleet that served it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Timeline {
    /// The variants, in the order of each tick's `ready` and `starting`.
    pub variants: Vec<String>,
    pub ticks: Vec<Sample>,
    pub buckets: Vec<Bucket>,
}

/// Feasible requests arriving within one bucket of [`BURST_BUCKET_S`], and how many met the SLO.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Bucket {
    pub start_s: f64,
    pub feasible: u32,
    pub met: u32,
}

/// Each run's timeline, by policy.
pub fn timelines(runs: &[Run], slo: &Slo) -> Vec<(String, Timeline)> {
    runs.iter()
        .map(|r| (r.policy.clone(), timeline(r, slo)))
        .collect()
}

/// `run` over time (see [`Timeline`]).
pub fn timeline(run: &Run, slo: &Slo) -> Timeline {
    let (total, good) = buckets(&run.outcomes, slo);
    Timeline {
        variants: run.variants.clone(),
        ticks: run.samples.clone(),
        buckets: total
            .iter()
            .zip(&good)
            .enumerate()
            .map(|(i, (&feasible, &met))| Bucket {
                start_s: i as f64 * BURST_BUCKET_S,
                feasible,
                met,
            })
            .collect(),
    }
}

fn percentile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let i = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len()) - 1;
    xs[i]
}

/// Whether a request met both SLOs.
pub fn met(o: &Outcome, slo: &Slo) -> bool {
    !o.failed
        && o.ttft_s.is_some_and(|t| t <= slo.ttft_p99_s)
        && o.tpot_s.is_some_and(|t| t <= slo.tpot_p99_s)
}

/// Summarises a run. An unfinished request's TTFT counts as the time it waited (a lower bound).
pub fn summarise(run: &Run, slo: &Slo, goal: f64) -> Summary {
    let n = run.outcomes.len();
    let ok = run.outcomes.iter().filter(|o| met(o, slo)).count();
    let feasible = run.outcomes.iter().filter(|o| o.feasible).count();
    let ok_feasible = run
        .outcomes
        .iter()
        .filter(|o| o.feasible && met(o, slo))
        .count();
    let share = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
    let mut ttft: Vec<f64> = run
        .outcomes
        .iter()
        .filter(|o| !o.failed)
        .map(|o| o.ttft_s.unwrap_or((run.end_s - o.arrival_s).max(0.0)))
        .collect();
    let mut tpot: Vec<f64> = run.outcomes.iter().filter_map(|o| o.tpot_s).collect();
    let failed = run.outcomes.iter().filter(|o| o.failed).count();
    let unfinished = run
        .outcomes
        .iter()
        .filter(|o| !o.failed && o.tpot_s.is_none())
        .count();
    let (bursts, max, mean) = recovery(&run.outcomes, slo, goal);
    Summary {
        requests: n,
        infeasible: n - feasible,
        slo_attainment: share(ok_feasible, feasible),
        raw_slo_attainment: share(ok, n),
        ttft_p50_s: percentile(&mut ttft, 0.5),
        ttft_p99_s: percentile(&mut ttft, 0.99),
        tpot_p50_s: percentile(&mut tpot, 0.5),
        tpot_p99_s: percentile(&mut tpot, 0.99),
        gpu_hours: run.gpu_hours,
        cost_usd: run.cost_usd,
        cost_vs_oracle: None,
        scale_events: run.scale_events,
        replicas_started: run.replicas_started,
        failed,
        unfinished,
        spot_preemptions: run.spot_preemptions,
        bursts,
        recovery_s_max: max,
        recovery_s_mean: mean,
    }
}

/// Episodes of consecutive arrival buckets whose attainment over feasible requests is below
/// `goal`: count, longest and mean duration in seconds.
pub fn recovery(outcomes: &[Outcome], slo: &Slo, goal: f64) -> (usize, f64, f64) {
    let (total, good) = buckets(outcomes, slo);
    let n = total.len();
    let mut episodes = Vec::new();
    let mut run = 0usize;
    for b in 0..n {
        let bad = total[b] > 0 && f64::from(good[b]) < goal * f64::from(total[b]);
        if bad {
            run += 1;
        } else if run > 0 {
            episodes.push(run);
            run = 0;
        }
    }
    if run > 0 {
        episodes.push(run);
    }
    let secs: Vec<f64> = episodes
        .iter()
        .map(|&e| e as f64 * BURST_BUCKET_S)
        .collect();
    let max = secs.iter().copied().fold(0.0, f64::max);
    let mean = if secs.is_empty() {
        0.0
    } else {
        secs.iter().sum::<f64>() / secs.len() as f64
    };
    (secs.len(), max, mean)
}

/// Feasible requests per arrival bucket of [`BURST_BUCKET_S`], and those that met the SLO.
fn buckets(outcomes: &[Outcome], slo: &Slo) -> (Vec<u32>, Vec<u32>) {
    let end = outcomes.iter().map(|o| o.arrival_s).fold(0.0, f64::max);
    let n = (end / BURST_BUCKET_S).floor() as usize + 1;
    let mut total = vec![0u32; n];
    let mut good = vec![0u32; n];
    for o in outcomes.iter().filter(|o| o.feasible) {
        let b = ((o.arrival_s / BURST_BUCKET_S) as usize).min(n - 1);
        total[b] += 1;
        good[b] += u32::from(met(o, slo));
    }
    (total, good)
}

/// Fills `cost_vs_oracle` from the oracle's summary, if present.
pub fn relate_to_oracle(summaries: &mut [(String, Summary)]) {
    let oracle = summaries
        .iter()
        .find(|(n, _)| n == "oracle")
        .map(|(_, s)| s.cost_usd);
    if let Some(o) = oracle.filter(|&o| o > 0.0) {
        for (_, s) in summaries.iter_mut() {
            s.cost_vs_oracle = Some(s.cost_usd / o);
        }
    }
}

fn ms(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{:.0}", x * 1000.0)
    }
}

/// The comparison table.
pub fn table(summaries: &[(String, Summary)]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "policy",
        "SLO met",
        "raw SLO",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "TPOT p99 ms",
        "GPU-h",
        "cost $",
        "× oracle",
        "scale ev.",
        "bursts",
        "recover max s",
    ]);
    for (name, s) in summaries {
        let row = vec![
            name.clone(),
            format!("{:.2} %", s.slo_attainment * 100.0),
            format!("{:.2} %", s.raw_slo_attainment * 100.0),
            ms(s.ttft_p50_s),
            ms(s.ttft_p99_s),
            ms(s.tpot_p50_s),
            ms(s.tpot_p99_s),
            format!("{:.1}", s.gpu_hours),
            format!("{:.2}", s.cost_usd),
            s.cost_vs_oracle.map_or("-".into(), |x| format!("{x:.2}")),
            s.scale_events.to_string(),
            s.bursts.to_string(),
            format!("{:.0}", s.recovery_s_max),
        ];
        t.add_row(figures_row(row, 1));
    }
    t.to_string()
}

/// A table row: its first `labels` cells are names, left-aligned; the rest are figures,
/// right-aligned.
pub(crate) fn figures_row(cells: impl IntoIterator<Item = String>, labels: usize) -> Vec<Cell> {
    cells
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let cell = Cell::new(c);
            if i < labels {
                cell
            } else {
                cell.set_alignment(CellAlignment::Right)
            }
        })
        .collect()
}

/// What the table's "SLO met" counts: the requests set apart as infeasible.
pub fn feasibility_line(s: &Summary) -> String {
    format!(
        "infeasible: {} of {} requests (no variant serves them within the SLO even alone and \
         idle); \"SLO met\" is over the other {}, \"raw SLO\" over all",
        s.infeasible,
        s.requests,
        s.requests - s.infeasible
    )
}

/// Writes a JSON report ([`Report`], or the suite's).
pub fn write_json(path: &Path, report: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(report).map_err(Error::Json)?;
    std::fs::write(path, text).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Every run's decisions ([`Run::decisions`]) as JSON lines, `{"policy", "decision"}`, run by
/// run in order.
pub fn write_decisions(path: &Path, runs: &[Run]) -> Result<()> {
    let mut text = String::new();
    for run in runs {
        for d in &run.decisions {
            let line = serde_json::json!({ "policy": run.policy, "decision": d });
            text.push_str(&line.to_string());
            text.push('\n');
        }
    }
    std::fs::write(path, text).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(t: f64, ttft: f64, tpot: f64) -> Outcome {
        Outcome {
            arrival_s: t,
            ttft_s: Some(ttft),
            tpot_s: Some(tpot),
            failed: false,
            feasible: true,
        }
    }

    #[test]
    fn attainment_needs_both_slos_and_bursts_are_runs_of_bad_buckets() {
        let slo = Slo {
            ttft_p99_s: 2.0,
            tpot_p99_s: 0.1,
        };
        assert!(met(&o(0.0, 1.0, 0.05), &slo));
        assert!(!met(&o(0.0, 3.0, 0.05), &slo));
        assert!(!met(&o(0.0, 1.0, 0.2), &slo));
        assert!(!met(
            &Outcome {
                failed: true,
                ..o(0.0, 1.0, 0.05)
            },
            &slo
        ));
        // Buckets 0..10 good except 3, 4 and 7.
        let mut outs = Vec::new();
        for b in 0..10 {
            let bad = [3, 4, 7].contains(&b);
            for i in 0..10 {
                let t = f64::from(b) * BURST_BUCKET_S + f64::from(i);
                outs.push(if bad {
                    o(t, 5.0, 0.05)
                } else {
                    o(t, 0.5, 0.05)
                });
            }
        }
        let (n, max, mean) = recovery(&outs, &slo, 0.99);
        assert_eq!(n, 2);
        assert_eq!(max, 2.0 * BURST_BUCKET_S);
        assert_eq!(mean, 1.5 * BURST_BUCKET_S);
        // The timeline's buckets say the same, request by request; infeasible ones are apart.
        outs.push(Outcome {
            feasible: false,
            ..o(0.0, 5.0, 0.05)
        });
        let run = Run {
            policy: "p".into(),
            outcomes: outs,
            cost_usd: 0.0,
            gpu_hours: 0.0,
            scale_events: 0,
            replicas_started: 0,
            spot_preemptions: 0,
            cold_arrivals: 0,
            end_s: 300.0,
            samples: Vec::new(),
            variants: vec!["v".into()],
            decisions: Vec::new(),
        };
        let t = timeline(&run, &slo);
        assert_eq!(t.buckets.len(), 10);
        for (b, bucket) in t.buckets.iter().enumerate() {
            let good = if [3, 4, 7].contains(&b) { 0 } else { 10 };
            assert_eq!((bucket.feasible, bucket.met), (10, good), "bucket {b}");
            assert_eq!(bucket.start_s, b as f64 * BURST_BUCKET_S);
        }
    }
}
