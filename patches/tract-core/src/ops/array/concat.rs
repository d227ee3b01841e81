use tract_data::itertools::Itertools;
use tract_num_traits::Zero;

use crate::internal::*;

use super::Slice;

#[derive(new, Debug, Clone, Hash, PartialEq, Eq)]
pub struct TypedConcat {
    pub axis: usize,
}

impl TypedConcat {
    pub fn offsets(&self, inputs: &[&TypedFact]) -> TractResult<Vec<TDim>> {
        let mut offsets = vec![0.to_dim()];
        for slice in inputs {
            let len = slice.shape[self.axis].clone();
            let offset = len + offsets.last().unwrap();
            offsets.push(offset)
        }
        Ok(offsets)
    }
}

impl Op for TypedConcat {
    fn name(&self) -> StaticName {
        "Concat".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("axis: {}", self.axis)])
    }

    op_as_typed_op!();
}

impl TypedOp for TypedConcat {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        ensure!(inputs.len() > 0);
        let mut fact = inputs[0].without_value();
        for input in inputs {
            if input.rank() != fact.rank()
                || input
                    .shape
                    .iter()
                    .zip(fact.shape.iter())
                    .enumerate()
                    .filter(|(ax, _)| *ax != self.axis)
                    .any(|(_, (i, f))| i != f)
            {
                bail!("Inconsistent concat {:?} inputs: {:?}", self, inputs);
            }
        }
        fact.shape.set(self.axis, self.offsets(inputs)?.pop().unwrap());
        Ok(tvec!(fact))
    }

    fn axes_mapping(
        &self,
        inputs: &[&TypedFact],
        outputs: &[&TypedFact],
    ) -> TractResult<AxesMapping> {
        let mut axes = AxesMapping::disconnected(inputs, outputs)?;
        for ax in 0..outputs[0].rank() {
            if ax != self.axis {
                for i in 0..inputs.len() {
                    axes = axes.linking((InOut::Out(0), ax), (InOut::In(i), ax))?;
                }
            }
        }
        Ok(axes)
    }

    fn change_axes(
        &self,
        model: &TypedModel,
        node: &TypedNode,
        _io: InOut,
        change: &AxisOp,
    ) -> TractResult<Option<AxisChangeConsequence>> {
        rule_if_some!(axis = change.transform_axis(self.axis));
        let op = TypedConcat { axis };
        Ok(Some(AxisChangeConsequence::new(model, node, Some(Box::new(op)), change)))
    }

    fn declutter(
        &self,
        model: &TypedModel,
        node: &TypedNode,
    ) -> TractResult<Option<TypedModelPatch>> {
        if node.inputs.len() == 1 {
            return TypedModelPatch::shunt_one_op(model, node);
        }
        let inputs = model.node_input_facts(node.id)?;
        if let Some(pos) = inputs.iter().position(|f| f.shape.volume().is_zero()) {
            let mut inputs = node.inputs.clone();
            inputs.remove(pos);
            return Ok(Some(TypedModelPatch::replace_single_op(
                model,
                node,
                &inputs,
                self.clone(),
            )?));
        }
        Ok(None)
    }

    fn slice(
        &self,
        patch: &mut TypedModelPatch,
        _model: &TypedModel,
        _node: &TypedNode,
        prefix: &str,
        inputs: &[OutletId],
        output_axis: usize,
        start: &TDim,
        end: &TDim,
    ) -> TractResult<Option<TVec<OutletId>>> {
        if output_axis != self.axis {
            return Ok(Some(patch.wire_node(prefix, self.clone(), inputs)?));
        }
        let facts =
            inputs.iter().map(|o| patch.outlet_fact(*o)).collect::<TractResult<TVec<_>>>()?;
        let offsets = self.offsets(&facts)?;
        std::mem::drop(facts);
        for (ix, (slice_start, slice_end)) in offsets.iter().tuple_windows().enumerate() {
            if (start.clone() - slice_start).prove_positive_or_zero()
                && (slice_end.clone() - end).prove_positive_or_zero()
            {
                return patch
                    .wire_node(
                        format!("{prefix}.slice-{output_axis}.{start}..{end}"),
                        Slice {
                            axis: output_axis,
                            start: (start.clone() - slice_start),
                            end: (end.clone() - slice_start),
                        },
                        &[inputs[ix]],
                    )
                    .map(Some);
            }
        }
        Ok(None)
    }
}

impl EvalOp for TypedConcat {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        if let Some(result) = concat_threaded(self.axis, &inputs)? {
            return Ok(tvec![result.into_tvalue()]);
        }
        let result = Tensor::stack_tensors(self.axis, &inputs)?;
        Ok(tvec![result.into_tvalue()])
    }
}

/// tract-ragged's patch: a concatenation of at least a megabyte of plain tensors of a
/// copied datum type, its output's bytes cut in pieces copied over the threads of the
/// executor in scope (a copy: the same bytes at any count of threads). None where it does
/// not apply (`Tensor::stack_tensors` then).
fn concat_threaded(axis: usize, inputs: &[TValue]) -> TractResult<Option<Tensor>> {
    let Some(first) = inputs.first() else { return Ok(None) };
    let (dt, rank) = (first.datum_type(), first.rank());
    let alike = |t: &TValue| {
        t.datum_type() == dt
            && t.rank() == rank
            && (0..rank).all(|ax| ax == axis || t.shape()[ax] == first.shape()[ax])
    };
    if !dt.is_copy() || axis >= rank || !inputs.iter().all(alike) {
        return Ok(None);
    }
    let mut shape: TVec<usize> = first.shape().into();
    shape[axis] = inputs.iter().map(|t| t.shape()[axis]).sum();
    let size = dt.size_of();
    let len = shape.iter().product::<usize>() * size;
    if len < 1 << 20 || size == 0 {
        return Ok(None);
    }
    let Ok(views) = inputs.iter().map(|t| t.try_as_plain_ram()).collect::<TractResult<Vec<_>>>()
    else {
        return Ok(None);
    };
    let sources: Vec<&[u8]> = views.iter().map(|v| v.as_bytes()).collect();
    // Each output row (the axes from `axis` on) is every input's block of it in turn.
    let row: usize = shape[axis..].iter().product::<usize>() * size;
    let blocks: Vec<usize> =
        inputs.iter().map(|t| t.shape()[axis..].iter().product::<usize>() * size).collect();
    let mut output = unsafe { Tensor::uninitialized_dt(dt, &shape)? };
    let bytes = output.as_bytes_mut();
    ensure!(bytes.len() == len && row > 0);
    tract_linalg::multithread::par_chunks_mut(bytes, size, len / size, |first, piece| {
        let mut at = first * size;
        let mut piece = piece;
        while !piece.is_empty() {
            let (r, mut col) = (at / row, at % row);
            let mut i = 0;
            while col >= blocks[i] {
                col -= blocks[i];
                i += 1;
            }
            let n = (blocks[i] - col).min(piece.len());
            let (dst, rest) = piece.split_at_mut(n);
            dst.copy_from_slice(&sources[i][r * blocks[i] + col..][..n]);
            piece = rest;
            at += n;
        }
        Ok(())
    })?;
    Ok(Some(output))
}
