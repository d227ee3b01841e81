//! The host backend: batches as host tensors, what every tract runtime takes and gives.
//!
//! It is the backend of tract's CPU runtime, and of any runtime whose plans no other
//! backend claims: a device runtime still takes a host batch (and brings it over
//! itself), only less quickly than through its own backend.
//!
//! Its batches run in lanes, one per core (`TRACT_RAGGED_LANES` overrides the count): a
//! plan runs on one thread, and batches of several samples are no cheaper per cell than
//! one (tract's CPU kernels gain little from a batch axis; PP-OCRv4 rec costs twice as
//! much per cell in batches of 8 as alone), so cores are filled with concurrent batches,
//! and the scheduler measures what batching is worth on the model at hand. A batch left
//! with idle cores takes them as threads of tract's executor, whose kernels split their
//! work without changing a bit of the result.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tract_linalg::multithread::{Executor, multithread_tract_scope};

use tract_core::internal::*;
use tract_core::ops::cnn::Conv;

use super::{Backend, CostModel, NodeRun, NodeTimes};

mod conv;
mod depthwise;
mod kernels;
mod unpacked;

use crate::batch::{crop_all, pack};
use crate::transform::OutputLayout;
pub use conv::{HostConv, convs_on_host};
pub use depthwise::{HostDepthwise, depthwise_on_host};

/// The kernel (as stored) and the bias (one value per output channel) of `conv` where
/// the host's own convolution ops can take it: f32 over NCHW with two spatial axes, the
/// kernel OIHW, both constants of the sizes the convolution says, a concrete input of
/// rank 4, no quantization. None otherwise.
fn conv_constants(
    conv: &Conv,
    input: &TypedFact,
    kernel: &TypedFact,
    bias: &TypedFact,
) -> TractResult<Option<(Arc<Tensor>, Vec<f32>)>> {
    use tract_core::ops::cnn::KernelFormat;
    use tract_core::ops::nn::DataFormat;
    let spec = &conv.pool_spec;
    let f32s = [input, kernel, bias]
        .iter()
        .all(|f| f.datum_type == f32::datum_type());
    let fits = f32s
        && conv.q_params.is_none()
        && spec.data_format == DataFormat::NCHW
        && spec.rank() == 2
        && conv.kernel_fmt == KernelFormat::OIHW
        && input.rank() == 4
        && input.shape.as_concrete().is_some();
    let (true, Some(k), Some(b)) = (fits, &kernel.konst, &bias.konst) else {
        return Ok(None);
    };
    let co = conv.output_channels();
    let taps = spec.kernel_shape.iter().product::<usize>();
    if k.len() != co * conv.input_channels() / conv.group.max(1) * taps
        || (b.len() != co && b.len() != 1)
    {
        return Ok(None);
    }
    let b = b.try_as_plain_ram()?;
    let b = b.as_slice::<f32>()?;
    let bias = if b.len() == 1 {
        vec![b[0]; co]
    } else {
        b.to_vec()
    };
    Ok(Some((k.clone(), bias)))
}

/// Replaces each convolution of `model` (concrete) for which `op` makes an op of its own
/// (from the convolution, and the facts of its input, kernel and bias) by that op, on the
/// convolution's input alone. Returns how many.
fn replace_convs<O: TypedOp>(
    model: &mut TypedModel,
    op: impl Fn(&Conv, &TypedFact, &TypedFact, &TypedFact) -> TractResult<Option<O>>,
) -> TractResult<usize> {
    let mut replaced = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(conv) = node.op_as::<Conv>() else {
            continue;
        };
        let ours = {
            let facts = model.node_input_facts(id)?;
            let [input, kernel, bias] = &*facts else {
                continue;
            };
            op(conv, input, kernel, bias)?
        };
        let Some(ours) = ours else {
            continue;
        };
        let mut patch = TypedModelPatch::default();
        let x = patch.tap_model(model, node.inputs[0])?;
        let y = patch.wire_node(&node.name, ours, &[x])?[0];
        patch.shunt_outside(model, OutletId::new(id, 0), y)?;
        patch.apply(model)?;
        replaced += 1;
    }
    if replaced > 0 {
        model.compact()?;
    }
    Ok(replaced)
}

