//! Models of several inputs: what each sample gives for each, checked, stacked and run.
//!
//! A text encoder takes `input_ids`, `attention_mask` and `token_type_ids`, all of the
//! sequence's length; a streaming audio model takes a clip and its state; some models
//! take a sample rate once for all. The transform finds what each input is to a sample
//! from the input facts ([`InputRole`]): ragged along the ragged input's widths, one
//! value per sample, or shared by the batch. A sample then gives one tensor per input
//! that is not shared, in the model's input order, without the batch axis; the shared
//! inputs come once per call, as the model takes them. Every ragged input of a sample
//! must have the ragged input's widths; errors name the sample and the input.
//!
//! [`RaggedRunnable::run_batch_inputs`] runs such samples as one batch,
//! [`RaggedRunnable::run_many_inputs`] any number of them in batches the scheduler cuts
//! by the ragged input's widths, [`RaggedRunnable::run_alone_inputs`] one alone through
//! the original model (the reference). A model whose only input is the ragged one keeps
//! [`RaggedRunnable::run_batch`] and every path built on it.

use crate::error::BadSample;
use std::borrow::Borrow;

use tract_core::internal::*;

use crate::batch::SampleFact;
use crate::runnable::{RaggedRunnable, widths_inputs};
use crate::schedule::lanes::{self, Job, Lending};
use crate::schedule::{Costs, Schedule};
use crate::timeline::{self, Phase};
use crate::transform::InputRole;

/// A sample's tensors, one per input that is not shared, in the model's order.
pub(crate) type Given<'a> = TVec<&'a Tensor>;

/// References to each sample's tensors.
fn given(samples: &[impl AsRef<[Tensor]>]) -> Vec<Given<'_>> {
    samples
        .iter()
        .map(|s| s.as_ref().iter().collect())
        .collect()
}

/// References to the tensors.
fn refs(tensors: &[Tensor]) -> Vec<&Tensor> {
    tensors.iter().collect()
}

/// One of the model's own inputs, as samples give it.
#[derive(Clone, Debug)]
pub struct InputSlot {
    /// The input's name in the model.
    pub name: String,
    /// What it is to a sample: ragged, one value per sample, or shared.
    pub role: InputRole,
    /// What each sample's tensor for it must agree with (batch axis removed); for a
    /// shared input, the model's fact whole.
    pub fact: SampleFact,
}

impl RaggedRunnable {
    /// The model's own inputs (the widths inputs the transform adds left out), in order.
    pub fn input_slots(&self) -> TractResult<Vec<InputSlot>> {
        let ragged = &self.model().ragged;
        ragged
            .roles
            .iter()
            .enumerate()
            .map(|(ix, role)| {
                let outlet = ragged.model.input_outlets()?[ix];
                let name = ragged.model.node(outlet.node).name.clone();
                let fact = ragged.model.outlet_fact(outlet)?;
                // A sample's tensor is the input without its batch axis.
                let batch = match role {
                    InputRole::Ragged(_) => Some(0),
                    InputRole::PerSample { batch } => Some(*batch),
                    InputRole::Shared => None,
                };
                let axes = match role {
                    InputRole::Ragged(axes) => axes.iter().map(|r| r.axis - 1).collect(),
                    _ => tvec!(),
                };
                let alignment = match role {
                    InputRole::Ragged(axes) => axes
                        .iter()
                        .map(|r| ragged.alignment[r.row].clone())
                        .collect(),
                    _ => tvec!(),
                };
                // A ragged axis is free, whatever extent a model typed per shape has there
                // at its probe shape.
                let ragged_axis = |axis: usize| match role {
                    InputRole::Ragged(axes) => axes.iter().any(|r| r.axis == axis),
                    _ => false,
                };
                let fact = SampleFact {
                    datum_type: fact.datum_type,
                    dims: fact
                        .shape
                        .iter()
                        .enumerate()
                        .filter(|(axis, _)| Some(*axis) != batch)
                        .map(|(axis, d)| d.to_usize().ok().filter(|_| !ragged_axis(axis)))
                        .collect(),
                    axes,
                    alignment,
                    largest: self.model().largest,
                };
                Ok(InputSlot {
                    name,
                    role: role.clone(),
                    fact,
                })
            })
            .collect()
    }

