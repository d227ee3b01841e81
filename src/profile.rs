//! Per-node timings of a prepared plan: where a batch's time goes.
//!
//! On the CPU each node is timed on the host. On a CUDA plan, host time says nothing
//! (launches return at once): each node's device time is measured between two CUDA events
//! recorded on the stream around its evaluation, so the cuDNN and cuBLAS work it queues is
//! counted too, without serialising the plan. The layout follows the tract CLI's profile:
//! nodes by time with their share, then ops by total time.

use std::fmt;
use std::time::{Duration, Instant};

use tract_core::internal::*;

/// The time of one node, averaged over the runs.
#[derive(Clone, Debug)]
pub struct NodeTime {
    pub id: usize,
    pub name: String,
    pub op: String,
    pub time: Duration,
}

/// Per-node times of a plan.
#[derive(Clone, Debug)]
pub struct Profile {
    pub nodes: Vec<NodeTime>,
    /// The whole run, wall clock, averaged.
    pub entire: Duration,
    pub runs: usize,
    /// Device time (CUDA events) rather than host time.
    pub device: bool,
}

impl Profile {
    pub fn total(&self) -> Duration {
        self.nodes.iter().map(|n| n.time).sum()
    }

    /// Total time and node count per op name, largest first.
    pub fn by_op(&self) -> Vec<(String, Duration, usize)> {
        let mut ops: HashMap<String, (Duration, usize)> = HashMap::default();
        for n in &self.nodes {
            let e = ops.entry(n.op.clone()).or_default();
            e.0 += n.time;
            e.1 += 1;
        }
        let mut ops: Vec<_> = ops.into_iter().map(|(k, (d, c))| (k, d, c)).collect();
        ops.sort_by_key(|o| std::cmp::Reverse(o.1));
        ops
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total().as_secs_f64().max(1e-12);
        let mut nodes: Vec<&NodeTime> = self.nodes.iter().collect();
        nodes.sort_by_key(|n| std::cmp::Reverse(n.time));
        writeln!(
            f,
            "{} time per node, average of {} run(s); the slowest first",
            if self.device {
                "device (CUDA events)"
            } else {
                "host"
            },
            self.runs
        )?;
        writeln!(f, "{:>10} {:>6}  {:<32} node", "time", "share", "op")?;
        for n in nodes.iter().filter(|n| !n.time.is_zero()).take(40) {
            let share = 100.0 * n.time.as_secs_f64() / total;
            writeln!(
                f,
                "{:>8.3}ms {:>5.1}%  {:<32} #{} {}",
                n.time.as_secs_f64() * 1e3,
                share,
                n.op,
                n.id,
                n.name
            )?;
        }
        writeln!(f, "\nby op:")?;
        for (op, d, count) in self.by_op() {
            let share = 100.0 * d.as_secs_f64() / total;
            writeln!(
                f,
                "{:>8.3}ms {:>5.1}%  {:<32} {count} node(s)",
                d.as_secs_f64() * 1e3,
                share,
                op
            )?;
        }
        write!(
            f,
            "\nsum of nodes {:.3}ms, entire run {:.3}ms (wall clock)",
            self.total().as_secs_f64() * 1e3,
            self.entire.as_secs_f64() * 1e3
        )
    }
}

/// Profiles `runnable` on `inputs`: one warm-up run, then `runs` timed ones.
pub fn profile(
    runnable: &Arc<dyn Runnable>,
    inputs: TVec<TValue>,
    runs: usize,
) -> TractResult<Profile> {
    let plan = runnable
        .typed_plan()
        .context("only a typed plan can be profiled")?
        .clone();
    runnable.run(inputs.clone())?;
    let device = is_device_plan(plan.model());
    let mut times: HashMap<usize, Duration> = HashMap::default();
    let mut entire = Duration::default();
    for _ in 0..runs.max(1) {
        let mut state = plan.spawn()?;
        let started = Instant::now();
        let per_node = if device {
            run_on_device(&mut state, inputs.clone())?
        } else {
            let mut per_node = vec![];
            state.run_plan_with_eval(inputs.clone(), |turn, node_state, node, input| {
                let start = Instant::now();
                let res = tract_core::plan::eval(turn, node_state, node, input);
                per_node.push((node.id, start.elapsed()));
                res
            })?;
            per_node
        };
        entire += started.elapsed();
        for (node, d) in per_node {
            *times.entry(node).or_default() += d;
        }
    }
    let runs = runs.max(1);
    let nodes = plan
        .model()
        .nodes()
        .iter()
        .map(|n| NodeTime {
            id: n.id,
            name: n.name.clone(),
            op: n.op.name().to_string(),
            time: times.get(&n.id).copied().unwrap_or_default() / runs as u32,
        })
        .collect();
    Ok(Profile {
        nodes,
        entire: entire / runs as u32,
        runs,
        device,
    })
}

#[cfg(feature = "cuda")]
fn is_device_plan(model: &TypedModel) -> bool {
    model
        .nodes()
        .iter()
        .any(|n| n.op_is::<tract_gpu::sync::DeviceSync>())
}

#[cfg(not(feature = "cuda"))]
fn is_device_plan(_model: &TypedModel) -> bool {
    false
}

#[cfg(feature = "cuda")]
fn run_on_device(
    state: &mut TypedSimpleState,
    inputs: TVec<TValue>,
) -> TractResult<Vec<(usize, Duration)>> {
    use cudarc::driver::sys::CUevent_flags;
    let mut events = vec![];
    tract_cuda::with_cuda_stream(|stream| {
        state.run_plan_with_eval(inputs, |turn, node_state, node, input| -> TractResult<_> {
            let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
            let start = stream.record_event(flags)?;
            let res = tract_core::plan::eval(turn, node_state, node, input);
            let end = stream.record_event(flags)?;
            events.push((node.id, start, end));
            res
        })?;
        stream.synchronize()?;
        Ok(())
    })?;
    events
        .into_iter()
        .map(|(node, start, end)| {
            Ok((
                node,
                Duration::from_secs_f64(start.elapsed_ms(&end)? as f64 / 1e3),
            ))
        })
        .collect()
}

#[cfg(not(feature = "cuda"))]
fn run_on_device(
    _state: &mut TypedSimpleState,
    _inputs: TVec<TValue>,
) -> TractResult<Vec<(usize, Duration)>> {
    bail!("built without the cuda feature")
}
