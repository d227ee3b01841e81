//! The ragged batch against each sample alone, on random models of every op family the
//! transform handles: conv stacks, pools, global pools, reductions and softmax over the
//! ragged axis, attention over it, layer norm over channels, squeeze-excitation blocks.
//!
//! Models are ONNX graphs built in code and loaded through tract-onnx, as a user's are;
//! batch size, channels, widths and the ops' geometry are drawn at random.

mod common;

use common::onnx::{Graph, Rng, float, int, ints, string};
use common::{assert_exact, runnable, samples};
use proptest::prelude::*;

/// The relative tolerance: float rounding only, of kernels tiling differently for a
/// batch and for one sample.
const TOL: f32 = 1e-5;

#[derive(Clone, Debug)]
struct ConvLayer {
    kw: usize,
    kh: usize,
    stride: usize,
    pads: (usize, usize),
    dilation: usize,
    depthwise: bool,
    same: bool,
    out: usize,
}

fn conv_layer() -> impl Strategy<Value = ConvLayer> {
    (
        1usize..=5,
        1usize..=3,
        1usize..=3,
        0usize..=3,
        0usize..=3,
        1usize..=3,
        any::<bool>(),
        0u8..6,
        1usize..=4,
    )
        .prop_map(
            |(kw, kh, stride, l, r, dilation, depthwise, same, out)| ConvLayer {
                kw,
                kh,
                stride,
                pads: (l.min(kw - 1 + dilation), r.min(kw - 1 + dilation)),
                dilation,
                depthwise,
                // SAME padding is refused with a stride above one: keep it to stride one here.
                same: same == 0,
                out,
            },
        )
}

/// Conv (+ activation) layers, NCHW, ragged W.
fn conv_stack(
    rng: &mut Rng,
    c: usize,
    layers: &[ConvLayer],
) -> (tract_onnx::pb::ModelProto, usize) {
    let mut g = Graph::default();
    let mut x = "x".to_string();
    let mut channels = c;
    for (i, l) in layers.iter().enumerate() {
        let group = if l.depthwise { channels } else { 1 };
        let out = if l.depthwise { channels } else { l.out };
        let w = g.weight(
            &[out, channels / group, l.kh, l.kw],
            rng.vec(out * channels / group * l.kh * l.kw, 0.5),
        );
        let b = g.weight(&[out], rng.vec(out, 0.5));
        let mut attrs = vec![
            ints("kernel_shape", &[l.kh as i64, l.kw as i64]),
            ints("dilations", &[1, l.dilation as i64]),
            int("group", group as i64),
        ];
        if l.same && l.stride == 1 {
            attrs.push(string("auto_pad", "SAME_UPPER"));
            attrs.push(ints("strides", &[1, 1]));
        } else {
            attrs.push(ints("strides", &[1, l.stride as i64]));
            attrs.push(ints(
                "pads",
                &[
                    (l.kh / 2) as i64,
                    l.pads.0 as i64,
                    (l.kh / 2) as i64,
                    l.pads.1 as i64,
                ],
            ));
        }
        x = g.op("Conv", &[&x, &w, &b], attrs);
        x = match i % 3 {
            0 => g.op("Relu", &[&x], vec![]),
            1 => g.op("HardSwish", &[&x], vec![]),
            _ => g.op("Sigmoid", &[&x], vec![]),
        };
        channels = out;
    }
    (g.model("x", 4, &[&x]), channels)
}

#[derive(Clone, Debug)]
struct Pool {
    max: bool,
    k: usize,
    stride: usize,
    pads: (usize, usize),
    ceil: bool,
    count_include_pad: bool,
    dilation: usize,
    global: u8,
}