/// Tensors on the host (module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostBackend;

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    /// The other cores, at most 3: the samples run on the caller's thread while the helpers
    /// prepare, and on the host a plan costs about a sample's run, so three keep ahead.
    fn plan_helpers(&self, cores: usize) -> usize {
        cores.saturating_sub(1).min(3)
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

    /// Measured (module doc), batches of at most 64: tract's CPU runtime runs batches of
    /// a few samples no more efficiently per cell than one, and big ones less (PP-OCRv4
    /// rec: 28 lines one by one in 1.75 s, in batches of 8 in 5.2 s), so nothing larger
    /// is worth probing.
    fn cost_model(&self) -> CostModel {
        CostModel {
            max_batch: Some(64),
            batch_overhead: 1024,
            measured: true,
            fitted: false,
        }
    }

    /// One per core the process may use, or `TRACT_RAGGED_LANES`.
    fn lanes(&self) -> usize {
        host_lanes()
    }

    /// Constants broadcast over the batch tiled along it (below), element-wise chains
    /// fused into one pass each ([`crate::elementwise::fuse_host`]: tract's CPU runtime
    /// runs hard-swish and batch norm as three passes over the activation where one
    /// does), depthwise convolutions vectorised at their borders and strides too
    /// ([`depthwise_on_host`]), dense convolutions of small kernels and few output
    /// channels computed directly ([`convs_on_host`]: tract's lazy im2col ran them at half
    /// speed). tract's values: the same bits but for the direct convolutions, within a
    /// rounding.
    fn before_prepare(&self, model: &mut TypedModel) -> TractResult<()> {
        tile_batch_broadcasts(model)?;
        crate::elementwise::fuse_host(model)?;
        depthwise_on_host(model)?;
        convs_on_host(model)?;
        Ok(())
    }

    fn with_threads(&self, threads: usize, f: &mut dyn FnMut()) {
        match executor(threads) {
            Some(pool) => multithread_tract_scope(pool, f),
            None => f(),
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
            arena_bytes: None,
            outputs,
        })
    }
}

/// The edit of tract-linalg's instruction sets (its `TRACT_CPU_ISA` knob) that this CPU's
/// matrix products want, if any: `-avx512f` on AMD Zen 4 (family 0x19 with AVX-512).
///
/// tract-linalg picks its f32 matmul kernel by a cost model calibrated, for AMD, on Zen 5,
/// whose 512-bit units are full width; Zen 4 runs 512-bit operations on 256-bit units, and
/// there the AVX-512 kernels it picks are slower than its AVX2 ones: PP-OCRv4 rec's 1x1
/// convolutions take 17.2 ms a line of 320 px with them, 13.8 ms without, and the fixture
/// lines' scheduled run 2895 ms against 2551 (benches/NOTES.md). tract-linalg reads the
/// knob once, at its first kernel choice, for the whole process: so this only says what to
/// set, and the command line tool and the Python package set it at start, where the user
/// has not (a library user decides for their own process).
pub fn preferred_isa_edit() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        // `unsafe` on the MSRV (1.91), safe on newer compilers.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID is present on every x86_64 CPU; leaves 0 and 1 always exist.
        let (vendor, signature) = unsafe {
            (
                std::arch::x86_64::__cpuid(0),
                std::arch::x86_64::__cpuid(1).eax,
            )
        };
        let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
        let family = ((signature >> 8) & 0xf) + ((signature >> 20) & 0xff);
        if amd && family == 0x19 && std::arch::is_x86_feature_detected!("avx512f") {
            return Some("-avx512f");
        }
    }
    None
}

/// The most elements a constant tiled over the batch may reach.
const TILED_MAX: usize = 1 << 16;

/// Tiles along axis 0 every small constant operand of an add or a multiply that is
/// broadcast along it (a bias `[1, C, 1, 1]`) to the other operand's extent there (the
/// batch, `[N, C, 1, 1]`). tract's CPU runtime adds a per-channel constant with its
/// by-scalar kernels only when the constant covers the leading axes; broadcast over a
/// batch of more than one it takes a generic broadcasting path, ten times slower (the
/// bias of PP-OCRv4 rec's 1x1 convolutions: 195 of a batch of 8's 305 ms). The sums are
/// the same.
fn tile_batch_broadcasts(model: &mut TypedModel) -> TractResult<()> {
    use tract_core::ops::binary::TypedBinOp;
    use tract_core::ops::math::{Add, Mul};
    let mut tiles = vec![];
    for node in model.nodes() {
        let Some(op) = node.op_as::<TypedBinOp>() else {
            continue;
        };
        if !(op.0.is::<Add>() || op.0.is::<Mul>()) || node.inputs.len() != 2 {
            continue;
        }
        let facts = model.node_input_facts(node.id)?;
        for slot in 0..2 {
            let (k, other) = (facts[slot], facts[1 - slot]);
            let Some(konst) = &k.konst else { continue };
            let Some(n) = other.shape.first().and_then(|d| d.to_usize().ok()) else {
                continue;
            };
            let tiled = konst.len() * n;
            if konst.rank() == other.rank()
                && konst.rank() >= 2
                && konst.shape()[0] == 1
                && n > 1
                && konst.len() > 1
                && tiled <= TILED_MAX
            {
                tiles.push((node.id, slot, konst.clone(), n));
            }
        }
    }
    for (id, slot, konst, n) in tiles {
        let mut shape: TVec<usize> = konst.shape().into();
        shape[0] = n;
        let tiled = konst.broadcast_to_shape(&shape)?;
        let name = format!("{}.tiled_over_batch", model.node(id).name);
        let wire = model.add_const(name, tiled)?;
        model.add_edge(wire, InletId::new(id, slot))?;
    }
    model.refresh_output_facts()?;
    Ok(())
}

