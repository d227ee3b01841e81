//! Axes merged and split back: no reshape at all.
//!
//! Exporters merge axes for a moment and split them back:
//! - torch's dynamo exporter transposes attention's keys through 3-D views, `[N, H, L, D]`
//!   reshaped to `[N*H, L, D]`, transposed, reshaped back to `[N, H, D, L]`;
//! - `GroupNorm(1, C)` (Conv-TasNet's global layer norm) is a reshape of `[N, C, T]` to
//!   `[N, 1, C*T]`, an instance norm over the merged axis (sums over it, element-wise ops,
//!   statistics broadcast back along it), and a reshape back to `[N, C, T]`;
//! - torch's `multi_head_attention_forward` (WavLM) views `[T, N, H*D]` as `[T, N*H, D]`,
//!   runs attention batched over `N*H` (products, a softmax, a position bias tiled over the
//!   batch and merged the same way) and views the result back as `[T*N, H*D]` for the
//!   output projection, itself split back to `[T, N, H*D]`;
//! - DeBERTa's dynamo export tiles its relative position keys `[H, P, D]` to `[N*H, P, D]`,
//!   gathers scores of `[N*H, L, L]` and splits them back to `[N, H, L, L]`;
//! - Conv-TasNet's decoder merges its sources into the batch, `[N, 2, C, T]` to
//!   `[2N, C, T]`, for one transposed convolution, and splits them back.
//!
//! The merged axis holds the batch, or a ragged axis with others: the ragged transform
//! cannot follow samples or their widths through it, though what happens in between is
//! axis by axis (moves, additions and removals of other axes, element-wise ops, products
//! and gathers that keep the merged axis apart, softmaxes) or a reduction over the whole
//! merged axis, which is a reduction over all the axes merged. Such a region, from the
//! merges (or tiles) of the same axes to the reshapes splitting them back, is rewritten on
//! the unmerged tensors: a sum over the merged `C*T` becomes a sum over `C` and `T`, which
//! the transform masks and divides per sample like any other; a product batched over
//! `N*H` one batched over `N` and `H`; a convolution batched over `N*2` one convolution of
//! `N` per index of the `2`, stacked back.
//!
//! A reshape that splits some axes and merges others (`[N, H*D]` to `[N*H, D]`) is first
//! written as its splits then its merges, where the dims allow (`split_mixed_reshapes`).

use tract_core::internal::*;
use tract_core::ops::array::{Gather, GatherElements, MultiBroadcastTo, Slice, Tile, TypedConcat};
use tract_core::ops::binary::TypedBinOp;
use tract_core::ops::cnn::{Conv, Deconv};
use tract_core::ops::einsum::EinSum;
use tract_core::ops::element_wise::ElementWiseOp;
use tract_core::ops::logic::Iff;
use tract_core::ops::nn::{Reduce, Reducer, Softmax};

/// Rewrites every merge of axes split back the same way, with what lies between, on the
/// unmerged tensor; how many changes were made (reshapes written as splits and merges
/// among them).
pub fn merges_split_back(model: &mut TypedModel) -> TractResult<usize> {
    let split = split_mixed_reshapes(model)?;
    // Each rewrite removes at least one merge or tile: the node count bounds them.
    for done in 0..=model.nodes().len() {
        let Some(region) = clean_region(model)? else {
            return Ok(split + done);
        };
        unmerged(model, &region)?.apply(model)?;
    }
    bail!("more merges split back than the model has nodes")
}

/// Each reshape that both splits and merges axes, written as its splits then its merges
/// where the dims have a common refinement (`[N, 48] -> [4N, 12]`: `48` split into
/// `[4, 12]`, then `[N, 4]` merged); how many were.
fn split_mixed_reshapes(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = fuse_reshapes(model)?;
    done += split_each_mixed_reshape(model)?;
    Ok(done + fuse_reshapes(model)?)
}

/// [`split_mixed_reshapes`]' splits and merges of each mixed reshape.
fn split_each_mixed_reshape(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(AxisOp::Reshape(at, from, to)) = node.op_as::<AxisOp>() else {
            continue;
        };
        let steps = pure_steps(*at, from, to)
            .unwrap_or_else(|| vec![AxisOp::Reshape(*at, from.clone(), to.clone())]);
        let steps: Vec<AxisOp> = steps.into_iter().flat_map(without_units).collect();
        if steps.len() < 2 {
            continue;
        }
        let mut patch = TypedModelPatch::default();
        let mut wire = patch.tap_model(model, node.inputs[0])?;
        for (ix, op) in steps.into_iter().enumerate() {
            wire = patch.wire_node(format!("{}.pure_{ix}", node.name), op, &[wire])?[0];
        }
        patch.shunt_outside(model, OutletId::new(id, 0), wire)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}

