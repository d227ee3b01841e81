//! Widths on the host: the widths table, and values the model derives from the width.

use tract_core::internal::*;

use crate::error::BadSample;
use crate::spec::Extent;
use crate::transform::width::{TooNarrow, WidthFn};

/// Computes the widths table `[K, N]` from the samples' input widths, one `[N]` input per
/// ragged axis of the input: row k is `fns[k]` applied to each sample's width along the
/// axis it derives from. Then, as outputs of their own, the rows in `emit` (`[N]` each):
/// the widths outputs of the model.
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
    /// The table for input widths `widths` (per ragged axis of the input, one per sample).
    pub fn compute(&self, widths: &[&[i64]]) -> TractResult<Tensor> {
        let n = widths.first().map(|w| w.len()).unwrap_or(0);
        ensure!(
            widths.iter().all(|w| w.len() == n),
            "the widths of the ragged axes are for different numbers of samples"
        );
        let mut table = Vec::with_capacity(self.fns.len() * n);
        for f in &self.fns {
            let source = widths.get(f.source).with_context(|| {
                format!(
                    "a width derives from ragged axis #{}, of {}",
                    f.source,
                    widths.len()
                )
            })?;
            for (sample, &w) in source.iter().enumerate() {
                ensure!(
                    w >= 1,
                    BadSample {
                        index: sample,
                        name: None,
                        input: None,
                        reason: format!("sample {sample} has width {w}: widths start at 1"),
                    }
                );
                let width = f.eval(w).map_err(|TooNarrow { node, width }| {
                    anyhow!(BadSample {
                        index: sample,
                        name: None,
                        input: None,
                        reason: format!(
                            "sample {sample} of width {w} is too narrow for this model: its \
                             width becomes {width} at node {node:?}"
                        ),
                    })
                })?;
                table.push(width);
            }
        }
        Tensor::from_shape(&[self.fns.len(), n], &table)
    }
}

/// The widths inputs of a run as i64 slices, one per ragged axis.
fn widths_of(inputs: &[TValue]) -> TractResult<Vec<Tensor>> {
    inputs
        .iter()
        .map(|w| Ok(w.cast_to::<i64>()?.into_owned()))
        .collect()
}

impl EvalOp for WidthTable {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let widths = widths_of(&inputs)?;
        let slices = widths
            .iter()
            .map(|w| w.try_as_plain_ram()?.as_slice::<i64>())
            .collect::<TractResult<Vec<_>>>()?;
        let table = self.compute(&slices)?;
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
    /// One pass writing its output: what it costs beside the ops that do the work.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        Ok(crate::ops::written(&self.output_facts(inputs)?[0]))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        ensure!(
            inputs.iter().all(|i| i.rank() == 1),
            "the widths inputs must be of rank 1, one width per sample"
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
    /// The value, as an expression of the symbols sizing the input's ragged axes.
    pub expr: TDim,
    /// How the input fact sizes each ragged axis of the input, in the order of the
    /// widths inputs: a sample's width there gives the symbol's value.
    pub extents: TVec<Extent>,
    /// The rank of the result: the batch on axis 0, every other axis of extent one.
    pub rank: usize,
    /// The symbols sizing the batch, which the expression may hold (a mean over the
    /// batch axis and others counts its samples): a sample alone is a batch of one.
    pub batch: TVec<Symbol>,
}

impl Op for PerSampleDim {
    fn name(&self) -> StaticName {
        "RaggedPerSampleDim".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        let symbols: Vec<String> = self
            .extents
            .iter()
            .filter_map(|e| e.symbol())
            .map(|s| s.to_string())
            .collect();
        Ok(vec![format!(
            "{} with {} at each sample's widths",
            self.expr,
            symbols.join(", ")
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for PerSampleDim {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let widths = widths_of(&inputs)?;
        let slices = widths
            .iter()
            .map(|w| w.try_as_plain_ram()?.as_slice::<i64>())
            .collect::<TractResult<Vec<_>>>()?;
        let n = slices.first().map(|w| w.len()).unwrap_or(0);
        let values = (0..n)
            .map(|sample| {
                let mut values = SymbolValues::default();
                for symbol in &self.batch {
                    values.set(symbol, 1);
                }
                for (extent, widths) in self.extents.iter().zip(&slices) {
                    if let Some(symbol) = extent.symbol() {
                        let value = extent
                            .symbol_value(widths[sample])
                            .with_context(|| format!("sample {sample}"))?;
                        values.set(symbol, value);
                    }
                }
                self.expr.eval_to_i64(&values)
            })
            .collect::<TractResult<Vec<i64>>>()?;
        let mut shape = tvec![1; self.rank];
        shape[0] = values.len();
        Ok(tvec!(Tensor::from_shape(&shape, &values)?.into_tvalue()))
    }
}

impl TypedOp for PerSampleDim {
    /// One pass writing its output: what it costs beside the ops that do the work.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        Ok(crate::ops::written(&self.output_facts(inputs)?[0]))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut shape: TVec<TDim> = tvec![1.to_dim(); self.rank];
        shape[0] = inputs[0].shape[0].clone();
        Ok(tvec!(i64::fact(shape)))
    }

    as_op!();
}
