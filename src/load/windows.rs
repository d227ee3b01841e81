//! A window of a table cut at an offset that moves with the padded extent, then
//! gathered: gathered instead from the whole table, at indices shifted by the offset.
//!
//! DeBERTa's relative attention cuts its table of `2M` relative-position embeddings to
//! the `2s` rows around its middle, `s = min(L, M)` (`rel_embeddings[M - s .. M + s]`),
//! projects them, multiplies them with the queries, and gathers the products along the
//! cut axis at `clamp(i - j + s, 0, 2s - 1)`. The window moves with the padded length
//! `L`: in a batch its row `k` is not row `k` of what a sample alone cuts, and the ragged
//! transform cannot carry a value of no sample sized by `L` that is not a prefix of
//! itself.
//!
//! Every op between the cut and the gathers computes each row along the cut axis from
//! that row alone (axis ops that keep the axis, pointwise ops with the other operands of
//! extent one there, products under one label the output keeps). So the values computed
//! on the whole table hold the window's row `k` at row `start + k`, and gathering them at
//! `index + start` reads the very values the model gathered, at every index: exact for
//! any input, not only on the samples' valid regions. What is left depends on `L` only
//! through the indices, position arithmetic the transform evaluates at several lengths
//! like any other (`transform::rules::prefix`): DeBERTa's become `M + i - j` on every
//! sample's valid region, whatever the padded length. The cost: products over the `2M`
//! rows instead of `2s`.
//!
//! Only a slice of a value that reads no input, at symbolic bounds, is rewritten, and
//! only when each of its uses leads through such ops to a `GatherElements` along the cut
//! axis. Anything else is left as it is.

use tract_core::internal::*;
use tract_core::ops::array::{GatherElements, Slice};
use tract_core::ops::binary::TypedBinOp;
use tract_core::ops::cast::{Cast, cast};
use tract_core::ops::einsum::EinSum;
use tract_core::ops::element_wise::ElementWiseOp;

use crate::evaluate::reads_no_input;

/// Rewrites every window of a table cut at a symbolic offset and gathered along the cut
/// into a gather from the whole table; how many windows were.
pub fn windows_gathered_whole(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        if let Some(window) = window(model, id)? {
            whole(model, id, &window)?.apply(model)?;
            done += 1;
        }
    }
    Ok(done)
}

/// A slice's window: where its rows go down to the gathers.
struct Window {
    /// The window's first row in the table.
    start: TDim,
    /// The nodes computing from the window, in evaluation order, gathers included.
    nodes: Vec<usize>,
}

fn window(model: &TypedModel, id: usize) -> TractResult<Option<Window>> {
    let node = model.node(id);
    let Some(slice) = node.op_as::<Slice>() else {
        return Ok(None);
    };
    let table = model.outlet_fact(node.inputs[0])?;
    let moving = !slice.start.symbols().is_empty() || !slice.end.symbols().is_empty();
    if !moving
        || table.shape[slice.axis].as_i64().is_none()
        || !reads_no_input(model, node.inputs[0])
    {
        return Ok(None);
    }
    // Where the cut axis is in each value computed from the window.
    let mut rows: HashMap<OutletId, usize> = HashMap::default();
    rows.insert(OutletId::new(id, 0), slice.axis);
    let mut nodes = vec![];
    let mut gathers = 0;
    for n in model.eval_order()? {
        let succ = model.node(n);
        let along: TVec<Option<usize>> = succ.inputs.iter().map(|i| rows.get(i).copied()).collect();
        if along.iter().all(Option::is_none) {
            continue;
        }
        let Some(out) = row_axis(model, succ, &along)? else {
            return Ok(None);
        };
        nodes.push(n);
        match out {
            Some(axis) => {
                rows.insert(OutletId::new(n, 0), axis);
            }
            None => gathers += 1,
        }
    }
    let kept_inside = rows.keys().all(|outlet| {
        !model.outputs.contains(outlet)
            && model
                .outlet_successors(*outlet)
                .iter()
                .all(|s| nodes.contains(&s.node))
    });
    if gathers == 0 || !kept_inside {
        return Ok(None);
    }
    Ok(Some(Window {
        start: slice.start.clone(),
        nodes,
    }))
}

