//! Running many samples: batches sized by memory, shaped by a cost model, answers in the
//! caller's order.
//!
//! A page or a corpus brings thousands of lines. The scheduler sorts them by width, so
//! that a batch holds lines of similar widths and little padding, then cuts the sorted
//! sequence into batches:
//!
//! - a batch must fit the **memory budget**: the peak memory of its plan, from the model's
//!   symbolic shapes evaluated at the batch size and padded width
//!   ([`crate::memory::peak_memory`]), stays under the budget (by default the backend's:
//!   80% of the device's free memory, or of the host's available memory);
//! - among the cuts that fit, the one of least **cost**: a batch costs a fixed overhead (its
//!   launches, its plan) plus its padded area, samples times padded width. Widths sorted,
//!   the best cut is found exactly by dynamic programming over contiguous groups. This
//!   prefers more, narrower batches to one wide one exactly when the padding saved is worth
//!   more than a batch's overhead.
//!
//! A batch that runs out of memory anyway (as its backend tells,
//! [`crate::backend::Backend::is_out_of_memory`]) is split in halves and retried, down to
//! single samples; a sample that fails alone is an error naming it. Every sample is
//! answered, or the error says which was not.
//!
//! [`RaggedRunnable::run_many_each_with`] answers each sample on its own instead: a sample
//! that is refused, or that fails (a batch failing otherwise than by memory is split
//! down to the samples at fault), gets its error, and every other sample its outputs.

use std::borrow::Borrow;

use tract_core::internal::*;

use crate::runnable::RaggedRunnable;

/// How [`RaggedRunnable::run_many`] forms batches.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Bytes a batch's peak memory may take.
    pub budget: u64,
    /// At most this many samples per batch.
    pub max_batch: Option<usize>,
    /// A batch's fixed cost, in padded cells over the ragged axes (samples x padded
    /// width, or x padded height x padded width): the padding a new batch must save to
    /// be worth its overhead.
    pub batch_overhead: u64,
    /// The number errors give the first sample (the others follow): where the samples
    /// start in a larger run cut into windows.
    pub first_index: usize,
}

/// One batch of the plan: the samples (indices in the caller's order) and the padded
/// extents they run at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub samples: Vec<usize>,
    /// The padded extent of the last ragged axis (a line's width).
    pub padded: usize,
    /// The padded extent of each ragged axis.
    pub extents: TVec<usize>,
    pub peak_memory: u64,
}

impl Batch {
    /// The share of the batch's cells that is padding, for samples of `widths` (one per
    /// ragged axis, per sample).
    pub fn waste(&self, widths: &[TVec<usize>]) -> f32 {
        let used: usize = self
            .samples
            .iter()
            .map(|i| widths[*i].iter().product::<usize>())
            .sum();
        let cells = self.samples.len() * self.extents.iter().product::<usize>();
        1.0 - used as f32 / cells as f32
    }
}

impl Schedule {
    /// The default schedule for a runnable: its backend's memory budget and cost model.
    pub fn for_runnable(runnable: &RaggedRunnable) -> Schedule {
        let backend = runnable.backend();
        let cost = backend.cost_model();
        Schedule {
            budget: backend.memory_budget(),
            max_batch: cost.max_batch,
            batch_overhead: cost.batch_overhead,
            first_index: 0,
        }
    }

    /// Cuts samples of `widths` (one ragged axis) into batches: sorted by width,
    /// contiguous groups of least total cost whose plans fit the budget.
    pub fn plan(&self, runnable: &RaggedRunnable, widths: &[usize]) -> TractResult<Vec<Batch>> {
        let widths: Vec<TVec<usize>> = widths.iter().map(|w| tvec!(*w)).collect();
        self.plan_axes(runnable, &widths)
    }

