//! Running samples: the runnable's verbs.
//!
//! - [`RaggedRunnable::run`]: any number of samples, in the batches the scheduler cuts
//!   (sorted by width, of least cost within the memory budget, in lanes); each sample's
//!   outputs in the caller's order. The first sample that fails fails the run.
//! - [`RaggedRunnable::run_each`]: the same, each sample answered on its own: its outputs,
//!   or why it failed; a bad sample takes no other with it.
//! - [`RaggedRunnable::run_batch`]: the samples as one batch, as given (a caller that
//!   batches on its own: a server's queue, a test of one batch's composition).
//! - [`RaggedRunnable::run_one_by_one`]: the reference, each sample alone through the
//!   original model at its own shape.
//! - [`RaggedRunnable::run_packed`]: a batch the caller packed and padded, with its
//!   widths; the transformed model's raw outputs.
//!
//! Each takes [`Samples`]: a model of one input and of several alike. Outputs come without
//! the batch axis, cropped to each sample's widths.

use std::borrow::Borrow;

use tract_core::internal::*;

use crate::RaggedRunnable;
use crate::inputs::{Given, InputSlot};
use crate::samples::Samples;
use crate::schedule::Schedule;
use crate::transform::InputRole;

/// A sample's outputs, or why it failed.
pub type Answer = TractResult<TVec<Tensor>>;

impl RaggedRunnable {
    /// Runs `samples` in the batches the scheduler cuts (module doc); each sample's
    /// outputs, in order. The first sample that fails fails the run, naming it.
    pub fn run<'s>(&self, samples: impl Into<Samples<'s>>) -> TractResult<Vec<TVec<Tensor>>> {
        self.run_scheduled(samples, &Schedule::for_runnable(self))
    }

    /// [`Self::run`] as `schedule` says (its memory budget, batch size, lanes and costs;
    /// [`Schedule::for_runnable`] is the default), its samples numbered from
    /// `schedule.first_index` in errors.
    pub fn run_scheduled<'s>(
        &self,
        samples: impl Into<Samples<'s>>,
        schedule: &Schedule,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        let samples = samples.into();
        if samples.is_empty() {
            return Ok(vec![]);
        }
        self.begin_run();
        self.by_inputs(
            &samples,
            |tensors| self.scheduled(tensors, schedule, |_| ()),
            |given, shared| self.many_inputs(given, shared, schedule),
        )
    }

    /// Runs `samples` as [`Self::run`] does, each answered on its own: its outputs, or why
    /// it failed (a sample that does not fit the model; a batch that fails is run again in
    /// halves, down to the samples at fault). The run fails as a whole only where no
    /// sample can run (the shared inputs refused).
    pub fn run_each<'s>(&self, samples: impl Into<Samples<'s>>) -> TractResult<Vec<Answer>> {
        self.run_each_scheduled(samples, &Schedule::for_runnable(self))
    }

    /// [`Self::run_each`] as `schedule` says ([`Self::run_scheduled`]).
    pub fn run_each_scheduled<'s>(
        &self,
        samples: impl Into<Samples<'s>>,
        schedule: &Schedule,
    ) -> TractResult<Vec<Answer>> {
        let samples = samples.into();
        if samples.is_empty() {
            return Ok(vec![]);
        }
        self.begin_run();
        let slots = self.input_slots()?;
        let (given, shared) = samples.resolve(&slots)?;
        // A sample whose inputs cannot be told apart runs as an empty set of tensors,
        // which every path refuses before it batches anything; its answer is then why.
        let mut unresolved: Vec<Option<TractError>> = vec![];
        let given: Vec<Given> = given
            .into_iter()
            .map(|g| match g {
                Ok(g) => {
                    unresolved.push(None);
                    g
                }
                Err(e) => {
                    unresolved.push(Some(e));
                    tvec!()
                }
            })
            .collect();
        let answers = match one_tensor(&slots) {
            true => {
                let empty = Tensor::default();
                let tensors: Vec<&Tensor> = given
                    .iter()
                    .map(|g| g.first().copied().unwrap_or(&empty))
                    .collect();
                self.scheduled_each(&tensors, schedule, |_| ())
            }
            false => self.each_inputs(&given, &shared, schedule)?,
        };
        Ok(answers
            .into_iter()
            .zip(unresolved)
            .map(|(answer, unresolved)| match unresolved {
                Some(e) => Err(e),
                None => answer,
            })
            .collect())
    }

    /// Runs `samples` as one batch, as given; each sample's outputs, in order.
    pub fn run_batch<'s>(&self, samples: impl Into<Samples<'s>>) -> TractResult<Vec<TVec<Tensor>>> {
        self.begin_run();
        self.by_inputs(
            &samples.into(),
            |tensors| Ok(self.run_batch_with_info(tensors)?.0),
            |given, shared| self.batch_inputs(given, shared),
        )
    }

    /// The reference: each sample alone through the original model (a batch of one, its
    /// own widths, no padding); each sample's outputs, in order.
    pub fn run_one_by_one<'s>(
        &self,
        samples: impl Into<Samples<'s>>,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.begin_run();
        self.by_inputs(
            &samples.into(),
            |tensors| self.one_by_one(tensors),
            |given, shared| {
                let helpers = self.plan_helpers();
                crate::runnable::ahead::in_order(
                    given.len(),
                    helpers,
                    2 * helpers,
                    |ix| self.preparing(|| self.alone_inputs_plan(&given[ix], shared)),
                    |ix, plan| {
                        plan.and_then(|plan| self.alone_inputs_on(&given[ix], shared, plan))
                            .with_context(|| alone(ix, given.len()))
                    },
                )
            },
        )
    }

    /// `samples` resolved against the model's inputs (the first sample that cannot give
    /// them fails the call) and run by `one` where a sample is one tensor (the model's
    /// only input is the ragged one), by `several` (each sample's tensors, the shared
    /// ones) otherwise.
    fn by_inputs<R>(
        &self,
        samples: &Samples,
        one: impl FnOnce(&[&Tensor]) -> TractResult<R>,
        several: impl FnOnce(&[Given], &[&Tensor]) -> TractResult<R>,
    ) -> TractResult<R> {
        let slots = self.input_slots()?;
        let (given, shared) = samples.resolve(&slots)?;
        let given = given.into_iter().collect::<TractResult<Vec<Given>>>()?;
        match one_tensor(&slots) {
            true => one(&only_tensors(&given)),
            false => several(&given, &shared),
        }
    }

    /// Runs a batch the caller packed: `batch` holds the samples along axis 0, padded
    /// along the ragged axes, `widths` the samples' widths along each ragged axis (one
    /// list per axis, one width per sample). Returns the transformed model's raw outputs:
    /// the model's own (padded, the padded region zero), then the widths outputs. For a
    /// model whose only input is the ragged one.
    pub fn run_packed(&self, batch: Tensor, widths: &[&[i64]]) -> TractResult<TVec<TValue>> {
        self.begin_run();
        self.packed(batch, widths)
    }

    /// [`Self::run_one_by_one`] for a model of one input.
    pub(crate) fn one_by_one(
        &self,
        samples: &[impl Borrow<Tensor> + Sync],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.sample_fact().check(samples)?;
        self.check_widths_of(samples)?;
        self.only_input()?;
        let helpers = self.plan_helpers();
        crate::runnable::ahead::in_order(
            samples.len(),
            helpers,
            2 * helpers,
            |ix| self.preparing(|| self.alone_plan(samples[ix].borrow())),
            |ix, plan| {
                let sample = samples[ix].borrow();
                plan.and_then(|plan| self.run_alone(sample, plan))
                    .with_context(|| alone(ix, samples.len()))
            },
        )
    }
}

