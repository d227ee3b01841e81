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
//! - **probes are real work**: batches of 1, then 2, 4, 8... samples of about the median
//!   width (taken from the samples sorted by width), timed without their plan's
//!   preparation, their outputs kept as those samples' answers; the ladder stops at the
//!   first size that is not at least 5% cheaper per cell than the best before it (that
//!   size is not made: a larger batch is used only where it measured clearly cheaper, so
//!   that timing noise cannot make a run slower than one by one), at the backend's
//!   largest batch, or when the samples or the memory run out;
//! - each size runs as one probe per lane, and at least three (at most half of the
//!   samples left, so that larger sizes get theirs; a size beyond one that the samples
//!   left cannot give three probes is not measured, nor made), and costs the **median**
//!   of its probes: one probe timed alone came out anywhere between 112 and 202 us per
//!   cell at size 1 on 16 cores (PP-OCRv4 rec, benches/NOTES.md), enough to choose
//!   larger batches that ran the 112 fixture lines in 904 ms instead of 553; on one
//!   core, one probe each made pairs look 0.7% cheaper than singles (125.0 against 125.8
//!   us per cell) and the run took 12.2 s where one by one took 5.1-7.6 s;
//! - **a lane's first batch is not timed** (the first size has a probe more per lane for
//!   it): timed, a cold process and plan state made singles look 40-75% dearer than they
//!   run, and PP-OCRv4 rec's lines, cheapest alone on 2 cores (a line's activations stay
//!   in its core's L2), were paired (benches/NOTES.md);
//! - lanes without a probe run single samples from the widest end meanwhile (work that
//!   is never slower than one by one), so a probe is timed among busy cores, as the run
//!   will be; every probe runs on its lane's thread alone, however few there are (the
//!   lanes lend no cores here): a lone probe of two on every core measured half the cost
//!   per cell of probes of one on their lanes, and PP-OCRv4 det's eight pages were then
//!   paired, padded to the larger page, in 1.8x ONNX Runtime's time on 2 cores;
//! - a batch then costs its padded cells times the measured cost per cell at its size
//!   (interpolated between the sizes measured); sizes beyond the largest measured are not
//!   made.
//!
//! A batch of one is the sample on the ragged plan of its width's bucket, not the original
//! model at its own width: the masks and at most 12.5% of padding cost about 3% against
//! the sample alone (the 112 fixture lines on 2 cores, batches of one: 2079 against 2026
//! ms), and a run over samples of many widths prepares a plan per bucket instead of one
//! per width (27 plans against 106 there; a server meeting new widths on every request
//! would otherwise prepare a plan for nearly each). So a scheduled run that chooses
//! batches by these costs is within a few percent of one by one at worst, whatever the
//! core count.

use std::collections::HashSet;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Instant;

use tract_core::internal::*;

