//! Running ragged batches: [`RaggedModel`] holds the transformed model, [`RaggedRunnable`]
//! runs batches of samples through plans prepared per padded shape.
//!
//! A model typed with a symbolic batch N and width W runs as it is, but tract runs such a
//! plan several times slower than one prepared for concrete shapes (measured on PP-OCRv4
//! rec on the CPU: 1064 ms against 138 ms for N=3, W=333). So the runnable keeps a cache of
//! plans, one per batch size and padded width, each prepared from the symbolic model with
//! N and W set. The padded width is rounded up to a bucket: the masks make the extra
//! padding harmless, and the buckets keep the cache small.

use crate::error::{BadSample, OutOfMemory};
use std::borrow::Borrow;
use std::sync::Mutex;
use std::time::Instant;

use tract_core::internal::*;
use tract_core::knobs::KnobScope;
use tract_onnx::prelude::{InferenceModel, InferenceModelExt};
use tract_onnx::tract_hir::infer::Factoid;

use crate::backend::{self, Backend};
use crate::batch::{SampleFact, widths};
use crate::error::Mixing;
use crate::schedule::cost::CellCosts;
use crate::schedule::fit::BatchTimes;
pub(crate) use crate::spec::extents_string;
use crate::spec::{Extent, RaggedSpec};
use crate::timeline::{self, Phase};
use crate::transform::width::WidthFn;
use crate::transform::{InputRole, Ragged, ragged, ragged_with};

/// How padded widths are rounded up before a plan is prepared for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucketing {
    /// One plan per exact width.
    Exact,
    /// Widths rounded up so that each octave holds `steps` buckets (8: at most 12.5% of
    /// padding added), and at least to a multiple of `min_step`.
    Geometric { steps: usize, min_step: usize },
}

impl Default for Bucketing {
    fn default() -> Bucketing {
        Bucketing::Geometric {
            steps: 8,
            min_step: 8,
        }
    }
}

impl Bucketing {
    pub fn round(&self, w: usize) -> usize {
        match *self {
            Bucketing::Exact => w,
            Bucketing::Geometric { steps, min_step } => {
                let octave = usize::BITS - 1 - w.max(1).leading_zeros();
                let step = ((1usize << octave) / steps.max(1)).max(min_step).max(1);
                w.div_ceil(step) * step
            }
        }
    }
}

/// Where the concrete models behind the plans come from.
#[derive(Clone, Debug)]
enum Source {
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
    source: Source,
    /// The transformed model: symbolic, or typed at a probe shape for a per-shape model
    /// (its output layouts hold for every shape).
    pub ragged: Ragged,
    /// The original model's ragged input, typed.
    pub input_fact: TypedFact,
    /// Every output reduced to its top k along its last axis ([`crate::reduce`]).
    pub top_k: Option<usize>,
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
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.context("no probe shape")?)
            .context("Typing the model at a probe shape (batch 2, widths 64, 256, 1024)")
    }

    /// Every output reduced to its top `k` values and their positions along its last axis
    /// (its classes), in the plans and in the original model alike ([`crate::reduce`]):
    /// each output becomes two, values then positions.
    pub fn with_top_k(mut self, k: usize) -> TractResult<RaggedModel> {
        ensure!(self.top_k.is_none(), "the outputs are reduced already");
        let own = self.ragged.outputs.len();
        let ranks = (0..own)
            .map(|i| Ok(self.ragged.model.output_fact(i)?.rank()))
            .collect::<TractResult<Vec<usize>>>()?;
        let layouts = crate::reduce::top_k_layouts(&self.ragged.outputs, &ranks)?;
        crate::reduce::top_k_outputs(&mut self.ragged.model, own, k)?;
        if let Source::Symbolic { original } = &mut self.source {
            let all = original.outputs.len();
            crate::reduce::top_k_outputs(original, all, k)?;
        }
        self.ragged.outputs = layouts;
        self.top_k = Some(k);
        Ok(self)
    }

    /// The model at `precision` ([`crate::precision`]). For f16, the original model in half
    /// precision ([`crate::precision::half`]) goes through the ragged transform again, so
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
    /// ([`backend::for_runtime`]).
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

fn type_at(
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

/// Which model a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Variant {
    /// The transformed model: exact.
    Ragged,
    /// The original model on a padded batch: what everybody does, inexact.
    Padded,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    variant: Variant,
    n: usize,
    /// The padded extent of each ragged axis.
    extents: TVec<usize>,
}

/// The plans prepared so far, the least recently used dropped past `capacity`: a plan
/// holds its own copy of the weights (packed for its shapes) and, on a device, its
/// buffers, so a run over samples of many widths one by one (a plan per width) would
/// otherwise grow with every new width.
#[derive(Debug)]
struct PlanCache {
    capacity: usize,
    clock: u64,
    plans: HashMap<PlanKey, (Arc<dyn Runnable>, u64)>,
}

