//! What a batch costs, measured on the model and the machine it runs on.
//!
//! Whether batching pays depends on both: on a GPU a batch of 32 costs little more than
//! one sample; on tract's CPU runtime a batch of 8 PP-OCRv4 lines costs twice as much per
//! cell as one line alone (its 1x1 convolutions are reshaped and transposed around one
//! large product, their bias added unfused), while a small model's per-run overhead makes
//! batches of many samples cheaper. So where its backend asks for it
//! ([`crate::backend::CostModel::measured`]), the scheduler measures the time per padded
//! cell at each batch size, [`CellCosts`], once per runnable, on the first samples it is
//! given to run:
//!
//! - **probes are real work**: a batch of 1, then 2, 4, 8... samples of the median width
//!   (taken from the samples sorted by width), timed without their plan's preparation,
//!   their outputs kept as those samples' answers; the ladder stops at the first size
//!   that is not at least 5% cheaper per cell than the best before it, at the backend's
//!   largest batch, or when the samples or the memory run out;
//! - the other lanes run single samples from the widest end meanwhile (work that is never
//!   slower than one by one), so a probe is timed among busy cores, as the run will be;
//! - a batch then costs its padded cells times the measured cost per cell at its size
//!   (interpolated between the sizes measured); sizes beyond the largest measured are not
//!   made.
//!
//! One by one is a batch of one in each lane, so a scheduled run that chooses batches by
//! these costs is not slower than one by one, whatever the core count.

use std::time::Instant;

use tract_core::internal::*;

use super::lanes::{self, Job};
use crate::backend::Backend;

/// Seconds per padded cell by batch size, measured (module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct CellCosts {
    /// (batch size, seconds per padded cell), ascending in batch size.
    pub points: Vec<(usize, f64)>,
}

impl CellCosts {
    /// The cost per cell of a batch of `n`, interpolated between the sizes measured;
    /// none beyond the largest.
    pub fn per_cell(&self, n: usize) -> Option<f64> {
        let (first, last) = (self.points.first()?, self.points.last()?);
        if n <= first.0 {
            return Some(first.1);
        }
        if n > last.0 {
            return None;
        }
        self.points.windows(2).find_map(|w| {
            let ((a, ca), (b, cb)) = (w[0], w[1]);
            (n >= a && n <= b).then(|| ca + (cb - ca) * (n - a) as f64 / (b - a).max(1) as f64)
        })
    }

    /// The largest batch measured: the largest the scheduler makes.
    pub fn largest(&self) -> usize {
        self.points.last().map_or(1, |p| p.0)
    }

    /// The measured batch size of least cost per cell.
    pub fn best(&self) -> usize {
        self.points
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(1, |p| p.0)
    }
}

/// What measuring needs to run a batch: its plan prepared (untimed), then run (timed).
pub(crate) trait Prober: Sync {
    type Answer: Send;
    /// The padded cells and peak memory of a batch of the samples at `indices`.
    fn size(&self, indices: &[usize]) -> TractResult<(u64, u64)>;
    /// Prepares the plan of a batch of the samples at `indices`.
    fn prepare(&self, indices: &[usize]) -> TractResult<()>;
    /// Runs them as one batch: whether it succeeded, and what to keep.
    fn run(&self, indices: &[usize]) -> (bool, Self::Answer);
}

/// What measuring found and did: the costs, and the batches it ran with their answers.
pub(crate) struct Measured<A> {
    pub costs: CellCosts,
    pub answered: Vec<(Vec<usize>, A)>,
}

/// Measures [`CellCosts`] on the samples at `sorted` (indices, ascending in width), as the
/// module doc says; the batches it runs are answered in [`Measured::answered`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn measure<P: Prober>(
    prober: &P,
    sorted: &[usize],
    lanes: usize,
    largest: usize,
    budget: u64,
    backend: &dyn Backend,
) -> TractResult<Measured<P::Answer>> {
    let lanes = lanes.max(1);
    let mut remaining: Vec<usize> = sorted.to_vec();
    let mut points: Vec<(usize, f64)> = vec![];
    let mut answered = vec![];
    let mut n = 1;
    while n <= largest.max(1) && remaining.len() >= n {
        let start = (remaining.len() / 2)
            .saturating_sub(n / 2)
            .min(remaining.len() - n);
        let probe: Vec<usize> = remaining[start..start + n].to_vec();
        let (cells, peak) = prober.size(&probe)?;
        if n > 1 && peak > budget / lanes as u64 {
            break;
        }
        remaining.drain(start..start + n);
        // Singles from the widest end for the other lanes, leaving samples for the
        // next probe.
        let spare = remaining.len().saturating_sub(4 * n);
        let fillers: Vec<Vec<usize>> = (0..(lanes - 1).min(spare))
            .filter_map(|_| remaining.pop().map(|i| vec![i]))
            .collect();
        prober.prepare(&probe)?;
        let mut jobs = vec![Job {
            work: probe,
            peak_memory: peak,
        }];
        for f in fillers {
            let peak_memory = prober.size(&f)?.1;
            jobs.push(Job {
                work: f,
                peak_memory,
            });
        }
        let mut probe_time = None;
        lanes::run(
            &jobs,
            lanes,
            budget,
            backend,
            |indices| {
                let started = Instant::now();
                let (ok, answer) = prober.run(indices);
                (ok, started.elapsed(), answer)
            },
            |ix, (ok, time, answer)| {
                if ix == 0 && ok {
                    probe_time = Some(time);
                }
                answered.push((jobs[ix].work.clone(), answer));
                true
            },
        );
        let Some(time) = probe_time else { break };
        let cost = time.as_secs_f64() / cells.max(1) as f64;
        let best = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        points.push((n, cost));
        if cost > best * 0.95 {
            break;
        }
        n *= 2;
    }
    if points.is_empty() {
        // Nothing measured (a failing probe): batches of one, which one by one runs.
        points.push((1, 1.0));
    }
    Ok(Measured {
        costs: CellCosts { points },
        answered,
    })
}

#[cfg(test)]
mod tests {
    use super::CellCosts;

    #[test]
    fn costs_are_interpolated_between_the_sizes_measured() {
        let costs = CellCosts {
            points: vec![(1, 4.0), (2, 2.0), (4, 3.0)],
        };
        assert_eq!(costs.per_cell(1), Some(4.0));
        assert_eq!(costs.per_cell(2), Some(2.0));
        assert_eq!(costs.per_cell(3), Some(2.5));
        assert_eq!(costs.per_cell(4), Some(3.0));
        assert_eq!(costs.per_cell(5), None);
        assert_eq!(costs.largest(), 4);
        assert_eq!(costs.best(), 2);
    }
}
