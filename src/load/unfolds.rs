//! Windows gathered along an axis (an unfold), as a convolution with one-hot kernels.
//!
//! ConvBERT's span convolution unfolds its values over a window of `k` positions: torch's
//! exporter writes it as a `Pad` of `p` zeros on each side of the sequence, then a `Gather`
//! along the sequence at `Range(L) + [0, 1, .., k-1]`, the `[k, L]` window positions. In a
//! ragged batch the gathered windows of a sample read past its end into the padding,
//! where alone they read the `Pad`'s zeros; and the ragged transform cannot follow a
//! gather at computed positions.
//!
//! That gather is a convolution: window position `i` of every channel is the channel
//! convolved with the kernel that is one at tap `i` and zero elsewhere, with `p - off[0]`
//! zeros of padding in front. Rewritten so (a convolution grouped by channel, `k` output
//! channels per input one, split back to `[C, k]`), the transform pads it like any other
//! convolution: each sample reads zeros past its own end, as alone. A one-hot kernel adds
//! to each tap exact zeros: the values are the gathered ones, bit for bit (but for the
//! sign of a zero).
//!
//! The indices are values of the model's shape (they read no input): they are computed
//! at several lengths ([`crate::evaluate`]) and must be, at each, `j + off[i]` with the
//! same consecutive offsets. Any other gather is left as it is.

use tract_core::internal::*;
use tract_core::ops::array::{Gather, Pad, PadMode};
use tract_core::ops::cnn::{Conv, KernelFormat, PaddingSpec, PoolSpec};
use tract_core::ops::nn::DataFormat;

use crate::evaluate::{evaluate, reads_no_input};

/// Rewrites every unfold (a gather of windows from a zero-padded axis) as a convolution;
/// how many were.
pub fn unfolds_as_convolutions(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        if let Some(unfold) = unfold(model, id)? {
            convolution(model, id, &unfold)?.apply(model)?;
            done += 1;
        }
    }
    Ok(done)
}

/// What a gather reads: windows of `k` taps at consecutive offsets from `first` in an
/// axis padded by `before`, the window axis first (`[k, L]`) or last (`[L, k]`) in the
/// indices.
struct Unfold {
    padded: OutletId,
    axis: usize,
    k: usize,
    first: i64,
    before: usize,
    window_first: bool,
}

fn unfold(model: &TypedModel, id: usize) -> TractResult<Option<Unfold>> {
    let node = model.node(id);
    let Some(gather) = node.op_as::<Gather>() else {
        return Ok(None);
    };
    let axis = gather.axis;
    let pad_node = model.node(node.inputs[0].node);
    let Some(pad) = pad_node.op_as::<Pad>() else {
        return Ok(None);
    };
    let PadMode::Constant(value) = &pad.mode else {
        return Ok(None);
    };
    let zero = value.cast_to_scalar::<f32>().is_ok_and(|v| v == 0.0);
    let only_along = pad
        .pads
        .iter()
        .enumerate()
        .all(|(a, p)| a == axis || *p == (0, 0));
    let data = model.outlet_fact(pad_node.inputs[0])?;
    // A convolution's spatial axis, of a float tensor with its channels at 1.
    if !zero
        || !only_along
        || data.datum_type != f32::datum_type()
        || axis < 2
        || data.rank() < 3
        || !reads_no_input(model, node.inputs[1])
    {
        return Ok(None);
    }
    let (before, after) = pad.pads[axis];
    let extent = data.shape[axis].clone();
    let indices = model.outlet_fact(node.inputs[1])?;
    if indices.rank() != 2 || data.shape[1].as_i64().is_none() {
        return Ok(None);
    }
    let window_first = if indices.shape[1] == extent {
        true
    } else if indices.shape[0] == extent {
        false
    } else {
        return Ok(None);
    };
    let Some(k) = indices.shape[if window_first { 0 } else { 1 }].as_i64() else {
        return Ok(None);
    };
    let k = k as usize;
    let symbols = extent.symbols();
    if symbols.is_empty() || k == 0 {
        return Ok(None);
    }
    let mut first = None;
    for length in [5i64, 9, 16] {
        let mut values = SymbolValues::default();
        for s in &symbols {
            values.set(s, length);
        }
        let Ok(at) = evaluate(model, node.inputs[1], &values) else {
            return Ok(None);
        };
        let Ok(at) = at.cast_to::<i64>() else {
            return Ok(None);
        };
        let at = at.to_plain_array_view::<i64>()?;
        let Ok(l) = extent.eval(&values).to_usize() else {
            return Ok(None);
        };
        let offset = at[[0, 0]];
        for i in 0..k {
            for j in 0..l {
                let v = if window_first { at[[i, j]] } else { at[[j, i]] };
                if v != j as i64 + offset + i as i64 {
                    return Ok(None);
                }
            }
        }
        if first.is_some_and(|f| f != offset) {
            return Ok(None);
        }
        first = Some(offset);
    }
    let Some(first) = first else {
        return Ok(None);
    };
    // Taps before and after the window's own position, all within the pad's zeros.
    let front = before as i64 - first;
    let back = k as i64 - 1 - front;
    if front < 0 || back < 0 || back > after as i64 {
        return Ok(None);
    }
    Ok(Some(Unfold {
        padded: node.inputs[0],
        axis,
        k,
        first,
        before,
        window_first,
    }))
}

