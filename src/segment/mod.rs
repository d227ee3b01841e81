//! Segments: a model too large for tract's optimizer to prepare in one piece, cut into
//! consecutive segments that are prepared (or decluttered) apart.
//!
//! Why: tract 0.23.9's optimizer is superlinear in a model's nodes. Its codegen and fuse
//! passes apply one patch per node and each patch looks for a duplicate of the nodes it
//! adds among all the model's nodes; its split pushdown compares every pair of successors
//! of an outlet (benches/NOTES.md: a plan for a chain of 5000 nodes takes 30 s, plain
//! tract alike). Cut into segments of at most [`TRACT_RAGGED_SEGMENT`] nodes, a model
//! prepares in time linear in its size: each segment costs what a model of that size
//! costs.
//!
//! The words:
//! - a **segment** is a run of consecutive nodes of the model's evaluation order, made a
//!   model of its own: a source for each value it reads from before it, an output for
//!   each value read after it (or that the model outputs);
//! - a **wire** is a value passed between segments: the model's inputs, then each
//!   segment's outputs, numbered in that order;
//! - a **cut** is where one segment ends and the next begins. Cuts go where the fewest
//!   values cross, within the second half of a segment's allowance: between the layers
//!   of a deep network, one or two values.
//!
//! The contract: a segmented plan computes what the whole model computes, with the same
//! ops on the same values; only a fusion across a cut is lost (rounding, within the
//! contract's few ULP). Constants are copied into each segment that reads them (the
//! tensor is shared, not duplicated), and so is a value the model knows to be constant:
//! what the optimizer folds inside a segment stays folded. On a device runtime, a value
//! crossing a cut stays on the device: tract-gpu hands a device output to the next plan
//! as it is (`LazyHostStorage`).
//!
//! A model is cut only when it holds more than [`CUT_ABOVE`] segments' worth of nodes
//! (2048 by default): below that one plan prepares in a few seconds and keeps every
//! fusion.

use std::collections::HashSet;

use tract_core::declare_knob;
use tract_core::internal::*;
use tract_core::ops::konst::Const;
use tract_core::ops::source::TypedSource;

mod plan;

pub use plan::{SegmentedPlan, count, prepare, prepare_with_options};

declare_knob!(
    scopable TRACT_RAGGED_SEGMENT,
    usize,
    512,
    "tract-ragged: the most nodes of one segment when a model too large for tract's optimizer is prepared in segments (0: never cut)."
);

/// A model is cut only when it has more than this many segments' worth of nodes.
pub const CUT_ABOVE: usize = 4;

/// Where a value comes from: a wire, or a constant the plan holds.
#[derive(Clone, Debug)]
enum Wire {
    Value(usize),
    Const(Arc<Tensor>),
}

/// One segment: its model, the wires its inputs read, the wires its outputs make.
#[derive(Clone, Debug)]
struct Piece<M> {
    model: M,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    /// Wires no later segment nor the outputs read: dropped once this one has run.
    last_readers_of: Vec<usize>,
}

/// A model cut into segments.
#[derive(Clone, Debug)]
pub struct Segments<M> {
    pieces: Vec<Piece<M>>,
    inputs: usize,
    outputs: Vec<Wire>,
    wires: usize,
}