    /// The model's own outputs, in the order each sample's outputs come: their names (the
    /// exported model's, else the node's, `node:slot` for a node with several outputs)
    /// and element types.
    pub fn output_slots(&self) -> TractResult<Vec<(String, DatumType)>> {
        let ragged = &self.model().ragged;
        let model = &ragged.model;
        model.outputs[..ragged.outputs.len()]
            .iter()
            .map(|o| {
                let node = model.node(o.node);
                let name = match model.outlet_label(*o) {
                    Some(label) => label.to_string(),
                    None if model.outputs.iter().filter(|p| p.node == o.node).count() == 1 => {
                        node.name.clone()
                    }
                    None => format!("{}:{}", node.name, o.slot),
                };
                Ok((name, model.outlet_fact(*o)?.datum_type))
            })
            .collect()
    }

    /// Fails for a model of several inputs: the single-tensor paths give its only one.
    pub(crate) fn only_input(&self) -> TractResult<()> {
        let roles = &self.model().ragged.roles;
        ensure!(
            roles.len() == 1,
            "the model has {} inputs: give each sample's set of inputs \
             (RaggedRunnable::run_batch_inputs)",
            roles.len()
        );
        Ok(())
    }

    /// Checks `samples` (one tensor per input that is not shared, in the model's order)
    /// and `shared`; returns the position of the ragged input among a sample's tensors.
    fn check_inputs(
        &self,
        slots: &[InputSlot],
        samples: &[Given],
        shared: &[&Tensor],
    ) -> TractResult<usize> {
        self.check_inputs_from(slots, samples, shared, 0)
    }

    /// [`Self::check_inputs`], the samples numbered from `first_index` in errors.
    fn check_inputs_from(
        &self,
        slots: &[InputSlot],
        samples: &[Given],
        shared: &[&Tensor],
        first_index: usize,
    ) -> TractResult<usize> {
        ensure!(!samples.is_empty(), "no sample to run");
        let primary = self.model().ragged.input;
        let given: Vec<&InputSlot> = slots
            .iter()
            .filter(|s| s.role != InputRole::Shared)
            .collect();
        check_shared(slots, shared)?;
        let at = slots[..primary]
            .iter()
            .filter(|s| s.role != InputRole::Shared)
            .count();
        let InputRole::Ragged(primary_axes) = &slots[primary].role else {
            bail!("the ragged input has no ragged axes");
        };
        let first = &samples[0];
        for (ix, sample) in samples.iter().enumerate() {
            let ix = first_index + ix;
            ensure!(
                sample.len() == given.len(),
                BadSample {
                    index: ix,
                    name: None,
                    input: None,
                    reason: format!(
                        "sample {ix} gives {} inputs, the model takes {} per sample ({:?})",
                        sample.len(),
                        given.len(),
                        given.iter().map(|s| &s.name).collect::<Vec<_>>()
                    ),
                }
            );
            for (k, (slot, t)) in given.iter().zip(sample).enumerate() {
                slot.fact
                    .check_sample(ix, t, Some((first_index, first[k])))
                    .map_err(|e| crate::error::in_input(e, &slot.name))?;
                if let InputRole::Ragged(axes) = &slot.role {
                    for r in axes {
                        let width = t.shape()[r.axis - 1];
                        let primary_axis = primary_axes[r.row].axis - 1;
                        let expected = sample[at].shape()[primary_axis];
                        ensure!(
                            width == expected,
                            BadSample {
                                index: ix,
                                name: None,
                                input: Some(slot.name.clone()),
                                reason: format!(
                                    "sample {ix}: input {:?} has extent {width} on axis {}, the \
                                     ragged input {:?} has width {expected} there",
                                    slot.name,
                                    r.axis - 1,
                                    slots[primary].name
                                ),
                            }
                        );
                    }
                }
            }
        }
        Ok(at)
    }

    /// Runs samples of a model of several inputs as one batch: each sample gives one
    /// tensor per input that is not shared, in the model's order, without the batch axis;
    /// `shared` the shared inputs (module doc). For each sample, its outputs, cropped as
    /// [`RaggedRunnable::run_batch`] crops them.
    #[deprecated(note = "use run_batch with Samples")]
    pub fn run_batch_inputs(
        &self,
        samples: &[impl AsRef<[Tensor]>],
        shared: &[Tensor],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.batch_inputs(&given(samples), &refs(shared))
    }