/// Each reshape followed only by another, as the one reshape they make, simplified, where
/// that is merges or splits of one axis each (ConvBERT views `[N, L, 2, 8]` as `[2NL, 8]`, then `[NL, 2, 8]`, then `[N, L, 2, 8]`:
/// nothing at all); how many pairs were.
fn fuse_reshapes(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    // Each fusion removes a reshape: the node count bounds them.
    for _ in 0..=model.nodes().len() {
        let outputs = model.output_outlets()?.to_vec();
        let mut found = None;
        for id in model.eval_order()? {
            let node = model.node(id);
            if !matches!(node.op_as::<AxisOp>(), Some(AxisOp::Reshape(..))) {
                continue;
            }
            let outlet = OutletId::new(id, 0);
            let successors = model.outlet_successors(outlet);
            if successors.len() != 1 || outputs.contains(&outlet) {
                continue;
            }
            let next = successors[0].node;
            if !matches!(
                model.node(next).op_as::<AxisOp>(),
                Some(AxisOp::Reshape(..))
            ) {
                continue;
            }
            let from = model.outlet_fact(node.inputs[0])?.shape.to_tvec();
            let to = model.outlet_fact(OutletId::new(next, 0))?.shape.to_tvec();
            let fused = AxisOp::Reshape(0, from, to).simplify();
            // Only into merges or splits of one axis: a split then a merge of other axes
            // is what `split_mixed_reshapes` writes, not to be undone.
            let pure = fused.iter().all(|op| match op {
                AxisOp::Reshape(_, from, to) => from.len() == 1 || to.len() == 1,
                _ => true,
            });
            if pure {
                found = Some((id, next, fused));
                break;
            }
        }
        let Some((first, second, fused)) = found else {
            return Ok(done);
        };
        let input = model.node(first).inputs[0];
        let mut patch = TypedModelPatch::default();
        let mut wire = patch.tap_model(model, input)?;
        for (ix, op) in fused.into_iter().enumerate() {
            let name = format!("{}.fused_{ix}", model.node(second).name);
            wire = patch.wire_node(name, op, &[wire])?[0];
        }
        patch.shunt_outside(model, OutletId::new(second, 0), wire)?;
        patch.apply(model)?;
        done += 1;
    }
    bail!("more reshapes fused than the model has nodes")
}

/// The splits (right to left) then the merges (right to left) that make the reshape of
/// `from` (at `at`) into `to`, when it both splits and merges and the dims refine into
/// common pieces.
fn pure_steps(at: usize, from: &[TDim], to: &[TDim]) -> Option<Vec<AxisOp>> {
    if from.len() < 2 || to.len() < 2 {
        return None;
    }
    let mut pieces: Vec<TDim> = vec![];
    let mut from_counts = vec![0usize; from.len()];
    let mut to_counts = vec![0usize; to.len()];
    let (mut i, mut j) = (0, 0);
    let (mut rest_from, mut rest_to) = (from[0].clone(), to[0].clone());
    while i < from.len() && j < to.len() {
        from_counts[i] += 1;
        to_counts[j] += 1;
        if rest_from == rest_to {
            pieces.push(rest_from.clone());
            i += 1;
            j += 1;
            rest_from = from.get(i).cloned().unwrap_or_default();
            rest_to = to.get(j).cloned().unwrap_or_default();
        } else if let Some(q) = quotient(&rest_to, &rest_from) {
            pieces.push(rest_from.clone());
            rest_to = q;
            i += 1;
            rest_from = from.get(i)?.clone();
        } else if let Some(q) = quotient(&rest_from, &rest_to) {
            pieces.push(rest_to.clone());
            rest_from = q;
            j += 1;
            rest_to = to.get(j)?.clone();
        } else {
            return None;
        }
    }
    if i != from.len() || j != to.len() {
        return None;
    }
    if from_counts.iter().all(|c| *c == 1) || to_counts.iter().all(|c| *c == 1) {
        return None;
    }
    let offsets = |counts: &[usize]| -> Vec<usize> {
        counts
            .iter()
            .scan(0, |acc, c| {
                let start = *acc;
                *acc += c;
                Some(start)
            })
            .collect()
    };
    let (from_at, to_at) = (offsets(&from_counts), offsets(&to_counts));
    let mut steps = vec![];
    for i in (0..from.len()).rev() {
        if from_counts[i] > 1 {
            let parts = &pieces[from_at[i]..from_at[i] + from_counts[i]];
            steps.push(AxisOp::Reshape(
                at + i,
                tvec!(from[i].clone()),
                parts.into(),
            ));
        }
    }
    for j in (0..to.len()).rev() {
        if to_counts[j] > 1 {
            let parts = &pieces[to_at[j]..to_at[j] + to_counts[j]];
            steps.push(AxisOp::Reshape(
                at + to_at[j],
                parts.into(),
                tvec!(to[j].clone()),
            ));
        }
    }
    Some(steps)
}

