//! Loading ONNX models so that one typed model, symbolic in the batch and the width,
//! serves every batch.
//!
//! Exports often compute a reshape's target shape at run time from the input's shape.
//! PaddlePaddle's does it as `Shape -> Cast(int32) -> Slice -> Cast(int64) -> Concat`,
//! and tract's symbolic shapes (TDim) survive casts to int64 but not to int32: typing
//! PP-OCRv4 rec with a symbolic width fails with "shape input is variable" at
//! p2o.Reshape.67. Shape values are never large enough for the width of the cast to
//! matter, so [`widen_shape_casts`] turns those int32 casts, and only those (casts of a
//! value computed from a Shape op), into int64 casts before tract reads the graph. The
//! model then types as `[N,3,48,W] -> [N,(W+3)/8,6625]`.
//!
//! The shapes a graph declares for its intermediate values are dropped before tract reads
//! them (`forget_intermediate_shapes`): torch's dynamo exporter writes them over its
//! own symbols and literal 1s, which contradict the facts the model is typed with.
//!
//! ONNX's recurrences (LSTM, GRU, RNN) load as tract-ragged's [`crate::ops::Recurrence`]
//! (`load::recurrence`), which the ragged transform can give each sample's width as its
//! length; tract-onnx's own lowering (a `Scan` per direction) it cannot.
//!
//! Dynamically quantized models (int8 encoders) compute one scale per tensor: each
//! `DynamicQuantizeLinear` is written as its ops with that scale kept at the input's rank,
//! which the transform computes per sample ([`dynamic_quantization_per_sample`]).
//!
//! Once typed, two things exporters write through the batch axis are rewritten as what
//! they compute: a gather of a tensor at its own coordinates (transformers' attention
//! masks) as a broadcast of it (`load::gathers`), and axes merged then split back around
//! moves of other axes (dynamo's transposes through `[N*H, L, D]` views) as those moves
//! (`load::reshapes`).
//!
//! Scripted exports branch with `If` nodes on shapes and on inputs given once (silero
//! VAD's sample rate); tract types both branches of each, and the one not taken may not
//! type. `decide_branches` replaces those the facts decide by the branch taken before
//! typing, and [`fold_input`] gives an input given once its value (`load::branches`).

use std::path::Path;

use tract_onnx::pb;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::infer::InferenceFact;

use crate::{RaggedModel, RaggedSpec};
use tract_onnx::tract_hir::internal::*;

mod branches;
mod constant_of_shape;
mod dims;
mod flatten;
mod gathers;
mod quantization;
mod recurrence;
mod reshapes;
mod resizes;
mod unfolds;
mod windows;

pub use branches::fold_input;
pub use quantization::dynamic_quantization_per_sample;

pub(crate) use branches::decide_branches;
pub(crate) use dims::{cumsums_of_dims_in_i64, forget_symbolic_uniforms};
pub(crate) use gathers::gathers_at_own_coordinates;
pub(crate) use reshapes::merges_split_back;
pub(crate) use resizes::single_pixel_resizes;
pub(crate) use unfolds::unfolds_as_convolutions;
pub(crate) use windows::windows_gathered_whole;

/// tract-onnx's parser with tract-ragged's loaders: ONNX LSTM, GRU and RNN nodes become
/// [`crate::ops::Recurrence`] (`load::recurrence`); `Flatten` types over several symbols
/// (`load::flatten`); `ConstantOfShape` without a value makes float32 zeros, as ONNX says
/// (`load::constant_of_shape`). For the `tract` crate's API too:
/// `tract_ragged::load::onnx().model_for_path(..)`.
pub fn onnx() -> tract_onnx::Onnx {
    let mut onnx = tract_onnx::onnx();
    recurrence::register(&mut onnx.op_register);
    flatten::register(&mut onnx.op_register);
    constant_of_shape::register(&mut onnx.op_register);
    onnx
}

/// ONNX's code for int32 and int64 tensors.
const ONNX_INT32: i32 = 6;
const ONNX_INT64: i32 = 7;

/// Ops through which a value stays "computed from a shape": index arithmetic and
/// reshuffling, the kind of op an export builds a target shape with.
const SHAPE_ARITHMETIC: &[&str] = &[
    "Cast",
    "Slice",
    "Gather",
    "Concat",
    "Squeeze",
    "Unsqueeze",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Floor",
    "Ceil",
    "Max",
    "Min",
    "Identity",
    "Reshape",
];

