//! Softmax over a ragged axis, on each sample's valid prefix only.
//!
//! A softmax over the keys of an attention block normalises over every key; padded keys
//! would take their share of the probability mass. Here each row is normalised over its
//! sample's width, and every padded position of the output, along any ragged axis, is 0:
//! which is exactly what the contraction with the values that follows needs (a padded
//! key contributes nothing), and what the next mask would write anyway.
//!
//! The f32 rows go through the same tract-linalg kernels tract's own softmax picks for a
//! row of that length, so a sample gets the values it gets alone, not merely close ones.

use tract_core::internal::*;
use tract_core::ndarray::{ArrayView2, ArrayViewMut1, Axis};
use tract_core::num_traits::Float;
use tract_core::ops::nn::SoftmaxKind;
use tract_core::tract_linalg::routines::{Func, softmax_rows_f32};

use super::{SampleAxes, table_view};

/// Softmax (or log-softmax) along `axis`, a ragged axis of `axes`. Inputs: the tensor,
/// the widths table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MaskedSoftmax {
    pub axes: SampleAxes,
    pub axis: usize,
    pub kind: SoftmaxKind,
}

impl Op for MaskedSoftmax {
    fn name(&self) -> StaticName {
        match self.kind {
            SoftmaxKind::Softmax => "RaggedMaskedSoftmax".into(),
            SoftmaxKind::LogSoftmax => "RaggedMaskedLogSoftmax".into(),
        }
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "axis {} (batch axis {})",
            self.axis, self.axes.batch
        )])
    }

    op_as_typed_op!();
}

/// Softmax of one row, in place, as tract computes it for a row of this length.
trait RowSoftmax: Datum + Float {
    fn row(row: &mut [Self], kind: SoftmaxKind) -> TractResult<()> {
        let max = row.iter().copied().fold(Self::neg_infinity(), Self::max);
        let sum = row
            .iter()
            .map(|&x| (x - max).exp())
            .fold(Self::zero(), |a, b| a + b);
        match kind {
            SoftmaxKind::Softmax => row.iter_mut().for_each(|x| *x = (*x - max).exp() / sum),
            SoftmaxKind::LogSoftmax => {
                let log_sum = sum.ln();
                row.iter_mut().for_each(|x| *x = *x - max - log_sum)
            }
        }
        Ok(())
    }
}

impl RowSoftmax for f64 {}
impl RowSoftmax for f16 {}
impl RowSoftmax for f32 {
    fn row(row: &mut [f32], kind: SoftmaxKind) -> TractResult<()> {
        if kind == SoftmaxKind::LogSoftmax {
            let max = Func::ReduceMax.reduce_f32()?.run(row)?;
            let mut exp_sum = 0f32;
            row.iter_mut().for_each(|x| {
                *x -= max;
                exp_sum += x.exp();
            });
            let log_sum = exp_sum.ln();
            row.iter_mut().for_each(|x| *x -= log_sum);
        } else if row.len().is_multiple_of(4)
            && let Some(rows) = softmax_rows_f32()
        {
            let len = row.len();
            rows(row, len);
        } else {
            let max = Func::ReduceMax.reduce_f32()?.run(row)?;
            let sum = Func::Softmax2.map_reduce_f32()?.run_with_params(row, max)?;
            Func::MulByScalar
                .ew_f32_param()?
                .run_with_params(row, sum.recip())?;
        }
        Ok(())
    }
}

impl MaskedSoftmax {
    fn eval_t<T: RowSoftmax>(&self, x: &mut Tensor, table: &ArrayView2<i64>) -> TractResult<()> {
        let row_of_axis = self
            .axes
            .ragged_at(self.axis)
            .context("softmax axis is not ragged")?
            .row;
        let others: TVec<_> = self
            .axes
            .ragged
            .iter()
            .filter(|r| r.axis != self.axis)
            .copied()
            .collect();
        let mut view = x.to_plain_array_view_mut::<T>()?;
        let shape = view.shape().to_vec();
        // Every lane along the softmax axis, with its coordinates along the other axes.
        let mut outer = shape.clone();
        outer[self.axis] = 1;
        let mut scratch: Vec<T> = vec![];
        for coords in tract_core::ndarray::indices(&*outer) {
            let sample = coords[self.axes.batch];
            let mut lane: ArrayViewMut1<T> = {
                let mut v = view.view_mut();
                for ax in (0..shape.len()).rev() {
                    if ax != self.axis {
                        v.index_axis_inplace(Axis(ax), coords[ax]);
                    }
                }
                v.into_dimensionality()?
            };
            let padded_out = others
                .iter()
                .any(|r| coords[r.axis] as i64 >= table[[r.row, sample]]);
            let w = if padded_out {
                0
            } else {
                table[[row_of_axis, sample]] as usize
            };
            if w > 0 {
                match lane.as_slice_mut() {
                    Some(slice) => T::row(&mut slice[..w], self.kind)?,
                    None => {
                        scratch.clear();
                        scratch.extend(lane.iter().take(w).copied());
                        T::row(&mut scratch, self.kind)?;
                        lane.iter_mut()
                            .zip(scratch.iter())
                            .for_each(|(l, s)| *l = *s);
                    }
                }
            }
            lane.slice_axis_mut(Axis(0), (w..).into()).fill(T::zero());
        }
        Ok(())
    }
}

impl EvalOp for MaskedSoftmax {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (x, table) = args_2!(inputs);
        let table = table_view(&table)?;
        let mut x = x.into_tensor();
        self.axes.check(x.shape(), &table, "RaggedMaskedSoftmax")?;
        match x.datum_type() {
            DatumType::F32 => self.eval_t::<f32>(&mut x, &table)?,
            DatumType::F16 => self.eval_t::<f16>(&mut x, &table)?,
            DatumType::F64 => self.eval_t::<f64>(&mut x, &table)?,
            dt => bail!("RaggedMaskedSoftmax: unsupported type {dt:?}"),
        }
        Ok(tvec!(x.into_tvalue()))
    }
}

impl TypedOp for MaskedSoftmax {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        Ok(tvec!(inputs[0].datum_type.fact(inputs[0].shape.clone())))
    }

    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let dt = inputs[0].datum_type;
        Ok(tvec!(
            (Cost::Div(dt), inputs[0].shape.volume()),
            (Cost::FMA(dt), inputs[0].shape.volume())
        ))
    }

    as_op!();
}
