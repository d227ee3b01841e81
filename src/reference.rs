//! The reference: a model run on each sample alone, as plain tract runs it.
//!
//! Every ragged result is checked against what the sample gives alone, so the reference
//! must not depend on what it checks: a [`Reference`] never runs the ragged transform,
//! nor types the model symbolically. Each sample's inputs are typed at their own concrete
//! shapes (a batch of one), the model optimised and prepared on a runtime, as plain tract
//! does with `set_input_fact` at those shapes; one plan per set of input shapes, the last
//! few kept. A model the transform refuses, or that tract cannot type over symbols, still
//! has its reference; a model tract itself cannot run at the sample's shape gets tract's
//! error.
//!
//! A sample's inputs are given without their batch axis: each takes one, of extent 1,
//! where its declared fact has the ragged input's batch symbol (axis 0 when it declares
//! none). Its outputs come back without theirs: the axis whose extent follows the batch
//! size, found once by typing the model at batches of one and of two (axis 0 where tract
//! cannot type a batch of two).

use std::sync::{Arc, Mutex};

use tract_core::internal::*;
use tract_core::runtime::{Runnable, Runtime};
use tract_onnx::tract_hir::infer::{Factoid, InferenceFact, InferenceModel, InferenceModelExt};

/// How many plans a [`Reference`] keeps, the most recently used first.
const PLANS: usize = 16;

/// The input shapes a plan was prepared for.
type Shapes = Vec<(DatumType, TVec<usize>)>;

/// A model run on each sample alone, plain tract at each sample's shape (see the module).
pub struct Reference {
    model: InferenceModel,
    runtime: &'static dyn Runtime,
    /// Where each input takes its batch axis.
    input_batch: Vec<usize>,
    plans: Mutex<Vec<(Shapes, Arc<dyn Runnable>)>>,
    /// Where each output has its batch axis (none: no axis follows the batch), found on
    /// the first run.
    output_batch: Mutex<Option<Vec<Option<usize>>>>,
}

impl std::fmt::Debug for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "Reference on {}", self.runtime.name())
    }
}

impl Reference {
    /// The reference of `model` (read by [`crate::load::read_onnx`], inputs given once
    /// already folded in) on `runtime`. `ragged` is the input whose batch symbol tells the
    /// others' batch axes.
    pub fn new(
        model: InferenceModel,
        ragged: usize,
        runtime: &'static dyn Runtime,
    ) -> TractResult<Reference> {
        let inputs = model.input_outlets()?.len();
        ensure!(
            ragged < inputs,
            "the model has {inputs} inputs, no input #{ragged}"
        );
        let batch = model
            .input_fact(ragged)?
            .shape
            .dim(0)
            .and_then(|d| d.concretize());
        let input_batch = (0..inputs)
            .map(|ix| {
                let fact = model.input_fact(ix)?;
                Ok(batch
                    .as_ref()
                    .filter(|b| matches!(b, TDim::Sym(_)))
                    .and_then(|b| {
                        fact.shape
                            .dims()
                            .position(|d| d.concretize().as_ref() == Some(b))
                    })
                    .unwrap_or(0))
            })
            .collect::<TractResult<_>>()?;
        Ok(Reference {
            model,
            runtime,
            input_batch,
            plans: Mutex::new(vec![]),
            output_batch: Mutex::new(None),
        })
    }

    /// The names of the model's inputs, in order.
    pub fn input_names(&self) -> TractResult<Vec<String>> {
        Ok(self
            .model
            .input_outlets()?
            .iter()
            .map(|o| self.model.node(o.node).name.clone())
            .collect())
    }

    /// One sample alone: `inputs`, one per model input in order, without their batch
    /// axes; its outputs without theirs.
    pub fn run(&self, inputs: &[Tensor]) -> TractResult<TVec<Tensor>> {
        ensure!(
            inputs.len() == self.input_batch.len(),
            "{} inputs given, the model takes {}",
            inputs.len(),
            self.input_batch.len()
        );
        let batch: TVec<Tensor> = inputs
            .iter()
            .zip(&self.input_batch)
            .map(|(t, axis)| {
                ensure!(
                    *axis <= t.rank(),
                    "an input of rank {} cannot take its batch axis at {axis}",
                    t.rank()
                );
                let mut t = t.clone();
                t.insert_axis(*axis)?;
                Ok(t)
            })
            .collect::<TractResult<_>>()?;
        let shapes: Shapes = batch
            .iter()
            .map(|t| (t.datum_type(), t.shape().into()))
            .collect();
        let plan = self.plan(&shapes)?;
        let outputs = crate::no_panic(
            || "Running the sample alone".into(),
            || plan.run(batch.into_iter().map(|t| t.into_tvalue()).collect()),
        )?;
        // Learned when the first plan was typed.
        let axes = self
            .output_batch
            .lock()
            .map_err(|_| anyhow!("the reference's batch axes are poisoned"))?
            .clone()
            .unwrap_or_default();
        outputs
            .into_iter()
            .enumerate()
            .map(|(j, o)| {
                let mut t = o.into_tensor();
                if let Some(axis) = axes.get(j).copied().flatten() {
                    t.remove_axis(axis)?;
                }
                Ok(t)
            })
            .collect()
    }

