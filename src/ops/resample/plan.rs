//! [`ResamplePlan`]: each sample's plan for one resized axis, from its widths.

use tract_core::internal::*;

use super::Resampling;
use crate::ops::table_view;

/// A sample's extent along a resized axis: a row of the widths table (a ragged axis), or
/// the same number for every sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AxisWidth {
    Row(usize),
    Fixed(usize),
}

impl AxisWidth {
    fn of(
        &self,
        table: &tract_core::ndarray::ArrayView2<i64>,
        sample: usize,
    ) -> TractResult<usize> {
        match self {
            AxisWidth::Fixed(w) => Ok(*w),
            AxisWidth::Row(row) => {
                let w = *table
                    .get((*row, sample))
                    .context("RaggedResamplePlan: a row past the widths table")?;
                usize::try_from(w).with_context(|| format!("sample {sample}: a width of {w}"))
            }
        }
    }
}

/// Per sample and output position of one resized axis, the `window` input positions it
/// reads and their weights, as tract plans the sample alone (module doc of
/// [`super`]): `[N, len_out, window]` i32 indices and f32 weights, zero past each sample's
/// output width. Input: the widths table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResamplePlan {
    pub resampling: Resampling,
    pub input: AxisWidth,
    pub output: AxisWidth,
    /// The scale given to the resize (bits), or `None` when it is sized: each sample's
    /// scale is then its output width over its input width, as alone.
    pub scale: Option<u32>,
    pub window: usize,
    /// The padded output extent.
    pub len_out: TDim,
}

impl Op for ResamplePlan {
    fn name(&self) -> StaticName {
        "RaggedResamplePlan".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "{:?} {}, {:?} -> {:?}, scale {:?}, {} taps",
            self.resampling.interpolator,
            self.resampling.coord.as_str(),
            self.input,
            self.output,
            self.scale.map(f32::from_bits),
            self.window
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for ResamplePlan {
    not_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let what = "RaggedResamplePlan";
        let table = table_view(&inputs[0])?;
        let n = table.shape()[1];
        let len_out = self.len_out.eval_to_i64(ctx.symbols)?;
        let len_out = usize::try_from(len_out).with_context(|| format!("{what}: {len_out}"))?;
        let window = self.window;
        let mut indices = vec![0i32; n * len_out * window];
        let mut weights = vec![0f32; n * len_out * window];
        for sample in 0..n {
            let (w_in, w_out) = (
                self.input.of(&table, sample)?,
                self.output.of(&table, sample)?,
            );
            ensure!(
                w_in >= 1 && w_out <= len_out,
                "{what}: sample {sample} resized from {w_in} to {w_out} in an extent of {len_out}"
            );
            if w_out == 0 {
                continue;
            }
            let scale = match self.scale {
                Some(bits) => f32::from_bits(bits),
                None => w_out as f32 / w_in as f32,
            };
            let plan = self.resampling.plan(scale, w_in, w_out);
            ensure!(
                plan.window <= window,
                "{what}: sample {sample} reads {} taps, the plan holds {window}",
                plan.window
            );
            ensure!(
                !plan.extrapolated.contains(&true),
                "{what}: sample {sample} extrapolates"
            );
            for o in 0..w_out {
                let at = (sample * len_out + o) * window;
                for t in 0..plan.window {
                    let index = plan.indices[o * plan.window + t];
                    indices[at + t] = i32::try_from(index).context("an index beyond 32 bits")?;
                    weights[at + t] = plan.weights[o * plan.window + t];
                }
            }
        }
        let shape = [n, len_out, window];
        Ok(tvec!(
            Tensor::from_shape(&shape, &indices)?.into_tvalue(),
            Tensor::from_shape(&shape, &weights)?.into_tvalue()
        ))
    }
}

impl TypedOp for ResamplePlan {
    /// One pass writing its output: what it costs beside the ops that do the work.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        Ok(crate::ops::written(&self.output_facts(inputs)?[0]))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let shape = [
            inputs[0].shape[1].clone(),
            self.len_out.clone(),
            self.window.to_dim(),
        ];
        Ok(tvec!(i32::fact(shape.clone()), f32::fact(shape)))
    }

    fn set_symbols(
        &self,
        _source: &TypedModel,
        node: &TypedNode,
        target: &mut TypedModel,
        mapping: &HashMap<OutletId, OutletId>,
        subs: &HashMap<Symbol, TDim>,
    ) -> TractResult<TVec<OutletId>> {
        let op = ResamplePlan {
            len_out: self.len_out.substitute_all(subs)?,
            ..self.clone()
        };
        let inputs: TVec<OutletId> = node.inputs.iter().map(|i| mapping[i]).collect();
        target.wire_node(&node.name, op, &inputs)
    }

    as_op!();
}