    /// [`Self::run_batch_inputs`] on references.
    pub(crate) fn batch_inputs(
        &self,
        samples: &[Given],
        shared: &[&Tensor],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        let slots = self.input_slots()?;
        let at = self.check_inputs(&slots, samples, shared)?;
        self.run_batch_checked(&slots, at, samples, shared)
    }

    /// [`Self::run_batch_inputs`] on samples checked against `slots` (by
    /// [`Self::run_many_inputs`], once for all its batches), the ragged input their `at`-th
    /// tensor.
    fn run_batch_checked(
        &self,
        slots: &[InputSlot],
        at: usize,
        samples: &[Given],
        shared: &[&Tensor],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        let primaries: Vec<&Tensor> = samples.iter().map(|s| s[at]).collect();
        let (plan, prepared, widths, padded) = self.ragged_plan(&primaries)?;
        let n = samples.len();
        let started = std::time::Instant::now();
        let mut inputs: TVec<TValue> = tvec!();
        let (mut given, mut once) = (0, shared.iter());
        for slot in slots {
            let input = match &slot.role {
                InputRole::Shared => (*once.next().context("a shared input missing")?)
                    .clone()
                    .into_tvalue(),
                role => {
                    let tensors: Vec<&Tensor> = samples.iter().map(|s| s[given]).collect();
                    given += 1;
                    match role {
                        InputRole::Ragged(axes) => {
                            let extents: TVec<usize> = axes.iter().map(|r| padded[r.row]).collect();
                            timeline::phase(Phase::Upload, n, &padded, || {
                                self.backend().upload(&tensors, &slot.fact.axes, &extents)
                            })
                            .with_context(|| format!("Packing input {:?}", slot.name))?
                        }
                        InputRole::PerSample { batch } => stack(&tensors, *batch)
                            .with_context(|| format!("Stacking input {:?}", slot.name))?
                            .into_tvalue(),
                        InputRole::Shared => bail!("a shared input among the given ones"),
                    }
                }
            };
            inputs.push(input);
        }
        inputs.extend(widths_inputs(&widths)?);
        let shape = crate::spec::extents_string(&padded);
        let what = || format!("Running a ragged batch of {n} samples padded to {shape}");
        let outputs = self.run_plan(&*plan, inputs, n, &padded, &what)?;
        let cropped = self.crop_batch(&outputs, n, &padded)?;
        if !prepared {
            self.measured
                .record_batch(n, &padded, started.elapsed().as_secs_f64());
        }
        Ok(cropped)
    }

    /// One sample of a model of several inputs alone through the original model: the
    /// reference [`Self::run_batch_inputs`] is to match.
    #[deprecated(note = "use run_one_by_one with Samples")]
    pub fn run_alone_inputs(
        &self,
        sample: &TVec<Tensor>,
        shared: &[Tensor],
    ) -> TractResult<TVec<Tensor>> {
        self.alone_inputs(&sample.iter().collect(), &refs(shared))
    }

    /// [`Self::run_alone_inputs`] on references.
    pub(crate) fn alone_inputs(
        &self,
        sample: &Given,
        shared: &[&Tensor],
    ) -> TractResult<TVec<Tensor>> {
        let plan = self.alone_inputs_plan(sample, shared)?;
        self.alone_inputs_on(sample, shared, plan)
    }

    /// The plan a sample of several inputs runs on alone ([`Self::alone_plan`] of its ragged
    /// input), the sample checked.
    pub(crate) fn alone_inputs_plan(
        &self,
        sample: &Given,
        shared: &[&Tensor],
    ) -> TractResult<(Arc<dyn Runnable>, TVec<usize>)> {
        let slots = self.input_slots()?;
        let at = self.check_inputs(&slots, std::slice::from_ref(sample), shared)?;
        self.alone_plan(sample[at])
    }

    /// A sample of several inputs alone on its plan ([`Self::alone_inputs_plan`]).
    pub(crate) fn alone_inputs_on(
        &self,
        sample: &Given,
        shared: &[&Tensor],
        (plan, extents): (Arc<dyn Runnable>, TVec<usize>),
    ) -> TractResult<TVec<Tensor>> {
        let slots = self.input_slots()?;
        let mut inputs: TVec<TValue> = tvec!();
        let (mut given, mut once) = (0, shared.iter());
        for slot in &slots {
            let input = match &slot.role {
                InputRole::Shared => (*once.next().context("a shared input missing")?).clone(),
                role => {
                    let batch = match role {
                        InputRole::PerSample { batch } => *batch,
                        _ => 0,
                    };
                    let mut t = sample[given].clone();
                    t.insert_axis(batch)?;
                    given += 1;
                    t
                }
            };
            inputs.push(input.into_tvalue());
        }
        let what = || {
            format!(
                "Running a sample of extents {} alone",
                crate::spec::extents_string(&extents)
            )
        };
        let outputs = self.run_plan(&*plan, inputs, 1, &extents, &what)?;
        self.outputs_alone(outputs, &extents)
    }

