//! tract's `Deconv` (ONNX ConvTranspose) on the device, f32 or f16, channels first
//! (`kernels/deconv.cu`): tract-cuda leaves it on the host. One thread per output
//! element, summing the taps of every input element that scatters to it.

use tract_core::internal::*;
use tract_core::ops::cnn::{Deconv, KernelFormat};
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use super::float_kernel;
use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous_floats, grid_over, launch};
use crate::cuda::nvrtc::KernelFile;

use super::DeviceOp;

crate::kernel_args! {
    /// A transposed convolution over up to three spatial axes (unused ones of extent 1).
    pub struct DeconvGeom {
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
        /// Output elements: one thread each.
        total: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "deconv",
    source: include_str!("../../../kernels/deconv.cu"),
    args: DeconvGeom::declaration,
};

/// tract's `Deconv` on the device (module doc). Inputs: data, kernel (OIHW as tract
/// holds it), bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaDeconv(pub Deconv);

/// Transposed convolutions on f32 or f16, channels first, OIHW kernels, 1 to 3 spatial axes.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<Deconv>() else {
        return Ok(None);
    };
    let supported = super::is_float_kernel_type(dt)
        && op.kernel_format == KernelFormat::OIHW
        && !op.pool_spec.data_format.c_is_last()
        && op.pool_spec.data_format.has_n()
        && (1..=3).contains(&op.pool_spec.rank());
    Ok(supported.then(|| Box::new(CudaDeconv(op.clone())) as Box<dyn TypedOp>))
}

device_op!(CudaDeconv);

impl DeviceOp for CudaDeconv {
    const NAME: &'static str = "CudaDeconv";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        ensure!(inputs.len() == 3, "{op}: data, kernel and bias");
        let inputs = contiguous_floats(&inputs, op)?;
        let (x, k, b) = (inputs[0], inputs[1], inputs[2]);
        let (mut geom, output_shape) = self.geometry(x.shape(), k.shape(), b.len())?;
        ensure!(
            b.len() == 1 || b.len() as i64 == geom.co,
            "{op}: {} biases for {} channels",
            b.len(),
            geom.co
        );
        let output = make_tensor_for_node(ctx, x.datum_type(), &output_shape)?;
        geom.total = output.len() as i64;
        if geom.total > 0 {
            // SAFETY: ragged_deconv_{f32,f16}(x, w, b, y, DeconvGeom): contiguous tensors of
            // one type (checked) and of the shapes the geometry was computed from, y `total`
            // of that type.
            unsafe {
                launch(
                    &KERNELS,
                    &format!("ragged_deconv_{}", float_kernel(x.datum_type(), op)?),
                    grid_over(output.len()),
                    &[x, k, b, &output],
                    &geom,
                )
            }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl CudaDeconv {
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

impl TypedOp for CudaDeconv {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| self.0.output_facts(facts))
    }

    as_op!();
}
