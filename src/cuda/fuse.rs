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
//! A ragged mask that reads a fused chain, when nothing else reads it, goes into the
//! chain's kernel too (`fuse_masks`): the kernel writes the fill past each sample's
//! width instead of a second pass copying the whole tensor. The mask selects, so the bits
//! stay the unfused ones.
//!
//! `TRACT_RAGGED_FUSE=0` turns the pass off (for measuring what it brings):
//! [`super::RaggedCudaRuntime::translate_with`].

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use tract_core::internal::*;
use tract_cuda::kernels::get_cuda_view;
use tract_cuda::ops::CudaFusedAxisOp;
use tract_gpu::ops::binary::GpuBinOp;
use tract_gpu::ops::change_axes::GpuAxisOp;
use tract_gpu::tensor::{DeviceTensor, DeviceTensorExt};
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use super::kernels::generated_function;
use super::ops::CudaMask;
use crate::elementwise::{BinKind, ChainNodes, MAX_OPERANDS, Program, all_facts, fuse_chains};

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
        // On the device: f32 device facts in and out.
        let f32_only = all_facts(model, node, |f| {
            f.datum_type == f32::datum_type() && f.exotic_fact.is_some()
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
        // Compiled now, for the shapes the plan is made for (where they are known): the
        // first run does not wait on NVRTC.
        let facts = operands
            .iter()
            .map(|o| model.outlet_fact(model.node(o.node).inputs[o.slot]))
            .collect::<TractResult<Vec<_>>>()?;
        if let Some(variant) = op.predicted_variant(&facts)? {
            op.kernel(&variant)?;
        }
        Ok(Box::new(op))
    })?;
    let masks = fuse_masks(model)?;
    if fused + masks > 0 {
        model.compact()?;
    }
    Ok(fused)
}

/// Moves each f32 mask with one ragged axis into the fused chain it reads, where the chain
/// has no other reader. Returns how many it moved.
fn fuse_masks(model: &mut TypedModel) -> TractResult<usize> {
    let outputs = model.output_outlets()?.to_vec();
    let mut moved = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(CudaMask(mask)) = node.op_as::<CudaMask>() else {
            continue;
        };
        let producer = node.inputs[0];
        let chain_node = model.node(producer.node);
        let Some(chain) = chain_node.op_as::<CudaFusedElementwise>() else {
            continue;
        };
        let [ragged] = &*mask.axes.ragged else {
            continue;
        };
        if chain.mask.is_some()
            || mask.fill.datum_type() != f32::datum_type()
            || chain_node.outputs[0].successors.len() != 1
            || outputs.contains(&producer)
        {
            continue;
        }
        let fill = mask.fill.cast_to_scalar::<f32>()?;
        let mut op = chain.clone();
        op.mask = Some(FusedMask {
            batch: mask.axes.batch,
            axis: ragged.axis,
            row: ragged.row,
            fill_bits: fill.to_bits(),
        });
        let mut patch = TypedModelPatch::default();
        let inputs = chain_node
            .inputs
            .iter()
            .chain(std::iter::once(&node.inputs[1]))
            .map(|i| patch.tap_model(model, *i))
            .collect::<TractResult<TVec<_>>>()?;
        let fused = patch.wire_node(format!("{}.masked", chain_node.name), op, &inputs)?[0];
        patch.shunt_outside(model, OutletId::new(id, 0), fused)?;
        patch.apply(model)?;
        moved += 1;
    }
    Ok(moved)
}

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

/// What a fused kernel is told of the shapes: the output's extents, the elements under
/// each axis, and each operand's strides in elements (0 along a broadcast axis). Laid out
/// as the generated kernels' `Geometry`. 32-bit: the op refuses larger tensors.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Geometry {
    dims: [u32; MAX_RANK],
    inner: [u32; MAX_RANK],
    strides: [[u32; MAX_RANK]; MAX_OPERANDS],
}

