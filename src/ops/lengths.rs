//! Each sample's length for a recurrence over the ragged axis: its width there, or the
//! model's own `sequence_lens` where shorter.

use tract_core::internal::*;

use super::table_view;

/// Row `row` of the widths table as `[N]` i32 (what ONNX's `sequence_lens` and cuDNN
/// take), each the smaller of it and the model's own length when a second input gives
/// those. Inputs: the widths table, optionally the model's lengths `[N]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SequenceLengths {
    pub row: usize,
}

impl Op for SequenceLengths {
    fn name(&self) -> StaticName {
        "RaggedSequenceLengths".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("widths table row {}", self.row)])
    }

    op_as_typed_op!();
}

impl EvalOp for SequenceLengths {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let table = table_view(&inputs[0])?;
        ensure!(
            self.row < table.shape()[0],
            "RaggedSequenceLengths: row {} of a widths table of {} rows",
            self.row,
            table.shape()[0]
        );
        let mut lengths: Vec<i64> = table.row(self.row).to_vec();
        if let Some(given) = inputs.get(1) {
            let given = given.cast_to::<i64>()?;
            let given = given.to_plain_array_view::<i64>()?;
            ensure!(
                given.len() == lengths.len(),
                "RaggedSequenceLengths: {} lengths given for {} samples",
                given.len(),
                lengths.len()
            );
            for (l, g) in lengths.iter_mut().zip(given.iter()) {
                *l = (*l).min(*g);
            }
        }
        let lengths = lengths
            .into_iter()
            .map(|l| i32::try_from(l).context("a sequence length beyond 32 bits"))
            .collect::<TractResult<Vec<i32>>>()?;
        Ok(tvec!(tensor1(&lengths).into_tvalue()))
    }
}

impl TypedOp for SequenceLengths {
    /// One pass writing its output: what it costs beside the ops that do the work.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        Ok(crate::ops::written(&self.output_facts(inputs)?[0]))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        ensure!(
            inputs[0].rank() == 2 && (inputs.len() == 1 || inputs[1].rank() == 1),
            "RaggedSequenceLengths: a [K, N] table and [N] lengths"
        );
        Ok(tvec!(i32::fact([inputs[0].shape[1].clone()])))
    }

    as_op!();
}