/// The lanes of the host: `TRACT_RAGGED_LANES`, or the cores this process may use.
///
/// The cores are read once for the process: std reads them from the cgroup's files at
/// every call, which cost a lone request in the server a tenth of its run.
pub fn host_lanes() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    crate::knobs::lanes().unwrap_or_else(|| {
        *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// tract's executor with `threads` threads, one pool per count kept for the process;
/// none for one thread, or where the pool cannot be made (the kernels then run on the
/// calling thread, as they would anyway).
fn executor(threads: usize) -> Option<Executor> {
    if threads <= 1 {
        return None;
    }
    static POOLS: OnceLock<Mutex<HashMap<usize, Option<Executor>>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Default::default).lock().ok()?;
    pools
        .entry(threads)
        .or_insert_with(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |i| format!("tract-ragged-{threads}-{i}"))
                .build()
                .ok()
                .map(|pool| Executor::MultiThread(Arc::new(pool)))
        })
        .clone()
}

/// The threads tract's executor lends the run on this thread: 1 where it lends none.
/// Host ops that split their work by hand ask, to cut it into enough pieces.
fn executor_threads() -> usize {
    match tract_linalg::multithread::current_tract_executor() {
        Executor::MultiThread(pool) => pool.current_num_threads(),
        Executor::RayonGlobal => rayon::current_num_threads(),
        Executor::SingleThread => 1,
    }
}

/// The memory this process can still take, in bytes: the host's `MemAvailable` on Linux
/// (8 GiB where it cannot be read), less where the process's cgroup (v2) or its
/// address-space limit (`ulimit -v`) leaves less: budgets above what the process may map
/// would fail in the allocator (an abort) where they should be refused.
///
/// A reading is kept for [`MEMORY_READING_LIFE`]: it takes five files of /proc and
/// /sys, and a scheduled run asks for it (a server's lone request paid more for those
/// reads than for its run on a small model).
pub fn available_memory() -> u64 {
    static LAST: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
    let now = Instant::now();
    let Ok(mut last) = LAST.lock() else {
        return read_available_memory();
    };
    match *last {
        Some((at, bytes)) if now.saturating_duration_since(at) < MEMORY_READING_LIFE => bytes,
        _ => {
            let bytes = read_available_memory();
            *last = Some((now, bytes));
            bytes
        }
    }
}

/// How long a reading of [`available_memory`] holds: short beside the time memory takes
/// to fill, long beside a request.
pub const MEMORY_READING_LIFE: Duration = Duration::from_millis(100);

/// [`available_memory`], read now.
fn read_available_memory() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    // A `KEY: NUMBER kB` line of a /proc file, in bytes.
    let field = |text: &str, key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let number = |text: Option<String>| text.and_then(|t| t.trim().parse::<u64>().ok());
    let free = read("/proc/meminfo")
        .and_then(|info| field(&info, "MemAvailable:"))
        .unwrap_or(8 << 30);
    // The process's cgroup (v2) limit, less what the group uses ("max": none).
    let group = number(read("/sys/fs/cgroup/memory.max"))
        .map(|max| max.saturating_sub(number(read("/sys/fs/cgroup/memory.current")).unwrap_or(0)));
    // An address-space limit (`ulimit -v`), less the address space the process maps.
    let address_space = read("/proc/self/limits").and_then(|limits| {
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max address space"))?;
        let limit: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
        let mapped = read("/proc/self/status").and_then(|s| field(&s, "VmSize:"));
        Some(limit.saturating_sub(mapped.unwrap_or(0)))
    });
    [Some(free), group, address_space]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(free)
}
