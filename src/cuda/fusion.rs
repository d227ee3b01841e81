//! The fusion pass: element-wise chains on the device as one generated kernel each
//! ([`CudaFusedElementwise`]) instead of one tract-cuda launch per link.
//!
//! tract-cuda runs each binary op as its own kernel: on PP-OCRv4 rec, 300 launches per
//! batch, each reading and writing a whole activation, half of the device time. After
//! tract-cuda's translation (and ours), [`fuse`] finds the chains of its f32 or f16 binary ops
//! ([`crate::elementwise::find_chains`]) and replaces each by a fused op, compiling its
//! kernel now for the shapes the plan is made for. Same bits as unfused (the op's doc
//! says why).
//!
//! A ragged mask that reads a fused chain, when nothing else reads it, goes into the
//! chain's kernel too (`fuse_masks`): the kernel writes the fill past each sample's
//! width instead of a second pass copying the whole tensor.
//!
//! `TRACT_RAGGED_FUSE` off turns the pass off ([`super::RaggedCudaRuntime::translate`]).

use tract_core::internal::*;
use tract_cuda::ops::CudaFusedAxisOp;
use tract_gpu::ops::binary::GpuBinOp;
use tract_gpu::ops::change_axes::GpuAxisOp;

use super::ops::fused_elementwise::{CudaFusedElementwise, FusedMask};
use super::ops::mask::CudaMask;
use crate::elementwise::{BinKind, ChainNodes, all_facts, fuse_chains};

/// tract-cuda's binary ops, bare or behind the axis ops it fused into their inputs. The
/// pass runs on ragged-cuda's translation: every device binary op there is tract-cuda's.
struct CudaNodes;

impl CudaNodes {
    fn binary(node: &TypedNode) -> Option<(&GpuBinOp, Option<&CudaFusedAxisOp>)> {
        if let Some(op) = node.op_as::<GpuBinOp>() {
            return Some((op, None));
        }
        let fused = node.op_as::<CudaFusedAxisOp>()?;
        Some((fused.op.downcast_ref::<GpuBinOp>()?, Some(fused)))
    }

    fn views(node: &TypedNode, slot: usize) -> &[GpuAxisOp] {
        match Self::binary(node) {
            Some((_, Some(fused))) => fused.grouped_axis_ops.get(slot).map_or(&[], |v| &**v),
            _ => &[],
        }
    }
}

impl ChainNodes for CudaNodes {
    fn kind(&self, model: &TypedModel, node: &TypedNode) -> Option<BinKind> {
        let (op, _) = Self::binary(node)?;
        // On the device: f32 device facts in and out, or f16 ones.
        let of = |dt: DatumType| {
            all_facts(model, node, |f| {
                f.datum_type == dt && f.exotic_fact.is_some()
            })
        };
        (of(DatumType::F32) || of(DatumType::F16)).then(|| BinKind::of(&*op.mini_op))?
    }

    fn plain_input(&self, node: &TypedNode, slot: usize) -> bool {
        Self::views(node, slot).is_empty()
    }

    fn operand_view(&self, node: &TypedNode, slot: usize) -> String {
        format!("{:?}", Self::views(node, slot))
    }
}

/// Replaces the element-wise chains of a model translated for the device by fused
/// kernels, compiling them now. Returns how many chains it fused.
pub fn fuse(model: &mut TypedModel) -> TractResult<usize> {
    let fused = fuse_chains(model, &CudaNodes, &|model, program, operands, tail| {
        let views = operands
            .iter()
            .map(|o| CudaNodes::views(model.node(o.node), o.slot).into())
            .collect();
        let fact = model.outlet_fact(OutletId::new(tail, 0))?;
        let op =
            CudaFusedElementwise::new(program.clone(), views, fact.shape.clone(), fact.datum_type)?;
        let facts = operands
            .iter()
            .map(|o| model.outlet_fact(model.node(o.node).inputs[o.slot]))
            .collect::<TractResult<Vec<_>>>()?;
        op.compile_for(&facts)?;
        Ok(Box::new(op))
    })?;
    let masks = fuse_masks(model)?;
    if fused + masks > 0 {
        model.compact()?;
    }
    Ok(fused)
}

/// Moves each mask with one ragged axis into the fused chain it reads (of its type), where
/// the chain has no other reader. Returns how many it moved.
fn fuse_masks(model: &mut TypedModel) -> TractResult<usize> {
    let outputs = model.output_outlets()?.to_vec();
    let mut moved = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(CudaMask(mask)) = node.op_as::<CudaMask>() else {
            continue;
        };
        let producer = node.inputs[0];
        let chain_node = model.node(producer.node);
        let Some(chain) = chain_node.op_as::<CudaFusedElementwise>() else {
            continue;
        };
        let [ragged] = &*mask.axes.ragged else {
            continue;
        };
        if chain.mask.is_some()
            || mask.fill.datum_type() != chain.dt
            || chain_node.outputs[0].successors.len() != 1
            || outputs.contains(&producer)
        {
            continue;
        }
        let fill = mask.fill.cast_to_scalar::<f32>()?;
        let mut op = chain.clone();
        op.mask = Some(FusedMask {
            batch: mask.axes.batch,
            axis: ragged.axis,
            row: ragged.row,
            fill_bits: fill.to_bits(),
        });
        let mut patch = TypedModelPatch::default();
        let inputs = chain_node
            .inputs
            .iter()
            .chain(std::iter::once(&node.inputs[1]))
            .map(|i| patch.tap_model(model, *i))
            .collect::<TractResult<TVec<_>>>()?;
        let fused = patch.wire_node(format!("{}.masked", chain_node.name), op, &inputs)?[0];
        patch.shunt_outside(model, OutletId::new(id, 0), fused)?;
        patch.apply(model)?;
        moved += 1;
    }
    Ok(moved)
}
