//! Per-node timings of a prepared plan: where a batch's time goes.
//!
//! Each node is timed as the plan's backend times it ([`Backend::time_nodes`]): on the
//! host, its evaluation; on a device, where host time says nothing (launches return at
//! once), the device time between two events recorded around its evaluation, next to the
//! host time it cost. The layout follows the tract CLI's profile: nodes by time with their
//! share, then ops by total time.
//!
//! Next to each time, what the node achieved: the bytes it reads and writes (its inputs
//! and outputs, from the plan's facts) per second, the floating-point operations its op
//! counts (`TypedOp::cost`: two per FMA) per second, and, where the backend knows its
//! machine's peaks ([`Backend::peaks`]), the share of the roofline bound reached: the
//! time the node would take at the peak that limits it (memory or compute) over the time
//! it took. A node well below 100% is where the time can still be won. f16 operations are
//! set against the f16 tensor-core peak where the backend knows it (a model in half
//! precision), the others against the f32 peak.

use std::fmt;
use std::time::{Duration, Instant};

use tract_core::internal::*;

use crate::backend::{Backend, Peaks};
use crate::segment::SegmentedPlan;

/// The time of one node, averaged over the runs.
#[derive(Clone, Debug)]
pub struct NodeTime {
    /// For a plan in segments ([`crate::segment`]), the segment the node is in (ids
    /// are the segment's own).
    pub segment: Option<usize>,
    pub id: usize,
    pub name: String,
    pub op: String,
    pub time: Duration,
    /// Host time spent in the node's evaluation (on a device plan: building and queuing
    /// its launches, which is the whole critical path when the batch is small).
    pub host: Duration,
    /// Bytes of its inputs and outputs.
    pub bytes: u64,
    /// Floating-point operations its op counts, if it counts them.
    pub flops: Option<f64>,
    /// Of those, the ones on f16.
    pub half_flops: f64,
}

impl NodeTime {
    /// Bytes per second, floating-point operations per second (if counted), and the share
    /// of the roofline bound reached (with peaks).
    fn rates(&self, peaks: Option<&Peaks>) -> (f64, Option<f64>, Option<f64>) {
        rates(self.time, self.bytes, self.flops, self.half_flops, peaks)
    }
}

fn rates(
    time: Duration,
    bytes: u64,
    flops: Option<f64>,
    half_flops: f64,
    peaks: Option<&Peaks>,
) -> (f64, Option<f64>, Option<f64>) {
    // Below a microsecond (constants, what events cannot resolve) a rate says nothing.
    if time < Duration::from_micros(1) {
        return (0.0, None, None);
    }
    let t = time.as_secs_f64();
    let bound = peaks.map(|p| {
        let memory = bytes as f64 / p.bytes_per_s;
        let half = half_flops.min(flops.unwrap_or(0.0));
        let compute = (flops.unwrap_or(0.0) - half) / p.flops_per_s
            + half / p.half_flops_per_s.unwrap_or(p.flops_per_s);
        memory.max(compute) / t
    });
    (bytes as f64 / t, flops.map(|f| f / t), bound)
}

/// The nodes of one op, summed.
#[derive(Clone, Debug, Default)]
pub struct OpTime {
    pub op: String,
    pub time: Duration,
    pub host: Duration,
    pub nodes: usize,
    pub bytes: u64,
    pub flops: Option<f64>,
    pub half_flops: f64,
}

/// Per-node times of a plan.
#[derive(Clone, Debug)]
pub struct Profile {
    pub nodes: Vec<NodeTime>,
    /// The whole run, wall clock, averaged.
    pub entire: Duration,
    pub runs: usize,
    /// Device time (events around each node on the device) rather than host time.
    pub device: bool,
    /// On a device plan: whether its tensors came from one arena per run (tract-gpu's
    /// memory schema) rather than one allocation per node output.
    pub arena: bool,
    /// The bytes of a run's arena, where there is one (a device's).
    pub arena_bytes: Option<u64>,
    /// The machine's peaks, where the backend knows them.
    pub peaks: Option<Peaks>,
}

impl Profile {
    pub fn total(&self) -> Duration {
        self.nodes.iter().map(|n| n.time).sum()
    }

