//! A policy against the autoscaler's targets, trace by trace: how far it is from them.
//!
//! The policy is held to three targets on every trace: at least 99 % of feasible requests
//! within the SLO; at most 1.15× the oracle's cost; and no dearer than each scaling baseline
//! (static peak, the HPAs, KPA) at an SLO at least as good. A suite table answers them only
//! after reading sixty rows; this says, per target, on how many traces the policy meets it
//! and where it does not, with the figures, so the distance is on one screen.

use serde::{Deserialize, Serialize};

use crate::report::Summary;
use crate::suite::TraceResult;

/// Share of feasible requests in SLO the policy must reach on every trace.
pub const SLO_GOAL: f64 = 0.99;
/// Most cost over the oracle's.
pub const COST_VS_ORACLE: f64 = 1.15;
/// The baselines a policy must be no dearer than, at an SLO at least as good.
const BASELINES: [&str; 4] = ["static-peak", "hpa-concurrency", "hpa-cpu", "kpa"];

/// One target over the suite: how many traces it was checked on, and those it is missed on
/// (trace, what was measured).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Target {
    pub name: String,
    pub checked: usize,
    pub missed: Vec<(String, String)>,
}

impl Target {
    fn new(name: String) -> Self {
        Target {
            name,
            checked: 0,
            missed: Vec::new(),
        }
    }

    fn check(&mut self, trace: &str, met: bool, figures: impl FnOnce() -> String) {
        self.checked += 1;
        if !met {
            self.missed.push((trace.to_string(), figures()));
        }
    }

    /// `name: met on n of m traces; missed on a (figures), b (figures)`.
    pub fn line(&self) -> String {
        let met = self.checked - self.missed.len();
        let traces = if self.checked == 1 { "trace" } else { "traces" };
        let mut s = format!("{}: met on {met} of {} {traces}", self.name, self.checked);
        if !self.missed.is_empty() {
            let missed: Vec<String> = self
                .missed
                .iter()
                .map(|(t, f)| format!("{t} ({f})"))
                .collect();
            s.push_str("; missed on ");
            s.push_str(&missed.join(", "));
        }
        s
    }
}

/// `policy` against the targets over the suite's results (see [`check_runs`]).
pub fn check(results: &[TraceResult], policy: &str) -> Vec<Target> {
    check_runs(
        results
            .iter()
            .map(|r| (r.trace.as_str(), r.summaries.as_slice())),
        policy,
    )
}

/// `policy` against the targets over traces, each with its policies' summaries: the SLO
/// goal, the cost over the oracle (where the oracle ran), and each baseline that ran. Empty
/// when `policy` did not run.
pub fn check_runs<'a>(
    runs: impl IntoIterator<Item = (&'a str, &'a [(String, Summary)])>,
    policy: &str,
) -> Vec<Target> {
    let mut slo = Target::new(format!(
        "{policy} ≥ {:.0} % of feasible requests in SLO",
        SLO_GOAL * 100.0
    ));
    let mut cost = Target::new(format!("{policy} ≤ {COST_VS_ORACLE:.2}× the oracle's cost"));
    let mut baselines: Vec<(&str, Target)> = BASELINES
        .iter()
        .map(|&b| {
            let t = format!("{policy} no dearer than {b} at an SLO at least as good");
            (b, Target::new(t))
        })
        .collect();
    for (trace, summaries) in runs {
        let find = |name: &str| summaries.iter().find(|(n, _)| n == name).map(|(_, s)| s);
        let Some(own) = find(policy) else { continue };
        slo.check(trace, own.slo_attainment >= SLO_GOAL, || percent(own));
        if let Some(ratio) = own.cost_vs_oracle {
            cost.check(trace, ratio <= COST_VS_ORACLE + 1e-9, || {
                format!("{ratio:.2}×")
            });
        }
        for (b, target) in &mut baselines {
            let Some(base) = find(b) else { continue };
            let met = own.cost_usd <= base.cost_usd + 1e-9
                && own.slo_attainment + 1e-9 >= base.slo_attainment;
            target.check(trace, met, || {
                format!(
                    "{} for ${:.2} against {} for ${:.2}",
                    percent(own),
                    own.cost_usd,
                    percent(base),
                    base.cost_usd
                )
            });
        }
    }
    let mut out = vec![slo, cost];
    out.extend(baselines.into_iter().map(|(_, t)| t));
    out.retain(|t| t.checked > 0);
    out
}

