//! The CUDA ops of ragged-cuda: the mask, the masked softmax, pooling and transposed
//! convolutions (tract-cuda has none), and depthwise convolutions (tract-cuda's are slow:
//! [`super::convs`]), each a launch of one of our kernels on tract-cuda's per-thread
//! stream.
//!
//! The ragged ones read the widths table from the device: it is uploaded once per run,
//! right after the host computes it, and every op picks its rows there.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use tract_core::internal::*;
use tract_core::ops::cnn::{KernelFormat, PaddingSpec, PoolSpec};
use tract_cuda::kernels::get_cuda_view;
use tract_gpu::tensor::{DeviceTensor, DeviceTensorExt};
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use super::kernels::{Library, function};
use crate::ops::{Mask, MaskedSoftmax, SampleAxes};

/// Launches `$func` on tract-cuda's stream with `$cfg` and the arguments pushed by
/// `$push`, recording the launch when tract-cuda's profiler is on.
macro_rules! launch {
    ($lib:expr, $name:expr, $cfg:expr, |$b:ident| $push:block) => {
        tract_cuda::with_cuda_stream(|stream| {
            let func = function(stream.context(), $lib, $name)?;
            let mut $b = stream.launch_builder(&func);
            $push;
            let events = stream.record_profile_events()?;
            unsafe { $b.launch($cfg) }.with_context(|| format!("Launching {}", $name))?;
            if let Some((start, end)) = events {
                stream.finish_profile_entry(start, end)?;
            }
            Ok(())
        })
    };
}

/// A grid-stride launch over `total` items.
fn elementwise_grid(total: usize) -> LaunchConfig {
    let block = 256u32;
    let grid = total.div_ceil(block as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn contiguous(t: &DeviceTensor, op: &str) -> TractResult<()> {
    ensure!(
        t.strides() == &*Tensor::natural_strides(t.shape()),
        "{op}: expected a contiguous tensor, got strides {:?} for shape {:?}",
        t.strides(),
        t.shape()
    );
    Ok(())
}

/// The device tensors of an op's `inputs`, each contiguous f32 (our convolutions'
/// kernels read nothing else).
pub(super) fn contiguous_f32<'a>(
    inputs: &'a [TValue],
    op: &str,
) -> TractResult<TVec<&'a DeviceTensor>> {
    inputs
        .iter()
        .map(|t| {
            let t = t.to_device_tensor()?;
            contiguous(t, op)?;
            ensure!(
                t.datum_type() == f32::datum_type(),
                "{op}: only f32 is supported, got {:?}",
                t.datum_type()
            );
            Ok(t)
        })
        .collect()
}

/// The widths table on the device, `[K, N]` i64: its N.
fn table_columns(table: &DeviceTensor, op: &str) -> TractResult<i64> {
    ensure!(
        table.datum_type() == i64::datum_type() && table.rank() == 2,
        "{op}: the widths table must be [K, N] i64, got {:?} {:?}",
        table.datum_type(),
        table.shape()
    );
    Ok(table.shape()[1] as i64)
}

/// Stride and extent of `axis` in a contiguous tensor of `shape`.
fn stride_dim(shape: &[usize], axis: usize) -> (i64, i64) {
    (
        shape[axis + 1..].iter().product::<usize>() as i64,
        shape[axis] as i64,
    )
}

fn device_facts(
    inputs: &[&TypedFact],
    shape: impl Fn(&TypedFact) -> TractResult<ShapeFact>,
) -> TractResult<TVec<TypedFact>> {
    facts_to_device_facts(inputs, |facts| {
        Ok(tvec!(facts[0].datum_type.fact(shape(facts[0])?)))
    })
}

/// [`Mask`] on the device: a copy of the input with the fill past each sample's width.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaMask(pub Mask);

