//! Resizes on the device, f32 or f16: tract's `Resize` (core) and ONNX's (tract-onnx-opl), which
//! tract-cuda leaves on the host (`kernels/resize.cu`).
//!
//! Like tract's CPU resize, one axis at a time, each by a plan tract makes on the host for
//! the axis' extents (`tract_core::ops::nn::resize::plan_axis`: per output position, the
//! input positions it reads and their weights): the same plan and the same sums give the
//! CPU's bits. A plan depends only on the shape, which a prepared plan fixes: each
//! thread's state of the op makes its plans and uploads them once, on its first run
//! (never a captured one), and keeps them, per input shape. Scales and sizes are read on
//! the host (they may be computed from the padded extents).
//!
//! Integer nearest upsampling is not here: tract declutters it into `NearestUpsample`,
//! which tract-cuda runs as a broadcast.

use std::borrow::Cow;
use std::cell::RefCell;

use cudarc::driver::{CudaSlice, PushKernelArg};
use tract_core::internal::*;
use tract_core::ops::nn::resize::Resize as CoreResize;
use tract_cuda::kernels::get_cuda_view;
use tract_gpu::tensor::{DeviceTensor, DeviceTensorExt};
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;
use tract_onnx_opl::resize::{AspectRatio, CoordTransform, Resize as OnnxResize};

use super::{float_kernel, is_float_kernel_type};
use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{Stream, contiguous, grid_over, with_stream};
use crate::cuda::nvrtc::KernelFile;
use crate::cuda::op_states::{self, OpStates};
use crate::ops::resample::{Resampling, Rounding};

use super::DeviceOp;

crate::kernel_args! {
    /// One axis of `[outer, len, inner]` resampled from `len_in` to `len_out` positions by
    /// windows of `window` taps.
    pub struct ResampleGeom {
        total: i64,
        len_in: i64,
        len_out: i64,
        inner: i64,
        window: i64,
        extrapolation: f32,
        pad: i32,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "resize",
    source: include_str!("../../../kernels/resize.cu"),
    args: ResampleGeom::declaration,
};

/// A resize on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaResize {
    pub resampling: Resampling,
    /// The axes the scales or sizes are given for, in their order.
    pub axes: TVec<usize>,
    /// The host node's input slots of its scales and sizes, and how many inputs it has:
    /// their values are read on the host, appended after the device inputs.
    pub scales: Option<usize>,
    pub sizes: Option<usize>,
    pub inputs: usize,
    /// The host node's output shape.
    pub shape: TVec<TDim>,
}

/// A core or ONNX resize on f32 or f16, but `tf_crop_and_resize` and aspect-ratio policies
/// (left on the host; the ragged transform refuses them along a ragged axis).
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    if !is_float_kernel_type(dt) {
        return Ok(None);
    }
    let rank = node.outputs[0].fact.rank();
    let shape = node.outputs[0].fact.shape.to_tvec();
    let inputs = node.inputs.len();
    if let Some(op) = node.op_as::<CoreResize>() {
        return Ok(Some(Box::new(CudaResize {
            resampling: Resampling {
                interpolator: op.interpolator.clone(),
                coord: op.coord_transformer.clone(),
                rounding: Rounding::of_core(&op.nearest),
                antialias: false,
                exclude_outside: false,
                cubic_a: -0.75,
            },
            axes: (0..rank).collect(),
            scales: op.optional_scales_input,
            sizes: op.optional_sizes_input,
            inputs,
            shape,
        })));
    }
    let Some(op) = node.op_as::<OnnxResize>() else {
        return Ok(None);
    };
    let CoordTransform::Plain(coord) = &op.coord_transformer else {
        return Ok(None);
    };
    if op.keep_aspect_ratio_policy != AspectRatio::Stretch {
        return Ok(None);
    }
    Ok(Some(Box::new(CudaResize {
        resampling: Resampling {
            interpolator: op.interpolator.clone(),
            coord: coord.clone(),
            rounding: Rounding::of_onnx(&op.nearest),
            antialias: op.antialias,
            exclude_outside: op.exclude_outside,
            cubic_a: op.cubic_coeff_a(),
        },
        axes: op.resized_axes(rank)?,
        scales: op.optional_scales_input,
        sizes: op.optional_sizes_input,
        inputs,
        shape,
    })))
}

device_op!(CudaResize);

