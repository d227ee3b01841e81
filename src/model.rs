//! A model through the ragged transform, not yet prepared: [`RaggedModel`].
//!
//! It holds the transformed model, the original one (the reference runs it on each
//! sample alone), the ragged input's fact and the output reductions. Where tract types the
//! model with a symbolic batch and width, it is typed and transformed once; where it
//! cannot (a shape computed from values tract only knows at a concrete shape), the model
//! is kept as read and typed anew for each batch shape, after the transform was run at
//! two probe shapes to refuse what it cannot handle before any batch and to check that
//! the widths follow from the samples' alone. Precision (f16) and top-k reductions are
//! applied here, to the transformed model and to the original alike, so that the
//! reference computes what the batches compute.

use tract_core::internal::*;
use tract_onnx::prelude::{InferenceModel, InferenceModelExt};
use tract_onnx::tract_hir::infer::Factoid;

use crate::RaggedRunnable;
use crate::backend::{self, Backend};
use crate::error::Mixing;
use crate::spec::RaggedSpec;
use crate::transform::width::WidthFn;
use crate::transform::{InputRole, Ragged, ragged, ragged_with};

/// Where the concrete models behind the plans come from.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// Typed once, with symbols for the batch and the width: each plan sets them.
    Symbolic { original: TypedModel },
    /// A model tract cannot type with a symbolic batch and width: each plan types it
    /// anew, for its batch size and padded width, and transforms it.
    PerShape {
        model: Box<InferenceModel>,
        /// The inputs' roles, from the model's symbolic facts ([`symbolic_roles`]).
        roles: Option<Vec<InputRole>>,
    },
}

/// A model through the ragged transform, not yet prepared.
#[derive(Clone, Debug)]
pub struct RaggedModel {
    pub(crate) source: Source,
    /// The transformed model: symbolic, or typed at a probe shape for a per-shape model
    /// (its output layouts hold for every shape).
    pub ragged: Ragged,
    /// The original model's ragged input, typed.
    pub input_fact: TypedFact,
    /// Every output reduced to its top k along its last axis (`crate::top_k_outputs`).
    pub top_k: Option<usize>,
    /// The largest magnitude its arithmetic holds where that is less than the samples'
    /// type's: 65504 for a model in f16 (samples beyond it are refused, they would become
    /// infinities inside).
    pub largest: Option<f32>,
}

/// Fails when the model transformed at padded extents `other` computes other widths than
/// at `probe` (`ragged`): its arithmetic along a ragged axis depends on the padded extent,
/// so a sample would be sized differently alone. Models that do not type at `other` pass.
fn check_same_widths(
    model: &InferenceModel,
    spec: &RaggedSpec,
    roles: Option<&[InputRole]>,
    ragged_at_probe: &Ragged,
    probe: usize,
    other: usize,
) -> TractResult<()> {
    let extents: TVec<usize> = spec.axes.iter().map(|_| other).collect();
    let Ok(typed) = crate::no_panic(
        || format!("Typing the model at width {other}"),
        || type_at(model, spec, 2, &extents, None),
    ) else {
        return Ok(());
    };
    let at_other = ragged_with(&typed, spec, roles)?;
    let fns = |r: &Ragged| -> Vec<WidthFn> {
        r.model
            .nodes()
            .iter()
            .find_map(|n| n.op_as::<crate::ops::WidthTable>())
            .map(|t| t.fns.clone())
            .unwrap_or_default()
    };
    let (a, b) = (fns(ragged_at_probe), fns(&at_other));
    let differ = a.len() != b.len() || a.iter().zip(&b).any(|(f, g)| !f.same_as(g));
    if differ {
        let (f, g) = a
            .iter()
            .zip(&b)
            .find(|(f, g)| !f.same_as(g))
            .map(|(f, g)| (f.to_string(), g.to_string()))
            .unwrap_or_default();
        bail!(Mixing(format!(
            "the model sizes its tensors along the ragged axis by the padded extent \
             (typed at {probe}: {f}; at {other}: {g}), so a sample would be sized differently \
             alone"
        )));
    }
    Ok(())
}

