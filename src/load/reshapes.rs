//! Axes merged and split back: no reshape at all.
//!
//! Exporters merge axes for a moment and split them back:
//! - torch's dynamo exporter transposes attention's keys through 3-D views, `[N, H, L, D]`
//!   reshaped to `[N*H, L, D]`, transposed, reshaped back to `[N, H, D, L]`;
//! - `GroupNorm(1, C)` (Conv-TasNet's global layer norm) is a reshape of `[N, C, T]` to
//!   `[N, 1, C*T]`, an instance norm over the merged axis (sums over it, element-wise ops,
//!   statistics broadcast back along it), and a reshape back to `[N, C, T]`.
//!
//! The merged axis holds the batch, or a ragged axis with others: the ragged transform
//! cannot follow samples or their widths through it, though what happens in between is
//! axis by axis (moves, additions and removals of other axes, element-wise ops) or a
//! reduction over the whole merged axis, which is a reduction over all the axes merged.
//! Such a region, from the merge to the reshapes splitting it back into the same axes, is
//! rewritten on the unmerged tensor: a sum over the merged `C*T` becomes a sum over `C`
//! and `T`, which the transform masks and divides per sample like any other.

use tract_core::internal::*;
use tract_core::ops::binary::TypedBinOp;
use tract_core::ops::element_wise::ElementWiseOp;
use tract_core::ops::logic::Iff;
use tract_core::ops::nn::{Reduce, Reducer};

/// Rewrites every merge of axes split back the same way, with what lies between, on the
/// unmerged tensor; how many were.
pub fn merges_split_back(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    let mut tried: std::collections::HashSet<usize> = Default::default();
    loop {
        let mut found = None;
        for id in model.eval_order()? {
            if tried.contains(&id) {
                continue;
            }
            if let Some(region) = region(model, id)? {
                found = Some(region);
                break;
            }
            tried.insert(id);
        }
        let Some(region) = found else {
            return Ok(done);
        };
        unmerged(model, &region)?.apply(model)?;
        tried.clear();
        done += 1;
    }
}

/// What a wire of the region holds: the merged axis at `position`, whole or reduced to
/// one (keeping its place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Merged {
    position: usize,
    reduced: bool,
}

/// A merge (`merge`, a reshape of `dims` into one axis) and the nodes after it up to and
/// including the reshapes splitting it back, in evaluation order.
struct Region {
    merge: usize,
    dims: TVec<TDim>,
    nodes: Vec<usize>,
}

fn region(model: &TypedModel, id: usize) -> TractResult<Option<Region>> {
    let node = model.node(id);
    let Some(AxisOp::Reshape(at, from, to)) = node.op_as::<AxisOp>() else {
        return Ok(None);
    };
    if to.len() != 1 || from.iter().filter(|d| !d.is_one()).count() < 2 {
        return Ok(None);
    }
    let outputs = model.output_outlets()?;
    // The region, grown from the merge: every consumer of one of its wires must be of it.
    let mut wires: HashMap<OutletId, Merged> = HashMap::default();
    wires.insert(
        OutletId::new(id, 0),
        Merged {
            position: *at,
            reduced: false,
        },
    );
    let mut nodes = vec![];
    let mut splits = 0;
    for next in model.eval_order()? {
        let n = model.node(next);
        if next == id || !n.inputs.iter().any(|i| wires.contains_key(i)) {
            continue;
        }
        let ins: TVec<Option<Merged>> = n.inputs.iter().map(|i| wires.get(i).copied()).collect();
        let Some(out) = step(model, n, &ins, from)? else {
            return Ok(None);
        };
        nodes.push(next);
        match out {
            Some(merged) => {
                let outlet = OutletId::new(next, 0);
                if outputs.contains(&outlet) {
                    return Ok(None);
                }
                wires.insert(outlet, merged);
            }
            None => splits += 1,
        }
    }
    // Every wire of the region is consumed inside it (the splits' outputs leave it).
    for outlet in wires.keys() {
        for succ in &model.outlet_successors(*outlet).to_vec() {
            if !nodes.contains(&succ.node) {
                return Ok(None);
            }
        }
    }
    Ok((splits > 0).then_some(Region {
        merge: id,
        dims: from.clone(),
        nodes,
    }))
}

