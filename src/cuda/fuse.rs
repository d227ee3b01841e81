//! Element-wise chains on the device: one generated kernel per chain instead of one
//! tract-cuda launch per link.
//!
//! tract-cuda runs each binary op as its own kernel: on PP-OCRv4 rec, 300 launches per
//! batch, each reading and writing a whole activation, half of the device time. After
//! tract-cuda's translation (and ours), [`fuse`] finds the chains of its f32 binary ops
//! ([`crate::elementwise::find_chains`]) and replaces each by a
//! [`CudaFusedElementwise`]: a kernel generated from the chain's [`Program`], compiled by
//! NVRTC when the plan is made (cached on disk, [`super::kernels`]).
//!
//! Same bits as unfused: a link is the same f32 operation as tract-cuda's kernel for it
//! (`a + b`, `fminf`, ...), and the generated source is compiled with `--fmad=false`, so
//! no multiply and add are contracted across links. The kernel reads each operand through
//! its strides, broadcast axes at stride 0, so the views tract-cuda had fused into a
//! binary's inputs (reshapes, moved axes: [`CudaFusedAxisOp`]) are applied here as views
//! too, never as copies.
//!
//! `TRACT_RAGGED_FUSE=0` turns the pass off (for measuring what it brings):
//! [`super::RaggedCudaRuntime::translate_with`].

use std::sync::Arc;

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use tract_core::internal::tract_smallvec::ToSmallVec;
use tract_core::internal::*;
use tract_cuda::kernels::get_cuda_view;
use tract_cuda::ops::CudaFusedAxisOp;
use tract_gpu::ops::binary::GpuBinOp;
use tract_gpu::ops::change_axes::GpuAxisOp;
use tract_gpu::tensor::{DeviceTensor, DeviceTensorExt};
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use super::kernels::generated_function;
use crate::elementwise::{BinKind, ChainNodes, MAX_OPERANDS, Program, fuse_chains};

/// The most axes a fused kernel addresses, after merging the axes it can.
const MAX_RANK: usize = 6;

/// tract-cuda's binary ops, bare or behind the axis ops it fused into their inputs.
struct CudaNodes;

impl CudaNodes {
    fn binary(node: &TypedNode) -> Option<(&GpuBinOp, Option<&CudaFusedAxisOp>)> {
        if let Some(op) = node.op_as::<GpuBinOp>() {
            return Some((op, None));
        }
        let fused = node.op_as::<CudaFusedAxisOp>()?;
        Some((fused.op.downcast_ref::<GpuBinOp>()?, Some(fused)))
    }

    fn views(node: &TypedNode, slot: usize) -> &[GpuAxisOp] {
        match Self::binary(node) {
            Some((_, Some(fused))) => fused.grouped_axis_ops.get(slot).map_or(&[], |v| &**v),
            _ => &[],
        }
    }
}

impl ChainNodes for CudaNodes {
    fn kind(&self, model: &TypedModel, node: &TypedNode) -> Option<BinKind> {
        let (op, _) = Self::binary(node)?;
        let f32_only = node
            .inputs
            .iter()
            .chain(std::iter::once(&OutletId::new(node.id, 0)))
            .all(|o| {
                model
                    .outlet_fact(*o)
                    .is_ok_and(|f| f.datum_type == f32::datum_type() && f.exotic_fact.is_some())
            });
        (op.backend_name == "Cuda" && f32_only).then(|| BinKind::of(&*op.mini_op))?
    }

    fn plain_input(&self, node: &TypedNode, slot: usize) -> bool {
        Self::views(node, slot).is_empty()
    }

    fn operand_view(&self, node: &TypedNode, slot: usize) -> String {
        format!("{:?}", Self::views(node, slot))
    }
}

/// Replaces the element-wise chains of a model translated for the device by fused
/// kernels, compiling them now. Returns how many chains it fused.
pub fn fuse(model: &mut TypedModel) -> TractResult<usize> {
    let fused = fuse_chains(model, &CudaNodes, &|model, program, operands, tail| {
        let views = operands
            .iter()
            .map(|o| CudaNodes::views(model.node(o.node), o.slot).into())
            .collect();
        let shape = model.outlet_fact(OutletId::new(tail, 0))?.shape.clone();
        let op = CudaFusedElementwise::new(program.clone(), views, shape)?;
        op.kernel()?;
        Ok(Box::new(op))
    })?;
    if fused > 0 {
        model.compact()?;
    }
    Ok(fused)
}