/// Turns the int32 casts of shape-derived values into int64 casts. Returns the names of
/// the nodes changed.
pub fn widen_shape_casts(proto: &mut pb::ModelProto) -> Vec<String> {
    let Some(graph) = proto.graph.as_mut() else {
        return vec![];
    };
    let mut from_shape: std::collections::HashSet<String> = Default::default();
    let mut changed = vec![];
    // Nodes of an ONNX graph are topologically sorted.
    for node in &mut graph.node {
        let derived = node.op_type == "Shape"
            || (SHAPE_ARITHMETIC.contains(&node.op_type.as_str())
                && node.input.first().is_some_and(|i| from_shape.contains(i)));
        if !derived {
            continue;
        }
        if node.op_type == "Cast" {
            for attr in &mut node.attribute {
                if attr.name == "to" && attr.i == ONNX_INT32 as i64 {
                    attr.i = ONNX_INT64 as i64;
                    changed.push(node.name.clone());
                }
            }
        }
        from_shape.extend(node.output.iter().cloned());
    }
    changed
}

/// Clears the shapes the graph declares for its intermediate values (`value_info`), in
/// its subgraphs too, keeping their element types. Returns how many were cleared.
///
/// tract-onnx takes them as facts, and torch's dynamo exporter (its default since torch
/// 2.9) writes them over the symbols of its dynamic axes (`s0`, `batch`, `sequence`) with
/// a literal 1 where a value broadcasts: typed at a sample's concrete shape, those meet
/// its numbers ("Impossible to unify Sym(N) with Val(1)"), typed over the user's own
/// symbols, a 1 meets `N`. tract infers every shape from the inputs' facts and the ops
/// alone, so the declared ones add nothing it needs.
pub(crate) fn forget_intermediate_shapes(proto: &mut pb::ModelProto) -> usize {
    fn graph(g: &mut pb::GraphProto) -> usize {
        let mut cleared = 0;
        for info in &mut g.value_info {
            if let Some(pb::type_proto::Value::TensorType(t)) =
                info.r#type.as_mut().and_then(|t| t.value.as_mut())
                && t.shape.take().is_some()
            {
                cleared += 1;
            }
        }
        for node in &mut g.node {
            for attr in &mut node.attribute {
                cleared += attr.g.as_mut().map_or(0, graph);
                cleared += attr.graphs.iter_mut().map(graph).sum::<usize>();
            }
        }
        cleared
    }
    proto.graph.as_mut().map_or(0, graph)
}

/// The bytes of an ONNX model with its shape casts widened ([`widen_shape_casts`]): for a
/// loader of tract's own (the `tract` crate's `onnx().load_buffer`) to type symbolically.
pub fn widened_onnx_bytes(path: impl AsRef<Path>) -> TractResult<Vec<u8>> {
    use prost::Message;
    let path = path.as_ref();
    let mut proto = tract_onnx::onnx()
        .proto_model_for_path(path)
        .with_context(|| format!("Reading ONNX model {}", path.display()))?;
    widen_shape_casts(&mut proto);
    Ok(proto.encode_to_vec())
}

/// A model read from ONNX, before typing.
pub struct OnnxModel {
    /// The model, its input facts as given.
    pub model: InferenceModel,
    /// The int32 shape casts widened to int64.
    pub widened_casts: Vec<String>,
}

/// Reads an ONNX model, widening its shape casts, and sets the facts of its first input
/// from a fact string in tract's syntax (`N,3,48,W,f32`: symbols for the batch and the
/// width).
pub fn read_onnx(path: impl AsRef<Path>, input_fact: Option<&str>) -> TractResult<OnnxModel> {
    let path = path.as_ref();
    ensure!(
        !path.is_dir(),
        "{} is a directory, not an ONNX model",
        path.display()
    );
    let proto = crate::no_panic(
        || format!("Reading ONNX model {}", path.display()),
        || tract_onnx::onnx().proto_model_for_path(path),
    )
    .with_context(|| format!("Reading ONNX model {}", path.display()))?;
    let dir = path.parent().and_then(|p| p.to_str());
    from_proto(proto, dir, input_fact)
        .with_context(|| format!("Parsing ONNX model {}", path.display()))
}

