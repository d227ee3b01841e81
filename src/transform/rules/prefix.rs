//! Positions computed from the padded extent: tensors of no sample, sized by the padded
//! extent of a ragged axis, whose value at a position does not depend on that extent.
//!
//! A token encoder numbers its positions from its own input's shape: `Range(0, L)` into a
//! position table, or a constant buffer of position ids cut to `L`
//! (`position_ids[:, :L]`). In a batch `L` is the padded length; each sample alone has its
//! own, and its positions `0..w` are the batch's first `w`: what the transform calls a
//! **prefix** tensor ([`Rewriter::prefixes`]). It may go through ops that keep each
//! position's value its own (carried ops, a gather of its values from a constant table),
//! and broadcasts over the batch where it meets the samples' tensors, its axis then one
//! of their ragged axes ([`super::carry`]). Anything else reading it (a reduction over
//! it, a window along it) would see positions no sample has, and is refused by name.

use tract_core::internal::*;
use tract_core::ops::array::{Gather, Range, Slice};
use tract_core::ops::binary::TypedBinOp;
use tract_core::ops::cast::Cast;
use tract_core::ops::element_wise::ElementWiseOp;

use super::wire_as;
use crate::ops::RaggedAxis;
use crate::transform::Class;
use crate::transform::rewrite::Rewriter;

/// Whether `node`, reading no tensor of the samples, makes a prefix tensor: a `Range` of
/// the padded extent, a constant sliced from 0 to it, or a carried op over prefix
/// tensors. Wired then, returning true; false leaves the node to the other rules.
pub fn rewrite(rw: &mut Rewriter, node: &TypedNode, inputs: &[OutletId]) -> TractResult<bool> {
    let op: &dyn TypedOp = node.op.as_ref();
    if let Some(range) = op.downcast_ref::<Range>() {
        return self::range(rw, node, range, inputs);
    }
    if let Some(slice) = op.downcast_ref::<Slice>()
        && !rw.prefixes.contains_key(&inputs[0])
    {
        let Some(row) = rw.row_of_extent(&slice.end) else {
            return Ok(false);
        };
        if slice.start != TDim::from(0) {
            bail!(
                "mixing op: it cuts a constant from {} to the padded extent {}: its positions \
                 would not line up with the samples'",
                slice.start,
                slice.end
            );
        }
        let wire = wire_as(rw, node, slice.clone(), inputs)?[0];
        rw.prefixes.insert(
            wire,
            tvec!(RaggedAxis {
                axis: slice.axis,
                row
            }),
        );
        rw.record(node, Class::Carried);
        return Ok(true);
    }
    if !inputs.iter().any(|i| rw.prefixes.contains_key(i)) {
        return Ok(false);
    }
    let carried = op.is::<AxisOp>()
        || op.is::<Cast>()
        || op.is::<ElementWiseOp>()
        || op.is::<TypedBinOp>()
        || op
            .downcast_ref::<Gather>()
            .is_some_and(|_| !rw.prefixes.contains_key(&inputs[0]));
    ensure!(
        carried,
        "mixing op: it reads values computed from the padded extent (positions 0..L of a \
         Range or a cut constant) other than position by position"
    );
    carry(rw, node, inputs)?;
    Ok(true)
}

/// `Range(start, end, step)` of the padded extent's length: its positions.
fn range(
    rw: &mut Rewriter,
    node: &TypedNode,
    range: &Range,
    inputs: &[OutletId],
) -> TractResult<bool> {
    let wire = wire_as(rw, node, range.clone(), inputs)?[0];
    let len = rw.fact(wire)?.shape[0].clone();
    if !rw.depends_on_ragged(&len) {
        // Sized by constants: nothing of the batch.
        rw.record(node, Class::Untouched);
        return Ok(true);
    }
    let row = rw.row_of_extent(&len).with_context(|| {
        format!(
            "mixing op: a range of length {len}, computed from the padded extent but not equal \
             to it: its positions would not line up with the samples'"
        )
    })?;
    rw.prefixes.insert(wire, tvec!(RaggedAxis { axis: 0, row }));
    rw.record(node, Class::Carried);
    Ok(true)
}

/// A carried op over prefix tensors and constants: each prefix axis followed through the
/// op's axes mapping; a constant must not span one.
fn carry(rw: &mut Rewriter, node: &TypedNode, inputs: &[OutletId]) -> TractResult<()> {
    let in_facts: TVec<TypedFact> = inputs
        .iter()
        .map(|i| rw.fact(*i).cloned())
        .collect::<TractResult<_>>()?;
    let in_refs: TVec<&TypedFact> = in_facts.iter().collect();
    let out_facts = node.op.output_facts(&in_refs)?;
    let out_refs: TVec<&TypedFact> = out_facts.iter().collect();
    let mapping = node.op.axes_mapping(&in_refs, &out_refs)?;
    let mut axes: TVec<RaggedAxis> = tvec!();
    for (slot, input) in inputs.iter().enumerate() {
        let Some(prefix) = rw.prefixes.get(input).cloned() else {
            continue;
        };
        for r in prefix {
            let axis = mapping
                .track_axis((InOut::In(slot), r.axis), InOut::Out(0))?
                .context("mixing op: it does not carry the positions' axis through")?;
            match axes.iter().find(|a| a.axis == axis) {
                Some(a) => rw.meet(a.row, r.row, &node.name)?,
                None => axes.push(RaggedAxis { axis, row: r.row }),
            }
        }
    }
    for r in &axes {
        let linked = mapping.axis((InOut::Out(0), r.axis))?;
        for (slot, positions) in linked.inputs.iter().enumerate() {
            let prefix = rw.prefixes.get(&inputs[slot]);
            for &p in positions {
                let carries = prefix.is_some_and(|axes| axes.iter().any(|a| a.axis == p));
                ensure!(
                    carries || in_facts[slot].shape[p].is_one(),
                    "mixing op: input {slot} spans the positions' axis with extent {} but does \
                     not hold positions",
                    in_facts[slot].shape[p]
                );
            }
        }
    }
    let wires = wire_as(rw, node, node.op.clone(), inputs)?;
    rw.prefixes.insert(wires[0], axes);
    rw.record(node, Class::Carried);
    Ok(())
}