// SAFETY: plain old data, `repr(C)`, laid out as the kernels' struct.
unsafe impl DeviceRepr for Geometry {}

/// How an operand is read, which decides how much index arithmetic its load costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Class {
    /// Laid out as the output: its offset is the output's index.
    Dense,
    /// One value for all: read once per thread.
    Scalar,
    /// Varies along one axis only (a per-channel scale): one division and one modulo.
    Axis(usize),
    /// Anything else (a transposed view): the coordinates on every axis.
    Strided,
}

impl Class {
    fn of(dims: &[usize], strides: &[isize]) -> Class {
        let moving: Vec<usize> = (0..dims.len()).filter(|d| strides[*d] != 0).collect();
        if moving.is_empty() {
            Class::Scalar
        } else if strides == &*Tensor::natural_strides(dims) {
            Class::Dense
        } else if moving.len() == 1 {
            Class::Axis(moving[0])
        } else {
            Class::Strided
        }
    }
}

/// A kernel of a fused chain is generated for the rank of its merged geometry and the
/// class of each operand: both are fixed for a plan, and knowing them when compiling
/// turns the index arithmetic into what each operand needs and nothing more.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Variant {
    rank: usize,
    classes: TVec<Class>,
    /// Whether the kernel writes a mask ([`FusedMask`]).
    masked: bool,
}

impl Variant {
    fn of(dims: &[usize], strides: &[TVec<isize>], masked: bool) -> Variant {
        Variant {
            rank: dims.len(),
            classes: strides.iter().map(|s| Class::of(dims, s)).collect(),
            masked,
        }
    }
}

/// A chain of element-wise binary ops, as one kernel on the device.
#[derive(Clone, Debug)]
pub struct CudaFusedElementwise {
    pub program: Program,
    /// Per operand, the axis ops tract-cuda had fused into its read: applied as views.
    pub views: TVec<TVec<GpuAxisOp>>,
    /// The output shape (the chain's), symbolic as in the model.
    pub shape: ShapeFact,
    /// A mask the kernel writes, the widths table as last input.
    pub mask: Option<FusedMask>,
    /// The kernels compiled for this chain, by variant: looked up here at each run, not
    /// by hashing a source.
    kernels: Arc<Mutex<HashMap<Variant, CudaFunction>>>,
}

impl PartialEq for CudaFusedElementwise {
    fn eq(&self, other: &Self) -> bool {
        (&self.program, &self.views, &self.shape, &self.mask)
            == (&other.program, &other.views, &other.shape, &other.mask)
    }
}

impl Eq for CudaFusedElementwise {}

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
        Ok(CudaFusedElementwise {
            program,
            views,
            shape,
            mask: None,
            kernels: Default::default(),
        })
    }

    /// The kernel for `variant`, compiled (or read from the disk cache) on first use.
    fn kernel(&self, variant: &Variant) -> TractResult<CudaFunction> {
        let mut kernels = self
            .kernels
            .lock()
            .map_err(|_| anyhow!("fused kernels poisoned"))?;
        if let Some(f) = kernels.get(variant) {
            return Ok(f.clone());
        }
        let source: Arc<str> = source(&self.program, variant).into();
        let f = tract_cuda::with_cuda_stream(|stream| {
            generated_function(stream.context(), &source, "fused_elementwise")
        })?;
        kernels.insert(variant.clone(), f.clone());
        Ok(f)
    }

    /// The variant a run will need, from the operands' facts (inputs laid out as their
    /// shapes say, as tract-cuda's outputs are), where the shapes are known.
    fn predicted_variant(&self, facts: &[&TypedFact]) -> TractResult<Option<Variant>> {
        let symbols = SymbolValues::default();
        let (Some(out), Some(shapes)) = (
            self.shape.as_concrete(),
            facts
                .iter()
                .map(|f| f.shape.as_concrete())
                .collect::<Option<Vec<_>>>(),
        ) else {
            return Ok(None);
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
        Ok(Some(Variant::of(&dims, &strides, self.mask.is_some())))
    }
}