/// What `node`'s output holds given what its inputs hold (`None` for an input from
/// outside the region): `Some(Some(_))` a wire of the region, `Some(None)` a split back
/// into `dims`, `None` an op the region cannot take.
fn step(
    model: &TypedModel,
    node: &TypedNode,
    inputs: &[Option<Merged>],
    dims: &[TDim],
) -> TractResult<Option<Option<Merged>>> {
    let inside: Vec<Merged> = inputs.iter().flatten().copied().collect();
    let Some(first) = inside.first().copied() else {
        return Ok(None);
    };
    if inside.iter().any(|m| m.position != first.position) {
        return Ok(None);
    }
    let position = first.position;
    if let Some(op) = node.op_as::<AxisOp>() {
        return Ok(match op {
            AxisOp::Reshape(at, f, t) if *at == position && f.len() == 1 && &**t == dims => {
                (!first.reduced).then_some(None)
            }
            AxisOp::Reshape(..) => None,
            _ => follow(op, position, model.outlet_fact(node.inputs[0])?.rank())
                .map(|position| Some(Merged { position, ..first })),
        });
    }
    if let Some(reduce) = node.op_as::<Reduce>() {
        // An arg-max over the merged axis answers a flat index into it: not what it
        // answers over the axes apart.
        if reduce.axes.contains(&position)
            && matches!(reduce.reducer, Reducer::ArgMax(_) | Reducer::ArgMin(_))
        {
            return Ok(None);
        }
        return Ok(Some(Some(Merged {
            position,
            reduced: first.reduced || reduce.axes.contains(&position),
        })));
    }
    let pointwise = node.op_is::<ElementWiseOp>()
        || node.op_is::<TypedBinOp>()
        || node.op_is::<Iff>()
        || node.op_is::<tract_core::ops::cast::Cast>();
    if !pointwise {
        return Ok(None);
    }
    // Inputs from outside broadcast along the merged axis, as reduced ones do.
    for (slot, input) in inputs.iter().enumerate() {
        let fact = model.outlet_fact(node.inputs[slot])?;
        if input.is_none() && (fact.rank() <= position || !fact.shape[position].is_one()) {
            return Ok(None);
        }
    }
    Ok(Some(Some(Merged {
        position,
        reduced: inside.iter().all(|m| m.reduced),
    })))
}

/// Where `op` takes the axis at `position` (of a tensor of `rank`), `None` when it moves
/// or removes that axis itself.
fn follow(op: &AxisOp, position: usize, rank: usize) -> Option<usize> {
    let mut axes: Vec<bool> = (0..rank).map(|a| a == position).collect();
    match op {
        AxisOp::Add(a) => axes.insert(*a, false),
        AxisOp::Rm(a) => {
            if *a == position {
                return None;
            }
            axes.remove(*a);
        }
        AxisOp::Move(from, to) => {
            if *from == position {
                return None;
            }
            let moved = axes.remove(*from);
            axes.insert(*to, moved);
        }
        AxisOp::Reshape(..) => return None,
    }
    axes.iter().position(|is| *is)
}

