//! A recurrence (ONNX LSTM, GRU or RNN) that runs each sample to its own length.
//!
//! The semantics are ONNX's with `sequence_lens`: sample n of length l runs steps
//! 0..l-1 forward, and l-1 down to 0 in the reverse direction (it starts at its own end,
//! not at the padded end); `Y` is zero at steps past l; `Y_h` (and `Y_c`) are the states
//! after the sample's own last step. That is exactly what the sample computes alone, so
//! a ragged batch only has to give each sample its width as its length
//! ([`crate::ops::SequenceLengths`]): the state never runs through the padded region, and nothing
//! before the recurrence needs a mask (the op never reads `X` past a sample's length).
//!
//! Why an op of ours rather than tract's lowering to a `Scan`: tract-onnx 0.23.9 refuses
//! a `sequence_lens` that is not the full length, ignores the `activations`, `clip` and
//! `direction: reverse` attributes, and needs a concrete batch size when the model gives
//! no initial state; its `Scan` runs a body plan per step on the host. One op holding the
//! whole recurrence and the lengths is also what cuDNN's RNN API takes (ragged-cuda).
//!
//! Inputs, in ONNX's order, the optional ones only when present ([`Inputs`]): `X`, `W`,
//! `R`, `B`, the lengths, `initial_h`, `initial_c`, `P`. Outputs: `Y`, `Y_h`, and `Y_c`
//! for an LSTM. Shapes (`layout` 0, sequence first): `X [T, N, C]`, `Y [T, D, N, H]`,
//! `Y_h [D, N, H]`; batch first (`layout` 1): `X [N, T, C]`, `Y [N, T, D, H]`,
//! `Y_h [N, D, H]`. f32.

use tract_core::internal::*;

mod cpu;

/// The cell a recurrence runs at each step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cell {
    Lstm,
    Gru,
    Rnn,
}

impl Cell {
    /// Gates stacked in `W` and `R`: i, o, f, c for an LSTM; z, r, h for a GRU.
    pub fn gates(&self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }

    /// Activations per direction: f, g, h for an LSTM; f, g for a GRU; f for an RNN.
    pub fn activations(&self) -> usize {
        match self {
            Cell::Lstm => 3,
            Cell::Gru => 2,
            Cell::Rnn => 1,
        }
    }

    /// ONNX's defaults.
    pub fn default_activations(&self) -> Vec<Activation> {
        match self {
            Cell::Lstm => vec![Activation::Sigmoid, Activation::Tanh, Activation::Tanh],
            Cell::Gru => vec![Activation::Sigmoid, Activation::Tanh],
            Cell::Rnn => vec![Activation::Tanh],
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Cell::Lstm => "LSTM",
            Cell::Gru => "GRU",
            Cell::Rnn => "RNN",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Forward,
    Reverse,
    Bidirectional,
}

impl Direction {
    pub fn count(&self) -> usize {
        match self {
            Direction::Bidirectional => 2,
            _ => 1,
        }
    }

    /// Whether direction `d` (0 or 1) runs from the end.
    pub fn reverse(&self, d: usize) -> bool {
        match self {
            Direction::Forward => false,
            Direction::Reverse => true,
            Direction::Bidirectional => d == 1,
        }
    }
}

/// An activation of ONNX's recurrences (with the alpha and beta it takes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Relu,
    Tanh,
    Sigmoid,
    Affine { alpha: f32, beta: f32 },
    LeakyRelu { alpha: f32 },
    ThresholdedRelu { alpha: f32 },
    ScaledTanh { alpha: f32, beta: f32 },
    HardSigmoid { alpha: f32, beta: f32 },
    Elu { alpha: f32 },
    Softsign,
    Softplus,
}

// Alpha and beta are finite (ONNX attributes): equality is an equivalence.
impl Eq for Activation {}

impl Activation {
    /// The activation ONNX names `name` (any case), taking `alpha` and `beta` where it
    /// uses them (ONNX's defaults otherwise).
    pub fn parse(name: &str, alpha: Option<f32>, beta: Option<f32>) -> TractResult<Activation> {
        let a = |default: f32| alpha.unwrap_or(default);
        let b = |default: f32| beta.unwrap_or(default);
        Ok(match name.to_ascii_lowercase().as_str() {
            "relu" => Activation::Relu,
            "tanh" => Activation::Tanh,
            "sigmoid" => Activation::Sigmoid,
            "affine" => Activation::Affine {
                alpha: a(1.0),
                beta: b(0.0),
            },
            "leakyrelu" => Activation::LeakyRelu { alpha: a(0.01) },
            "thresholdedrelu" => Activation::ThresholdedRelu { alpha: a(1.0) },
            "scaledtanh" => Activation::ScaledTanh {
                alpha: a(1.0),
                beta: b(1.0),
            },
            "hardsigmoid" => Activation::HardSigmoid {
                alpha: a(0.2),
                beta: b(0.5),
            },
            "elu" => Activation::Elu { alpha: a(1.0) },
            "softsign" => Activation::Softsign,
            "softplus" => Activation::Softplus,
            other => bail!("unknown recurrence activation {other:?}"),
        })
    }