use super::lanes::{self, Job, Lending};
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
    // The threads that ran a batch of this measurement: each one's first is not timed.
    let warm: Mutex<HashSet<ThreadId>> = Mutex::default();
    let mut n = 1;
    while n <= largest.max(1) && remaining.len() >= n {
        // The first size has a probe more per lane, for the lanes' first batches.
        let warmups = if n == 1 { lanes } else { 0 };
        let range = probes_at(remaining.len(), n, lanes, warmups);
        // A larger size is made only where it measured cheaper on the median of enough
        // probes: measured on one, a pair of det pages came out a third cheaper per cell
        // than pages alone, and the run that paired them took 1.8x as long on 2 cores.
        if n > 1 && range.len() / n < MIN_PROBES {
            break;
        }
        let probes: Vec<Vec<usize>> = remaining[range.clone()]
            .chunks(n)
            .map(|c| c.to_vec())
            .collect();
        let sizes = probes
            .iter()
            .map(|p| prober.size(p))
            .collect::<TractResult<Vec<(u64, u64)>>>()?;
        if n > 1 && sizes.iter().any(|(_, peak)| *peak > budget / lanes as u64) {
            break;
        }
        remaining.drain(range);
        // Singles from the widest end for the lanes left, leaving samples for the next
        // probes.
        let spare = remaining.len().saturating_sub(4 * n);
        let fillers: Vec<Vec<usize>> = (0..lanes.saturating_sub(probes.len()).min(spare))
            .filter_map(|_| remaining.pop().map(|i| vec![i]))
            .collect();
        for probe in &probes {
            prober.prepare(probe)?;
        }
        let mut jobs: Vec<Job<Vec<usize>>> = probes
            .iter()
            .zip(&sizes)
            .map(|(probe, (_, peak))| Job {
                work: probe.clone(),
                peak_memory: *peak,
                // Unknown: what the probes measure.
                cost: 0.0,
            })
            .collect();
        for f in fillers {
            let peak_memory = prober.size(&f)?.1;
            jobs.push(Job {
                work: f,
                peak_memory,
                cost: 0.0,
            });
        }
        let mut per_cell = vec![];
        lanes::run(
            &jobs,
            lanes,
            budget,
            backend,
            // Every size as a batch among many runs, so that their costs compare: a lone
            // probe given every core came out at half the cost per cell of probes of one
            // on their lanes, and PP-OCRv4 det's pages were paired, padded, on 2 cores.
            Lending::OneThreadEach,
            |indices| {
                let first = warm
                    .lock()
                    .is_ok_and(|mut w| w.insert(std::thread::current().id()));
                let started = Instant::now();
                let (ok, answer) = prober.run(indices);
                (ok, (!first).then(|| started.elapsed()), answer)
            },
            |ix, (ok, time, answer)| {
                if let (Some((cells, _)), Some(time)) = (sizes.get(ix).filter(|_| ok), time) {
                    per_cell.push(time.as_secs_f64() / (*cells).max(1) as f64);
                }
                answered.push((jobs[ix].work.clone(), answer));
                true
            },
        );
        let Some(cost) = median(&mut per_cell) else {
            break;
        };
        let best = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        if cost > best * 0.95 {
            break;
        }
        points.push((n, cost));
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

/// The fewest probes a size is measured on where the samples allow, lanes or not: the
/// median of three outvotes one slow run.
const MIN_PROBES: usize = 3;

/// Where the probes of size `n` lie among `left` samples sorted by width: one per lane
/// and at least [`MIN_PROBES`], and `warmups` more, as many as half the samples make (at
/// least one), contiguous and centred on the median width; cut into probes of `n` in
/// order.
fn probes_at(left: usize, n: usize, lanes: usize, warmups: usize) -> std::ops::Range<usize> {
    let n = n.clamp(1, left.max(1));
    let count = (left / n / 2).clamp(1, lanes.max(MIN_PROBES) + warmups);
    let span = count * n;
    let start = (left / 2).saturating_sub(span / 2).min(left - span);
    start..start + span
}

/// The median of `values` (the upper one of an even count); none of none.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::{CellCosts, MIN_PROBES, Prober, measure, median, probes_at};
    use crate::backend::HostBackend;
    use tract_core::internal::*;

    #[test]
    fn probes_take_one_lane_each_and_at_most_half_the_samples() {
        // 112 samples on 16 lanes: 16 probes of one, then of two, then 8 of four.
        assert_eq!(probes_at(112, 1, 16, 0), 48..64);
        assert_eq!(probes_at(96, 2, 16, 0), 32..64);
        assert_eq!(probes_at(64, 4, 16, 0), 16..48);
        // Too few for two probes: one, centred.
        assert_eq!(probes_at(24, 8, 16, 0), 8..16);
        assert_eq!(probes_at(5, 4, 2, 0), 0..4);
        // One or two lanes: three probes, one after the other.
        assert_eq!(probes_at(100, 2, 1, 0), 47..53);
        assert_eq!(probes_at(100, 1, 2, 0), 49..52);
        // Too few samples for three: fewer.
        assert_eq!(probes_at(4, 1, 1, 0), 1..3);
        // A probe more per lane for the lanes' first batches, within half the samples.
        assert_eq!(probes_at(112, 1, 2, 2), 54..59);
        assert_eq!(probes_at(112, 1, 16, 16), 40..72);
        assert_eq!(probes_at(8, 1, 2, 2), 2..6);
        for (left, n, lanes) in [(3, 1, 4), (7, 4, 3), (1, 1, 1), (300, 8, 16), (9, 2, 1)] {
            let r = probes_at(left, n, lanes, 0);
            assert!(
                r.end <= left && r.len().is_multiple_of(n) && r.len() >= n,
                "{left} {n} {lanes}"
            );
            assert!(r.len() / n <= lanes.max(MIN_PROBES) && (r.len() <= left / 2 || r.len() == n));
        }
    }

    /// Samples of one cell each whose batches take 4 ms whatever their size: larger
    /// batches are cheaper per cell.
    struct Flat;

    impl Prober for Flat {
        type Answer = ();
        fn size(&self, indices: &[usize]) -> TractResult<(u64, u64)> {
            Ok((indices.len() as u64, 0))
        }
        fn prepare(&self, _: &[usize]) -> TractResult<()> {
            Ok(())
        }
        fn run(&self, _: &[usize]) -> (bool, ()) {
            std::thread::sleep(std::time::Duration::from_millis(4));
            (true, ())
        }
    }

    #[test]
    fn a_larger_size_needs_three_probes_to_be_made() {
        let sizes = |samples: usize| {
            let sorted: Vec<usize> = (0..samples).collect();
            let measured = measure(&Flat, &sorted, 2, 8, u64::MAX, &HostBackend).unwrap();
            // Every sample probed is answered, once.
            let mut probed: Vec<usize> =
                measured.answered.iter().flat_map(|a| a.0.clone()).collect();
            probed.sort();
            probed.dedup();
            assert_eq!(
                probed.len(),
                measured.answered.iter().map(|a| a.0.len()).sum::<usize>()
            );
            measured
                .costs
                .points
                .iter()
                .map(|p| p.0)
                .collect::<Vec<_>>()
        };
        // 8 samples: three probes of one, then five left: one probe of two, not enough.
        assert_eq!(sizes(8), vec![1]);
        // 40 samples: three of one, three of two, three of four; 8 would take 48.
        assert_eq!(sizes(40), vec![1, 2, 4]);
    }

    /// Samples of one cell each, a batch costing 4 ms a sample alone and 5 ms a sample
    /// in a batch, but a thread's first batch 60 ms (a cold process and plan state).
    #[derive(Default)]
    struct ColdFirst {
        ran: std::sync::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    }

    impl Prober for ColdFirst {
        type Answer = ();
        fn size(&self, indices: &[usize]) -> TractResult<(u64, u64)> {
            Ok((indices.len() as u64, 0))
        }
        fn prepare(&self, _: &[usize]) -> TractResult<()> {
            Ok(())
        }
        fn run(&self, indices: &[usize]) -> (bool, ()) {
            let first = self.ran.lock().unwrap().insert(std::thread::current().id());
            let ms = match (first, indices.len()) {
                (true, _) => 60,
                (false, 1) => 4,
                (false, n) => 5 * n as u64,
            };
            std::thread::sleep(std::time::Duration::from_millis(ms));
            (true, ())
        }
    }

    /// The lanes' first batches are not timed: timed, two cold probes of three made
    /// singles look dearer than pairs on two lanes, and the run batched samples that
    /// run faster alone (PP-OCRv4 rec's lines on 2 cores, benches/NOTES.md).
    #[test]
    fn the_lanes_first_batches_are_not_timed() {
        let sorted: Vec<usize> = (0..40).collect();
        let measured =
            measure(&ColdFirst::default(), &sorted, 2, 8, u64::MAX, &HostBackend).unwrap();
        assert_eq!(measured.costs.points.len(), 1, "{:?}", measured.costs);
        let (n, cost) = measured.costs.points[0];
        assert_eq!(n, 1);
        assert!((0.004..0.02).contains(&cost), "{cost}");
    }

    #[test]
    fn a_size_costs_the_median_of_its_probes() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0]), Some(3.0));
        // One slow probe among four does not move the cost.
        assert_eq!(median(&mut [1.2, 9.0, 1.0, 1.1]), Some(1.2));
        assert_eq!(median(&mut [2.0, 1.0, 9.0]), Some(2.0));
    }

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
