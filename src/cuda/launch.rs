//! Launching our work on the device, and what every op checks of its tensors first.
//!
//! Every op of ours queues its work on tract-cuda's stream of the calling thread
//! ([`with_stream`]), between the events of tract-cuda's profiler when it is on
//! ([`Stream::profiled`]): kernels of ours through [`Kernel::launch`], cuBLAS and cuDNN
//! calls through [`Stream::profiled`] directly. So tract's own profiling sees our nodes
//! like its own, and a plan captured into a CUDA graph captures them like tract-cuda's.

use cudarc::cublas::CudaBlas;
use cudarc::cudnn::Cudnn;
use cudarc::driver::{CudaEvent, CudaStream, LaunchArgs, LaunchConfig, PushKernelArg};
use tract_core::internal::*;
use tract_gpu::tensor::DeviceTensor;
use tract_gpu::utils::facts_to_device_facts;

use super::abi::KernelArgs;
use super::nvrtc::{Kernel, KernelFile};

type Events = Option<(CudaEvent, CudaEvent)>;

/// This thread's tract-cuda stream, with its cuBLAS and cuDNN handles and its profiler:
/// what our ops queue their work on.
pub struct Stream<'a> {
    pub stream: &'a Arc<CudaStream>,
    pub cublas: &'a CudaBlas,
    pub cudnn: &'a Arc<Cudnn>,
    record: &'a dyn Fn() -> TractResult<Events>,
    finish: &'a dyn Fn(CudaEvent, CudaEvent) -> TractResult<()>,
}

/// Runs `f` with this thread's tract-cuda stream.
pub fn with_stream<R>(f: impl FnOnce(&Stream) -> TractResult<R>) -> TractResult<R> {
    tract_cuda::with_cuda_stream(|s| {
        let record = || s.record_profile_events();
        let finish = |start, end| s.finish_profile_entry(start, end);
        f(&Stream {
            stream: s,
            cublas: s.cublas(),
            cudnn: s.cudnn(),
            record: &record,
            finish: &finish,
        })
    })
}

impl Stream<'_> {
    /// Runs `enqueue`, which queues work on this stream, between tract-cuda's profiling
    /// events when its profiler is on.
    pub fn profiled<T>(&self, enqueue: impl FnOnce() -> TractResult<T>) -> TractResult<T> {
        let events = (self.record)()?;
        let out = enqueue()?;
        if let Some((start, end)) = events {
            (self.finish)(start, end)?;
        }
        Ok(out)
    }
}

impl Kernel {
    /// Launches the kernel on `stream` with `cfg` and the arguments `push` gives it.
    ///
    /// # Safety
    ///
    /// `push` must push the kernel's parameters, in order and of their types, and every
    /// pointer must address device memory of the extent the kernel reads or writes for
    /// those arguments and `cfg`.
    pub unsafe fn launch<'a>(
        &'a self,
        stream: &Stream<'a>,
        cfg: LaunchConfig,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> TractResult<()> {
        let mut builder = stream.stream.launch_builder(&self.function);
        push(&mut builder);
        stream.profiled(|| {
            // SAFETY: the arguments match the kernel, as this function's caller promised.
            unsafe { builder.launch(cfg) }.with_context(|| format!("Launching {}", self.name))?;
            Ok(())
        })
    }
}

/// Launches kernel `name` of `file` with `cfg`, its parameters the device tensors, in
/// order, then `geom`: the form every kernel file of ours takes.
///
/// # Safety
///
/// The kernel's parameters must be pointers to the tensors' elements, in this order, then
/// a `G` by value; and it must read and write only within the tensors as `geom` and `cfg`
/// describe them.
pub unsafe fn launch<G: KernelArgs>(
    file: &'static KernelFile,
    name: &str,
    cfg: LaunchConfig,
    tensors: &[&DeviceTensor],
    geom: &G,
) -> TractResult<()> {
    let views: TVec<_> = tensors
        .iter()
        .map(|t| tract_cuda::kernels::get_cuda_view(t))
        .collect();
    with_stream(|stream| {
        let kernel = file.kernel(stream.stream.context(), name)?;
        // SAFETY: the parameters are the tensors then `geom`, as this function's caller
        // promised the kernel takes them.
        unsafe {
            kernel.launch(stream, cfg, |b| {
                for v in &views {
                    b.arg(v);
                }
                b.arg(geom);
            })
        }
    })
}

/// A grid-stride launch over `total` items, 256 threads a block.
pub fn grid_over(total: usize) -> LaunchConfig {
    let block = 256u32;
    let grid = total.div_ceil(block as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Fails unless `t` is laid out as its shape says (our kernels index it so). The stride
/// of an axis of extent one is never used: tract leaves any there (a view of one image of
/// a batch: `[50176, 50176, 224, 1]` for `[1, 3, 224, 224]`).
pub fn contiguous(t: &DeviceTensor, op: &str) -> TractResult<()> {
    let natural = Tensor::natural_strides(t.shape());
    let laid_out = t
        .shape()
        .iter()
        .zip(t.strides())
        .zip(natural.iter())
        .all(|((extent, stride), want)| *extent <= 1 || stride == want);
    ensure!(
        laid_out,
        "{op}: expected a contiguous tensor, got strides {:?} for shape {:?}",
        t.strides(),
        t.shape()
    );
    Ok(())
}

/// The device tensors of an op's `inputs`, each contiguous, all f32 or all f16.
pub fn contiguous_floats<'a>(
    inputs: &'a [TValue],
    op: &str,
) -> TractResult<TVec<&'a DeviceTensor>> {
    let tensors = contiguous_of(inputs, op, &[DatumType::F32, DatumType::F16])?;
    ensure!(
        tensors
            .windows(2)
            .all(|p| p[0].datum_type() == p[1].datum_type()),
        "{op}: inputs of different types {:?}",
        tensors.iter().map(|t| t.datum_type()).collect::<Vec<_>>()
    );
    Ok(tensors)
}

fn contiguous_of<'a>(
    inputs: &'a [TValue],
    op: &str,
    types: &[DatumType],
) -> TractResult<TVec<&'a DeviceTensor>> {
    use tract_gpu::tensor::DeviceTensorExt;
    inputs
        .iter()
        .map(|t| {
            let t = t.to_device_tensor()?;
            contiguous(t, op)?;
            ensure!(
                types.contains(&t.datum_type()),
                "{op}: only {types:?} are supported, got {:?}",
                t.datum_type()
            );
            Ok(t)
        })
        .collect()
}

/// The widths table on the device, `[K, N]` i64: its N.
pub fn table_columns(table: &DeviceTensor, op: &str) -> TractResult<i64> {
    ensure!(
        table.datum_type() == i64::datum_type() && table.rank() == 2,
        "{op}: the widths table must be [K, N] i64, got {:?} {:?}",
        table.datum_type(),
        table.shape()
    );
    Ok(table.shape()[1] as i64)
}

/// Stride and extent of `axis` in a contiguous tensor of `shape`.
pub fn stride_dim(shape: &[usize], axis: usize) -> (i64, i64) {
    (
        shape[axis + 1..].iter().product::<usize>() as i64,
        shape[axis] as i64,
    )
}

/// The device fact of an op whose one output is its first input's type, of the shape
/// `shape` gives.
pub fn device_facts(
    inputs: &[&TypedFact],
    shape: impl Fn(&TypedFact) -> TractResult<ShapeFact>,
) -> TractResult<TVec<TypedFact>> {
    facts_to_device_facts(inputs, |facts| {
        Ok(tvec!(facts[0].datum_type.fact(shape(facts[0])?)))
    })
}