impl Op for CudaMask {
    fn name(&self) -> StaticName {
        "CudaRaggedMask".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    op_as_typed_op!();
}

impl EvalOp for CudaMask {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (x, table) = args_2!(inputs);
        let (x, table) = (x.to_device_tensor()?, table.to_device_tensor()?);
        contiguous(x, "CudaRaggedMask")?;
        let table_n = table_columns(table, "CudaRaggedMask")?;
        let axes = &self.0.axes;
        ensure!(
            (1..=2).contains(&axes.ragged.len()),
            "CudaRaggedMask: one or two ragged axes"
        );
        let shape = x.shape();
        ensure!(
            shape[axes.batch] as i64 == table_n,
            "CudaRaggedMask: {} samples, {table_n} widths",
            shape[axes.batch]
        );
        let output = make_tensor_for_node(ctx, x.datum_type(), shape)?;
        ensure!(
            x.len() <= i32::MAX as usize,
            "CudaRaggedMask: {} elements, the kernel addresses at most 2^31 - 1",
            x.len()
        );
        let total = x.len() as u32;
        let table_n = table_n as u32;
        let fill = self.0.fill.as_bytes();
        let (xv, yv, tv) = (
            get_cuda_view(x),
            get_cuda_view(&output),
            get_cuda_view(table),
        );
        let size = x.datum_type().size_of();
        ensure!(
            [1, 2, 4, 8].contains(&size),
            "CudaRaggedMask: elements of {size} bytes are not supported"
        );
        if let [ragged] = &*axes.ragged
            && axes.batch < ragged.axis
        {
            // By rows: see `ragged_mask_rows` in kernels/mask.cu.
            let rows = shape[..ragged.axis].iter().product::<usize>() as u32;
            let inner = shape[ragged.axis + 1..].iter().product::<usize>() as u32;
            let row_len = shape[ragged.axis] as u32 * inner;
            let rows_per_sample =
                shape[axes.batch + 1..ragged.axis].iter().product::<usize>() as u32;
            let batch_dim = shape[axes.batch] as u32;
            let row_ix = ragged.row as i32;
            let block = 128u32;
            let cfg = LaunchConfig {
                grid_dim: (
                    row_len.div_ceil(block).clamp(1, 1024),
                    rows.clamp(1, 65535),
                    1,
                ),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            macro_rules! go {
                ($name:expr, $t:ty) => {{
                    let fill: $t = <$t>::from_ne_bytes(fill.try_into()?);
                    launch!(Library::Mask, $name, cfg, |b| {
                        b.arg(&xv)
                            .arg(&yv)
                            .arg(&tv)
                            .arg(&rows)
                            .arg(&row_len)
                            .arg(&inner);
                        b.arg(&rows_per_sample)
                            .arg(&batch_dim)
                            .arg(&table_n)
                            .arg(&row_ix);
                        b.arg(&fill);
                    })
                }};
            }
            match size {
                1 => go!("ragged_mask_rows_b1", u8)?,
                2 => go!("ragged_mask_rows_b2", u16)?,
                4 => go!("ragged_mask_rows_b4", u32)?,
                _ => go!("ragged_mask_rows_b8", u64)?,
            }
            return Ok(tvec!(output.into_tensor().into_tvalue()));
        }
        let u32_stride_dim = |axis: usize| {
            let (s, d) = stride_dim(shape, axis);
            (s as u32, d as u32)
        };
        let (batch_stride, batch_dim) = u32_stride_dim(axes.batch);
        let (r0_stride, r0_dim) = u32_stride_dim(axes.ragged[0].axis);
        let r0_row = axes.ragged[0].row as i32;
        let (r1_stride, r1_dim, r1_row) = match axes.ragged.get(1) {
            Some(r) => {
                let (s, d) = u32_stride_dim(r.axis);
                (s, d, r.row as i32)
            }
            None => (1, 1, -1),
        };
        macro_rules! go {
            ($name:expr, $t:ty) => {{
                let fill: $t = <$t>::from_ne_bytes(fill.try_into()?);
                launch!(
                    Library::Mask,
                    $name,
                    elementwise_grid(total as usize),
                    |b| {
                        b.arg(&xv).arg(&yv).arg(&tv).arg(&total).arg(&table_n);
                        b.arg(&batch_stride).arg(&batch_dim);
                        b.arg(&r0_stride).arg(&r0_dim).arg(&r0_row);
                        b.arg(&r1_stride).arg(&r1_dim).arg(&r1_row);
                        b.arg(&fill);
                    }
                )
            }};
        }
        match size {
            1 => go!("ragged_mask_b1", u8)?,
            2 => go!("ragged_mask_b2", u16)?,
            4 => go!("ragged_mask_b4", u32)?,
            _ => go!("ragged_mask_b8", u64)?,
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaMask {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(inputs, |f| Ok(f.shape.clone()))
    }

    as_op!();
}

/// [`MaskedSoftmax`] on the device, f32: one block per row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaMaskedSoftmax(pub MaskedSoftmax);

impl Op for CudaMaskedSoftmax {
    fn name(&self) -> StaticName {
        format!("Cuda{}", self.0.name()).into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    op_as_typed_op!();
}

impl EvalOp for CudaMaskedSoftmax {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (x, table) = args_2!(inputs);
        let (x, table) = (x.to_device_tensor()?, table.to_device_tensor()?);
        let op = "CudaRaggedMaskedSoftmax";
        contiguous(x, op)?;
        ensure!(
            x.datum_type() == f32::datum_type(),
            "{op}: only f32 is supported, got {:?}",
            x.datum_type()
        );
        let table_n = table_columns(table, op)?;
        let SampleAxes { batch, ragged } = &self.0.axes;
        let axis = self.0.axis;
        let shape = x.shape();
        let w_row = ragged
            .iter()
            .find(|r| r.axis == axis)
            .context("softmax axis is not ragged")?
            .row as i64;
        let (o_stride, o_dim, o_row) = match ragged.iter().find(|r| r.axis != axis) {
            Some(r) => {
                let (s, d) = stride_dim(shape, r.axis);
                (s, d, r.row as i64)
            }
            None => (1, 1, -1),
        };
        let (batch_stride, batch_dim) = stride_dim(shape, *batch);
        let len = shape[axis] as i64;
        let inner = shape[axis + 1..].iter().product::<usize>() as i64;
        let rows = (x.len() as i64 / len.max(1)) as u32;
        let log = (self.0.kind == tract_core::ops::nn::SoftmaxKind::LogSoftmax) as i32;
        let output = make_tensor_for_node(ctx, x.datum_type(), shape)?;
        if rows > 0 && len > 0 {
            // One block size whatever the row length: each element of the valid prefix
            // lands on the same thread and the reductions combine them in the same order
            // for a row of the batch and for the same row alone.
            let block = 256u32;
            let cfg = LaunchConfig {
                grid_dim: (rows, 1, 1),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            let (xv, yv, tv) = (
                get_cuda_view(x),
                get_cuda_view(&output),
                get_cuda_view(table),
            );
            launch!(Library::Softmax, "ragged_softmax_f32", cfg, |b| {
                b.arg(&xv)
                    .arg(&yv)
                    .arg(&tv)
                    .arg(&table_n)
                    .arg(&len)
                    .arg(&inner);
                b.arg(&batch_stride).arg(&batch_dim).arg(&w_row);
                b.arg(&o_stride).arg(&o_dim).arg(&o_row).arg(&log);
            })?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaMaskedSoftmax {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(inputs, |f| Ok(f.shape.clone()))
    }

    as_op!();
}

/// The geometry the pool kernel takes, laid out as `struct PoolGeom` in kernels/pool.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct PoolGeom {
    n: i64,
    c: i64,
    table_n: i64,
    in_dims: [i64; 3],
    out_dims: [i64; 3],
    k: [i64; 3],
    s: [i64; 3],
    d: [i64; 3],
    pb: [i64; 3],
    pa: [i64; 3],
    spatial: i64,
    channels_last: i64,
    is_max: i64,
    normalize: i64,
    count_include_pad: i64,
    ceil_mode: i64,
    ragged_geo: i64,
    row: i64,
}

unsafe impl cudarc::driver::DeviceRepr for PoolGeom {}

/// How a pool reduces its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    Sum {
        normalize: bool,
        count_include_pad: bool,
    },
}

/// Max, sum and average pooling on the device, f32: tract's `MaxPool` and `SumPool`
/// (which tract-cuda leaves on the host), and [`crate::ops::MaskedAvgPool`] with its
/// per-sample divisors. With `ragged`, a sample's cells past its width along that axis
/// are never read: a mask before the pool becomes unnecessary.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaPool {
    pub pool_spec: PoolSpec,
    pub kind: PoolKind,
    /// The input's ragged axis the pool slides along, and its row in the widths table.
    pub ragged: Option<(usize, usize)>,
}

impl Op for CudaPool {
    fn name(&self) -> StaticName {
        match (self.kind, self.ragged.is_some()) {
            (PoolKind::Max, false) => "CudaMaxPool".into(),
            (PoolKind::Max, true) => "CudaRaggedMaxPool".into(),
            (_, false) => "CudaSumPool".into(),
            (_, true) => "CudaRaggedAvgPool".into(),
        }
    }