    /// Cuts samples of `widths` (per sample, one per ragged axis) into batches: sorted by
    /// widths (the first axis first), contiguous groups of least total cost whose plans
    /// fit the budget, a group padded to the largest width along each axis.
    pub fn plan_axes(
        &self,
        runnable: &RaggedRunnable,
        widths: &[TVec<usize>],
    ) -> TractResult<Vec<Batch>> {
        let mut order: Vec<usize> = (0..widths.len()).collect();
        order.sort_by(|a, b| widths[*a].cmp(&widths[*b]));
        let n = order.len();
        // The largest batch that fits the budget at each padded extents, found once.
        let mut fits: HashMap<TVec<usize>, usize> = HashMap::default();
        let mut max_fitting = |padded: &TVec<usize>| -> TractResult<usize> {
            if let Some(m) = fits.get(padded) {
                return Ok(*m);
            }
            let cap = self.max_batch.unwrap_or(n).min(n).max(1);
            let (mut lo, mut hi) = (0usize, cap);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if runnable.peak_memory(mid, padded)? <= self.budget {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            fits.insert(padded.clone(), lo);
            Ok(lo)
        };
        // The padded extents of the sorted samples start..end.
        let group = |start: usize, end: usize| -> TVec<usize> {
            let axes = widths.first().map(|w| w.len()).unwrap_or(0);
            let maxima: Vec<usize> = (0..axes)
                .map(|a| {
                    order[start..end]
                        .iter()
                        .map(|i| widths[*i][a])
                        .max()
                        .unwrap_or(1)
                })
                .collect();
            runnable.padded_extents(&maxima)
        };
        // best[i]: least cost of the first i sorted samples; cut[i]: where their last
        // batch starts.
        let mut best = vec![u64::MAX; n + 1];
        let mut cut = vec![0usize; n + 1];
        best[0] = 0;
        for end in 1..=n {
            let last = order[end - 1];
            let limit = max_fitting(&runnable.padded_extents(&widths[last]))?;
            ensure!(
                limit >= 1,
                "sample {} (width {}) alone needs more memory than the budget of {} bytes",
                self.first_index + last,
                crate::runnable::extents_string(&widths[last]),
                self.budget
            );
            // Ascending: of equal costs, the fewest batches.
            for start in end.saturating_sub(limit)..end {
                if best[start] == u64::MAX {
                    continue;
                }
                let padded = group(start, end);
                // Wider along another axis than the last sample: it may not fit.
                if start + 1 < end && max_fitting(&padded)? < end - start {
                    continue;
                }
                let cells = (end - start) * padded.iter().product::<usize>();
                let cost = best[start] + self.batch_overhead + cells as u64;
                if cost < best[end] {
                    best[end] = cost;
                    cut[end] = start;
                }
            }
        }
        let mut batches = vec![];
        let mut end = n;
        while end > 0 {
            let start = cut[end];
            let extents = group(start, end);
            let samples = order[start..end].to_vec();
            let peak_memory = runnable.peak_memory(samples.len(), &extents)?;
            batches.push(Batch {
                samples,
                padded: *extents.last().context("no ragged axis")?,
                extents,
                peak_memory,
            });
            end = start;
        }
        batches.reverse();
        Ok(batches)
    }
}

impl RaggedRunnable {
    /// Runs any number of samples, batched as `schedule` says; returns each sample's
    /// outputs in the caller's order. `progress` is told how many samples are done.
    pub fn run_many_with(
        &self,
        samples: &[impl Borrow<Tensor>],
        schedule: &Schedule,
        mut progress: impl FnMut(usize),
    ) -> TractResult<Vec<TVec<Tensor>>> {
        let first = samples.first().context("no sample to run")?.borrow();
        for (ix, sample) in samples.iter().enumerate() {
            let ix = schedule.first_index + ix;
            let like = (schedule.first_index, first);
            self.sample_fact()
                .check_sample(ix, sample.borrow(), Some(like))?;
        }
        let widths: Vec<TVec<usize>> = samples
            .iter()
            .map(|s| self.sample_fact().widths_of(s.borrow()))
            .collect();
        let batches = schedule.plan_axes(self, &widths)?;
        let mut outputs: Vec<Option<TVec<Tensor>>> = vec![None; samples.len()];
        let mut done = 0;
        for batch in &batches {
            self.run_splitting(samples, &batch.samples, schedule.first_index, &mut outputs)?;
            done += batch.samples.len();
            progress(done);
        }
        outputs
            .into_iter()
            .enumerate()
            .map(|(ix, o)| {
                o.with_context(|| format!("sample {} was not answered", schedule.first_index + ix))
            })
            .collect()
    }

    /// Runs any number of samples with the default schedule.
    pub fn run_many(&self, samples: &[impl Borrow<Tensor>]) -> TractResult<Vec<TVec<Tensor>>> {
        self.run_many_with(samples, &Schedule::for_runnable(self), |_| ())
    }

