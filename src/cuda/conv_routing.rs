//! The convolutions ragged-cuda runs itself, marked before tract-cuda's transform.
//!
//! - **1x1 convolutions, as one cuBLAS GEMM per batch, on NCHW as it lies**
//!   ([`Pointwise`], run by [`CudaPointwise`](super::ops::CudaPointwise)). tract
//!   declutters them into an `EinSum` `NIHW,OI->NOHW`, which tract-cuda runs as its own
//!   GEMM between two transposes (the channels moved last and back): on PP-OCRv4 rec, 14
//!   such GEMMs and 28 transposes.
//! - **Depthwise convolutions, on our kernel** ([`Depthwise`], run by
//!   [`CudaDepthwise`](super::ops::CudaDepthwise)): tract-cuda's cuDNN path uses one
//!   fixed algorithm, slow on one filter per channel (0.66 ms for a 5x5 on a
//!   [32, 240, 12, 352] activation that a direct kernel reads and writes at the memory
//!   bandwidth).
//! - **Every other convolution tract-cuda would run through cuDNN** ([`Dense`], run by
//!   [`CudaCudnnConv`](super::ops::CudaCudnnConv)): the same algorithm, with the math type chosen
//!   per descriptor, so that f32 stays f32 without touching the process's environment.
//!   The bias is added by an element-wise `Add` after it, as tract-cuda does (it joins
//!   the fused chains).
//!
//! [`mark_convs`] swaps them for markers: the same op inside (their host evaluation is
//! tract's), ops tract-cuda does not know, so it leaves them on the host between
//! `DeviceSync`s; the island pass ([`super::islands`]) then puts our CUDA ops there, their
//! weights uploaded once with the plan. `TRACT_RAGGED_CUBLAS` off leaves 1x1 convolutions
//! to tract-cuda's GEMMs and runs depthwise ones as [`Dense`].
//!
//! Exactness holds as for any op of the plan: a sample's result does not depend on the
//! batch (each sample is its own GEMM of the batch, each depthwise output its own sum in a
//! fixed order, cuDNN's algorithm fixed), and f32 stays off TF32 unless
//! `TRACT_RAGGED_TF32` asks for it.

use tract_core::internal::*;
use tract_core::model::Rewriter;
use tract_core::ops::cnn::conv::rewrite_kernel_conv_in_oihw;
use tract_core::ops::cnn::{Conv, KernelFormat, rewrite_conv_with_n_axis};
use tract_core::ops::einsum::EinSum;

/// The types our convolutions run on: f32, and f16 (a model in half precision).
fn is_ours(dt: DatumType) -> bool {
    dt == DatumType::F32 || dt == DatumType::F16
}

/// Whether `op` is a 1x1 convolution's einsum: `NIHW,OI->NOHW` (any letters) on f32 or
/// f16, unquantised.
fn is_pointwise(op: &EinSum) -> bool {
    let axes = &op.axes;
    if op.q_params.is_some()
        || !is_ours(op.operating_dt)
        || axes.input_count() != 2
        || axes.output_count() != 1
        || axes.rank(InOut::In(0)) != 4
        || axes.rank(InOut::In(1)) != 2
        || axes.rank(InOut::Out(0)) != 4
    {
        return false;
    }
    // Each axis' positions in the input, the weights and the output: N, I (summed), H, W,
    // then O.
    let expected: [(&[usize], &[usize], &[usize]); 5] = [
        (&[0], &[], &[0]),
        (&[1], &[1], &[]),
        (&[2], &[], &[2]),
        (&[3], &[], &[3]),
        (&[], &[0], &[1]),
    ];
    let found: Vec<(&[usize], &[usize], &[usize])> = axes
        .iter_all_axes()
        .map(|a| (&*a.inputs[0], &*a.inputs[1], &*a.outputs[0]))
        .collect();
    found.len() == expected.len() && expected.iter().all(|e| found.contains(e))
}

/// Whether `op` is a depthwise 2-D convolution we run: f32 or f16, channels first, one
/// filter per channel (OIHW), unquantised.
/// The most taps a depthwise filter run on our kernel may have (`DEPTHWISE_MAX_TAPS` in
/// `kernels/depthwise.cu`, which stages a filter in shared memory); larger go to cuDNN.
pub const DEPTHWISE_MAX_TAPS: usize = 64;

fn is_depthwise(op: &Conv, input: &TypedFact) -> bool {
    let spec = &op.pool_spec;
    op.q_params.is_none()
        && op.kernel_fmt == KernelFormat::OIHW
        && spec.data_format.has_n()
        && !spec.data_format.c_is_last()
        && spec.rank() == 2
        && spec.kernel_shape.iter().product::<usize>() <= DEPTHWISE_MAX_TAPS
        && is_ours(input.datum_type)
        && input.rank() == 4
        && input.shape[1]
            .to_usize()
            .is_ok_and(|c| c == op.group && c == spec.output_channels)
}