/// What a fused kernel is told of the shapes: the output's extents, and each operand's
/// strides in elements (0 along a broadcast axis). Laid out as the generated kernels'
/// `Geometry`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Geometry {
    dims: [i64; MAX_RANK],
    strides: [[i64; MAX_RANK]; MAX_OPERANDS],
}

// SAFETY: plain old data, `repr(C)`, laid out as the kernels' struct.
unsafe impl DeviceRepr for Geometry {}

/// A chain of element-wise binary ops, as one kernel on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaFusedElementwise {
    pub program: Program,
    /// Per operand, the axis ops tract-cuda had fused into its read: applied as views.
    pub views: TVec<TVec<GpuAxisOp>>,
    /// The output shape (the chain's), symbolic as in the model.
    pub shape: ShapeFact,
    source: Arc<str>,
}

impl CudaFusedElementwise {
    pub fn new(
        program: Program,
        views: TVec<TVec<GpuAxisOp>>,
        shape: ShapeFact,
    ) -> TractResult<Self> {
        ensure!(
            program.operands == views.len() && (1..=MAX_OPERANDS).contains(&program.operands),
            "fused element-wise: {} operands, {} views",
            program.operands,
            views.len()
        );
        let source = source(&program).into();
        Ok(CudaFusedElementwise {
            program,
            views,
            shape,
            source,
        })
    }

    fn kernel(&self) -> TractResult<cudarc::driver::CudaFunction> {
        tract_cuda::with_cuda_stream(|stream| {
            generated_function(stream.context(), &self.source, "fused_elementwise")
        })
    }
}

/// The kernel source of a program: one thread per output element (grid-stride), its
/// coordinates from its index, each operand read once at its strided offset, the links
/// in order, one write. The index is 32-bit (unsigned division is several times cheaper
/// than 64-bit): tensors of 2^31 elements and more are refused, as tract-cuda's own
/// element-wise kernels do not address them either.
fn source(program: &Program) -> String {
    let k = program.operands;
    let params: String = (0..k)
        .map(|i| format!(", const float* __restrict__ p{i}"))
        .collect();
    let offsets = (0..k)
        .map(|i| format!("o{i} = 0"))
        .collect::<Vec<_>>()
        .join(", ");
    let accumulate: String = (0..k)
        .map(|i| format!("                o{i} += c * g.strides[{i}][d];\n"))
        .collect();
    let loads: String = (0..k)
        .map(|i| format!("        const float x{i} = p{i}[o{i}];\n"))
        .collect();
    let links: String = program
        .links
        .iter()
        .enumerate()
        .map(|(j, l)| {
            format!(
                "        const float v{j} = {};\n",
                l.kind.c_expr(&l.a.to_string(), &l.b.to_string())
            )
        })
        .collect();
    let last = program.links.len() - 1;
    let mut src = format!(
        "// {program}\nstruct Geometry {{ long long dims[{MAX_RANK}]; long long strides[{MAX_OPERANDS}][{MAX_RANK}]; }};\n"
    );
    src += &format!(
        r#"
extern "C" __global__ void fused_elementwise(float* __restrict__ out{params}, const Geometry g, unsigned int n, int rank) {{
    typedef unsigned int I;
    for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {{
        I rem = i;
        long long {offsets};
        #pragma unroll
        for (int d = {max}; d >= 0; --d) {{
            if (d < rank) {{
                const I dim = (I)g.dims[d];
                const long long c = (long long)(rem % dim);
                rem /= dim;
{accumulate}            }}
        }}
{loads}{links}        out[i] = v{last};
    }}
}}
"#,
        max = MAX_RANK - 1
    );
    src
}