    /// Whether it takes an alpha (consumed from `activation_alpha` in order).
    pub fn takes_alpha(name: &str) -> bool {
        matches!(
            name.to_ascii_lowercase().as_str(),
            "affine" | "leakyrelu" | "thresholdedrelu" | "scaledtanh" | "hardsigmoid" | "elu"
        )
    }

    /// Whether it takes a beta (consumed from `activation_beta` in order).
    pub fn takes_beta(name: &str) -> bool {
        matches!(
            name.to_ascii_lowercase().as_str(),
            "affine" | "scaledtanh" | "hardsigmoid"
        )
    }

    #[inline]
    pub fn apply(&self, x: f32) -> f32 {
        match *self {
            Activation::Relu => x.max(0.0),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Activation::Affine { alpha, beta } => alpha * x + beta,
            Activation::LeakyRelu { alpha } => {
                if x >= 0.0 {
                    x
                } else {
                    alpha * x
                }
            }
            Activation::ThresholdedRelu { alpha } => {
                if x > alpha {
                    x
                } else {
                    0.0
                }
            }
            Activation::ScaledTanh { alpha, beta } => alpha * (beta * x).tanh(),
            Activation::HardSigmoid { alpha, beta } => (alpha * x + beta).clamp(0.0, 1.0),
            Activation::Elu { alpha } => {
                if x >= 0.0 {
                    x
                } else {
                    alpha * (x.exp() - 1.0)
                }
            }
            Activation::Softsign => x / (1.0 + x.abs()),
            Activation::Softplus => x.exp().ln_1p(),
        }
    }
}

/// The optional inputs present, after `X`, `W` and `R`, in this order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Inputs {
    pub bias: bool,
    /// `sequence_lens`, `[N]` integers: the model's own, or each sample's width under the
    /// transform ([`crate::ops::SequenceLengths`]).
    pub lengths: bool,
    pub initial_h: bool,
    pub initial_c: bool,
    pub peepholes: bool,
}

/// The input slot of each optional input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slots {
    pub bias: Option<usize>,
    pub lengths: Option<usize>,
    pub initial_h: Option<usize>,
    pub initial_c: Option<usize>,
    pub peepholes: Option<usize>,
    pub count: usize,
}

impl Inputs {
    pub fn slots(&self) -> Slots {
        let mut next = 3;
        let mut take = |present: bool| {
            present.then(|| {
                next += 1;
                next - 1
            })
        };
        let bias = take(self.bias);
        let lengths = take(self.lengths);
        let initial_h = take(self.initial_h);
        let initial_c = take(self.initial_c);
        let peepholes = take(self.peepholes);
        Slots {
            bias,
            lengths,
            initial_h,
            initial_c,
            peepholes,
            count: next,
        }
    }
}

/// An ONNX LSTM, GRU or RNN, each sample run to its own length (module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Recurrence {
    pub cell: Cell,
    pub direction: Direction,
    pub hidden: usize,
    /// ONNX's `layout` 1: `X [N, T, C]`.
    pub batch_first: bool,
    /// [`Cell::activations`] per direction, the forward direction's first.
    pub activations: Vec<Activation>,
    /// Bounds the input of every activation to [-clip, clip].
    pub clip: Option<f32>,
    /// GRU: the reset gate scales `Ht-1 * Rh^T + Rbh` rather than `Ht-1`.
    pub linear_before_reset: bool,
    /// LSTM: the forget gate is one minus the input gate.
    pub input_forget: bool,
    pub inputs: Inputs,
}

// The clip is finite (an ONNX attribute): equality is an equivalence.
impl Eq for Recurrence {}

impl Recurrence {
    /// The axes of `X`: (sequence, batch).
    pub fn x_axes(&self) -> (usize, usize) {
        if self.batch_first { (1, 0) } else { (0, 1) }
    }

    /// The batch axis of `Y`.
    pub fn y_batch_axis(&self) -> usize {
        if self.batch_first { 0 } else { 2 }
    }

