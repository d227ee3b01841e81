//! ONNX's LSTM, GRU and RNN nodes loaded as tract-ragged's [`Recurrence`] op.
//!
//! tract-onnx types them (its rules, reused here) and would lower them to a `Scan` per
//! direction; this loader wires one [`Recurrence`] instead, with every attribute ONNX
//! gives a recurrence: `direction` (a single `reverse` too), `layout`, `activations`
//! with their `activation_alpha` and `activation_beta`, `clip`, GRU's
//! `linear_before_reset`, LSTM's `input_forget`, and `sequence_lens` (tract's lowering
//! refuses one that is not the full length, ignores the others but `layout` and
//! `linear_before_reset`, and needs a concrete batch when no initial state is given).

use tract_onnx::model::{OnnxOpRegister, ParsingContext};
use tract_onnx::ops::rec::common::{CommonRec, WireBody};
use tract_onnx::ops::rec::{gru::GRU, lstm::LSTM, rnn::RNN};
use tract_onnx::pb::NodeProto;
use tract_onnx::tract_hir::internal::*;
use tract_onnx::tract_hir::ops;

use crate::ops::recurrence::{Activation, Cell, Direction, Inputs, Recurrence};

/// Registers the loader for LSTM, GRU and RNN nodes.
pub fn register(register: &mut OnnxOpRegister) {
    register.insert("LSTM", |ctx, pb| load(ctx, pb, Cell::Lstm));
    register.insert("GRU", |ctx, pb| load(ctx, pb, Cell::Gru));
    register.insert("RNN", |ctx, pb| load(ctx, pb, Cell::Rnn));
}

/// An ONNX recurrence node: typed by tract-onnx's rules, wired as a [`Recurrence`].
#[derive(Debug, Clone)]
struct OnnxRecurrence {
    /// tract-onnx's view of the node: where its optional inputs and outputs are, and the
    /// typing rules.
    common: CommonRec,
    cell: Cell,
    direction: Direction,
    /// As the node names them, with their alpha and beta; ONNX's defaults when empty.
    activations: Vec<Activation>,
    clip: Option<f32>,
    linear_before_reset: bool,
    input_forget: bool,
}

fn load(
    _ctx: &ParsingContext,
    pb: &NodeProto,
    cell: Cell,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    // tract-onnx's cell definitions only tell its rules how many gates there are.
    let body: Box<dyn WireBody> = match cell {
        Cell::Lstm => Box::new(LSTM {
            f: Box::new(ops::nn::sigmoid()),
            g: Box::new(ops::math::tanh()),
            h: Box::new(ops::math::tanh()),
        }),
        Cell::Gru => Box::new(GRU {
            f: Box::new(ops::nn::sigmoid()),
            g: Box::new(ops::math::tanh()),
            linear_before_reset: false,
        }),
        Cell::Rnn => Box::new(RNN {
            fore: Box::new(ops::math::tanh()),
            back: Box::new(ops::math::tanh()),
        }),
    };
    let common = CommonRec::from_node_and_options(pb, 3, 0, body)?;
    let direction = match pb.get_attr_opt::<&str>("direction")?.unwrap_or("forward") {
        "forward" => Direction::Forward,
        "reverse" => Direction::Reverse,
        "bidirectional" => Direction::Bidirectional,
        other => bail!("{}: unknown direction {other:?}", pb.name),
    };
    let names: TVec<&str> = pb.get_attr_opt_tvec("activations")?.unwrap_or_default();
    let alphas: TVec<f32> = pb
        .get_attr_opt_tvec("activation_alpha")?
        .unwrap_or_default();
    let betas: TVec<f32> = pb.get_attr_opt_tvec("activation_beta")?.unwrap_or_default();
    let (mut alphas, mut betas) = (alphas.into_iter(), betas.into_iter());
    let activations = names
        .iter()
        .map(|name| {
            let alpha = if Activation::takes_alpha(name) {
                alphas.next()
            } else {
                None
            };
            let beta = if Activation::takes_beta(name) {
                betas.next()
            } else {
                None
            };
            Activation::parse(name, alpha, beta)
        })
        .collect::<TractResult<Vec<_>>>()
        .with_context(|| format!("{}: activations", pb.name))?;
    let clip = pb.get_attr_opt::<f32>("clip")?.filter(|c| *c > 0.0);
    let linear_before_reset = pb.get_attr_opt::<i64>("linear_before_reset")?.unwrap_or(0) != 0;
    let input_forget = pb.get_attr_opt::<i64>("input_forget")?.unwrap_or(0) != 0;
    let op = OnnxRecurrence {
        common,
        cell,
        direction,
        activations,
        clip,
        linear_before_reset,
        input_forget,
    };
    Ok((expand(op), vec![]))
}

