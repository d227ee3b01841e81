//! A plan in segments: each segment prepared on the runtime apart, run one after the
//! other, the values crossing a cut handed from one plan to the next (module doc of
//! [`super`]).

use tract_core::internal::*;

use super::{Segments, TRACT_RAGGED_SEGMENT, Wire};

/// `model` prepared on `runtime`: in one plan, or in segments when it is too large for
/// tract's optimizer to prepare in one piece ([`super::Segments::cut`]).
pub fn prepare(runtime: &dyn Runtime, model: TypedModel) -> TractResult<Box<dyn Runnable>> {
    prepare_with_options(runtime, model, &RunOptions::default())
}

/// [`prepare`] with the runtime's `options` (a symbolic plan's memory sizing hints).
pub fn prepare_with_options(
    runtime: &dyn Runtime,
    model: TypedModel,
    options: &RunOptions,
) -> TractResult<Box<dyn Runnable>> {
    let Some(segments) = Segments::cut(&model, TRACT_RAGGED_SEGMENT.get())? else {
        return runtime.prepare_with_options(model, options);
    };
    let input_facts = model
        .input_outlets()?
        .iter()
        .map(|o| model.outlet_fact(*o).cloned())
        .collect::<TractResult<_>>()?;
    let output_facts = model
        .output_outlets()?
        .iter()
        .map(|o| model.outlet_fact(*o).cloned())
        .collect::<TractResult<_>>()?;
    drop(model);
    let plans = segments.map(|m| {
        Ok(Arc::<dyn Runnable>::from(
            runtime.prepare_with_options(m, options)?,
        ))
    })?;
    Ok(Box::new(SegmentedPlan {
        segments: Arc::new(plans),
        input_facts,
        output_facts,
    }))
}

/// How many segments `plan` runs in: 1 unless it is a [`SegmentedPlan`].
pub fn count(plan: &dyn Runnable) -> usize {
    plan.downcast_ref::<SegmentedPlan>()
        .map(|s| s.segments.len())
        .unwrap_or(1)
}

/// The plans of a model's segments, run in order.
#[derive(Clone, Debug)]
pub struct SegmentedPlan {
    segments: Arc<Segments<Arc<dyn Runnable>>>,
    input_facts: Vec<TypedFact>,
    output_facts: Vec<TypedFact>,
}

impl SegmentedPlan {
    /// The segments' plans, in order.
    pub fn plans(&self) -> impl Iterator<Item = &Arc<dyn Runnable>> {
        self.segments.models()
    }

    /// Runs the segments in order, each through `run` (its index, its plan, its
    /// inputs); a value is dropped as soon as the last segment reading it has its
    /// inputs, so that a plan may reuse its buffer.
    pub fn run_with(
        &self,
        inputs: TVec<TValue>,
        mut run: impl FnMut(usize, &Arc<dyn Runnable>, TVec<TValue>) -> TractResult<TVec<TValue>>,
    ) -> TractResult<TVec<TValue>> {
        let s = &*self.segments;
        ensure!(
            inputs.len() == s.inputs,
            "the model takes {} inputs, {} given",
            s.inputs,
            inputs.len()
        );
        let mut wires: Vec<Option<TValue>> = vec![None; s.wires];
        for (ix, input) in inputs.into_iter().enumerate() {
            wires[ix] = Some(input);
        }
        let count = s.pieces.len();
        for (ix, piece) in s.pieces.iter().enumerate() {
            let inputs = piece
                .inputs
                .iter()
                .map(|w| {
                    wires[*w]
                        .clone()
                        .context("a segment reads a value not made yet")
                })
                .collect::<TractResult<TVec<_>>>()?;
            for w in &piece.last_readers_of {
                wires[*w] = None;
            }
            let outputs = run(ix, &piece.model, inputs)
                .with_context(|| format!("Running segment {} of {count}", ix + 1))?;
            ensure!(
                outputs.len() == piece.outputs.len(),
                "segment {} made {} values, {} expected",
                ix + 1,
                outputs.len(),
                piece.outputs.len()
            );
            for (w, value) in piece.outputs.iter().zip(outputs) {
                wires[*w] = Some(value);
            }
        }
        s.outputs
            .iter()
            .map(|o| match o {
                Wire::Value(w) => wires[*w].clone().context("an output is made nowhere"),
                Wire::Const(k) => Ok(k.clone().into_tvalue()),
            })
            .collect()
    }
}

impl Runnable for SegmentedPlan {
    fn run(&self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        self.run_with(inputs, |_, plan, inputs| plan.run(inputs))
    }

    fn spawn(&self) -> TractResult<Box<dyn State>> {
        let states = self
            .plans()
            .map(|p| p.spawn())
            .collect::<TractResult<_>>()?;
        Ok(Box::new(SegmentedState {
            plan: self.clone(),
            states,
        }))
    }

    fn input_count(&self) -> usize {
        self.input_facts.len()
    }

    fn output_count(&self) -> usize {
        self.output_facts.len()
    }

    fn input_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.input_facts
            .get(ix)
            .with_context(|| format!("no input #{ix}"))
    }

    fn output_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.output_facts
            .get(ix)
            .with_context(|| format!("no output #{ix}"))
    }

    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        None
    }

    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        None
    }
}

/// A state of each segment's plan.
#[derive(Clone, Debug)]
struct SegmentedState {
    plan: SegmentedPlan,
    states: Vec<Box<dyn State>>,
}

impl State for SegmentedState {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let states = &mut self.states;
        self.plan
            .run_with(inputs, |ix, _, inputs| states[ix].run(inputs))
    }

    fn runnable(&self) -> &dyn Runnable {
        &self.plan
    }
}