/// [`read_onnx`] from a decoded model: `dir` is where external data would be. A graph
/// tract cannot make sense of (a node reading a value nothing produces, say) is an
/// error, whether tract reports it or panics on it.
pub fn from_proto(
    mut proto: pb::ModelProto,
    dir: Option<&str>,
    input_fact: Option<&str>,
) -> TractResult<OnnxModel> {
    let widened_casts = widen_shape_casts(&mut proto);
    forget_intermediate_shapes(&mut proto);
    dynamic_quantization_per_sample(&mut proto);
    let mut model = crate::no_panic(
        || "Parsing the ONNX graph".to_string(),
        || Ok(onnx().parse(&proto, dir)?.model),
    )?;
    if let Some(spec) = input_fact {
        ensure!(
            !spec.trim().is_empty(),
            "an empty input fact: give the input's dims and element type (N,3,48,W,f32)"
        );
        let fact = InferenceFact::from_spec(&model.symbols, spec)
            .with_context(|| format!("Parsing input fact {spec:?}"))?;
        check_against_declared(&model, spec, &fact)?;
        assert_non_negative(&model.symbols, &fact)?;
        unify_symbols(&mut model, &fact)?;
        model.set_input_fact(0, fact)?;
    }
    Ok(OnnxModel {
        model,
        widened_casts,
    })
}

/// Renames, in the declared facts of the model's other inputs, the symbols the model
/// declares for its first input to those of the fact given for it (`batch, sequence` to
/// `N, L`): a text encoder's `attention_mask` and `token_type_ids` share its
/// `input_ids`' extents, and would otherwise keep symbols of their own.
///
/// torch's dynamo exporter, given a dynamic batch per input, names each input's batch
/// apart (`input_ids: [s0, s1]`, `attention_mask: [s43, s1]`) though they are one: an
/// input sharing one of the first input's other extents and leading with a symbol of its
/// own takes the given batch there too.
fn unify_symbols(model: &mut InferenceModel, given: &InferenceFact) -> TractResult<()> {
    let declared = model.input_fact(0)?.clone();
    let mut renames: Vec<(Symbol, TDim)> = declared
        .shape
        .dims()
        .zip(given.shape.dims())
        .filter_map(|(d, g)| match (d.concretize(), g.concretize()) {
            (Some(TDim::Sym(a)), Some(b @ TDim::Sym(_))) if TDim::Sym(a.clone()) != b => {
                Some((a, b))
            }
            _ => None,
        })
        .collect();
    let declared_dims: Vec<TDim> = declared
        .shape
        .dims()
        .filter_map(|d| d.concretize())
        .collect();
    if let (Some(TDim::Sym(_)), Some(batch @ TDim::Sym(_))) = (
        declared_dims.first().cloned(),
        given.shape.dims().next().and_then(|d| d.concretize()),
    ) {
        let own: Vec<Symbol> = declared_dims.iter().flat_map(|d| d.symbols()).collect();
        for ix in 1..model.input_outlets()?.len() {
            let Some(dims) = model.input_fact(ix)?.shape.concretize() else {
                continue;
            };
            let shares = dims
                .iter()
                .skip(1)
                .any(|d| matches!(d, TDim::Sym(s) if own.contains(s) && Some(d) != declared_dims.first()));
            if let (true, Some(TDim::Sym(lead))) = (shares, dims.first())
                && !own.contains(lead)
                && !renames.iter().any(|(s, _)| s == lead)
            {
                renames.push((lead.clone(), batch.clone()));
            }
        }
    }
    substitute_in_other_inputs(model, 0, &renames)
}

/// Substitutes `values` for their symbols in the declared facts of every input but
/// `except`: the names or the values the fact of input `except` gives its symbols, which
/// the others share (a state's `[2, N, 128]` beside `[N, L]`).
pub(crate) fn substitute_in_other_inputs(
    model: &mut InferenceModel,
    except: usize,
    values: &[(Symbol, TDim)],
) -> TractResult<()> {
    if values.is_empty() {
        return Ok(());
    }
    for ix in 0..model.input_outlets()?.len() {
        if ix == except {
            continue;
        }
        let mut fact = model.input_fact(ix)?.clone();
        let Some(dims) = fact.shape.concretize() else {
            continue;
        };
        let dims = dims
            .iter()
            .map(|d| {
                values
                    .iter()
                    .try_fold(d.clone(), |d, (sym, value)| d.substitute(sym, value))
            })
            .collect::<TractResult<TVec<TDim>>>()?;
        fact.shape = dims.into_iter().collect();
        model.set_input_fact(ix, fact)?;
    }
    Ok(())
}

