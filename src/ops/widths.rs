//! Widths on the host: the widths table, and values the model derives from the width.

use tract_core::internal::*;

use crate::transform::width::{TooNarrow, WidthFn};

/// Computes the widths table `[K, N]` from the samples' input widths `[N]`: row k is
/// `fns[k]` applied to each sample's width. Then, as outputs of their own, the rows in
/// `emit` (`[N]` each): the widths outputs of the model.
///
/// This is where a sample too narrow for the model is caught (a width of 3 through an
/// unpadded 5-wide conv), with the node where its width falls below one: alone, that
/// sample would not run either.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WidthTable {
    pub fns: Vec<WidthFn>,
    pub emit: Vec<usize>,
}

impl Op for WidthTable {
    fn name(&self) -> StaticName {
        "RaggedWidthTable".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(self
            .fns
            .iter()
            .enumerate()
            .map(|(k, f)| format!("row {k}: {f}"))
            .collect())
    }

    op_as_typed_op!();
}

impl WidthTable {
    /// The table for input widths `widths`.
    pub fn compute(&self, widths: &[i64]) -> TractResult<Tensor> {
        let mut table = Vec::with_capacity(self.fns.len() * widths.len());
        for f in &self.fns {
            for (sample, &w) in widths.iter().enumerate() {
                ensure!(w >= 1, "sample {sample} has width {w}: widths start at 1");
                let width = f.eval(w).map_err(|TooNarrow { node, width }| {
                    anyhow!(
                        "sample {sample} of width {w} is too narrow for this model: \
                         its width becomes {width} at node {node:?}"
                    )
                })?;
                table.push(width);
            }
        }
        Tensor::from_shape(&[self.fns.len(), widths.len()], &table)
    }
}

impl EvalOp for WidthTable {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let widths = args_1!(inputs);
        let widths = widths.cast_to::<i64>()?;
        let widths = widths.try_as_plain_ram()?;
        let table = self.compute(widths.as_slice::<i64>()?)?;
        let n = table.shape()[1];
        let mut outputs = tvec!();
        for row in &self.emit {
            outputs.push(
                table
                    .slice(0, *row, row + 1)?
                    .into_shape(&[n])?
                    .into_tvalue(),
            );
        }
        outputs.insert(0, table.into_tvalue());
        Ok(outputs)
    }
}

impl TypedOp for WidthTable {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        ensure!(
            inputs[0].rank() == 1,
            "the widths input must be of rank 1, one width per sample"
        );
        let n = inputs[0].shape[0].clone();
        let mut facts = tvec!(super::table_fact(self.fns.len(), n.clone()));
        facts.extend(self.emit.iter().map(|_| i64::fact([n.clone()])));
        Ok(facts)
    }

    as_op!();
}

/// A value the model derives from the padded width, evaluated per sample at the
/// sample's own width.
///
/// A global average pool over the ragged axis divides by the extent it pooled; on a
/// symbolic model that divisor is a constant expression in the width symbol
/// (`6*(W+3)/4` in PP-OCRv4). Alone, a sample divides by its own width's value of that
/// expression, so the batch must too: this op turns the expression into one value per
/// sample, laid out along the batch axis so that it broadcasts against the batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PerSampleDim {
    /// The value, as an expression of the ragged input's width symbol.
    pub expr: TDim,
    pub symbol: Symbol,
    /// The rank of the result: the batch on axis 0, every other axis of extent one.
    pub rank: usize,
}

impl Op for PerSampleDim {
    fn name(&self) -> StaticName {
        "RaggedPerSampleDim".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "{} with {} at each sample's width",
            self.expr, self.symbol
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for PerSampleDim {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let widths = args_1!(inputs);
        let widths = widths.cast_to::<i64>()?;
        let widths = widths.try_as_plain_ram()?;
        let values = widths
            .as_slice::<i64>()?
            .iter()
            .map(|w| {
                self.expr
                    .eval_to_i64(&SymbolValues::default().with(&self.symbol, *w))
            })
            .collect::<TractResult<Vec<i64>>>()?;
        let mut shape = tvec![1; self.rank];
        shape[0] = values.len();
        Ok(tvec!(Tensor::from_shape(&shape, &values)?.into_tvalue()))
    }
}

impl TypedOp for PerSampleDim {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut shape: TVec<TDim> = tvec![1.to_dim(); self.rank];
        shape[0] = inputs[0].shape[0].clone();
        Ok(tvec!(i64::fact(shape)))
    }

    as_op!();
}
