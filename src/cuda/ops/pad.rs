//! tract's `Pad` in edge and reflect modes on the device (`kernels/pad.cu`): tract-gpu
//! translates constant pads only and leaves these on the host, between two copies over the
//! bus. A reflect pad after the ragged axis is what an STFT front end does to its clip
//! (silero's VAD); the ragged transform then writes each sample's own end again
//! ([`super::CudaEdgeFill`]), so the pad itself is the plain op over the padded batch.
//!
//! Moves bits: one kernel per element size, each output reading the one input position
//! its coordinates map to, as tract's `Pad::eval` fills it axis after axis.

use tract_core::internal::*;
use tract_core::ops::array::{Pad, PadMode};
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, device_facts, grid_over, launch};
use crate::cuda::nvrtc::KernelFile;

use super::DeviceOp;

/// The largest rank the kernel takes.
const MAX_RANK: usize = 8;

crate::kernel_args! {
    /// Per axis (the first `rank`): the output's stride and extent, the input's stride and
    /// extent, the padding before; `reflect` 1 to mirror, 0 to clamp.
    pub struct PadGeom {
        total: i64,
        rank: i64,
        reflect: i64,
        out_stride: [i64; MAX_RANK],
        out_dim: [i64; MAX_RANK],
        in_stride: [i64; MAX_RANK],
        in_dim: [i64; MAX_RANK],
        before: [i64; MAX_RANK],
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "pad",
    source: include_str!("../../../kernels/pad.cu"),
    args: PadGeom::declaration,
};

/// tract's edge or reflect `Pad` on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaPad(pub Pad);

/// Edge and reflect pads of elements of 1, 2, 4 or 8 bytes, of rank up to 8.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(pad) = node.op_as::<Pad>() else {
        return Ok(None);
    };
    let supported = matches!(pad.mode, PadMode::Edge | PadMode::Reflect)
        && super::element_size_kernel("ragged_pad", dt, "a pad").is_ok()
        && pad.pads.len() <= MAX_RANK;
    Ok(supported.then(|| Box::new(CudaPad(pad.clone())) as _))
}

impl CudaPad {
    /// The kernel's geometry for an input of `shape`: an error where tract's own pad would
    /// read outside the input (a reflect pad as long as the extent, an edge pad of an
    /// empty axis).
    fn geometry(&self, shape: &[usize]) -> TractResult<(PadGeom, TVec<usize>)> {
        let rank = shape.len();
        ensure!(
            self.0.pads.len() == rank,
            "{} pads for an input of rank {rank}",
            self.0.pads.len()
        );
        let reflect = self.0.mode == PadMode::Reflect;
        let out: TVec<usize> = shape
            .iter()
            .zip(&self.0.pads)
            .map(|(d, (b, a))| d + b + a)
            .collect();
        let mut g = PadGeom {
            total: out.iter().product::<usize>() as i64,
            rank: rank as i64,
            reflect: reflect as i64,
            ..Default::default()
        };
        let (in_strides, out_strides) = (
            Tensor::natural_strides(shape),
            Tensor::natural_strides(&out),
        );
        for (axis, (&n, &(before, after))) in shape.iter().zip(&self.0.pads).enumerate() {
            if before + after > 0 {
                ensure!(
                    n >= 1 && (!reflect || (before < n && after < n)),
                    "a {} pad of ({before}, {after}) along axis {axis} of extent {n}",
                    if reflect { "reflect" } else { "edge" }
                );
            }
            g.out_stride[axis] = out_strides[axis] as i64;
            g.out_dim[axis] = out[axis] as i64;
            g.in_stride[axis] = in_strides[axis] as i64;
            g.in_dim[axis] = n as i64;
            g.before[axis] = before as i64;
        }
        Ok((g, out))
    }
}

device_op!(CudaPad);

impl DeviceOp for CudaPad {
    const NAME: &'static str = "CudaPad";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let x = args_1!(inputs);
        let x = x.to_device_tensor()?;
        contiguous(x, op)?;
        let (geom, out_shape) = self.geometry(x.shape()).context(op)?;
        let output = make_tensor_for_node(ctx, x.datum_type(), &out_shape)?;
        if geom.total > 0 {
            let name = super::element_size_kernel("ragged_pad", x.datum_type(), op)?;
            // SAFETY: ragged_pad_bK(x, y, PadGeom): x holds the input's elements of K bytes
            // and y `total` of them (the output's shape); every source coordinate is within
            // the input's extent on its axis (clamped, or mirrored once with the pads
            // shorter than the extent, which `geometry` checked).
            unsafe {
                launch(
                    &KERNELS,
                    &name,
                    grid_over(geom.total as usize),
                    &[x, &output],
                    &geom,
                )
            }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaPad {
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let out = self.0.output_facts(inputs)?;
        Ok(crate::ops::written(&out[0]))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(inputs, |f| Ok(self.0.output_facts(&[f])?.remove(0).shape))
    }

    as_op!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pad(mode: PadMode, pads: Vec<(usize, usize)>) -> CudaPad {
        CudaPad(Pad::new(pads, mode))
    }

    #[test]
    fn the_geometry_maps_every_axis_and_refuses_reads_outside() {
        let (g, out) = pad(PadMode::Reflect, vec![(0, 0), (1, 3)])
            .geometry(&[2, 5])
            .unwrap();
        assert_eq!(&*out, &[2, 9]);
        assert_eq!((g.total, g.rank, g.reflect), (18, 2, 1));
        assert_eq!(&g.out_stride[..2], &[9, 1]);
        assert_eq!(&g.in_stride[..2], &[5, 1]);
        assert_eq!(&g.before[..2], &[0, 1]);
        let long = pad(PadMode::Reflect, vec![(0, 5)]).geometry(&[5]);
        assert!(format!("{:#}", long.unwrap_err()).contains("reflect pad of (0, 5)"));
        assert!(pad(PadMode::Edge, vec![(0, 5)]).geometry(&[5]).is_ok());
        assert!(pad(PadMode::Edge, vec![(1, 0)]).geometry(&[0]).is_err());
    }
}
