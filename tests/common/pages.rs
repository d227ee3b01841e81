//! Models over two ragged axes (H and W of a page), as ONNX graphs built in code: stacks
//! of convolutions and pools with kernels, strides, pads and dilations along both axes,
//! squeeze-excitation gates (a global average pool over H x W), and the shapes of text
//! detectors' feature pyramids.

#![allow(dead_code)]

use super::onnx::{Graph, Rng, int, ints};
use proptest::prelude::*;
use tract_onnx::pb::ModelProto;

#[derive(Clone, Debug)]
pub enum Layer {
    Conv {
        k: (usize, usize),
        s: (usize, usize),
        d: (usize, usize),
        /// Before and after, along H then W.
        pads: [usize; 4],
        out: usize,
    },
    Pool {
        max: bool,
        k: (usize, usize),
        s: (usize, usize),
        pads: [usize; 4],
        ceil: bool,
        count_include_pad: bool,
    },
    /// A squeeze-excitation gate: global average pool, 1x1 conv, sigmoid, multiply.
    Gate,
    /// A softmax along H (2) or W (3): over each sample's own extent there.
    Softmax { axis: i64 },
}

pub fn layer() -> impl Strategy<Value = Layer> {
    let conv = (
        (1usize..=3, 1usize..=3),
        (1usize..=2, 1usize..=2),
        (1usize..=2, 1usize..=2),
        [0usize..=2, 0usize..=2, 0usize..=2, 0usize..=2],
        1usize..=3,
    )
        .prop_map(|(k, s, d, pads, out)| Layer::Conv { k, s, d, pads, out });
    let pool = (
        any::<bool>(),
        (2usize..=3, 1usize..=3),
        (1usize..=2, 1usize..=2),
        [0usize..=1, 0usize..=1, 0usize..=1, 0usize..=1],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(max, k, s, pads, ceil, count_include_pad)| Layer::Pool {
            max,
            k,
            s,
            pads,
            ceil,
            count_include_pad,
        });
    let softmax = (2i64..=3).prop_map(|axis| Layer::Softmax { axis });
    prop_oneof![4 => conv, 2 => pool, 1 => Just(Layer::Gate), 1 => softmax]
}

/// `layers` over `x [N, c, H, W]`, each conv followed by a ReLU; outputs the last map and
/// its global average.
pub fn page_stack(rng: &mut Rng, c: usize, layers: &[Layer]) -> ModelProto {
    let mut g = Graph::default();
    let mut x = "x".to_string();
    let mut channels = c;
    for l in layers {
        match l {
            Layer::Conv { k, s, d, pads, out } => {
                let w = g.weight(
                    &[*out, channels, k.0, k.1],
                    rng.vec(out * channels * k.0 * k.1, 0.5),
                );
                let b = g.weight(&[*out], rng.vec(*out, 0.3));
                // ONNX pads: [h_begin, w_begin, h_end, w_end]; a pad below the kernel's
                // field at each side.
                let p = |i: usize, field: usize| pads[i].min(field - 1) as i64;
                let (fh, fw) = ((k.0 - 1) * d.0 + 1, (k.1 - 1) * d.1 + 1);
                let conv = g.op(
                    "Conv",
                    &[&x, &w, &b],
                    vec![
                        ints("kernel_shape", &[k.0 as i64, k.1 as i64]),
                        ints("strides", &[s.0 as i64, s.1 as i64]),
                        ints("dilations", &[d.0 as i64, d.1 as i64]),
                        ints("pads", &[p(0, fh), p(2, fw), p(1, fh), p(3, fw)]),
                    ],
                );
                x = g.op("Relu", &[&conv], vec![]);
                channels = *out;
            }
            Layer::Pool {
                max,
                k,
                s,
                pads,
                ceil,
                count_include_pad,
            } => {
                let p = |i: usize, kernel: usize| pads[i].min(kernel - 1) as i64;
                let mut attrs = vec![
                    ints("kernel_shape", &[k.0 as i64, k.1 as i64]),
                    ints("strides", &[s.0 as i64, s.1 as i64]),
                    ints("pads", &[p(0, k.0), p(2, k.1), p(1, k.0), p(3, k.1)]),
                    int("ceil_mode", *ceil as i64),
                ];
                if !max {
                    attrs.push(int("count_include_pad", *count_include_pad as i64));
                }
                x = g.op(if *max { "MaxPool" } else { "AveragePool" }, &[&x], attrs);
            }
            Layer::Gate => {
                let pooled = g.op("GlobalAveragePool", &[&x], vec![]);
                let w = g.weight(
                    &[channels, channels, 1, 1],
                    rng.vec(channels * channels, 0.5),
                );
                let squeezed = g.op("Conv", &[&pooled, &w], vec![]);
                let gate = g.op("Sigmoid", &[&squeezed], vec![]);
                x = g.op("Mul", &[&x, &gate], vec![]);
            }
            Layer::Softmax { axis } => {
                x = g.op("Softmax", &[&x], vec![int("axis", *axis)]);
            }
        }
    }
    let mean = g.op("GlobalAveragePool", &[&x], vec![]);
    g.model("x", 4, &[&x, &mean])
}