    /// Runs any number of samples, batched as `schedule` says, and answers each on its
    /// own: its outputs, or why it failed. A sample that cannot be run (refused by
    /// [`crate::batch::SampleFact`], alone above the memory budget, of other free dims
    /// than the first good sample) fails alone; a batch that fails is split in halves
    /// down to the samples that fail alone, so that a bad sample takes none of its
    /// batch's with it.
    pub fn run_many_each_with(
        &self,
        samples: &[impl Borrow<Tensor>],
        schedule: &Schedule,
        mut progress: impl FnMut(usize),
    ) -> Vec<TractResult<TVec<Tensor>>> {
        let mut results: Vec<Option<TractResult<TVec<Tensor>>>> =
            (0..samples.len()).map(|_| None).collect();
        let mut first: Option<usize> = None;
        let mut good = vec![];
        for (ix, sample) in samples.iter().enumerate() {
            let sample = sample.borrow();
            let like = first.map(|f| (schedule.first_index + f, samples[f].borrow()));
            let alone = self.check_alone(schedule.first_index + ix, sample, like, schedule.budget);
            match alone {
                Ok(()) => {
                    first.get_or_insert(ix);
                    good.push(ix);
                }
                Err(e) => results[ix] = Some(Err(e)),
            }
        }
        let widths: Vec<TVec<usize>> = good
            .iter()
            .map(|i| self.sample_fact().widths_of(samples[*i].borrow()))
            .collect();
        match schedule.plan_axes(self, &widths) {
            Ok(batches) => {
                let mut done = samples.len() - good.len();
                for batch in &batches {
                    let indices: Vec<usize> = batch.samples.iter().map(|i| good[*i]).collect();
                    self.run_isolating(samples, &indices, &mut results);
                    done += indices.len();
                    progress(done);
                }
            }
            Err(e) => {
                for ix in &good {
                    results[*ix] = Some(Err(anyhow!("{e:#}")));
                }
            }
        }
        results
            .into_iter()
            .enumerate()
            .map(|(ix, r)| {
                r.unwrap_or_else(|| {
                    let ix = schedule.first_index + ix;
                    Err(anyhow!("sample {ix} was not answered"))
                })
            })
            .collect()
    }

    /// Runs the samples at `indices` as one batch; a batch that fails is run as two
    /// halves, down to single samples, which get their own errors.
    fn run_isolating(
        &self,
        samples: &[impl Borrow<Tensor>],
        indices: &[usize],
        results: &mut [Option<TractResult<TVec<Tensor>>>],
    ) {
        let batch: Vec<&Tensor> = indices.iter().map(|i| samples[*i].borrow()).collect();
        match self.run_checked(&batch) {
            Ok((outputs, _)) => {
                for (ix, r) in indices.iter().zip(outputs) {
                    results[*ix] = Some(Ok(r));
                }
            }
            Err(e) if indices.len() == 1 => {
                results[indices[0]] = Some(Err(e).context("Running it in a batch of its own"));
            }
            Err(_) => {
                let (left, right) = indices.split_at(indices.len() / 2);
                self.run_isolating(samples, left, results);
                self.run_isolating(samples, right, results);
            }
        }
    }

    /// Runs the samples at `indices` as one batch, or, out of memory, as two halves.
    fn run_splitting(
        &self,
        samples: &[impl Borrow<Tensor>],
        indices: &[usize],
        first_index: usize,
        outputs: &mut [Option<TVec<Tensor>>],
    ) -> TractResult<()> {
        let batch: Vec<&Tensor> = indices.iter().map(|i| samples[*i].borrow()).collect();
        match self.run_checked(&batch).map(|(results, _)| results) {
            Ok(results) => {
                for (ix, r) in indices.iter().zip(results) {
                    outputs[*ix] = Some(r);
                }
                Ok(())
            }
            Err(e) if self.backend().is_out_of_memory(&e) && indices.len() > 1 => {
                let (left, right) = indices.split_at(indices.len() / 2);
                self.run_splitting(samples, left, first_index, outputs)?;
                self.run_splitting(samples, right, first_index, outputs)
            }
            Err(e) => Err(e).with_context(|| {
                let named: Vec<usize> = indices.iter().take(8).map(|i| first_index + i).collect();
                format!("Running samples {named:?}")
            }),
        }
    }
}