    /// Runs any number of samples of a model of several inputs (each as
    /// [`Self::run_batch_inputs`] takes them), cut into batches by the ragged input's
    /// widths as [`RaggedRunnable::run_many`] cuts samples (the default schedule: the
    /// backend's memory budget and batch cap, its lanes; a batch's fixed overhead where
    /// the schedule would measure costs, measured on samples of one input only), answers
    /// in the caller's order. A batch that fails fails the run.
    #[deprecated(note = "use run with Samples")]
    pub fn run_many_inputs(
        &self,
        samples: &[impl AsRef<[Tensor]> + Sync],
        shared: &[Tensor],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        let schedule = Schedule::for_runnable(self);
        self.many_inputs(&given(samples), &refs(shared), &schedule)
    }

    /// [`Self::run_many_inputs`] on references.
    pub(crate) fn many_inputs(
        &self,
        samples: &[Given],
        shared: &[&Tensor],
        schedule: &Schedule,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        let slots = self.input_slots()?;
        let at = self.check_inputs_from(&slots, samples, shared, schedule.first_index)?;
        let all: Vec<usize> = (0..samples.len()).collect();
        let (schedule, jobs) = self.input_jobs(samples, at, &all, schedule)?;
        let mut outputs: Vec<Option<TVec<Tensor>>> = vec![None; samples.len()];
        let mut failure = None;
        lanes::run(
            &jobs,
            schedule.lanes,
            schedule.budget,
            &**self.backend(),
            Lending::Cores,
            |indices| {
                let batch: Vec<Given> = indices.iter().map(|i| samples[*i].clone()).collect();
                self.run_batch_checked(&slots, at, &batch, shared)
            },
            |job, result| {
                match result {
                    Ok(answers) => {
                        for (ix, out) in jobs[job].work.iter().zip(answers) {
                            outputs[*ix] = Some(out);
                        }
                    }
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
                failure.is_none()
            },
        );
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
}

impl RaggedRunnable {
    /// The batches of the samples at `indices` (checked, their ragged input their `at`-th
    /// tensor), cut by the ragged input's widths as the default schedule cuts them (a
    /// batch's fixed overhead where it would measure costs: measuring runs samples of one
    /// input only).
    fn input_jobs(
        &self,
        samples: &[Given],
        at: usize,
        indices: &[usize],
        schedule: &Schedule,
    ) -> TractResult<(Schedule, Vec<Job<Vec<usize>>>)> {
        let mut schedule = schedule.clone();
        if !matches!(schedule.costs, Costs::Measured(_)) {
            schedule.costs = Costs::Fixed;
        }
        // Samples not in `indices` (refused) have no widths the cut reads.
        let widths: Vec<TVec<usize>> = samples
            .iter()
            .map(|s| {
                s.get(at)
                    .map(|t| self.sample_fact().widths_of(t))
                    .unwrap_or_default()
            })
            .collect();
        let jobs = schedule.jobs(self, &widths, indices)?;
        Ok((schedule, jobs))
    }

    /// [`Self::run_many_inputs`], each sample answered on its own: a sample whose inputs are
    /// refused, or that fails (a batch failing is run again in halves, down to the samples
    /// at fault), gets its error, every other sample its outputs. An error of the whole
    /// run only where no sample can run (the shared inputs refused).
    #[deprecated(note = "use run_each with Samples")]
    pub fn run_many_inputs_each(
        &self,
        samples: &[impl AsRef<[Tensor]> + Sync],
        shared: &[Tensor],
    ) -> TractResult<Vec<TractResult<TVec<Tensor>>>> {
        let schedule = Schedule::for_runnable(self);
        self.each_inputs(&given(samples), &refs(shared), &schedule)
    }

    /// [`Self::run_many_inputs_each`] on references.
    pub(crate) fn each_inputs(
        &self,
        samples: &[Given],
        shared: &[&Tensor],
        schedule: &Schedule,
    ) -> TractResult<Vec<TractResult<TVec<Tensor>>>> {
        let slots = self.input_slots()?;
        check_shared(&slots, shared)?;
        let mut results: Vec<Option<TractResult<TVec<Tensor>>>> =
            (0..samples.len()).map(|_| None).collect();
        let mut good = vec![];
        let mut at = 0;
        for (ix, sample) in samples.iter().enumerate() {
            // Each sample checked alone; samples that disagree with each other fail in
            // their batch, then alone.
            let named = schedule.first_index + ix;
            match self.check_inputs_from(&slots, std::slice::from_ref(sample), shared, named) {
                Ok(found) => {
                    at = found;
                    good.push(ix);
                }
                Err(e) => results[ix] = Some(Err(e)),
            }
        }
        let first_index = schedule.first_index;
        let (schedule, jobs) = self.input_jobs(samples, at, &good, schedule)?;
        let run = |indices: &[usize]| -> Vec<(usize, TractResult<TVec<Tensor>>)> {
            let mut answers = vec![];
            self.isolate_inputs(
                &slots,
                at,
                (samples, first_index),
                shared,
                indices,
                &mut answers,
            );
            answers
        };
        lanes::run(
            &jobs,
            schedule.lanes,
            schedule.budget,
            &**self.backend(),
            Lending::Cores,
            |indices| run(indices),
            |_, answers| {
                for (ix, result) in answers {
                    results[ix] = Some(result);
                }
                true
            },
        );
        Ok(results
            .into_iter()
            .enumerate()
            .map(|(ix, r)| {
                r.unwrap_or_else(|| Err(anyhow!("sample {} was not answered", first_index + ix)))
            })
            .collect())
    }

    /// The samples at `indices` as one batch; a batch that fails as two halves, down to
    /// single samples, which get their own errors (naming them from `first_index`).
    fn isolate_inputs(
        &self,
        slots: &[InputSlot],
        at: usize,
        (samples, first_index): (&[Given], usize),
        shared: &[&Tensor],
        indices: &[usize],
        answers: &mut Vec<(usize, TractResult<TVec<Tensor>>)>,
    ) {
        let batch: Vec<Given> = indices.iter().map(|i| samples[*i].clone()).collect();
        match self.run_batch_checked(slots, at, &batch, shared) {
            Ok(outputs) => answers.extend(indices.iter().copied().zip(outputs.into_iter().map(Ok))),
            Err(e) if indices.len() == 1 => {
                let named = first_index + indices[0];
                answers.push((indices[0], Err(e.context(format!("sample {named}")))))
            }
            Err(_) => {
                let (a, b) = indices.split_at(indices.len() / 2);
                self.isolate_inputs(slots, at, (samples, first_index), shared, a, answers);
                self.isolate_inputs(slots, at, (samples, first_index), shared, b, answers);
            }
        }
    }
}

/// Checks the inputs given once against the model's shared inputs.
fn check_shared(slots: &[InputSlot], shared: &[&Tensor]) -> TractResult<()> {
    let shared_slots: Vec<&InputSlot> = slots
        .iter()
        .filter(|s| s.role == InputRole::Shared)
        .collect();
    ensure!(
        shared.len() == shared_slots.len(),
        "{} shared inputs given, the model takes {} ({:?})",
        shared.len(),
        shared_slots.len(),
        shared_slots.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    for (slot, t) in shared_slots.iter().zip(shared) {
        ensure!(
            t.datum_type() == slot.fact.datum_type && t.rank() == slot.fact.dims.len(),
            "shared input {:?}: {:?} of shape {:?}, the model takes {:?} of rank {}",
            slot.name,
            t.datum_type(),
            t.shape(),
            slot.fact.datum_type,
            slot.fact.dims.len()
        );
    }
    Ok(())
}

/// Samples of equal shapes stacked along a new axis `batch`.
fn stack(tensors: &[impl Borrow<Tensor>], batch: usize) -> TractResult<Tensor> {
    let with_batch = tensors
        .iter()
        .map(|t| {
            let mut t = t.borrow().clone();
            t.insert_axis(batch)?;
            Ok(t)
        })
        .collect::<TractResult<Vec<Tensor>>>()?;
    Tensor::stack_tensors(batch, &with_batch)
}