impl Segments<TypedModel> {
    /// `model` cut into segments of at most `max_nodes` nodes (constants and sources not
    /// counted), or `None` when it has no more than [`CUT_ABOVE`] segments' worth.
    pub fn cut(model: &TypedModel, max_nodes: usize) -> TractResult<Option<Self>> {
        if max_nodes == 0 {
            return Ok(None);
        }
        let order = model.eval_order()?;
        let body: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&n| !is_copied(model, n) && !model.node(n).op_is::<TypedSource>())
            .collect();
        if body.len() <= max_nodes.saturating_mul(CUT_ABOVE) {
            return Ok(None);
        }
        let mut position = vec![usize::MAX; model.nodes().len()];
        for (p, &n) in body.iter().enumerate() {
            position[n] = p;
        }
        let ranges = ranges(model, &body, &position, max_nodes)?;
        let mut segment_of = vec![usize::MAX; model.nodes().len()];
        for (s, r) in ranges.iter().enumerate() {
            for &n in &body[r.clone()] {
                segment_of[n] = s;
            }
        }
        let model_outputs: HashSet<OutletId> = model.outputs.iter().copied().collect();
        let mut wire_of: HashMap<OutletId, usize> = HashMap::default();
        for (ix, input) in model.inputs.iter().enumerate() {
            wire_of.insert(*input, ix);
        }
        let mut wires = model.inputs.len();
        let mut pieces = vec![];
        for (s, r) in ranges.iter().enumerate() {
            let mut piece = TypedModel {
                symbols: model.symbols.clone(),
                ..TypedModel::default()
            };
            let mut names: HashSet<String> = HashSet::new();
            let mut mapping: HashMap<OutletId, OutletId> = HashMap::default();
            let mut inputs = vec![];
            for &n in &body[r.clone()] {
                let node = model.node(n);
                for input in &node.inputs {
                    if mapping.contains_key(input) {
                        continue;
                    }
                    let fact = model.outlet_fact(*input)?;
                    let producer = model.node(input.node);
                    let outlet = if let Some(konst) = constant(model, *input)? {
                        let name = unique(&mut names, &producer.name, input.slot);
                        piece.add_const(name, konst)?
                    } else {
                        let wire = *wire_of.get(input).with_context(|| {
                            format!(
                                "Cutting the model: node #{n} reads a value made nowhere before it"
                            )
                        })?;
                        let name = unique(&mut names, &producer.name, input.slot);
                        inputs.push(wire);
                        piece.add_source(name, fact.without_value())?
                    };
                    mapping.insert(*input, outlet);
                }
                names.insert(node.name.clone());
                let facts = node.outputs.iter().map(|o| o.fact.clone()).collect();
                let id = piece.add_node(node.name.clone(), node.op.clone(), facts)?;
                for (ix, input) in node.inputs.iter().enumerate() {
                    piece.add_edge(mapping[input], InletId::new(id, ix))?;
                }
                for slot in 0..node.outputs.len() {
                    mapping.insert(OutletId::new(n, slot), OutletId::new(id, slot));
                }
            }
            // What this segment makes that a later one, or the model, reads.
            let mut outputs = vec![];
            let mut outlets = vec![];
            for &n in &body[r.clone()] {
                for (slot, output) in model.node(n).outputs.iter().enumerate() {
                    let outlet = OutletId::new(n, slot);
                    let read_later = output.fact.konst.is_none()
                        && output.successors.iter().any(|succ| {
                            segment_of[succ.node] != usize::MAX && segment_of[succ.node] > s
                        });
                    if read_later || model_outputs.contains(&outlet) {
                        outlets.push(mapping[&outlet]);
                        outputs.push(wires);
                        wire_of.insert(outlet, wires);
                        wires += 1;
                    }
                }
            }
            piece.select_output_outlets(&outlets)?;
            pieces.push(Piece {
                model: piece,
                inputs,
                outputs,
                last_readers_of: vec![],
            });
        }
        let mut outputs = vec![];
        for outlet in &model.outputs {
            outputs.push(match constant(model, *outlet)? {
                Some(konst) if !wire_of.contains_key(outlet) => Wire::Const(konst),
                _ => Wire::Value(*wire_of.get(outlet).with_context(|| {
                    format!("Cutting the model: output {outlet:?} is made nowhere")
                })?),
            });
        }
        let mut segments = Segments {
            pieces,
            inputs: model.inputs.len(),
            outputs,
            wires,
        };
        segments.note_last_readers();
        Ok(Some(segments))
    }

    /// The segments joined back into one model (after each was decluttered, say): the
    /// model's inputs, then each segment's nodes, its sources wired to what feeds them.
    pub fn join(&self, like: &TypedModel) -> TractResult<TypedModel> {
        let mut model = TypedModel {
            symbols: like.symbols.clone(),
            properties: like.properties.clone(),
            ..TypedModel::default()
        };
        let mut wires: Vec<Option<OutletId>> = vec![None; self.wires];
        // A constant copied into several segments is there once per segment.
        let mut names: HashSet<String> = HashSet::new();
        for (ix, input) in like.inputs.iter().enumerate() {
            let node = like.node(input.node);
            names.insert(node.name.clone());
            wires[ix] =
                Some(model.add_source(node.name.clone(), like.outlet_fact(*input)?.clone())?);
        }
        for piece in &self.pieces {
            let m = &piece.model;
            let mut mapping: HashMap<OutletId, OutletId> = HashMap::default();
            for (input, wire) in m.inputs.iter().zip(&piece.inputs) {
                mapping.insert(
                    *input,
                    wires[*wire].context("a segment reads a wire not made yet")?,
                );
            }
            for n in m.eval_order()? {
                let node = m.node(n);
                if node.op_is::<TypedSource>() {
                    continue;
                }
                let facts = node.outputs.iter().map(|o| o.fact.clone()).collect();
                let name = unique(&mut names, &node.name, 0);
                let id = model.add_node(name, node.op.clone(), facts)?;
                for (ix, input) in node.inputs.iter().enumerate() {
                    model.add_edge(mapping[input], InletId::new(id, ix))?;
                }
                for slot in 0..node.outputs.len() {
                    mapping.insert(OutletId::new(n, slot), OutletId::new(id, slot));
                }
            }
            for (outlet, wire) in m.outputs.iter().zip(&piece.outputs) {
                wires[*wire] = Some(mapping[outlet]);
            }
        }
        let mut outputs = vec![];
        for (ix, output) in self.outputs.iter().enumerate() {
            outputs.push(match output {
                Wire::Value(w) => wires[*w].context("an output wire is made nowhere")?,
                Wire::Const(k) => {
                    let name = unique(&mut names, &format!("output.{ix}"), 0);
                    model.add_const(name, k.clone())?
                }
            });
        }
        model.select_output_outlets(&outputs)?;
        Ok(model)
    }

    /// Each segment's model through `f` (declutter, prepare on a runtime).
    pub fn map<M>(
        self,
        mut f: impl FnMut(TypedModel) -> TractResult<M>,
    ) -> TractResult<Segments<M>> {
        let count = self.pieces.len();
        let mut pieces = Vec::with_capacity(count);
        for (ix, piece) in self.pieces.into_iter().enumerate() {
            let model = f(piece.model).with_context(|| format!("Segment {} of {count}", ix + 1))?;
            pieces.push(Piece {
                model,
                inputs: piece.inputs,
                outputs: piece.outputs,
                last_readers_of: piece.last_readers_of,
            });
        }
        Ok(Segments {
            pieces,
            inputs: self.inputs,
            outputs: self.outputs,
            wires: self.wires,
        })
    }

    /// Each segment decluttered apart, joined back: what `declutter` gives on the whole
    /// model, in time linear in its size.
    pub fn declutter(model: &mut TypedModel) -> TractResult<()> {
        match Segments::cut(model, TRACT_RAGGED_SEGMENT.get())? {
            None => model.declutter(),
            Some(segments) => {
                let joined = segments
                    .map(|mut m| {
                        m.declutter()?;
                        Ok(m)
                    })?
                    .join(model)?;
                *model = joined;
                Ok(())
            }
        }
    }
}