impl PlanCache {
    /// Enough for the batch sizes and width buckets of a run of any size (a few per
    /// octave of widths), a fraction of what per-width plans would take.
    const DEFAULT_CAPACITY: usize = 32;

    fn new(capacity: usize) -> PlanCache {
        PlanCache {
            capacity: capacity.max(1),
            clock: 0,
            plans: HashMap::default(),
        }
    }

    fn get(&mut self, key: &PlanKey) -> Option<Arc<dyn Runnable>> {
        self.clock += 1;
        let clock = self.clock;
        self.plans.get_mut(key).map(|(plan, used)| {
            *used = clock;
            plan.clone()
        })
    }

    /// Keeps `plan` for `key` (or the one another thread kept first), dropping the least
    /// recently used beyond the capacity.
    fn insert(&mut self, key: PlanKey, plan: Arc<dyn Runnable>) -> Arc<dyn Runnable> {
        if let Some(kept) = self.get(&key) {
            return kept;
        }
        self.plans.insert(key, (plan.clone(), self.clock));
        while self.plans.len() > self.capacity {
            let oldest = self
                .plans
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.plans.remove(&k),
                None => break,
            };
        }
        plan
    }
}

/// How a batch was run, for the curious and for `--verbose`.
#[derive(Clone, Debug)]
pub struct RunInfo {
    pub samples: usize,
    /// The padded extent of the last ragged axis (the only one of a line).
    pub padded_width: usize,
    /// The padded extent of each ragged axis.
    pub padded: TVec<usize>,
    /// Whether the plan was prepared for this run (false: taken from the cache).
    pub prepared: bool,
    pub plan: String,
    /// How many segments the plan runs in (1: one plan; more for a model too large for
    /// tract's optimizer in one piece, [`crate::segment`]).
    pub segments: usize,
}

/// A ragged model prepared on a runtime: runs batches of samples of any widths.
#[derive(Debug)]
pub struct RaggedRunnable {
    model: RaggedModel,
    runtime: &'static dyn Runtime,
    /// How batches reach the plans and come back, memory, costs: the runtime's own.
    backend: Arc<dyn Backend>,
    /// Knob values the plans are prepared under (tract's `KnobScope`).
    knobs: Option<KnobScope>,
    sample: SampleFact,
    batch_dim: TDim,
    /// The input's extent along each ragged axis: a multiple of a symbol, or a number.
    extents: TVec<Extent>,
    pub bucketing: Bucketing,
    plans: Mutex<PlanCache>,
    /// Peak memory by batch size and padded extents, computed once.
    memory: Mutex<HashMap<(usize, TVec<usize>), u64>>,
    /// What a cell costs by batch size, measured on the first run that needed it
    /// ([`crate::schedule::cost`]).
    costs: Mutex<Option<CellCosts>>,
    /// The cells and times of the batches run on plans prepared before
    /// ([`crate::schedule::fit`]).
    batch_times: Mutex<BatchTimes>,
}

impl RaggedRunnable {
    fn new(
        model: RaggedModel,
        runtime: &'static dyn Runtime,
        backend: Arc<dyn Backend>,
    ) -> TractResult<RaggedRunnable> {
        runtime.check()?;
        let ragged = &model.ragged;
        let fact = &model.input_fact;
        let batch_dim = fact.shape[0].clone();
        let input_name = ragged.spec.input.to_string();
        let extents = ragged
            .spec
            .axes
            .iter()
            .map(|a| Extent::of(&fact.shape[*a], *a, &input_name))
            .collect::<TractResult<_>>()?;
        let dims = fact
            .shape
            .iter()
            .skip(1)
            .map(|d| d.to_usize().ok())
            .collect();
        let sample = SampleFact {
            datum_type: fact.datum_type,
            dims,
            axes: ragged.spec.axes.iter().map(|a| a - 1).collect(),
            alignment: ragged.alignment.clone(),
        };
        Ok(RaggedRunnable {
            model,
            runtime,
            backend,
            knobs: None,
            sample,
            batch_dim,
            extents,
            bucketing: Bucketing::default(),
            plans: Mutex::new(PlanCache::new(PlanCache::DEFAULT_CAPACITY)),
            memory: Mutex::new(HashMap::default()),
            costs: Mutex::new(None),
            batch_times: Mutex::new(BatchTimes::default()),
        })
    }

    pub fn model(&self) -> &RaggedModel {
        &self.model
    }

    /// What every sample must agree with.
    pub fn sample_fact(&self) -> &SampleFact {
        &self.sample
    }

