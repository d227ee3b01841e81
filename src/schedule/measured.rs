//! What the scheduler learns about a runnable as it runs it: what a cell costs by batch
//! size ([`super::cost`], measured once, on the first run that needs it) and the times
//! of the batches run on plans prepared before ([`super::fit`], a batch's fixed part
//! fitted to them). The runnable holds one, so that every run of it cuts its batches
//! with what the runs before learnt; the scheduler alone reads and writes it.

use std::sync::Mutex;

use super::cost::CellCosts;
use super::fit::BatchTimes;

/// The scheduler's measurements on one runnable (module doc).
#[derive(Debug, Default)]
pub struct Measurements {
    costs: Mutex<Option<CellCosts>>,
    batch_times: Mutex<BatchTimes>,
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

    /// A batch's fixed part in padded cells, fitted to the batches recorded, and how many
    /// batches the fit has; none until they allow a fit.
    pub fn fitted_overhead(&self) -> Option<(u64, usize)> {
        let times = self.batch_times.lock().ok()?;
        Some((times.overhead()?, times.len()))
    }
}