/// `t` seen through the axis ops tract-cuda had fused into the read: reshapes and moved
/// axes as new shapes and strides over the same memory (as tract-cuda applies them).
fn view(t: &DeviceTensor, ops: &[GpuAxisOp], symbols: &SymbolValues) -> TractResult<DeviceTensor> {
    ops.iter().try_fold(t.clone(), |t, axis_op| {
        let mut shape: TVec<usize> = t.shape().into();
        match &axis_op.inner {
            AxisOp::Reshape(skip, from, to) => {
                let from = from.iter().map(|d| d.eval(symbols)).collect();
                let to = to.iter().map(|d| d.eval(symbols)).collect();
                AxisOp::Reshape(*skip, from, to).change_shape_array(&mut shape, false)?;
            }
            other => other.change_shape_array(&mut shape, false)?,
        }
        if let AxisOp::Move(from, to) = axis_op.inner {
            let mut strides: TVec<isize> = t.strides().to_smallvec();
            let moved = strides.remove(from);
            strides.insert(to, moved);
            t.reshaped(shape)?.restrided(strides)
        } else {
            t.reshaped(shape)
        }
    })
}

/// Each operand's strides against the output's extents, 0 along its broadcast axes.
fn broadcast_strides(
    out: &[usize],
    operands: &[(&[usize], &[isize])],
) -> TractResult<Vec<TVec<isize>>> {
    operands
        .iter()
        .enumerate()
        .map(|(i, (shape, strides))| {
            ensure!(
                shape.len() == out.len(),
                "fused element-wise: operand {i} of rank {} for an output of rank {}",
                shape.len(),
                out.len()
            );
            (0..out.len())
                .map(|d| {
                    if shape[d] == out[d] && out[d] != 1 {
                        Ok(strides[d])
                    } else if shape[d] == 1 {
                        Ok(0)
                    } else {
                        bail!("fused element-wise: operand {i} of shape {shape:?} does not broadcast to {out:?}")
                    }
                })
                .collect()
        })
        .collect()
}

/// Drops the axes of extent one, then merges each axis into the next wherever every
/// operand walks the pair as one run (its stride there is the next one's times the next
/// extent): a per-channel operand keeps the channel axis apart, the rest collapses.
fn merge_axes(dims: &mut TVec<usize>, strides: &mut [TVec<isize>]) {
    let mut d = 0;
    while d < dims.len() && dims.len() > 1 {
        if dims[d] == 1 {
            dims.remove(d);
            strides.iter_mut().for_each(|s| {
                s.remove(d);
            });
        } else {
            d += 1;
        }
    }
    let mut d = 0;
    while d + 1 < dims.len() {
        let inner = dims[d + 1] as isize;
        if strides.iter().all(|s| s[d] == s[d + 1] * inner) {
            dims[d + 1] *= dims[d];
            dims.remove(d);
            strides.iter_mut().for_each(|s| {
                s.remove(d);
            });
        } else {
            d += 1;
        }
    }
}

/// The kernel's geometry for an output of extents `out` and the operands' views.
fn geometry(
    out: &[usize],
    operands: &[DeviceTensor],
) -> TractResult<(TVec<usize>, Vec<TVec<isize>>)> {
    let views: Vec<(&[usize], &[isize])> =
        operands.iter().map(|t| (t.shape(), t.strides())).collect();
    let mut strides = broadcast_strides(out, &views)?;
    let mut dims: TVec<usize> = out.into();
    merge_axes(&mut dims, &mut strides);
    ensure!(
        dims.len() <= MAX_RANK,
        "fused element-wise: {} axes after merging, the kernel addresses {MAX_RANK}",
        dims.len()
    );
    Ok((dims, strides))
}

impl Op for CudaFusedElementwise {
    fn name(&self) -> StaticName {
        "CudaFusedElementwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![self.program.to_string()])
    }

    op_as_typed_op!();
}