fn percent(s: &Summary) -> String {
    format!("{:.2} %", s.slo_attainment * 100.0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn summary(slo: f64, cost: f64, vs_oracle: Option<f64>) -> Summary {
        Summary {
            slo_attainment: slo,
            cost_usd: cost,
            cost_vs_oracle: vs_oracle,
            ..Summary::default()
        }
    }

    pub(crate) fn trace(name: &str, rows: &[(&str, Summary)]) -> TraceResult {
        TraceResult {
            trace: name.into(),
            requests: 0,
            summaries: rows
                .iter()
                .map(|(n, s)| (n.to_string(), s.clone()))
                .collect(),
            notes: Vec::new(),
            timelines: Vec::new(),
        }
    }

    #[test]
    fn each_target_counts_the_traces_it_was_checked_on_and_names_the_misses() {
        let results = [
            // Meets everything.
            trace(
                "steady",
                &[
                    ("sluice", summary(0.999, 10.0, Some(1.0))),
                    ("static-peak", summary(0.999, 12.0, Some(1.2))),
                    ("oracle", summary(0.995, 10.0, Some(1.0))),
                ],
            ),
            // Short of the goal, dearer than the oracle allows, cheaper than static peak but
            // with a worse SLO.
            trace(
                "crowd",
                &[
                    ("sluice", summary(0.8, 20.0, Some(2.0))),
                    ("static-peak", summary(1.0, 40.0, Some(4.0))),
                    ("oracle", summary(0.996, 10.0, Some(1.0))),
                ],
            ),
            // No oracle and no baseline ran: only the SLO goal is checked.
            trace("alone", &[("sluice", summary(0.995, 5.0, None))]),
        ];
        let t = check(&results, "sluice");
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sluice ≥ 99 % of feasible requests in SLO",
                "sluice ≤ 1.15× the oracle's cost",
                "sluice no dearer than static-peak at an SLO at least as good",
            ]
        );
        assert_eq!(t[0].checked, 3);
        assert_eq!(t[0].missed, [("crowd".to_string(), "80.00 %".to_string())]);
        assert_eq!(t[1].checked, 2);
        assert_eq!(t[1].missed, [("crowd".to_string(), "2.00×".to_string())]);
        assert_eq!(t[2].checked, 2);
        assert_eq!(
            t[2].line(),
            "sluice no dearer than static-peak at an SLO at least as good: met on 1 of 2 \
             traces; missed on crowd (80.00 % for $20.00 against 100.00 % for $40.00)"
        );
        assert_eq!(
            t[0].line(),
            "sluice ≥ 99 % of feasible requests in SLO: met on 2 of 3 traces; missed on crowd \
             (80.00 %)"
        );
        // A policy that did not run meets nothing and is checked on nothing.
        assert!(check(&results, "kpa").is_empty());
    }

    #[test]
    fn the_same_cost_and_slo_as_a_baseline_is_no_dearer() {
        let results = [trace(
            "floor",
            &[
                ("sluice", summary(1.0, 19.84, Some(1.0))),
                ("static-peak", summary(1.0, 19.84, Some(1.0))),
                ("hpa-concurrency", summary(1.0, 19.83, Some(1.0))),
            ],
        )];
        let t = check(&results, "sluice");
        assert!(t[1].missed.is_empty() && t[2].missed.is_empty(), "{t:?}");
        // One cent dearer than HPA is dearer.
        assert!(t[3].name.contains("hpa-concurrency"));
        assert_eq!(t[3].missed.len(), 1, "{:?}", t[3]);
        assert!(t.iter().all(|t| t.checked == 1));
    }
}
