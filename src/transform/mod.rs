//! The ragged transform: give a model a widths input and make every sample's outputs
//! independent of the batch it is run in.
//!
//! The transform follows the ragged axis from the input through every node, the way
//! tract's `batchify` follows a batch axis, and classifies each op by what it does along
//! the axis (the lexicon of DESIGN.md):
//!
//! - **carried**: maps each position to the same position, or treats the axis as a
//!   batch-like axis (element-wise ops, 1x1 convs, a matmul with the axis as M, layer norm
//!   over channels, transposes, unit-axis reshapes). Nothing to do: garbage in the padded
//!   region stays in the padded region.
//! - **windowed**: reads neighbouring positions (conv or pool with a kernel, a stride or
//!   padding along the axis). The padded region is masked first (0 for a conv, -inf for a
//!   max pool) so that the dense op reads there what a sample alone reads past its edge;
//!   the widths follow the op's arithmetic (`width`).
//! - **reducing**: folds the axis (reductions, global pools, softmax over the axis). The
//!   padded region is masked with the reduction's neutral value, softmax becomes a masked
//!   softmax, and a divisor the model derives from the padded width (a global average's)
//!   is computed per sample instead.
//! - **contracting**: sums over the axis against another operand (attention's P·V).
//!   Both operands are masked to 0 along it.
//! - **recurrent**: a recurrence (LSTM, GRU, RNN) whose sequence is the axis. It takes
//!   each sample's width as its sequence length, so that its state never runs through
//!   the padded region ([`crate::ops::Recurrence`]).
//! - **mixing**: anything else touching the axis (a reshape merging it with another axis,
//!   a resize along it, a concatenation along it, a recurrence reading it as its
//!   features, a `Scan` over it). Refused, naming the node, its op and why: a model the
//!   transform does not understand is an error, never a silently wrong answer.
//!
//! The result has one more input per ragged axis, the samples' widths along it (i64,
//! one per sample), after the model's own, and one more output per distinct width of
//! every output carrying a ragged axis, after the model's own. The padded region of
//! every output is zero.
//!
//! The batch axis is followed too: an op that would fold samples into one another (a
//! reduction over the batch axis) is refused the same way.

use crate::error::{Mixing, Refused};
use tract_core::internal::*;

use crate::spec::RaggedSpec;

pub mod registered;
mod rewrite;
mod rules;
#[doc(hidden)]
pub(crate) mod width;

pub use rewrite::Layout;

/// What an op does along the ragged axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// No input derives from the ragged input: copied as it is.
    Untouched,
    /// Maps each position of the ragged axis to the same position (lexicon: carried).
    Carried,
    /// Reads neighbouring positions: the padding is masked before it.
    Windowed,
    /// Folds the ragged axis: over each sample's own width.
    Reducing,
    /// Sums over the ragged axis against another operand (attention P·V): masked first.
    Contracting,
    /// A value the model computes from the padded width, now computed per sample.
    PerSample,
    /// A recurrence (LSTM, GRU, RNN) over the ragged axis, each sample run to its width.
    Recurrent,
}

/// The classification of one source node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    /// The node's name.
    pub node: String,
    /// Its op's name.
    pub op: String,
    /// What it does along the ragged axis.
    pub class: Class,
}

/// Where the samples lie in one output of the transformed model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputLayout {
    /// The batch axis, `None` for an output that does not depend on the ragged input.
    pub batch: Option<usize>,
    /// Its ragged axes, each with where its widths come out.
    pub ragged: Vec<OutputAxis>,
}

/// A ragged axis of an output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputAxis {
    /// The axis, in the output's shape.
    pub axis: usize,
    /// The model output holding its widths.
    pub widths_output: usize,
    /// The row of the widths table they come from.
    pub row: usize,
}

/// What one of the model's inputs is to a sample, found from the input facts: the ragged
/// input's extents shared by another input make it ragged along the same widths (a text
/// encoder's `attention_mask` beside its `input_ids`), the batch extent alone makes it
/// one value per sample (a recurrent state), neither makes it shared by the batch (a
/// sample rate).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InputRole {
    /// Stacked along axis 0, padded along these axes, each of the widths of `row` (the
    /// ragged input's axis of that row).
    Ragged(TVec<crate::ops::RaggedAxis>),
    /// Stacked along its batch axis (0, or where the model puts it: an ONNX recurrence's
    /// initial state is [directions, N, H]), the same extents for every sample.
    PerSample {
        /// The input's batch axis.
        batch: usize,
    },
    /// Given once for the whole batch, as the model takes it.
    Shared,
}