    /// Host time summed over the nodes.
    pub fn host_total(&self) -> Duration {
        self.nodes.iter().map(|n| n.host).sum()
    }

    /// Per op name: total time, total host time and node count, largest time first.
    pub fn by_op(&self) -> Vec<OpTime> {
        let mut ops: HashMap<String, OpTime> = HashMap::default();
        for n in &self.nodes {
            let e = ops.entry(n.op.clone()).or_insert_with(|| OpTime {
                op: n.op.clone(),
                ..OpTime::default()
            });
            e.time += n.time;
            e.host += n.host;
            e.nodes += 1;
            e.bytes += n.bytes;
            if let Some(f) = n.flops {
                e.flops = Some(e.flops.unwrap_or(0.0) + f);
            }
            e.half_flops += n.half_flops;
        }
        let mut ops: Vec<_> = ops.into_values().collect();
        ops.sort_by_key(|o| std::cmp::Reverse(o.time));
        ops
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total().as_secs_f64().max(1e-12);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut nodes: Vec<&NodeTime> = self.nodes.iter().collect();
        nodes.sort_by_key(|n| std::cmp::Reverse(n.time));
        writeln!(
            f,
            "{} time per node, average of {} run(s); the slowest first",
            if self.device {
                "device (events around each node)"
            } else {
                "host"
            },
            self.runs
        )?;
        // On a device plan a second column says what the node cost the host: with small
        // batches the launches, not the kernels, set the pace.
        if self.device {
            let peak = self
                .arena_bytes
                .map(|b| format!(" of {:.1} MiB", b as f64 / (1 << 20) as f64))
                .unwrap_or_default();
            writeln!(
                f,
                "device memory: {}{peak}",
                if self.arena {
                    "one arena per run"
                } else {
                    "allocated per node output"
                }
            )?;
        }
        match &self.peaks {
            Some(p) => writeln!(
                f,
                "peaks ({}): {:.0} GB/s, {:.1} TFLOP/s f32{}; \"bound\": the time at the peak \
                 that limits the node over its time",
                p.source,
                p.bytes_per_s / 1e9,
                p.flops_per_s / 1e12,
                p.half_flops_per_s
                    .map(|h| format!(", {:.0} TFLOP/s f16 (tensor cores)", h / 1e12))
                    .unwrap_or_default()
            )?,
            None => writeln!(f, "peaks: unknown on this backend")?,
        }
        let peaks = self.peaks.as_ref();
        write!(f, "{:>10} {:>6}", "time", "share")?;
        if self.device {
            write!(f, " {:>9}", "host")?;
        }
        writeln!(
            f,
            " {:>8} {:>9} {:>6}  {:<32} node",
            "GB/s", "GFLOP/s", "bound", "op"
        )?;
        let rate_columns = |f: &mut fmt::Formatter<'_>, r: (f64, Option<f64>, Option<f64>)| {
            let flops = r.1.map_or("-".to_string(), |v| format!("{:.0}", v / 1e9));
            let bound =
                r.2.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0));
            write!(f, " {:>8.1} {flops:>9} {bound:>6}", r.0 / 1e9)
        };
        for n in nodes.iter().filter(|n| !n.time.is_zero()).take(40) {
            let share = 100.0 * n.time.as_secs_f64() / total;
            write!(f, "{:>8.3}ms {:>5.1}%", ms(n.time), share)?;
            if self.device {
                write!(f, " {:>7.1}us", n.host.as_secs_f64() * 1e6)?;
            }
            rate_columns(f, n.rates(peaks))?;
            match n.segment {
                Some(s) => writeln!(f, "  {:<32} #{s}.{} {}", n.op, n.id, n.name)?,
                None => writeln!(f, "  {:<32} #{} {}", n.op, n.id, n.name)?,
            }
        }
        writeln!(f, "\nby op:")?;
        for o in self.by_op() {
            let share = 100.0 * o.time.as_secs_f64() / total;
            write!(f, "{:>8.3}ms {:>5.1}%", ms(o.time), share)?;
            if self.device {
                write!(f, " {:>7.3}ms host", ms(o.host))?;
            }
            rate_columns(f, rates(o.time, o.bytes, o.flops, o.half_flops, peaks))?;
            writeln!(f, "  {:<32} {} node(s)", o.op, o.nodes)?;
        }
        write!(f, "\nsum of nodes {:.3}ms", ms(self.total()))?;
        if self.device {
            write!(f, " (host {:.3}ms)", ms(self.host_total()))?;
        }
        write!(f, ", entire run {:.3}ms (wall clock)", ms(self.entire))
    }
}