/// Sets the facts of the inputs named in `facts` (name, fact in tract's syntax), after
/// the first input's: a model of several inputs whose others the model declares loosely
/// (a state's extents left free).
pub fn set_input_facts(model: &mut InferenceModel, facts: &[(&str, &str)]) -> TractResult<()> {
    for (name, spec) in facts {
        let ix = crate::spec::InputRef::Name(name.to_string())
            .resolve(model)
            .with_context(|| format!("input fact {name}={spec}"))?;
        ensure!(
            !spec.trim().is_empty(),
            "an empty input fact for input {name:?}: give its dims and element type \
             ({name}=N,3,48,W,f32)"
        );
        let fact = InferenceFact::from_spec(&model.symbols, spec)
            .with_context(|| format!("Parsing input fact {spec:?} of input {name:?}"))?;
        assert_non_negative(&model.symbols, &fact)?;
        model.set_input_fact(ix, fact)?;
    }
    Ok(())
}

/// Tells tract the symbols of `fact` are never negative (they size axes): its rule
/// simplifying `(32*h + 31)/32` to `h` needs them proven so, and feature pyramids over
/// extents declared as multiples of their stride type only with it.
fn assert_non_negative(symbols: &SymbolScope, fact: &InferenceFact) -> TractResult<()> {
    if let Some(shape) = fact.shape.concretize() {
        for dim in &shape {
            for sym in dim.symbols() {
                symbols.add_assertion(format!("{sym}>=0"))?;
            }
        }
    }
    Ok(())
}

/// Refuses an input fact that contradicts what the model declares for its first input
/// (rank, element type, fixed dims): tract would report it deep inside the graph, at the
/// first op that cares.
fn check_against_declared(
    model: &InferenceModel,
    spec: &str,
    fact: &InferenceFact,
) -> TractResult<()> {
    let declared = model.input_fact(0)?;
    let name = &model.node(model.input_outlets()?[0].node).name;
    let contradiction = |what: String| {
        anyhow!(
            "the input fact {spec:?} {what}, but the model declares its input {name:?} as {}",
            declared.format_dt_shape()
        )
    };
    if let (Some(given), Some(expected)) = (
        fact.shape.rank().concretize(),
        declared.shape.rank().concretize(),
    ) && given != expected
    {
        return Err(contradiction(format!("has rank {given}")));
    }
    if let (Some(given), Some(expected)) = (fact.datum_type(), declared.datum_type())
        && given != expected
    {
        return Err(contradiction(format!("is {given:?}")));
    }
    for (axis, (given, expected)) in fact.shape.dims().zip(declared.shape.dims()).enumerate() {
        if let (Some(TDim::Val(given)), Some(TDim::Val(expected))) =
            (given.concretize(), expected.concretize())
            && given != expected
        {
            return Err(contradiction(format!("has {given} on axis {axis}")));
        }
    }
    Ok(())
}

/// Why a model may have failed to type, from its first input's fact: no shape declared,
/// or symbols where the ops need numbers. Empty when neither.
fn typing_hint(model: &InferenceModel, spec: &RaggedSpec) -> String {
    if let Some((node, input)) = branches::branch_on_input(model) {
        return format!(
            " (If node {node:?} branches on input {input:?}: give it once, as shared.{input} \
             in run's archive or with load::fold_input, so that the branch is known before \
             the model is typed)"
        );
    }
    let Ok(fact) = model.input_fact(0) else {
        return String::new();
    };
    let Some(rank) = fact.shape.rank().concretize() else {
        return " (the model does not declare its input's rank: give an input fact, e.g. \
                 --input-fact N,3,48,W,f32)"
            .into();
    };
    if fact.datum_type().is_none() {
        return " (the model does not declare its input's element type: give an input fact)".into();
    }
    let unknown: Vec<String> = fact
        .shape
        .dims()
        .enumerate()
        .filter(|(axis, _)| *axis != 0 && !spec.axes.contains(axis))
        .filter(|(_, d)| !matches!(d.concretize(), Some(TDim::Val(_))))
        .map(|(axis, d)| match d.concretize() {
            Some(dim) => format!("axis {axis} ({dim})"),
            None => format!("axis {axis} (unknown)"),
        })
        .collect();
    if unknown.is_empty() {
        return String::new();
    }
    format!(
        " (the input is {} of rank {rank}: {} left free, where most models need numbers; \
         give them in an input fact, e.g. --input-fact with numbers there and symbols for \
         the batch and the ragged axes {:?})",
        fact.format_dt_shape(),
        unknown.join(", "),
        spec.axes
    )
}