fn pool() -> impl Strategy<Value = Pool> {
    (
        any::<bool>(),
        1usize..=4,
        1usize..=3,
        0usize..=2,
        0usize..=2,
        any::<bool>(),
        any::<bool>(),
        1usize..=2,
        0u8..3,
    )
        .prop_map(
            |(max, k, stride, l, r, ceil, count_include_pad, dilation, global)| Pool {
                max,
                k,
                stride,
                // ONNX: pads must be smaller than the kernel.
                pads: (l.min(k - 1), r.min(k - 1)),
                ceil,
                count_include_pad,
                dilation: if max { dilation } else { 1 },
                global,
            },
        )
}

/// A 3x3 conv, a pool along W, then maybe a global pool multiplied back (squeeze-excitation
/// like) or output alongside.
fn pool_model(rng: &mut Rng, c: usize, p: &Pool) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let w = g.weight(&[c, c, 3, 3], rng.vec(c * c * 9, 0.4));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let mut attrs = vec![
        ints("kernel_shape", &[1, p.k as i64]),
        ints("strides", &[1, p.stride as i64]),
        ints("pads", &[0, p.pads.0 as i64, 0, p.pads.1 as i64]),
        int("ceil_mode", p.ceil as i64),
    ];
    let pooled = if p.max {
        attrs.push(ints("dilations", &[1, p.dilation as i64]));
        g.op("MaxPool", &[&x], attrs)
    } else {
        attrs.push(int("count_include_pad", p.count_include_pad as i64));
        g.op("AveragePool", &[&x], attrs)
    };
    match p.global {
        0 => g.model("x", 4, &[&pooled]),
        1 => {
            let gap = g.op("GlobalAveragePool", &[&pooled], vec![]);
            let s = g.op("Sigmoid", &[&gap], vec![]);
            let y = g.op("Mul", &[&pooled, &s], vec![]);
            g.model("x", 4, &[&y, &gap])
        }
        _ => {
            let gmp = g.op("GlobalMaxPool", &[&pooled], vec![]);
            g.model("x", 4, &[&pooled, &gmp])
        }
    }
}

/// Reductions and softmaxes over W, each added back onto the input.
fn reduce_model(rng: &mut Rng, c: usize, which: u8) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let w = g.weight(&[c, c, 1, 3], rng.vec(c * c * 3, 0.5));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[1, 3]), ints("pads", &[0, 1, 0, 1])],
    );
    let r = match which {
        0 => g.op(
            "ReduceMean",
            &[&x],
            vec![ints("axes", &[3]), int("keepdims", 1)],
        ),
        1 => {
            let axes = g.ints_const(&[3]);
            g.op("ReduceSum", &[&x, &axes], vec![int("keepdims", 1)])
        }
        2 => g.op(
            "ReduceMax",
            &[&x],
            vec![ints("axes", &[3]), int("keepdims", 1)],
        ),
        3 => g.op(
            "ReduceMin",
            &[&x],
            vec![ints("axes", &[3]), int("keepdims", 1)],
        ),
        4 => g.op("Softmax", &[&x], vec![int("axis", 3)]),
        _ => g.op("LogSoftmax", &[&x], vec![int("axis", 3)]),
    };
    let y = g.op("Add", &[&x, &r], vec![]);
    g.model("x", 4, &[&y, &r])
}