    /// The plan a ragged batch of `samples` runs on, and its inputs (the packed batch and
    /// the widths): for profiling.
    pub fn prepared(
        &self,
        samples: &[impl Borrow<Tensor>],
    ) -> TractResult<(Arc<dyn Runnable>, TVec<TValue>)> {
        self.sample.check(samples)?;
        let (plan, _, widths, padded) = self.ragged_plan(samples)?;
        let mut inputs = tvec!(self.upload(samples, &padded)?);
        inputs.extend(widths_inputs(&widths)?);
        Ok((plan, inputs))
    }

    /// The plan of a ragged batch of `samples` (checked), prepared on first use: with
    /// whether it was prepared now, the samples' widths and the padded extents.
    #[allow(clippy::type_complexity)]
    pub(crate) fn ragged_plan(
        &self,
        samples: &[impl Borrow<Tensor>],
    ) -> TractResult<(Arc<dyn Runnable>, bool, Vec<Vec<i64>>, TVec<usize>)> {
        let widths = widths(samples, &self.sample.axes);
        // Before any plan: a batch of samples too narrow for the model must not reach
        // tract with a padded width that makes some tensor empty.
        self.width_table_axes(&slices(&widths))?;
        let maxima = maxima(&widths)?;
        let padded = self.padded_extents(&maxima);
        for (max, padded) in maxima.iter().zip(&padded) {
            ensure!(
                max <= padded,
                "a sample has width {max}, above the model's fixed extent {padded} along a \
                 ragged axis"
            );
        }
        let key = PlanKey {
            variant: Variant::Ragged,
            n: samples.len(),
            extents: padded.clone(),
        };
        let like = samples.first().context("no sample")?.borrow();
        let (plan, prepared) = self.plan(key, like)?;
        Ok((plan, prepared, widths, padded))
    }

    /// What a cell costs by batch size on this runnable, once measured.
    pub fn measured_costs(&self) -> Option<CellCosts> {
        self.costs.lock().ok().and_then(|c| c.clone())
    }

    /// A batch's fixed part in padded cells, fitted to the batches this runnable ran
    /// ([`crate::schedule::fit`]), and how many batches the fit has; none until they
    /// allow a fit.
    pub fn fitted_overhead(&self) -> Option<(u64, usize)> {
        let times = self.batch_times.lock().ok()?;
        Some((times.overhead()?, times.len()))
    }

    /// Records a batch of `n` samples padded to `extents` that took `seconds` from its
    /// upload to its crops, on a plan prepared before.
    pub(crate) fn record_batch_time(&self, n: usize, extents: &[usize], seconds: f64) {
        if let Ok(mut times) = self.batch_times.lock() {
            times.record((n * extents.iter().product::<usize>()) as u64, seconds);
        }
    }

    pub(crate) fn keep_measured_costs(&self, costs: &CellCosts) {
        if let Ok(mut kept) = self.costs.lock() {
            *kept = Some(costs.clone());
        }
    }

    /// Prepares the plan a batch of `samples` (checked) runs on, without running it.
    pub(crate) fn prepare_batch(&self, samples: &[&Tensor]) -> TractResult<()> {
        self.ragged_plan(samples).map(|_| ())
    }