impl<M> Segments<M> {
    /// How many segments.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The segments' models, in order.
    pub fn models(&self) -> impl Iterator<Item = &M> {
        self.pieces.iter().map(|p| &p.model)
    }

    fn note_last_readers(&mut self) {
        let mut last = vec![None; self.wires];
        for (ix, piece) in self.pieces.iter().enumerate() {
            for w in &piece.inputs {
                last[*w] = Some(ix);
            }
        }
        for output in &self.outputs {
            if let Wire::Value(w) = output {
                last[*w] = None;
            }
        }
        for (w, reader) in last.into_iter().enumerate() {
            if let Some(ix) = reader {
                self.pieces[ix].last_readers_of.push(w);
            }
        }
    }
}

/// Whether node `n` is copied into each segment that reads it rather than being part of
/// one: a constant.
fn is_copied(model: &TypedModel, n: usize) -> bool {
    model.node(n).op_is::<Const>()
}

/// The value of `outlet` when the model knows it (a constant, or a folded fact).
fn constant(model: &TypedModel, outlet: OutletId) -> TractResult<Option<Arc<Tensor>>> {
    if let Some(k) = model.node(outlet.node).op_as::<Const>() {
        return Ok(Some(k.val().clone()));
    }
    Ok(model.outlet_fact(outlet)?.konst.clone())
}

/// A node name for the source (or copied constant) standing for `producer`'s output
/// `slot` inside a segment, unique there.
fn unique(names: &mut HashSet<String>, producer: &str, slot: usize) -> String {
    let mut name = if slot == 0 {
        producer.to_string()
    } else {
        format!("{producer}.{slot}")
    };
    let mut i = 1;
    while names.contains(&name) {
        name = format!("{producer}.{slot}#{i}");
        i += 1;
    }
    names.insert(name.clone());
    name
}

/// Consecutive ranges of `body` (positions in evaluation order), each of at most
/// `max_nodes`, cut where the fewest values cross within the second half of each range.
fn ranges(
    model: &TypedModel,
    body: &[usize],
    position: &[usize],
    max_nodes: usize,
) -> TractResult<Vec<std::ops::Range<usize>>> {
    // crossing[c]: values made before position c and read at c or after.
    let mut delta = vec![0i64; body.len() + 2];
    let outputs: HashSet<OutletId> = model.outputs.iter().copied().collect();
    for (p, &n) in body.iter().enumerate() {
        for (slot, output) in model.node(n).outputs.iter().enumerate() {
            if output.fact.konst.is_some() {
                continue;
            }
            let mut last = output
                .successors
                .iter()
                .map(|s| position[s.node])
                .filter(|&q| q != usize::MAX)
                .max();
            if outputs.contains(&OutletId::new(n, slot)) {
                last = Some(body.len());
            }
            if let Some(last) = last.filter(|&l| l > p) {
                delta[p + 1] += 1;
                delta[last + 1] -= 1;
            }
        }
    }
    let mut crossing = vec![0i64; body.len() + 1];
    let mut live = 0;
    for (c, d) in delta.iter().take(body.len() + 1).enumerate() {
        live += d;
        crossing[c] = live;
    }
    let mut ranges = vec![];
    let mut start = 0;
    while body.len() - start > max_nodes {
        let lo = start + max_nodes.div_ceil(2).max(1);
        let hi = start + max_nodes;
        let cut = (lo..=hi)
            .rev()
            .min_by_key(|&c| crossing[c])
            .context("empty cut range")?;
        ranges.push(start..cut);
        start = cut;
    }
    ranges.push(start..body.len());
    Ok(ranges)
}