/// Profiles `runnable` on `inputs`: one warm-up run, then `runs` timed ones, each node
/// timed as `backend` times it. A plan in segments is timed segment by segment.
pub fn profile(
    backend: &dyn Backend,
    runnable: &Arc<dyn Runnable>,
    inputs: TVec<TValue>,
    runs: usize,
) -> TractResult<Profile> {
    let segmented = runnable.downcast_ref::<SegmentedPlan>();
    let plans: Vec<Arc<TypedSimplePlan>> = match segmented {
        Some(s) => s
            .plans()
            .map(|p| typed_plan(p).cloned())
            .collect::<TractResult<_>>()?,
        None => vec![typed_plan(runnable)?.clone()],
    };
    // A plan over symbols (one for every batch shape) counts its work at these inputs'.
    let values = match plans.first() {
        Some(plan) => {
            let symbols = crate::evaluate::input_symbols(plan.model())?;
            crate::evaluate::input_symbol_values(&symbols, &inputs)
        }
        None => SymbolValues::default(),
    };
    runnable.run(inputs.clone())?;
    let mut times: HashMap<(usize, usize), (Duration, Duration)> = HashMap::default();
    let mut entire = Duration::default();
    let (mut device, mut arena) = (false, false);
    let mut arena_bytes: Option<u64> = None;
    for _ in 0..runs.max(1) {
        let mut time = |ix: usize, inputs: TVec<TValue>| -> TractResult<TVec<TValue>> {
            let mut state = plans[ix].spawn()?;
            let run = backend.time_nodes(&mut state, inputs)?;
            device = run.device;
            arena |= run.arena;
            if let Some(b) = run.arena_bytes {
                // Segments each have theirs: the largest is the peak.
                arena_bytes = Some(arena_bytes.unwrap_or(0).max(b));
            }
            for n in run.nodes {
                let t = times.entry((ix, n.node)).or_default();
                t.0 += n.time;
                t.1 += n.host;
            }
            Ok(run.outputs)
        };
        let started = Instant::now();
        match segmented {
            Some(s) => s.run_with(inputs.clone(), |ix, _, inputs| time(ix, inputs))?,
            None => time(0, inputs.clone())?,
        };
        entire += started.elapsed();
    }
    let runs = runs.max(1);
    let mut nodes = vec![];
    for (ix, plan) in plans.iter().enumerate() {
        let model = plan.model();
        for n in model.nodes() {
            let (time, host) = times.get(&(ix, n.id)).copied().unwrap_or_default();
            let (bytes, flops, half_flops) = work(model, n, &values);
            nodes.push(NodeTime {
                bytes,
                flops,
                half_flops,
                segment: segmented.map(|_| ix),
                id: n.id,
                name: n.name.clone(),
                op: n.op.name().to_string(),
                time: time / runs as u32,
                host: host / runs as u32,
            });
        }
    }
    Ok(Profile {
        nodes,
        entire: entire / runs as u32,
        runs,
        device,
        arena,
        arena_bytes,
        peaks: backend.peaks(),
    })
}

/// The bytes a node reads and writes (its input and output tensors) and the
/// floating-point operations its op counts (two per FMA), at the symbols' `values`.
fn work(model: &TypedModel, node: &TypedNode, values: &SymbolValues) -> (u64, Option<f64>, f64) {
    let size = |f: &TypedFact| -> u64 {
        f.shape
            .iter()
            .map(|d| d.eval(values).to_usize().ok())
            .product::<Option<usize>>()
            .map_or(0, |volume| (volume * f.datum_type.size_of()) as u64)
    };
    let Ok(inputs) = model.node_input_facts(node.id) else {
        return (0, None, 0.0);
    };
    let bytes = inputs.iter().map(|f| size(f)).sum::<u64>()
        + node.outputs.iter().map(|o| size(&o.fact)).sum::<u64>();
    let costs = node.op.cost(&inputs).unwrap_or_default();
    let fmas = |half: bool| -> i64 {
        costs
            .iter()
            .filter(|(c, _)| matches!(c, Cost::FMA(dt) if (*dt == DatumType::F16) == half))
            .map(|(_, n)| n.eval(values).to_i64().unwrap_or(0))
            .sum()
    };
    let (full, half) = (fmas(false), fmas(true));
    let flops = (full + half > 0).then_some(2.0 * (full + half) as f64);
    (bytes, flops, 2.0 * half as f64)
}