impl EvalOp for CudaFusedElementwise {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        ensure!(
            inputs.len() == self.program.operands,
            "CudaFusedElementwise: {} inputs for {} operands",
            inputs.len(),
            self.program.operands
        );
        let operands = inputs
            .iter()
            .zip(&self.views)
            .map(|(t, ops)| view(t.to_device_tensor()?, ops, ctx.symbols))
            .collect::<TractResult<Vec<_>>>()?;
        for (i, t) in operands.iter().enumerate() {
            ensure!(
                t.datum_type() == f32::datum_type(),
                "CudaFusedElementwise: operand {i} is {:?}, not f32",
                t.datum_type()
            );
        }
        let shape = self.shape.eval_to_usize(ctx.symbols)?;
        let output = make_tensor_for_node(ctx, f32::datum_type(), &shape)?;
        let total = output.len();
        if total == 0 {
            return Ok(tvec!(output.into_tensor().into_tvalue()));
        }
        let (dims, strides) = geometry(&shape, &operands)?;
        let mut geo = Geometry {
            dims: [1; MAX_RANK],
            strides: [[0; MAX_RANK]; MAX_OPERANDS],
        };
        for (d, dim) in dims.iter().enumerate() {
            geo.dims[d] = *dim as i64;
        }
        for (i, s) in strides.iter().enumerate() {
            for (d, stride) in s.iter().enumerate() {
                geo.strides[i][d] = *stride as i64;
            }
        }
        ensure!(
            total <= i32::MAX as usize,
            "CudaFusedElementwise: {total} elements, the kernel addresses at most 2^31 - 1"
        );
        let func = self.kernel()?;
        let views: Vec<_> = operands.iter().map(get_cuda_view).collect();
        let out_view = get_cuda_view(&output);
        let (n, rank) = (total as u32, dims.len() as i32);
        let block = 256u32;
        let cfg = LaunchConfig {
            grid_dim: (
                total.div_ceil(block as usize).clamp(1, 1 << 20) as u32,
                1,
                1,
            ),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        tract_cuda::with_cuda_stream(|stream| {
            let mut b = stream.launch_builder(&func);
            b.arg(&out_view);
            for v in &views {
                b.arg(v);
            }
            b.arg(&geo);
            b.arg(&n);
            b.arg(&rank);
            let events = stream.record_profile_events()?;
            unsafe { b.launch(cfg) }.context("Launching CudaFusedElementwise")?;
            if let Some((start, end)) = events {
                stream.finish_profile_entry(start, end)?;
            }
            Ok(())
        })?;
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaFusedElementwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |_| Ok(tvec!(f32::fact(self.shape.clone()))))
    }

    as_op!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elementwise::{Arg, Link};

    #[test]
    fn source_reads_each_operand_once_and_chains_links() {
        let program = Program {
            operands: 2,
            links: vec![
                Link {
                    kind: BinKind::Add,
                    a: Arg::Operand(0),
                    b: Arg::Operand(1),
                },
                Link {
                    kind: BinKind::Max,
                    a: Arg::Value(0),
                    b: Arg::Operand(0),
                },
            ],
        };
        let src = source(&program);
        assert!(src.contains("const float x0 = p0[o0];"));
        assert!(src.contains("const float v0 = x0 + x1;"));
        assert!(src.contains("const float v1 = fmaxf(v0, x0);"));
        assert!(src.contains("out[i] = v1;"));
        assert!(src.contains("void fused_elementwise("));
    }

    #[test]
    fn geometry_merges_what_runs_together() {
        // A [2, 3, 4, 5] output, a full operand, a per-channel one, a scalar: the channel
        // axis stays apart, the spatial axes merge.
        let out = [2, 3, 4, 5];
        let mut strides = broadcast_strides(
            &out,
            &[
                (&[2, 3, 4, 5], &[60, 20, 5, 1]),
                (&[1, 3, 1, 1], &[3, 1, 1, 1]),
                (&[1, 1, 1, 1], &[1, 1, 1, 1]),
            ],
        )
        .unwrap();
        let mut dims: TVec<usize> = out.into();
        merge_axes(&mut dims, &mut strides);
        assert_eq!(&*dims, &[2, 3, 20]);
        assert_eq!(&*strides[0], &[60, 20, 1]);
        assert_eq!(&*strides[1], &[0, 1, 0]);
        assert_eq!(&*strides[2], &[0, 0, 0]);
        // A transposed view does not merge with its neighbours.
        let mut strides = broadcast_strides(&[4, 5], &[(&[4, 5], &[1, 4])]).unwrap();
        let mut dims: TVec<usize> = tvec![4, 5];
        merge_axes(&mut dims, &mut strides);
        assert_eq!(&*dims, &[4, 5]);
        assert!(broadcast_strides(&[4, 5], &[(&[4, 3], &[3, 1])]).is_err());
    }
}
