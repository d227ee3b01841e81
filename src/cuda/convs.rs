//! The convolutions tract-cuda runs slowly, taken over before its transform.
//!
//! - **1x1 convolutions, as one cuBLAS GEMM per batch, on NCHW as it lies.** tract
//!   declutters them into an `EinSum` `NIHW,OI->NOHW`, and tract-cuda runs that as its own
//!   GEMM between two transposes (the channels moved last and back): on PP-OCRv4 rec, 14
//!   such GEMMs and 28 transposes. Yet each sample's output is one matrix product as the
//!   tensors lie: its `[I, H*W]` input, row-major, times the weights `[O, I]` gives its
//!   `[O, H*W]` output; cuBLAS's strided-batched SGEMM does all the samples in one call.
//! - **Depthwise convolutions, as our kernel** (`kernels/depthwise.cu`). tract-cuda runs
//!   every convolution through cuDNN with one fixed algorithm (implicit precomputed GEMM),
//!   which is slow on one filter per channel: 0.66 ms for a 5x5 on a [32, 240, 12, 352]
//!   activation that a direct kernel reads and writes at the memory bandwidth.
//!
//! [`mark_convs`] swaps them for markers, [`Pointwise`] and [`Depthwise`]: the same op
//! inside (their host evaluation is tract's), ops tract-cuda does not know, so it leaves
//! them on the host between `DeviceSync`s; the island pass ([`super::islands`]) then puts
//! [`CudaPointwise`] and [`super::ops::CudaDepthwise`] there, their weights uploaded once
//! with the plan.
//!
//! Exactness holds as for any op of the plan: a sample's result does not depend on the
//! batch (each sample is its own GEMM of the batch, each depthwise output its own sum in a
//! fixed order), and f32 stays f32 (cuBLAS is kept off TF32 with the rest of ragged-cuda,
//! `NVIDIA_TF32_OVERRIDE`). `TRACT_RAGGED_CUBLAS=0` leaves both to tract-cuda, for
//! measuring what this brings.

use cudarc::cublas::{result::sgemm_strided_batched, sys::cublasOperation_t};
use cudarc::driver::DevicePtr;
use tract_core::internal::*;
use tract_core::ops::cnn::{Conv, KernelFormat};
use tract_core::ops::einsum::EinSum;
use tract_cuda::kernels::get_cuda_view;

use super::ops::contiguous_f32;
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

/// Whether `op` is a 1x1 convolution's einsum: `NIHW,OI->NOHW` (any letters) on f32,
/// unquantised.
fn is_pointwise(op: &EinSum) -> bool {
    if op.q_params.is_some() || op.operating_dt != f32::datum_type() {
        return false;
    }
    let text = op.axes.to_string();
    let Some((inputs, output)) = text.split_once("->") else {
        return false;
    };
    let inputs: Vec<Vec<char>> = inputs.split(',').map(|s| s.chars().collect()).collect();
    let output: Vec<char> = output.chars().collect();
    match (&*inputs, &*output) {
        ([x, w], [n, o, h, ww]) if x.len() == 4 && w.len() == 2 => {
            let distinct = [x[0], x[1], x[2], x[3], w[0]];
            x[0] == *n
                && w[0] == *o
                && w[1] == x[1]
                && x[2] == *h
                && x[3] == *ww
                && (0..5).all(|i| (i + 1..5).all(|j| distinct[i] != distinct[j]))
        }
        _ => false,
    }
}

/// Whether `op` is a depthwise 2-D convolution we run: f32, channels first, one filter
/// per channel (OIHW), unquantised.
fn is_depthwise(op: &Conv, input: &TypedFact) -> bool {
    let spec = &op.pool_spec;
    op.q_params.is_none()
        && op.kernel_fmt == KernelFormat::OIHW
        && spec.data_format.has_n()
        && !spec.data_format.c_is_last()
        && spec.rank() == 2
        && input.datum_type == f32::datum_type()
        && input.rank() == 4
        && input.shape[1]
            .to_usize()
            .is_ok_and(|c| c == op.group && c == spec.output_channels)
}

