//! The rewrite: a new model, wired node by node from the source in evaluation order,
//! following the sample axes from the ragged input.
//!
//! The [`Rewriter`] holds what the rules share: the target model under construction, the
//! source-to-target outlet mapping, the [`Layout`] of every target tensor derived from
//! the ragged input (where its batch and ragged axes are, and what its padded region is
//! known to hold), the width functions (the rows of the widths table), and the masks
//! already wired, so that two consumers needing the same mask share it.

use tract_core::internal::*;
use tract_core::ops::source::TypedSource;

use super::width::WidthFn;
use super::{Class, InputRole, NodeReport, OutputAxis, OutputLayout};
use crate::error::Mixing;
use crate::ops::{EdgeFill, Fill, Mask, RaggedAxis, SampleAxes, WidthTable, table_fact};
use crate::spec::Extent;

/// What the transform knows of a tensor derived from the ragged input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Where the batch and the ragged axes lie in the tensor.
    pub axes: SampleAxes,
    /// What the padded region holds (a scalar of the tensor's type), when a mask or a
    /// masked op wrote it.
    pub fill: Option<Arc<Tensor>>,
}

impl Layout {
    /// A tensor of these axes whose padded region holds nothing known.
    pub fn new(axes: SampleAxes) -> Layout {
        Layout { axes, fill: None }
    }
}

pub struct Rewriter<'a> {
    pub source: &'a TypedModel,
    pub target: TypedModel,
    mapping: HashMap<OutletId, OutletId>,
    layouts: HashMap<OutletId, Layout>,
    pub rows: Vec<WidthFn>,
    masks: HashMap<(OutletId, Arc<Tensor>), OutletId>,
    /// The model's input widths, `[N]` i64, one input per ragged axis of the input.
    pub widths: TVec<OutletId>,
    /// The widths table, `[K, N]` i64.
    pub table: OutletId,
    /// How the input fact sizes each ragged axis of the input (a multiple of a symbol in
    /// a symbolic model), in the order of the widths inputs.
    pub extents: TVec<Extent>,
    /// Per ragged axis of the input: the multiple its widths must be (1: any), and why.
    pub alignment: TVec<(u64, Option<String>)>,
    /// Tensors holding extents computed from the padded shape (a resize's sizes): read as
    /// sizes only.
    pub shape_values: std::collections::HashSet<OutletId>,
    /// Sums over ragged axes of concrete extents (a model typed per shape): what a mean
    /// must then divide by, per sample.
    pub sums: HashMap<OutletId, Summed>,
    /// Tensors of no sample, sized by the padded extent along some axes, whose value at a
    /// position does not depend on that extent (positions `0..L` from a `Range`, a
    /// constant cut to `L`): what a sample alone holds is their prefix of its width. They
    /// broadcast over the batch where they meet the samples' tensors (position
    /// embeddings), and are refused anywhere else. Their axes and the rows of their
    /// extents.
    pub prefixes: HashMap<OutletId, TVec<RaggedAxis>>,
    /// Other tensors of no sample computed from the padded extents (masks, relative
    /// positions), wired as the model computes them and checked where they meet the
    /// samples' tensors (`rules::prefix::settle`): the target wire, and the source outlet
    /// it computes.
    pub pending: HashMap<OutletId, OutletId>,
    /// The padded extent of each ragged axis of the input, as the input fact sizes it.
    pub source_extents: TVec<TDim>,
    /// The input fact's batch extent, and its symbols.
    pub batch_extent: TDim,
    pub batch_symbols: TVec<Symbol>,
    /// What each of the model's inputs is to a sample.
    pub roles: Vec<InputRole>,
    /// The nodes reducing over the batch axis and others, now each sample's own.
    pub batch_reductions: Vec<String>,
    pub report: Vec<NodeReport>,
}

/// A sum over ragged axes whose extents are numbers: the rows of the reduced ragged axes,
/// the product of the other reduced extents, and the padded count of cells reduced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summed {
    pub rows: TVec<usize>,
    pub fixed: u64,
    pub padded: u64,
}