/// For a node reading the window's rows (`along`: the cut axis of each input computed
/// from the window): `Some(Some(axis))` where its one output holds them, row by row;
/// `Some(None)` for a gather of them along the cut; `None` for anything else.
fn row_axis(
    model: &TypedModel,
    node: &TypedNode,
    along: &[Option<usize>],
) -> TractResult<Option<Option<usize>>> {
    let op: &dyn TypedOp = node.op.as_ref();
    if node.outputs.len() != 1 {
        return Ok(None);
    }
    if let Some(gather) = op.downcast_ref::<GatherElements>() {
        let gathered = along.first().copied().flatten() == Some(gather.axis) && along[1].is_none();
        return Ok(gathered.then_some(None));
    }
    if let Some(einsum) = op.downcast_ref::<EinSum>() {
        return Ok(einsum_axis(einsum, along).map(Some));
    }
    // Pointwise: the operands not computed from the window are one row, broadcast.
    let mut axes = along.iter().flatten();
    let Some(&axis) = axes.next() else {
        return Ok(None);
    };
    if axes.any(|a| *a != axis) {
        return Ok(None);
    }
    if let Some(axis_op) = op.downcast_ref::<AxisOp>() {
        return Ok(axis_op.transform_axis(axis).map(Some));
    }
    let pointwise = op.is::<Cast>() || op.is::<ElementWiseOp>() || op.is::<TypedBinOp>();
    if !pointwise {
        return Ok(None);
    }
    for (slot, a) in along.iter().enumerate() {
        if a.is_none() {
            let fact = model.outlet_fact(node.inputs[slot])?;
            if fact.rank() != node.outputs[0].fact.rank() || !fact.shape[axis].is_one() {
                return Ok(None);
            }
        }
    }
    Ok(Some(Some(axis)))
}

/// Where an `EinSum` puts an axis some of its inputs have (`along`: its position in each
/// of them): under one label in all of them, which the other inputs lack and the output
/// keeps (the window's rows here, a merged axis in [`super::reshapes`]). A quantized
/// product's zero points and scales are inputs like the others: per tensor (no labels)
/// they lack the axis, per row they carry its label and are taken only from the region.
pub(super) fn einsum_axis(op: &EinSum, along: &[Option<usize>]) -> Option<usize> {
    let (ins, outs) = op.axes.to_strs();
    let mut label = None;
    for (slot, axis) in along.iter().enumerate() {
        let Some(axis) = axis else {
            continue;
        };
        let c = ins.get(slot)?.chars().nth(*axis)?;
        if label.is_some_and(|l| l != c) {
            return None;
        }
        label = Some(c);
    }
    let label = label?;
    for (slot, axis) in along.iter().enumerate() {
        if axis.is_none() && ins.get(slot)?.contains(label) {
            return None;
        }
    }
    outs.first()?.chars().position(|c| c == label)
}

/// The window's nodes wired again over the whole table, each gather at its indices plus
/// the window's start.
fn whole(model: &TypedModel, id: usize, window: &Window) -> TractResult<TypedModelPatch> {
    let mut patch = TypedModelPatch::default();
    let mut map: HashMap<OutletId, OutletId> = HashMap::default();
    let table = patch.tap_model(model, model.node(id).inputs[0])?;
    map.insert(OutletId::new(id, 0), table);
    for &n in &window.nodes {
        let node = model.node(n);
        let mut inputs: TVec<OutletId> = tvec![];
        for i in &node.inputs {
            inputs.push(match map.get(i) {
                Some(o) => *o,
                None => patch.tap_model(model, *i)?,
            });
        }
        let name = format!("{}.whole_table", node.name);
        if node.op_is::<GatherElements>() {
            let indices = patch.outlet_fact(inputs[1])?.clone();
            let start = tensor0(window.start.clone()).broadcast_into_rank(indices.rank())?;
            let mut start = patch.add_const(format!("{name}.start"), start)?;
            if indices.datum_type != TDim::datum_type() {
                start = patch.wire_node(
                    format!("{name}.start_as_index"),
                    cast(indices.datum_type),
                    &[start],
                )?[0];
            }
            let mut shifted = patch.wire_node(
                format!("{name}.indices"),
                tract_core::ops::math::add(),
                &[inputs[1], start],
            )?[0];
            if indices.datum_type == TDim::datum_type() {
                // Position arithmetic over the padded length: a plan over symbols
                // evaluates it at the run's symbols only through a cast (a gather casts
                // its indices with none).
                shifted = patch.wire_node(
                    format!("{name}.indices_as_i64"),
                    cast(i64::datum_type()),
                    &[shifted],
                )?[0];
            }
            let gathered = patch.wire_node(name, node.op.clone(), &[inputs[0], shifted])?[0];
            patch.shunt_outside(model, OutletId::new(n, 0), gathered)?;
        } else {
            let wire = patch.wire_node(name, node.op.clone(), &inputs)?[0];
            map.insert(OutletId::new(n, 0), wire);
        }
    }
    Ok(patch)
}
