//! Random models of every op family the transform handles, as ONNX graphs built in code:
//! conv stacks, pools and global pools, reductions and softmax over the width, attention
//! over the width with layer norm over channels. Shared by the CPU and CUDA exactness
//! tests.

#![allow(dead_code)]

use super::onnx::{Graph, Rng, float, int, ints, string};
use proptest::prelude::*;
use tract_onnx::pb::ModelProto;

#[derive(Clone, Debug)]
pub struct ConvLayer {
    pub kw: usize,
    pub kh: usize,
    pub stride: usize,
    pub pads: (usize, usize),
    pub dilation: usize,
    pub depthwise: bool,
    pub same: bool,
    pub out: usize,
}

pub fn conv_layer() -> impl Strategy<Value = ConvLayer> {
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
pub fn conv_stack(rng: &mut Rng, c: usize, layers: &[ConvLayer]) -> (ModelProto, usize) {
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
        // SAME padding on the last layer only: tract's declutter pulls a later layer's
        // stride into a SAME-padded conv, making it a SAME conv with a stride, whose left
        // padding depends on the width, which the transform then refuses (a tract rewrite
        // that changes the positions, noted in benches/NOTES.md).
        if l.same && l.stride == 1 && i + 1 == layers.len() {
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
pub struct Pool {
    pub max: bool,
    pub k: usize,
    pub stride: usize,
    pub pads: (usize, usize),
    pub ceil: bool,
    pub count_include_pad: bool,
    pub dilation: usize,
    pub global: u8,
}

pub fn pool() -> impl Strategy<Value = Pool> {
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
pub fn pool_model(rng: &mut Rng, c: usize, p: &Pool) -> ModelProto {
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
pub fn reduce_model(rng: &mut Rng, c: usize, which: u8) -> ModelProto {
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
pub fn attention_model(rng: &mut Rng, c: usize, heads: usize) -> ModelProto {
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

const OPS: [&str; 6] = ["Add", "Sub", "Mul", "Div", "Min", "Max"];

/// One step of a random graph: an op, its two inputs (indices into the values so far, or
/// a new constant of a broadcast shape), and whether its value is also a model output.
#[derive(Clone, Debug)]
pub struct BinopStep {
    pub op: usize,
    pub a: usize,
    pub b: Option<usize>,
    pub constant_shape: usize,
    pub output: bool,
    pub breaker: bool,
}

pub fn binop_step() -> impl Strategy<Value = BinopStep> {
    (
        0..OPS.len(),
        any::<usize>(),
        proptest::option::of(any::<usize>()),
        0usize..4,
        proptest::bool::weighted(0.15),
        proptest::bool::weighted(0.1),
    )
        .prop_map(|(op, a, b, constant_shape, output, breaker)| BinopStep {
            op,
            a,
            b,
            constant_shape,
            output,
            breaker,
        })
}

/// The graph of `steps` (binary ops, element-wise chains to fuse) over an input `[N, C, H, W]`.
pub fn binop_graph(
    rng: &mut Rng,
    c: usize,
    h: usize,
    steps: &[BinopStep],
) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let mut values = vec!["x".to_string()];
    let mut outputs = vec![];
    for s in steps {
        let a = values[s.a % values.len()].clone();
        let b = match s.b {
            Some(b) => values[b % values.len()].clone(),
            None => {
                let shape =
                    [[1, 1, 1, 1], [1, c, 1, 1], [1, 1, h, 1], [1, c, h, 1]][s.constant_shape];
                let len = shape.iter().product();
                // Away from zero: a division stays finite.
                let data = rng
                    .vec(len, 1.0)
                    .iter()
                    .map(|v| v.signum() * (0.5 + v.abs()))
                    .collect();
                g.weight(&shape, data)
            }
        };
        let v = if s.breaker {
            // Not a binary op: a chain ends here.
            g.op("Tanh", &[&a], vec![])
        } else {
            g.op(OPS[s.op], &[&a, &b], vec![])
        };
        if s.output {
            outputs.push(v.clone());
        }
        values.push(v);
    }
    let last = values.last().unwrap().clone();
    if !outputs.contains(&last) {
        outputs.push(last);
    }
    let outputs: Vec<&str> = outputs.iter().map(|s| s.as_str()).collect();
    g.model("x", 4, &outputs)
}

/// PP-OCR's block: a conv, batch norm (Mul, Add), hard-swish (Add, Max, Min, Mul, Mul)
/// reading the normed value twice, and a residual add of the conv's output: one
/// element-wise chain of eight links, the conv's output read twice from outside.
pub fn bn_hard_swish(rng: &mut Rng, c: usize) -> ModelProto {
    let mut g = Graph::default();
    let scale = g.weight(&[1, c, 1, 1], rng.vec(c, 1.0));
    let bias = g.weight(&[1, c, 1, 1], rng.vec(c, 1.0));
    let three = g.weight(&[1, 1, 1, 1], vec![3.0]);
    let zero = g.weight(&[1, 1, 1, 1], vec![0.0]);
    let six = g.weight(&[1, 1, 1, 1], vec![6.0]);
    let sixth = g.weight(&[1, 1, 1, 1], vec![1.0 / 6.0]);
    let kernel = g.weight(&[c, c, 1, 3], rng.vec(c * c * 3, 0.5));
    let conv = g.op("Conv", &["x", &kernel], vec![ints("pads", &[0, 1, 0, 1])]);
    let scaled = g.op("Mul", &[&conv, &scale], vec![]);
    let normed = g.op("Add", &[&scaled, &bias], vec![]);
    let shifted = g.op("Add", &[&normed, &three], vec![]);
    let relu = g.op("Max", &[&shifted, &zero], vec![]);
    let relu6 = g.op("Min", &[&relu, &six], vec![]);
    let gated = g.op("Mul", &[&normed, &relu6], vec![]);
    let swish = g.op("Mul", &[&gated, &sixth], vec![]);
    // The conv's output is also read by a residual add after the chain.
    let out = g.op("Add", &[&swish, &conv], vec![]);
    g.model("x", 4, &[&out])
}

/// A 3x3 conv of 2 channels over `x` (`[N, 2, H, W]`), then `tail` on its output: with a
/// `Flatten` of C with W, what the transform refuses and plain tract runs alone.
pub fn conv_then(rng: &mut Rng, tail: impl Fn(&mut Graph, &str) -> String) -> ModelProto {
    let mut g = Graph::default();
    let w = g.weight(&[2, 2, 3, 3], rng.vec(36, 0.5));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let y = tail(&mut g, &x);
    g.model("x", 4, &[&y])
}

/// Position arithmetic as transformers' exports write it, over `x` `[N, L, 4]`: positions
/// as a cumulative sum of a mask of ones along `L` (RoBERTa's position ids), cast to int64
/// (which tract computes as `TDim`), offset, read from a position table, negated, and
/// their absolute values and signs on int32 (relative distances); and the channels
/// permuted by a `GatherElements` at indices broadcast over the batch (RoBERTa's token
/// types, DeBERTa's gathers of scores). Everything is added to `x`.
pub fn position_arithmetic(rng: &mut Rng) -> ModelProto {
    let mut g = Graph::default();
    let low = g.weight(&[1], vec![-100.0]);
    let above = g.op("Greater", &["x", &low], vec![]);
    let ones = g.op("Cast", &[&above], vec![int("to", 6)]);
    let axis = g.int64_scalar(1);
    let pos = g.op("CumSum", &[&ones, &axis], vec![]);
    let pos = g.op("Cast", &[&pos], vec![int("to", 7)]);
    let one = g.ints_const(&[1]);
    let pos = g.op("Add", &[&pos, &one], vec![]);
    let table = g.weight(&[80], rng.vec(80, 1.0));
    let embedded = g.op("Gather", &[&table, &pos], vec![int("axis", 0)]);
    let back = g.op("Neg", &[&pos], vec![]);
    let back = g.op("Cast", &[&back], vec![int("to", 6)]);
    let distance = g.op("Abs", &[&back], vec![]);
    let sign = g.op("Sign", &[&back], vec![]);
    let signed = g.op("Mul", &[&distance, &sign], vec![]);
    let signed = g.op("Cast", &[&signed], vec![int("to", 1)]);
    let shape = g.op("Shape", &["x"], vec![]);
    let perm = g.ints_const(&[3, 0, 2, 1]);
    let at = g.op("Expand", &[&perm, &shape], vec![]);
    let permuted = g.op("GatherElements", &["x", &at], vec![int("axis", 2)]);
    let y = g.op("Add", &["x", &embedded], vec![]);
    let y = g.op("Add", &[&y, &permuted], vec![]);
    let scale = g.weight(&[1], vec![0.01]);
    let signed = g.op("Mul", &[&signed, &scale], vec![]);
    let y = g.op("Add", &[&y, &signed], vec![]);
    g.model("x", 3, &[&y])
}

/// Projections of a dynamically quantized model, as ONNX Runtime's `quantize_dynamic`
/// writes them: `x` (`[N, L, C]`) quantized whole (`DynamicQuantizeLinear`), multiplied by
/// int8 weights `[C, D]` of zero point 3 (`MatMulInteger`), dequantized; once on `x`
/// (BERT's projections) and once on `x` flattened to `[N*L, C]` and split back (GPT-2's
/// `Conv1D`), summed.
pub fn quantized_projections(rng: &mut Rng, c: usize, d: usize) -> ModelProto {
    let mut g = Graph::default();
    let values: Vec<i8> = (0..c * d)
        .map(|_| (rng.next_f32() * 254.0 - 127.0) as i8)
        .collect();
    let w = g.int8_weight(&[c, d], &values);
    let w_zero_point = g.int8_weight(&[], &[3]);
    let w_scale = g.weight(&[], vec![0.02]);
    let project = |g: &mut Graph, x: &str| -> String {
        let q = g.op_n("DynamicQuantizeLinear", &[x], 3, vec![]);
        let y = g.op("MatMulInteger", &[&q[0], &w, &q[2], &w_zero_point], vec![]);
        let y = g.op("Cast", &[&y], vec![int("to", 1)]);
        let scale = g.op("Mul", &[&q[1], &w_scale], vec![]);
        g.op("Mul", &[&y, &scale], vec![])
    };
    let direct = project(&mut g, "x");
    let flat_shape = g.ints_const(&[-1, c as i64]);
    let flat = g.op("Reshape", &["x", &flat_shape], vec![]);
    let flat = project(&mut g, &flat);
    let shape = g.op("Shape", &["x"], vec![]);
    let (starts, ends) = (g.ints_const(&[0]), g.ints_const(&[2]));
    let batch_and_length = g.op("Slice", &[&shape, &starts, &ends], vec![]);
    let columns = g.ints_const(&[d as i64]);
    let back = g.op(
        "Concat",
        &[&batch_and_length, &columns],
        vec![int("axis", 0)],
    );
    let split = g.op("Reshape", &[&flat, &back], vec![]);
    let y = g.op("Add", &[&direct, &split], vec![]);
    g.model("x", 3, &[&y])
}
