//! After tract-cuda's transform: the nodes it left on the host become CUDA ops of ours.
//!
//! tract-cuda translates every op it knows and leaves the others on the host, wrapped in
//! `DeviceSync`s: a copy to the host before, a copy back after. Our ragged ops are among
//! those, and so are tract's pools. This pass rebuilds the model node by node: each such
//! island becomes our CUDA op reading the device tensor the `DeviceSync` to the host was
//! reading, and the `DeviceSync`s back to the device that read the island now read our
//! op's output. The widths table, computed on the host, goes to the device once, shared
//! by every op that reads it.
//!
//! A ragged op of ours that has no CUDA version for its input is an error, never a silent
//! host island: [`check_no_host_island`] is what the tests and the runtime hold the plan to.

use tract_core::internal::*;
use tract_core::ops::konst::Const;
use tract_core::ops::source::TypedSource;
use tract_cuda::ops::CudaFusedAxisOp;
use tract_gpu::fact::{DeviceFact, DeviceTypedFactExt};
use tract_gpu::sync::{DeviceSync, DeviceSyncKind};
use tract_gpu::tensor::DeviceTensor;
use tract_gpu::tensor::IntoDevice;

use super::ops::{TRANSLATORS, host_inputs};
use crate::ops::WidthTable;

/// The CUDA op standing for a host node, if one of ours takes it ([`TRANSLATORS`]); an
/// error for one of our ragged ops that cannot go to the device.
fn cuda_op(model: &TypedModel, node: &TypedNode) -> TractResult<Option<Box<dyn TypedOp>>> {
    let dt = model
        .outlet_fact(
            node.inputs
                .first()
                .copied()
                .unwrap_or(OutletId::new(node.id, 0)),
        )?
        .datum_type;
    // What tract-cuda keeps on the host (f64 among others) stays there, ours included.
    if !DeviceTensor::is_supported_dt(dt) {
        return Ok(None);
    }
    for translate in TRANSLATORS {
        if let Some(op) = translate(node, dt)? {
            // Every input the op reads on the device must be of a type the device holds
            // (a gather's indices may be TDim where `integers` left them so).
            let host = host_inputs(&*op);
            for (slot, input) in node.inputs.iter().enumerate() {
                if !host.contains(&slot)
                    && !DeviceTensor::is_supported_dt(model.outlet_fact(*input)?.datum_type)
                {
                    return Ok(None);
                }
            }
            return Ok(Some(op));
        }
    }
    Ok(None)
}

fn sync_kind(node: &TypedNode) -> Option<DeviceSyncKind> {
    node.op_as::<DeviceSync>().map(|s| s.kind)
}

/// A sync to the host into which tract-cuda fused the axis ops before it: those axis ops,
/// which our op must apply on the device instead.
pub(crate) fn fused_sync_to_host(
    node: &TypedNode,
) -> Option<&TVec<tract_gpu::ops::change_axes::GpuAxisOp>> {
    let fused = node.op_as::<CudaFusedAxisOp>()?;
    let sync = fused.op.downcast_ref::<DeviceSync>()?;
    (sync.kind == DeviceSyncKind::ToHost).then(|| &fused.grouped_axis_ops[0])
}

struct Islands<'a> {
    source: &'a TypedModel,
    target: TypedModel,
    /// Source outlet to the target outlet holding its value as the source held it.
    mapping: HashMap<OutletId, OutletId>,
    /// Source outlet to a target outlet holding its value on the device, where known.
    on_device: HashMap<OutletId, OutletId>,
    /// Target host outlet to its copy on the device, made once.
    uploads: HashMap<OutletId, OutletId>,
}

