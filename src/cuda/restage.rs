//! Restaging: a CUDA graph replayed for new host inputs of the same shapes, its host
//! values computed again and written where its uploads read them.
//!
//! A ragged plan's host inputs are its widths; what it computes from them on the host
//! (the widths table) crosses to the device through the uploads ([`DeviceSync`] to the
//! device) that a capture reads from page-locked buffers ([`super::graph`]). Keyed by the
//! widths' bytes, a graph replays only batches of the same widths, which lines and
//! gatherings of a server rarely repeat. When nothing else of the plan depends on the
//! host inputs' values, a graph is keyed by their shapes instead: before each replay, the
//! host part of the plan runs again on the new host inputs ([`Restage::values`], a plan of
//! its own), and its values are written into the page-locked buffers, which the replay's
//! uploads then read. The device work is the capture's, on the values a plain run of
//! those inputs would upload: the replay gives what that run gives.
//!
//! A plan is restaged only where (for the host inputs of the run):
//! - every node that reads a value derived from a host input runs on the host or is an
//!   upload: a device op reading host values as its parameters (a resize's scales, a
//!   recurrence's lengths for cuDNN) launches with them, and its launches are captured;
//! - what the uploads take, and the plan's outputs computed on the host from the host
//!   inputs (a ragged model's output widths), are computed from host inputs and
//!   constants only: both are computed again for each replay.
//!
//! Otherwise the graph is keyed by the host inputs' bytes, as before.

use std::collections::{HashMap, HashSet};

use tract_core::internal::*;
use tract_core::ops::source::TypedSource;
use tract_gpu::fact::DeviceTypedFactExt;
use tract_gpu::sync::{DeviceSync, DeviceSyncKind};

/// The host part of a plan, to run again before each replay (module doc).
pub struct Restage {
    /// The plan's inputs that arrive on the host, in order: the inputs of `plan`.
    pub host_inputs: Vec<usize>,
    /// The uploads whose values derive from the host inputs, by node: output `k` of `plan`
    /// is what upload `uploads[k]` takes.
    pub uploads: Vec<usize>,
    /// The plan's outputs derived from the host inputs: output `uploads.len() + k` of
    /// `plan` is the plan's output `outputs[k]`.
    pub outputs: Vec<usize>,
    /// The symbols of the plan's inputs' facts, by input and axis: a plan over symbols
    /// (one for every batch shape) has its host part read extents its host inputs do
    /// not carry (a page's height), given from all the inputs' shapes.
    symbols: Vec<(usize, usize, Symbol)>,
    plan: Arc<TypedSimplePlan>,
}

impl std::fmt::Debug for Restage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Restage {{ host inputs {:?}, uploads {:?} }}",
            self.host_inputs, self.uploads
        )
    }
}

fn is_upload(node: &TypedNode) -> bool {
    node.op_as::<DeviceSync>()
        .is_some_and(|s| s.kind == DeviceSyncKind::ToDevice)
}

/// A node whose outputs all stay on the host and that is no crossing.
fn on_host(node: &TypedNode) -> bool {
    node.op_as::<DeviceSync>().is_none()
        && super::islands::fused_sync_to_host(node).is_none()
        && node
            .outputs
            .iter()
            .all(|o| o.fact.as_device_fact().is_none())
}

impl Restage {
    /// The restaging of `model` for a run whose inputs `host` arrive on the host, or why
    /// it has none.
    pub fn of(model: &TypedModel, host: &[usize]) -> Result<Restage, String> {
        Self::analyse(model, host).map_err(|e| format!("{e:#}"))?
    }

