//! Edge replication: the padded region holding a sample's last valid value.
//!
//! An op that clamps its reads to the input's extent (a linear or cubic resize reading a
//! neighbour past the last position) reads, for a sample alone, its own last row or
//! column there; in the batch it would read the padding. Writing each sample's last valid
//! value along an axis into everything past its width there makes the dense op read what
//! the sample alone reads, whatever it reads past the edge. Along two axes, one after the
//! other: the corner gets the sample's corner, as clamping both coordinates gives it.
//!
//! Mirrored (`reflect`), position `w - 1 + k` past a sample's width `w` holds position
//! `w - 1 - k` instead: what a reflect pad after the sample puts there for the sample
//! alone (ONNX `Pad` in `reflect` mode; the edge itself is not repeated). Past `2(w-1)`
//! it holds position 0 (never read by a pad shorter than the sample, as ONNX requires).

use tract_core::internal::*;
use tract_core::ndarray::{ArrayView2, Axis};

use super::{SampleAxes, table_view};

/// Fills, along each ragged axis in `along`, every position past a sample's width with
/// the value at its last valid position. Inputs: the tensor, the widths table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EdgeFill {
    pub axes: SampleAxes,
    /// The ragged axes to extend (among `axes.ragged`), in order.
    pub along: TVec<usize>,
    /// Mirrored about the last valid position rather than repeating it (module doc).
    pub reflect: bool,
}

impl Op for EdgeFill {
    fn name(&self) -> StaticName {
        "RaggedEdgeFill".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "batch axis {}, along {:?}{}",
            self.axes.batch,
            self.along,
            if self.reflect { ", mirrored" } else { "" }
        )])
    }

    op_as_typed_op!();
}

impl EdgeFill {
    fn fill_t<T: Datum + Copy>(&self, x: &mut Tensor, table: &ArrayView2<i64>) -> TractResult<()> {
        let batch = self.axes.batch;
        let mut view = x.to_plain_array_view_mut::<T>()?;
        for (sample, mut sample_view) in view.axis_iter_mut(Axis(batch)).enumerate() {
            for &axis in &self.along {
                let r = self
                    .axes
                    .ragged_at(axis)
                    .context("RaggedEdgeFill: an axis that is not ragged")?;
                // The sample view has lost the batch axis.
                let axis = axis - (axis > batch) as usize;
                let w = table[[r.row, sample]] as usize;
                if w == 0 || w >= sample_view.shape()[axis] {
                    continue;
                }
                let (valid, mut past) = sample_view.view_mut().split_at(Axis(axis), w);
                if self.reflect {
                    for k in 0..past.shape()[axis] {
                        let src = (2 * (w - 1)).saturating_sub(w + k);
                        past.index_axis_mut(Axis(axis), k)
                            .assign(&valid.index_axis(Axis(axis), src));
                    }
                } else {
                    let edge = valid.index_axis(Axis(axis), w - 1).insert_axis(Axis(axis));
                    past.assign(&edge);
                }
            }
        }
        Ok(())
    }
}

impl EvalOp for EdgeFill {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (x, table) = args_2!(inputs);
        let table = table_view(&table)?;
        self.axes.check(x.shape(), &table, "RaggedEdgeFill")?;
        let mut x = x.into_tensor();
        dispatch_copy!(Self::fill_t(x.datum_type())(self, &mut x, &table))?;
        Ok(tvec!(x.into_tvalue()))
    }
}

impl TypedOp for EdgeFill {
    /// One pass over its input.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        Ok(crate::ops::written(inputs[0]))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        Ok(tvec!(inputs[0].datum_type.fact(inputs[0].shape.clone())))
    }

    as_op!();
}