    fn info(&self) -> TractResult<Vec<String>> {
        let mut info = self.pool_spec.info();
        info.push(format!("{:?}, ragged: {:?}", self.kind, self.ragged));
        Ok(info)
    }

    op_as_typed_op!();
}

impl CudaPool {
    fn geometry(&self, input: &[usize], table_n: i64) -> TractResult<(PoolGeom, TVec<usize>)> {
        let spec = &self.pool_spec;
        let data = spec.data_format.shape(input)?;
        let hw: TVec<usize> = data.hw_axes().collect();
        ensure!(
            (1..=3).contains(&hw.len()),
            "CudaPool: {} spatial axes, 1 to 3 supported",
            hw.len()
        );
        let mut g = PoolGeom {
            n: data.n().copied().unwrap_or(1) as i64,
            c: *data.c() as i64,
            table_n,
            spatial: hw.len() as i64,
            channels_last: spec.data_format.c_is_last() as i64,
            is_max: (self.kind == PoolKind::Max) as i64,
            ragged_geo: -1,
            ..PoolGeom::default()
        };
        if let PoolKind::Sum {
            normalize,
            count_include_pad,
        } = self.kind
        {
            g.normalize = normalize as i64;
            g.count_include_pad = count_include_pad as i64;
        }
        g.ceil_mode = matches!(spec.padding, PaddingSpec::ExplicitOnnxPool(_, _, true)) as i64;
        let padded = spec.computed_padding(data.hw_dims());
        for (geo, p) in padded.iter().enumerate() {
            g.in_dims[geo] = data.hw_dims()[geo] as i64;
            g.out_dims[geo] = p.convoluted as i64;
            g.k[geo] = spec.kernel_shape[geo] as i64;
            g.s[geo] = spec.stride(geo) as i64;
            g.d[geo] = spec.dilation(geo) as i64;
            g.pb[geo] = p.pad_before as i64;
            g.pa[geo] = p.pad_after as i64;
        }
        if let Some((axis, row)) = self.ragged {
            g.ragged_geo = hw
                .iter()
                .position(|a| *a == axis)
                .context("ragged axis is not spatial")? as i64;
            g.row = row as i64;
        }
        let output = spec.output_shape(input)?.shape.to_vec().into();
        Ok((g, output))
    }
}

impl EvalOp for CudaPool {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = self.name();
        let x = inputs[0].to_device_tensor()?;
        contiguous(x, &op)?;
        ensure!(
            x.datum_type() == f32::datum_type(),
            "{op}: only f32 is supported, got {:?}",
            x.datum_type()
        );
        let table = match self.ragged {
            Some(_) => Some(
                inputs
                    .get(1)
                    .context("missing widths table")?
                    .to_device_tensor()?,
            ),
            None => None,
        };
        let table_n = table
            .map(|t| table_columns(t, &op))
            .transpose()?
            .unwrap_or(0);
        let (geom, output_shape) = self.geometry(x.shape(), table_n)?;
        let output = make_tensor_for_node(ctx, x.datum_type(), &output_shape)?;
        let total = output.len() as i64;
        if total > 0 {
            let (xv, yv) = (get_cuda_view(x), get_cuda_view(&output));
            // Without a table, the kernel never reads it: any valid pointer does.
            let tv = get_cuda_view(table.unwrap_or(x));
            launch!(
                Library::Pool,
                "ragged_pool_f32",
                elementwise_grid(total as usize),
                |b| {
                    b.arg(&xv).arg(&yv).arg(&tv).arg(&geom).arg(&total);
                }
            )?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaPool {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(&inputs[..1], |f| {
            Ok(self.pool_spec.output_shape(&f.shape)?.shape.into())
        })
    }

    as_op!();
}

/// The geometry the deconv kernel takes, laid out as `struct DeconvGeom` in
/// kernels/deconv.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct DeconvGeom {
    n: i64,
    ci: i64,
    co: i64,
    groups: i64,
    bias_len: i64,
    in_dims: [i64; 3],
    out_dims: [i64; 3],
    k: [i64; 3],
    s: [i64; 3],
    d: [i64; 3],
    pb: [i64; 3],
    spatial: i64,
}

unsafe impl cudarc::driver::DeviceRepr for DeconvGeom {}

/// tract's `Deconv` (ONNX ConvTranspose) on the device, f32, channels first: tract-cuda
/// leaves it on the host. Inputs: data, kernel (OIHW as tract holds it), bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaDeconv(pub tract_core::ops::cnn::Deconv);

impl Op for CudaDeconv {
    fn name(&self) -> StaticName {
        "CudaDeconv".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    op_as_typed_op!();
}

impl CudaDeconv {
    /// Whether the kernel handles this deconv.
    pub fn supports(op: &tract_core::ops::cnn::Deconv) -> bool {
        op.kernel_format == KernelFormat::OIHW
            && !op.pool_spec.data_format.c_is_last()
            && op.pool_spec.data_format.has_n()
            && (1..=3).contains(&op.pool_spec.rank())
    }