    fn analyse(model: &TypedModel, host: &[usize]) -> TractResult<Result<Restage, String>> {
        let sources: Vec<usize> = host
            .iter()
            .map(|ix| Ok(model.input_outlets()?.get(*ix).context("an input")?.node))
            .collect::<TractResult<_>>()?;
        // Everything derived from the host inputs, up to the uploads.
        let mut derived: HashSet<usize> = sources.iter().copied().collect();
        let mut uploads = vec![];
        for id in model.eval_order()? {
            let node = model.node(id);
            if sources.contains(&id) || !node.inputs.iter().any(|i| derived.contains(&i.node)) {
                continue;
            }
            if is_upload(node) {
                uploads.push(id);
                continue;
            }
            if !on_host(node) {
                return Ok(Err(format!(
                    "{node} reads a value derived from the host inputs on the device"
                )));
            }
            derived.insert(id);
        }
        // What the uploads take, computed from host inputs and constants only.
        let mut needed: HashSet<usize> = HashSet::new();
        // The outputs derived from the host inputs, on the host.
        let mut outputs = vec![];
        for (ix, o) in model.output_outlets()?.iter().enumerate() {
            if derived.contains(&o.node) {
                outputs.push(ix);
            }
        }
        let mut targets: Vec<OutletId> = uploads.iter().map(|u| model.node(*u).inputs[0]).collect();
        for ix in &outputs {
            targets.push(model.output_outlets()?[*ix]);
        }
        let mut stack: Vec<usize> = targets.iter().map(|o| o.node).collect();
        while let Some(id) = stack.pop() {
            if !needed.insert(id) || sources.contains(&id) {
                continue;
            }
            let node = model.node(id);
            if node.op_is::<TypedSource>() {
                return Ok(Err(format!(
                    "{node}, an input on the device, feeds an upload"
                )));
            }
            if !on_host(node) {
                return Ok(Err(format!("{node}, on the device, feeds an upload")));
            }
            stack.extend(node.inputs.iter().map(|i| i.node));
        }
        let mut sub = TypedModel::default();
        let mut wired: HashMap<OutletId, OutletId> = HashMap::new();
        for &id in &sources {
            let outlet = OutletId::new(id, 0);
            let source =
                sub.add_source(&model.node(id).name, model.outlet_fact(outlet)?.clone())?;
            wired.insert(outlet, source);
        }
        for id in model.eval_order()? {
            if !needed.contains(&id) || sources.contains(&id) {
                continue;
            }
            let node = model.node(id);
            let inputs = node
                .inputs
                .iter()
                .map(|i| {
                    wired
                        .get(i)
                        .copied()
                        .context("an input wired before its node")
                })
                .collect::<TractResult<TVec<_>>>()?;
            let outs = sub.wire_node(&node.name, node.op.clone(), &inputs)?;
            for (slot, o) in outs.into_iter().enumerate() {
                wired.insert(OutletId::new(id, slot), o);
            }
        }
        let outlets = targets
            .iter()
            .map(|o| {
                wired
                    .get(o)
                    .copied()
                    .with_context(|| format!("the value of {o:?}"))
            })
            .collect::<TractResult<Vec<_>>>()?;
        sub.select_output_outlets(&outlets)?;
        let plan = TypedSimplePlan::new(sub).context("Preparing the host part of a plan")?;
        let symbols = crate::evaluate::input_symbols(model)?;
        Ok(Ok(Restage {
            host_inputs: host.to_vec(),
            uploads,
            outputs,
            symbols,
            plan,
        }))
    }

    /// What the uploads take for the plan's `inputs`, by upload (`uploads`' order), then
    /// the plan's outputs derived from them (`outputs`' order).
    ///
    /// `captured` are the symbols the capture's run resolved: a plan over symbols resolves
    /// some from the shapes its device ops give (a feature pyramid's level heights), which
    /// the host part does not run. A graph is looked up by its inputs' shapes, so they
    /// hold for its replays; the inputs' own symbols are set from `inputs` over them.
    pub fn values(&self, inputs: &[TValue], captured: &SymbolValues) -> TractResult<TVec<TValue>> {
        let host = self
            .host_inputs
            .iter()
            .map(|ix| inputs.get(*ix).cloned().context("a host input"))
            .collect::<TractResult<TVec<_>>>()?;
        let mut state = TypedSimpleState::new(&self.plan)?;
        state.turn_state.resolved_symbols =
            crate::evaluate::input_symbol_values_over(captured.clone(), &self.symbols, inputs);
        state.run(host).context("Computing a replay's host values")
    }
}