/// The region's nodes on the unmerged tensor, the splits' outputs taken over.
fn unmerged(model: &TypedModel, region: &Region) -> TractResult<TypedModelPatch> {
    let mut patch = TypedModelPatch::default();
    let merge = model.node(region.merge);
    let k = region.dims.len();
    // Per wire of the region: its wire in the patch, and the merged axis' position in the
    // source (its `k` unmerged axes start there in the patch).
    let mut mapped: HashMap<OutletId, (OutletId, usize)> = HashMap::default();
    let Some(AxisOp::Reshape(at, ..)) = merge.op_as::<AxisOp>() else {
        bail!("the region does not start with a reshape");
    };
    let source = patch.tap_model(model, merge.inputs[0])?;
    mapped.insert(OutletId::new(region.merge, 0), (source, *at));
    // An axis of the source, in the patch: past the merged axis, `k - 1` further.
    let shift = |axis: usize, position: usize| if axis > position { axis + k - 1 } else { axis };
    for &id in &region.nodes {
        let node = model.node(id);
        let position = node
            .inputs
            .iter()
            .find_map(|i| mapped.get(i).map(|(_, p)| *p))
            .context("a node of the region reads none of it")?;
        let mut inputs: TVec<OutletId> = tvec!();
        for (slot, input) in node.inputs.iter().enumerate() {
            match mapped.get(input) {
                Some((wire, _)) => inputs.push(*wire),
                None => {
                    // From outside, one along the merged axis: `k - 1` more such axes.
                    let mut wire = patch.tap_model(model, *input)?;
                    for extra in 0..k - 1 {
                        wire = patch.wire_node(
                            format!("{}.unmerged_{slot}_{extra}", node.name),
                            AxisOp::Add(position),
                            &[wire],
                        )?[0];
                    }
                    inputs.push(wire);
                }
            }
        }
        let rank = model.outlet_fact(node.inputs[0])?.rank();
        let (op, out_position): (Box<dyn TypedOp>, Option<usize>) = if let Some(op) =
            node.op_as::<AxisOp>()
        {
            match op {
                AxisOp::Reshape(..) => {
                    // The split: the unmerged wire is its output.
                    patch.shunt_outside(model, OutletId::new(id, 0), inputs[0])?;
                    continue;
                }
                AxisOp::Add(a) => (
                    Box::new(AxisOp::Add(if *a <= position { *a } else { a + k - 1 })),
                    follow(op, position, rank),
                ),
                AxisOp::Rm(a) => (
                    Box::new(AxisOp::Rm(shift(*a, position))),
                    follow(op, position, rank),
                ),
                AxisOp::Move(from, to) => {
                    let after = follow(op, position, rank).context("a move of the merged axis")?;
                    let to = if *to < after { *to } else { to + k - 1 };
                    (
                        Box::new(AxisOp::Move(shift(*from, position), to)),
                        Some(after),
                    )
                }
            }
        } else if let Some(reduce) = node.op_as::<Reduce>() {
            let mut axes: TVec<usize> = tvec!();
            for &a in &reduce.axes {
                if a == position {
                    axes.extend(position..position + k);
                } else {
                    axes.push(shift(a, position));
                }
            }
            (Box::new(Reduce::new(axes, reduce.reducer)), Some(position))
        } else {
            (node.op.clone(), Some(position))
        };
        let wire = patch.wire_node(&node.name, op, &inputs)?[0];
        mapped.insert(
            OutletId::new(id, 0),
            (wire, out_position.context("an op moving the merged axis")?),
        );
    }
    Ok(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(model: TypedModel, input: &Tensor) -> TractResult<Tensor> {
        let out = model
            .into_runnable()?
            .run(tvec!(input.clone().into_tvalue()))?;
        Ok(out[0].clone().into_tensor())
    }

    fn no_reshape_left(model: &TypedModel) -> bool {
        model
            .nodes
            .iter()
            .all(|n| !matches!(n.op_as::<AxisOp>(), Some(AxisOp::Reshape(..))))
    }

    /// An arg-max over the merged axis is a flat index: the merge is left as it is.
    #[test]
    fn an_arg_max_over_merged_axes_is_left_merged() -> TractResult<()> {
        let mut model = TypedModel::default();
        let t = model.symbols.sym("T");
        let x = model.add_source("x", f32::fact([2.to_dim(), 3.to_dim(), t.to_dim()]))?;
        let ct = t.to_dim() * 3;
        let merged = model.wire_node(
            "merge",
            AxisOp::Reshape(1, tvec!(3.to_dim(), t.to_dim()), tvec!(ct.clone())),
            &[x],
        )?[0];
        let arg = model.wire_node(
            "arg",
            Reduce::new(tvec!(1), Reducer::ArgMax(false)),
            &[merged],
        )?[0];
        let arg = model.wire_node(
            "cast",
            tract_core::ops::cast::cast(f32::datum_type()),
            &[arg],
        )?[0];
        let shifted = model.wire_node("shifted", tract_core::ops::math::sub(), &[merged, arg])?[0];
        let split = model.wire_node(
            "split",
            AxisOp::Reshape(1, tvec!(ct), tvec!(3.to_dim(), t.to_dim())),
            &[shifted],
        )?[0];
        model.select_output_outlets(&[split])?;
        let before = model.clone();
        assert_eq!(merges_split_back(&mut model)?, 0);
        let input = Tensor::from_shape(
            &[2, 3, 4],
            &(0..24).map(|v| (v * 5 % 11) as f32).collect::<Vec<_>>(),
        )?;
        assert_eq!(run(model, &input)?, run(before, &input)?);
        Ok(())
    }

    /// dynamo's keys transpose: `[N, 4, L, 3]` to `[4N, L, 3]`, axes 1 and 2 swapped, back
    /// to `[N, 4, 3, L]`: one move of axes 2 and 3, the same values.
    #[test]
    fn a_transpose_through_merged_batch_and_heads_is_a_move() -> TractResult<()> {
        let mut model = TypedModel::default();
        let n = model.symbols.sym("N");
        let l = model.symbols.sym("L");
        let fact = f32::fact([n.to_dim(), 4.to_dim(), l.to_dim(), 3.to_dim()]);
        let x = model.add_source("x", fact)?;
        let nh = n.to_dim() * 4;
        let merged = model.wire_node(
            "merge",
            AxisOp::Reshape(0, tvec!(n.to_dim(), 4.to_dim()), tvec!(nh.clone())),
            &[x],
        )?[0];
        let moved = model.wire_node("move", AxisOp::Move(1, 2), &[merged])?[0];
        let split = model.wire_node(
            "split",
            AxisOp::Reshape(0, tvec!(nh), tvec!(n.to_dim(), 4.to_dim())),
            &[moved],
        )?[0];
        model.select_output_outlets(&[split])?;
        let before = model.clone();
        assert_eq!(merges_split_back(&mut model)?, 1);
        let model = model.into_decluttered()?;
        assert!(no_reshape_left(&model), "{model}");
        let input = Tensor::from_shape(
            &[2, 4, 5, 3],
            &(0..120).map(|v| v as f32).collect::<Vec<_>>(),
        )?;
        assert_eq!(run(model, &input)?, run(before, &input)?);
        Ok(())
    }

    /// `GroupNorm(1, C)`'s statistics: `[N, 1, C, T]` merged to `[N, 1, C*T]`, its mean over
    /// the merged axis subtracted, split back: a mean over `C` and `T`.
    #[test]
    fn a_mean_over_merged_axes_is_a_mean_over_each() -> TractResult<()> {
        use tract_core::ops::math::{mul, sub};
        let mut model = TypedModel::default();
        let n = model.symbols.sym("N");
        let t = model.symbols.sym("T");
        let fact = f32::fact([n.to_dim(), 1.to_dim(), 3.to_dim(), t.to_dim()]);
        let x = model.add_source("x", fact)?;
        let ct = t.to_dim() * 3;
        let merged = model.wire_node(
            "merge",
            AxisOp::Reshape(2, tvec!(3.to_dim(), t.to_dim()), tvec!(ct.clone())),
            &[x],
        )?[0];
        let sum = model.wire_node("sum", Reduce::new(tvec!(2), Reducer::Sum), &[merged])?[0];
        let scale = model.add_const("scale", tensor3(&[[[0.25f32]]]))?;
        let mean = model.wire_node("mean", mul(), &[sum, scale])?[0];
        let centred = model.wire_node("centred", sub(), &[merged, mean])?[0];
        let split = model.wire_node(
            "split",
            AxisOp::Reshape(2, tvec!(ct), tvec!(3.to_dim(), t.to_dim())),
            &[centred],
        )?[0];
        model.select_output_outlets(&[split])?;
        let before = model.clone();
        assert_eq!(merges_split_back(&mut model)?, 1);
        assert!(no_reshape_left(&model), "{model}");
        let input = Tensor::from_shape(
            &[2, 1, 3, 5],
            &(0..30).map(|v| (v * v % 7) as f32).collect::<Vec<_>>(),
        )?;
        assert_eq!(run(model, &input)?, run(before, &input)?);
        Ok(())
    }
}