/// A merge or split of several axes with axes of one among them, as a merge or split of
/// the others and the removals or additions of those of one (`[N, 1, 4]` merged: the `1`
/// removed, `[N, 4]` merged), so that it meets the split of `[N, 4]` back.
fn without_units(op: AxisOp) -> Vec<AxisOp> {
    let AxisOp::Reshape(at, from, to) = &op else {
        return vec![op];
    };
    let units =
        |dims: &[TDim]| -> Vec<usize> { (0..dims.len()).filter(|i| dims[*i].is_one()).collect() };
    let others =
        |dims: &[TDim]| -> TVec<TDim> { dims.iter().filter(|d| !d.is_one()).cloned().collect() };
    if to.len() == 1 && others(from).len() >= 2 && !units(from).is_empty() {
        let mut steps: Vec<AxisOp> = units(from)
            .iter()
            .rev()
            .map(|i| AxisOp::Rm(at + i))
            .collect();
        steps.push(AxisOp::Reshape(*at, others(from), to.clone()));
        return steps;
    }
    if from.len() == 1 && others(to).len() >= 2 && !units(to).is_empty() {
        let mut steps = vec![AxisOp::Reshape(*at, from.clone(), others(to))];
        steps.extend(units(to).iter().map(|i| AxisOp::Add(at + i)));
        return steps;
    }
    vec![op]
}

/// `a / b` when `b` divides `a` exactly (checked by multiplying back).
fn quotient(a: &TDim, b: &TDim) -> Option<TDim> {
    if *b == TDim::Val(0) || a == b {
        return None;
    }
    let mut candidates: Vec<TDim> = vec![];
    if let Ok((q, 1)) = a.maybe_div(b) {
        candidates.push(q);
    }
    // `N*((T+75)/80) - N` over `(T+75)/80 - 1`: tract divides by a symbol, not by a sum.
    candidates.extend(a.symbols().into_iter().map(TDim::Sym));
    candidates
        .into_iter()
        .find(|q| !q.is_one() && (q.clone() * b).simplify() == a.clone().simplify())
}

/// What a wire of a region holds: the merged axis at `position`, whole or reduced to
/// one (keeping its place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Merged {
    position: usize,
    reduced: bool,
}

/// The merges (reshapes of `dims` into one axis) and tiles (by `dims[0]` of an axis of
/// `dims[1]`) of a region, with where they put the merged axis, and its other nodes up
/// to and including the reshapes splitting it back, in evaluation order.
struct Region {
    dims: TVec<TDim>,
    sources: Vec<(usize, usize)>,
    nodes: Vec<usize>,
}

/// Where `node` makes one axis of `dims`: a reshape merging them, or a tile by `dims[0]`
/// of an axis of `dims[1]` (the same values as a broadcast to `dims` merged).
fn source_position(model: &TypedModel, node: &TypedNode, dims: &[TDim]) -> Option<usize> {
    if let Some(AxisOp::Reshape(at, from, to)) = node.op_as::<AxisOp>() {
        return (to.len() == 1 && &**from == dims).then_some(*at);
    }
    let tile = node.op_as::<Tile>()?;
    let tiled: Vec<usize> = (0..tile.multipliers.len())
        .filter(|a| !tile.multipliers[*a].is_one())
        .collect();
    let &[axis] = &*tiled else {
        return None;
    };
    let fact = model.outlet_fact(*node.inputs.first()?).ok()?;
    (dims.len() == 2 && tile.multipliers[axis] == dims[0] && fact.shape[axis] == dims[1])
        .then_some(axis)
}

/// The first region, over the first dims merged that has one, whose every wire is
/// consumed inside it and which splits back at least once.
fn clean_region(model: &TypedModel) -> TractResult<Option<Region>> {
    let order = model.eval_order()?;
    let mut candidates: Vec<TVec<TDim>> = vec![];
    for &id in &order {
        if let Some(AxisOp::Reshape(_, from, to)) = model.node(id).op_as::<AxisOp>()
            && to.len() == 1
            && from.iter().filter(|d| !d.is_one()).count() >= 2
            && !candidates.contains(from)
        {
            candidates.push(from.clone());
        }
    }
    for dims in candidates {
        if let Some(region) = region_of(model, &order, &dims)? {
            return Ok(Some(region));
        }
    }
    Ok(None)
}