impl Islands<'_> {
    /// `outlet` (of the source) on the device.
    fn device(&mut self, outlet: OutletId) -> TractResult<OutletId> {
        if let Some(d) = self.on_device.get(&outlet) {
            return Ok(*d);
        }
        let mapped = self.mapping[&outlet];
        if self.target.outlet_fact(mapped)?.as_device_fact().is_some() {
            return Ok(mapped);
        }
        let producer = self.source.node(outlet.node);
        if sync_kind(producer) == Some(DeviceSyncKind::ToHost) {
            return self.device(producer.inputs[0]);
        }
        if let Some(axis_ops) = fused_sync_to_host(producer) {
            let mut wire = self.device(producer.inputs[0])?;
            for (ix, op) in axis_ops.iter().enumerate() {
                let name = format!("{}.on-device.{ix}", producer.name);
                wire = self.target.wire_node(name, op.clone(), &[wire])?[0];
            }
            self.on_device.insert(outlet, wire);
            return Ok(wire);
        }
        if let Some(up) = self.uploads.get(&mapped) {
            return Ok(*up);
        }
        // A constant (weights, a bias) goes to the device once, with the plan, as
        // tract-cuda puts its own constants there.
        if let Some(konst) = self
            .target
            .node(mapped.node)
            .op_as::<Const>()
            .filter(|_| mapped.slot == 0)
        {
            let fact = self.target.outlet_fact(mapped)?.clone();
            let device = konst
                .val()
                .clone()
                .into_device()?
                .into_tensor()
                .into_arc_tensor();
            let op = Const::new_with_exotic_fact(device, Box::new(DeviceFact::from_host(fact)?))?;
            let name = format!("{}.on-device", self.target.node(mapped.node).name);
            let up = self.target.wire_node(name, op, &[])?[0];
            self.uploads.insert(mapped, up);
            return Ok(up);
        }
        let node_name = &self.target.node(mapped.node).name;
        let name = if mapped.slot == 0 {
            format!("{node_name}.to-device")
        } else {
            format!("{node_name}.to-device-{}", mapped.slot)
        };
        let up =
            self.target
                .wire_node(name, DeviceSync::new(DeviceSyncKind::ToDevice), &[mapped])?[0];
        self.uploads.insert(mapped, up);
        Ok(up)
    }

    fn node(&mut self, node: &TypedNode) -> TractResult<()> {
        if let Some(op) = cuda_op(self.source, node)? {
            // What the device holds no tensor of (a resize's sizes as TDims) stays on the
            // host: the op reads it there.
            let mut inputs = node
                .inputs
                .iter()
                .map(|i| {
                    if DeviceTensor::is_supported_dt(self.source.outlet_fact(*i)?.datum_type) {
                        self.device(*i)
                    } else {
                        Ok(self.mapping[i])
                    }
                })
                .collect::<TractResult<TVec<_>>>()?;
            for slot in host_inputs(&*op) {
                inputs.push(self.mapping[&node.inputs[slot]]);
            }
            let wires = self.target.wire_node(&node.name, op, &inputs)?;
            for (slot, wire) in wires.iter().enumerate() {
                let outlet = OutletId::new(node.id, slot);
                self.on_device.insert(outlet, *wire);
                // A host consumer (a model output, a host op) reads it back: lazily, only
                // if something does.
                let name = format!("{}.to-host-{slot}", node.name);
                let host = self.target.wire_node(
                    name,
                    DeviceSync::new(DeviceSyncKind::ToHost),
                    &[*wire],
                )?[0];
                self.mapping.insert(outlet, host);
            }
            return Ok(());
        }
        if sync_kind(node) == Some(DeviceSyncKind::ToDevice) {
            let input = node.inputs[0];
            let producer = self.source.node(input.node);
            if self.on_device.contains_key(&input) || producer.op_is::<WidthTable>() {
                let device = self.device(input)?;
                self.mapping.insert(OutletId::new(node.id, 0), device);
                return Ok(());
            }
        }
        let inputs: TVec<OutletId> = node.inputs.iter().map(|i| self.mapping[i]).collect();
        let wires = if let Some(s) = node.op_as::<TypedSource>() {
            tvec!(self.target.add_source(&node.name, s.fact.clone())?)
        } else {
            self.target
                .wire_node(&node.name, node.op.clone(), &inputs)?
        };
        for (slot, wire) in wires.iter().enumerate() {
            self.mapping.insert(OutletId::new(node.id, slot), *wire);
        }
        Ok(())
    }
}

