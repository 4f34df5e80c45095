//! Stabilisation: what the fleet holds on the way down (the scale-down window, panic, a rising
//! load), whether cuts paid back, and the capacity an idle pool keeps warm for its return.

use super::{Planned, Sluice};
use crate::capacity::Capacity;
use crate::decision::{Decision, ReasonKind};
use crate::mix::Offer;
use crate::payback::Verdict;
use crate::policy::plan::VariantLimits;
use crate::signals::Signals;

/// The demand stabilisation holds (see [`Sluice::stabilise`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Stable {
    /// The demand the mix is sized for.
    pub(super) demand: f64,
    /// The same without the hold of a rising load: where it is lower, the rise held a cut back.
    unheld_by_rise: f64,
}

/// The most capacity (requests/s) stabilisation holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Holdable {
    /// What runs and is on its way; while the pool is idle (nothing arrived within the window,
    /// nothing queued or running), what is ready. A replica still starting when traffic stops
    /// would be paid for through the rest of its start-up and the scale-down window, to serve
    /// traffic that has gone (idle-gaps: the replica a five-minute session ordered arrived
    /// after it); what a return needs is kept warm after ([`Sluice::keep_warm_for_return`]).
    all: f64,
    /// What is ready (at most `all`): all the window holds of a demand planned in a panic's
    /// episode.
    ready: f64,
}

impl Holdable {
    pub(super) fn new(s: &Signals, ready: f64, current: f64) -> Holdable {
        let idle = s.arrivals.requests_per_s <= 0.0 && s.queue.waiting == 0 && s.queue.running == 0;
        let all = if idle { ready.min(current) } else { current };
        Holdable {
            all,
            ready: ready.min(all),
        }
    }
}

impl Sluice {
    /// Stabilisation (HPA's, on the planned demand rather than per variant, so a switch of
    /// mix is never half held back): up at once, down only to the highest demand planned
    /// within the window; in panic, not down at all; not while the load is rising (a cut the
    /// forecast expects to buy back within a start-up, where a lull inside a ramp would
    /// release what the ramp needs a start-up later); and not before a full window of
    /// arrivals has been measured (taking over a running fleet, the first rates are not yet
    /// rates). Never above [`Holdable`]. The demand the mix is sized for.
    ///
    /// A demand planned in a panic's episode is held by the window only as far as it is
    /// ready. Panic plans for a crowd at its peak (the short window's rate × the forecast cap ×
    /// the headroom × the margin: ~2.7× a two-minute crowd's rate), and what it orders comes a
    /// start-up later, mostly after the crowd: held for the window, those replicas were paid
    /// for through the rest of their start-up and the window to serve a crowd that had gone.
    /// Once the panic is over, replicas still starting stay only as far as the demand planned
    /// since needs them; what came up during the panic is held as any ready fleet is. The
    /// episode spans one rate window (`window_s`) on either side of the panic: before it, the
    /// long window's rate already held the crowd the short window then panicked on; after
    /// it, the rate, its trend and the backlog still hold it.
    pub(super) fn stabilise(
        &mut self,
        (t, window_s): (f64, f64),
        p: &Planned,
        holdable: Holdable,
        panic: bool,
        d: &mut Decision,
    ) -> Stable {
        let planned = p.planned;
        let held_now = if panic || p.warming || p.rising {
            planned.max(holdable.all)
        } else {
            planned
        };
        // The window remembers the demand planned, not the fleet panic held: replicas bought
        // for a backlog that has drained are not held for a whole window after the panic.
        // While the first window is measured the fleet is remembered (its rates are not yet
        // rates).
        let remembered = if p.warming { held_now } else { planned };
        if panic && self.history.back().is_some_and(|&(_, _, episode)| !episode) {
            for e in self.history.iter_mut().filter(|e| e.0 > t - window_s) {
                e.2 = true;
            }
        }
        let episode = panic || t < self.panic_until + window_s;
        self.history.push_back((t, remembered, episode));
        while self
            .history
            .front()
            .is_some_and(|&(h, _, _)| h < t - self.payback.window_s())
        {
            self.history.pop_front();
        }
        // Holding never grows the fleet: at most what runs now (what is ready, while idle, or
        // of what a panic's episode planned).
        let window = |episodes_ready_only: bool| {
            self.history
                .iter()
                .map(|&(_, p, episode)| {
                    p.min(if episode && episodes_ready_only {
                        holdable.ready
                    } else {
                        holdable.all
                    })
                })
                .fold(0.0, f64::max)
        };
        let held = window(true);
        let stable = planned.max(held).max(held_now);
        let whole = window(false);
        if whole > stable + 1e-9 {
            d.reason(
                ReasonKind::Stabilisation,
                None,
                format!(
                    "a panic's episode planned {whole:.2} req/s: held only as far as ready \
                     ({:.2} req/s), what still starts for it is let go",
                    holdable.ready
                ),
            );
        }
        // What the rise alone holds is what `stable` exceeds this by. A rise that keeps what a
        // panic ordered still starting holds back no cut of the window's own (it held panic
        // plans before it held only their ready part): no lull to learn from.
        let unheld = if panic || p.warming {
            stable
        } else if p.rising {
            planned.max(whole)
        } else {
            planned.max(held)
        };
        if stable > planned + 1e-9 && stable > 0.0 {
            let why = if panic {
                ": panic, no scale-down".to_string()
            } else if p.warming {
                ": still measuring the first window".to_string()
            } else if stable > unheld + 1e-9 {
                format!(
                    ": load rising (forecast {:.2} req/s in {:.0}s), no scale-down",
                    p.forecast,
                    self.horizon_s()
                )
            } else {
                format!(" for the {:.0}s scale-down window", self.payback.window_s())
            };
            d.reason(
                ReasonKind::Stabilisation,
                None,
                format!("holding {stable:.2} req/s (planned {planned:.2}){why}"),
            );
        }
        Stable {
            demand: stable,
            unheld_by_rise: unheld,
        }
    }

