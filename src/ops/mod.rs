//! The ops the ragged transform inserts, with their CPU evaluation.
//!
//! Every op here reads the **widths table**: one i64 tensor of shape `[K, N]`, row `k`
//! holding, for each of the N samples, its width at the tensors whose ragged axis is
//! described by the transform's k-th width function (`crate::transform::width`).
//! The table is computed once per run, on the host, by [`WidthTable`] from the widths
//! input; every mask and masked op takes it as its last input and picks its rows. So the
//! widths cross to a device once per run, not once per op.
//!
//! - [`WidthTable`]: input widths to the table.
//! - [`PerSampleDim`]: a value the model computes from the padded width (the divisor of a
//!   global average pool, say), evaluated at each sample's own width instead.
//! - [`SampleCount`]: a sample's own count of cells over ragged axes, the divisor of a
//!   mean in a model typed per shape.
//! - [`Mask`]: writes a fill value over the padded region (0 before a conv, -inf before
//!   a max pool), so that the dense op that follows reads there what a sample alone
//!   reads past its border.
//! - [`EdgeFill`]: a sample's last valid value over its padded region, before an op that
//!   clamps its reads to the extent (a linear resize).
//! - [`ResamplePlan`], [`SampleResample`]: a resize whose reads depend on the extents
//!   (`align_corners`, `exclude_outside`, antialiasing), each sample by its own plan.
//! - [`MaskedSoftmax`]: softmax over the valid prefix of a ragged axis.
//! - [`MaskedAvgPool`]: average pooling whose divisor counts a sample's own cells.
//! - [`SequenceLengths`]: each sample's width as a recurrence's sequence lengths.
//! - [`Recurrence`]: an ONNX LSTM, GRU or RNN run to each sample's own length (the
//!   model's recurrences load as this op, [`crate::load`]).
//! - [`TopK`]: the top k of each row along an output's last axis, for outputs reduced
//!   where they are computed ([`crate::RaggedModel::with_top_k`]).

use tract_core::internal::*;
use tract_core::ndarray::ArrayView2;

mod count;
mod edge;
mod lengths;
mod mask;
mod pooling;
pub mod recurrence;
pub mod resample;
mod softmax;
mod top_k;
mod widths;

/// The cost of writing `fact` once: ops that move or fill values rather than compute.
pub fn written(fact: &TypedFact) -> TVec<(Cost, TDim)> {
    tvec!((Cost::Buffer(fact.datum_type), fact.shape.volume()))
}

pub use count::SampleCount;
pub use edge::EdgeFill;
pub use lengths::SequenceLengths;
pub use mask::{Fill, Mask};
pub use pooling::MaskedAvgPool;
pub use recurrence::Recurrence;
pub use resample::{ResamplePlan, SampleResample};
pub use softmax::MaskedSoftmax;
pub use top_k::{TopK, top_k_row};
pub use widths::{PerSampleDim, WidthTable};

/// One ragged axis of a tensor, and the row of the widths table that holds its widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RaggedAxis {
    pub axis: usize,
    pub row: usize,
}

/// Where the samples lie in a tensor: the batch axis, and the ragged axes (none for a
/// per-sample tensor such as the output of a global pool; two for attention scores,
/// queries by keys).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SampleAxes {
    pub batch: usize,
    pub ragged: TVec<RaggedAxis>,
}

impl SampleAxes {
    /// The ragged axis at `axis`, if it is one.
    pub fn ragged_at(&self, axis: usize) -> Option<RaggedAxis> {
        self.ragged.iter().copied().find(|r| r.axis == axis)
    }

    /// Checks a concrete tensor against the table: the batch has as many samples as the
    /// table, and no width exceeds the padded extent of its axis.
    fn check(&self, shape: &[usize], table: &ArrayView2<i64>, op: &str) -> TractResult<()> {
        let n = shape[self.batch];
        ensure!(
            table.shape()[1] == n,
            "{op}: the batch holds {n} samples along axis {} but the widths hold {}",
            self.batch,
            table.shape()[1]
        );
        for r in &self.ragged {
            for (sample, w) in table.row(r.row).iter().enumerate() {
                ensure!(
                    *w >= 0 && *w as usize <= shape[r.axis],
                    "{op}: sample {sample} has width {w} along axis {}, whose padded extent is {}",
                    r.axis,
                    shape[r.axis]
                );
            }
        }
        Ok(())
    }
}

/// The widths table of a run, as a `[K, N]` view.
fn table_view(table: &TValue) -> TractResult<ArrayView2<'_, i64>> {
    let view = table.to_plain_array_view::<i64>()?;
    Ok(view.into_dimensionality()?)
}

/// The fact of the widths table for `rows` width functions and a batch of `n` samples.
pub fn table_fact(rows: usize, n: TDim) -> TypedFact {
    i64::fact([rows.to_dim(), n])
}