/// Replaces the 1x1 convolutions' einsums of `model` by [`Pointwise`] and its depthwise
/// convolutions by [`Depthwise`], where their weights (and biases) are f32 constants.
/// Returns how many of each.
pub fn mark_convs(model: &mut TypedModel) -> TractResult<(usize, usize)> {
    let (mut pointwise, mut depthwise) = (0, 0);
    for id in model.eval_order()? {
        let node = model.node(id);
        let f32_consts = node.inputs.iter().skip(1).all(|i| {
            model.outlet_fact(*i).is_ok_and(|f| {
                f.konst
                    .as_ref()
                    .is_some_and(|k| k.datum_type() == f32::datum_type())
            })
        });
        let input =
            model.outlet_fact(node.inputs.first().copied().unwrap_or(OutletId::new(id, 0)))?;
        let marker: Box<dyn TypedOp> = match (node.op_as::<EinSum>(), node.op_as::<Conv>()) {
            (Some(op), _)
                if is_pointwise(op)
                    && node.inputs.len() == 2
                    && f32_consts
                    && input.datum_type == f32::datum_type() =>
            {
                pointwise += 1;
                Box::new(Pointwise(op.clone()))
            }
            (_, Some(op))
                if is_depthwise(op, input)
                    && node.inputs.len() == 3
                    && f32_consts
                    && model.outlet_fact(node.inputs[2])?.shape.volume() == op.group.to_dim() =>
            {
                depthwise += 1;
                Box::new(Depthwise(op.clone()))
            }
            _ => continue,
        };
        let mut patch = TypedModelPatch::default();
        let inputs = node
            .inputs
            .iter()
            .map(|i| patch.tap_model(model, *i))
            .collect::<TractResult<TVec<_>>>()?;
        let wire = patch.wire_node(&node.name, marker, &inputs)?[0];
        patch.shunt_outside(model, OutletId::new(id, 0), wire)?;
        patch.apply(model)?;
    }
    if pointwise + depthwise > 0 {
        model.compact()?;
    }
    Ok((pointwise, depthwise))
}

/// A depthwise convolution marked for our kernel: evaluated on the host as tract's conv.
/// Inputs: data, kernel (OIHW), bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Depthwise(pub Conv);

impl Op for Depthwise {
    fn name(&self) -> StaticName {
        "RaggedDepthwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    op_as_typed_op!();
}

impl EvalOp for Depthwise {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        self.0.eval(ctx, inputs)
    }
}

impl TypedOp for Depthwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        self.0.output_facts(inputs)
    }

    as_op!();
}

/// A 1x1 convolution's einsum `NIHW,OI->NOHW`, marked for cuBLAS: evaluated on the host
/// as tract's einsum.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pointwise(pub EinSum);

impl Op for Pointwise {
    fn name(&self) -> StaticName {
        "RaggedPointwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    op_as_typed_op!();
}

impl EvalOp for Pointwise {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        self.0.eval(ctx, inputs)
    }
}

impl TypedOp for Pointwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        self.0.output_facts(inputs)
    }

    as_op!();
}

/// [`Pointwise`] on the device: `Y[n] = W X[n]` for every sample in one strided-batched
/// SGEMM.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaPointwise;

impl Op for CudaPointwise {
    fn name(&self) -> StaticName {
        "CudaPointwise".into()
    }

    op_as_typed_op!();
}