    fn geometry(
        &self,
        x: &[usize],
        k: &[usize],
        bias_len: usize,
    ) -> TractResult<(DeconvGeom, TVec<usize>)> {
        let spec = &self.0.pool_spec;
        let data = spec.data_format.shape(x)?;
        let hw = data.hw_dims();
        let padded = spec.padding.compute_for_deconv(
            hw,
            &spec.kernel_shape,
            &spec.dilations(),
            &spec.strides(),
            &self.0.adjustments,
        )?;
        let mut g = DeconvGeom {
            n: *data.n().unwrap_or(&1) as i64,
            ci: *data.c() as i64,
            co: k[0] as i64,
            groups: self.0.group as i64,
            bias_len: bias_len as i64,
            spatial: hw.len() as i64,
            ..DeconvGeom::default()
        };
        let mut output: TVec<usize> = tvec!(g.n as usize, g.co as usize);
        for (a, p) in padded.iter().enumerate() {
            g.in_dims[a] = hw[a] as i64;
            g.out_dims[a] = p.deconvoluted as i64;
            g.k[a] = spec.kernel_shape[a] as i64;
            g.s[a] = spec.stride(a) as i64;
            g.d[a] = spec.dilation(a) as i64;
            g.pb[a] = p.pad_before as i64;
            output.push(p.deconvoluted);
        }
        Ok((g, output))
    }
}

impl EvalOp for CudaDeconv {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        ensure!(inputs.len() == 3, "CudaDeconv: data, kernel and bias");
        let inputs = contiguous_f32(&inputs, "CudaDeconv")?;
        let (x, k, b) = (inputs[0], inputs[1], inputs[2]);
        let (geom, output_shape) = self.geometry(x.shape(), k.shape(), b.len())?;
        ensure!(
            b.len() == 1 || b.len() as i64 == geom.co,
            "CudaDeconv: {} biases for {} channels",
            b.len(),
            geom.co
        );
        let output = make_tensor_for_node(ctx, x.datum_type(), &output_shape)?;
        let total = output.len() as i64;
        if total > 0 {
            let (xv, kv, bv, yv) = (
                get_cuda_view(x),
                get_cuda_view(k),
                get_cuda_view(b),
                get_cuda_view(&output),
            );
            launch!(
                Library::Deconv,
                "ragged_deconv_f32",
                elementwise_grid(total as usize),
                |l| {
                    l.arg(&xv).arg(&kv).arg(&bv).arg(&yv).arg(&geom).arg(&total);
                }
            )?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaDeconv {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| self.0.output_facts(facts))
    }

