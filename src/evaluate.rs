//! Evaluating a value of the model's shape at given extents.
//!
//! A tensor of a typed model that reads no model input (positions, masks, index
//! arithmetic and relative-position biases an exporter computes from the input's shape)
//! is a function of the symbols sizing the input only. Computing it with the symbols
//! bound tells what it is: the ragged transform compares it at the padded extent and at a
//! sample's own (its prefix rule), the loader recognises gathers at a tensor's own
//! coordinates (`load::gathers`). This module computes it the way a plan would, for the
//! nodes it depends on only.

use tract_core::internal::*;
use tract_core::ops::konst::Const;
use tract_core::ops::source::TypedSource;

/// The symbols sizing `model`'s inputs, by input and axis: the dims of its input facts
/// that are a symbol. A plan over symbols (one for every batch shape) resolves them from
/// each run's inputs; [`input_symbol_values`] does it for a part or a count of the plan.
pub fn input_symbols(model: &TypedModel) -> TractResult<Vec<(usize, usize, Symbol)>> {
    let mut symbols = vec![];
    for (ix, outlet) in model.input_outlets()?.iter().enumerate() {
        for (axis, dim) in model.outlet_fact(*outlet)?.shape.iter().enumerate() {
            if let TDim::Sym(symbol) = dim {
                symbols.push((ix, axis, symbol.clone()));
            }
        }
    }
    Ok(symbols)
}

/// The values `inputs` give the [`input_symbols`] `symbols`: their extents there.
pub fn input_symbol_values(symbols: &[(usize, usize, Symbol)], inputs: &[TValue]) -> SymbolValues {
    input_symbol_values_over(SymbolValues::default(), symbols, inputs)
}

/// `values` with the [`input_symbols`] `symbols` set to their extents in `inputs`.
pub fn input_symbol_values_over(
    mut values: SymbolValues,
    symbols: &[(usize, usize, Symbol)],
    inputs: &[TValue],
) -> SymbolValues {
    for (ix, axis, symbol) in symbols {
        if let Some(extent) = inputs.get(*ix).and_then(|i| i.shape().get(*axis)) {
            values.set(symbol, *extent as i64);
        }
    }
    values
}

/// The value of `outlet` in `model` with the symbols at `values`, or an error when it
/// reads a model input or an op cannot be evaluated there (tract's gather panics on an
/// index out of its table: caught, an error too).
pub fn evaluate(
    model: &TypedModel,
    outlet: OutletId,
    values: &SymbolValues,
) -> TractResult<TValue> {
    crate::no_panic(
        || format!("Evaluating {outlet:?} at {values:?}"),
        || evaluate_unchecked(model, outlet, values),
    )
}

fn evaluate_unchecked(
    model: &TypedModel,
    outlet: OutletId,
    values: &SymbolValues,
) -> TractResult<TValue> {
    let order = cone(model, outlet.node)?;
    let seating = Seating::single();
    let mut computed: HashMap<usize, TVec<TValue>> = HashMap::default();
    for id in order {
        let node = model.node(id);
        let inputs: TVec<TValue> = node
            .inputs
            .iter()
            .map(|i| {
                computed
                    .get(&i.node)
                    .and_then(|outs| outs.get(i.slot))
                    .cloned()
                    .with_context(|| format!("input {i:?} of node {:?} not computed", node.name))
            })
            .collect::<TractResult<_>>()?;
        let outputs = if let Some(konst) = node.op_as::<Const>() {
            tvec!(bind_dims(konst.val(), values)?.into_tvalue())
        } else {
            let ctx = EvalContext {
                session: SessionId::NONE,
                node_id: id,
                symbols: values,
                scenario: None,
                shared: None,
                seating: &seating,
            };
            match node.op.state(&ctx)? {
                Some(mut state) => state.eval(&ctx, node.op.as_op(), inputs),
                None => node.op.eval(&ctx, inputs),
            }
            .with_context(|| format!("evaluating node {:?} ({})", node.name, node.op.name()))?
        };
        computed.insert(id, outputs);
    }
    computed
        .remove(&outlet.node)
        .and_then(|mut outs| (outlet.slot < outs.len()).then(|| outs.swap_remove(outlet.slot)))
        .context("the value was not computed")
}

/// Whether `outlet` reads no model input: a value of the model's shape and constants.
pub fn reads_no_input(model: &TypedModel, outlet: OutletId) -> bool {
    cone(model, outlet.node).is_ok()
}

/// The nodes `node` depends on, itself last, in an evaluation order; an error when one
/// of them is a model input.
fn cone(model: &TypedModel, node: usize) -> TractResult<Vec<usize>> {
    let mut order = vec![];
    let mut done: std::collections::HashSet<usize> = Default::default();
    // Depth-first, post-order, without recursion: a deep chain of shape arithmetic
    // must not exhaust the stack.
    let mut stack: Vec<(usize, bool)> = vec![(node, false)];
    while let Some((id, expanded)) = stack.pop() {
        if done.contains(&id) {
            continue;
        }
        let n = model.node(id);
        ensure!(
            !n.op_is::<TypedSource>(),
            "it reads the model input {:?}",
            n.name
        );
        if expanded {
            done.insert(id);
            order.push(id);
            continue;
        }
        stack.push((id, true));
        for i in &n.inputs {
            if !done.contains(&i.node) {
                stack.push((i.node, false));
            }
        }
    }
    Ok(order)
}

/// A constant with its symbolic extents (a folded `Shape`) bound to `values`.
fn bind_dims(tensor: &Arc<Tensor>, values: &SymbolValues) -> TractResult<Tensor> {
    if tensor.datum_type() != TDim::datum_type() {
        return Ok(tensor.as_ref().clone());
    }
    let mut bound = tensor.as_ref().clone();
    for d in bound.try_as_plain_ram_mut()?.as_slice_mut::<TDim>()? {
        *d = d.eval(values);
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_core::ops::array::Range;

    #[test]
    fn a_range_of_the_padded_extent_is_computed_at_the_bound_extent() -> TractResult<()> {
        let mut model = TypedModel::default();
        let l = model.symbols.sym("L");
        let start = model.add_const("start", tensor0(0i64))?;
        let end = model.add_const("end", tensor0(TDim::from(l.clone())))?;
        let end = model.wire_node(
            "cast",
            tract_core::ops::cast::cast(i64::datum_type()),
            &[end],
        )?[0];
        let step = model.add_const("step", tensor0(1i64))?;
        let range = model.wire_node("range", Range::new(l.clone().into()), &[start, end, step])?[0];
        let values = SymbolValues::default().with(&l, 4);
        let value = evaluate(&model, range, &values)?;
        assert_eq!(value.into_tensor(), tensor1(&[0i64, 1, 2, 3]));
        Ok(())
    }

    #[test]
    fn a_value_reading_an_input_is_not_evaluated() -> TractResult<()> {
        let mut model = TypedModel::default();
        let x = model.add_source("x", f32::fact([3]))?;
        let y = model.wire_node("neg", tract_core::ops::math::neg(), &[x])?[0];
        assert!(!reads_no_input(&model, y));
        assert!(evaluate(&model, y, &SymbolValues::default()).is_err());
        Ok(())
    }
}