impl OnnxModel {
    /// The typed, decluttered model (in segments when it is huge: [`crate::segment`]).
    pub fn into_typed(mut self) -> TractResult<TypedModel> {
        decide_branches(&mut self.model)?;
        let mut model = self.model.into_typed()?;
        cumsums_of_dims_in_i64(&mut model)?;
        forget_symbolic_uniforms(&mut model);
        crate::segment::Segments::declutter(&mut model)?;
        // Index arithmetic and reshapes through the batch, once tract has folded the
        // shapes they are computed from; again after tract's declutter, which may write
        // new reshapes around what was rewritten (a product batched over the axes an
        // unfold gave); a few rounds at most.
        for _ in 0..4 {
            let rewritten = gathers_at_own_coordinates(&mut model)?
                + merges_split_back(&mut model)?
                + unfolds_as_convolutions(&mut model)?
                + single_pixel_resizes(&mut model)?
                + windows_gathered_whole(&mut model)?;
            if rewritten == 0 {
                break;
            }
            crate::segment::Segments::declutter(&mut model)?;
        }
        Ok(model)
    }
}

/// The ragged model for an ONNX model: typed once, symbolically, when tract can type it
/// with the input fact given; typed per batch shape otherwise. A refusal of the transform
/// is an error either way: only a failure to type falls back.
///
/// A model typed per shape whose feature maps of different strides meet (a detector's
/// FPN: widths must be multiples of 32) is typed again with its ragged extents declared
/// as multiples of that alignment (`32*H_32` for `H`), which tract can often type
/// symbolically ([`crate::spec::Extent`]): one typed model for every batch shape instead
/// of one per shape.
pub fn ragged_model(onnx: OnnxModel, spec: RaggedSpec) -> TractResult<RaggedModel> {
    ensure!(
        !onnx.model.output_outlets()?.is_empty(),
        "the model has no outputs: nothing to compute"
    );
    let inference = onnx.model.clone();
    match crate::no_panic(|| "Typing the model".into(), || onnx.into_typed()) {
        Ok(typed) => RaggedModel::new(typed, spec),
        Err(symbolic) => {
            let hint = typing_hint(&inference, &spec);
            let per_shape = match RaggedModel::per_shape(inference.clone(), spec.clone()) {
                Ok(per_shape) => per_shape,
                Err(e) => {
                    return typed_at_a_multiple(&inference, &spec)
                        .ok_or(e)
                        .with_context(|| {
                            format!(
                                "tract could not type the model{hint}: symbolically, \
                             {symbolic:#}; per shape"
                            )
                        });
                }
            };
            let aligned = &per_shape.ragged.alignment;
            Ok(typed_at_multiples(&inference, &spec, aligned).unwrap_or(per_shape))
        }
    }
}

/// A model that types neither symbolically nor per shape may take only multiples of some
/// length (Conv-TasNet views its decoded `8*(T/8)` samples back as `T`: as exported it
/// runs on multiples of 8 only): typed with each ragged extent a multiple of 2, 4, .. 64,
/// the first that types. Its samples must then be such multiples, and are told so.
fn typed_at_a_multiple(inference: &InferenceModel, spec: &RaggedSpec) -> Option<RaggedModel> {
    [2u64, 4, 8, 16, 32, 64].into_iter().find_map(|m| {
        let why = format!("tract types it for widths of {m}*W only");
        let alignment: Vec<(u64, Option<String>)> =
            spec.axes.iter().map(|_| (m, Some(why.clone()))).collect();
        typed_at_multiples(inference, spec, &alignment)
    })
}

