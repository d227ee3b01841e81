//! A chain of element-wise binary ops as one generated kernel on the device, made by the
//! fusion pass ([`crate::cuda::fusion`]).
//!
//! The kernel is generated from the chain's [`Program`] for the variant a run needs
//! ([`codegen`]), compiled by NVRTC when the plan is made (cached on disk,
//! [`crate::cuda::nvrtc`]) with `--fmad=false`: each link is the same f32 operation as
//! tract-cuda's kernel for it, rounded alike, so the chain gives the bits of its ops run
//! one by one. An f16 chain computes each link in f32 and rounds it to f16, which is what
//! tract-cuda's f16 kernels give (half arithmetic is correctly rounded). Operands are read through their strides ([`mod@geometry`]), broadcast axes at
//! stride 0, so the views tract-cuda had fused into a binary's inputs stay views.
//!
//! With a [`FusedMask`], the kernel also writes a ragged mask's fill past each sample's
//! width (the mask selects: same bits as the mask after the chain).

use std::sync::{Arc, Mutex};

use cudarc::driver::PushKernelArg;
use tract_core::internal::*;
use tract_cuda::kernels::get_cuda_view;
use tract_gpu::ops::change_axes::GpuAxisOp;
use tract_gpu::tensor::{DeviceTensor, DeviceTensorExt};
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use crate::cuda::launch::{grid_over, with_stream};
use crate::cuda::nvrtc::{Kernel, generated_kernel};
use crate::elementwise::{MAX_OPERANDS, Program};

pub mod codegen;
pub mod geometry;

use crate::cuda::fastdiv::fast_div;
use codegen::{Class, FusedGeometry, FusedMaskGeom, MAX_RANK, Variant, source};
use geometry::{geometry, view};

use super::DeviceOp;

/// A mask written by a fused chain's kernel: past each sample's width along `axis` (of
/// the output), the fill instead of the chain's value. The widths table is the op's last
/// input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FusedMask {
    pub batch: usize,
    pub axis: usize,
    /// The row of the widths table.
    pub row: usize,
    /// The fill, as f32 bits (an infinity for a max pool).
    pub fill_bits: u32,
}

impl FusedMask {
    /// The kernel's mask arguments for an output of `shape` and the widths `table`.
    fn geometry(&self, shape: &[usize], table: &DeviceTensor) -> TractResult<FusedMaskGeom> {
        let op = CudaFusedElementwise::NAME;
        ensure!(
            table.datum_type() == i64::datum_type()
                && table.rank() == 2
                && self.row < table.shape()[0],
            "{op}: a widths table of [K, N] i64 with row {}, got {:?} {:?}",
            self.row,
            table.datum_type(),
            table.shape()
        );
        ensure!(
            self.batch < shape.len() && self.axis < shape.len(),
            "{op}: mask axes {} and {} for rank {}",
            self.batch,
            self.axis,
            shape.len()
        );
        ensure!(
            shape[self.batch] == table.shape()[1],
            "{op}: {} samples, {} widths",
            shape[self.batch],
            table.shape()[1]
        );
        let stride = |axis: usize| shape[axis + 1..].iter().product::<usize>() as u32;
        Ok(FusedMaskGeom {
            table_n: table.shape()[1] as u32,
            batch_stride: stride(self.batch),
            batch_dim: shape[self.batch] as u32,
            ragged_stride: stride(self.axis),
            ragged_dim: shape[self.axis] as u32,
            row: self.row as i32,
            fill: f32::from_bits(self.fill_bits),
            batch_stride_div: fast_div(stride(self.batch)),
            batch_dim_div: fast_div(shape[self.batch] as u32),
            ragged_stride_div: fast_div(stride(self.axis)),
            ragged_dim_div: fast_div(shape[self.axis] as u32),
        })
    }
}

/// A chain of element-wise binary ops, as one kernel on the device (module doc).
#[derive(Clone, Debug)]
pub struct CudaFusedElementwise {
    pub program: Program,
    /// Per operand, the axis ops tract-cuda had fused into its read: applied as views.
    pub views: TVec<TVec<GpuAxisOp>>,
    /// The output shape (the chain's), symbolic as in the model.
    pub shape: ShapeFact,
    /// The type of the operands and the output: f32 or f16.
    pub dt: DatumType,
    /// A mask the kernel writes, the widths table as last input.
    pub mask: Option<FusedMask>,
    /// The kernels compiled for this chain, by variant: looked up here at each run, not
    /// by hashing a source.
    kernels: Arc<Mutex<HashMap<Variant, Kernel>>>,
}