/// The kernel source of a program for a variant: one thread per output element
/// (grid-stride), each operand read once, the links in order, one write.
///
/// The index arithmetic is what the operands' classes need: none for a dense operand (its
/// offset is the output's index), none per element for a scalar (read once), one division
/// and one modulo for an operand along one axis, the coordinates on every axis only when
/// some operand is strided. 32-bit throughout (unsigned division is several times cheaper
/// than 64-bit): tensors of 2^31 elements and more are refused, as tract-cuda's own
/// element-wise kernels do not address them either. The first version computed every
/// operand's offset from all coordinates, in 64 bits: on PP-OCRv4 rec its kernels ran at a
/// tenth of the memory bandwidth.
fn source(program: &Program, variant: &Variant) -> String {
    let k = program.operands;
    let rank = variant.rank;
    let params: String = (0..k)
        .map(|i| format!(", const float* __restrict__ p{i}"))
        .collect();
    let scalars: String = (0..k)
        .filter(|i| variant.classes[*i] == Class::Scalar)
        .map(|i| format!("    const float s{i} = p{i}[0];\n"))
        .collect();
    let any_strided = variant.classes.contains(&Class::Strided);
    let mut coords = String::new();
    if any_strided {
        coords += "        I rem = i;\n";
        for d in (0..rank).rev() {
            coords += &format!("        const I c{d} = rem % g.dims[{d}]; rem /= g.dims[{d}];\n");
        }
    } else {
        let mut axes: Vec<usize> = variant
            .classes
            .iter()
            .filter_map(|c| match c {
                Class::Axis(d) => Some(*d),
                _ => None,
            })
            .collect();
        axes.sort();
        axes.dedup();
        for d in axes {
            let c = match (d == 0, d + 1 == rank) {
                (true, true) => "i".to_string(),
                (true, false) => format!("i / g.inner[{d}]"),
                (false, true) => format!("i % g.dims[{d}]"),
                (false, false) => format!("(i / g.inner[{d}]) % g.dims[{d}]"),
            };
            coords += &format!("        const I c{d} = {c};\n");
        }
    }
    let loads: String = (0..k)
        .map(|i| {
            let value = match variant.classes[i] {
                Class::Dense => format!("p{i}[i]"),
                Class::Scalar => format!("s{i}"),
                Class::Axis(d) => format!("p{i}[c{d} * g.strides[{i}][{d}]]"),
                Class::Strided => {
                    let offset = (0..rank)
                        .map(|d| format!("c{d} * g.strides[{i}][{d}]"))
                        .collect::<Vec<_>>()
                        .join(" + ");
                    format!("p{i}[{offset}]")
                }
            };
            format!("        const float x{i} = {value};\n")
        })
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
    let (mask_params, write) = if variant.masked {
        (
            ", const long long* __restrict__ table, unsigned table_n, unsigned mb_stride, unsigned mb_dim, unsigned mr_stride, unsigned mr_dim, int m_row, float m_fill",
            format!(
                "        const I mn = (i / mb_stride) % mb_dim;\n        const bool pad = (long long)((i / mr_stride) % mr_dim) >= table[m_row * table_n + mn];\n        out[i] = pad ? m_fill : v{last};\n"
            ),
        )
    } else {
        ("", format!("        out[i] = v{last};\n"))
    };
    let classes = format!("{:?}", variant.classes);
    let mut src = format!(
        "// {program}\n// rank {rank}, operands {classes}, masked {}\nstruct Geometry {{ unsigned dims[{MAX_RANK}]; unsigned inner[{MAX_RANK}]; unsigned strides[{MAX_OPERANDS}][{MAX_RANK}]; }};\n",
        variant.masked
    );
    src += &format!(
        r#"
extern "C" __global__ void fused_elementwise(float* __restrict__ out{params}, const Geometry g, unsigned int n{mask_params}) {{
    typedef unsigned int I;
{scalars}    for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {{
{coords}{loads}{links}{write}    }}
}}
"#
    );
    src
}