impl DeviceOp for CudaResize {
    const NAME: &'static str = "CudaResize";
    const NEEDS_PLAN: bool = true;

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "{:?}, {}, axes {:?}",
            self.resampling.interpolator,
            self.resampling.coord.as_str(),
            self.axes
        )])
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let x = inputs[0].to_device_tensor()?;
        contiguous(x, op)?;
        float_kernel(x.datum_type(), op)?;
        let [scales, sizes] = self.host_values(&inputs)?;
        let sizes = sizes.map(|s| at_symbols(s, ctx.symbols)).transpose()?;
        let resolution = self.resolve(x.shape(), scales, sizes.as_deref())?;
        let mut shape: TVec<usize> = x.shape().into();
        for (axis, _, len_out) in &resolution {
            shape[*axis] = *len_out;
        }
        let output = make_tensor_for_node(ctx, x.datum_type(), &shape)?;
        if output.len() == 0 {
            return Ok(tvec!(output.into_tensor().into_tvalue()));
        }
        if resolution.is_empty() {
            tract_cuda::kernels::array::cuda_copy_nd_dispatch(
                x,
                0,
                x.strides(),
                &output,
                0,
                output.shape(),
                output.strides(),
            )?;
            return Ok(tvec!(output.into_tensor().into_tvalue()));
        }
        with_stream(|stream| {
            PLANS.with_borrow_mut(|all| -> TractResult<()> {
                let mine = all.get_or_try_insert_with((ctx.session, ctx.node_id), || {
                    TractResult::Ok(NodePlans::default())
                })?;
                let key = (TVec::from(x.shape()), resolution);
                if !mine.contains_key(&key) {
                    let plans = self.upload(stream, x.shape(), &key.1)?;
                    mine.insert(key.clone(), plans);
                }
                let plans = &mine[&key];
                // One axis at a time, through intermediate tensors in f32, as tract's CPU
                // resizes (an f16 tensor is rounded to f16 once, at the end).
                let mut current: Option<DeviceTensor> = None;
                for (ix, plan) in plans.iter().enumerate() {
                    let src = current.as_ref().unwrap_or(x);
                    if ix + 1 == plans.len() {
                        resample(stream, src, &output, plan)?;
                    } else {
                        let mut next: TVec<usize> = src.shape().into();
                        next[plan.axis] = plan.len_out;
                        let dst = DeviceTensor::uninitialized_dt(f32::datum_type(), &next)?;
                        resample(stream, src, &dst, plan)?;
                        current = Some(dst);
                    }
                }
                Ok(())
            })
        })?;
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }

    fn drop_session(&self, session: SessionId, node_id: usize) {
        op_states::end(&PLANS, session, node_id);
    }
}

/// One resampled axis, on the device: tract's plan for its extents.
struct DevicePlan {
    axis: usize,
    len_in: usize,
    len_out: usize,
    window: usize,
    indices: CudaSlice<i32>,
    weights: CudaSlice<f32>,
    extrapolated: CudaSlice<i32>,
}

/// What a resize resolves to for one input: per resampled axis, its scale (bits) and
/// output extent. A plan is made once per such resolution.
type Resolution = Vec<(usize, u32, usize)>;

/// `sizes` with its dims evaluated at the run's `symbols`: a plan over symbols (one for
/// every batch shape) keeps sizes computed from the shapes as expressions of them.
fn at_symbols<'a>(sizes: &'a Tensor, symbols: &SymbolValues) -> TractResult<Cow<'a, Tensor>> {
    if sizes.datum_type() != TDim::datum_type() {
        return Ok(Cow::Borrowed(sizes));
    }
    let dims: Vec<TDim> = sizes
        .try_as_plain_ram()?
        .as_slice::<TDim>()?
        .iter()
        .map(|d| d.eval(symbols))
        .collect();
    Ok(Cow::Owned(tensor1(&dims).into_shape(sizes.shape())?))
}

/// One node's plans on this thread, per input shape and resolution.
type NodePlans = HashMap<(TVec<usize>, Resolution), Vec<DevicePlan>>;

thread_local! {
    /// Per session and node: the plans this thread uploaded (a plan is uploaded in a
    /// plain run, before any capture replays it).
    static PLANS: RefCell<OpStates<NodePlans>> = RefCell::default();
}

/// Frees this thread's plans of sessions ended on other threads ([`op_states`]).
pub(crate) fn sweep() {
    op_states::sweep(&PLANS);
}

