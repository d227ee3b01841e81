//! ONNX `If` nodes whose condition the model's facts decide, replaced by the branch taken.
//!
//! Exports of scripted PyTorch code branch on shapes and on inputs given once: silero
//! VAD's does `if x.shape[-1] == 1: x = x.squeeze(-1)`, `if x.dim() == 1: ...` around its
//! LSTM cell, and picks its 16 kHz or 8 kHz network on the sample-rate input. tract's
//! `If` types both branches whatever its condition (tract-onnx 0.23.9), so a branch that
//! will not be taken and cannot be typed at the model's shapes (the `squeeze` of the
//! batch axis, written for batch 1) fails the whole model, even where the condition is
//! known. [`decide_branches`] replaces each `If` whose condition follows from the facts
//! (ranks, fixed extents, an input folded to its value: [`fold_input`]) by the nodes of
//! the branch taken, as tract's typed `IfThenElse` does itself once its condition is a
//! constant; the branch not taken is dropped. An `If` whose condition depends on the
//! values of a batch stays, and tract types it as it would have.
//!
//! Each sample alone takes the same branch: the conditions decided here follow from
//! facts every batch and every sample shares (ranks, fixed extents, values given once).
//! A condition on the batch size or on a ragged extent is never decided here: those are
//! symbols in a symbolic model (but for an equality of two sizes that are one
//! expression, DeBERTa's `q.size(-2) != k.size(-2)`, both `L`: true whatever `L` is), and
//! a model typed per batch shape leaves them to the transform, which refuses them (a batch-1 assumption: ragged_model's message).

use tract_onnx::ops::logic::If;
use tract_onnx::tract_hir::infer::InferenceModelPatch;
use tract_onnx::tract_hir::internal::*;

/// Replaces every `If` whose condition the facts decide by the branch taken, as often as
/// deciding one lets tract infer more (an `If` in a branch taken, a condition computed
/// from a branch's output). Returns the names of the `If` nodes replaced.
pub fn decide_branches(model: &mut InferenceModel) -> TractResult<Vec<String>> {
    let mut decided = vec![];
    if !model.nodes().iter().any(|n| n.op_as::<If>().is_some()) {
        return Ok(decided);
    }
    // Each round replaces one If: a node count bounds the rounds.
    for _ in 0..=model.nodes().len() + 64 {
        // Facts inferred as far as they go (a branch tract cannot type is what this is
        // here for), on a copy: an If not decided yet gives its outputs the facts of
        // either branch, which must not stay once the other one is wired.
        let mut analysed = model.clone();
        let _ = analysed.analyse(true);
        let Some((node, taken)) = next_decided(&analysed)? else {
            return Ok(decided);
        };
        decided.push(model.node(node).name.clone());
        inline(model, node, taken).with_context(|| {
            format!(
                "Replacing If node {:?} by its branch",
                model.node(node).name
            )
        })?;
        model.compact()?;
    }
    bail!("more If nodes decided than the model has nodes")
}

/// The first `If`, in evaluation order, whose condition has a known value, and whether
/// it takes its `then` branch.
fn next_decided(model: &InferenceModel) -> TractResult<Option<(usize, bool)>> {
    for id in model.eval_order()? {
        let node = model.node(id);
        if node.op_as::<If>().is_none() {
            continue;
        }
        let Some(&cond) = node.inputs.first() else {
            continue;
        };
        if !free_of_symbols(model, cond)? {
            continue;
        }
        if let Some(value) = model.outlet_fact(cond)?.value.concretize() {
            let taken = value
                .cast_to_scalar::<bool>()
                .with_context(|| format!("The condition of If node {:?}", node.name))?;
            return Ok(Some((id, taken)));
        }
    }
    Ok(None)
}

/// Ops (by name, or its start: tract-onnx's `Squeeze13`) whose known output may drop the symbols of a known input and still be exact:
/// they pick or count elements (`Gather(Shape(x), 1)` is 128 in `[N, 128]`). Any other op
/// whose output is known while an input holds symbols has decided something about them
/// (tract's `Equal` says `(L+320)/512 == 1` is false, which it is not for every `L`).
const PICKING: &[&str] = &[
    "Gather",
    "Slice",
    "StridedSlice",
    "Size",
    "Shape",
    "Squeeze",
    "Unsqueeze",
    "Reshape",
    "Identity",
];

