//! Scale to zero: what a policy that may go to zero replicas saves over a trace's idle
//! periods, against the same policy kept at one replica, and what its cold starts cost.
//!
//! Each policy that can go to zero (sluice, KPA) runs twice over the same requests: at the
//! scenario's `min_replicas` 0 and at 1 (one replica of the baseline variant always kept).
//! The difference in cost is what the idle periods cost at min 1: the two runs differ only
//! where the pool is idle long enough to go to zero. A request arriving at zero waits in the
//! gateway queue for the policy's next tick and the variant's start-up on a new node, and that
//! wait is its time to first token: it counts against the TTFT SLO like any other.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde::{Deserialize, Serialize};

use sluice_policy::timeline::Request;

use crate::error::Result;
use crate::report;
use crate::scenario::{self, Scenario};

/// The policies that may go to zero, so have a min-1 twin to compare with.
pub const ZERO_POLICIES: &[&str] = &["sluice", "kpa"];

/// One policy at min 0 against itself at min 1.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ZeroSavings {
    pub policy: String,
    pub cost_usd: f64,
    pub cost_min_one_usd: f64,
    /// `cost_min_one_usd − cost_usd`.
    pub saved_usd: f64,
    /// SLO attainment over feasible requests, at min 0 and at min 1.
    pub slo_attainment: f64,
    pub slo_attainment_min_one: f64,
    /// Requests that arrived with no replica ready (at min 0).
    pub cold_arrivals: usize,
    /// Gaps between arrivals long enough to go to zero, and their total length in seconds.
    pub idle_periods: usize,
    pub idle_s: f64,
    /// Mean time to first token of the first request after each idle period, at min 0 (the
    /// cold start as a client sees it); `None` without idle periods.
    pub wake_ttft_s: Option<f64>,
}

/// The shortest gap after which a policy goes to zero: the arrival window empties, then the
/// scale-down window passes with nothing planned.
pub fn idle_threshold_s(scn: &Scenario) -> f64 {
    scn.sim.window_s
        + sluice_policy::policy::SluiceConfig::new(scn.slo, Vec::new()).scale_down_window_s
}

/// The indices of requests that end an idle period (the previous arrival at least
/// `threshold_s` earlier), and the periods' total length.
pub fn idle_periods(requests: &[Request], threshold_s: f64) -> (Vec<usize>, f64) {
    let mut wakes = Vec::new();
    let mut total = 0.0;
    for (i, w) in requests.windows(2).enumerate() {
        let gap = w[1].arrival_s - w[0].arrival_s;
        if gap >= threshold_s {
            wakes.push(i + 1);
            total += gap;
        }
    }
    (wakes, total)
}

/// Runs each of `policies` that can go to zero at min 0 and at min 1.
pub fn compare(
    scn: &Scenario,
    requests: &[Request],
    policies: &[String],
) -> Result<Vec<ZeroSavings>> {
    let names: Vec<String> = policies
        .iter()
        .filter(|p| ZERO_POLICIES.contains(&p.as_str()))
        .cloned()
        .collect();
    let at = |min: u32| -> Result<Vec<crate::sim::Run>> {
        let mut s = scn.clone();
        s.min_replicas = min;
        let prepared = scenario::prepare(&s, requests, &names)?;
        Ok(scenario::run_all(&s, requests, prepared))
    };
    let (zero, one) = (at(0)?, at(1)?);
    let (wakes, idle_s) = idle_periods(requests, idle_threshold_s(scn));
    Ok(zero
        .iter()
        .zip(&one)
        .map(|(z, o)| {
            let sz = report::summarise(z, &scn.slo, scn.goal);
            let so = report::summarise(o, &scn.slo, scn.goal);
            let ttfts: Vec<f64> = wakes
                .iter()
                .map(|&i| {
                    let out = &z.outcomes[i];
                    out.ttft_s.unwrap_or((z.end_s - out.arrival_s).max(0.0))
                })
                .collect();
            ZeroSavings {
                policy: z.policy.clone(),
                cost_usd: z.cost_usd,
                cost_min_one_usd: o.cost_usd,
                saved_usd: o.cost_usd - z.cost_usd,
                slo_attainment: sz.slo_attainment,
                slo_attainment_min_one: so.slo_attainment,
                cold_arrivals: z.cold_arrivals,
                idle_periods: wakes.len(),
                idle_s,
                wake_ttft_s: (!ttfts.is_empty())
                    .then(|| ttfts.iter().sum::<f64>() / ttfts.len() as f64),
            }
        })
        .collect())
}

/// The comparison as a table.
pub fn table(rows: &[ZeroSavings]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "policy",
        "cost $ (min 0)",
        "cost $ (min 1)",
        "saved $",
        "SLO (min 0)",
        "SLO (min 1)",
        "cold arrivals",
        "idle periods",
        "idle min",
        "wake TTFT s",
    ]);
    for r in rows {
        let row = [
            r.policy.clone(),
            format!("{:.2}", r.cost_usd),
            format!("{:.2}", r.cost_min_one_usd),
            format!("{:.2}", r.saved_usd),
            format!("{:.2} %", r.slo_attainment * 100.0),
            format!("{:.2} %", r.slo_attainment_min_one * 100.0),
            r.cold_arrivals.to_string(),
            r.idle_periods.to_string(),
            format!("{:.0}", r.idle_s / 60.0),
            r.wake_ttft_s.map_or("-".into(), |x| format!("{x:.0}")),
        ];
        t.add_row(report::figures_row(row, 1));
    }
    t.to_string()
}