    /// The model typed at `shapes`, as plain tract types it: every input's fact set.
    fn typed(&self, shapes: &Shapes) -> TractResult<TypedModel> {
        let mut model = self.model.clone();
        for (ix, (dt, shape)) in shapes.iter().enumerate() {
            model.set_input_fact(ix, InferenceFact::dt_shape(*dt, shape.clone()))?;
        }
        crate::load::decide_branches(&mut model)?;
        let what = || format!("Typing the model at {}", describe(shapes));
        let mut typed = crate::no_panic(what, || model.into_typed().with_context(what))?;
        crate::load::cumsums_of_dims_in_i64(&mut typed)?;
        Ok(typed)
    }

    /// The plan for `shapes`, prepared on first use.
    fn plan(&self, shapes: &Shapes) -> TractResult<Arc<dyn Runnable>> {
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| anyhow!("the reference's plans are poisoned"))?;
        if let Some(at) = plans.iter().position(|(s, _)| s == shapes) {
            let entry = plans.remove(at);
            let plan = entry.1.clone();
            plans.insert(0, entry);
            return Ok(plan);
        }
        drop(plans);
        let typed = self.typed(shapes)?;
        self.learn_output_batch(&typed, shapes)?;
        let what = || {
            format!(
                "Preparing the model at {} on {}",
                describe(shapes),
                self.runtime.name()
            )
        };
        let plan: Arc<dyn Runnable> = crate::no_panic(what, || {
            Ok(crate::segment::prepare(self.runtime, typed)
                .with_context(what)?
                .into())
        })?;
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| anyhow!("the reference's plans are poisoned"))?;
        plans.insert(0, (shapes.clone(), plan.clone()));
        plans.truncate(PLANS);
        Ok(plan)
    }

    /// Learns, once, where each output has its batch axis from `one`, the model typed at
    /// `shapes` (a batch of one): where its extent is 1 there and 2 at a batch of two; none
    /// for an output with no such axis. When the model does not type at a batch of two,
    /// axis 0 where its extent is 1.
    fn learn_output_batch(&self, one: &TypedModel, shapes: &Shapes) -> TractResult<()> {
        let mut known = self
            .output_batch
            .lock()
            .map_err(|_| anyhow!("the reference's batch axes are poisoned"))?;
        if known.is_some() {
            return Ok(());
        }
        let doubled: Shapes = shapes
            .iter()
            .zip(&self.input_batch)
            .map(|((dt, shape), axis)| {
                let mut shape = shape.clone();
                shape[*axis] = 2;
                (*dt, shape)
            })
            .collect();
        let two = self.typed(&doubled).ok();
        let axes = (0..one.outputs.len())
            .map(|j| {
                let of = |m: &TypedModel| -> Option<TVec<usize>> {
                    m.outputs
                        .get(j)
                        .and_then(|o| m.outlet_fact(*o).ok())
                        .and_then(|f| f.shape.as_concrete().map(|s| s.into()))
                };
                let a = of(one)?;
                // Not typed at two (tract fails on some exports' reshapes at a concrete
                // batch above one): the batch-first convention, where the extent allows.
                let Some(b) = two.as_ref().and_then(of) else {
                    return (a.first() == Some(&1)).then_some(0);
                };
                let moved: Vec<usize> = (0..a.len().min(b.len()))
                    .filter(|&k| a[k] == 1 && b[k] == 2)
                    .collect();
                (a.len() == b.len() && moved.len() == 1).then(|| moved[0])
            })
            .collect::<Vec<_>>();
        *known = Some(axes);
        Ok(())
    }
}

fn describe(shapes: &Shapes) -> String {
    shapes
        .iter()
        .map(|(dt, s)| {
            let dims: Vec<String> = s.iter().map(|d| d.to_string()).collect();
            format!("{},{dt:?}", dims.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}
