//! The peak memory of a plan, from the model's symbolic shapes: what the scheduler sizes
//! batches by.
//!
//! A transformed model is typed once with a symbolic batch and width, so the size of
//! every tensor is an expression in them. Walking the model in evaluation order, each
//! tensor alive from its producer to its last reader, gives the largest total alive at
//! once for any batch size and padded width, without preparing a plan for it.

use tract_core::internal::*;

/// The peak memory, in bytes, of running `model` with its symbols set to `values`: the
/// largest total size of the tensors alive at once, walking the model in evaluation order
/// and freeing each tensor after its last reader.
pub fn peak_memory(model: &TypedModel, values: &SymbolValues) -> TractResult<u64> {
    let order = model.eval_order()?;
    let mut last_use: HashMap<OutletId, usize> = HashMap::default();
    for (step, id) in order.iter().enumerate() {
        for input in &model.node(*id).inputs {
            last_use.insert(*input, step);
        }
    }
    for output in model.output_outlets()? {
        last_use.insert(*output, usize::MAX);
    }
    let mut alive: HashMap<OutletId, u64> = HashMap::default();
    let (mut current, mut peak) = (0u64, 0u64);
    for (step, id) in order.iter().enumerate() {
        let node = model.node(*id);
        for (slot, output) in node.outputs.iter().enumerate() {
            if output.fact.konst.is_some() {
                continue;
            }
            let volume = output.fact.shape.volume().eval_to_i64(values)?.max(0) as u64;
            let bytes = volume * output.fact.datum_type.size_of() as u64;
            alive.insert(OutletId::new(*id, slot), bytes);
            current += bytes;
        }
        peak = peak.max(current);
        alive.retain(|outlet, bytes| {
            let keep = last_use.get(outlet).is_some_and(|last| *last > step);
            if !keep {
                current -= *bytes;
            }
            keep
        });
    }
    Ok(peak)
}