/// Whether the value at `outlet` was computed without deciding anything about a symbol:
/// every value it derives from holds no symbol, but where an op picks elements of a value
/// that does (module doc).
fn free_of_symbols(model: &InferenceModel, outlet: OutletId) -> TractResult<bool> {
    let symbolic = |o: OutletId| -> TractResult<bool> {
        Ok(model
            .outlet_fact(o)?
            .value
            .concretize()
            .is_some_and(|v| has_symbols(&v)))
    };
    let mut todo = vec![outlet];
    let mut seen = std::collections::HashSet::new();
    while let Some(o) = todo.pop() {
        if !seen.insert(o) {
            continue;
        }
        if symbolic(o)? {
            return Ok(false);
        }
        let node = model.node(o.node);
        if same_values(model, node)? {
            // `Equal(L, L)`, two sizes of one symbolic shape: true whatever `L` holds.
            continue;
        }
        let picks = PICKING.iter().any(|p| node.op.name().starts_with(p));
        for &input in &node.inputs {
            if picks && symbolic(input)? {
                continue;
            }
            // Only known values lead to a known output; others (an If branch's tensor,
            // whose shape alone a Shape reads) are not values it was computed from.
            if model.outlet_fact(input)?.value.concretize().is_some() {
                todo.push(input);
            }
        }
    }
    Ok(true)
}

/// Whether `node` is an `Equal` of two known values that are the same expressions: true
/// for every value of their symbols (DeBERTa's scripted attention checks that queries and
/// keys have one length, both `L`).
fn same_values(model: &InferenceModel, node: &InferenceNode) -> TractResult<bool> {
    use tract_onnx::tract_core::ops::logic::CompEq;
    use tract_onnx::tract_hir::ops::binary::InferenceBinOp;
    use tract_onnx::tract_hir::ops::expandable::Expansion;
    let equal = node
        .op_as::<Box<dyn Expansion>>()
        .and_then(|e| e.as_any().downcast_ref::<InferenceBinOp>())
        .is_some_and(|op| op.0.is::<CompEq>());
    if !equal || node.inputs.len() != 2 {
        return Ok(false);
    }
    let a = model.outlet_fact(node.inputs[0])?.value.concretize();
    let b = model.outlet_fact(node.inputs[1])?.value.concretize();
    Ok(matches!((a, b), (Some(a), Some(b)) if a == b))
}

/// Whether a tensor of dims holds a symbol.
fn has_symbols(value: &Tensor) -> bool {
    value.datum_type() == TDim::datum_type()
        && value
            .to_plain_array_view::<TDim>()
            .is_ok_and(|dims| dims.iter().any(|d| d.to_i64().is_err()))
}

/// Wires the nodes of the branch `taken` of `If` node `id` in its place.
fn inline(model: &mut InferenceModel, id: usize, taken: bool) -> TractResult<()> {
    let node = model.node(id);
    let op = node.op_as::<If>().context("not an If node")?;
    let (body, other) = if taken {
        (&op.then_body, &op.else_body)
    } else {
        (&op.else_body, &op.then_body)
    };
    let mapping = input_mapping(body, other)?;
    let mut patch = InferenceModelPatch::default();
    let mut wired: HashMap<OutletId, OutletId> = HashMap::default();
    let sources = body.input_outlets()?;
    for (source, &outer) in sources.iter().zip(&mapping) {
        let input = *node
            .inputs
            .get(outer)
            .with_context(|| format!("the branch reads input {outer}, which the If lacks"))?;
        wired.insert(*source, patch.tap_model(model, input)?);
    }
    for body_id in body.eval_order()? {
        if sources.iter().any(|s| s.node == body_id) {
            continue;
        }
        let inner = body.node(body_id);
        let inputs = inner
            .inputs
            .iter()
            .map(|o| {
                wired
                    .get(o)
                    .copied()
                    .with_context(|| format!("node {:?} of the branch", inner.name))
            })
            .collect::<TractResult<TVec<OutletId>>>()?;
        let outputs = patch.wire_node(&inner.name, inner.op.clone(), &inputs)?;
        for (slot, outlet) in outputs.into_iter().enumerate() {
            wired.insert(OutletId::new(body_id, slot), outlet);
        }
    }
    for (slot, output) in body.output_outlets()?.iter().enumerate() {
        let by = *wired
            .get(output)
            .context("a branch output that no node of the branch computes")?;
        patch.shunt_outside(model, OutletId::new(id, slot), by)?;
    }
    patch.apply(model)
}

