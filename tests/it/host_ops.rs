//! The host backend's own ops give tract's values, against tract's plan of the same
//! model: depthwise convolutions of every kernel size, stride, dilation and padding
//! tract's `DepthWise` runs, with and without a bias, equal as floats (a tap over the
//! padding adds `k * 0` where tract skips it, which can only turn a -0 into +0); dense
//! convolutions of small kernels within a rounding.

use crate::common::onnx::{Graph, Rng, int, ints};
use crate::common::typed;
use proptest::prelude::*;
use tract_ragged::backend::{HostConv, HostDepthwise, convs_on_host, depthwise_on_host};
use tract_ragged::prelude::*;

fn run(model: TypedModel, input: &Tensor) -> TractResult<Tensor> {
    let plan = tract_core::runtime::DefaultRuntime.prepare(model)?;
    Ok(plan
        .run(tvec!(input.clone().into_tvalue()))?
        .remove(0)
        .into_tensor())
}

/// A convolution of `ci` to `co` channels in `group` groups, random kernel and bias.
#[allow(clippy::too_many_arguments)]
fn conv(
    rng: &mut Rng,
    [ci, co, group]: [usize; 3],
    k: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pads: [usize; 4],
    bias: bool,
) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let per_group = ci / group;
    let w = g.weight(
        &[co, per_group, k[0], k[1]],
        rng.vec(co * per_group * k[0] * k[1], 1.0),
    );
    let mut inputs = vec!["x".to_string(), w];
    if bias {
        inputs.push(g.weight(&[co], rng.vec(co, 1.0)));
    }
    let inputs: Vec<&str> = inputs.iter().map(|s| s.as_str()).collect();
    let y = g.op(
        "Conv",
        &inputs,
        vec![
            int("group", group as i64),
            ints("kernel_shape", &[k[0] as i64, k[1] as i64]),
            ints("strides", &[stride[0] as i64, stride[1] as i64]),
            ints("dilations", &[dilation[0] as i64, dilation[1] as i64]),
            ints("pads", &pads.map(|p| p as i64)),
        ],
    );
    g.model("x", 4, &[&y])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn host_depthwise_gives_tracts_values(
        seed in 1u64.., n in 1usize..=3, c in 2usize..=19, h in 1usize..=9,
        w in prop_oneof![1usize..=12, 30usize..=140],
        kh in 1usize..=5, kw in 1usize..=5, sh in 1usize..=2, sw in 1usize..=3,
        dh in 1usize..=2, dw in 1usize..=2, pads in proptest::array::uniform4(0usize..=2),
        bias: bool,
    ) {
        // The input must hold at least one output point.
        prop_assume!(h + pads[0] + pads[2] > dh * (kh - 1));
        prop_assume!(w + pads[1] + pads[3] > dw * (kw - 1));
        let mut rng = Rng(seed);
        let proto = conv(&mut rng, [c, c, c], [kh, kw], [sh, sw], [dh, dw], pads, bias);
        let plain = typed(&proto, &format!("{n},{c},{h},{w},f32")).unwrap();
        let mut ours = plain.clone();
        prop_assert_eq!(depthwise_on_host(&mut ours).unwrap(), 1);
        prop_assert!(ours.nodes().iter().any(|n| n.op_is::<HostDepthwise>()));
        let input = Tensor::from_shape(&[n, c, h, w], &rng.vec(n * c * h * w, 1.0)).unwrap();
        let expected = run(plain, &input).unwrap();
        let found = run(ours, &input).unwrap();
        prop_assert_eq!(found.shape(), expected.shape());
        let (f, e) = (found.to_plain_array_view::<f32>().unwrap(), expected.to_plain_array_view::<f32>().unwrap());
        let differ = f.iter().zip(e).filter(|(f, e)| f != e && !(f.is_nan() && e.is_nan())).count();
        prop_assert_eq!(differ, 0);
    }
}