/// An operand's shape and strides seen through the axis ops tract-cuda had fused into
/// its read: reshapes and moved axes as new shapes and strides over the same memory, as
/// tract-cuda applies them (a reshape that changes the shape lays it out anew).
fn view(
    mut shape: TVec<usize>,
    mut strides: TVec<isize>,
    ops: &[GpuAxisOp],
    symbols: &SymbolValues,
) -> TractResult<(TVec<usize>, TVec<isize>)> {
    for axis_op in ops {
        let before = shape.clone();
        match &axis_op.inner {
            AxisOp::Reshape(skip, from, to) => {
                let from = from.iter().map(|d| d.eval(symbols)).collect();
                let to = to.iter().map(|d| d.eval(symbols)).collect();
                AxisOp::Reshape(*skip, from, to).change_shape_array(&mut shape, false)?;
            }
            other => other.change_shape_array(&mut shape, false)?,
        }
        if let AxisOp::Move(from, to) = axis_op.inner {
            let moved = strides.remove(from);
            strides.insert(to, moved);
        } else if shape != before {
            strides = Tensor::natural_strides(&shape);
        }
    }
    Ok((shape, strides))
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
    operands: &[(TVec<usize>, TVec<isize>)],
) -> TractResult<(TVec<usize>, Vec<TVec<isize>>)> {
    let views: Vec<(&[usize], &[isize])> = operands.iter().map(|(s, t)| (&**s, &**t)).collect();
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

/// The kernel arguments of a [`FusedMask`] for an output of `shape`.
struct MaskArgs<'a> {
    table: cudarc::driver::CudaView<'a, u8>,
    table_n: u32,
    batch_stride: u32,
    batch_dim: u32,
    ragged_stride: u32,
    ragged_dim: u32,
    row: i32,
    fill: f32,
}

impl<'a> MaskArgs<'a> {
    fn new(mask: &FusedMask, shape: &[usize], table: &'a DeviceTensor) -> TractResult<Self> {
        ensure!(
            table.datum_type() == i64::datum_type()
                && table.rank() == 2
                && mask.row < table.shape()[0],
            "CudaFusedElementwise: a widths table of [K, N] i64 with row {}, got {:?} {:?}",
            mask.row,
            table.datum_type(),
            table.shape()
        );
        ensure!(
            mask.batch < shape.len() && mask.axis < shape.len(),
            "CudaFusedElementwise: mask axes {} and {} for rank {}",
            mask.batch,
            mask.axis,
            shape.len()
        );
        ensure!(
            shape[mask.batch] == table.shape()[1],
            "CudaFusedElementwise: {} samples, {} widths",
            shape[mask.batch],
            table.shape()[1]
        );
        let stride = |axis: usize| shape[axis + 1..].iter().product::<usize>() as u32;
        Ok(MaskArgs {
            table: get_cuda_view(table),
            table_n: table.shape()[1] as u32,
            batch_stride: stride(mask.batch),
            batch_dim: shape[mask.batch] as u32,
            ragged_stride: stride(mask.axis),
            ragged_dim: shape[mask.axis] as u32,
            row: mask.row as i32,
            fill: f32::from_bits(mask.fill_bits),
        })
    }
}

impl Op for CudaFusedElementwise {
    fn name(&self) -> StaticName {
        "CudaFusedElementwise".into()
    }

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

    op_as_typed_op!();
}