impl InputRole {
    /// The role of an input of `fact` beside the ragged input of `ragged` (ragged along
    /// `axes`): its axes sized as a ragged axis of the ragged input are ragged there, a
    /// leading axis sized as its batch is the batch axis.
    pub fn of(fact: &TypedFact, ragged: &TypedFact, axes: &[usize]) -> TractResult<InputRole> {
        let batched = fact.rank() >= 1 && fact.shape[0] == ragged.shape[0];
        // Elsewhere than axis 0 (an ONNX recurrence's initial state, [directions, N, H]),
        // the batch is found by its symbol: one axis, of an input not otherwise ragged.
        let elsewhere: Vec<usize> = (1..fact.rank())
            .filter(|a| !ragged.shape[0].symbols().is_empty() && fact.shape[*a] == ragged.shape[0])
            .collect();
        let along: TVec<crate::ops::RaggedAxis> = (1..fact.rank())
            .filter_map(|axis| {
                axes.iter()
                    .position(|a| ragged.shape[*a] == fact.shape[axis])
                    .map(|row| crate::ops::RaggedAxis { axis, row })
            })
            .collect();
        let symbols_of_widths: Vec<Symbol> = axes
            .iter()
            .flat_map(|a| ragged.shape[*a].symbols())
            .collect();
        let sized_by_widths = fact
            .shape
            .iter()
            .any(|d| d.symbols().iter().any(|s| symbols_of_widths.contains(s)));
        if !batched && !elsewhere.is_empty() {
            ensure!(
                elsewhere.len() == 1 && along.is_empty() && !sized_by_widths,
                "its axes {elsewhere:?} are sized as the batch ({}), with extents {:?}: an \
                 input given per sample has one batch axis, and only with it on axis 0 may \
                 it be ragged",
                ragged.shape[0],
                fact.shape
            );
            return Ok(InputRole::PerSample {
                batch: elsewhere[0],
            });
        }
        ensure!(
            elsewhere.is_empty(),
            "its axes 0 and {elsewhere:?} are all sized as the batch ({}): which one holds \
             the samples is ambiguous",
            ragged.shape[0]
        );
        match (batched, along.is_empty()) {
            (true, false) => Ok(InputRole::Ragged(along)),
            (true, true) => {
                ensure!(
                    !sized_by_widths,
                    "its extents {:?} depend on the ragged input's widths other than as one of \
                     them",
                    fact.shape
                );
                Ok(InputRole::PerSample { batch: 0 })
            }
            (false, _) => {
                ensure!(
                    !sized_by_widths,
                    "it is sized by the ragged input's widths ({:?}) but has no batch axis \
                     sized as the ragged input's ({}) first",
                    fact.shape,
                    ragged.shape[0]
                );
                Ok(InputRole::Shared)
            }
        }
    }
}

/// A model through the ragged transform, with what the transform found.
#[derive(Clone, Debug)]
pub struct Ragged {
    /// The transformed model: the original's inputs, then one widths input per ragged axis; its outputs, then the widths of each ragged output.
    pub model: TypedModel,
    /// The ragged input and axes it was transformed along.
    pub spec: RaggedSpec,
    /// The ragged input's position among the inputs (the widths inputs are last).
    pub input: usize,
    /// Where the samples lie in each of the model's own outputs.
    pub outputs: Vec<OutputLayout>,
    /// What the transform made of each node of the original model.
    pub report: Vec<NodeReport>,
    /// Per ragged axis of the input: the multiple its widths must be (1: any), and why
    /// (the input fact says so, or differently strided feature maps meet at a node).
    pub alignment: TVec<(u64, Option<String>)>,
    /// What each of the model's inputs is to a sample (the ragged input's among them).
    pub roles: Vec<InputRole>,
    /// The nodes that reduce over the batch axis and others: each sample now gets its
    /// own reduction, as alone, where the model on a batch would fold its samples
    /// together (so the transformed model no longer computes the model's value on a batch
    /// of several, full widths or not).
    pub batch_reductions: Vec<String>,
}

/// Runs the ragged transform on `model`.
pub fn ragged(model: &TypedModel, spec: &RaggedSpec) -> TractResult<Ragged> {
    ragged_with(model, spec, None)
}

/// [`ragged`], with the roles of the model's inputs given rather than found from its
/// facts: a model typed at a concrete shape cannot tell its batch axis by its symbol
/// (at batch 2, a state of `[2, N, 128]` reads `[2, 2, 128]`), so a model typed per shape
/// takes the roles its symbolic facts give ([`InputRole::of`] on them).
pub fn ragged_with(
    model: &TypedModel,
    spec: &RaggedSpec,
    roles: Option<&[InputRole]>,
) -> TractResult<Ragged> {
    let input = spec.check(model)?;
    let mut rw = rewrite::Rewriter::new(model, input, &spec.axes, roles)?;
    for id in model.eval_order()? {
        let node = model.node(id);
        if model.input_outlets()?.contains(&OutletId::new(id, 0)) {
            continue;
        }
        rules::rewrite_node(&mut rw, node).map_err(|e| at_node(e, node))?;
    }
    let alignment = rw.alignment.clone();
    let roles = rw.roles.clone();
    let batch_reductions = rw.batch_reductions.clone();
    let (mut target, outputs, report) = rw.finish()?;
    target.refresh_output_facts()?;
    Ok(Ragged {
        model: target,
        spec: spec.clone(),
        input,
        outputs,
        report,
        alignment,
        roles,
        batch_reductions,
    })
}

/// `error`, from the rule for `node`, said at that node: a [`Refused`] naming it where the
/// rule refused the op ([`Mixing`]), the node as context otherwise.
fn at_node(error: TractError, node: &TypedNode) -> TractError {
    let (id, name, op) = (node.id, node.name.clone(), node.op.name().to_string());
    match error.downcast_ref::<Mixing>().map(|m| m.0.clone()) {
        Some(reason) => error.context(Refused {
            id,
            node: name,
            op,
            reason,
        }),
        None => error.context(format!("Ragged transform: node #{id} {name:?} ({op})")),
    }
}

pub use registered::{RaggedConfig, RaggedTransform, Widths};
