//! Outputs reduced where they are computed: the top k of each row along an output's last
//! axis (its classes), for users who read only that.
//!
//! A recogniser gives, for every step of every line, a probability per class: 6625 floats
//! a step for PP-OCRv4 rec, 200 MB for 112 lines, where a CTC decoder reads the best class
//! of each step and a confidence. Brought back whole, they cost a device-to-host copy and
//! the host's crops; reduced in the plan ([`crate::ops::TopK`], on the device on
//! ragged-cuda), only `k` values and positions a row cross back. Opt-in
//! ([`crate::RaggedModel::with_top_k`], CLI `--top-k K`); whole outputs stay the default.
//!
//! Each output `o` of the model becomes two, `o`'s top-k values then their positions
//! (i64), shaped as `o` with its last axis of extent `k`; they keep `o`'s batch and ragged
//! axes, so they are cropped per sample as `o` was. The widths outputs follow. The same
//! reduction is applied to the original model, so one by one and naive padding give the
//! same outputs to compare.

use tract_core::internal::*;

use crate::ops::TopK;
use crate::transform::OutputLayout;

/// Replaces each of the first `own` outputs of `model` by its top `k` values and their
/// positions along its last axis (module doc); the outputs past `own` follow them.
pub fn top_k_outputs(model: &mut TypedModel, own: usize, k: usize) -> TractResult<()> {
    ensure!(k >= 1, "the top 0 of an output");
    let outputs = model.output_outlets()?.to_vec();
    let mut reduced = vec![];
    let mut labels = vec![];
    for (ix, outlet) in outputs.iter().take(own).enumerate() {
        let name = format!("{}.top_{k}", model.node(outlet.node).name);
        let label = model
            .outlet_label(*outlet)
            .map(|l| l.to_string())
            .unwrap_or_else(|| model.node(outlet.node).name.clone());
        let wires = model
            .wire_node(&name, TopK { k }, &[*outlet])
            .with_context(|| format!("The top {k} of output {ix}"))?;
        // Named after the output they reduce: `o.top_k.values`, `o.top_k.indices`.
        labels.push((wires[0], format!("{label}.top_{k}.values")));
        labels.push((wires[1], format!("{label}.top_{k}.indices")));
        reduced.extend(wires);
    }
    reduced.extend(outputs.iter().skip(own).copied());
    model.select_output_outlets(&reduced)?;
    for (wire, label) in labels {
        model.set_outlet_label(wire, label)?;
    }
    Ok(())
}

/// The layouts of the outputs [`top_k_outputs`] makes from outputs of `layouts`: each
/// twice, the widths outputs they point to moved past the added ones. Fails for an output
/// whose last axis is its batch axis or a ragged one.
pub fn top_k_layouts(layouts: &[OutputLayout], ranks: &[usize]) -> TractResult<Vec<OutputLayout>> {
    let own = layouts.len();
    let mut out = vec![];
    for (ix, (layout, rank)) in layouts.iter().zip(ranks).enumerate() {
        let last = rank
            .checked_sub(1)
            .with_context(|| format!("output {ix} is a scalar"))?;
        ensure!(
            layout.batch != Some(last) && layout.ragged.iter().all(|r| r.axis != last),
            "output {ix}: its last axis is the batch or a ragged axis, not classes to take \
             the top of"
        );
        let mut moved = layout.clone();
        for r in &mut moved.ragged {
            r.widths_output += own;
        }
        out.push(moved.clone());
        out.push(moved);
    }
    Ok(out)
}