/// Whether tract-cuda would run `op` on `input` through cuDNN (f32), or could (f16: it runs
/// those on a direct kernel of its own): at most 6 spatial axes, as much padding before as
/// after on each (cuDNN's padding is symmetric).
fn is_dense(op: &Conv, input: &TypedFact) -> bool {
    let spec = &op.pool_spec;
    let Ok(shape) = spec.data_format.shape(input.shape.to_tvec()) else {
        return false;
    };
    op.q_params.is_none()
        && op.kernel_fmt == KernelFormat::OIHW
        && spec.data_format.has_n()
        && is_ours(input.datum_type)
        && shape.hw_rank() <= 6
        && spec
            .computed_padding(shape.hw_dims())
            .iter()
            .all(|p| p.pad_before == p.pad_after)
}

/// What [`mark_convs`] marked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marked {
    pub pointwise: usize,
    pub depthwise: usize,
    pub dense: usize,
}

/// Marks the convolutions of `model` ragged-cuda runs itself (module doc): 1x1 and
/// depthwise ones when `own_kernels`, every other convolution tract-cuda would send to
/// cuDNN always. Our 1x1 and depthwise kernels take constant weights and biases of the
/// input's type (f32 or f16).
pub fn mark_convs(model: &mut TypedModel, own_kernels: bool) -> TractResult<Marked> {
    // As tract-cuda's transform does first: kernels in OIHW, a batch axis on every conv.
    Rewriter::default()
        .with_rule_for("rewrite_kernel_conv_in_oihw", rewrite_kernel_conv_in_oihw)
        .with_rule_for("rewrite_conv_with_n_axis", rewrite_conv_with_n_axis)
        .rewrite(&(), model)?;
    let mut marked = Marked::default();
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(dt) = node
            .inputs
            .first()
            .and_then(|i| model.outlet_fact(*i).ok())
            .map(|f| f.datum_type)
            .filter(|dt| is_ours(*dt))
        else {
            continue;
        };
        let consts = node.inputs.iter().skip(1).all(|i| {
            model
                .outlet_fact(*i)
                .is_ok_and(|f| f.konst.as_ref().is_some_and(|k| k.datum_type() == dt))
        });
        let all_of_dt = node
            .inputs
            .iter()
            .all(|i| model.outlet_fact(*i).is_ok_and(|f| f.datum_type == dt));
        if !all_of_dt {
            continue;
        }
        let input = model.outlet_fact(node.inputs[0])?;
        let mut patch = TypedModelPatch::default();
        let inputs = patch.taps(model, &node.inputs)?;
        let wire = match (node.op_as::<EinSum>(), node.op_as::<Conv>()) {
            (Some(op), _)
                if own_kernels && consts && is_pointwise(op) && node.inputs.len() == 2 =>
            {
                marked.pointwise += 1;
                patch.wire_node(&node.name, Pointwise(op.clone()), &inputs)?[0]
            }
            (_, Some(op))
                if own_kernels
                    && consts
                    && is_depthwise(op, input)
                    && node.inputs.len() == 3
                    && model.outlet_fact(node.inputs[2])?.shape.volume() == op.group.to_dim() =>
            {
                marked.depthwise += 1;
                patch.wire_node(&node.name, Depthwise(op.clone()), &inputs)?[0]
            }
            (_, Some(op)) if node.inputs.len() == 3 && is_dense(op, input) => {
                marked.dense += 1;
                wire_dense(&mut patch, model, node, op, &inputs)?
            }
            _ => continue,
        };
        patch.shunt_outside(model, OutletId::new(id, 0), wire)?;
        patch.apply(model)?;
    }
    if marked != Marked::default() {
        model.compact()?;
    }
    Ok(marked)
}

