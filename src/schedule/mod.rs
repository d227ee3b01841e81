//! Running many samples: batches sized by memory, shaped by a cost model, answers in the
//! caller's order.
//!
//! A page or a corpus brings thousands of lines. The scheduler sorts them by width, so
//! that a batch holds lines of similar widths and little padding, then cuts the sorted
//! sequence into batches:
//!
//! - a batch must fit the **memory budget**: the peak memory of its plan, from the model's
//!   symbolic shapes evaluated at the batch size and padded width
//!   (`crate::memory::MemoryWalk`), stays under the budget (by default the backend's:
//!   80% of the device's free memory, or of the host's available memory);
//! - among the cuts that fit, the one of least **cost**: a batch costs its padded area
//!   (samples times padded width) times what a cell costs at its batch size, measured on
//!   the model and the machine where the backend asks for it (`cost`), or a fixed
//!   overhead (its launches, its plan) plus its padded area. Widths sorted, the best cut is
//!   found exactly by dynamic programming over contiguous groups. This prefers more,
//!   narrower batches to one wide one exactly when the padding saved is worth more than a
//!   batch's overhead;
//! - the batches run in **lanes** (`schedule::lanes`): as many at once as the backend runs
//!   concurrently (the host: one per core), the costliest first; a batch of several
//!   samples fits the budget shared by the lanes, a single sample the whole budget.
//!
//! A batch that runs out of memory anyway (as its backend tells,
//! [`crate::backend::Backend::is_out_of_memory`]) is split in halves and retried, down to
//! single samples; a sample that fails alone is an error naming it. Every sample is
//! answered, or the error says which was not.
//!
//! [`RaggedRunnable::run_many_each_with`] answers each sample on its own instead: a sample
//! that is refused, or that fails (a batch failing otherwise than by memory is split
//! down to the samples at fault), gets its error, and every other sample its outputs.

use crate::error::OutOfMemory;
use std::borrow::Borrow;

use tract_core::internal::*;

use crate::runnable::{HeldPlans, RaggedRunnable, Renting, Shape};
use crate::timeline::{self, Phase};
use measured::Measurements;

pub(crate) mod cost;
pub(crate) mod fit;
pub(crate) mod lanes;
pub(crate) mod measured;

pub use cost::CellCosts;
use lanes::{Job, Lending};

/// What a batch costs, for the cut of least cost.
#[derive(Clone, Debug, PartialEq)]
pub enum Costs {
    /// [`Schedule::batch_overhead`] plus its padded cells.
    Fixed,
    /// Measured on the runnable's first run (`cost`), then kept by the runnable.
    Measure,
    /// Its padded cells times the measured cost per cell at its size.
    Measured(CellCosts),
}

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
    /// How many batches run at once.
    pub lanes: usize,
    /// What a batch costs.
    pub costs: Costs,
    /// What a batch whose ragged plan the runnable does not hold adds to the cut's cost, in
    /// the cut's units (cells with [`Costs::Fixed`], seconds with measured costs); 0 leaves
    /// plans out of the cut. [`Schedule::counting_new_plans`] sets it from what the runnable's
    /// latest new plans took.
    pub new_plan: f64,
    /// Told every cut the schedule makes for a run, before its batches run.
    pub on_cut: Option<OnCut>,
}

/// What a run's cut is told to ([`Schedule::on_cut`]): its batches, and the widths their
/// samples' indices point into (per sample, one per ragged axis). For a caller's own
/// account of the batches (the server's batch sizes and padding), from the cut that runs
/// rather than from a second cut of its own.
#[derive(Clone)]
pub struct OnCut(pub Arc<CutTold>);

/// What [`OnCut`] calls: the batches, and the widths their indices point into.
pub type CutTold = dyn Fn(&[Batch], &[TVec<usize>]) + Send + Sync;

impl std::fmt::Debug for OnCut {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("OnCut")
    }
}

