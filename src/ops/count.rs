//! How many cells a sample has over some ragged axes: a mean's divisor, per sample.
//!
//! A model typed for one concrete shape (per shape: tract could not type it with symbolic
//! extents) divides a sum over ragged axes by a number, the padded count of cells there.
//! Alone, a sample divides by its own count; this op gives it, from the widths table, laid
//! out along the batch axis so that it broadcasts against the sum.

use tract_core::internal::*;

use super::table_view;

/// `fixed` times the product of the widths table's `rows`, per sample: `[1, .., N, .., 1]`
/// of `datum_type` (the reciprocal when `reciprocal`), the samples along `batch` of `rank`
/// axes. Input: the widths table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SampleCount {
    pub rows: TVec<usize>,
    pub fixed: u64,
    pub reciprocal: bool,
    pub datum_type: DatumType,
    pub rank: usize,
    pub batch: usize,
}

impl Op for SampleCount {
    fn name(&self) -> StaticName {
        "RaggedSampleCount".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "{}{} x rows {:?}",
            if self.reciprocal { "1 / " } else { "" },
            self.fixed,
            self.rows
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for SampleCount {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let table = table_view(&inputs[0])?;
        let n = table.shape()[1];
        let counts = (0..n)
            .map(|sample| {
                let mut count = self.fixed as f64;
                for row in &self.rows {
                    count *= *table
                        .get((*row, sample))
                        .context("RaggedSampleCount: a row past the widths table")?
                        as f64;
                }
                Ok(if self.reciprocal { 1.0 / count } else { count })
            })
            .collect::<TractResult<Vec<f64>>>()?;
        let mut shape = tvec![1; self.rank];
        shape[self.batch] = n;
        let counts = Tensor::from_shape(&shape, &counts)?;
        Ok(tvec!(
            counts
                .cast_to_dt(self.datum_type)?
                .into_owned()
                .into_tvalue()
        ))
    }
}

impl TypedOp for SampleCount {
    /// One pass writing its output: what it costs beside the ops that do the work.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        Ok(crate::ops::written(&self.output_facts(inputs)?[0]))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut shape: TVec<TDim> = tvec![1.to_dim(); self.rank];
        shape[self.batch] = inputs[0].shape[1].clone();
        Ok(tvec!(self.datum_type.fact(shape)))
    }

    as_op!();
}