/// A convolution as tract-cuda wires it for cuDNN: the convolution without bias, then,
/// unless the bias is all zeros, an `Add` of the bias shaped to broadcast over the
/// channels.
fn wire_dense(
    patch: &mut TypedModelPatch,
    model: &TypedModel,
    node: &TypedNode,
    op: &Conv,
    inputs: &[OutletId],
) -> TractResult<OutletId> {
    let bias = model.outlet_fact(node.inputs[2])?;
    let zero_bias = match &bias.konst {
        Some(k) => k.is_all_zero()?,
        None => false,
    };
    if zero_bias {
        return Ok(patch.wire_node(&node.name, Dense(op.clone()), &inputs[..2])?[0]);
    }
    let conv = patch.wire_node(
        format!("{}.conv", node.name),
        Dense(op.clone()),
        &inputs[..2],
    )?[0];
    let fact = &node.outputs[0].fact;
    let c_axis = op
        .pool_spec
        .data_format
        .shape(fact.shape.to_tvec())?
        .c_axis();
    let mut shape = tvec![1.to_dim(); fact.rank()];
    shape[c_axis] = op.pool_spec.output_channels.to_dim();
    let reshaped = patch.wire_node(
        format!("{}.bias_reshaped", node.name),
        AxisOp::Reshape(0, bias.shape.to_tvec(), shape),
        &[inputs[2]],
    )?[0];
    Ok(patch.wire_node(&node.name, tract_core::ops::math::add(), &[conv, reshaped])?[0])
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

/// A convolution marked for cuDNN through ours: evaluated on the host as tract's conv,
/// without bias. Inputs: data, kernel (OIHW).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Dense(pub Conv);

impl Dense {
    fn zero_bias(&self, dt: DatumType) -> TractResult<Tensor> {
        Tensor::zero_dt(dt, &[self.0.pool_spec.output_channels])
    }
}

impl Op for Dense {
    fn name(&self) -> StaticName {
        "RaggedDenseConv".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    op_as_typed_op!();
}

impl EvalOp for Dense {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, mut inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let dt = inputs
            .first()
            .context("RaggedDenseConv: no input")?
            .datum_type();
        inputs.push(self.zero_bias(dt)?.into_tvalue());
        self.0.eval(ctx, inputs)
    }
}

impl TypedOp for Dense {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let bias = inputs[0]
            .datum_type
            .fact([self.0.pool_spec.output_channels]);
        self.0.output_facts(&[inputs[0], inputs[1], &bias])
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
        assert_eq!(
            mark_convs(&mut model, true)?,
            Marked {
                pointwise: 1,
                ..Marked::default()
            }
        );
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
            assert_eq!(mark_convs(&mut model, true)?.depthwise, marked);
            let found = model.into_runnable()?.run(tvec!(input.into()))?;
            assert_eq!(found[0], expected[0]);
        }
        Ok(())
    }

    /// Every other convolution tract-cuda would run through cuDNN is marked [`Dense`],
    /// its bias added after it unless all zeros, and evaluates as before on the host;
    /// without our own kernels, depthwise ones are [`Dense`] too.
    #[test]
    fn dense_convs_are_marked_with_their_bias_after() -> TractResult<()> {
        use tract_core::ops::cnn::{PaddingSpec, PoolSpec};
        use tract_core::ops::nn::DataFormat;
        let conv = |group: usize| Conv {
            pool_spec: PoolSpec::new(
                DataFormat::NCHW,
                tvec![3, 3],
                PaddingSpec::Explicit(tvec![1, 1], tvec![1, 1]),
                None,
                Some(tvec![1, 2]),
                4,
                4,
            ),
            kernel_fmt: KernelFormat::OIHW,
            group,
            q_params: None,
        };
        for (group, bias, own, dense, adds) in [
            (1, 0.5f32, true, 1, 1),
            (1, 0.0, true, 1, 0),
            (4, 0.5, true, 0, 0),
            (4, 0.5, false, 1, 1),
        ] {
            let mut model = TypedModel::default();
            let x = model.add_source("x", f32::fact([2, 4, 6, 7]))?;
            let kernel: Vec<f32> = (0..4 * 4 / group * 9).map(|v| (v as f32).cos()).collect();
            let k = model.add_const("k", Tensor::from_shape(&[4, 4 / group, 3, 3], &kernel)?)?;
            let b = model.add_const("b", Tensor::from_shape(&[4], &[bias; 4])?)?;
            let y = model.wire_node("conv", conv(group), &[x, k, b])?;
            model.select_output_outlets(&y)?;
            let input: Vec<f32> = (0..336).map(|v| (v as f32 * 0.1).sin()).collect();
            let input = Tensor::from_shape(&[2, 4, 6, 7], &input)?;
            let expected = model
                .clone()
                .into_runnable()?
                .run(tvec!(input.clone().into()))?;
            assert_eq!(mark_convs(&mut model, own)?.dense, dense, "group {group}");
            let added = model
                .nodes()
                .iter()
                .filter(|n| n.op_as::<tract_core::ops::binary::TypedBinOp>().is_some())
                .count();
            assert_eq!(added, adds, "group {group}, bias {bias}");
            let found = model.into_runnable()?.run(tvec!(input.into()))?;
            found[0].close_enough(&expected[0], Approximation::Close)?;
        }
        Ok(())
    }
}
