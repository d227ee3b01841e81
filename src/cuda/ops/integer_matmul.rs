//! Integer products on the device (`kernels/integer_matmul.cu`): tract's `PrefixMatMul`
//! over `i32`, which tract-cuda leaves on the host (its products are cuBLAS's, on floats)
//! and tract's own host op does not compute either. Dynamically quantized models reach it
//! through [`crate::cuda::quantized`]: their `MatMulInteger`s as products over
//! `i32`. The sums are integers: the same bits as tract's host kernels.
//!
//! One thread per output element, each summing along `k`: simple rather than fast (the
//! int8 models this serves are exact here; their speed on the device is not yet a goal).

use tract_core::internal::*;
use tract_core::ops::einsum::prefix_matmul::PrefixMatMul;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, grid_over, launch};
use crate::cuda::nvrtc::KernelFile;

use super::DeviceOp;

/// The largest output rank the kernel takes.
const RANK: usize = 6;

crate::kernel_args! {
    /// The output's element count and shape (padded with leading ones to `RANK` (6) axes),
    /// a's and b's strides along each output axis (0 where they broadcast or lack it),
    /// the extent of the summed axis and a's and b's strides along it.
    pub struct IntegerMatMulGeom {
        total: i64,
        dims: [i64; 6],
        a_strides: [i64; 6],
        b_strides: [i64; 6],
        k: i64,
        a_k: i64,
        b_k: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "integer_matmul",
    source: include_str!("../../../kernels/integer_matmul.cu"),
    args: IntegerMatMulGeom::declaration,
};

/// [`PrefixMatMul`] over `i32` on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaIntegerMatMul {
    /// Whether a is `[.., k, m]`, b `[.., n, k]`, the output `[.., n, m]`.
    pub transpose_a: bool,
    pub transpose_b: bool,
    pub transpose_c: bool,
}

/// tract's products of `i32` by `i32` into `i32`, unquantized.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<PrefixMatMul>() else {
        return Ok(None);
    };
    let output = node.outputs[0].fact.datum_type;
    if dt != DatumType::I32 || output != DatumType::I32 || op.quantize_output.is_some() {
        return Ok(None);
    }
    Ok(Some(Box::new(CudaIntegerMatMul {
        transpose_a: op.transpose_a,
        transpose_b: op.transpose_b,
        transpose_c: op.transpose_c,
    })))
}

impl CudaIntegerMatMul {
    /// The host op it stands for.
    fn host(&self) -> PrefixMatMul {
        PrefixMatMul {
            transpose_a: self.transpose_a,
            transpose_b: self.transpose_b,
            transpose_c: self.transpose_c,
            quantize_output: None,
            operating_dt: Some(DatumType::I32),
        }
    }

    /// The kernel's geometry for operands of shapes `a` and `b` (each `[prefix.., rows,
    /// columns]`, of one rank) and the output's shape.
    fn geometry(&self, a: &[usize], b: &[usize]) -> TractResult<(IntegerMatMulGeom, TVec<usize>)> {
        let op = self;
        let rank = a.len();
        ensure!(
            rank >= 2 && rank == b.len() && rank <= RANK,
            "operands {a:?} and {b:?} (one rank, from 2 to {RANK})"
        );
        let (a_strides, b_strides) = (Tensor::natural_strides(a), Tensor::natural_strides(b));
        // a is [.., m, k] (or [.., k, m]), b is [.., k, n] (or [.., n, k]).
        let (a_m, a_k) = if op.transpose_a {
            (rank - 1, rank - 2)
        } else {
            (rank - 2, rank - 1)
        };
        let (b_k, b_n) = if op.transpose_b {
            (rank - 1, rank - 2)
        } else {
            (rank - 2, rank - 1)
        };
        ensure!(
            a[a_k] == b[b_k],
            "operands {a:?} and {b:?} sum over different extents"
        );
        let mut dims = tvec!();
        let mut along_a = tvec!();
        let mut along_b = tvec!();
        for axis in 0..rank - 2 {
            let (da, db) = (a[axis], b[axis]);
            ensure!(
                da == db || da == 1 || db == 1,
                "operands {a:?} and {b:?} do not broadcast"
            );
            dims.push(da.max(db));
            along_a.push(if da == 1 { 0 } else { a_strides[axis] as i64 });
            along_b.push(if db == 1 { 0 } else { b_strides[axis] as i64 });
        }
        let (m, n) = (a[a_m], b[b_n]);
        let rows = (m, a_strides[a_m] as i64, 0);
        let columns = (n, 0, b_strides[b_n] as i64);
        let last = if op.transpose_c {
            [columns, rows]
        } else {
            [rows, columns]
        };
        for (extent, sa, sb) in last {
            dims.push(extent);
            along_a.push(sa);
            along_b.push(sb);
        }
        let pad = RANK - rank;
        let mut geom = IntegerMatMulGeom {
            total: dims.iter().product::<usize>() as i64,
            dims: [1; RANK],
            k: a[a_k] as i64,
            a_k: a_strides[a_k] as i64,
            b_k: b_strides[b_k] as i64,
            ..Default::default()
        };
        for d in 0..rank {
            geom.dims[pad + d] = dims[d] as i64;
            geom.a_strides[pad + d] = along_a[d];
            geom.b_strides[pad + d] = along_b[d];
        }
        Ok((geom, dims))
    }
}

device_op!(CudaIntegerMatMul);

impl DeviceOp for CudaIntegerMatMul {
    const NAME: &'static str = "CudaIntegerMatMul";

    fn info(&self) -> TractResult<Vec<String>> {
        let op = self;
        Ok(vec![format!(
            "transposed: a {}, b {}, c {}",
            op.transpose_a, op.transpose_b, op.transpose_c
        )])
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let (a, b) = args_2!(inputs);
        let (a, b) = (a.to_device_tensor()?, b.to_device_tensor()?);
        contiguous(a, op)?;
        contiguous(b, op)?;
        for x in [a, b] {
            ensure!(
                x.datum_type() == DatumType::I32,
                "{op}: operands of {:?} (i32 only)",
                x.datum_type()
            );
        }
        let (geom, shape) = self.geometry(a.shape(), b.shape()).context(op)?;
        let output = make_tensor_for_node(ctx, DatumType::I32, &shape)?;
        if geom.total > 0 {
            // SAFETY: integer_matmul_i32(a, b, c, IntegerMatMulGeom): c holds `total` i32
            // (the output's shape); every output coordinate is below `dims`, where a's
            // stride is 0 unless a's extent is that dim (and likewise for b), and k stays
            // below a's and b's common extent along it: every read is within a or b.
            unsafe {
                launch(
                    &KERNELS,
                    "integer_matmul_i32",
                    grid_over(geom.total as usize),
                    &[a, b, &output],
                    &geom,
                )
            }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaIntegerMatMul {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| self.host().output_facts(facts))
    }

    as_op!();
}