    pub fn runtime(&self) -> &'static dyn Runtime {
        self.runtime
    }

    /// How batches reach this runnable's plans, and what memory and costs they have.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Prepares this runnable's plans, and schedules its runs, with `knobs` set (tract's
    /// knobs and ours, [`crate::knobs`]: `KnobScope::new([("TRACT_RAGGED_GRAPHS",
    /// "off")])`), whatever the environment says. Plans prepared before are dropped.
    pub fn with_knobs(mut self, knobs: KnobScope) -> RaggedRunnable {
        self.knobs = Some(knobs);
        let capacity = self
            .plans
            .get_mut()
            .map(|p| p.capacity)
            .unwrap_or(PlanCache::DEFAULT_CAPACITY);
        self.plans = Mutex::new(PlanCache::new(capacity));
        self
    }

    /// `f`'s value with this runnable's knobs set ([`Self::with_knobs`]), where it has any.
    pub(crate) fn in_knob_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.knobs {
            Some(knobs) => knobs.enter(f),
            None => f(),
        }
    }

    /// Prepares this runnable's plans at `precision` ([`crate::precision`]): fp32 (the
    /// default, exact) or TF32 on ragged-cuda's tensor cores. Plans prepared before are
    /// dropped.
    pub fn with_precision(
        self,
        precision: crate::precision::Precision,
    ) -> TractResult<RaggedRunnable> {
        Ok(match precision.knobs()? {
            Some(knobs) => self.with_knobs(knobs),
            None => self,
        })
    }

    /// Keeps at most `capacity` prepared plans (32 by default), dropping the least
    /// recently used. Plans prepared before are dropped.
    pub fn with_plan_capacity(mut self, capacity: usize) -> RaggedRunnable {
        self.plans = Mutex::new(PlanCache::new(capacity));
        self
    }

    /// How many prepared plans the runnable holds.
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().map(|p| p.plans.len()).unwrap_or(0)
    }

    /// The symbol values giving the model input the shape of a batch of `n` samples of
    /// padded extents `padded` (one per ragged axis), and of `like` along its other dims.
    fn symbol_values(
        &self,
        n: usize,
        padded: &[usize],
        like: &Tensor,
    ) -> TractResult<HashMap<Symbol, TDim>> {
        let mut values: HashMap<Symbol, TDim> = HashMap::default();
        let fact = &self.model.input_fact;
        let mut set = |dim: &TDim, value: usize, what: &str| -> TractResult<()> {
            match dim {
                TDim::Sym(s) => {
                    if let Some(previous) = values.insert(s.clone(), value.to_dim()) {
                        ensure!(
                            previous == value.to_dim(),
                            "symbol {s} would be both {previous} and {value}"
                        );
                    }
                    Ok(())
                }
                TDim::Val(v) => {
                    ensure!(
                        *v as usize == value,
                        "the model's {what} is fixed to {v}, the batch needs {value}"
                    );
                    Ok(())
                }
                other => bail!("the model's {what} is {other}: expected a symbol or a number"),
            }
        };
        set(&self.batch_dim, n, "batch size")?;
        for (extent, padded) in self.extents.iter().zip(padded) {
            match extent {
                Extent::Fixed(fixed) => ensure!(
                    fixed == padded,
                    "the model's ragged axis extent is fixed to {fixed}, the batch needs {padded}"
                ),
                Extent::Symbolic { symbol, .. } => {
                    let value = extent.symbol_value(*padded as i64)?;
                    set(
                        &TDim::Sym(symbol.clone()),
                        value as usize,
                        "ragged axis extent",
                    )?;
                }
            }
        }
        let ragged = &self.model.ragged.spec.axes;
        for (axis, dim) in fact.shape.iter().enumerate().skip(1) {
            if !ragged.contains(&axis) && dim.to_usize().is_err() {
                set(dim, like.shape()[axis - 1], &format!("axis {axis}"))?;
            }
        }
        Ok(values)
    }

    /// The model a plan runs for a batch of `n` samples padded to `width`, like `like`
    /// along the other axes: the transformed one (`ragged`), or the original. For
    /// inspecting plans.
    pub fn concrete_model(
        &self,
        n: usize,
        padded: &[usize],
        like: &Tensor,
        ragged: bool,
    ) -> TractResult<TypedModel> {
        let variant = if ragged {
            Variant::Ragged
        } else {
            Variant::Padded
        };
        let extents = padded.into();
        self.concrete(
            &PlanKey {
                variant,
                n,
                extents,
            },
            like,
        )
    }

    /// The model a plan for `key` runs, with every dim known.
    fn concrete(&self, key: &PlanKey, like: &Tensor) -> TractResult<TypedModel> {
        match &self.model.source {
            Source::Symbolic { original } => {
                let values = self.symbol_values(key.n, &key.extents, like)?;
                match key.variant {
                    Variant::Ragged => self.model.ragged.model.set_symbols(&values),
                    Variant::Padded => original.set_symbols(&values),
                }
            }
            Source::PerShape { model, roles } => {
                let spec = &self.model.ragged.spec;
                let typed = type_at(model, spec, key.n, &key.extents, Some(like))?;
                let (mut model, own) = match key.variant {
                    Variant::Ragged => {
                        let ragged = ragged_with(&typed, spec, roles.as_deref())?;
                        let own = ragged.outputs.len();
                        let mut model = ragged.model;
                        crate::segment::Segments::declutter(&mut model)?;
                        (model, own)
                    }
                    Variant::Padded => {
                        let own = typed.outputs.len();
                        (typed, own)
                    }
                };
                if let Some(k) = self.model.top_k {
                    crate::reduce::top_k_outputs(&mut model, own, k)?;
                }
                Ok(model)
            }
        }
    }

    /// The plan for `key`, prepared on first use. Prepared outside the cache's lock: a
    /// slow preparation does not hold other batch shapes back.
    fn plan(&self, key: PlanKey, like: &Tensor) -> TractResult<(Arc<dyn Runnable>, bool)> {
        if let Some(plan) = self
            .plans
            .lock()
            .map_err(|_| anyhow!("plan cache poisoned"))?
            .get(&key)
        {
            return Ok((plan, false));
        }
        let shape = format!("N={}, W={}", key.n, extents_string(&key.extents));
        let what = || format!("Preparing a plan for {shape} on {}", self.runtime.name());
        let plan: Arc<dyn Runnable> = crate::no_panic(what, || {
            let mut concrete = self
                .concrete(&key, like)
                .with_context(|| format!("Making the model concrete for {shape}"))?;
            self.backend
                .before_prepare(&mut concrete)
                .with_context(|| format!("Rewriting the model for {shape}"))?;
            let prepare = || crate::segment::prepare(&*self.runtime, concrete);
            let plan = match &self.knobs {
                Some(knobs) => knobs.enter(prepare),
                None => prepare(),
            };
            Ok(plan.with_context(what)?.into())
        })?;
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| anyhow!("plan cache poisoned"))?;
        Ok((plans.insert(key, plan), true))
    }

    /// The peak memory, in bytes, of a ragged batch of `n` samples padded to `padded` (one
    /// extent per ragged axis), from the transformed model's symbolic shapes
    /// ([`crate::memory::peak_memory`]). A model typed per shape scales its probe's.
    pub fn peak_memory(&self, n: usize, padded: &[usize]) -> TractResult<u64> {
        let key = (n, TVec::from(padded));
        let cache = |m: &Mutex<HashMap<(usize, TVec<usize>), u64>>| {
            m.lock().ok().and_then(|m| m.get(&key).copied())
        };
        if let Some(bytes) = cache(&self.memory) {
            return Ok(bytes);
        }
        let bytes = self.eval_peak_memory(n, padded)?;
        if let Ok(mut m) = self.memory.lock() {
            m.insert(key, bytes);
        }
        Ok(bytes)
    }

    /// Symbol values for the batch and the ragged extents.
    fn shape_values(&self, n: usize, padded: &[usize]) -> SymbolValues {
        let mut values = SymbolValues::default();
        if let TDim::Sym(s) = &self.batch_dim {
            values.set(s, n as i64);
        }
        for (extent, padded) in self.extents.iter().zip(padded) {
            // Padded extents are multiples of the input fact's (the alignment).
            if let (Some(s), Ok(v)) = (extent.symbol(), extent.symbol_value(*padded as i64)) {
                values.set(s, v);
            }
        }
        values
    }

    /// The batch size and the product of the ragged extents of a per-shape model's probe.
    fn probe_cells(&self) -> TractResult<(u64, u64)> {
        let fact = self
            .model
            .ragged
            .model
            .input_fact(self.model.ragged.input)?;
        let n = fact.shape[0].to_usize()?.max(1) as u64;
        let mut cells = 1u64;
        for axis in &self.model.ragged.spec.axes {
            cells *= fact.shape[*axis].to_usize()?.max(1) as u64;
        }
        Ok((n, cells))
    }

    fn eval_peak_memory(&self, n: usize, padded: &[usize]) -> TractResult<u64> {
        let values = self.shape_values(n, padded);
        let probe = crate::memory::peak_memory(&self.model.ragged.model, &values)?;
        match &self.model.source {
            Source::Symbolic { .. } => Ok(probe),
            Source::PerShape { .. } => {
                let (probe_n, probe_cells) = self.probe_cells()?;
                let cells = n as u64 * padded.iter().product::<usize>() as u64;
                Ok(probe * cells / (probe_n * probe_cells))
            }
        }
    }

    /// The bytes of the model's constants (its weights): about what each prepared plan
    /// holds a copy of, packed for its shapes.
    pub fn weight_bytes(&self) -> u64 {
        self.model
            .ragged
            .model
            .nodes()
            .iter()
            .flat_map(|n| &n.outputs)
            .filter_map(|o| o.fact.konst.as_ref())
            .map(|k| (k.len() * k.datum_type().size_of()) as u64)
            .sum()
    }

    /// The bytes one sample of widths `widths` (one per ragged axis) gets as outputs, at
    /// most: the outputs of a batch of one at its padded extents. For holding outputs
    /// within a memory budget.
    pub fn sample_output_bytes(&self, widths: &[usize]) -> TractResult<u64> {
        let padded = self.padded_extents(widths);
        let values = self.shape_values(1, &padded);
        let model = &self.model.ragged.model;
        let mut bytes = 0u64;
        for outlet in model.output_outlets()? {
            let fact = model.outlet_fact(*outlet)?;
            let volume = fact.shape.volume().eval_to_i64(&values)?.max(0) as u64;
            bytes += volume * fact.datum_type.size_of() as u64;
        }
        Ok(match &self.model.source {
            Source::Symbolic { .. } => bytes,
            Source::PerShape { .. } => {
                // The probe's outputs, for its own batch size and extents.
                let (probe_n, probe_cells) = self.probe_cells()?;
                let cells = padded.iter().product::<usize>() as u64;
                (bytes * cells).div_ceil(probe_n * probe_cells)
            }
        })
    }

    /// The padded extents a batch of widths up to `maxima` (one per ragged axis) runs at:
    /// each rounded up to its bucket (and to the multiple the model takes there), or the
    /// model's fixed extent there.
    pub fn padded_extents(&self, maxima: &[usize]) -> TVec<usize> {
        self.extents
            .iter()
            .zip(maxima)
            .zip(&self.sample.alignment)
            .map(|((extent, max), (m, _))| match extent {
                Extent::Fixed(fixed) => *fixed,
                Extent::Symbolic { .. } => self.bucketing.round(*max).next_multiple_of(*m as usize),
            })
            .collect()
    }

    /// The padded extent of the last ragged axis for a batch of widths up to `max` along
    /// it (a line's width).
    pub fn padded_width(&self, max: usize) -> usize {
        match self.extents.last() {
            Some(Extent::Fixed(fixed)) => *fixed,
            _ => self.bucketing.round(max),
        }
    }

    /// Runs samples of a model of one input as one ragged batch ([`Self::run_batch`]),
    /// with what the run did.
    pub fn run_batch_with_info(
        &self,
        samples: &[impl Borrow<Tensor>],
    ) -> TractResult<(Vec<TVec<Tensor>>, RunInfo)> {
        self.sample.check(samples)?;
        self.run_checked(samples)
    }

    /// [`Self::run_batch_with_info`] on samples already checked (by `run_many`, once for
    /// all its batches).
    pub(crate) fn run_checked(
        &self,
        samples: &[impl Borrow<Tensor>],
    ) -> TractResult<(Vec<TVec<Tensor>>, RunInfo)> {
        self.only_input()?;
        let (plan, prepared, widths, padded) = self.ragged_plan(samples)?;
        let n = samples.len();
        let started = Instant::now();
        // Waits for turns before this batch were other batches'.
        crate::backend::turns::waited();
        let upload = timeline::phase(Phase::Upload, n, &padded, || self.upload(samples, &padded));
        let mut inputs = tvec!(upload?);
        inputs.extend(widths_inputs(&widths)?);
        let shape = extents_string(&padded);
        let what = || format!("Running a ragged batch of {n} samples padded to {shape}");
        let outputs = self.run_plan(&*plan, inputs, n, &padded, &what)?;
        let cropped = self.crop_batch(&outputs, n, &padded)?;
        if !prepared {
            // Without the wait for the lane's turn: another batch's run, not this one's.
            let took = started
                .elapsed()
                .saturating_sub(crate::backend::turns::waited());
            self.record_batch_time(n, &padded, took.as_secs_f64());
        }
        let segments = crate::segment::count(&*plan);
        let info = RunInfo {
            samples: samples.len(),
            padded_width: *padded.last().context("no ragged axis")?,
            padded,
            prepared,
            plan: format!(
                "ragged N={} W={shape} on {}{}",
                samples.len(),
                self.runtime.name(),
                if segments > 1 {
                    format!(", in {segments} segments")
                } else {
                    String::new()
                }
            ),
            segments,
        };
        Ok((cropped, info))
    }

    /// The packed batch of `samples`, padded to `padded` (per ragged axis), as the plan
    /// takes it.
    pub(crate) fn upload(
        &self,
        samples: &[impl Borrow<Tensor>],
        padded: &[usize],
    ) -> TractResult<TValue> {
        let samples: Vec<&Tensor> = samples.iter().map(|s| s.borrow()).collect();
        crate::no_panic(
            || {
                format!(
                    "Packing {} samples padded to {}",
                    samples.len(),
                    extents_string(padded)
                )
            },
            || self.backend.upload(&samples, &self.sample.axes, padded),
        )
    }

    /// Each of the `n` samples' outputs, cropped out of a run's `outputs`.
    pub(crate) fn download(&self, outputs: &[TValue], n: usize) -> TractResult<Vec<TVec<Tensor>>> {
        crate::no_panic(
            || format!("Cropping the outputs of {n} samples"),
            || {
                self.backend
                    .download(outputs, &self.model.ragged.outputs, n)
            },
        )
    }

    /// Runs a batch already packed: `batch` with its samples along axis 0, padded along
    /// the ragged axis, and `widths` one per sample. Returns the transformed model's raw
    /// outputs: the model's own, then the widths outputs. For a model of one ragged axis
    /// ([`Self::run_padded_axes`] for several).
    #[deprecated(note = "use run_packed")]
    pub fn run_padded(&self, batch: Tensor, widths: &[i64]) -> TractResult<TVec<TValue>> {
        self.packed(batch, &[widths])
    }

    /// [`Self::run_padded`] with the samples' widths along each ragged axis.
    #[deprecated(note = "use run_packed")]
    pub fn run_padded_axes(&self, batch: Tensor, widths: &[&[i64]]) -> TractResult<TVec<TValue>> {
        self.packed(batch, widths)
    }

    /// [`Self::run_packed`].
    pub(crate) fn packed(&self, batch: Tensor, widths: &[&[i64]]) -> TractResult<TVec<TValue>> {
        let axes = &self.model.ragged.spec.axes;
        ensure!(
            batch.rank() == self.sample.dims.len() + 1,
            "the batch has rank {}, the model input has rank {}",
            batch.rank(),
            self.sample.dims.len() + 1
        );
        ensure!(
            widths.len() == axes.len(),
            "widths for {} ragged axes, the model has {}",
            widths.len(),
            axes.len()
        );
        let n = batch.shape()[0];
        let mut padded = tvec!();
        for (axis, widths) in axes.iter().zip(widths) {
            ensure!(
                widths.len() == n,
                "{} widths for a batch of {n} samples",
                widths.len()
            );
            let extent = batch.shape()[*axis];
            for (ix, w) in widths.iter().enumerate() {
                ensure!(
                    *w >= 1 && *w as usize <= extent,
                    BadSample {
                        index: ix,
                        reason: format!(
                            "sample {ix} has width {w} along axis {axis}, outside 1..={extent} \
                             (the padded width)"
                        ),
                    }
                );
            }
            padded.push(extent);
        }
        self.width_table_axes(widths)?;
        let key = PlanKey {
            variant: Variant::Ragged,
            n,
            extents: padded,
        };
        let like = batch.slice(0, 0, 1)?.into_shape(&batch.shape()[1..])?;
        let (plan, _) = self.plan(key, &like)?;
        let owned: Vec<Vec<i64>> = widths.iter().map(|w| w.to_vec()).collect();
        let mut inputs = tvec!(batch.into_tvalue());
        inputs.extend(widths_inputs(&owned)?);
        crate::no_panic(
            || format!("Running a packed batch of {n} samples"),
            || plan.run(inputs),
        )
    }

    /// Checks that the model takes every sample's widths (a sample too narrow fails).
    pub(crate) fn check_widths_of(&self, samples: &[impl Borrow<Tensor>]) -> TractResult<()> {
        self.width_table_axes(&slices(&widths(samples, &self.sample.axes)))?;
        Ok(())
    }

    /// One sample alone through the original model, as [`Self::run_one_by_one`] runs
    /// each, the sample checked as [`Self::check_alone`] does.
    pub(crate) fn run_alone(&self, sample: &Tensor) -> TractResult<TVec<Tensor>> {
        self.only_input()?;
        let (plan, extents) = self.alone_plan(sample)?;
        let batch = timeline::phase(Phase::Upload, 1, &extents, || {
            self.upload(&[sample], &extents)
        })?;
        let what = || {
            format!(
                "Running a sample of extents {} alone",
                extents_string(&extents)
            )
        };
        let outputs = self.run_plan(&*plan, tvec!(batch), 1, &extents, &what)?;
        self.outputs_alone(outputs, &extents)
    }

    /// Runs `plan` on `inputs`, a batch of `n` samples padded to `extents`: the timeline's
    /// run phase, the backend's queued work waited for while it is recorded (so that a
    /// batch's device time is its run's), an error or a panic of tract's in context
    /// `what`.
    pub(crate) fn run_plan(
        &self,
        plan: &dyn Runnable,
        inputs: TVec<TValue>,
        n: usize,
        extents: &[usize],
        what: &dyn Fn() -> String,
    ) -> TractResult<TVec<TValue>> {
        // In the lane's turn, where the lanes' runs take turns (`backend::turns`).
        crate::backend::turns::in_turn(n, extents, || {
            timeline::phase(Phase::Run, n, extents, || {
                let outputs = crate::no_panic(what, || plan.run(inputs).with_context(what))?;
                if timeline::recording() {
                    self.backend.settle()?;
                }
                Ok(outputs)
            })
        })
    }

    /// Each of the `n` samples' outputs cropped out of a batch's: the timeline's download
    /// phase.
    pub(crate) fn crop_batch(
        &self,
        outputs: &[TValue],
        n: usize,
        extents: &[usize],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        timeline::phase(Phase::Download, n, extents, || self.download(outputs, n))
    }

    /// The outputs of a sample run alone through the original model, batch axis removed
    /// where it lies (a transpose may have moved it): the timeline's download phase.
    pub(crate) fn outputs_alone(
        &self,
        outputs: TVec<TValue>,
        extents: &[usize],
    ) -> TractResult<TVec<Tensor>> {
        timeline::phase(Phase::Download, 1, extents, || {
            outputs
                .into_iter()
                .zip(&self.model.ragged.outputs)
                .map(|(o, layout)| {
                    let mut t = o.into_tensor();
                    if let Some(batch) = layout.batch {
                        t.remove_axis(batch)?;
                    }
                    Ok(t)
                })
                .collect()
        })
    }

    /// The plan a sample runs on alone (the original model at its own extents), prepared
    /// on first use, and those extents.
    pub(crate) fn alone_plan(
        &self,
        sample: &Tensor,
    ) -> TractResult<(Arc<dyn Runnable>, TVec<usize>)> {
        self.sample.check_sample(0, sample, None)?;
        let extents = self.sample.widths_of(sample);
        let widths: Vec<Vec<i64>> = extents.iter().map(|e| vec![*e as i64]).collect();
        self.width_table_axes(&slices(&widths))?;
        let key = PlanKey {
            variant: Variant::Padded,
            n: 1,
            extents: extents.clone(),
        };
        let (plan, _) = self.plan(key, sample)?;
        Ok((plan, extents))
    }

    /// Whether sample `ix` can run at all, whatever its batch: it agrees with the
    /// [`SampleFact`] (and with `first`, a sample it may share a batch with), the model
    /// takes its widths, and a batch of it alone needs at most `budget` bytes.
    pub fn check_alone(
        &self,
        ix: usize,
        sample: &Tensor,
        first: Option<(usize, &Tensor)>,
        budget: u64,
    ) -> TractResult<()> {
        self.sample.check_sample(ix, sample, first)?;
        let extents = self.sample.widths_of(sample);
        let shape = extents_string(&extents);
        let widths: Vec<Vec<i64>> = extents.iter().map(|e| vec![*e as i64]).collect();
        // Too narrow for the model: the sample's own fault.
        self.width_table_axes(&slices(&widths)).map_err(|e| {
            anyhow!(BadSample {
                index: ix,
                reason: format!("sample {ix} (width {shape}): {e:#}"),
            })
        })?;
        let peak = self.peak_memory(1, &self.padded_extents(&extents))?;
        ensure!(
            peak <= budget,
            OutOfMemory {
                what: format!(
                    "sample {ix} (width {shape}) alone needs {peak} bytes, above the budget of \
                     {budget} bytes"
                ),
            }
        );
        Ok(())
    }

    /// What everybody does: the original model on the batch padded with zeros, outputs
    /// cropped to the widths the samples have alone. Inexact: the padding leaks into the
    /// samples' results. For comparisons.
    pub fn run_naive_padded(
        &self,
        samples: &[impl Borrow<Tensor>],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.sample.check(samples)?;
        let widths = widths(samples, &self.sample.axes);
        let table = self.width_table_axes(&slices(&widths))?;
        let padded: TVec<usize> = maxima(&widths)?.into_iter().collect();
        let key = PlanKey {
            variant: Variant::Padded,
            n: samples.len(),
            extents: padded.clone(),
        };
        let (plan, _) = self.plan(key, samples[0].borrow())?;
        let batch = self.upload(samples, &padded)?;
        let mut outputs = crate::no_panic(
            || "Running a padded batch".into(),
            || plan.run(tvec!(batch)),
        )?;
        let layouts = &self.model.ragged.outputs;
        let n_widths = layouts
            .iter()
            .flat_map(|l| l.ragged.iter().map(|r| r.widths_output))
            .max();
        if let Some(max) = n_widths {
            outputs.resize(max + 1, tensor0(0i64).into_tvalue());
            for layout in layouts {
                for r in &layout.ragged {
                    outputs[r.widths_output] = table
                        .slice(0, r.row, r.row + 1)?
                        .into_shape(&[samples.len()])?
                        .into_tvalue();
                }
            }
        }
        self.download(&outputs, samples.len())
    }

    /// The widths table for these input widths, of a model with one ragged axis.
    pub fn width_table(&self, widths: &[i64]) -> TractResult<Tensor> {
        self.width_table_axes(&[widths])
    }

    /// The widths table for these input widths, one slice per ragged axis: empty for a
    /// model with nothing to mask (its ragged axes all of an extent the fact fixes).
    pub fn width_table_axes(&self, widths: &[&[i64]]) -> TractResult<Tensor> {
        let none = crate::ops::WidthTable {
            fns: vec![],
            emit: vec![],
        };
        let table = self
            .model
            .ragged
            .model
            .nodes()
            .iter()
            .find_map(|n| n.op_as::<crate::ops::WidthTable>())
            .unwrap_or(&none);
        ensure!(
            widths.len() == self.model.ragged.spec.axes.len(),
            "widths for {} ragged axes, the model has {}",
            widths.len(),
            self.model.ragged.spec.axes.len()
        );
        table.compute(widths)
    }
}

/// Per ragged axis, its widths as a slice.
fn slices(widths: &[Vec<i64>]) -> Vec<&[i64]> {
    widths.iter().map(|w| w.as_slice()).collect()
}

/// The largest width along each ragged axis.
fn maxima(widths: &[Vec<i64>]) -> TractResult<Vec<usize>> {
    widths
        .iter()
        .map(|w| Ok(*w.iter().max().context("no sample")? as usize))
        .collect()
}

/// The widths inputs of a run: one `[N]` tensor per ragged axis.
pub(crate) fn widths_inputs(widths: &[Vec<i64>]) -> TractResult<TVec<TValue>> {
    widths
        .iter()
        .map(|w| Ok(Tensor::from_shape(&[w.len()], w)?.into_tvalue()))
        .collect()
}