/// For each input of `body`, the index of the `If` node's input it reads. tract-onnx
/// makes a branch's inputs of the outer values it reads (its sources, named after them);
/// the `If` node's inputs are its condition, then the names both branches read, sorted
/// and without repeats (tract-onnx's `_if`, whose mapping is private).
fn input_mapping(body: &InferenceModel, other: &InferenceModel) -> TractResult<Vec<usize>> {
    let names = |m: &InferenceModel| -> TractResult<Vec<String>> {
        Ok(m.input_outlets()?
            .iter()
            .map(|o| m.node(o.node).name.clone())
            .collect())
    };
    let mine = names(body)?;
    let mut all: Vec<String> = mine.iter().cloned().chain(names(other)?).collect();
    all.sort();
    all.dedup();
    mine.iter()
        .map(|n| {
            all.iter()
                .position(|a| a == n)
                .map(|p| p + 1)
                .with_context(|| format!("the branch input {n:?} among the If's inputs"))
        })
        .collect()
}

/// Replaces the model's input `name` by a constant: an input given once and the same
/// for every batch (a sample rate), so that what the model computes from it (the branch
/// an `If` takes) is known when it is typed (`decide_branches`).
pub fn fold_input(model: &mut InferenceModel, name: &str, value: Tensor) -> TractResult<()> {
    let inputs = model.input_outlets()?.to_vec();
    let outlet = inputs
        .iter()
        .copied()
        .find(|o| model.node(o.node).name == name)
        .with_context(|| {
            format!(
                "the model has no input {name:?} to give a value to (inputs: {})",
                inputs
                    .iter()
                    .map(|o| model.node(o.node).name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let declared = model.outlet_fact(outlet)?.clone();
    ensure!(
        declared
            .datum_type
            .concretize()
            .is_none_or(|dt| dt == value.datum_type()),
        "input {name:?} is {:?}, the value given for it {:?}",
        declared.datum_type.concretize(),
        value.datum_type()
    );
    if let Some(shape) = declared.shape.concretize() {
        ensure!(
            shape.len() == value.rank()
                && shape
                    .iter()
                    .zip(value.shape())
                    .all(|(d, v)| d.to_usize().map_or(true, |d| d == *v)),
            "input {name:?} is declared {}, the value given for it has shape {:?}",
            declared.format_dt_shape(),
            value.shape()
        );
    }
    let konst = model.add_const(format!("{name}.value"), value)?;
    let mut patch = InferenceModelPatch::default();
    let tap = patch.tap_model(model, konst)?;
    patch.shunt_outside(model, outlet, tap)?;
    patch.apply(model)?;
    model.inputs.retain(|o| *o != outlet);
    model.compact()
}

/// The first `If` left undecided whose condition derives from one of the model's inputs,
/// and that input's name: an input to fold ([`fold_input`]) for the branch to be known.
pub(crate) fn branch_on_input(model: &InferenceModel) -> Option<(String, String)> {
    let inputs = model.input_outlets().ok()?;
    for id in model.eval_order().ok()? {
        let node = model.node(id);
        if node.op_as::<If>().is_none() {
            continue;
        }
        let mut todo = vec![*node.inputs.first()?];
        let mut seen = std::collections::HashSet::new();
        while let Some(o) = todo.pop() {
            if !seen.insert(o) {
                continue;
            }
            if inputs.contains(&o) {
                return Some((node.name.clone(), model.node(o.node).name.clone()));
            }
            // A Shape reads its input's shape, not its values.
            let from = model.node(o.node);
            if !from.op.name().starts_with("Shape") {
                todo.extend(from.inputs.iter().copied());
            }
        }
    }
    None
}