impl<'a> Rewriter<'a> {
    /// Starts the target with the source's inputs, the widths inputs after them (one per
    /// ragged axis), and the widths table computed from them.
    pub fn new(
        source: &'a TypedModel,
        ragged_input: usize,
        axes: &[usize],
        given_roles: Option<&[InputRole]>,
    ) -> TractResult<Rewriter<'a>> {
        let mut target = TypedModel {
            symbols: source.symbols.clone(),
            ..TypedModel::default()
        };
        let mut mapping = HashMap::default();
        let mut layouts = HashMap::default();
        let inputs = source.input_outlets()?.to_vec();
        let ragged_outlet = inputs[ragged_input];
        let fact = source.outlet_fact(ragged_outlet)?;
        let mut roles = vec![];
        for (ix, outlet) in inputs.iter().enumerate() {
            let node = source.node(outlet.node);
            let source_op = node
                .op_as::<TypedSource>()
                .context("model input is not a source")?
                .clone();
            let wire = target.wire_node(&node.name, source_op, &[])?[0];
            mapping.insert(*outlet, wire);
            let role = if ix == ragged_input {
                InputRole::Ragged(
                    axes.iter()
                        .enumerate()
                        .map(|(row, &axis)| RaggedAxis { axis, row })
                        .collect(),
                )
            } else if let Some(role) = given_roles.and_then(|r| r.get(ix)) {
                role.clone()
            } else {
                InputRole::of(source.outlet_fact(*outlet)?, fact, axes)
                    .with_context(|| format!("input {:?}", node.name))?
            };
            match &role {
                InputRole::Ragged(ragged) => {
                    // An extent the input fact fixes is every sample's (they are checked
                    // against the fact): nothing is padded there, and what the model
                    // lines up along it (a table of positions added whole, windows of a
                    // fixed grid) lines up with each sample as alone. Not ragged, then.
                    // (A model typed per shape, its roles given, has every extent
                    // concrete: its ragged axes stay.)
                    let input_fact = source.outlet_fact(*outlet)?;
                    let fixed = |axis: usize| {
                        given_roles.is_none() && input_fact.shape[axis].as_i64().is_some()
                    };
                    let axes = SampleAxes {
                        batch: 0,
                        ragged: ragged.iter().filter(|r| !fixed(r.axis)).cloned().collect(),
                    };
                    layouts.insert(wire, Layout::new(axes));
                }
                InputRole::PerSample { batch } => {
                    let axes = SampleAxes {
                        batch: *batch,
                        ragged: tvec!(),
                    };
                    layouts.insert(wire, Layout::new(axes));
                }
                InputRole::Shared => (),
            }
            roles.push(role);
        }
        let input_name = &source.node(ragged_outlet.node).name;
        let n = fact.shape[0].clone();
        let mut widths = tvec!();
        let mut extents: TVec<Extent> = tvec!();
        for &axis in axes {
            let name = if axes.len() == 1 {
                format!("{input_name}.widths")
            } else {
                format!("{input_name}.widths.{axis}")
            };
            widths.push(target.add_source(name, i64::fact([n.clone()]))?);
            extents.push(Extent::of(&fact.shape[axis], axis, input_name)?);
        }
        let table = target.wire_node(
            format!("{input_name}.widths_table"),
            WidthTable {
                fns: vec![],
                emit: vec![],
            },
            &widths,
        )?[0];
        Ok(Rewriter {
            source,
            target,
            mapping,
            layouts,
            rows: (0..axes.len()).map(WidthFn::of_source).collect(),
            masks: HashMap::default(),
            alignment: extents
                .iter()
                .map(|e| match e.multiple() {
                    1 => (1, None),
                    m => (
                        m,
                        Some(format!(
                            "the input fact sizes the axis as {m}*{}",
                            e.symbol().map(|s| s.to_string()).unwrap_or_default()
                        )),
                    ),
                })
                .collect(),
            shape_values: Default::default(),
            sums: HashMap::default(),
            prefixes: HashMap::default(),
            pending: HashMap::default(),
            source_extents: axes.iter().map(|a| fact.shape[*a].clone()).collect(),
            roles,
            batch_reductions: vec![],
            batch_extent: fact.shape[0].clone(),
            batch_symbols: fact.shape[0].symbols().into_iter().collect(),
            widths,
            table,
            extents,
            report: vec![],
        })
    }

    /// Widths along the input's ragged axis `source` must be multiples of `multiple`,
    /// for `why`.
    pub fn align(&mut self, source: usize, multiple: u64, why: &str) {
        let entry = &mut self.alignment[source];
        if !entry.0.is_multiple_of(multiple) {
            *entry = (
                entry.0 / gcd(entry.0, multiple) * multiple,
                Some(why.to_string()),
            );
        }
    }

    /// Tensors of widths `rows[a]` and `rows[b]` meet in `node` (an addition, a
    /// concatenation along another axis): fine when the widths are the same, or the same
    /// for inputs sized in multiples of some alignment, which samples must then be.
    pub fn meet(&mut self, a: usize, b: usize, node: &str) -> TractResult<()> {
        let (f, g) = (&self.rows[a], &self.rows[b]);
        match f.agreement(g) {
            Some(1) => Ok(()),
            Some(m) => {
                let source = f.source;
                let why = format!("its feature maps of different strides meet at node {node}");
                self.align(source, m, &why);
                Ok(())
            }
            None => bail!(Mixing(format!(
                "two inputs of different widths ({f} and {g}) meet along a ragged \
                 axis, whatever the samples' sizes"
            ))),
        }
    }

    /// Whether `dim` depends on the extent of a ragged axis of the input (its symbol).
    pub fn depends_on_ragged(&self, dim: &TDim) -> bool {
        let used = dim.symbols();
        self.extents
            .iter()
            .filter_map(|e| e.symbol())
            .any(|s| used.contains(s))
    }

    /// The row of the ragged axis of the input whose padded extent `dim` is, if it is one.
    pub fn row_of_extent(&self, dim: &TDim) -> Option<usize> {
        self.source_extents.iter().position(|e| e == dim)
    }

    /// The row of a ragged axis of extent `dim` among the tensors laid out so far (a
    /// feature map's length, `(W+15)/16`, which no input has).
    pub fn row_of_laid_out_extent(&self, dim: &TDim) -> Option<usize> {
        let mut rows = self.layouts.iter().filter_map(|(outlet, layout)| {
            let fact = self.target.outlet_fact(*outlet).ok()?;
            layout
                .axes
                .ragged
                .iter()
                .find(|r| fact.shape.get(r.axis) == Some(dim))
                .map(|r| r.row)
        });
        // The smallest, whichever order the layouts are kept in.
        rows.next().map(|first| rows.fold(first, usize::min))
    }

    pub fn mapped(&self, outlet: OutletId) -> TractResult<OutletId> {
        self.mapping
            .get(&outlet)
            .copied()
            .with_context(|| format!("{outlet:?} not wired yet"))
    }

    pub fn map(&mut self, source: OutletId, target: OutletId) {
        self.mapping.insert(source, target);
    }

    pub fn layout(&self, outlet: OutletId) -> Option<&Layout> {
        self.layouts.get(&outlet)
    }

    pub fn set_layout(&mut self, outlet: OutletId, layout: Layout) {
        self.layouts.insert(outlet, layout);
    }

    pub fn fact(&self, outlet: OutletId) -> TractResult<&TypedFact> {
        self.target.outlet_fact(outlet)
    }

    /// The row of the widths table holding `f`, added if no row computes the same widths.
    pub fn row_for(&mut self, f: WidthFn) -> usize {
        if let Some(row) = self.rows.iter().position(|r| r.same_as(&f)) {
            return row;
        }
        self.rows.push(f);
        self.rows.len() - 1
    }

    /// `outlet` with its padded region holding `fill`: as it is when it does already, else
    /// through a mask, shared by every consumer asking for the same fill.
    pub fn masked(&mut self, outlet: OutletId, fill: Fill) -> TractResult<OutletId> {
        let dt = self.fact(outlet)?.datum_type;
        self.masked_with(outlet, fill.scalar(dt)?)
    }

    /// `outlet` with its padded region holding `value`, a scalar of its type.
    pub fn masked_with(&mut self, outlet: OutletId, value: Arc<Tensor>) -> TractResult<OutletId> {
        let layout = self
            .layout(outlet)
            .context("masking a tensor with no sample axes")?
            .clone();
        if layout.axes.ragged.is_empty() || layout.fill.as_ref() == Some(&value) {
            return Ok(outlet);
        }
        if let Some(masked) = self.masks.get(&(outlet, value.clone())) {
            return Ok(*masked);
        }
        let mask = Mask {
            axes: layout.axes.clone(),
            fill: value.clone(),
        };
        let name = format!("{}.ragged_mask", self.target.node(outlet.node).name);
        let name = self.unique_name(&name);
        let wire = self.target.wire_node(name, mask, &[outlet, self.table])?[0];
        self.set_layout(
            wire,
            Layout {
                axes: layout.axes,
                fill: Some(value.clone()),
            },
        );
        self.masks.insert((outlet, value), wire);
        Ok(wire)
    }

    /// `outlet` with each sample's last valid value over its padded region along the
    /// ragged axes `along`, or its values mirrored about it (`reflect`) ([`EdgeFill`]).
    pub fn edge_filled(
        &mut self,
        outlet: OutletId,
        along: &[usize],
        reflect: bool,
    ) -> TractResult<OutletId> {
        let layout = self
            .layout(outlet)
            .context("extending a tensor with no sample axes")?
            .clone();
        let name = format!("{}.ragged_edge", self.target.node(outlet.node).name);
        let name = self.unique_name(&name);
        let op = EdgeFill {
            axes: layout.axes.clone(),
            along: along.into(),
            reflect,
        };
        let wire = self.target.wire_node(name, op, &[outlet, self.table])?[0];
        self.set_layout(wire, Layout::new(layout.axes));
        Ok(wire)
    }

    /// A node name not taken yet in the target.
    pub fn unique_name(&self, name: &str) -> String {
        if self.target.nodes().iter().all(|n| n.name != name) {
            return name.to_string();
        }
        (1..)
            .map(|i| format!("{name}.{i}"))
            .find(|n| self.target.nodes().iter().all(|x| x.name != *n))
            .unwrap_or_default()
    }

    pub fn record(&mut self, node: &TypedNode, class: Class) {
        self.report.push(NodeReport {
            node: node.name.clone(),
            op: node.op.name().to_string(),
            class,
        });
    }

    /// Closes the target: every ragged output masked to zero past the widths, one widths
    /// output per distinct width of each ragged output, the widths table sized.
    ///
    /// The widths outputs come straight out of the widths table op, on the host: a runtime
    /// putting the model on a device has nothing to bring back for them.
    pub fn finish(mut self) -> TractResult<(TypedModel, Vec<OutputLayout>, Vec<NodeReport>)> {
        let mut outputs = vec![];
        let mut layouts = vec![];
        let mut emit: Vec<usize> = vec![];
        let mut widths_names: Vec<String> = vec![];
        for outlet in self.source.output_outlets()?.iter() {
            let wire = self.mapped(*outlet)?;
            let label = self
                .source
                .outlet_label(*outlet)
                .map(|s| s.to_string())
                .unwrap_or_else(|| self.source.node(outlet.node).name.clone());
            let Some(layout) = self.layout(wire).cloned() else {
                ensure!(
                    !self.pending.contains_key(&wire) && !self.prefixes.contains_key(&wire),
                    "output {label:?} is computed from the padded extents alone, reading no \
                     sample: its value in a batch is not any sample's"
                );
                outputs.push(wire);
                layouts.push(OutputLayout {
                    batch: None,
                    ragged: vec![],
                });
                continue;
            };
            let wire = self.masked(wire, Fill::Zero)?;
            outputs.push(wire);
            let mut ragged = vec![];
            let mut rows: Vec<(usize, usize)> = vec![];
            for r in &layout.axes.ragged {
                let widths_output = match rows.iter().find(|(row, _)| *row == r.row) {
                    Some((_, out)) => *out,
                    None => {
                        emit.push(r.row);
                        widths_names.push(self.unique_name(&format!("{label}.widths")));
                        rows.push((r.row, emit.len() - 1));
                        emit.len() - 1
                    }
                };
                ragged.push(OutputAxis {
                    axis: r.axis,
                    widths_output,
                    row: r.row,
                });
            }
            layouts.push(OutputLayout {
                batch: Some(layout.axes.batch),
                ragged,
            });
        }
        // The table's rows are all known now: size it, and give it one output per
        // emitted row.
        let n = self.fact(self.widths[0])?.shape[0].clone();
        let table_node = self.target.node_mut(self.table.node);
        table_node.op = Box::new(WidthTable {
            fns: self.rows.clone(),
            emit: emit.clone(),
        });
        table_node.outputs[0].fact = table_fact(self.rows.len(), n.clone());
        for _ in &emit {
            table_node.outputs.push(Outlet {
                fact: i64::fact([n.clone()]),
                successors: tvec!(),
            });
        }
        let widths_outputs: Vec<(OutletId, String)> = widths_names
            .into_iter()
            .enumerate()
            .map(|(ix, name)| (OutletId::new(self.table.node, 1 + ix), name))
            .collect();
        let first_widths = outputs.len();
        for layout in &mut layouts {
            for axis in &mut layout.ragged {
                axis.widths_output += first_widths;
            }
        }
        for (wire, name) in &widths_outputs {
            self.target.set_outlet_label(*wire, name.clone())?;
            outputs.push(*wire);
        }
        for (outlet, wire) in self.source.output_outlets()?.iter().zip(outputs.iter()) {
            if let Some(label) = self.source.outlet_label(*outlet) {
                self.target.set_outlet_label(*wire, label.to_string())?;
            }
        }
        let mut inputs: Vec<OutletId> = self
            .source
            .input_outlets()?
            .iter()
            .map(|i| self.mapping[i])
            .collect();
        inputs.extend(self.widths.iter().copied());
        self.target.set_input_outlets(&inputs)?;
        self.target.select_output_outlets(&outputs)?;
        self.target.properties.clone_from(&self.source.properties);
        Ok((self.target, layouts, self.report))
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}