/// The gather `id` as a convolution of the unpadded tensor, grouped by channel with `k`
/// one-hot kernels each, its output channels split back to `[C, k]` and the window axis
/// moved where the gather puts it.
fn convolution(model: &TypedModel, id: usize, unfold: &Unfold) -> TractResult<TypedModelPatch> {
    let node = model.node(id);
    let pad = model.node(unfold.padded.node);
    let data = model.outlet_fact(pad.inputs[0])?.clone();
    let channels = data.shape[1].to_usize()?;
    let spatial = data.rank() - 2;
    let k = unfold.k;
    let front = (unfold.before as i64 - unfold.first) as usize;
    let mut kernel_shape: TVec<usize> = tvec![1; spatial];
    kernel_shape[unfold.axis - 2] = k;
    let mut before: TVec<usize> = tvec![0; spatial];
    let mut after: TVec<usize> = tvec![0; spatial];
    before[unfold.axis - 2] = front;
    after[unfold.axis - 2] = k - 1 - front;
    // OIHW: output channel `c*k + i` reads input channel `c` at tap `i` only.
    let mut shape = vec![channels * k, 1];
    shape.extend(kernel_shape.iter().copied());
    let taps: usize = kernel_shape.iter().product();
    let stride_along: usize = kernel_shape[unfold.axis - 2 + 1..].iter().product();
    let mut values = vec![0f32; channels * k * taps];
    for c in 0..channels {
        for i in 0..k {
            values[(c * k + i) * taps + i * stride_along] = 1.0;
        }
    }
    let kernel = Tensor::from_shape(&shape, &values)?;
    let conv = Conv {
        pool_spec: PoolSpec {
            data_format: DataFormat::NCHW,
            kernel_shape,
            padding: PaddingSpec::Explicit(before, after),
            dilations: None,
            strides: None,
            input_channels: channels,
            output_channels: channels * k,
        },
        kernel_fmt: KernelFormat::OIHW,
        group: channels,
        q_params: None,
    };
    let mut patch = TypedModelPatch::default();
    let input = patch.tap_model(model, pad.inputs[0])?;
    let kernel = patch.add_const(format!("{}.one_hot_kernel", node.name), kernel)?;
    let bias = patch.add_const(
        format!("{}.no_bias", node.name),
        Tensor::zero::<f32>(&[channels * k])?,
    )?;
    let mut wire = patch.wire_node(
        format!("{}.as_convolution", node.name),
        conv,
        &[input, kernel, bias],
    )?[0];
    wire = patch.wire_node(
        format!("{}.windows", node.name),
        AxisOp::Reshape(
            1,
            tvec!((channels * k).to_dim()),
            tvec!(channels.to_dim(), k.to_dim()),
        ),
        &[wire],
    )?[0];
    // `[N, C, k, ..]`: the gather puts the window axis where the gathered one was, before
    // the positions (`[k, L]` indices) or after them (`[L, k]`).
    let to = if unfold.window_first {
        unfold.axis
    } else {
        unfold.axis + 1
    };
    if to != 2 {
        wire = patch.wire_node(
            format!("{}.window_axis", node.name),
            AxisOp::Move(2, to),
            &[wire],
        )?[0];
    }
    patch.shunt_outside(model, OutletId::new(id, 0), wire)?;
    Ok(patch)
}