/// The ragged model typed symbolically with each ragged extent declared as a multiple of
/// its alignment, `None` when it is not one (no alignment, an extent that is not a bare
/// symbol) or tract cannot type it so either.
fn typed_at_multiples(
    inference: &InferenceModel,
    spec: &RaggedSpec,
    alignment: &[(u64, Option<String>)],
) -> Option<RaggedModel> {
    if alignment.iter().all(|(m, _)| *m <= 1) {
        return None;
    }
    let ix = match &spec.input {
        crate::spec::InputRef::Index(ix) => *ix,
        crate::spec::InputRef::Name(name) => inference
            .input_outlets()
            .ok()?
            .iter()
            .position(|o| inference.node(o.node).name == *name)?,
    };
    let fact = inference.input_fact(ix).ok()?;
    let dt = fact.datum_type.concretize()?;
    let mut shape = fact.shape.concretize()?;
    for (&axis, (m, _)) in spec.axes.iter().zip(alignment) {
        if *m <= 1 {
            continue;
        }
        let TDim::Sym(s) = shape.get(axis)? else {
            return None;
        };
        let multiple = inference.symbols.sym(&format!("{s}_{m}"));
        shape[axis] = TDim::MulInt(*m as i64, Box::new(TDim::Sym(multiple)));
    }
    let fact = InferenceFact::dt_shape(dt, shape);
    let mut model = inference.clone();
    assert_non_negative(&model.symbols, &fact).ok()?;
    model.set_input_fact(ix, fact).ok()?;
    let onnx = OnnxModel {
        model,
        widened_casts: vec![],
    };
    let typed = crate::no_panic(|| "Typing the model".into(), || onnx.into_typed()).ok()?;
    let mut model = RaggedModel::new(typed, spec.clone()).ok()?;
    // The multiples are the model's, not the user's: say where its maps meet.
    for (found, probed) in model.ragged.alignment.iter_mut().zip(alignment) {
        if found.0 == probed.0 {
            found.1 = probed.1.clone();
        }
    }
    Some(model)
}

/// Reads an ONNX model and types it (decluttered), with the input fact given.
pub fn load_onnx(path: impl AsRef<Path>, input_fact: Option<&str>) -> TractResult<TypedModel> {
    let path = path.as_ref();
    read_onnx(path, input_fact)?
        .into_typed()
        .with_context(|| format!("Typing ONNX model {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str, inputs: &[&str], outputs: &[&str], to: Option<i64>) -> pb::NodeProto {
        pb::NodeProto {
            op_type: op.into(),
            name: outputs[0].into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: to
                .map(|i| pb::AttributeProto {
                    name: "to".into(),
                    i,
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    fn value_info(name: &str, dims: &[i64]) -> pb::ValueInfoProto {
        use pb::tensor_shape_proto::{Dimension, dimension::Value};
        let shape = pb::TensorShapeProto {
            dim: dims
                .iter()
                .map(|d| Dimension {
                    value: Some(Value::DimValue(*d)),
                    ..Default::default()
                })
                .collect(),
        };
        pb::ValueInfoProto {
            name: name.into(),
            r#type: Some(pb::TypeProto {
                value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                    elem_type: 1,
                    shape: Some(shape),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn intermediate_shapes_are_forgotten_in_subgraphs_too_types_kept() {
        let branch = pb::GraphProto {
            value_info: vec![value_info("b", &[1, 4])],
            ..Default::default()
        };
        let mut if_node = node("If", &["c"], &["y"], None);
        if_node.attribute.push(pb::AttributeProto {
            name: "then_branch".into(),
            g: Some(branch),
            ..Default::default()
        });
        let mut proto = pb::ModelProto {
            graph: Some(pb::GraphProto {
                node: vec![if_node],
                value_info: vec![value_info("a", &[1, 4]), value_info("c", &[])],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(forget_intermediate_shapes(&mut proto), 3);
        assert_eq!(forget_intermediate_shapes(&mut proto), 0);
        let graph = proto.graph.unwrap();
        let Some(pb::type_proto::Value::TensorType(t)) =
            &graph.value_info[0].r#type.as_ref().unwrap().value
        else {
            panic!("a tensor type")
        };
        assert_eq!((t.elem_type, t.shape.is_none()), (1, true));
    }

    #[test]
    fn only_casts_of_shapes_are_widened() {
        let mut proto = pb::ModelProto {
            graph: Some(pb::GraphProto {
                node: vec![
                    node("Shape", &["x"], &["s"], None),
                    node("Cast", &["s"], &["s32"], Some(6)),
                    node("Slice", &["s32", "a", "b"], &["sl"], None),
                    node("Cast", &["sl"], &["s64"], Some(7)),
                    node("Cast", &["x"], &["x32"], Some(6)),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(widen_shape_casts(&mut proto), vec!["s32".to_string()]);
        let nodes = &proto.graph.unwrap().node;
        assert_eq!(nodes[1].attribute[0].i, 7);
        assert_eq!(nodes[4].attribute[0].i, 6);
    }
}