impl PartialEq for CudaFusedElementwise {
    fn eq(&self, other: &Self) -> bool {
        (&self.program, &self.views, &self.shape, self.dt, &self.mask)
            == (
                &other.program,
                &other.views,
                &other.shape,
                other.dt,
                &other.mask,
            )
    }
}

impl Eq for CudaFusedElementwise {}

impl CudaFusedElementwise {
    pub fn new(
        program: Program,
        views: TVec<TVec<GpuAxisOp>>,
        shape: ShapeFact,
        dt: DatumType,
    ) -> TractResult<Self> {
        ensure!(
            dt == DatumType::F32 || dt == DatumType::F16,
            "fused element-wise: {dt:?} chains (f32 and f16 only)"
        );
        ensure!(
            program.operands == views.len() && (1..=MAX_OPERANDS).contains(&program.operands),
            "fused element-wise: {} operands, {} views",
            program.operands,
            views.len()
        );
        Ok(CudaFusedElementwise {
            program,
            views,
            shape,
            dt,
            mask: None,
            kernels: Default::default(),
        })
    }

    /// The kernel for `variant`, compiled (or read from the disk cache) on first use.
    fn kernel(&self, variant: &Variant) -> TractResult<Kernel> {
        let mut kernels = self
            .kernels
            .lock()
            .map_err(|_| anyhow!("fused kernels poisoned"))?;
        if let Some(k) = kernels.get(variant) {
            return Ok(k.clone());
        }
        let source: Arc<str> = source(&self.program, variant).into();
        let k = tract_cuda::with_cuda_stream(|stream| {
            generated_kernel(stream.context(), &source, "fused_elementwise")
        })?;
        kernels.insert(variant.clone(), k.clone());
        Ok(k)
    }

    fn variant(
        &self,
        dims: &[usize],
        strides: &[TVec<isize>],
        masked: bool,
        vector: bool,
    ) -> Variant {
        Variant::of(dims, strides, masked, vector, self.dt == DatumType::F16)
    }

    /// The mask's batch and ragged strides and ragged extent in an output of `shape`, for
    /// [`Variant::vectorizable`].
    fn mask_strides(&self, shape: &[usize]) -> Option<(usize, usize, usize)> {
        let mask = self.mask.as_ref()?;
        let stride = |axis: usize| shape.get(axis + 1..).map_or(1, |s| s.iter().product());
        Some((
            stride(mask.batch),
            stride(mask.axis),
            shape.get(mask.axis).copied().unwrap_or(1),
        ))
    }

    /// Compiles now the kernel a run on operands of `facts` will need, where their shapes
    /// are known (inputs laid out as their shapes say, as tract-cuda's outputs are): the
    /// first run does not wait on NVRTC.
    pub fn compile_for(&self, facts: &[&TypedFact]) -> TractResult<()> {
        let symbols = SymbolValues::default();
        let (Some(out), Some(shapes)) = (
            self.shape.as_concrete(),
            facts
                .iter()
                .map(|f| f.shape.as_concrete())
                .collect::<Option<Vec<_>>>(),
        ) else {
            return Ok(());
        };
        let views = shapes
            .iter()
            .zip(&self.views)
            .map(|(shape, ops)| {
                view(
                    (*shape).into(),
                    Tensor::natural_strides(shape),
                    ops,
                    &symbols,
                )
            })
            .collect::<TractResult<Vec<_>>>()?;
        let (dims, strides) = geometry(out, &views)?;
        // Tensors as tract-cuda allocates them are aligned for float4.
        let vector = Variant::vectorizable(&dims, &strides, self.mask_strides(out));
        self.kernel(&self.variant(&dims, &strides, self.mask.is_some(), vector))?;
        Ok(())
    }
}

device_op!(CudaFusedElementwise);

impl DeviceOp for CudaFusedElementwise {
    const NAME: &'static str = "CudaFusedElementwise";

