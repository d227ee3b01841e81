//! [`SampleResample`]: one axis resampled with each sample's own plan.

use tract_core::internal::*;
use tract_core::ndarray::{Axis, Zip};

/// Resamples `axis` of each sample (along `batch`) by its plan ([`super::ResamplePlan`]'s
/// indices and weights, `[N, len_out, window]`): output position `o` is the sum over the
/// taps of weight times input position, zero weights skipped, from zero, in tap order.
/// Floats are resampled in f32, as tract does. Inputs: the tensor, the indices, the
/// weights.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SampleResample {
    pub axis: usize,
    pub batch: usize,
}

impl Op for SampleResample {
    fn name(&self) -> StaticName {
        "RaggedSampleResample".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "axis {}, batch axis {}",
            self.axis, self.batch
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for SampleResample {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let what = "RaggedSampleResample";
        let (x, indices, weights) = args_3!(inputs);
        let dt = x.datum_type();
        let x = x.cast_to::<f32>()?;
        let x = x.to_plain_array_view::<f32>()?;
        let indices = indices.to_plain_array_view::<i32>()?;
        let weights = weights.to_plain_array_view::<f32>()?;
        let (n, len_out, window) = (indices.shape()[0], indices.shape()[1], indices.shape()[2]);
        ensure!(
            x.shape().get(self.batch) == Some(&n) && weights.shape() == indices.shape(),
            "{what}: a tensor of shape {:?}, plans of {:?} and {:?}",
            x.shape(),
            indices.shape(),
            weights.shape()
        );
        let len_in = x.shape()[self.axis];
        let mut shape: TVec<usize> = x.shape().into();
        shape[self.axis] = len_out;
        let mut y = tract_core::ndarray::ArrayD::<f32>::zeros(&*shape);
        // Within a sample (its batch axis gone), the resampled axis' position.
        let axis = self.axis - (self.axis > self.batch) as usize;
        for (sample, (x, mut y)) in x
            .axis_iter(Axis(self.batch))
            .zip(y.axis_iter_mut(Axis(self.batch)))
            .enumerate()
        {
            for (o, mut y) in y.axis_iter_mut(Axis(axis)).enumerate() {
                for t in 0..window {
                    let w = weights[[sample, o, t]];
                    if w == 0.0 {
                        continue;
                    }
                    let i = indices[[sample, o, t]];
                    let i = usize::try_from(i)
                        .ok()
                        .filter(|i| *i < len_in)
                        .with_context(|| format!("{what}: sample {sample} reads position {i}"))?;
                    Zip::from(&mut y)
                        .and(&x.index_axis(Axis(axis), i))
                        .for_each(|d, s| *d += w * s);
                }
            }
        }
        let y = y.into_tensor();
        let y = if dt == f32::datum_type() {
            y
        } else {
            y.cast_to_dt(dt)?.into_owned()
        };
        Ok(tvec!(y.into_tvalue()))
    }
}

impl TypedOp for SampleResample {
    /// Every output a weighted sum of its plan's window of taps.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let out = &self.output_facts(inputs)?[0];
        let window = inputs[2].shape.last().cloned().unwrap_or_else(|| 1.into());
        Ok(tvec!((
            Cost::FMA(out.datum_type),
            out.shape.volume() * window
        )))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut shape = inputs[0].shape.to_tvec();
        shape[self.axis] = inputs[1].shape[1].clone();
        Ok(tvec!(inputs[0].datum_type.fact(shape)))
    }

    as_op!();
}