/// One batch of the plan: the samples (indices in the caller's order) and the padded
/// extents they run at.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Its samples, by their indices among the widths the plan was cut from.
    pub samples: Vec<usize>,
    /// The padded extent of the last ragged axis (a line's width).
    pub padded: usize,
    /// The padded extent of each ragged axis.
    pub extents: TVec<usize>,
    /// What it needs in memory at its padded extents, in bytes.
    pub peak_memory: u64,
    /// Its cost in the model that cut it: the costliest run first.
    pub cost: f64,
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
    /// The default schedule for a runnable: its backend's cost model, the memory budget,
    /// lanes and batch size its knobs ask for (the backend's where they ask for none) ([`crate::knobs`], in the runnable's
    /// knob scope).
    pub fn for_runnable(runnable: &RaggedRunnable) -> Schedule {
        runnable.in_knob_scope(|| Self::for_runnable_here(runnable))
    }

    fn for_runnable_here(runnable: &RaggedRunnable) -> Schedule {
        let backend = runnable.backend();
        let cost = backend.cost_model();
        Schedule {
            budget: crate::knobs::memory().unwrap_or_else(|| backend.memory_budget()),
            max_batch: crate::knobs::max_batch().or(cost.max_batch),
            batch_overhead: match cost.fitted {
                true => runnable
                    .fitted_overhead()
                    .map_or(cost.batch_overhead, |(cells, _)| cells),
                false => cost.batch_overhead,
            },
            first_index: 0,
            lanes: backend.lanes(),
            costs: match (cost.measured, runnable.measured_costs()) {
                (false, _) => Costs::Fixed,
                (true, Some(costs)) => Costs::Measured(costs),
                (true, None) => Costs::Measure,
            },
            new_plan: 0.0,
            on_cut: None,
        }
    }

    /// This schedule with [`Schedule::new_plan`] set from what the runnable's latest
    /// batches on a new plan took beyond their run (preparing the plan, and on a device
    /// choosing kernels and capturing a graph at its first run), converted to the cut's
    /// units: for runs of a few samples that come often (the server's gatherings), where
    /// each new batch size or width bucket would prepare a plan costing more than the
    /// batch's run, and a batch a little wider or cut in two on plans held costs less.
    /// Unchanged until the runnable has prepared a plan and can price a cell. On the host
    /// too (measured costs): a plan there costs about one line's run (PP-OCRv4 rec on 2
    /// cores), and gatherings of a few clients then many, each cutting into
    /// other batch sizes, otherwise met more shapes than the cache keeps (90 plans
    /// prepared over loads of 1, 4, 16 and 64 clients, 31 priced).
    /// A runnable running every batch shape on one plan (`TRACT_RAGGED_SYMBOLIC_PLANS` on
    /// ragged-cuda) prices none.
    pub fn counting_new_plans(mut self, runnable: &RaggedRunnable) -> Schedule {
        self.new_plan = match runnable.plans_every_shape() {
            true => 0.0,
            false => self.new_plan_cost(&runnable.measured),
        };
        self
    }

    /// What a new plan costs in this schedule's units, from `measured`
    /// ([`Schedule::counting_new_plans`]).
    fn new_plan_cost(&self, measured: &Measurements) -> f64 {
        let fit = measured.batch_fit().filter(|(_, per_cell)| *per_cell > 0.0);
        match &self.costs {
            Costs::Measure => 0.0,
            // The cut's unit is then the second.
            Costs::Measured(c) => measured
                .new_plan_seconds(|n, cells| c.per_cell(n).map(|p| p * cells as f64))
                .unwrap_or(0.0),
            Costs::Fixed => fit
                .and_then(|(fixed, per_cell)| {
                    let seconds = measured
                        .new_plan_seconds(|_, cells| Some(fixed + per_cell * cells as f64))?;
                    Some(seconds / per_cell)
                })
                .unwrap_or(0.0),
        }
    }

    /// The batches of the samples at `indices` of `widths` (per sample, per ragged axis),
    /// as the lanes take them: sorted by width, cut at least cost, the costliest first,
    /// each with the caller's indices of its samples.
    pub(crate) fn jobs(
        &self,
        runnable: &RaggedRunnable,
        widths: &[TVec<usize>],
        indices: &[usize],
    ) -> TractResult<Vec<Job<Vec<usize>>>> {
        let mut sorted: Vec<usize> = indices.to_vec();
        sorted.sort_by(|a, b| widths[*a].cmp(&widths[*b]));
        let subset: Vec<TVec<usize>> = sorted.iter().map(|i| widths[*i].clone()).collect();
        let mut batches = timeline::phase(Phase::Schedule, subset.len(), &[], || {
            self.plan_axes(runnable, &subset)
        })?;
        if let Some(OnCut(told)) = &self.on_cut {
            told(&batches, &subset);
        }
        batches.sort_by(|a, b| b.cost.total_cmp(&a.cost));
        Ok(batches
            .into_iter()
            .map(|b| Job {
                work: b.samples.iter().map(|i| sorted[*i]).collect(),
                peak_memory: b.peak_memory,
                cost: b.cost,
            })
            .collect())
    }

    /// A schedule of fixed costs, on one lane: `budget`, batches of at most
    /// `max_batch`, each costing `batch_overhead` cells more than its padded cells.
    pub fn fixed(budget: u64, max_batch: Option<usize>, batch_overhead: u64) -> Schedule {
        Schedule {
            budget,
            max_batch,
            batch_overhead,
            first_index: 0,
            lanes: 1,
            costs: Costs::Fixed,
            new_plan: 0.0,
            on_cut: None,
        }
    }

    /// The largest batch the costs allow, and the cost of a batch of `n` samples over
    /// `cells` padded cells.
    fn largest(&self) -> Option<usize> {
        match &self.costs {
            Costs::Measured(c) => Some(self.max_batch.map_or(c.largest(), |m| m.min(c.largest()))),
            _ => self.max_batch,
        }
    }

    fn batch_cost(&self, n: usize, cells: u64) -> f64 {
        match &self.costs {
            Costs::Measured(c) => c.per_cell(n).unwrap_or(f64::INFINITY) * cells as f64,
            _ => (self.batch_overhead + cells) as f64,
        }
    }

    /// The bytes a batch of `n` may take: a share of the budget for each lane, the whole
    /// budget for a sample alone (which then waits for room, [`lanes::MemoryGate`]).
    fn batch_budget(&self, n: usize) -> u64 {
        if n <= 1 {
            self.budget
        } else {
            self.budget / self.lanes.max(1) as u64
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
            let cap = self.largest().unwrap_or(n).min(n).max(1);
            let (mut lo, mut hi) = (0usize, cap);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if runnable.peak_memory(mid, padded)? <= self.batch_budget(mid) {
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
        // Where a new plan is priced (`new_plan`), a batch of a shape the runnable holds
        // no plan for costs that much more. Counted once per shape, not per batch: a first
        // cut, then the cut again with the shapes the first one prepares taken as held.
        let mut held = match self.new_plan > 0.0 {
            true => runnable.held_plans(),
            false => HeldPlans::default(),
        };
        let passes = if self.new_plan > 0.0 { 2 } else { 1 };
        let mut cut = vec![0usize; n + 1];
        for pass in 0..passes {
            if pass > 0 {
                let mut end = n;
                let mut new = vec![];
                while end > 0 {
                    let start = cut[end];
                    let shape = (end - start, group(start, end));
                    if self.runs_as(runnable, &held, shape.clone()).1 > 0.0 {
                        new.push(shape);
                    }
                    end = start;
                }
                new.into_iter().for_each(|shape| held.insert(shape));
            }
            self.cut(runnable, widths, &order, &held, &mut max_fitting, &mut cut)?;
        }
        let mut batches = vec![];
        let mut end = n;
        while end > 0 {
            let start = cut[end];
            let extents = group(start, end);
            let samples = order[start..end].to_vec();
            // A batch run on a larger plan takes that plan's memory and time.
            let (runs, _) = self.runs_as(runnable, &held, (samples.len(), extents.clone()));
            let peak_memory = runnable.peak_memory(runs.0, &runs.1)?;
            let cells = runs.0 * runs.1.iter().product::<usize>();
            batches.push(Batch {
                cost: self.batch_cost(runs.0, cells as u64),
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

    /// Where new plans are priced, the shape a batch of `shape` runs at (its own, or a
    /// larger plan's held that it may rent, [`RaggedRunnable::rent`]) and the price of the
    /// new plan it needs (0 where it needs none).
    fn runs_as(&self, runnable: &RaggedRunnable, held: &HeldPlans, shape: Shape) -> (Shape, f64) {
        if self.new_plan <= 0.0 || held.contains(&shape) {
            return (shape, 0.0);
        }
        if runnable.can_rent() {
            let renting = self.renting(shape.0);
            let fits = |s: &Shape| runnable.fits(s, renting.budget);
            if let Some((larger, _)) = held.rentable(&shape, &renting, fits) {
                return (larger, 0.0);
            }
        }
        (shape, self.new_plan)
    }

    /// What a batch of `n` samples may rent: a larger plan whose extra cells cost less than
    /// a new plan, within the batch's memory.
    pub(crate) fn renting(&self, n: usize) -> Renting {
        Renting {
            new_plan: self.new_plan,
            budget: self.batch_budget(n),
        }
    }

    /// The cut of least cost of the samples of `widths` in `order` (sorted): `cut[end]` is
    /// where the batch ending at `end` starts. `held`: the shapes (batch size, padded
    /// extents) whose plans cost nothing new.
    fn cut(
        &self,
        runnable: &RaggedRunnable,
        widths: &[TVec<usize>],
        order: &[usize],
        held: &HeldPlans,
        max_fitting: &mut impl FnMut(&TVec<usize>) -> TractResult<usize>,
        cut: &mut [usize],
    ) -> TractResult<()> {
        // best[i]: least cost of the first i sorted samples; cut[i]: where their last
        // batch starts.
        let n = order.len();
        let mut best = vec![f64::INFINITY; n + 1];
        best[0] = 0.0;
        for end in 1..=n {
            let last = order[end - 1];
            let limit = max_fitting(&runnable.padded_extents(&widths[last]))?;
            ensure!(
                limit >= 1,
                OutOfMemory {
                    what: format!(
                        "sample {} (width {}) alone needs more memory than the budget of {} \
                             bytes",
                        self.first_index + last,
                        crate::runnable::extents_string(&widths[last]),
                        self.budget
                    ),
                }
            );
            // The group start..end grows to the left: its maxima only widen, and its
            // padded extents (and what fits at them) change only then. So each end costs
            // its `limit` starts, not their lengths too (256 samples in batches of up to
            // 256 took 9 ms with the maxima taken anew for each start).
            let mut maxima = widths[last].clone();
            let mut padded = runnable.padded_extents(&maxima);
            let mut fitting = limit;
            for start in (end.saturating_sub(limit)..end).rev() {
                let sample = &widths[order[start]];
                if sample.iter().zip(&maxima).any(|(w, m)| w > m) {
                    maxima
                        .iter_mut()
                        .zip(sample)
                        .for_each(|(m, w)| *m = (*m).max(*w));
                    padded = runnable.padded_extents(&maxima);
                    // Wider along another axis than the last sample: it may not fit.
                    fitting = max_fitting(&padded)?;
                }
                if best[start].is_infinite() || fitting < end - start {
                    continue;
                }
                let ((n, extents), new_plan) =
                    self.runs_as(runnable, held, (end - start, padded.clone()));
                let cells = n * extents.iter().product::<usize>();
                let cost = best[start] + self.batch_cost(n, cells as u64) + new_plan;
                // Of equal costs, the fewest batches: the smallest start, seen last.
                if cost.is_finite() && cost <= best[end] {
                    best[end] = cost;
                    cut[end] = start;
                }
            }
        }
        Ok(())
    }
}

/// Runs the batches of a schedule: what measuring probes with, and what the lanes run.
struct Runner<'a, S> {
    runnable: &'a RaggedRunnable,
    samples: &'a [S],
    widths: &'a [TVec<usize>],
    first_index: usize,
    /// Whether a batch that fails is split down to the samples at fault, each answered
    /// with its own error ([`RaggedRunnable::run_many_each_with`]), rather than failing
    /// the run.
    isolate: bool,
    /// The schedule, for what a batch may rent ([`Schedule::renting`]).
    schedule: &'a Schedule,
}

/// Each sample's answer in a batch; an error of the whole batch where the run fails whole.
type Answers = TractResult<Vec<(usize, TractResult<TVec<Tensor>>)>>;

impl<S: Borrow<Tensor> + Sync> Runner<'_, S> {
    fn batch(&self, indices: &[usize]) -> Vec<&Tensor> {
        indices.iter().map(|i| self.samples[*i].borrow()).collect()
    }

    fn extents(&self, indices: &[usize]) -> TVec<usize> {
        let axes = self.widths.first().map_or(0, |w| w.len());
        let maxima: Vec<usize> = (0..axes)
            .map(|a| {
                indices
                    .iter()
                    .map(|i| self.widths[*i][a])
                    .max()
                    .unwrap_or(1)
            })
            .collect();
        self.runnable.padded_extents(&maxima)
    }

    fn answer(&self, indices: &[usize]) -> Answers {
        let renting = self.schedule.renting(indices.len());
        if self.isolate {
            let mut answers = vec![];
            self.runnable
                .run_isolating(self.samples, indices, &renting, &mut answers);
            Ok(answers)
        } else {
            let answers =
                self.runnable
                    .run_splitting(self.samples, indices, &renting, self.first_index)?;
            Ok(answers.into_iter().map(|(i, o)| (i, Ok(o))).collect())
        }
    }
}

impl<S: Borrow<Tensor> + Sync> cost::Prober for Runner<'_, S> {
    type Answer = Answers;

    fn size(&self, indices: &[usize]) -> TractResult<(u64, u64)> {
        let extents = self.extents(indices);
        let cells = indices.len() * extents.iter().product::<usize>();
        let peak = self.runnable.peak_memory(indices.len(), &extents)?;
        Ok((cells as u64, peak))
    }

    fn prepare(&self, indices: &[usize]) -> TractResult<()> {
        self.runnable.prepare_batch(&self.batch(indices))
    }

    fn run(&self, indices: &[usize]) -> (bool, Answers) {
        let answers = self.answer(indices);
        let ok = answers
            .as_ref()
            .is_ok_and(|a| a.iter().all(|(_, r)| r.is_ok()));
        (ok, answers)
    }
}

impl RaggedRunnable {
    /// Runs any number of samples, batched as `schedule` says; returns each sample's
    /// outputs in the caller's order. `progress` is told how many samples are done.
    #[deprecated(note = "use run_scheduled")]
    pub fn run_many_with(
        &self,
        samples: &[impl Borrow<Tensor> + Sync],
        schedule: &Schedule,
        progress: impl FnMut(usize),
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.scheduled(samples, schedule, progress)
    }

    /// Runs samples of one tensor each as `schedule` says ([`Self::run_scheduled`]);
    /// `progress` is told how many samples are done.
    pub(crate) fn scheduled(
        &self,
        samples: &[impl Borrow<Tensor> + Sync],
        schedule: &Schedule,
        mut progress: impl FnMut(usize),
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.sample_fact()
            .check_from(schedule.first_index, samples)?;
        let all: Vec<usize> = (0..samples.len()).collect();
        let mut outputs: Vec<Option<TVec<Tensor>>> = vec![None; samples.len()];
        let mut failure = None;
        let mut done = 0;
        self.cut_and_run(samples, &all, schedule, false, |answers| {
            match answers {
                Ok(answers) => {
                    done += answers.len();
                    for (ix, r) in answers {
                        match r {
                            Ok(o) => outputs[ix] = Some(o),
                            Err(e) => {
                                failure.get_or_insert(e);
                            }
                        }
                    }
                    progress(done);
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
            failure.is_none()
        })?;
        if let Some(e) = failure {
            return Err(e);
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
    #[deprecated(note = "use run")]
    pub fn run_many(
        &self,
        samples: &[impl Borrow<Tensor> + Sync],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.scheduled(samples, &Schedule::for_runnable(self), |_| ())
    }

    /// Runs any number of samples, batched as `schedule` says, and answers each on its
    /// own: its outputs, or why it failed. A sample that cannot be run (refused by
    /// [`crate::batch::SampleFact`], alone above the memory budget, of other free dims
    /// than the first good sample) fails alone; a batch that fails is split in halves
    /// down to the samples that fail alone, so that a bad sample takes none of its
    /// batch's with it.
    #[deprecated(note = "use run_each_scheduled")]
    pub fn run_many_each_with(
        &self,
        samples: &[impl Borrow<Tensor> + Sync],
        schedule: &Schedule,
        progress: impl FnMut(usize),
    ) -> Vec<TractResult<TVec<Tensor>>> {
        self.scheduled_each(samples, schedule, progress)
    }

    /// Runs samples of one tensor each as `schedule` says, each answered on its own
    /// ([`Self::run_each_scheduled`]).
    pub(crate) fn scheduled_each(
        &self,
        samples: &[impl Borrow<Tensor> + Sync],
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
        let mut done = samples.len() - good.len();
        let run = self.cut_and_run(samples, &good, schedule, true, |answers| {
            if let Ok(answers) = answers {
                done += answers.len();
                for (ix, r) in answers {
                    results[ix] = Some(r);
                }
                progress(done);
            }
            true
        });
        if let Err(e) = run {
            for ix in &good {
                results[*ix].get_or_insert_with(|| Err(crate::error::copy(&e)));
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

    /// Runs the samples at `indices` as `schedule` says: its costs measured first where
    /// they are to be, then the cut of least cost, in lanes. `answered` gets each batch's
    /// answers as it finishes, and returns false to stop the run.
    fn cut_and_run<S: Borrow<Tensor> + Sync>(
        &self,
        samples: &[S],
        indices: &[usize],
        schedule: &Schedule,
        isolate: bool,
        mut answered: impl FnMut(Answers) -> bool,
    ) -> TractResult<()> {
        // Only the samples to run are known to have the model's rank.
        let mut widths: Vec<TVec<usize>> = vec![tvec!(); samples.len()];
        for ix in indices {
            widths[*ix] = self.sample_fact().widths_of(samples[*ix].borrow());
        }
        let runner = Runner {
            runnable: self,
            samples,
            widths: &widths,
            first_index: schedule.first_index,
            isolate,
            schedule,
        };
        let mut remaining: Vec<usize> = indices.to_vec();
        remaining.sort_by(|a, b| widths[*a].cmp(&widths[*b]));
        let mut schedule = schedule.clone();
        if schedule.costs == Costs::Measure {
            match self.measured_costs() {
                Some(costs) => schedule.costs = Costs::Measured(costs),
                None if remaining.len() >= 2 => {
                    // The schedule's cap (the backend's, or the caller's) bounds the probes.
                    let largest = schedule.max_batch.unwrap_or(samples.len());
                    let measured = cost::measure(
                        &runner,
                        &remaining,
                        schedule.lanes,
                        largest,
                        schedule.budget,
                        &**self.backend(),
                    )?;
                    let mut go_on = true;
                    for (batch, answers) in measured.answered {
                        remaining.retain(|i| !batch.contains(i));
                        go_on = go_on && answered(answers);
                    }
                    if !go_on {
                        return Ok(());
                    }
                    self.measured.keep_costs(&measured.costs);
                    schedule.costs = Costs::Measured(measured.costs);
                }
                // One sample: nothing to batch, it runs as a batch of one.
                None => {
                    schedule.costs = Costs::Measured(CellCosts {
                        points: vec![(1, 1.0)],
                    })
                }
            }
        }
        if remaining.is_empty() {
            return Ok(());
        }
        let jobs = schedule.jobs(self, &widths, &remaining)?;
        lanes::run(
            &jobs,
            schedule.lanes,
            schedule.budget,
            &**self.backend(),
            Lending::Cores,
            |indices| runner.answer(indices),
            |_, answers| answered(answers),
        );
        Ok(())
    }

    /// Answers the samples at `indices` as one batch; a batch that fails is run as two
    /// halves, down to single samples, which get their own errors.
    fn run_isolating(
        &self,
        samples: &[impl Borrow<Tensor>],
        indices: &[usize],
        renting: &Renting,
        answers: &mut Vec<(usize, TractResult<TVec<Tensor>>)>,
    ) {
        let batch: Vec<&Tensor> = indices.iter().map(|i| samples[*i].borrow()).collect();
        match self.run_checked(&batch, Some(renting)) {
            Ok((outputs, _)) => {
                for (ix, r) in indices.iter().zip(outputs) {
                    answers.push((*ix, Ok(r)));
                }
            }
            Err(e) if indices.len() == 1 => {
                answers.push((
                    indices[0],
                    Err(e).context("Running it in a batch of its own"),
                ));
            }
            Err(_) => {
                let (left, right) = indices.split_at(indices.len() / 2);
                self.run_isolating(samples, left, renting, answers);
                self.run_isolating(samples, right, renting, answers);
            }
        }
    }

    /// Runs the samples at `indices` as one batch, or, out of memory, as two halves.
    fn run_splitting(
        &self,
        samples: &[impl Borrow<Tensor>],
        indices: &[usize],
        renting: &Renting,
        first_index: usize,
    ) -> TractResult<Vec<(usize, TVec<Tensor>)>> {
        let batch: Vec<&Tensor> = indices.iter().map(|i| samples[*i].borrow()).collect();
        match self
            .run_checked(&batch, Some(renting))
            .map(|(results, _)| results)
        {
            Ok(results) => Ok(indices.iter().copied().zip(results).collect()),
            Err(e) if self.backend().is_out_of_memory(&e) && indices.len() > 1 => {
                // Halves rent nothing: out of memory already.
                let none = Renting {
                    new_plan: 0.0,
                    ..*renting
                };
                let (left, right) = indices.split_at(indices.len() / 2);
                let mut answers = self.run_splitting(samples, left, &none, first_index)?;
                answers.extend(self.run_splitting(samples, right, &none, first_index)?);
                Ok(answers)
            }
            Err(e) => Err(e).with_context(|| {
                let named: Vec<usize> = indices.iter().take(8).map(|i| first_index + i).collect();
                format!("Running samples {named:?}")
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On fixed costs a new plan costs, in cells, its seconds beyond the fitted batch over
    /// the fitted seconds a cell: nothing before a fit and a new plan. On measured costs
    /// (the host), its seconds beyond the measured cost of its cells.
    #[test]
    fn a_new_plan_is_priced_in_the_cuts_units() {
        let fixed = Schedule::fixed(1 << 30, None, 64);
        let measured = Measurements::default();
        assert_eq!(fixed.new_plan_cost(&measured), 0.0);
        // Batches of 1 ms fixed and 100 ns a cell.
        for cells in [10_000usize, 80_000, 20_000, 40_000] {
            measured.record_batch(1, &[cells], 1e-3 + 1e-7 * cells as f64);
        }
        assert_eq!(fixed.new_plan_cost(&measured), 0.0);
        // Prepared in 50 ms, then a first run of 13 ms where 2 ms were predicted: 61 ms,
        // 610000 cells.
        measured.record_new_plan(1, &[10_000], 0.050, 0.013);
        assert!((fixed.new_plan_cost(&measured) - 610_000.0).abs() < 1.0);
        let host = Schedule {
            costs: Costs::Measured(CellCosts {
                points: vec![(1, 1e-7)],
            }),
            ..fixed
        };
        // On measured costs, in seconds: 50 ms, and 12 ms of the first run beyond the 1 ms
        // its 10000 cells cost at 100 ns.
        assert!((host.new_plan_cost(&measured) - 0.062).abs() < 1e-9);
    }
}