/// Replaces the host islands of a model through tract-cuda's transform by our CUDA ops.
pub fn translate_islands(source: &TypedModel) -> TractResult<TypedModel> {
    let mut islands = Islands {
        source,
        target: TypedModel {
            symbols: source.symbols.clone(),
            ..TypedModel::default()
        },
        mapping: HashMap::default(),
        on_device: HashMap::default(),
        uploads: HashMap::default(),
    };
    let mut order = source.eval_order()?;
    for input in source.input_outlets()? {
        if !order.contains(&input.node) {
            order.insert(0, input.node);
        }
    }
    for id in order {
        let node = source.node(id);
        islands
            .node(node)
            .with_context(|| format!("ragged-cuda: node {node}"))?;
    }
    let mut target = islands.target;
    let inputs: Vec<OutletId> = source
        .input_outlets()?
        .iter()
        .map(|i| islands.mapping[i])
        .collect();
    let outputs: Vec<OutletId> = source
        .output_outlets()?
        .iter()
        .map(|o| islands.mapping[o])
        .collect();
    target.set_input_outlets(&inputs)?;
    target.select_output_outlets(&outputs)?;
    for (o, t) in source.output_outlets()?.iter().zip(&outputs) {
        if let Some(label) = source.outlet_label(*o) {
            target.set_outlet_label(*t, label.to_string())?;
        }
    }
    target.properties.clone_from(&source.properties);
    target.compact()?;
    Ok(target)
}

/// The nodes of a CUDA plan that run on the host between the input and output syncs:
/// what is neither a source, a `DeviceSync` (fused with axis ops or not), an op with
/// device outputs, nor width arithmetic on the host (the widths table and what is computed from the widths input
/// alone).
pub fn host_nodes(model: &TypedModel) -> TractResult<Vec<String>> {
    let mut width_only: std::collections::HashSet<usize> = Default::default();
    let mut host = vec![];
    for id in model.eval_order()? {
        let node = model.node(id);
        if node.op_is::<TypedSource>() {
            // The widths input is i64 [N]: what reads only it is width arithmetic.
            if model.outlet_fact(OutletId::new(id, 0))?.datum_type == i64::datum_type() {
                width_only.insert(id);
            }
            continue;
        }
        // Syncs (tract-cuda fuses axis ops into those to the host) move tensors; the
        // host nodes they feed are the ones named.
        if node.op_is::<DeviceSync>()
            || fused_sync_to_host(node).is_some()
            || node.op_is::<tract_core::ops::konst::Const>()
        {
            continue;
        }
        if !node.inputs.is_empty() && node.inputs.iter().all(|i| width_only.contains(&i.node)) {
            width_only.insert(id);
            continue;
        }
        let on_device = node
            .outputs
            .iter()
            .all(|o| o.fact.as_device_fact().is_some());
        if !on_device {
            host.push(format!("{} ({})", node.name, node.op.name()));
        }
    }
    Ok(host)
}

/// Fails when one of our ragged ops stayed on the host, but for a type the device holds
/// no tensor of (f64): tract-cuda keeps those on the host too. A ragged op is one that
/// reads the widths table (every mask and masked op does, [`crate::ops`]), so a new one
/// is held to this without being named here.
pub fn check_no_host_island(model: &TypedModel) -> TractResult<()> {
    for node in model.nodes() {
        let reads_table = node
            .inputs
            .iter()
            .any(|i| i.slot == 0 && model.node(i.node).op_is::<WidthTable>());
        if !reads_table || node.op_is::<DeviceSync>() {
            continue;
        }
        let Some(data) = node.inputs.first() else {
            continue;
        };
        // Width arithmetic on the table itself (a recurrence's lengths) stays on the host.
        if model.node(data.node).op_is::<WidthTable>() {
            continue;
        }
        let dt = model.outlet_fact(*data)?.datum_type;
        ensure!(
            !DeviceTensor::is_supported_dt(dt),
            "ragged-cuda: {} ({}) stayed on the host",
            node.name,
            node.op.name()
        );
    }
    Ok(())
}