/// How a feature pyramid upsamples.
#[derive(Clone, Debug)]
pub enum Upsample {
    /// ONNX Resize by 2: its mode and coordinate transform.
    Resize(&'static str, &'static str),
    /// ONNX Resize to the extents of the map it is added to, as PyTorch exports
    /// `F.interpolate(x, size=y.shape[2:])`: sizes computed from a `Shape`.
    ToShape(&'static str, &'static str),
    /// A transposed convolution, kernel 2 stride 2.
    Deconv,
}

pub fn upsample() -> impl Strategy<Value = Upsample> {
    prop_oneof![
        Just(Upsample::Resize("nearest", "asymmetric")),
        Just(Upsample::Resize("nearest", "half_pixel")),
        Just(Upsample::Resize("linear", "half_pixel")),
        Just(Upsample::Resize("linear", "pytorch_half_pixel")),
        Just(Upsample::Resize("linear", "asymmetric")),
        Just(Upsample::Resize("cubic", "half_pixel")),
        Just(Upsample::ToShape("nearest", "asymmetric")),
        Just(Upsample::ToShape("linear", "pytorch_half_pixel")),
        Just(Upsample::Resize("linear", "align_corners")),
        Just(Upsample::Resize("cubic", "align_corners")),
        Just(Upsample::ToShape("linear", "align_corners")),
        Just(Upsample::Deconv),
    ]
}

fn conv(
    g: &mut Graph,
    rng: &mut Rng,
    x: &str,
    cin: usize,
    cout: usize,
    k: usize,
    s: usize,
) -> String {
    let w = g.weight(&[cout, cin, k, k], rng.vec(cout * cin * k * k, 0.5));
    let b = g.weight(&[cout], rng.vec(cout, 0.2));
    let p = (k / 2) as i64;
    let y = g.op(
        "Conv",
        &[x, &w, &b],
        vec![
            ints("kernel_shape", &[k as i64, k as i64]),
            ints("strides", &[s as i64, s as i64]),
            ints("pads", &[p, p, p, p]),
        ],
    );
    g.op("Relu", &[&y], vec![])
}

/// `x` upsampled twice to `like`'s extents.
fn up(g: &mut Graph, rng: &mut Rng, x: &str, like: &str, c: usize, how: &Upsample) -> String {
    let attrs = |mode: &str, coord: &str| {
        let mut attrs = vec![
            super::onnx::string("mode", mode),
            super::onnx::string("coordinate_transformation_mode", coord),
        ];
        if mode == "nearest" {
            attrs.push(super::onnx::string("nearest_mode", "floor"));
        }
        attrs
    };
    match how {
        Upsample::Resize(mode, coord) => {
            let scales = g.weight(&[4], vec![1.0, 1.0, 2.0, 2.0]);
            g.op("Resize", &[x, "", &scales], attrs(mode, coord))
        }
        Upsample::ToShape(mode, coord) => {
            let shape_x = g.op("Shape", &[x], vec![]);
            let shape_like = g.op("Shape", &[like], vec![]);
            let (zero, two, four) = (g.ints_const(&[0]), g.ints_const(&[2]), g.ints_const(&[4]));
            let nc = g.op("Slice", &[&shape_x, &zero, &two], vec![]);
            let hw = g.op("Slice", &[&shape_like, &two, &four], vec![]);
            let sizes = g.op("Concat", &[&nc, &hw], vec![int("axis", 0)]);
            g.op("Resize", &[x, "", "", &sizes], attrs(mode, coord))
        }
        Upsample::Deconv => {
            let w = g.weight(&[c, c, 2, 2], rng.vec(c * c * 4, 0.5));
            g.op(
                "ConvTranspose",
                &[x, &w],
                vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
            )
        }
    }
}

/// A text detector's shape: two stride-2 convs, the coarse map upsampled and added to the
/// finer one, a squeeze-excitation gate, upsampled again and concatenated with a
/// full-resolution branch along the channels, a 1x1 conv and a sigmoid: a probability map
/// `[N, 1, H, W]`, and the coarse map's global average. Pages must be multiples of 4.
pub fn fpn(rng: &mut Rng, c: usize, how: &Upsample) -> ModelProto {
    let mut g = Graph::default();
    let f = 4;
    let c1 = conv(&mut g, rng, "x", c, f, 3, 2);
    let c2 = conv(&mut g, rng, &c1, f, f, 3, 2);
    let u = up(&mut g, rng, &c2, &c1, f, how);
    let p1 = g.op("Add", &[&u, &c1], vec![]);
    let pooled = g.op("GlobalAveragePool", &[&p1], vec![]);
    let w = g.weight(&[f, f, 1, 1], rng.vec(f * f, 0.5));
    let gate = g.op("Conv", &[&pooled, &w], vec![]);
    let gate = g.op("Sigmoid", &[&gate], vec![]);
    let p1 = g.op("Mul", &[&p1, &gate], vec![]);
    let full = conv(&mut g, rng, "x", c, f, 3, 1);
    let u2 = up(&mut g, rng, &p1, &full, f, how);
    let cat = g.op("Concat", &[&u2, &full], vec![int("axis", 1)]);
    let w = g.weight(&[1, 2 * f, 1, 1], rng.vec(2 * f, 0.5));
    let logits = g.op("Conv", &[&cat, &w], vec![]);
    let probs = g.op("Sigmoid", &[&logits], vec![]);
    let mean = g.op("GlobalAveragePool", &[&c2], vec![]);
    g.model("x", 4, &[&probs, &mean])
}