/// The regions of `dims` grow from every merge and tile of them, joined where their wires
/// meet; a region any of whose wires goes to a node it cannot take (or out of the model)
/// is left alone. The first clean one.
fn region_of(model: &TypedModel, order: &[usize], dims: &[TDim]) -> TractResult<Option<Region>> {
    let outputs = model.output_outlets()?;
    // Regions as a union-find over their first node.
    let mut parent: HashMap<usize, usize> = HashMap::default();
    fn find(parent: &HashMap<usize, usize>, mut r: usize) -> usize {
        while parent[&r] != r {
            r = parent[&r];
        }
        r
    }
    let mut wires: HashMap<OutletId, (Merged, usize)> = HashMap::default();
    let mut poisoned: std::collections::HashSet<usize> = Default::default();
    let mut split: std::collections::HashSet<usize> = Default::default();
    let mut members: Vec<(usize, usize, Option<usize>)> = vec![];
    for &id in order {
        let node = model.node(id);
        let wired: Vec<usize> = node
            .inputs
            .iter()
            .filter_map(|i| wires.get(i).map(|(_, r)| find(&parent, *r)))
            .collect();
        if let Some(position) = source_position(model, node, dims) {
            // A merge of a region's wire again: that region cannot take it.
            poisoned.extend(wired);
            parent.insert(id, id);
            wires.insert(
                OutletId::new(id, 0),
                (
                    Merged {
                        position,
                        reduced: false,
                    },
                    id,
                ),
            );
            members.push((id, id, Some(position)));
            continue;
        }
        if wired.is_empty() {
            continue;
        }
        let ins: TVec<Option<Merged>> = node
            .inputs
            .iter()
            .map(|i| wires.get(i).map(|(m, _)| *m))
            .collect();
        let Some(out) = step(model, node, &ins, dims)? else {
            poisoned.extend(wired);
            continue;
        };
        let root = wired[0];
        for &other in &wired[1..] {
            if other != root {
                parent.insert(other, root);
            }
        }
        members.push((id, root, None));
        match out {
            Some(merged) => {
                wires.insert(OutletId::new(id, 0), (merged, root));
            }
            None => {
                split.insert(root);
            }
        }
    }
    for (outlet, (_, r)) in &wires {
        if outputs.contains(outlet) {
            poisoned.insert(find(&parent, *r));
        }
    }
    // Poison and splits recorded on a root before it was joined under another.
    let roots: Vec<usize> = parent.keys().copied().collect();
    for r in roots {
        let root = find(&parent, r);
        if poisoned.contains(&r) {
            poisoned.insert(root);
        }
        if split.contains(&r) {
            split.insert(root);
        }
    }
    let Some(root) = members
        .iter()
        .map(|(_, r, _)| find(&parent, *r))
        .find(|r| split.contains(r) && !poisoned.contains(r))
    else {
        return Ok(None);
    };
    let mut region = Region {
        dims: dims.into(),
        sources: vec![],
        nodes: vec![],
    };
    for (id, r, source) in members {
        if find(&parent, r) != root {
            continue;
        }
        match source {
            Some(position) => region.sources.push((id, position)),
            None => region.nodes.push(id),
        }
    }
    Ok(Some(region))
}

/// An input from outside a region, along the merged axis at `position`: of extent one,
/// or a broadcast (of the returned wire) of a tensor of extent one there.
#[derive(Clone, Debug)]
enum Along {
    One,
    Broadcast(OutletId, TVec<TDim>),
}