impl RaggedRunnable {
    /// The threads one by one prepares the next samples' plans on while it runs the
    /// current one (`crate::runnable::ahead`): as many as `TRACT_RAGGED_PLAN_HELPERS`
    /// asks, else as the backend allows.
    fn plan_helpers(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        crate::knobs::plan_helpers().unwrap_or_else(|| self.backend().plan_helpers(cores))
    }

    /// `prepare` run as the backend prepares plans ([`crate::backend::Backend::preparing`]).
    fn preparing<P>(&self, prepare: impl FnOnce() -> TractResult<P>) -> TractResult<P> {
        let (mut prepare, mut plan) = (Some(prepare), None);
        self.backend()
            .preparing(&mut || plan = prepare.take().map(|prepare| prepare()));
        plan.context("The backend did not run the plan's preparation")?
    }
}

/// What a run of sample `ix` of `n` alone is, in an error: the caller knows which sample
/// it gave where it gave one.
fn alone(ix: usize, n: usize) -> String {
    match n {
        1 => "Running the sample alone".into(),
        _ => format!("Running sample {ix} alone"),
    }
}

/// Each sample's only tensor, for a model of one input ([`one_tensor`]).
fn only_tensors<'a>(given: &[Given<'a>]) -> Vec<&'a Tensor> {
    given.iter().map(|g| g[0]).collect()
}

/// Whether a sample gives the model one tensor: its only input is the ragged one.
fn one_tensor(slots: &[InputSlot]) -> bool {
    matches!(slots, [slot] if matches!(slot.role, InputRole::Ragged(_)))
}