    as_op!();
}

/// Geometry of a depthwise convolution, as `kernels/depthwise.cu`'s `DepthwiseGeom`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct DepthwiseGeom {
    c: u32,
    ih: u32,
    iw: u32,
    oh: u32,
    ow: u32,
    kh: i32,
    kw: i32,
    sh: i32,
    sw: i32,
    dh: i32,
    dw: i32,
    ph: i32,
    pw: i32,
}

// SAFETY: plain old data, `repr(C)`, laid out as the kernel's struct.
unsafe impl cudarc::driver::DeviceRepr for DepthwiseGeom {}

/// A depthwise 2-D convolution on the device, f32, channels first, one filter per channel
/// ([`super::convs::Depthwise`]). Inputs: data, kernel (OIHW), bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaDepthwise(pub tract_core::ops::cnn::Conv);

impl Op for CudaDepthwise {
    fn name(&self) -> StaticName {
        "CudaDepthwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    op_as_typed_op!();
}

impl EvalOp for CudaDepthwise {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        ensure!(inputs.len() == 3, "CudaDepthwise: data, kernel and bias");
        let inputs = contiguous_f32(&inputs, "CudaDepthwise")?;
        let (x, k, b) = (inputs[0], inputs[1], inputs[2]);
        let spec = &self.0.pool_spec;
        let shape = x.shape();
        ensure!(
            shape.len() == 4 && k.len() == shape[1] * spec.kernel_shape.iter().product::<usize>(),
            "CudaDepthwise: input {shape:?} and kernel {:?} are not one 2-D filter per channel",
            k.shape()
        );
        ensure!(
            b.len() == shape[1],
            "CudaDepthwise: {} biases for {} channels",
            b.len(),
            shape[1]
        );
        let padding = spec.computed_padding(&shape[2..]);
        let output_shape = [
            shape[0],
            shape[1],
            padding[0].convoluted,
            padding[1].convoluted,
        ];
        let output = make_tensor_for_node(ctx, f32::datum_type(), &output_shape)?;
        let total = output.len();
        ensure!(
            total <= i32::MAX as usize && x.len() <= i32::MAX as usize,
            "CudaDepthwise: tensors of 2^31 elements or more are not supported"
        );
        if total > 0 {
            let int = |v: usize| v as i32;
            let geom = DepthwiseGeom {
                c: shape[1] as u32,
                ih: shape[2] as u32,
                iw: shape[3] as u32,
                oh: output_shape[2] as u32,
                ow: output_shape[3] as u32,
                kh: int(spec.kernel_shape[0]),
                kw: int(spec.kernel_shape[1]),
                sh: int(spec.stride(0)),
                sw: int(spec.stride(1)),
                dh: int(spec.dilation(0)),
                dw: int(spec.dilation(1)),
                ph: int(padding[0].pad_before),
                pw: int(padding[1].pad_before),
            };
            let total = total as u32;
            let (xv, kv, bv, yv) = (
                get_cuda_view(x),
                get_cuda_view(k),
                get_cuda_view(b),
                get_cuda_view(&output),
            );
            launch!(
                Library::Depthwise,
                "ragged_depthwise_f32",
                elementwise_grid(total as usize),
                |l| {
                    l.arg(&xv).arg(&kv).arg(&bv).arg(&yv).arg(&geom).arg(&total);
                }
            )?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaDepthwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| self.0.output_facts(facts))
    }

    as_op!();
}