/// Self-attention over W: x [N,C,1,W] -> tokens [N,W,C] -> heads -> softmax over keys ->
/// P·V -> output projection, with layer norm over channels. The head split is a reshape
/// computed from the input's shape, as PyTorch exports it.
fn attention_model(rng: &mut Rng, c: usize, heads: usize) -> tract_onnx::pb::ModelProto {
    let d = c * heads;
    let mut g = Graph::default();
    let axes2 = g.ints_const(&[2]);
    let x = g.op("Squeeze", &["x", &axes2], vec![]);
    let t = g.op("Transpose", &[&x], vec![ints("perm", &[0, 2, 1])]);
    let scale = g.weight(&[c], rng.vec(c, 1.0));
    let bias = g.weight(&[c], rng.vec(c, 0.2));
    let t = g.op(
        "LayerNormalization",
        &[&t, &scale, &bias],
        vec![int("axis", -1), float("epsilon", 1e-5)],
    );
    let shape = g.op("Shape", &[&t], vec![]);
    let nw = {
        let idx = g.ints_const(&[0, 1]);
        g.op("Gather", &[&shape, &idx], vec![int("axis", 0)])
    };
    let hd = g.ints_const(&[heads as i64, c as i64]);
    let split = g.op("Concat", &[&nw, &hd], vec![int("axis", 0)]);
    let proj = |g: &mut Graph, rng: &mut Rng| {
        let w = g.weight(&[c, d], rng.vec(c * d, 0.5));
        let p = g.op("MatMul", &[&t, &w], vec![]);
        let p = g.op("Reshape", &[&p, &split], vec![]);
        g.op("Transpose", &[&p], vec![ints("perm", &[0, 2, 1, 3])])
    };
    let q = proj(&mut g, rng);
    let k = proj(&mut g, rng);
    let v = proj(&mut g, rng);
    let kt = g.op("Transpose", &[&k], vec![ints("perm", &[0, 1, 3, 2])]);
    let s = g.op("MatMul", &[&q, &kt], vec![]);
    let sc = g.weight(&[1], vec![1.0 / (c as f32).sqrt()]);
    let s = g.op("Mul", &[&s, &sc], vec![]);
    let p = g.op("Softmax", &[&s], vec![int("axis", -1)]);
    let o = g.op("MatMul", &[&p, &v], vec![]);
    let o = g.op("Transpose", &[&o], vec![ints("perm", &[0, 2, 1, 3])]);
    let back = {
        let nwd = g.ints_const(&[0, 0, d as i64]);
        g.op("Reshape", &[&o, &nwd], vec![])
    };
    let wo = g.weight(&[d, c], rng.vec(d * c, 0.5));
    let y = g.op("MatMul", &[&back, &wo], vec![]);
    let y = g.op("Add", &[&y, &t], vec![]);
    g.model("x", 4, &[&y, &p])
}

fn widths(max: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(1usize..=max, 1..=4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn conv_stacks(seed in 1u64.., c in 1usize..=3, h in 1usize..=3,
                   layers in proptest::collection::vec(conv_layer(), 1..=3), widths in widths(24)) {
        let mut rng = Rng(seed);
        let (model, _) = conv_stack(&mut rng, c, &layers);
        let runnable = runnable(&model, &format!("N,{c},{h},W,f32"), 3).unwrap();
        assert_exact(&runnable, &samples(&mut rng, &[c, h, 1], 2, &widths), TOL).unwrap();
    }

    #[test]
    fn pools(seed in 1u64.., c in 1usize..=3, p in pool(), widths in widths(20)) {
        let mut rng = Rng(seed);
        let model = pool_model(&mut rng, c, &p);
        let runnable = runnable(&model, &format!("N,{c},2,W,f32"), 3).unwrap();
        assert_exact(&runnable, &samples(&mut rng, &[c, 2, 1], 2, &widths), TOL).unwrap();
    }

    #[test]
    fn reductions_and_softmax(seed in 1u64.., c in 1usize..=3, which in 0u8..6, widths in widths(20)) {
        let mut rng = Rng(seed);
        let model = reduce_model(&mut rng, c, which);
        let runnable = runnable(&model, &format!("N,{c},2,W,f32"), 3).unwrap();
        assert_exact(&runnable, &samples(&mut rng, &[c, 2, 1], 2, &widths), TOL).unwrap();
    }

    #[test]
    fn attention(seed in 1u64.., c in 1usize..=4, heads in 1usize..=2, widths in widths(20)) {
        let mut rng = Rng(seed);
        let model = attention_model(&mut rng, c, heads);
        let runnable = runnable(&model, &format!("N,{c},1,W,f32"), 3).unwrap();
        assert_exact(&runnable, &samples(&mut rng, &[c, 1, 1], 2, &widths), TOL).unwrap();
    }
}