    fn info(&self) -> TractResult<Vec<String>> {
        let mut info = vec![self.program.to_string()];
        if let Some(m) = &self.mask {
            info.push(format!(
                "masked: batch axis {}, ragged axis {} (row {}), fill {}",
                m.batch,
                m.axis,
                m.row,
                f32::from_bits(m.fill_bits)
            ));
        }
        Ok(info)
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let k = self.program.operands;
        ensure!(
            inputs.len() == k + self.mask.is_some() as usize,
            "{op}: {} inputs for {k} operands{}",
            inputs.len(),
            if self.mask.is_some() {
                " and a widths table"
            } else {
                ""
            }
        );
        let table = match self.mask {
            Some(_) => Some(inputs[k].to_device_tensor()?),
            None => None,
        };
        let operands = inputs[..k]
            .iter()
            .map(|t| t.to_device_tensor())
            .collect::<TractResult<Vec<_>>>()?;
        for (i, t) in operands.iter().enumerate() {
            ensure!(
                t.datum_type() == self.dt,
                "{op}: operand {i} is {:?}, not {:?}",
                t.datum_type(),
                self.dt
            );
        }
        let shape = self.shape.eval_to_usize(ctx.symbols)?;
        let output = make_tensor_for_node(ctx, self.dt, &shape)?;
        let total = output.len();
        if total == 0 {
            return Ok(tvec!(output.into_tensor().into_tvalue()));
        }
        ensure!(
            total <= i32::MAX as usize,
            "{op}: {total} elements, the kernel addresses at most 2^31 - 1"
        );
        let views = operands
            .iter()
            .zip(&self.views)
            .map(|(t, ops)| view(t.shape().into(), t.strides().into(), ops, ctx.symbols))
            .collect::<TractResult<Vec<_>>>()?;
        let (dims, strides) = geometry(&shape, &views)?;
        let mut geo = FusedGeometry {
            dims: [1; MAX_RANK],
            inner: [1; MAX_RANK],
            strides: [[0; MAX_RANK]; MAX_OPERANDS],
            dims_div: [fast_div(1); MAX_RANK],
            inner_div: [fast_div(1); MAX_RANK],
        };
        let mut inner = 1usize;
        for d in (0..dims.len()).rev() {
            geo.dims[d] = dims[d] as u32;
            geo.inner[d] = inner as u32;
            geo.dims_div[d] = fast_div(dims[d] as u32);
            geo.inner_div[d] = fast_div(inner as u32);
            inner *= dims[d];
        }
        for (i, s) in strides.iter().enumerate() {
            // The furthest element an operand reads must be addressable in 32 bits.
            let reach: isize = s
                .iter()
                .zip(&dims)
                .map(|(s, d)| s * (*d as isize - 1))
                .sum();
            ensure!(
                s.iter().all(|s| *s >= 0) && reach <= i32::MAX as isize,
                "{op}: operand {i} (strides {s:?}) is out of the kernel's 32-bit reach"
            );
            for (d, stride) in s.iter().enumerate() {
                geo.strides[i][d] = *stride as u32;
            }
        }
        let masking = match (&self.mask, table) {
            (Some(mask), Some(table)) => {
                Some((mask.geometry(&shape, table)?, get_cuda_view(table)))
            }
            _ => None,
        };
        // float4 (f16x4) reads and writes need 16-byte (8-byte) aligned dense operands and
        // output.
        let alignment = 4 * self.dt.size_of();
        let aligned = std::iter::once(&output)
            .chain(
                operands
                    .iter()
                    .zip(&strides)
                    .filter_map(|(t, s)| (Class::of(&dims, s) == Class::Dense).then_some(*t)),
            )
            .all(|t| t.buffer_offset::<usize>() % alignment == 0);
        let vector = aligned && Variant::vectorizable(&dims, &strides, self.mask_strides(&shape));
        let kernel = self.kernel(&self.variant(&dims, &strides, masking.is_some(), vector))?;
        let ptrs: Vec<_> = operands.iter().map(|t| get_cuda_view(t)).collect();
        let out_view = get_cuda_view(&output);
        let n = total as u32;
        with_stream(|stream| {
            // SAFETY: fused_elementwise(out, p0..pk, FusedGeometry, n[, table,
            // FusedMaskGeom]) as `source` generated it for this variant: `n` elements of
            // `dt` out, each operand of `dt` (checked) within its 32-bit reach through its strides (checked above), the
            // table [K, table_n] i64 with `row` < K (checked by `FusedMask::geometry`).
            unsafe {
                kernel.launch(
                    stream,
                    grid_over(if vector { total / 4 } else { total }),
                    |b| {
                        b.arg(&out_view);
                        for v in &ptrs {
                            b.arg(v);
                        }
                        b.arg(&geo).arg(&n);
                        if let Some((mask, table)) = &masking {
                            b.arg(table).arg(mask);
                        }
                    },
                )
            }
        })?;
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaFusedElementwise {
    /// One operation per link of the chain and output element (an FMA each, as tract's
    /// element-wise ops count theirs), one pass writing the output.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let out = &self.output_facts(inputs)?[0];
        Ok(tvec!(
            (
                Cost::FMA(out.datum_type),
                out.shape.volume() * self.program.links.len()
            ),
            (Cost::Buffer(out.datum_type), out.shape.volume())
        ))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |_| Ok(tvec!(self.dt.fact(self.shape.clone()))))
    }

    as_op!();
}