    /// A cut the rising load held back (see [`Sluice::stabilise`]) is judged as a cut: when,
    /// within the start-up lead of the smallest replica it kept, the demand without that hold
    /// is back above what the fleet less that replica serves, the cut would have been bought
    /// back, and the scale-down window grows as for one (see [`crate::payback::Payback`]).
    /// Otherwise the policy would not learn that this traffic's lulls are shorter than a
    /// start-up.
    pub(super) fn judge_held_cut(
        &mut self,
        t: f64,
        (offers, current): (&[Offer], &[u32]),
        capacity: f64,
        held: Stable,
        d: &mut Decision,
    ) {
        if let Some((at, level, lead_s)) = self.held_cut {
            if t - at >= lead_s {
                self.held_cut = None;
            } else if held.unheld_by_rise > level + 1e-9 {
                self.held_cut = None;
                self.payback.bought_back(lead_s);
                d.reason(
                    ReasonKind::Stabilisation,
                    None,
                    format!(
                        "a cut the rising load held back {:.0}s ago would have been bought \
                         again: scale-down window now {:.0}s",
                        t - at,
                        self.payback.window_s()
                    ),
                );
            }
        }
        if held.demand <= held.unheld_by_rise + 1e-9 {
            return;
        }
        let smallest = offers
            .iter()
            .zip(current)
            .zip(&self.leads)
            .filter(|((o, &n), _)| n > 0 && o.requests_per_s > 0.0)
            .map(|((o, _), &lead_s)| (o.requests_per_s, lead_s))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((per_replica, lead_s)) = smallest {
            let level = capacity - per_replica;
            if level >= held.unheld_by_rise {
                self.held_cut = Some((t, level, lead_s));
            }
        }
    }

    /// Whether the last cuts of the fleet paid back (see [`crate::payback::Payback`]): a
    /// variant bought again within its start-up lead of a cut lengthens the scale-down window.
    pub(super) fn judge_cuts(&mut self, t: f64, current: &[u32], counts: &[u32], d: &mut Decision) {
        if let Verdict::BoughtBack { after_s, lead_s } =
            self.payback.observe(t, current, counts, &self.leads)
        {
            d.reason(
                ReasonKind::Stabilisation,
                None,
                format!(
                    "replicas cut {after_s:.0}s ago bought again within their {lead_s:.0}s \
                     start-up: scale-down window now {:.0}s",
                    self.payback.window_s()
                ),
            );
        }
    }

    /// Under [`crate::zero::ZeroRule::ErrorBudget`], an idle pool goes to zero only when the
    /// cold start that would wake it fits the error budget; otherwise it keeps capacity for
    /// the rate its traffic returns at, also while the arrival window refills after the return
    /// (the windowed rate then understates it). The demand to size the mix for.
    pub(super) fn keep_warm_for_return(
        &mut self,
        s: &Signals,
        limits: &[VariantLimits],
        caps: &[Capacity],
        stable: f64,
        d: &mut Decision,
    ) -> f64 {
        let Some(z) = self.zero.as_mut() else {
            return stable;
        };
        if !z.idle_or_returning(s.time_s, s.arrivals.window_s) {
            return stable;
        }
        // The replica that would wake the pool: the quickest to start of those that serve.
        let startup = limits
            .iter()
            .zip(caps)
            .filter(|(_, c)| c.requests_per_s > 0.0)
            .filter_map(|(l, _)| self.profile.variant(&l.variant).ok())
            .map(|v| v.startup_s(true))
            .fold(f64::INFINITY, f64::min);
        if !startup.is_finite() {
            return stable;
        }
        let ttft = self.config.slo.ttft_p99_s;
        if stable <= 0.0 && z.allows_zero(startup, ttft) {
            return stable;
        }
        let warm = z.warm_capacity(startup, ttft);
        if warm <= 0.0 || stable >= warm {
            return stable;
        }
        d.reason(
            ReasonKind::ScaleToZero,
            None,
            format!(
                "a cold start would miss ~{:.0} requests, over the {:.0} the error budget \
                 has left: {warm:.2} req/s kept for the traffic's return",
                z.expected_misses(startup, ttft),
                z.remaining()
            ),
        );
        warm
    }
}