impl RaggedModel {
    /// Runs the ragged transform on a typed model, ideally symbolic in its batch axis and
    /// its ragged axis (`N,3,48,W`).
    pub fn new(model: TypedModel, spec: RaggedSpec) -> TractResult<RaggedModel> {
        let mut ragged = crate::no_panic(|| "Ragged transform".into(), || ragged(&model, &spec))?;
        crate::no_panic(
            || "Decluttering the ragged model".into(),
            || crate::segment::Segments::declutter(&mut ragged.model),
        )?;
        let input_fact = model.input_fact(ragged.input)?.clone();
        Ok(RaggedModel {
            source: Source::Symbolic { original: model },
            ragged,
            input_fact,
            top_k: None,
            largest: None,
        })
    }

    /// A model that tract cannot type with a symbolic batch and width: typed again for
    /// every batch size and padded width. `model`'s input fact says which dims are the
    /// batch and the width (symbols) and which are fixed. The transform is run once here,
    /// on a probe shape, to refuse a model it cannot handle before any batch, and on a
    /// second one: the widths of every tensor must follow from the sample's widths alone,
    /// the same at both (a transposed convolution given its `output_shape` is padded by the
    /// padded extent: refused).
    pub fn per_shape(model: InferenceModel, spec: RaggedSpec) -> TractResult<RaggedModel> {
        let roles = symbolic_roles(&model, &spec);
        let mut last = None;
        let probes = [64, 256, 1024];
        for (ix, probe) in probes.iter().copied().enumerate() {
            let extents: TVec<usize> = spec.axes.iter().map(|_| probe).collect();
            match crate::no_panic(
                || format!("Typing the model at width {probe}"),
                || type_at(&model, &spec, 2, &extents, None),
            ) {
                Ok(typed) => {
                    let ragged = ragged_with(&typed, &spec, roles.as_deref())?;
                    if let Some(&other) = probes.get(ix + 1) {
                        check_same_widths(&model, &spec, roles.as_deref(), &ragged, probe, other)?;
                    }
                    // The batch and the widths stay free: plans set them.
                    let mut input_fact = typed.input_fact(ragged.input)?.clone();
                    let mut shape = input_fact.shape.to_tvec();
                    shape[0] = model.symbols.sym("N").to_dim();
                    for &axis in &spec.axes {
                        let name = if spec.axes.len() == 1 {
                            "W".to_string()
                        } else {
                            format!("W{axis}")
                        };
                        shape[axis] = model.symbols.sym(&name).to_dim();
                    }
                    input_fact.shape = shape.into();
                    let source = Source::PerShape {
                        model: Box::new(model),
                        roles,
                    };
                    return Ok(RaggedModel {
                        source,
                        ragged,
                        input_fact,
                        top_k: None,
                        largest: None,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.context("no probe shape")?)
            .context("Typing the model at a probe shape (batch 2, widths 64, 256, 1024)")
    }

    /// Every output reduced to its top `k` values and their positions along its last axis
    /// (its classes), in the plans and in the original model alike (`crate::top_k_outputs`):
    /// each output becomes two, values then positions.
    pub fn with_top_k(mut self, k: usize) -> TractResult<RaggedModel> {
        ensure!(self.top_k.is_none(), "the outputs are reduced already");
        let own = self.ragged.outputs.len();
        let ranks = (0..own)
            .map(|i| Ok(self.ragged.model.output_fact(i)?.rank()))
            .collect::<TractResult<Vec<usize>>>()?;
        let layouts = crate::top_k_outputs::top_k_layouts(&self.ragged.outputs, &ranks)?;
        crate::top_k_outputs::top_k_outputs(&mut self.ragged.model, own, k)?;
        if let Source::Symbolic { original } = &mut self.source {
            let all = original.outputs.len();
            crate::top_k_outputs::top_k_outputs(original, all, k)?;
        }
        self.ragged.outputs = layouts;
        self.top_k = Some(k);
        Ok(self)
    }

    /// The model at `precision` ([`crate::precision`]). For f16, the original model in half
    /// precision (`crate::precision::half`) goes through the ragged transform again, so
    /// that the masks, pools and softmaxes it inserts are f16 too, and its one-by-one
    /// reference is the f16 model alone. fp32 and TF32 leave the model as it is (TF32 is a
    /// knob of the plans: [`RaggedRunnable::with_precision`]).
    pub fn at_precision(self, precision: crate::precision::Precision) -> TractResult<RaggedModel> {
        if precision != crate::precision::Precision::F16 {
            return Ok(self);
        }
        ensure!(
            self.top_k.is_none(),
            "set the precision before reducing the outputs to their top k"
        );
        let Source::Symbolic { original } = &self.source else {
            bail!(
                "f16 needs a model tract types with a symbolic batch and width; this one is \
                 typed per batch shape"
            );
        };
        let half = crate::no_panic(
            || "Translating the model to f16".into(),
            || crate::precision::half(original),
        )?;
        let mut halved =
            RaggedModel::new(half, self.ragged.spec.clone()).context("The model in f16")?;
        // Why the widths must be multiples is the loader's to say (`load::ragged_model`).
        for (found, known) in halved
            .ragged
            .alignment
            .iter_mut()
            .zip(&self.ragged.alignment)
        {
            if found.0 == known.0 {
                found.1.clone_from(&known.1);
            }
        }
        halved.largest = Some(f16::MAX.to_f32());
        Ok(halved)
    }

    /// Whether plans come from one symbolic model (false: typed per shape).
    pub fn is_symbolic(&self) -> bool {
        matches!(self.source, Source::Symbolic { .. })
    }

    /// Prepares it on tract's default CPU runtime.
    pub fn into_runnable(self) -> TractResult<RaggedRunnable> {
        self.into_runnable_with(&DefaultRuntime)
    }

    /// Prepares it on `runtime`, with the backend of the plans `runtime` prepares
    /// (`backend::for_runtime`).
    pub fn into_runnable_with(self, runtime: &'static dyn Runtime) -> TractResult<RaggedRunnable> {
        runtime.check()?;
        let backend = backend::for_runtime(runtime)?;
        RaggedRunnable::new(self, runtime, backend)
    }

    /// Prepares it on `runtime`, batches moving through `backend`: for a runtime whose
    /// plans no registered backend recognises.
    pub fn into_runnable_on(
        self,
        runtime: &'static dyn Runtime,
        backend: Arc<dyn Backend>,
    ) -> TractResult<RaggedRunnable> {
        RaggedRunnable::new(self, runtime, backend)
    }

    /// The transformed model (for a per-shape model, at its probe shape).
    pub fn model(&self) -> &TypedModel {
        &self.ragged.model
    }

    /// The model's properties (ONNX metadata among them).
    pub fn properties(&self) -> &HashMap<String, Arc<Tensor>> {
        &self.ragged.model.properties
    }
}

/// `model` typed with its ragged input's batch and ragged extents set to `n` and
/// `extents`, and its other free dims to those of `like` (a sample).
///
/// Not decluttered: declutter simplifies ops for the shape at hand, and some of those
/// simplifications hold for that width only (a ceil-mode pool whose padded width happens
/// to be even becomes a floor-mode one). The transform must see the op as written.
/// The roles of the model's inputs as their symbolic facts give them, before a concrete
/// shape hides which axis is the batch ([`ragged_with`]); none when an input's fact is
/// not complete (the roles are then found at each shape, as before).
fn symbolic_roles(model: &InferenceModel, spec: &RaggedSpec) -> Option<Vec<InputRole>> {
    let inputs = model.input_outlets().ok()?;
    let ix = match &spec.input {
        crate::spec::InputRef::Index(i) => *i,
        crate::spec::InputRef::Name(name) => inputs
            .iter()
            .position(|o| model.node(o.node).name == *name)?,
    };
    let fact = |i: usize| -> Option<TypedFact> {
        let f = model.input_fact(i).ok()?;
        TypedFact::try_from(f).ok()
    };
    let ragged = fact(ix)?;
    (0..inputs.len())
        .map(|i| {
            if i == ix {
                Some(InputRole::Ragged(
                    spec.axes
                        .iter()
                        .enumerate()
                        .map(|(row, &axis)| crate::ops::RaggedAxis { axis, row })
                        .collect(),
                ))
            } else {
                InputRole::of(&fact(i)?, &ragged, &spec.axes).ok()
            }
        })
        .collect()
}

pub(crate) fn type_at(
    model: &InferenceModel,
    spec: &RaggedSpec,
    n: usize,
    extents: &[usize],
    like: Option<&Tensor>,
) -> TractResult<TypedModel> {
    let mut model = model.clone();
    let ix = model
        .input_outlets()?
        .iter()
        .position(|o| match &spec.input {
            crate::spec::InputRef::Index(i) => {
                model.input_outlets().map(|x| x[*i] == *o).unwrap_or(false)
            }
            crate::spec::InputRef::Name(name) => model.node(o.node).name == *name,
        })
        .context("ragged input not found")?;
    let mut fact = model.input_fact(ix)?.clone();
    let declared = fact.clone();
    let rank = fact
        .shape
        .rank()
        .concretize()
        .context("the ragged input's rank is unknown")? as usize;
    for axis in 0..rank {
        let value = match spec.axes.iter().position(|a| *a == axis) {
            _ if axis == 0 => Some(n),
            Some(k) => Some(extents[k]),
            None => like.map(|t| t.shape()[axis - 1]),
        };
        let known = fact
            .shape
            .dim(axis)
            .and_then(|d| d.concretize())
            .and_then(|d| d.to_usize().ok());
        if let (None, Some(v)) = (known, value) {
            fact.shape.set_dim(axis, v.to_dim());
        }
    }
    // The symbols the ragged input's batch and ragged axes were declared with take the
    // same values in the other inputs' facts (a state's `[2, N, 128]`).
    let values: Vec<(Symbol, TDim)> = (0..rank)
        .filter_map(|axis| {
            let sym = match declared.shape.dim(axis)?.concretize()? {
                TDim::Sym(s) => s,
                _ => return None,
            };
            let value = fact.shape.dim(axis)?.concretize()?;
            Some((sym, value))
        })
        .collect();
    model.set_input_fact(ix, fact)?;
    crate::load::substitute_in_other_inputs(&mut model, ix, &values)?;
    crate::load::decide_branches(&mut model)?;
    let mut typed = model.into_typed()?;
    crate::load::cumsums_of_dims_in_i64(&mut typed)?;
    lower_slices_and_identities(&mut typed)?;
    Ok(typed)
}

/// ONNX's `Slice` types as tract's `StridedSlice` and `Identity` as tract's, which only
/// tract's declutter lowers to the `Slice`s the transform knows or removes. A model typed
/// at a concrete shape is not decluttered whole (it would bake the padded extent into what
/// it simplifies: a pool's `ceil_mode` into fixed padding); these two ops are, alone:
/// strided bounds resolved at the padded extent along a ragged axis give other widths at
/// the two probe shapes and are refused there ([`check_same_widths`]).
fn lower_slices_and_identities(model: &mut TypedModel) -> TractResult<()> {
    let lowered: Vec<usize> = model
        .nodes()
        .iter()
        .filter(|n| {
            n.op_is::<tract_core::ops::array::StridedSlice>()
                || n.op_is::<tract_core::ops::identity::Identity>()
        })
        .map(|n| n.id)
        .collect();
    for id in lowered {
        let node = model.node(id);
        if let Some(patch) = node.op.declutter(model, node)? {
            patch.apply(model)?;
        }
    }
    model.compact()
}