impl EvalOp for CudaFusedElementwise {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let k = self.program.operands;
        ensure!(
            inputs.len() == k + self.mask.is_some() as usize,
            "CudaFusedElementwise: {} inputs for {k} operands{}",
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
        ensure!(
            total <= i32::MAX as usize,
            "CudaFusedElementwise: {total} elements, the kernel addresses at most 2^31 - 1"
        );
        let views = operands
            .iter()
            .zip(&self.views)
            .map(|(t, ops)| view(t.shape().into(), t.strides().into(), ops, ctx.symbols))
            .collect::<TractResult<Vec<_>>>()?;
        let (dims, strides) = geometry(&shape, &views)?;
        let mut geo = Geometry {
            dims: [1; MAX_RANK],
            inner: [1; MAX_RANK],
            strides: [[0; MAX_RANK]; MAX_OPERANDS],
        };
        let mut inner = 1usize;
        for d in (0..dims.len()).rev() {
            geo.dims[d] = dims[d] as u32;
            geo.inner[d] = inner as u32;
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
                "CudaFusedElementwise: operand {i} (strides {s:?}) is out of the kernel's 32-bit reach"
            );
            for (d, stride) in s.iter().enumerate() {
                geo.strides[i][d] = *stride as u32;
            }
        }
        let masking = match (&self.mask, table) {
            (Some(mask), Some(table)) => Some(MaskArgs::new(mask, &shape, table)?),
            _ => None,
        };
        let func = self.kernel(&Variant::of(&dims, &strides, masking.is_some()))?;
        let ptrs: Vec<_> = operands.iter().map(|t| get_cuda_view(t)).collect();
        let out_view = get_cuda_view(&output);
        let n = total as u32;
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
            for v in &ptrs {
                b.arg(v);
            }
            b.arg(&geo);
            b.arg(&n);
            if let Some(m) = &masking {
                b.arg(&m.table);
                b.arg(&m.table_n).arg(&m.batch_stride).arg(&m.batch_dim);
                b.arg(&m.ragged_stride).arg(&m.ragged_dim).arg(&m.row);
                b.arg(&m.fill);
            }
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
        // A full operand and a per-channel one (along axis 1 of 3).
        let variant = Variant {
            rank: 3,
            classes: tvec![Class::Dense, Class::Axis(1)],
            masked: false,
        };
        let src = source(&program, &variant);
        assert!(src.contains("const float x0 = p0[i];"), "{src}");
        assert!(
            src.contains("const I c1 = (i / g.inner[1]) % g.dims[1];"),
            "{src}"
        );
        assert!(
            src.contains("const float x1 = p1[c1 * g.strides[1][1]];"),
            "{src}"
        );
        assert!(src.contains("const float v0 = x0 + x1;"));
        assert!(src.contains("const float v1 = fmaxf(v0, x0);"));
        assert!(src.contains("out[i] = v1;"));
        assert!(src.contains("void fused_elementwise("));
        assert!(
            !src.contains("rem"),
            "no full coordinates without a strided operand"
        );
        // A transposed operand needs every coordinate; a scalar is read once.
        let variant = Variant {
            rank: 2,
            classes: tvec![Class::Strided, Class::Scalar],
            masked: true,
        };
        let src = source(&program, &variant);
        assert!(src.contains("const I c0 = rem % g.dims[0];"), "{src}");
        assert!(
            src.contains("p0[c0 * g.strides[0][0] + c1 * g.strides[0][1]]"),
            "{src}"
        );
        assert!(src.contains("const float s1 = p1[0];"), "{src}");
        assert!(src.contains("const float x1 = s1;"), "{src}");
        // The mask writes the fill past the sample's width, the chain's value before.
        assert!(src.contains("out[i] = pad ? m_fill : v1;"), "{src}");
        assert!(src.contains("table[m_row * table_n + mn]"), "{src}");
    }

    #[test]
    fn operands_are_classed_by_their_strides() {
        let dims = [2, 3, 20];
        assert_eq!(Class::of(&dims, &[60, 20, 1]), Class::Dense);
        assert_eq!(Class::of(&dims, &[0, 0, 0]), Class::Scalar);
        assert_eq!(Class::of(&dims, &[0, 1, 0]), Class::Axis(1));
        assert_eq!(Class::of(&dims, &[3, 1, 0]), Class::Strided);
        assert_eq!(Class::of(&dims, &[1, 2, 6]), Class::Strided);
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