impl EvalOp for CudaPointwise {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        ensure!(inputs.len() == 2, "CudaPointwise: input and weights");
        let inputs = contiguous_f32(&inputs, "CudaPointwise")?;
        let (x, w) = (inputs[0], inputs[1]);
        ensure!(
            x.rank() == 4 && w.rank() == 2 && x.shape()[1] == w.shape()[1],
            "CudaPointwise: input {:?} and weights {:?} do not make NIHW,OI->NOHW",
            x.shape(),
            w.shape()
        );
        let (n, i, h, ww) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
        let o = w.shape()[0];
        let hw = h * ww;
        let output = make_tensor_for_node(ctx, f32::datum_type(), &[n, o, h, ww])?;
        if output.len() == 0 {
            return Ok(tvec!(output.into_tensor().into_tvalue()));
        }
        let int = |v: usize, what: &str| -> TractResult<i32> {
            i32::try_from(v)
                .with_context(|| format!("CudaPointwise: {what} {v} exceeds cuBLAS's int"))
        };
        let (m, nn, k, batch) = (int(hw, "H*W")?, int(o, "O")?, int(i, "I")?, int(n, "N")?);
        let (xv, wv, yv) = (get_cuda_view(x), get_cuda_view(w), get_cuda_view(&output));
        tract_cuda::with_cuda_stream(|stream| {
            let (xp, _x) = xv.device_ptr(stream);
            let (wp, _w) = wv.device_ptr(stream);
            let (yp, _y) = yv.device_ptr(stream);
            let (alpha, beta) = (1f32, 0f32);
            let events = stream.record_profile_events()?;
            // Column-major as cuBLAS sees it: a row-major [I, HW] sample is an [HW, I]
            // matrix, the row-major [O, I] weights an [I, O] one, and [HW, I] x [I, O] is
            // the row-major [O, HW] output.
            unsafe {
                sgemm_strided_batched(
                    *stream.cublas().handle(),
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
            }
            .map_err(|e| anyhow!("CudaPointwise: cuBLAS SGEMM failed: {e:?}"))?;
            if let Some((start, end)) = events {
                stream.finish_profile_entry(start, end)?;
            }
            Ok(())
        })?;
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaPointwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| {
            let (x, w) = (facts[0], facts[1]);
            ensure!(
                x.rank() == 4 && w.rank() == 2,
                "CudaPointwise: NIHW,OI->NOHW"
            );
            let shape = tvec![
                x.shape[0].clone(),
                w.shape[0].clone(),
                x.shape[2].clone(),
                x.shape[3].clone()
            ];
            Ok(tvec!(f32::fact(shape)))
        })
    }

    as_op!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn einsum(expr: &str) -> EinSum {
        EinSum::new(expr.parse().unwrap(), f32::datum_type())
    }

    #[test]
    fn finds_the_one_by_one_convolutions() {
        assert!(is_pointwise(&einsum("NIHW,OI->NOHW")));
        assert!(is_pointwise(&einsum("abcd,eb->aecd")));
        // Channels last, weights transposed, a batched matmul: not this.
        assert!(!is_pointwise(&einsum("NHWI,OI->NHWO")));
        assert!(!is_pointwise(&einsum("NIHW,IO->NOHW")));
        assert!(!is_pointwise(&einsum("NIHW,NOI->NOHW")));
    }

    /// The swap changes no value on the host: `Pointwise` evaluates as tract's einsum.
    #[test]
    fn swapped_einsums_evaluate_as_before() -> TractResult<()> {
        let mut model = TypedModel::default();
        let x = model.add_source("x", f32::fact([2, 3, 4, 5]))?;
        let weights: Vec<f32> = (0..18).map(|v| v as f32 * 0.25 - 2.0).collect();
        let w = model.add_const("w", Tensor::from_shape(&[6, 3], &weights)?)?;
        let y = model.wire_node("conv", einsum("NIHW,OI->NOHW"), &[x, w])?;
        model.select_output_outlets(&y)?;
        let input: Vec<f32> = (0..120).map(|v| (v as f32).sin()).collect();
        let input = Tensor::from_shape(&[2, 3, 4, 5], &input)?;
        let expected = model
            .clone()
            .into_runnable()?
            .run(tvec!(input.clone().into()))?;
        assert_eq!(mark_convs(&mut model)?, (1, 0));
        assert!(model.nodes().iter().any(|n| n.op_is::<Pointwise>()));
        let found = model.into_runnable()?.run(tvec!(input.into()))?;
        assert_eq!(found[0], expected[0]);
        Ok(())
    }

    /// Depthwise convolutions are marked, and evaluate as tract's conv on the host; a
    /// grouped convolution that is not depthwise is left alone.
    #[test]
    fn depthwise_convs_are_marked() -> TractResult<()> {
        use tract_core::ops::cnn::{PaddingSpec, PoolSpec};
        use tract_core::ops::nn::DataFormat;
        let conv = |group: usize, out: usize| Conv {
            pool_spec: PoolSpec::new(
                DataFormat::NCHW,
                tvec![3, 3],
                PaddingSpec::Explicit(tvec![1, 0], tvec![1, 2]),
                Some(tvec![1, 2]),
                Some(tvec![2, 1]),
                4,
                out,
            ),
            kernel_fmt: KernelFormat::OIHW,
            group,
            q_params: None,
        };
        for (group, out, marked) in [(4, 4, 1), (2, 4, 0)] {
            let mut model = TypedModel::default();
            let x = model.add_source("x", f32::fact([2, 4, 6, 7]))?;
            let kernel: Vec<f32> = (0..out * 4 / group * 9).map(|v| (v as f32).cos()).collect();
            let k = model.add_const("k", Tensor::from_shape(&[out, 4 / group, 3, 3], &kernel)?)?;
            let b = model.add_const("b", Tensor::from_shape(&[out], &vec![0.5f32; out])?)?;
            let y = model.wire_node("conv", conv(group, out), &[x, k, b])?;
            model.select_output_outlets(&y)?;
            let input: Vec<f32> = (0..336).map(|v| (v as f32 * 0.1).sin()).collect();
            let input = Tensor::from_shape(&[2, 4, 6, 7], &input)?;
            let expected = model
                .clone()
                .into_runnable()?
                .run(tvec!(input.clone().into()))?;
            assert_eq!(mark_convs(&mut model)?, (0, marked));
            let found = model.into_runnable()?.run(tvec!(input.into()))?;
            assert_eq!(found[0], expected[0]);
        }
        Ok(())
    }
}
