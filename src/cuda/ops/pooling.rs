//! Max, sum and average pooling on the device, f32 or f16 (`kernels/pooling.cu`): tract's `MaxPool`
//! and `SumPool`, which tract-cuda leaves on the host, and [`MaskedAvgPool`] with its
//! per-sample divisors.
//!
//! Along a ragged axis, a sample's cells past its width are never read: they count as
//! padding, so a mask before the pool is unnecessary and the divisor is the sample's own.

use tract_core::internal::*;
use tract_core::ops::cnn::{MaxPool, PaddingSpec, PoolSpec, SumPool};
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use super::{float_kernel, is_float_kernel_type};
use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, device_facts, grid_over, launch, table_columns};
use crate::cuda::nvrtc::KernelFile;
use crate::ops::MaskedAvgPool;

use super::DeviceOp;

crate::kernel_args! {
    /// A pool over up to three spatial axes (unused ones of extent 1), channels first or
    /// last; `rows` the widths table row of each ragged spatial axis (-1: not ragged).
    pub struct PoolGeom {
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
        /// Output elements: one thread each.
        total: i64,
        channels_last: i64,
        is_max: i64,
        normalize: i64,
        count_include_pad: i64,
        ceil_mode: i64,
        rows: [i64; 3],
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "pooling",
    source: include_str!("../../../kernels/pooling.cu"),
    args: PoolGeom::declaration,
};

/// How a pool reduces its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    Sum {
        normalize: bool,
        count_include_pad: bool,
    },
}

/// A pool on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaPool {
    pub pool_spec: PoolSpec,
    pub kind: PoolKind,
    /// The input's ragged axes the pool slides along, and their rows in the widths table.
    pub ragged: TVec<(usize, usize)>,
}

/// Our masked average pool (f32, f16 or an error), tract's max pools without index outputs
/// and sum pools on f32 and f16.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    if let Some(op) = node.op_as::<MaskedAvgPool>() {
        float_kernel(dt, "a masked average pool")?;
        let ragged = op
            .windows
            .iter()
            .map(|(axis, _)| {
                let row = op
                    .axes
                    .ragged_at(*axis)
                    .context("pooled axis is not ragged")?
                    .row;
                Ok((*axis, row))
            })
            .collect::<TractResult<_>>()?;
        let kind = PoolKind::Sum {
            normalize: true,
            count_include_pad: op.count_include_pad,
        };
        return Ok(Some(Box::new(CudaPool {
            pool_spec: op.pool_spec.clone(),
            kind,
            ragged,
        })));
    }
    if !is_float_kernel_type(dt) {
        return Ok(None);
    }
    let (pool_spec, kind) = if let Some(op) = node.op_as::<MaxPool>() {
        if op.with_index_outputs.is_some() {
            return Ok(None);
        }
        (&op.pool_spec, PoolKind::Max)
    } else if let Some(op) = node.op_as::<SumPool>() {
        let kind = PoolKind::Sum {
            normalize: op.normalize,
            count_include_pad: op.count_include_pad,
        };
        (&op.pool_spec, kind)
    } else {
        return Ok(None);
    };
    Ok(Some(Box::new(CudaPool {
        pool_spec: pool_spec.clone(),
        kind,
        ragged: tvec!(),
    })))
}

device_op!(CudaPool);

impl CudaPool {
    fn geometry(&self, input: &[usize], table_n: i64) -> TractResult<(PoolGeom, TVec<usize>)> {
        let op = Self::NAME;
        let spec = &self.pool_spec;
        let data = spec.data_format.shape(input)?;
        let hw: TVec<usize> = data.hw_axes().collect();
        ensure!(
            (1..=3).contains(&hw.len()),
            "{op}: {} spatial axes, 1 to 3 supported",
            hw.len()
        );
        let mut g = PoolGeom {
            n: data.n().copied().unwrap_or(1) as i64,
            c: *data.c() as i64,
            table_n,
            spatial: hw.len() as i64,
            channels_last: spec.data_format.c_is_last() as i64,
            is_max: (self.kind == PoolKind::Max) as i64,
            rows: [-1; 3],
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
        for (axis, row) in &self.ragged {
            let geo = hw
                .iter()
                .position(|a| a == axis)
                .context("ragged axis is not spatial")?;
            g.rows[geo] = *row as i64;
        }
        let output = spec.output_shape(input)?.shape.to_vec().into();
        Ok((g, output))
    }
}

impl DeviceOp for CudaPool {
    const NAME: &'static str = "CudaPool";

    fn name(&self) -> StaticName {
        match (self.kind, !self.ragged.is_empty()) {
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

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = DeviceOp::name(self);
        let x = inputs[0].to_device_tensor()?;
        contiguous(x, &op)?;
        let kernel = format!("ragged_pool_{}", float_kernel(x.datum_type(), &op)?);
        let table = match self.ragged.first() {
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
        let (mut geom, output_shape) = self.geometry(x.shape(), table_n)?;
        let output = make_tensor_for_node(ctx, x.datum_type(), &output_shape)?;
        geom.total = output.len() as i64;
        if geom.total > 0 {
            // Without a table, the kernel never reads it: any valid pointer does.
            let table = table.unwrap_or(x);
            // SAFETY: ragged_pool_{f32,f16}(x, y, table, PoolGeom): x holds the input shape
            // of the geometry in its type, y `total` of them (its output shape), the table
            // [K, table_n] i64 with `row` < K when a ragged axis is read.
            unsafe {
                launch(
                    &KERNELS,
                    &kernel,
                    grid_over(output.len()),
                    &[x, &output, table],
                    &geom,
                )
            }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaPool {
    /// Every output a pass over its window: a sum (FMA) per tap.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let out = &self.output_facts(inputs)?[0];
        let taps: usize = self.pool_spec.kernel_shape.iter().product();
        Ok(tvec!((
            Cost::FMA(inputs[0].datum_type),
            out.shape.volume() * taps
        )))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(&inputs[..1], |f| {
            Ok(self.pool_spec.output_shape(&f.shape)?.shape.into())
        })
    }

    as_op!();
}
