//! Cumulative sums (ONNX CumSum) along an axis: RoBERTa and XLM-R exports number their
//! positions by one along the tokens the mask keeps (`cumsum(mask, 1) * mask`).
//!
//! Along a ragged axis, forward, position t sums positions 0..=t (0..t when exclusive):
//! inside a sample's width when t is, so its prefix is what the sample alone computes.
//! Reverse, position t sums t.. the padded end: with the padded region at zero that is
//! t.. the sample's own end, as alone, so the input is masked to zero first. Along the
//! batch axis it would add samples together: refused. Along any other axis it is carried
//! position by position of the sample axes.

use tract_core::internal::*;
use tract_core::ops::array::CumSum;

use super::super::Class;
use super::super::rewrite::{Layout, Rewriter};
use super::{input_layout, wire_as};
use crate::error::Mixing;
use crate::ops::Fill;

pub fn cumsum(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &CumSum,
    inputs: &[OutletId],
) -> TractResult<()> {
    let layout = input_layout(rw, inputs[0])?;
    ensure!(
        op.axis != layout.axes.batch,
        Mixing("a cumulative sum along the batch axis adds the samples together".into())
    );
    let mut inputs: TVec<OutletId> = inputs.into();
    if op.reverse && layout.axes.ragged_at(op.axis).is_some() {
        inputs[0] = rw.masked(inputs[0], Fill::Zero)?;
    }
    // Same shape, same sample axes; the padded region holds partial sums.
    let wires = wire_as(rw, node, node.op.clone(), &inputs)?;
    rw.set_layout(wires[0], Layout::new(layout.axes));
    rw.record(node, Class::Carried);
    Ok(())
}
