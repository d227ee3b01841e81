//! What the scheduler learns about a runnable as it runs it: what a cell costs by batch
//! size ([`super::cost`], measured once, on the first run that needs it), the times
//! of the batches run on plans prepared before ([`super::fit`], a batch's fixed part
//! fitted to them), and what the ragged batches that needed a new plan took (preparing
//! it, then its first run: what a cut that needs a new plan pays,
//! [`super::Schedule::counting_new_plans`]). The runnable holds one, so that every run of
//! it cuts its batches with what the runs before learnt; the scheduler alone reads and
//! writes it.

use std::sync::Mutex;

use super::cost::CellCosts;
use super::fit::BatchTimes;

/// The latest batches on a new plan the measurements keep.
const NEW_PLANS_KEPT: usize = 16;

/// A batch that ran on a plan prepared for it.
#[derive(Clone, Copy, Debug)]
struct NewPlan {
    n: usize,
    cells: u64,
    /// Preparing the plan.
    preparing: f64,
    /// The batch's first run on it, upload to crops.
    first_run: f64,
}

/// The scheduler's measurements on one runnable (module doc).
#[derive(Debug, Default)]
pub struct Measurements {
    costs: Mutex<Option<CellCosts>>,
    batch_times: Mutex<BatchTimes>,
    new_plans: Mutex<Vec<NewPlan>>,
}

impl Measurements {
    /// What a cell costs by batch size, once measured.
    pub fn costs(&self) -> Option<CellCosts> {
        self.costs.lock().ok().and_then(|c| c.clone())
    }

    /// Keeps the costs measured by a run.
    pub(crate) fn keep_costs(&self, costs: &CellCosts) {
        if let Ok(mut kept) = self.costs.lock() {
            *kept = Some(costs.clone());
        }
    }

    /// Records a batch of `n` samples padded to `extents` that took `seconds` from its
    /// upload to its crops, on a plan prepared before.
    pub(crate) fn record_batch(&self, n: usize, extents: &[usize], seconds: f64) {
        if let Ok(mut times) = self.batch_times.lock() {
            times.record((n * extents.iter().product::<usize>()) as u64, seconds);
        }
    }

    /// Records a batch of `n` samples padded to `extents` that needed a new plan:
    /// `preparing` seconds to prepare it, then `first_run` seconds from upload to crops.
    pub(crate) fn record_new_plan(
        &self,
        n: usize,
        extents: &[usize],
        preparing: f64,
        first_run: f64,
    ) {
        if !(preparing.is_finite() && first_run.is_finite()) {
            return;
        }
        if let Ok(mut kept) = self.new_plans.lock() {
            if kept.len() == NEW_PLANS_KEPT {
                kept.remove(0);
            }
            kept.push(NewPlan {
                n,
                cells: (n * extents.iter().product::<usize>()) as u64,
                preparing: preparing.max(0.0),
                first_run: first_run.max(0.0),
            });
        }
    }

    /// What a batch needing a new plan took beyond the same batch on a plan held, in
    /// seconds: the median, over the latest batches on a new plan, of the preparation
    /// plus what their first run took beyond `predicted(n, cells)` seconds (a first run
    /// on a device also chooses its kernels and captures its graph). None before any.
    pub fn new_plan_seconds(&self, predicted: impl Fn(usize, u64) -> Option<f64>) -> Option<f64> {
        let kept = self.new_plans.lock().ok()?;
        let mut extra: Vec<f64> = kept
            .iter()
            .map(|p| {
                let beyond = predicted(p.n, p.cells).map_or(0.0, |t| (p.first_run - t).max(0.0));
                p.preparing + beyond
            })
            .collect();
        extra.sort_by(f64::total_cmp);
        extra.get(extra.len() / 2).copied()
    }

    /// `(fixed seconds, seconds per cell)` of a batch, fitted to the batches recorded
    /// ([`BatchTimes::fit`]).
    pub fn batch_fit(&self) -> Option<(f64, f64)> {
        self.batch_times.lock().ok()?.fit()
    }

    /// A batch's fixed part in padded cells, fitted to the batches recorded, and how many
    /// batches the fit has; none until they allow a fit.
    pub fn fitted_overhead(&self) -> Option<(u64, usize)> {
        let times = self.batch_times.lock().ok()?;
        Some((times.overhead()?, times.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new plan costs its preparation plus what its first run took beyond the
    /// prediction: the median over the latest, none before any.
    #[test]
    fn a_new_plan_costs_its_preparation_and_its_first_run_beyond_the_prediction() {
        let m = Measurements::default();
        let predicted = |_: usize, cells: u64| Some(1e-3 + 1e-6 * cells as f64);
        assert_eq!(m.new_plan_seconds(predicted), None);
        // 1000 cells: predicted 2 ms; prepared in 50 ms, first run 12 ms: 60 ms.
        m.record_new_plan(2, &[500], 0.050, 0.012);
        assert!((m.new_plan_seconds(predicted).unwrap() - 0.060).abs() < 1e-9);
        // A first run faster than predicted adds nothing; the median of three.
        m.record_new_plan(1, &[1000], 0.040, 0.001);
        m.record_new_plan(4, &[250], 0.070, 0.002);
        assert!((m.new_plan_seconds(predicted).unwrap() - 0.060).abs() < 1e-9);
        // Only the latest are kept.
        for _ in 0..NEW_PLANS_KEPT {
            m.record_new_plan(1, &[1000], 0.010, 0.002);
        }
        assert!((m.new_plan_seconds(predicted).unwrap() - 0.010).abs() < 1e-9);
    }
}