impl OnnxRecurrence {
    /// The activations for `dirs` directions: the node's, the forward ones reused for the
    /// reverse direction when only they are given, ONNX's defaults when none are.
    fn activations(&self, dirs: usize) -> TractResult<Vec<Activation>> {
        let k = self.cell.activations();
        let given = if self.activations.is_empty() {
            self.cell.default_activations()
        } else {
            self.activations.clone()
        };
        if given.len() == k * dirs {
            Ok(given)
        } else if given.len() == k {
            Ok(given.iter().cycle().take(k * dirs).copied().collect())
        } else {
            bail!(
                "{} activations given, {} per direction expected for {dirs} direction(s)",
                given.len(),
                k
            )
        }
    }
}

impl Expansion for OnnxRecurrence {
    fn name(&self) -> StaticName {
        self.cell.name().into()
    }

    fn validation(&self) -> Validation {
        Validation::Rounding
    }

    fn nboutputs(&self) -> TractResult<usize> {
        self.common.nboutputs()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> TractResult<()> {
        self.common.rules(s, inputs, outputs)
    }

    fn wire(
        &self,
        prefix: &str,
        target: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let c = &self.common;
        let dirs = target.outlet_fact(inputs[1])?.shape[0]
            .to_usize()
            .context("the number of directions (W's first dim) must be known")?;
        ensure!(
            dirs == self.direction.count(),
            "direction {:?} with weights for {dirs} direction(s)",
            self.direction
        );
        let hidden = target.outlet_fact(inputs[2])?.shape[2]
            .to_usize()
            .context("the hidden size (R's last dim) must be known")?;
        let op = Recurrence {
            cell: self.cell,
            direction: self.direction,
            hidden,
            batch_first: c.batch_first,
            activations: self.activations(dirs)?,
            clip: self.clip,
            linear_before_reset: self.linear_before_reset,
            input_forget: self.input_forget,
            inputs: Inputs {
                bias: c.optional_bias_input.is_some(),
                lengths: c.optional_sequence_lens_input.is_some(),
                initial_h: c.optional_initial_h_input.is_some(),
                initial_c: c.optional_initial_c_input.is_some(),
                peepholes: c.optional_p_input.is_some(),
            },
        };
        let mut wired: TVec<OutletId> = inputs[..3].into();
        for slot in [
            c.optional_bias_input,
            c.optional_sequence_lens_input,
            c.optional_initial_h_input,
            c.optional_initial_c_input,
            c.optional_p_input,
        ]
        .into_iter()
        .flatten()
        {
            wired.push(inputs[slot]);
        }
        let outputs = target.wire_node(prefix, op, &wired)?;
        // The node's outputs, those it names, in ONNX's order: Y, Y_h, Y_c.
        Ok([
            c.optional_y_output,
            c.optional_y_h_output,
            c.optional_y_c_output,
        ]
        .into_iter()
        .zip(outputs.iter())
        .filter_map(|(present, wire)| present.map(|_| *wire))
        .collect())
    }
}
