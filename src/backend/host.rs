//! The host backend: batches as host tensors, what every tract runtime takes and gives.
//!
//! It is the backend of tract's CPU runtime, and of any runtime whose plans no other
//! backend claims: a device runtime still takes a host batch (and brings it over
//! itself), only less quickly than through its own backend.

use std::time::Instant;

use tract_core::internal::*;

use super::{Backend, CostModel, NodeRun, NodeTimes};
use crate::batch::{crop_all, pack};
use crate::transform::OutputLayout;

/// Tensors on the host (module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostBackend;

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn upload(&self, samples: &[&Tensor], axes: &[usize], padded: &[usize]) -> TractResult<TValue> {
        Ok(pack(samples, axes, padded)?.into_tvalue())
    }

    fn download(
        &self,
        outputs: &[TValue],
        layouts: &[OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        crop_all(outputs, layouts, n)
    }

    /// 80% of the host's available memory.
    fn memory_budget(&self) -> u64 {
        available_memory() / 5 * 4
    }

    /// Batches of at most 4 and a small overhead: tract's CPU runtime runs big batches
    /// less efficiently per cell than small ones (measured on PP-OCRv4 rec: 28 lines one
    /// by one in 1.75 s, in batches of 8 in 5.2 s).
    fn cost_model(&self) -> CostModel {
        CostModel {
            max_batch: Some(4),
            batch_overhead: 1024,
        }
    }

    fn time_nodes(
        &self,
        state: &mut TypedSimpleState,
        inputs: TVec<TValue>,
    ) -> TractResult<NodeTimes> {
        let mut nodes = vec![];
        let outputs = state.run_plan_with_eval(inputs, |turn, node_state, node, input| {
            let start = Instant::now();
            let res = tract_core::plan::eval(turn, node_state, node, input);
            let time = start.elapsed();
            nodes.push(NodeRun {
                node: node.id,
                time,
                host: time,
            });
            res
        })?;
        Ok(NodeTimes {
            nodes,
            device: false,
            arena: false,
            outputs,
        })
    }
}

/// The host's available memory, in bytes (`MemAvailable` on Linux; 8 GiB where it cannot
/// be read).
pub fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(8 << 30)
}
