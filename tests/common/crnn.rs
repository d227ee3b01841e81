//! Recurrent models as ONNX graphs built in code, as PyTorch exports them: a CRNN (a conv,
//! the map-to-sequence of its columns, stacked LSTM, GRU or RNN layers in any direction
//! and layout, a linear layer, a softmax over the classes), with or without initial states
//! computed per sample, clipping, other activations, GRU's `linear_before_reset`.

#![allow(dead_code)]

use super::onnx::{Graph, Rng, float, floats, int, ints, string, strings};
use proptest::prelude::*;
use tract_onnx::pb::ModelProto;

#[derive(Clone, Debug)]
pub struct Rnn {
    /// 0: LSTM, 1: GRU, 2: RNN.
    pub cell: u8,
    /// 0: forward, 1: reverse, 2: bidirectional.
    pub direction: u8,
    pub hidden: usize,
    pub layers: usize,
    /// ONNX's `layout` 1.
    pub batch_first: bool,
    pub bias: bool,
    /// Initial states computed from each sample (a mean over its width).
    pub initial: bool,
    pub clip: bool,
    /// Activations other than the defaults (with alphas and betas).
    pub activations: bool,
    pub linear_before_reset: bool,
}

pub fn rnn() -> impl Strategy<Value = Rnn> {
    (
        0u8..3,
        0u8..3,
        1usize..=6,
        1usize..=2,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u8..4,
        0u8..4,
        any::<bool>(),
    )
        .prop_map(
            |(cell, direction, hidden, layers, batch_first, bias, initial, clip, acts, lbr)| Rnn {
                cell,
                direction,
                hidden,
                layers,
                batch_first,
                bias,
                initial,
                clip: clip == 0,
                activations: acts == 0,
                linear_before_reset: lbr,
            },
        )
}

impl Rnn {
    /// A bidirectional LSTM of two layers, sequence first, biases, no initial states.
    pub fn default_lstm() -> Rnn {
        Rnn {
            cell: 0,
            direction: 2,
            hidden: 4,
            layers: 2,
            batch_first: false,
            bias: true,
            initial: false,
            clip: false,
            activations: false,
            linear_before_reset: true,
        }
    }

    pub fn op(&self) -> &'static str {
        ["LSTM", "GRU", "RNN"][self.cell as usize]
    }

    pub fn gates(&self) -> usize {
        [4, 3, 1][self.cell as usize]
    }

    pub fn dirs(&self) -> usize {
        if self.direction == 2 { 2 } else { 1 }
    }
}

/// A CRNN over `x [N, c, h, W]`: a conv of height `h` (to one row) and width 3, Relu, the
/// columns as a sequence, `r.layers` recurrences, a linear layer to `classes`, a softmax.
/// Outputs: the probabilities `[N, T, classes]`, and the last layer's `Y_h`.
pub fn crnn(rng: &mut Rng, c: usize, h: usize, classes: usize, r: &Rnn) -> ModelProto {
    let mut g = Graph::default();
    let f = 3;
    let w = g.weight(&[f, c, h, 3], rng.vec(f * c * h * 3, 0.5));
    let conv = g.op(
        "Conv",
        &["x", &w],
        vec![
            ints("kernel_shape", &[h as i64, 3]),
            ints("pads", &[0, 1, 0, 1]),
        ],
    );
    let conv = g.op("Relu", &[&conv], vec![]);
    let axes = g.ints_const(&[2]);
    let cols = g.op("Squeeze", &[&conv, &axes], vec![]);
    // [N, F, W] -> [T, N, F] (or [N, T, F] batch first).
    let perm: &[i64] = if r.batch_first {
        &[0, 2, 1]
    } else {
        &[2, 0, 1]
    };
    let mut seq = g.op("Transpose", &[&cols], vec![ints("perm", perm)]);
    let mut features = f;
    let mut y_h = String::new();
    for _ in 0..r.layers {
        let (y, yh) = layer(&mut g, rng, r, &seq, features);
        seq = y;
        y_h = yh;
        features = r.dirs() * r.hidden;
    }
    let lin = g.weight(&[features, classes], rng.vec(features * classes, 0.7));
    let logits = g.op("MatMul", &[&seq, &lin], vec![]);
    let bias = g.weight(&[classes], rng.vec(classes, 0.3));
    let logits = g.op("Add", &[&logits, &bias], vec![]);
    let probs = g.op("Softmax", &[&logits], vec![int("axis", -1)]);
    let probs = if r.batch_first {
        probs
    } else {
        g.op("Transpose", &[&probs], vec![ints("perm", &[1, 0, 2])])
    };
    g.model("x", 4, &[&probs, &y_h])
}