fn along(model: &TypedModel, outlet: OutletId, position: usize) -> TractResult<Option<Along>> {
    let fact = model.outlet_fact(outlet)?;
    if fact.rank() <= position {
        return Ok(None);
    }
    if fact.shape[position].is_one() {
        return Ok(Some(Along::One));
    }
    let node = model.node(outlet.node);
    if let Some(op) = node.op_as::<MultiBroadcastTo>() {
        let input = model.outlet_fact(node.inputs[0])?;
        if input.rank() == fact.rank() && input.shape[position].is_one() {
            return Ok(Some(Along::Broadcast(node.inputs[0], op.shape.to_tvec())));
        }
    }
    Ok(None)
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
    if let Some(op) = node.op_as::<EinSum>() {
        return Ok(einsum_step(op, inputs).map(|position| {
            Some(Merged {
                position,
                reduced: false,
            })
        }));
    }
    if inside.iter().any(|m| m.position != first.position) {
        return Ok(None);
    }
    let position = first.position;
    if let Some(op) = node.op_as::<AxisOp>() {
        return Ok(match op {
            AxisOp::Reshape(at, f, t) if *at == position && f.len() == 1 && &**t == dims => {
                (!first.reduced).then_some(None)
            }
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
    if node.op_is::<Softmax>() {
        return Ok(Some(Some(first)));
    }
    if let Some(op) = node.op_as::<GatherElements>() {
        // Data and indices both along the merged axis, gathered along another one.
        let indices = match inputs.get(1) {
            Some(Some(m)) => !m.reduced,
            Some(None) => matches!(
                along(model, node.inputs[1], position)?,
                Some(Along::Broadcast(..))
            ),
            None => false,
        };
        let data = matches!(inputs.first(), Some(Some(m)) if !m.reduced);
        return Ok((data && indices && op.axis != position).then_some(Some(first)));
    }
    if let Some(op) = node.op_as::<Gather>() {
        // Picks along another axis, at indices from outside.
        let data = matches!(inputs.first(), Some(Some(m)) if !m.reduced);
        if !data || !matches!(inputs.get(1), Some(None)) || op.axis == position {
            return Ok(None);
        }
        let indices = model.outlet_fact(node.inputs[1])?.rank();
        return Ok(Some(Some(Merged {
            position: gathered(op.axis, position, indices),
            ..first
        })));
    }
    if let Some(axis) = convolved(node, dims) {
        // A convolution batched over the merged axis, its kernel and bias from outside.
        let rest_outside = inputs.iter().skip(1).all(|i| i.is_none());
        let data = matches!(inputs.first(), Some(Some(m)) if !m.reduced);
        return Ok((data && rest_outside && position == 0 && axis <= 1).then_some(Some(first)));
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
        if input.is_none() && along(model, node.inputs[slot], position)?.is_none() {
            return Ok(None);
        }
    }
    Ok(Some(Some(Merged {
        position,
        reduced: inside.iter().all(|m| m.reduced),
    })))
}

/// Where an `EinSum` puts the merged axis: its inputs from the region carry it whole and
/// under one label, which the others lack and the output keeps.
fn einsum_step(op: &EinSum, inputs: &[Option<Merged>]) -> Option<usize> {
    if inputs.iter().flatten().any(|m| m.reduced) {
        return None;
    }
    let positions: TVec<Option<usize>> = inputs.iter().map(|m| m.map(|m| m.position)).collect();
    super::windows::einsum_axis(op, &positions)
}

/// For a convolution (or transposed one) whose batch axis can hold the merged `dims`: the
/// one of the two unmerged axes that is a small fixed count, which the rewrite unrolls
/// (Conv-TasNet's decoder convolves `[N*2, C, T]`, its two sources merged into the
/// batch: it becomes one convolution of `[N, C, T]` per source).
fn convolved(node: &TypedNode, dims: &[TDim]) -> Option<usize> {
    let has_n = if let Some(conv) = node.op_as::<Conv>() {
        conv.pool_spec.data_format.has_n()
    } else if let Some(deconv) = node.op_as::<Deconv>() {
        deconv.pool_spec.data_format.has_n()
    } else {
        return None;
    };
    if !has_n || dims.len() != 2 {
        return None;
    }
    let small = |d: &TDim| d.as_i64().is_some_and(|v| (1..=16).contains(&v));
    match (small(&dims[0]), small(&dims[1])) {
        (false, true) => Some(1),
        (true, false) => Some(0),
        _ => None,
    }
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
        AxisOp::Reshape(at, from, to) => {
            // Of other axes only.
            if (*at..at + from.len()).contains(&position) {
                return None;
            }
            return Some(if position >= at + from.len() {
                position + to.len() - from.len()
            } else {
                position
            });
        }
    }
    axes.iter().position(|is| *is)
}

/// Where a gather along `axis` at indices of rank `indices` puts the axis at `position`.
fn gathered(axis: usize, position: usize, indices: usize) -> usize {
    if axis < position {
        position - 1 + indices
    } else {
        position
    }
}

/// `shape` with the merged axis at `position` replaced by `dims`.
fn unmerged_shape(shape: &[TDim], position: usize, dims: &[TDim]) -> TVec<TDim> {
    let mut out: TVec<TDim> = shape[..position].into();
    out.extend(dims.iter().cloned());
    out.extend(shape[position + 1..].iter().cloned());
    out
}

/// The region's nodes on the unmerged tensor, the splits' outputs taken over.
fn unmerged(model: &TypedModel, region: &Region) -> TractResult<TypedModelPatch> {
    let mut patch = TypedModelPatch::default();
    let dims = &region.dims;
    let k = dims.len();
    // Per wire of the region: its wire in the patch, and the merged axis' position in the
    // source (its `k` unmerged axes start there in the patch).
    let mut mapped: HashMap<OutletId, (OutletId, usize)> = HashMap::default();
    for &(id, position) in &region.sources {
        let node = model.node(id);
        let mut wire = patch.tap_model(model, node.inputs[0])?;
        if node.op_is::<Tile>() {
            // A tile by `dims[0]`: a broadcast along a new axis before the tiled one.
            let shape = model.outlet_fact(node.inputs[0])?.shape.to_tvec();
            wire = patch.wire_node(
                format!("{}.unmerged_axis", node.name),
                AxisOp::Add(position),
                &[wire],
            )?[0];
            let shape = unmerged_shape(&shape, position, dims);
            wire = patch.wire_node(
                format!("{}.unmerged", node.name),
                MultiBroadcastTo::new(shape.into()),
                &[wire],
            )?[0];
        }
        mapped.insert(OutletId::new(id, 0), (wire, position));
    }
    // An axis of the source, in the patch: past the merged axis, `k - 1` further.
    let shift = |axis: usize, position: usize| if axis > position { axis + k - 1 } else { axis };
    for &id in &region.nodes {
        let node = model.node(id);
        let position = node
            .inputs
            .iter()
            .find_map(|i| mapped.get(i).map(|(_, p)| *p))
            .context("a node of the region reads none of it")?;
        let einsum = node.op_as::<EinSum>();
        let mut inputs: TVec<OutletId> = tvec!();
        for (slot, input) in node.inputs.iter().enumerate() {
            if let Some((wire, _)) = mapped.get(input) {
                inputs.push(*wire);
                continue;
            }
            if einsum.is_some() || convolved(node, dims).is_some() || node.op_is::<Gather>() {
                // Without the merged axis (a kernel, a bias, indices): as it is.
                inputs.push(patch.tap_model(model, *input)?);
                continue;
            }
            // One along the merged axis, or broadcast from one: `k - 1` more such axes.
            let (source, broadcast) = match along(model, *input, position)? {
                Some(Along::One) => (*input, None),
                Some(Along::Broadcast(source, shape)) => (source, Some(shape)),
                None => bail!(
                    "input {slot} of {:?} is not along the merged axis",
                    node.name
                ),
            };
            let mut wire = patch.tap_model(model, source)?;
            for extra in 0..k - 1 {
                wire = patch.wire_node(
                    format!("{}.unmerged_{slot}_{extra}", node.name),
                    AxisOp::Add(position),
                    &[wire],
                )?[0];
            }
            if let Some(shape) = broadcast {
                wire = patch.wire_node(
                    format!("{}.unmerged_{slot}", node.name),
                    MultiBroadcastTo::new(unmerged_shape(&shape, position, dims).into()),
                    &[wire],
                )?[0];
            }
            inputs.push(wire);
        }
        if let Some(axis) = convolved(node, dims) {
            // One convolution per index of the fixed axis, stacked back along it.
            let count = dims[axis].to_usize()?;
            let axis = position + axis;
            let mut parts = tvec!();
            for index in 0..count {
                let name = format!("{}.unrolled_{index}", node.name);
                let mut wire = patch.wire_node(
                    format!("{name}.slice"),
                    Slice::new(axis, index, index + 1),
                    &[inputs[0]],
                )?[0];
                wire = patch.wire_node(format!("{name}.rm"), AxisOp::Rm(axis), &[wire])?[0];
                let mut conv_inputs = inputs.clone();
                conv_inputs[0] = wire;
                wire = patch.wire_node(&name, node.op.clone(), &conv_inputs)?[0];
                wire = patch.wire_node(format!("{name}.add"), AxisOp::Add(axis), &[wire])?[0];
                parts.push(wire);
            }
            let wire = patch.wire_node(&node.name, TypedConcat::new(axis), &parts)?[0];
            mapped.insert(OutletId::new(id, 0), (wire, position));
            continue;
        }
        let rank = model.outlet_fact(node.inputs[0])?.rank();
        let (op, out_position): (Box<dyn TypedOp>, Option<usize>) = if let Some(op) = einsum {
            let (mut ins, mut outs) = op.axes.to_strs();
            let mut label = None;
            for (slot, input) in node.inputs.iter().enumerate() {
                if let Some((_, p)) = mapped.get(input) {
                    label = ins[slot].chars().nth(*p);
                }
            }
            let label = label.context("an einsum without the merged axis")?;
            let fresh: String = op.axes.available_labels().take(k - 1).collect();
            let spread = |s: &String| s.replace(label, &format!("{label}{fresh}"));
            ins.iter_mut().for_each(|s| *s = spread(s));
            outs.iter_mut().for_each(|s| *s = spread(s));
            let out_position = outs[0].chars().position(|c| c == label);
            let axes = AxesMapping::from_strs(&ins, &outs)?;
            (Box::new(EinSum { axes, ..op.clone() }), out_position)
        } else if let Some(op) = node.op_as::<AxisOp>() {
            match op {
                AxisOp::Reshape(at, from, to) if *at != position || from.len() != 1 => {
                    // Of other axes.
                    let shifted = AxisOp::Reshape(shift(*at, position), from.clone(), to.clone());
                    (Box::new(shifted), follow(op, position, rank))
                }
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
            let axes = spread_axes(&reduce.axes, position, k);
            (Box::new(Reduce::new(axes, reduce.reducer)), Some(position))
        } else if let Some(softmax) = node.op_as::<Softmax>() {
            let axes = spread_axes(&softmax.axes, position, k);
            let op = Softmax {
                axes,
                ..softmax.clone()
            };
            (Box::new(op), Some(position))
        } else if let Some(gather) = node.op_as::<Gather>() {
            let indices = model.outlet_fact(node.inputs[1])?.rank();
            let op = Gather {
                axis: shift(gather.axis, position),
                ..gather.clone()
            };
            (Box::new(op), Some(gathered(gather.axis, position, indices)))
        } else if let Some(gather) = node.op_as::<GatherElements>() {
            let op = GatherElements {
                axis: shift(gather.axis, position),
            };
            (Box::new(op), Some(position))
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

/// `axes` of a tensor whose merged axis at `position` is unmerged into `k`: the merged
/// one becomes all of them.
fn spread_axes(axes: &[usize], position: usize, k: usize) -> TVec<usize> {
    let mut out: TVec<usize> = tvec!();
    for &a in axes {
        if a == position {
            out.extend(position..position + k);
        } else if a > position {
            out.push(a + k - 1);
        } else {
            out.push(a);
        }
    }
    out
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
    fn no_reshape_of_the_batch(model: &TypedModel) -> bool {
        model.nodes.iter().all(|n| match n.op_as::<AxisOp>() {
            Some(AxisOp::Reshape(_, from, to)) => from
                .iter()
                .chain(to.iter())
                .all(|d| d.symbols().iter().all(|s| format!("{s}") != "N")),
            _ => true,
        })
    }

    /// `model` rewritten: some merge split back, no reshape of the batch left once
    /// decluttered; its output on `input`, and the original's.
    fn rewritten_and_original(
        mut model: TypedModel,
        input: &Tensor,
    ) -> TractResult<(Tensor, Tensor)> {
        let before = model.clone();
        assert!(merges_split_back(&mut model)? > 0);
        let model = model.into_decluttered()?;
        assert!(no_reshape_of_the_batch(&model), "{model}");
        assert!(model.nodes.iter().all(|n| !n.op_is::<Tile>()), "{model}");
        Ok((run(model, input)?, run(before, input)?))
    }

    fn counting(shape: &[usize]) -> TractResult<Tensor> {
        let len = shape.iter().product::<usize>();
        Tensor::from_shape(
            shape,
            &(0..len)
                .map(|v| ((v * 7 % 13) as f32) / 4.0)
                .collect::<Vec<_>>(),
        )
    }

    /// `[N, 48]` to `[4N, 12]`: 48 split, then `[N, 4]` merged; `[T, 4N, 12]` to
    /// `[T*N, 48]`, where `T` is a frame count: `4N` split, then both merges.
    #[test]
    fn reshapes_that_split_and_merge_are_written_as_splits_then_merges() {
        let table = SymbolScope::default();
        let n = table.sym("N").to_dim();
        let t = (table.sym("T").to_dim() + 75) / 80 - 1;
        let steps = pure_steps(1, &[n.clone(), 48.to_dim()], &[n.clone() * 4, 12.to_dim()]);
        assert_eq!(
            steps,
            Some(vec![
                AxisOp::Reshape(2, tvec!(48.to_dim()), tvec!(4.to_dim(), 12.to_dim())),
                AxisOp::Reshape(1, tvec!(n.clone(), 4.to_dim()), tvec!(n.clone() * 4)),
            ])
        );
        let steps = pure_steps(
            0,
            &[t.clone(), n.clone() * 4, 12.to_dim()],
            &[(t.clone() * &n).simplify(), 48.to_dim()],
        );
        assert_eq!(
            steps,
            Some(vec![
                AxisOp::Reshape(1, tvec!(n.clone() * 4), tvec!(n.clone(), 4.to_dim())),
                AxisOp::Reshape(2, tvec!(4.to_dim(), 12.to_dim()), tvec!(48.to_dim())),
                AxisOp::Reshape(0, tvec!(t.clone(), n.clone()), tvec!((t * &n).simplify())),
            ])
        );
        // Pure merges and splits, and dims without common pieces, are left as they are.
        assert_eq!(
            pure_steps(0, &[n.clone(), 4.to_dim()], &[n.clone() * 4]),
            None
        );
        assert_eq!(
            pure_steps(0, &[6.to_dim(), 4.to_dim()], &[4.to_dim(), 6.to_dim()]),
            None
        );
    }

    /// torch's `multi_head_attention_forward`: `[L, N, 8]` viewed as `[L, 2N, 4]`, scores
    /// batched over `2N`, a softmax, the values' product, viewed back as `[L*N, 8]` for a
    /// projection, split back to `[L, N, 8]`: no reshape of the batch is left, the same
    /// values.
    #[test]
    fn attention_batched_over_merged_batch_and_heads_is_batched_over_both() -> TractResult<()> {
        let mut model = TypedModel::default();
        let n = model.symbols.sym("N").to_dim();
        let l = model.symbols.sym("L").to_dim();
        let x = model.add_source("x", f32::fact([l.clone(), n.clone(), 8.to_dim()]))?;
        let heads = model.wire_node(
            "heads",
            AxisOp::Reshape(
                1,
                tvec!(n.clone(), 8.to_dim()),
                tvec!(n.clone() * 2, 4.to_dim()),
            ),
            &[x],
        )?[0];
        let einsum = |expr: &str| -> TractResult<EinSum> {
            Ok(EinSum {
                axes: expr.parse()?,
                operating_dt: f32::datum_type(),
                q_params: None,
            })
        };
        let scores = model.wire_node("scores", einsum("mak,nak->amn")?, &[heads, heads])?[0];
        let probs = model.wire_node(
            "probs",
            Softmax {
                axes: tvec!(2),
                quant_output_dt: None,
                kind: Default::default(),
            },
            &[scores],
        )?[0];
        let mixed = model.wire_node("mixed", einsum("amn,nak->mak")?, &[probs, heads])?[0];
        let rows = (l.clone() * &n).simplify();
        let flat = model.wire_node(
            "flat",
            AxisOp::Reshape(
                0,
                tvec!(l.clone(), n.clone() * 2, 4.to_dim()),
                tvec!(rows.clone(), 8.to_dim()),
            ),
            &[mixed],
        )?[0];
        let w = model.add_const("w", counting(&[8, 8])?)?;
        let projected = model.wire_node("projected", einsum("mk,kn->mn")?, &[flat, w])?[0];
        let split = model.wire_node(
            "split",
            AxisOp::Reshape(0, tvec!(rows), tvec!(l.clone(), n.clone())),
            &[projected],
        )?[0];
        model.select_output_outlets(&[split])?;
        let (ours, theirs) = rewritten_and_original(model, &counting(&[5, 3, 8])?)?;
        ours.close_enough(&theirs, Approximation::Close)?;
        Ok(())
    }

    /// DeBERTa's dynamo export: a table tiled over the batch (`[2, 3, 5]` to `[2N, 3, 5]`),
    /// scores merged to `[2N, 3, 5]` gathered at broadcast indices, added, split back.
    #[test]
    fn tiles_and_gathers_through_merged_batch_and_heads_are_broadcasts() -> TractResult<()> {
        let mut model = TypedModel::default();
        let n = model.symbols.sym("N").to_dim();
        let x = model.add_source(
            "x",
            f32::fact([n.clone(), 2.to_dim(), 3.to_dim(), 5.to_dim()]),
        )?;
        let merged = model.wire_node(
            "merge",
            AxisOp::Reshape(0, tvec!(n.clone(), 2.to_dim()), tvec!(n.clone() * 2)),
            &[x],
        )?[0];
        let indices = Tensor::from_shape(
            &[1, 3, 5],
            &(0..15).map(|v| (v * 3 % 5) as i64).collect::<Vec<_>>(),
        )?;
        let indices = model.add_const("indices", indices)?;
        let indices = model.wire_node(
            "indices.broadcast",
            MultiBroadcastTo::new(tvec!(n.clone() * 2, 3.to_dim(), 5.to_dim()).into()),
            &[indices],
        )?[0];
        let gathered =
            model.wire_node("gather", GatherElements { axis: 2 }, &[merged, indices])?[0];
        let table = model.add_const("table", counting(&[2, 3, 5])?)?;
        let tiled = model.wire_node(
            "tile",
            Tile {
                multipliers: tvec!(n.clone(), 1.to_dim(), 1.to_dim()),
            },
            &[table],
        )?[0];
        let sum = model.wire_node("sum", tract_core::ops::math::add(), &[gathered, tiled])?[0];
        let split = model.wire_node(
            "split",
            AxisOp::Reshape(0, tvec!(n.clone() * 2), tvec!(n.clone(), 2.to_dim())),
            &[sum],
        )?[0];
        model.select_output_outlets(&[split])?;
        let (ours, theirs) = rewritten_and_original(model, &counting(&[3, 2, 3, 5])?)?;
        assert_eq!(ours, theirs);
        Ok(())
    }
    /// torch's `nn.MultiheadAttention` as dynamo writes it: `[T, N, 6]` merged to
    /// `[T*N, 6]`, an axis added, `6` split into `[3, 2]`, the middle picked by a gather,
    /// split back to `[T, N, ..]`; and a merge of `[N, 1, 2]` (a unit among the axes)
    /// split back as `[N, 2]`.
    #[test]
    fn reshapes_and_gathers_of_other_axes_and_merged_units_are_followed() -> TractResult<()> {
        let mut model = TypedModel::default();
        let n = model.symbols.sym("N").to_dim();
        let t = model.symbols.sym("T").to_dim();
        let x = model.add_source("x", f32::fact([t.clone(), n.clone(), 6.to_dim()]))?;
        let rows = (t.clone() * &n).simplify();
        let merged = model.wire_node(
            "merge",
            AxisOp::Reshape(0, tvec!(t.clone(), n.clone()), tvec!(rows.clone())),
            &[x],
        )?[0];
        let added = model.wire_node("add", AxisOp::Add(1), &[merged])?[0];
        let parts = model.wire_node(
            "parts",
            AxisOp::Reshape(2, tvec!(6.to_dim()), tvec!(3.to_dim(), 2.to_dim())),
            &[added],
        )?[0];
        let index = model.add_const("index", tensor0(1i64))?;
        let picked = model.wire_node(
            "pick",
            Gather {
                axis: 2,
                output_type: None,
            },
            &[parts, index],
        )?[0];
        let split = model.wire_node(
            "split",
            AxisOp::Reshape(0, tvec!(rows), tvec!(t.clone(), n.clone())),
            &[picked],
        )?[0];
        // [T, N, 1, 2]: N and its unit merged, split back without the unit.
        let moved = model.wire_node("move", AxisOp::Move(1, 0), &[split])?[0];
        let units = model.wire_node(
            "merge_units",
            AxisOp::Reshape(
                0,
                tvec!(n.clone(), t.clone(), 1.to_dim()),
                tvec!((n.clone() * &t).simplify()),
            ),
            &[moved],
        )?[0];
        let scaled = model.add_const("scale", tensor2(&[[2f32]]))?;
        let scaled = model.wire_node("scaled", tract_core::ops::math::mul(), &[units, scaled])?[0];
        let back = model.wire_node(
            "split_units",
            AxisOp::Reshape(
                0,
                tvec!((n.clone() * &t).simplify()),
                tvec!(n.clone(), t.clone()),
            ),
            &[scaled],
        )?[0];
        model.select_output_outlets(&[back])?;
        let (ours, theirs) = rewritten_and_original(model, &counting(&[4, 3, 6])?)?;
        assert_eq!(ours, theirs);
        Ok(())
    }
}
