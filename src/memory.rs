//! The peak memory of a plan, from the model's symbolic shapes: what the scheduler sizes
//! batches by.
//!
//! A transformed model is typed once with a symbolic batch and width, so the size of
//! every tensor is an expression in them. Walking the model in evaluation order, each
//! tensor alive from its producer to its last reader, gives the largest total alive at
//! once for any batch size and padded width, without preparing a plan for it.

use tract_core::internal::*;

/// A model's tensors in evaluation order, each with its size as an expression in the
/// model's symbols and the step after which it is freed: the peak memory of running the
/// model (the largest total size of the tensors alive at once, each freed after its last
/// reader) for any symbol values, without walking the graph again. The scheduler asks for
/// the peak of many batch shapes (a few per new width bucket and batch size); the sizes'
/// expressions, simplified once here, were most of each answer's time (3 ms on PP-OCRv4
/// rec's 1000 nodes, against 53 us for the walk).
#[derive(Clone, Debug)]
pub struct MemoryWalk {
    /// Each tensor not a constant: its element count and element size.
    tensors: Vec<(TDim, u64)>,
    /// Per step, the tensors it makes (indices into `tensors`), then those it frees.
    steps: Vec<(Vec<usize>, Vec<usize>)>,
}

impl MemoryWalk {
    /// The walk of `model`.
    pub fn new(model: &TypedModel) -> TractResult<MemoryWalk> {
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
        let mut tensors = vec![];
        let mut steps: Vec<(Vec<usize>, Vec<usize>)> = vec![(vec![], vec![]); order.len()];
        for (step, id) in order.iter().enumerate() {
            let node = model.node(*id);
            for (slot, output) in node.outputs.iter().enumerate() {
                if output.fact.konst.is_some() {
                    continue;
                }
                let ix = tensors.len();
                tensors.push((
                    output.fact.shape.volume(),
                    output.fact.datum_type.size_of() as u64,
                ));
                steps[step].0.push(ix);
                // Freed after its last reader's step, or its own when nothing reads it.
                match last_use.get(&OutletId::new(*id, slot)) {
                    Some(&usize::MAX) => {}
                    Some(last) => steps[(*last).max(step)].1.push(ix),
                    None => steps[step].1.push(ix),
                }
            }
        }
        Ok(MemoryWalk { tensors, steps })
    }

    /// The peak memory in bytes with the symbols set to `values`.
    pub fn peak(&self, values: &SymbolValues) -> TractResult<u64> {
        let bytes = self
            .tensors
            .iter()
            .map(|(volume, size)| Ok(volume.eval_to_i64(values)?.max(0) as u64 * size))
            .collect::<TractResult<Vec<u64>>>()?;
        let (mut current, mut peak) = (0u64, 0u64);
        for (made, freed) in &self.steps {
            current += made.iter().map(|ix| bytes[*ix]).sum::<u64>();
            peak = peak.max(current);
            current -= freed.iter().map(|ix| bytes[*ix]).sum::<u64>();
        }
        Ok(peak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_core::ops::math;
    use tract_core::ops::nn;

    /// x -> a = relu(x) -> b = relu(a) -> c = b + x: x lives to the end, a dies with b's
    /// step, so the peak is x, b and c at once, three tensors of N x W floats; a constant
    /// weighs nothing.
    #[test]
    fn the_peak_is_the_most_alive_at_once_for_any_symbols() -> TractResult<()> {
        let mut model = TypedModel::default();
        let (n, w) = (model.symbols.sym("N"), model.symbols.sym("W"));
        let x = model.add_source("x", f32::fact(&[n.to_dim(), w.to_dim()]))?;
        let a = model.wire_node("a", nn::leaky_relu(0.0), &[x])?;
        let b = model.wire_node("b", nn::leaky_relu(0.0), &[a[0]])?;
        let k = model.add_const("k", tensor2(&[[1f32]]))?;
        let c = model.wire_node("c", math::add(), &[b[0], x])?;
        let d = model.wire_node("d", math::mul(), &[c[0], k])?;
        model.select_output_outlets(&d)?;
        let walk = MemoryWalk::new(&model)?;
        for (nv, wv) in [(1i64, 1i64), (2, 3), (32, 1408)] {
            let mut values = SymbolValues::default();
            values.set(&n, nv);
            values.set(&w, wv);
            // x, b, c alive as c is made; then x and b die and d is made: c, d.
            assert_eq!(walk.peak(&values)?, 3 * (nv * wv) as u64 * 4);
        }
        Ok(())
    }
}
