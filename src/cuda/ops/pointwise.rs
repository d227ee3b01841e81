//! A 1x1 convolution on the device as one cuBLAS strided-batched SGEMM, on NCHW as it
//! lies, for the einsums [`crate::cuda::conv_routing`] marked [`Pointwise`].
//!
//! Each sample's output is one matrix product: its `[I, H*W]` input, row-major, times the
//! weights `[O, I]` gives its `[O, H*W]` output, and cuBLAS's strided-batched SGEMM does
//! every sample in one call, with none of the transposes tract-cuda puts around its GEMMs.
//! A sample's result does not depend on the batch: each sample is its own GEMM.
//!
//! f32 stays f32: cuBLAS's default math mode keeps single precision off TF32. With
//! `TRACT_RAGGED_TF32` on, the call runs in cuBLAS's TF32 math mode, and the handle is
//! put back in its default mode right after (tract-cuda's GEMMs share it).
//!
//! f16 (a model in half precision, [`crate::precision`]) runs `cublasGemmStridedBatchedEx`
//! on f16 tensor cores with f32 accumulation: each output rounded to f16 once, so that a
//! sample's sum over its channels loses no more than f16's last place, whatever the batch.

use cudarc::cublas::result::{gemm_strided_batched_ex, sgemm_strided_batched};
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t, cublasOperation_t, cublasSetMathMode,
    cudaDataType,
};
use cudarc::driver::DevicePtr;
use tract_core::internal::*;
use tract_cuda::kernels::get_cuda_view;
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use crate::cuda::conv_routing::Pointwise;
use crate::cuda::knobs::TRACT_RAGGED_TF32;
use crate::cuda::launch::{contiguous_floats, with_stream};

use super::DeviceOp;

/// `Y[n] = W X[n]` for every sample in one strided-batched SGEMM (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaPointwise {
    /// Whether the GEMM may run on TF32 tensor cores.
    pub tf32: bool,
}

/// The einsums marked [`Pointwise`] (on f32 or f16).
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let marked = node.op_is::<Pointwise>() && super::is_float_kernel_type(dt);
    Ok(marked.then(|| {
        Box::new(CudaPointwise {
            tf32: TRACT_RAGGED_TF32.get(),
        }) as Box<dyn TypedOp>
    }))
}

device_op!(CudaPointwise);

impl DeviceOp for CudaPointwise {
    const NAME: &'static str = "CudaPointwise";

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("tf32: {}", self.tf32)])
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        ensure!(inputs.len() == 2, "{op}: input and weights");
        let inputs = contiguous_floats(&inputs, op)?;
        let (x, w) = (inputs[0], inputs[1]);
        ensure!(
            x.rank() == 4 && w.rank() == 2 && x.shape()[1] == w.shape()[1],
            "{op}: input {:?} and weights {:?} do not make NIHW,OI->NOHW",
            x.shape(),
            w.shape()
        );
        let (n, i, h, ww) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
        let o = w.shape()[0];
        let hw = h * ww;
        let dt = x.datum_type();
        let output = make_tensor_for_node(ctx, dt, &[n, o, h, ww])?;
        if output.len() == 0 {
            return Ok(tvec!(output.into_tensor().into_tvalue()));
        }
        let int = |v: usize, what: &str| -> TractResult<i32> {
            i32::try_from(v).with_context(|| format!("{op}: {what} {v} exceeds cuBLAS's int"))
        };
        let (m, nn, k, batch) = (int(hw, "H*W")?, int(o, "O")?, int(i, "I")?, int(n, "N")?);
        let (xv, wv, yv) = (get_cuda_view(x), get_cuda_view(w), get_cuda_view(&output));
        with_stream(|stream| {
            let (xp, _x) = xv.device_ptr(stream.stream);
            let (wp, _w) = wv.device_ptr(stream.stream);
            let (yp, _y) = yv.device_ptr(stream.stream);
            let handle = *stream.cublas.handle();
            let (alpha, beta) = (1f32, 0f32);
            stream.profiled(|| {
                // Column-major as cuBLAS sees it: a row-major [I, HW] sample is an [HW, I]
                // matrix, the row-major [O, I] weights an [I, O] one, and [HW, I] x [I, O]
                // is the row-major [O, HW] output.
                if dt == DatumType::F16 {
                    // SAFETY: x holds N samples of I x HW f16, w O x I f16, y N samples of
                    // O x HW f16, all contiguous on this stream's device (checked above);
                    // alpha and beta f32, as the f32 compute type takes them.
                    return unsafe {
                        gemm_strided_batched_ex(
                            handle,
                            cublasOperation_t::CUBLAS_OP_N,
                            cublasOperation_t::CUBLAS_OP_N,
                            m,
                            nn,
                            k,
                            &alpha as *const f32 as *const _,
                            xp as *const _,
                            cudaDataType::CUDA_R_16F,
                            m,
                            (i * hw) as i64,
                            wp as *const _,
                            cudaDataType::CUDA_R_16F,
                            k,
                            0,
                            &beta as *const f32 as *const _,
                            yp as *mut _,
                            cudaDataType::CUDA_R_16F,
                            m,
                            (o * hw) as i64,
                            batch,
                            cublasComputeType_t::CUBLAS_COMPUTE_32F,
                            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                        )
                    }
                    .map_err(|e| anyhow!("{op}: cuBLAS f16 GEMM failed: {e:?}"));
                }
                if self.tf32 {
                    // SAFETY: a mode of this thread's handle, put back below.
                    unsafe { cublasSetMathMode(handle, cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH) }
                        .result()
                        .map_err(|e| anyhow!("{op}: cublasSetMathMode: {e:?}"))?;
                }
                // SAFETY: x holds N samples of I x HW f32, w O x I f32, y N samples of
                // O x HW f32, all contiguous on this stream's device (checked above).
                let gemm = unsafe {
                    sgemm_strided_batched(
                        handle,
                        cublasOperation_t::CUBLAS_OP_N,
                        cublasOperation_t::CUBLAS_OP_N,
                        m,
                        nn,
                        k,
                        &alpha,
                        xp as *const f32,
                        m,
                        (i * hw) as i64,
                        wp as *const f32,
                        k,
                        0,
                        &beta,
                        yp as *mut f32,
                        m,
                        (o * hw) as i64,
                        batch,
                    )
                };
                if self.tf32 {
                    // SAFETY: the handle's default mode back, for tract-cuda's GEMMs.
                    unsafe { cublasSetMathMode(handle, cublasMath_t::CUBLAS_DEFAULT_MATH) }
                        .result()
                        .map_err(|e| anyhow!("{op}: cublasSetMathMode: {e:?}"))?;
                }
                gemm.map_err(|e| anyhow!("{op}: cuBLAS SGEMM failed: {e:?}"))
            })
        })?;
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaPointwise {
    /// One FMA per output element and input channel.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let (x, w) = (inputs[0], inputs[1]);
        let fma = x.shape[0].clone()
            * w.shape[0].clone()
            * x.shape[1].clone()
            * x.shape[2].clone()
            * x.shape[3].clone();
        Ok(tvec!((Cost::FMA(x.datum_type), fma)))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let op = Self::NAME;
        facts_to_device_facts(inputs, |facts| {
            let (x, w) = (facts[0], facts[1]);
            ensure!(x.rank() == 4 && w.rank() == 2, "{op}: NIHW,OI->NOHW");
            let shape = tvec![
                x.shape[0].clone(),
                w.shape[0].clone(),
                x.shape[2].clone(),
                x.shape[3].clone()
            ];
            Ok(tvec!(x.datum_type.fact(shape)))
        })
    }

    as_op!();
}