    /// The batch axis of `Y_h` and `Y_c` (and of the initial states).
    pub fn state_batch_axis(&self) -> usize {
        if self.batch_first { 0 } else { 1 }
    }

    pub fn outputs(&self) -> usize {
        if self.cell == Cell::Lstm { 3 } else { 2 }
    }

    /// The activations of direction `d`.
    pub fn activations_of(&self, d: usize) -> &[Activation] {
        let k = self.cell.activations();
        &self.activations[d * k..(d + 1) * k]
    }
}

impl Op for Recurrence {
    fn name(&self) -> StaticName {
        format!("Ragged{}", self.cell.name()).into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        let mut info = vec![format!(
            "{:?}, hidden {}, {}, activations {:?}",
            self.direction,
            self.hidden,
            if self.batch_first {
                "batch first"
            } else {
                "sequence first"
            },
            self.activations
        )];
        if self.inputs.lengths {
            info.push("sequence_lens".to_string());
        }
        if let Some(clip) = self.clip {
            info.push(format!("clip {clip}"));
        }
        if self.cell == Cell::Gru {
            info.push(format!("linear_before_reset: {}", self.linear_before_reset));
        }
        Ok(info)
    }

    op_as_typed_op!();
}

impl EvalOp for Recurrence {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        self.eval_f32(&inputs)
    }
}

impl TypedOp for Recurrence {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let slots = self.inputs.slots();
        let name = self.cell.name();
        ensure!(
            inputs.len() == slots.count,
            "{name}: {} inputs, {} expected",
            inputs.len(),
            slots.count
        );
        let x = inputs[0];
        ensure!(
            x.datum_type == f32::datum_type(),
            "{name}: only f32 recurrences are supported, this one is {:?}",
            x.datum_type
        );
        ensure!(x.rank() == 3, "{name}: X has rank {}, 3 expected", x.rank());
        let (seq, batch) = self.x_axes();
        let (t, n) = (x.shape[seq].clone(), x.shape[batch].clone());
        let dirs = self.direction.count();
        let h = self.hidden;
        let gates = self.cell.gates();
        let expect = |fact: &TypedFact, what: &str, dims: &[TDim]| -> TractResult<()> {
            ensure!(
                fact.shape.iter().eq(dims.iter()),
                "{name}: {what} has shape {:?}, [{}] expected",
                fact.shape,
                dims.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            ensure!(
                fact.datum_type == x.datum_type,
                "{name}: {what} is {:?}, X is {:?}",
                fact.datum_type,
                x.datum_type
            );
            Ok(())
        };
        let c = x.shape[2].clone();
        expect(inputs[1], "W", &[dirs.into(), (gates * h).into(), c])?;
        expect(inputs[2], "R", &[dirs.into(), (gates * h).into(), h.into()])?;
        if let Some(b) = slots.bias {
            expect(inputs[b], "B", &[dirs.into(), (2 * gates * h).into()])?;
        }
        let state: TVec<TDim> = if self.batch_first {
            tvec!(n.clone(), dirs.into(), h.into())
        } else {
            tvec!(dirs.into(), n.clone(), h.into())
        };
        for (slot, what) in [
            (slots.initial_h, "initial_h"),
            (slots.initial_c, "initial_c"),
        ] {
            if let Some(s) = slot {
                expect(inputs[s], what, &state)?;
            }
        }
        if let Some(p) = slots.peepholes {
            expect(inputs[p], "P", &[dirs.into(), (3 * h).into()])?;
        }
        if let Some(s) = slots.lengths {
            ensure!(
                inputs[s].rank() == 1 && inputs[s].datum_type.is_integer(),
                "{name}: sequence_lens must be integers of rank 1"
            );
        }
        let y: TVec<TDim> = if self.batch_first {
            tvec!(n.clone(), t, dirs.into(), h.into())
        } else {
            tvec!(t, dirs.into(), n.clone(), h.into())
        };
        let mut facts = tvec!(x.datum_type.fact(y), x.datum_type.fact(state.clone()));
        if self.cell == Cell::Lstm {
            facts.push(x.datum_type.fact(state));
        }
        Ok(facts)
    }

    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        // Per step and sample: the input and the recurrent products.
        let x = inputs[0];
        let gates = (self.cell.gates() * self.hidden) as i64;
        let per_row = (x.shape[2].clone() + self.hidden as i64) * gates;
        let steps = x.shape[0].clone() * &x.shape[1] * self.direction.count() as i64;
        Ok(tvec!((Cost::FMA(x.datum_type), steps * per_row)))
    }

    as_op!();
}