/// One recurrence over `seq` (`[T, N, features]`, or `[N, T, features]` batch first):
/// its `Y` as `[T, N, D*H]` (or `[N, T, D*H]`), and its `Y_h`.
fn layer(g: &mut Graph, rng: &mut Rng, r: &Rnn, seq: &str, features: usize) -> (String, String) {
    let (dirs, hidden, gates) = (r.dirs(), r.hidden, r.gates());
    let w = g.weight(
        &[dirs, gates * hidden, features],
        rng.vec(dirs * gates * hidden * features, 0.6),
    );
    let rw = g.weight(
        &[dirs, gates * hidden, hidden],
        rng.vec(dirs * gates * hidden * hidden, 0.6),
    );
    let mut inputs = vec![seq.to_string(), w, rw];
    inputs.push(if r.bias {
        g.weight(
            &[dirs, 2 * gates * hidden],
            rng.vec(dirs * 2 * gates * hidden, 0.3),
        )
    } else {
        String::new()
    });
    inputs.push(String::new()); // sequence_lens
    if r.initial {
        let state = initial_state(g, rng, r, seq, features);
        inputs.push(state.clone());
        if r.cell == 0 {
            inputs.push(state);
        }
    }
    while inputs.last().is_some_and(|i| i.is_empty()) {
        inputs.pop();
    }
    let mut attrs = vec![
        int("hidden_size", hidden as i64),
        string(
            "direction",
            ["forward", "reverse", "bidirectional"][r.direction as usize],
        ),
        int("layout", r.batch_first as i64),
    ];
    if r.clip {
        attrs.push(float("clip", 1.5));
    }
    if r.cell == 1 {
        attrs.push(int("linear_before_reset", r.linear_before_reset as i64));
    }
    if r.activations {
        let per_dir: &[&str] = match r.cell {
            0 => &["HardSigmoid", "Tanh", "Softsign"],
            1 => &["HardSigmoid", "LeakyRelu"],
            _ => &["ScaledTanh"],
        };
        let names: Vec<&str> = per_dir
            .iter()
            .cycle()
            .take(per_dir.len() * dirs)
            .copied()
            .collect();
        attrs.push(strings("activations", &names));
        let alphas: Vec<f32> = (0..dirs).flat_map(|_| [0.3f32, 0.05]).collect();
        let betas: Vec<f32> = (0..dirs).flat_map(|_| [0.45f32]).collect();
        attrs.push(floats("activation_alpha", &alphas));
        attrs.push(floats("activation_beta", &betas));
    }
    let refs: Vec<&str> = inputs.iter().map(|s| s.as_str()).collect();
    let outs = g.op_n(r.op(), &refs, 2, attrs);
    let (y, y_h) = (outs[0].clone(), outs[1].clone());
    // Y: [T, D, N, H] -> [T, N, D*H]; batch first [N, T, D, H] -> [N, T, D*H].
    let y = if r.batch_first {
        y
    } else {
        g.op("Transpose", &[&y], vec![ints("perm", &[0, 2, 1, 3])])
    };
    let shape = g.ints_const(&[0, 0, (dirs * hidden) as i64]);
    (g.op("Reshape", &[&y, &shape], vec![]), y_h)
}

/// Initial states from each sample: the tanh of a linear map of its mean over the
/// sequence, `[D, N, H]` (or `[N, D, H]` batch first).
fn initial_state(g: &mut Graph, rng: &mut Rng, r: &Rnn, seq: &str, features: usize) -> String {
    let seq_axis = if r.batch_first { 1 } else { 0 };
    let mean = g.op(
        "ReduceMean",
        &[seq],
        vec![ints("axes", &[seq_axis]), int("keepdims", 0)],
    );
    let m = g.weight(&[features, r.hidden], rng.vec(features * r.hidden, 0.8));
    let h = g.op("MatMul", &[&mean, &m], vec![]);
    let h = g.op("Tanh", &[&h], vec![]);
    let dirs_axis = if r.batch_first { 1 } else { 0 };
    let axes = g.ints_const(&[dirs_axis]);
    let h = g.op("Unsqueeze", &[&h, &axes], vec![]);
    if r.dirs() == 2 {
        g.op("Concat", &[&h, &h], vec![int("axis", dirs_axis)])
    } else {
        h
    }
}