/// A convolution that is not depthwise (one group), or whose kernel is an input, stays.
#[test]
fn other_convolutions_stay() -> TractResult<()> {
    let mut rng = Rng(3);
    let mut g = Graph::default();
    let w = g.weight(&[4, 2, 3, 3], rng.vec(72, 1.0));
    let y = g.op("Conv", &["x", &w], vec![ints("pads", &[1, 1, 1, 1])]);
    let proto = g.model("x", 4, &[&y]);
    let mut model = typed(&proto, "1,2,5,7,f32")?;
    assert_eq!(depthwise_on_host(&mut model)?, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    #[test]
    fn host_conv_gives_tracts_values(
        seed in 1u64.., n in 1usize..=2, ci in 1usize..=9, co in prop_oneof![Just(4usize), Just(8), Just(12), Just(32)],
        h in 1usize..=7, w in prop_oneof![1usize..=20, 30usize..=90],
        kh in 1usize..=5, kw in 1usize..=5, pads in proptest::array::uniform4(0usize..=2),
        bias: bool,
    ) {
        prop_assume!(kh * kw > 1);
        prop_assume!(h + pads[0] + pads[2] >= kh && w + pads[1] + pads[3] >= kw);
        let mut rng = Rng(seed);
        let proto = conv(&mut rng, [ci, co, 1], [kh, kw], [1, 1], [1, 1], pads, bias);
        let plain = typed(&proto, &format!("{n},{ci},{h},{w},f32")).unwrap();
        let mut ours = plain.clone();
        let taken = convs_on_host(&mut ours).unwrap();
        if !(is_x86_feature_detected!("avx") && is_x86_feature_detected!("fma")) {
            prop_assert_eq!(taken, 0);
            return Ok(());
        }
        prop_assert_eq!(taken, 1);
        prop_assert!(ours.nodes().iter().any(|n| n.op_is::<HostConv>()));
        let input = Tensor::from_shape(&[n, ci, h, w], &rng.vec(n * ci * h * w, 1.0)).unwrap();
        let expected = run(plain, &input).unwrap();
        let ours_again = ours.clone();
        let found = run(ours, &input).unwrap();
        prop_assert_eq!(found.shape(), expected.shape());
        let (f, e) = (found.to_plain_array_view::<f32>().unwrap(), expected.to_plain_array_view::<f32>().unwrap());
        // tract's kernels sum the taps in this op's order on most shapes (bit-equal), not
        // on all: tiny outputs take another of its paths (one rounding apart).
        let off = f.iter().zip(e).filter(|(f, e)| (*f - *e).abs() > 1e-6 * (1.0 + e.abs())).count();
        prop_assert_eq!(off, 0);
        // Split across threads (rows of the output), the same bits as on one.
        let pool = tract_linalg::multithread::Executor::multithread(3);
        let threaded = tract_linalg::multithread::multithread_tract_scope(pool, || run(ours_again, &input)).unwrap();
        prop_assert_eq!(threaded, found);
    }
}

/// Dense convolutions of more output channels than `HostConv` takes, or not a multiple
/// of its block, or strided, stay tract's.
#[test]
fn convolutions_host_conv_does_not_take_stay() -> TractResult<()> {
    let mut rng = Rng(4);
    for (co, stride) in [(36, 1), (6, 1), (8, 2)] {
        let mut g = Graph::default();
        let w = g.weight(&[co, 2, 3, 3], rng.vec(co * 18, 1.0));
        let y = g.op(
            "Conv",
            &["x", &w],
            vec![
                ints("pads", &[1, 1, 1, 1]),
                ints("strides", &[stride, stride]),
            ],
        );
        let proto = g.model("x", 4, &[&y]);
        let mut model = typed(&proto, "1,2,5,7,f32")?;
        assert_eq!(
            convs_on_host(&mut model)?,
            0,
            "{co} channels, stride {stride}"
        );
    }
    Ok(())
}

/// The only output of `model` on `input`, run on one thread, then on an executor of three.
fn on_one_and_three_threads(model: TypedModel, input: &Tensor) -> TractResult<(Tensor, Tensor)> {
    let plan = tract_core::plan::SimplePlan::new(model)?;
    let one = plan.run(tvec!(input.clone().into_tvalue()))?.remove(0);
    let pool = tract_linalg::multithread::Executor::multithread(3);
    let three = tract_linalg::multithread::multithread_tract_scope(pool, || {
        plan.run(tvec!(input.clone().into_tvalue()))
    })?
    .remove(0);
    Ok((one.into_tensor(), three.into_tensor()))
}

/// tract's ops that tract-ragged's patches split over the executor's threads (a
/// deconvolution whose taps do not overlap, a nearest upsampling, a concatenation of a
/// megabyte or more, PP-OCRv4 det's head) give the bits they give on one thread.
#[test]
fn tracts_copies_split_over_threads_give_the_bits_of_one() -> TractResult<()> {
    let mut rng = Rng(5);
    let mut g = Graph::default();
    let (wv, bv) = (rng.vec(256, 1.0), rng.vec(8, 1.0));
    let w = g.weight(&[8, 8, 2, 2], wv.clone());
    let b = g.weight(&[8], bv.clone());
    let up = g.op(
        "ConvTranspose",
        &["x", &w, &b],
        vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
    );
    let scales = g.weight(&[4], vec![1.0, 1.0, 2.0, 2.0]);
    let resized = g.op("Resize", &["x", "", &scales], vec![]);
    let y = g.op("Concat", &[&up, &resized], vec![int("axis", 1)]);
    let proto = g.model("x", 4, &[&y]);
    let model = typed(&proto, "1,8,64,96,f32")?.into_optimized()?;
    for op in ["DeconvSum", "NearestUpsample", "Concat"] {
        let found = model.nodes().iter().any(|n| n.op().name() == op);
        assert!(found, "no {op} in the optimized model");
    }
    let input = Tensor::from_shape(&[1, 8, 64, 96], &rng.vec(8 * 64 * 96, 1.0))?;
    let (one, three) = on_one_and_three_threads(model, &input)?;
    assert_eq!(one.shape(), &[1, 16, 128, 192]);
    assert_eq!(one, three);
    // The values, computed apart: the deconvolved half is each input point times a tap
    // (`[ci, co, ky, kx]`) plus the bias, the upsampled half the input repeated.
    let (x, out) = (
        input.to_plain_array_view::<f32>()?,
        one.to_plain_array_view::<f32>()?,
    );
    let mut off = 0;
    for c in 0..16 {
        for oy in 0..128 {
            for ox in 0..192 {
                let (iy, ix) = (oy / 2, ox / 2);
                let expected = if c < 8 {
                    bv[c]
                        + (0..8)
                            .map(|ci| {
                                x[[0, ci, iy, ix]] * wv[((ci * 8 + c) * 2 + oy % 2) * 2 + ox % 2]
                            })
                            .sum::<f32>()
                } else {
                    x[[0, c - 8, iy, ix]]
                };
                off += usize::from((out[[0, c, oy, ox]] - expected).abs() > 1e-5);
            }
        }
    }
    assert_eq!(off, 0, "values off the deconvolution and the upsampling");
    Ok(())
}

/// tract's sum of f32 over the trailing axes (a global pool's [N, C, H, W] over H and W;
/// tract-ragged's patch splits its rows over the executor): the bits ndarray's row sums give,
/// the path it took serially, on one thread and on three.
#[test]
fn tracts_spatial_sums_split_over_threads_give_the_bits_of_one() -> TractResult<()> {
    use tract_core::ndarray::{Axis, Ix2};
    use tract_core::ops::nn::{Reduce, Reducer};
    let mut rng = Rng(9);
    let (n, c, h, w) = (2, 24, 37, 53);
    let input = Tensor::from_shape(&[n, c, h, w], &rng.vec(n * c * h * w, 1.0))?;
    let mut model = TypedModel::default();
    let x = model.add_source("x", f32::fact([n, c, h, w]))?;
    let y = model.wire_node("sum", Reduce::new(tvec![2, 3], Reducer::Sum), &[x])?;
    model.select_output_outlets(&y)?;
    let (one, three) = on_one_and_three_threads(model, &input)?;
    assert_eq!(one.shape(), &[n, c, 1, 1]);
    assert_eq!(one, three);
    let rows = input
        .to_plain_array_view::<f32>()?
        .into_shape_with_order((n * c, h * w))?;
    let expected = rows.into_dimensionality::<Ix2>()?.sum_axis(Axis(1));
    let got = one.to_plain_array_view::<f32>()?;
    let got: Vec<f32> = got.iter().copied().collect();
    assert_eq!(got, expected.to_vec(), "row sums off ndarray's");
    Ok(())
}
