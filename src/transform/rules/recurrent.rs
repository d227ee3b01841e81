//! Recurrences over the ragged axis: each sample runs to its own width.
//!
//! A [`Recurrence`] whose sequence axis is the ragged axis gets each sample's width as
//! its length (the smaller of the two when the model gives `sequence_lens` of its own):
//! alone, a sample runs exactly its own steps, the reverse direction starting at its own
//! end, so in the batch its state must never run through the padded region. Nothing is
//! masked before it (the op never reads `X` past a length), and `Y` is zero past it.
//!
//! A recurrence reading the ragged axis as anything but its sequence (its features) is
//! refused: its products would sum over the padded region. One over another axis, its
//! input carrying only the batch, is carried: it runs per sample as it is.

use tract_core::internal::*;

use super::wire_as;
use crate::error::Mixing;
use crate::ops::SequenceLengths;
use crate::ops::recurrence::{Inputs, Recurrence};
use crate::ops::{RaggedAxis, SampleAxes};
use crate::transform::Class;
use crate::transform::rewrite::{Layout, Rewriter};

pub fn recurrence(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &Recurrence,
    inputs: &[OutletId],
) -> TractResult<()> {
    let name = op.cell.name();
    let slots = op.inputs.slots();
    let (seq, batch) = op.x_axes();
    let x = rw.layout(inputs[0]).cloned().with_context(|| {
        Mixing(format!("the {name}'s input X does not derive from the ragged input but another of its inputs does"))
    })?;
    ensure!(
        x.axes.batch == batch,
        Mixing(format!(
            "the samples lie along axis {} of the {name}'s input, its batch axis is {batch}",
            x.axes.batch
        ))
    );
    let mut row = None;
    for r in &x.axes.ragged {
        ensure!(
            r.axis == seq,
            Mixing(format!(
                "the {name} reads the ragged axis as axis {} of its input, not as its \
             sequence (axis {seq}): its products would sum over the padded region",
                r.axis
            ))
        );
        row = Some(r.row);
    }
    for (slot, what) in [
        (Some(1), "W"),
        (Some(2), "R"),
        (slots.bias, "B"),
        (slots.peepholes, "P"),
    ] {
        if let Some(s) = slot {
            ensure!(
                rw.layout(inputs[s]).is_none(),
                Mixing(format!(
                    "the {name}'s weights {what} derive from the ragged input"
                ))
            );
        }
    }
    for (slot, what, axis) in [
        (slots.initial_h, "initial_h", op.state_batch_axis()),
        (slots.initial_c, "initial_c", op.state_batch_axis()),
        (slots.lengths, "sequence_lens", 0),
    ] {
        if let Some(layout) = slot.and_then(|s| rw.layout(inputs[s])) {
            ensure!(
                layout.axes.batch == axis && layout.axes.ragged.is_empty(),
                Mixing(format!(
                    "the {name}'s {what} holds its samples along axis {} (expected \
                 {axis}) or carries the ragged axis",
                    layout.axes.batch
                ))
            );
        }
    }
    let (ragged_op, wired) = match row {
        Some(row) => with_lengths(rw, node, op, inputs, row)?,
        None => (op.clone(), inputs.into()),
    };
    let wires = wire_as(rw, node, ragged_op, &wired)?;
    let mut y = Layout::new(SampleAxes {
        batch: op.y_batch_axis(),
        ragged: row
            .map(|row| tvec!(RaggedAxis { axis: seq, row }))
            .unwrap_or_default(),
    });
    if row.is_some() {
        // Y is zero past each sample's length.
        y.fill = Some(Tensor::zero_scalar_dt(rw.fact(wires[0])?.datum_type)?.into_arc_tensor());
    }
    rw.set_layout(wires[0], y);
    for w in &wires[1..] {
        rw.set_layout(
            *w,
            Layout::new(SampleAxes {
                batch: op.state_batch_axis(),
                ragged: tvec!(),
            }),
        );
    }
    rw.record(node, Class::Recurrent);
    Ok(())
}

/// `op` taking each sample's width at row `row` of the widths table as its lengths (the
/// smaller of them and the model's own, when it has them), and its inputs then.
fn with_lengths(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &Recurrence,
    inputs: &[OutletId],
    row: usize,
) -> TractResult<(Recurrence, TVec<OutletId>)> {
    let old = op.inputs.slots();
    let mut lengths_inputs = tvec!(rw.table);
    lengths_inputs.extend(old.lengths.map(|s| inputs[s]));
    let name = rw.unique_name(&format!("{}.lengths", node.name));
    let lengths = rw
        .target
        .wire_node(name, SequenceLengths { row }, &lengths_inputs)?[0];
    let mut ragged = op.clone();
    ragged.inputs = Inputs {
        lengths: true,
        ..op.inputs
    };
    let input = |slot: Option<usize>| slot.map(|s| inputs[s]);
    let mut wired: TVec<OutletId> = inputs[..3].into();
    wired.extend(input(old.bias));
    wired.push(lengths);
    wired.extend(input(old.initial_h));
    wired.extend(input(old.initial_c));
    wired.extend(input(old.peepholes));
    ensure!(wired.len() == ragged.inputs.slots().count);
    Ok((ragged, wired))
}