impl CudaResize {
    /// The host node's scales and sizes, read on the host (module doc).
    fn host_values<'a>(&self, inputs: &'a [TValue]) -> TractResult<[Option<&'a Tensor>; 2]> {
        let op = Self::NAME;
        let value = |slot: Option<usize>| -> TractResult<Option<&'a Tensor>> {
            let Some(slot) = slot else { return Ok(None) };
            let at = self.inputs
                + self
                    .host_slots()
                    .iter()
                    .position(|s| *s == slot)
                    .context("a host input")?;
            Ok(Some(
                &**inputs
                    .get(at)
                    .with_context(|| format!("{op}: no host input {at}"))?,
            ))
        };
        Ok([value(self.scales)?, value(self.sizes)?])
    }

    /// The slots read on the host, in the order they are appended.
    pub fn host_slots(&self) -> TVec<usize> {
        self.scales
            .iter()
            .chain(self.sizes.iter())
            .copied()
            .filter(|s| *s < self.inputs)
            .collect()
    }

    /// Per resampled axis of an input of `shape`: its scale and output extent, as
    /// tract's CPU resize resolves them (a scale per axis given, or one from the size).
    fn resolve(
        &self,
        shape: &[usize],
        scales: Option<&Tensor>,
        sizes: Option<&Tensor>,
    ) -> TractResult<Resolution> {
        let op = Self::NAME;
        let mut per_axis: TVec<(f32, usize)> = shape.iter().map(|d| (1.0, *d)).collect();
        if let Some(scales) = scales.filter(|s| s.len() == self.axes.len()) {
            let scales = scales.cast_to::<f32>()?;
            for (&axis, &s) in self
                .axes
                .iter()
                .zip(scales.try_as_plain_ram()?.as_slice::<f32>()?)
            {
                let len = shape[axis];
                let out = if s.round() == s {
                    len * s as usize
                } else {
                    (len as f32 * s) as usize
                };
                per_axis[axis] = (s, out);
            }
        } else if let Some(sizes) = sizes.filter(|s| s.len() == self.axes.len()) {
            let sizes = sizes.cast_to::<i64>()?;
            for (&axis, &n) in self
                .axes
                .iter()
                .zip(sizes.try_as_plain_ram()?.as_slice::<i64>()?)
            {
                let n = usize::try_from(n).with_context(|| format!("{op}: a size of {n}"))?;
                per_axis[axis] = (n as f32 / shape[axis] as f32, n);
            }
        } else {
            bail!(
                "{op}: neither scales nor sizes for {} axes",
                self.axes.len()
            );
        }
        Ok(per_axis
            .into_iter()
            .zip(shape)
            .enumerate()
            .filter(|(_, ((s, out), len))| !(*out == **len && *s == 1.0))
            .map(|(axis, ((s, out), _))| (axis, s.to_bits(), out))
            .collect())
    }

    /// The plans of `resolution` for an input of `shape`, uploaded on `stream`.
    fn upload(
        &self,
        stream: &Stream,
        shape: &[usize],
        resolution: &Resolution,
    ) -> TractResult<Vec<DevicePlan>> {
        let op = Self::NAME;
        let mut lens: TVec<usize> = shape.into();
        let mut plans = vec![];
        for &(axis, scale, len_out) in resolution {
            let len_in = lens[axis];
            ensure!(len_in > 0, "{op}: resampling an empty axis {axis}");
            let plan = self.resampling.plan(f32::from_bits(scale), len_in, len_out);
            let indices = plan
                .indices
                .iter()
                .map(|i| {
                    i32::try_from(*i).with_context(|| format!("{op}: an index beyond 32 bits"))
                })
                .collect::<TractResult<Vec<i32>>>()?;
            let extrapolated: Vec<i32> = plan.extrapolated.iter().map(|e| *e as i32).collect();
            plans.push(DevicePlan {
                axis,
                len_in,
                len_out,
                window: plan.window,
                indices: stream.stream.clone_htod(&indices)?,
                weights: stream.stream.clone_htod(&plan.weights)?,
                extrapolated: stream.stream.clone_htod(&extrapolated)?,
            });
            lens[axis] = len_out;
        }
        Ok(plans)
    }
}

/// Resamples `plan.axis` of `src` into `dst`.
fn resample(
    stream: &Stream,
    src: &DeviceTensor,
    dst: &DeviceTensor,
    plan: &DevicePlan,
) -> TractResult<()> {
    let op = CudaResize::NAME;
    let inner: usize = src.shape()[plan.axis + 1..].iter().product();
    let geom = ResampleGeom {
        total: dst.len() as i64,
        len_in: plan.len_in as i64,
        len_out: plan.len_out as i64,
        inner: inner as i64,
        window: plan.window as i64,
        // tract-onnx-opl's extrapolation value serves tf_crop_and_resize only, which
        // stays on the host.
        extrapolation: 0.0,
        pad: 0,
    };
    let name = format!(
        "ragged_resample_{}_{}",
        float_kernel(src.datum_type(), op)?,
        float_kernel(dst.datum_type(), op)?
    );
    let kernel = KERNELS.kernel(stream.stream.context(), &name)?;
    let (sv, dv) = (get_cuda_view(src), get_cuda_view(dst));
    // SAFETY: ragged_resample_{in}_{out}(x, y, indices, weights, extrapolated,
    // ResampleGeom): x holds outer x len_in x inner of src's type (its shape), y outer x
    // len_out x inner of dst's (`total`, its shape), the plan len_out x window indices
    // below len_in and as many f32 weights, and len_out flags: the plan tract made for
    // these extents.
    unsafe {
        kernel.launch(stream, grid_over(dst.len()), |b| {
            b.arg(&sv);
            b.arg(&dv);
            b.arg(&plan.indices);
            b.arg(&plan.weights);
            b.arg(&plan.extrapolated);
            b.arg(&geom);
        })
    }
}

impl TypedOp for CudaResize {
    /// Every output read from up to two neighbours along each resized axis (two for a
    /// linear resampling): an FMA per neighbour, counted at two per axis.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let out = &self.output_facts(inputs)?[0];
        let reads = 1usize << self.axes.len();
        Ok(tvec!((
            Cost::FMA(inputs[0].datum_type),
            out.shape.volume() * reads
        )))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(&inputs[..1], |f| {
            Ok(tvec!(f[0].datum_type.fact(&*self.shape)))
        })
    }

    as_op!();
}
