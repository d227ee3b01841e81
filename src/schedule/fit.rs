//! A batch's overhead fitted to the batches a runnable ran: the cost model of a device.
//!
//! On a GPU a batch costs a fixed part (its launches, the host's work around them, the
//! transfers' setup) plus a part proportional to its padded cells once it fills the
//! device; what a cell costs hardly depends on how many samples share the batch. The
//! scheduler's cut needs only their ratio: the padding a new batch must save to be worth
//! its fixed part, [`crate::backend::CostModel::batch_overhead`] in cells. Guessed, it is
//! right for one model on one device; so where the backend asks for it
//! ([`crate::backend::CostModel::fitted`]) every batch the runnable runs on a plan it had
//! already prepared records its padded cells and its time (upload, run, crops: what the
//! caller waits for), and [`BatchTimes::overhead`] fits `time = fixed + per_cell x cells`
//! by least squares over the latest [`KEPT`] of them. The fit is used once the batches
//! span cells widely enough to separate the two parts ([`SPREAD`]); until then, and where
//! the fit says nothing sensible (a negative per-cell time: noise), the backend's guess.
//!
//! A new overhead means a new cut, new batch sizes and widths, and new plans to prepare:
//! a fit that moved with every batch would cost more than it saves. So the overhead in
//! use is a power of two, and it changes only when the fit moves more than twice or half
//! away from it ([`BatchTimes::overhead`]).
//!
//! Batches run in lanes share the device, which lengthens both parts alike: the ratio,
//! which is all the cut uses, holds.

/// The latest batches the fit keeps.
pub const KEPT: usize = 64;

/// The fit is used once the largest batch kept has at least this many times the cells of
/// the smallest.
pub const SPREAD: f64 = 2.0;

/// The largest overhead the fit may give, in cells: beyond it every run would be one
/// batch, whatever its padding.
pub const MAX_OVERHEAD: u64 = 1 << 22;

/// The padded cells and seconds of the latest batches a runnable ran (module doc).
#[derive(Clone, Debug, Default)]
pub struct BatchTimes {
    points: Vec<(u64, f64)>,
    next: usize,
    /// The overhead in use: a power of two.
    adopted: Option<u64>,
}

impl BatchTimes {
    /// Records a batch of `cells` padded cells that took `seconds`.
    pub fn record(&mut self, cells: u64, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) || cells == 0 {
            return;
        }
        if self.points.len() < KEPT {
            self.points.push((cells, seconds));
        } else {
            self.points[self.next] = (cells, seconds);
        }
        self.next = (self.next + 1) % KEPT;
        if let Some(fitted) = self.fitted_overhead() {
            let fitted = (fitted.max(1) as f64).log2();
            let moved = self
                .adopted
                .is_none_or(|a| (fitted - (a as f64).log2()).abs() > 1.0);
            if moved {
                self.adopted = Some(1 << (fitted.round() as u32).min(MAX_OVERHEAD.ilog2()));
            }
        }
    }

    /// How many batches the fit has.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// The overhead in use, in cells: a power of two near the fit, kept until the fit
    /// moves more than twice or half away (module doc); none until the batches allow a
    /// fit.
    pub fn overhead(&self) -> Option<u64> {
        self.adopted
    }

    /// The fixed part over the per-cell part, in cells, where the batches allow a fit.
    pub fn fitted_overhead(&self) -> Option<u64> {
        let (fixed, per_cell) = self.fit()?;
        (per_cell > 0.0)
            .then(|| (fixed.max(0.0) / per_cell).min(MAX_OVERHEAD as f64).round() as u64)
    }

    /// `(fixed seconds, seconds per cell)` by least squares, where the cells spread
    /// [`SPREAD`] times or more.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let (lo, hi) = self
            .points
            .iter()
            .fold((u64::MAX, 0), |(lo, hi), (c, _)| (lo.min(*c), hi.max(*c)));
        if self.points.len() < 2 || (hi as f64) < SPREAD * lo as f64 {
            return None;
        }
        let n = self.points.len() as f64;
        let mean_c = self.points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
        let mean_t = self.points.iter().map(|p| p.1).sum::<f64>() / n;
        let (mut cov, mut var) = (0.0, 0.0);
        for (c, t) in &self.points {
            let dc = *c as f64 - mean_c;
            cov += dc * (t - mean_t);
            var += dc * dc;
        }
        let per_cell = cov / var;
        Some((mean_t - per_cell * mean_c, per_cell))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_gives_its_fixed_part_in_cells() {
        let mut times = BatchTimes::default();
        // 2 ms fixed, 100 ns a cell: an overhead of 20000 cells, 16384 in use.
        for cells in [10_000u64, 40_000, 80_000, 20_000] {
            times.record(cells, 2e-3 + 1e-7 * cells as f64);
        }
        assert_eq!(times.fitted_overhead(), Some(20_000));
        assert_eq!(times.overhead(), Some(16_384));
    }

    #[test]
    fn batches_of_alike_cells_give_no_fit() {
        let mut times = BatchTimes::default();
        for cells in [10_000u64, 12_000, 15_000] {
            times.record(cells, 1e-3 + 1e-7 * cells as f64);
        }
        assert_eq!(times.overhead(), None);
        times.record(30_000, 1e-3 + 3e-3);
        assert!(times.overhead().is_some());
    }

    #[test]
    fn noise_that_makes_cells_free_gives_no_overhead() {
        let mut times = BatchTimes::default();
        times.record(10_000, 5e-3);
        times.record(40_000, 4e-3);
        assert_eq!(times.overhead(), None);
    }

    #[test]
    fn only_the_latest_batches_count() {
        let mut times = BatchTimes::default();
        for cells in [1_000u64, 100_000] {
            times.record(cells, 1.0 + 1e-9 * cells as f64);
        }
        for k in 0..KEPT as u64 {
            let cells = 10_000 + 1_000 * k;
            times.record(cells, 1e-3 + 1e-7 * cells as f64);
        }
        assert_eq!(times.len(), KEPT);
        assert_eq!(times.fitted_overhead(), Some(10_000));
        assert_eq!(times.overhead(), Some(8_192));
    }

    #[test]
    fn the_overhead_in_use_moves_only_when_the_fit_moves_twice_away() {
        let mut times = BatchTimes::default();
        let mut feed = |fixed: f64| {
            for cells in [10_000u64, 80_000] {
                times.record(cells, fixed + 1e-7 * cells as f64);
            }
            times.overhead()
        };
        assert_eq!(feed(1e-3), Some(8_192)); // 10000 cells
        assert_eq!(feed(1.5e-3), Some(8_192)); // toward 15000: within twice
        for _ in 0..KEPT {
            feed(4e-3);
        }
        assert_eq!(feed(4e-3), Some(32_768)); // 40000: moved
    }
}