fn typed_plan(runnable: &Arc<dyn Runnable>) -> TractResult<&Arc<TypedSimplePlan>> {
    runnable
        .typed_plan()
        .context("only a typed plan (or one in segments of typed plans) can be profiled")
}

#[cfg(feature = "cli")]
/// tract-libcli's annotations of `model` with `profile`'s times: on a device, each node's
/// device time as its accelerator time and its host time as its time, as tract's dump
/// shows a GPU plan; with `cost`, each node's cost.
pub fn annotations(
    model: &TypedModel,
    profile: &Profile,
    cost: bool,
) -> TractResult<tract_libcli::annotations::Annotations> {
    use tract_libcli::annotations::{Annotations, NodeQId, ProfileSummary};
    let mut annotations = Annotations::from_model(model)?;
    let (mut sum, mut accel_sum, mut max) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for node in &profile.nodes {
        let tags = annotations.node_mut(NodeQId(tvec!(), node.id));
        if profile.device {
            tags.profile = Some(node.host);
            tags.accelerator_profile = Some(node.time);
            accel_sum += node.time;
            sum += node.host;
        } else {
            tags.profile = Some(node.time);
            sum += node.time;
        }
        max = max.max(node.time);
    }
    annotations.profile_summary = Some(ProfileSummary {
        max,
        sum,
        accel_sum,
        entire: profile.entire,
        iters: profile.runs,
    });
    if cost {
        tract_libcli::profile::extract_costs(&mut annotations, model, &SymbolValues::default())?;
    }
    Ok(annotations)
}

/// `profile` of `plan` in the JSON of tract's `dump --json` (tract-libcli's
/// `GraphPerfInfo`), with each node's cost where `cost` asks.
#[cfg(feature = "cli")]
pub fn json(plan: &Arc<dyn Runnable>, profile: &Profile, cost: bool) -> TractResult<String> {
    let model = plan
        .typed_plan()
        .context("a JSON profile needs a plan in one piece (not in segments)")?
        .model();
    let annotations = annotations(model, profile, cost)?;
    let info = tract_libcli::export::GraphPerfInfo::from(model, &annotations);
    Ok(serde_json::to_string(&info)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_operations_are_bounded_by_the_tensor_core_peak() {
        let peaks = Peaks {
            bytes_per_s: 1e12,
            flops_per_s: 1e13,
            half_flops_per_s: Some(1e14),
            source: "a test",
        };
        let ms = Duration::from_millis(1);
        // 1e10 f32 operations take 1 ms at the f32 peak: the bound reached is 100%.
        let (_, _, bound) = rates(ms, 0, Some(1e10), 0.0, Some(&peaks));
        assert!((bound.unwrap() - 1.0).abs() < 1e-9);
        // The same count in f16 takes a tenth of that at the tensor-core peak.
        let (_, _, bound) = rates(ms, 0, Some(1e10), 1e10, Some(&peaks));
        assert!((bound.unwrap() - 0.1).abs() < 1e-9);
        // Unknown tensor-core peak: the f32 one.
        let peaks = Peaks {
            half_flops_per_s: None,
            ..peaks
        };
        let (_, _, bound) = rates(ms, 0, Some(1e10), 1e10, Some(&peaks));
        assert!((bound.unwrap() - 1.0).abs() < 1e-9);
        // No measurable time, no rates (a constant's row).
        for t in [Duration::ZERO, Duration::from_nanos(300)] {
            assert_eq!(rates(t, 8, Some(1.0), 0.0, Some(&peaks)), (0.0, None, None));
        }
    }
}
