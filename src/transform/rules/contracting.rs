//! Einsums (matmuls, 1x1 convs after declutter, attention products).
//!
//! Each sample axis of an input is followed by its label. A label reaching the output is
//! carried there: a matmul with W as its M axis, attention's scores carrying the axis
//! twice (queries by keys), each with its own label. A ragged label summed away is a
//! contraction over the axis: every operand carrying it is masked to 0 along it, so the
//! padded positions add nothing (one zero operand is not enough: 0 times a NaN of garbage
//! is NaN). The batch label must reach the output.

use tract_core::internal::*;
use tract_core::ops::einsum::EinSum;

use super::wire_as;
use crate::error::Mixing;
use crate::ops::{Fill, RaggedAxis, SampleAxes};
use crate::transform::Class;
use crate::transform::rewrite::{Layout, Rewriter};

pub fn einsum(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &EinSum,
    inputs: &[OutletId],
) -> TractResult<()> {
    let mapping = &op.axes;
    let mut out: Option<SampleAxes> = None;
    let mut contracted: TVec<(char, usize)> = tvec!();
    for (slot, input) in inputs.iter().enumerate() {
        let Some(layout) = rw.layout(*input).cloned() else {
            continue;
        };
        let batch = mapping.axis((InOut::In(slot), layout.axes.batch))?;
        let batch_out = *batch.outputs[0].first().with_context(|| {
            Mixing(format!(
                "it sums over the batch axis (label {}), folding samples",
                batch.repr
            ))
        })?;
        let axes = out.get_or_insert(SampleAxes {
            batch: batch_out,
            ragged: tvec!(),
        });
        ensure!(
            axes.batch == batch_out,
            "its inputs disagree on where the batch axis is"
        );
        for r in &layout.axes.ragged {
            let label = mapping.axis((InOut::In(slot), r.axis))?;
            match label.outputs[0].first() {
                Some(&axis) => match axes.ragged_at(axis) {
                    Some(existing) => ensure!(
                        rw.rows[existing.row].same_as(&rw.rows[r.row]),
                        Mixing(format!(
                            "operands of different widths meet along label {}",
                            label.repr
                        ))
                    ),
                    None => axes.ragged.push(RaggedAxis { axis, row: r.row }),
                },
                None => {
                    if let Some((_, row)) = contracted.iter().find(|(l, _)| *l == label.repr) {
                        ensure!(
                            rw.rows[*row].same_as(&rw.rows[r.row]),
                            Mixing(format!(
                                "operands of different widths are contracted along label {}",
                                label.repr
                            ))
                        );
                    } else {
                        contracted.push((label.repr, r.row));
                    }
                }
            }
        }
    }
    let axes = out.context("no input is batched")?;
    // Every operand holding a sample label must carry the sample axis there, or broadcast.
    let labels = std::iter::once(mapping.axis((InOut::Out(0), axes.batch))?.repr)
        .chain(
            axes.ragged
                .iter()
                .map(|r| mapping.axis((InOut::Out(0), r.axis)).map(|a| a.repr))
                .collect::<TractResult<TVec<_>>>()?,
        )
        .chain(contracted.iter().map(|(l, _)| *l));
    for label in labels.collect::<TVec<char>>() {
        let axis = mapping.axis(label)?;
        for (slot, positions) in axis.inputs.iter().enumerate() {
            for &p in positions {
                let layout = rw.layout(inputs[slot]);
                let carries =
                    layout.is_some_and(|l| l.axes.batch == p || l.axes.ragged_at(p).is_some());
                ensure!(
                    carries || rw.fact(inputs[slot])?.shape[p].is_one(),
                    Mixing(format!(
                        "operand {slot} spans sample axis {label} without deriving from \
                     the ragged input"
                    ))
                );
            }
        }
    }
    let mut wired = inputs.to_vec();
    if !contracted.is_empty() {
        ensure!(
            op.q_params.is_none(),
            "a quantized contraction over the ragged axis is not supported"
        );
        for (slot, input) in inputs.iter().enumerate() {
            let touches = contracted.iter().any(|(label, _)| {
                mapping
                    .axis(*label)
                    .is_ok_and(|a| !a.inputs[slot].is_empty())
            });
            if touches {
                wired[slot] = rw.masked(*input, Fill::Zero)?;
            }
        }
    }
    let wire = wire_as(rw, node, op.clone(), &wired)?[0];
    rw.set_layout(wire, Layout::new(axes));
    rw.record(
        node,
        if contracted.is_empty() {
            Class::Carried
        } else {
            Class::Contracting
        },
    );
    Ok(())
}
