//! Running ragged batches: [`RaggedModel`] holds the transformed model, [`RaggedRunnable`]
//! runs batches of samples through plans prepared per padded shape.
//!
//! A model typed with a symbolic batch N and width W runs as it is, but tract runs such a
//! plan several times slower than one prepared for concrete shapes (measured on PP-OCRv4
//! rec on the CPU: 1064 ms against 138 ms for N=3, W=333). So the runnable keeps a cache of
//! plans, one per batch size and padded width, each prepared from the symbolic model with
//! N and W set. The padded width is rounded up to a bucket: the masks make the extra
//! padding harmless, and the buckets keep the cache small.

use std::borrow::Borrow;
use std::sync::Mutex;

use tract_core::internal::*;
use tract_core::knobs::KnobScope;
use tract_onnx::prelude::{InferenceModel, InferenceModelExt};
use tract_onnx::tract_hir::infer::Factoid;

use crate::backend::{self, Backend};
use crate::batch::{SampleFact, widths};
use crate::spec::RaggedSpec;
use crate::transform::{Ragged, ragged};

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
    PerShape { model: Box<InferenceModel> },
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
        })
    }

    /// A model that tract cannot type with a symbolic batch and width: typed again for
    /// every batch size and padded width. `model`'s input fact says which dims are the
    /// batch and the width (symbols) and which are fixed. The transform is run once here,
    /// on a probe shape, to refuse a model it cannot handle before any batch.
    pub fn per_shape(model: InferenceModel, spec: RaggedSpec) -> TractResult<RaggedModel> {
        let mut last = None;
        for probe in [64, 256, 1024] {
            match crate::no_panic(
                || format!("Typing the model at width {probe}"),
                || type_at(&model, &spec, 2, probe, None),
            ) {
                Ok(typed) => {
                    let ragged = ragged(&typed, &spec)?;
                    // The batch and the width stay free: plans set them.
                    let mut input_fact = typed.input_fact(ragged.input)?.clone();
                    let mut shape = input_fact.shape.to_tvec();
                    shape[0] = model.symbols.sym("N").to_dim();
                    shape[spec.axis] = model.symbols.sym("W").to_dim();
                    input_fact.shape = shape.into();
                    let source = Source::PerShape {
                        model: Box::new(model),
                    };
                    return Ok(RaggedModel {
                        source,
                        ragged,
                        input_fact,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.context("no probe shape")?)
            .context("Typing the model at a probe shape (batch 2, widths 64, 256, 1024)")
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

/// `model` typed with its ragged input's batch and width set to `n` and `width`, and its
/// other free dims to those of `like` (a sample).
///
/// Not decluttered: declutter simplifies ops for the shape at hand, and some of those
/// simplifications hold for that width only (a ceil-mode pool whose padded width happens
/// to be even becomes a floor-mode one). The transform must see the op as written.
fn type_at(
    model: &InferenceModel,
    spec: &RaggedSpec,
    n: usize,
    width: usize,
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
    let rank = fact
        .shape
        .rank()
        .concretize()
        .context("the ragged input's rank is unknown")? as usize;
    for axis in 0..rank {
        let value = match axis {
            0 => Some(n),
            a if a == spec.axis => Some(width),
            a => like.map(|t| t.shape()[a - 1]),
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
    model.set_input_fact(ix, fact)?;
    model.into_typed()
}

/// Which model a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Variant {
    /// The transformed model: exact.
    Ragged,
    /// The original model on a padded batch: what everybody does, inexact.
    Padded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    variant: Variant,
    n: usize,
    width: usize,
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
                .map(|(k, _)| *k);
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
    pub padded_width: usize,
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
    width_dim: TDim,
    pub bucketing: Bucketing,
    plans: Mutex<PlanCache>,
    /// Peak memory by batch size and padded width, computed once.
    memory: Mutex<HashMap<(usize, usize), u64>>,
}

impl RaggedRunnable {
    fn new(
        model: RaggedModel,
        runtime: &'static dyn Runtime,
        backend: Arc<dyn Backend>,
    ) -> TractResult<RaggedRunnable> {
        runtime.check()?;
        let ragged = &model.ragged;
        ensure!(
            ragged.model.inputs.len() == 2,
            "the model has {} inputs: running samples needs a model whose only input is the \
             ragged one (run the transformed model directly otherwise)",
            ragged.model.inputs.len() - 1
        );
        let fact = &model.input_fact;
        let batch_dim = fact.shape[0].clone();
        let width_dim = fact.shape[ragged.spec.axis].clone();
        let dims = fact
            .shape
            .iter()
            .skip(1)
            .map(|d| d.to_usize().ok())
            .collect();
        let sample = SampleFact {
            datum_type: fact.datum_type,
            dims,
            axis: ragged.spec.axis - 1,
        };
        Ok(RaggedRunnable {
            model,
            runtime,
            backend,
            knobs: None,
            sample,
            batch_dim,
            width_dim,
            bucketing: Bucketing::default(),
            plans: Mutex::new(PlanCache::new(PlanCache::DEFAULT_CAPACITY)),
            memory: Mutex::new(HashMap::default()),
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
        let widths = widths(samples, self.sample.axis);
        self.width_table(&widths)?;
        let padded = self.padded_width(*widths.iter().max().context("no sample")? as usize);
        let key = PlanKey {
            variant: Variant::Ragged,
            n: samples.len(),
            width: padded,
        };
        let (plan, _) = self.plan(key, samples[0].borrow())?;
        let batch = self.upload(samples, padded)?;
        Ok((
            plan,
            tvec!(
                batch,
                Tensor::from_shape(&[widths.len()], &widths)?.into_tvalue()
            ),
        ))
    }

    pub fn runtime(&self) -> &'static dyn Runtime {
        self.runtime
    }

    /// How batches reach this runnable's plans, and what memory and costs they have.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Prepares this runnable's plans with `knobs` set (tract's knobs, ragged-cuda's
    /// among them: `KnobScope::new([("TRACT_RAGGED_GRAPHS", "off")])`), whatever the
    /// environment says. Plans prepared before are dropped.
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
    /// padded width `width`, and of `like` along its other dims.
    fn symbol_values(
        &self,
        n: usize,
        width: usize,
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
        set(&self.width_dim, width, "ragged axis extent")?;
        for (axis, dim) in fact.shape.iter().enumerate().skip(1) {
            if axis != self.model.ragged.spec.axis && dim.to_usize().is_err() {
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
        width: usize,
        like: &Tensor,
        ragged: bool,
    ) -> TractResult<TypedModel> {
        let variant = if ragged {
            Variant::Ragged
        } else {
            Variant::Padded
        };
        self.concrete(PlanKey { variant, n, width }, like)
    }

    /// The model a plan for `key` runs, with every dim known.
    fn concrete(&self, key: PlanKey, like: &Tensor) -> TractResult<TypedModel> {
        match &self.model.source {
            Source::Symbolic { original } => {
                let values = self.symbol_values(key.n, key.width, like)?;
                match key.variant {
                    Variant::Ragged => self.model.ragged.model.set_symbols(&values),
                    Variant::Padded => original.set_symbols(&values),
                }
            }
            Source::PerShape { model } => {
                let spec = &self.model.ragged.spec;
                let typed = type_at(model, spec, key.n, key.width, Some(like))?;
                match key.variant {
                    Variant::Ragged => {
                        let mut model = ragged(&typed, spec)?.model;
                        crate::segment::Segments::declutter(&mut model)?;
                        Ok(model)
                    }
                    Variant::Padded => Ok(typed),
                }
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
        let what = || {
            format!(
                "Preparing a plan for N={}, W={} on {}",
                key.n,
                key.width,
                self.runtime.name()
            )
        };
        let plan: Arc<dyn Runnable> = crate::no_panic(what, || {
            let concrete = self.concrete(key, like).with_context(|| {
                format!(
                    "Making the model concrete for N={} and W={}",
                    key.n, key.width
                )
            })?;
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

    /// The peak memory, in bytes, of a ragged batch of `n` samples padded to `width`, from
    /// the transformed model's symbolic shapes ([`crate::memory::peak_memory`]). A
    /// model typed per shape scales its probe's.
    pub fn peak_memory(&self, n: usize, width: usize) -> TractResult<u64> {
        let cache = |m: &Mutex<HashMap<(usize, usize), u64>>| {
            m.lock().ok().and_then(|m| m.get(&(n, width)).copied())
        };
        if let Some(bytes) = cache(&self.memory) {
            return Ok(bytes);
        }
        let bytes = self.eval_peak_memory(n, width)?;
        if let Ok(mut m) = self.memory.lock() {
            m.insert((n, width), bytes);
        }
        Ok(bytes)
    }

    fn eval_peak_memory(&self, n: usize, width: usize) -> TractResult<u64> {
        let mut values = SymbolValues::default();
        for (dim, value) in [(&self.batch_dim, n), (&self.width_dim, width)] {
            if let TDim::Sym(s) = dim {
                values.set(s, value as i64);
            }
        }
        match &self.model.source {
            Source::Symbolic { .. } => {
                crate::memory::peak_memory(&self.model.ragged.model, &values)
            }
            Source::PerShape { .. } => {
                let fact = self
                    .model
                    .ragged
                    .model
                    .input_fact(self.model.ragged.input)?;
                let probe_n = fact.shape[0].to_usize()? as u64;
                let probe_w = fact.shape[self.model.ragged.spec.axis].to_usize()? as u64;
                let probe = crate::memory::peak_memory(&self.model.ragged.model, &values)?;
                Ok(probe * (n * width) as u64 / (probe_n * probe_w).max(1))
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

    /// The bytes one sample of width `width` gets as outputs, at most: the outputs of a
    /// batch of one at its padded width. For holding outputs within a memory budget.
    pub fn sample_output_bytes(&self, width: usize) -> TractResult<u64> {
        let padded = self.padded_width(width);
        let mut values = SymbolValues::default();
        for (dim, value) in [(&self.batch_dim, 1), (&self.width_dim, padded)] {
            if let TDim::Sym(s) = dim {
                values.set(s, value as i64);
            }
        }
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
                // The probe's outputs, for its own batch size and width.
                let fact = model.input_fact(self.model.ragged.input)?;
                let probe_n = fact.shape[0].to_usize()?.max(1) as u64;
                let probe_w = fact.shape[self.model.ragged.spec.axis].to_usize()?.max(1) as u64;
                (bytes * padded as u64).div_ceil(probe_n * probe_w)
            }
        })
    }

    /// The padded width a batch of widths up to `max` runs at.
    pub fn padded_width(&self, max: usize) -> usize {
        match self.width_dim.to_usize() {
            Ok(fixed) => fixed,
            Err(_) => self.bucketing.round(max),
        }
    }

    /// Runs samples (without their batch axis) as one ragged batch. Returns, for each
    /// sample, its outputs without the batch axis, cropped to its widths.
    pub fn run_batch(&self, samples: &[impl Borrow<Tensor>]) -> TractResult<Vec<TVec<Tensor>>> {
        Ok(self.run_batch_with_info(samples)?.0)
    }

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
        let widths = widths(samples, self.sample.axis);
        // Before any plan: a batch of samples too narrow for the model must not reach
        // tract with a padded width that makes some tensor empty.
        self.width_table(&widths)?;
        let max = *widths.iter().max().context("no sample")? as usize;
        let padded = self.padded_width(max);
        ensure!(
            max <= padded,
            "a sample has width {max}, above the model's fixed extent {padded} along the ragged axis"
        );
        let key = PlanKey {
            variant: Variant::Ragged,
            n: samples.len(),
            width: padded,
        };
        let (plan, prepared) = self.plan(key, samples[0].borrow())?;
        let batch = self.upload(samples, padded)?;
        let widths_tensor = Tensor::from_shape(&[widths.len()], &widths)?;
        let what = || {
            format!(
                "Running a ragged batch of {} samples padded to {padded}",
                samples.len()
            )
        };
        let outputs = crate::no_panic(what, || {
            plan.run(tvec!(batch, widths_tensor.into_tvalue()))
                .with_context(what)
        })?;
        let cropped = self.download(&outputs, samples.len())?;
        let segments = crate::segment::count(&*plan);
        let info = RunInfo {
            samples: samples.len(),
            padded_width: padded,
            prepared,
            plan: format!(
                "ragged N={} W={padded} on {}{}",
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

    /// The packed batch of `samples`, padded to `padded`, as the plan takes it.
    fn upload(&self, samples: &[impl Borrow<Tensor>], padded: usize) -> TractResult<TValue> {
        let samples: Vec<&Tensor> = samples.iter().map(|s| s.borrow()).collect();
        crate::no_panic(
            || format!("Packing {} samples padded to {padded}", samples.len()),
            || self.backend.upload(&samples, self.sample.axis, padded),
        )
    }

    /// Each of the `n` samples' outputs, cropped out of a run's `outputs`.
    fn download(&self, outputs: &[TValue], n: usize) -> TractResult<Vec<TVec<Tensor>>> {
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
    /// outputs: the model's own, then the widths outputs.
    pub fn run_padded(&self, batch: Tensor, widths: &[i64]) -> TractResult<TVec<TValue>> {
        let axis = self.model.ragged.spec.axis;
        ensure!(
            batch.rank() == self.sample.dims.len() + 1,
            "the batch has rank {}, the model input has rank {}",
            batch.rank(),
            self.sample.dims.len() + 1
        );
        let n = batch.shape()[0];
        ensure!(
            widths.len() == n,
            "{} widths for a batch of {n} samples",
            widths.len()
        );
        let padded = batch.shape()[axis];
        for (ix, w) in widths.iter().enumerate() {
            ensure!(
                *w >= 1 && *w as usize <= padded,
                "sample {ix} has width {w}, outside 1..={padded} (the padded width)"
            );
        }
        self.width_table(widths)?;
        let key = PlanKey {
            variant: Variant::Ragged,
            n,
            width: padded,
        };
        let like = batch.slice(0, 0, 1)?.into_shape(&batch.shape()[1..])?;
        let (plan, _) = self.plan(key, &like)?;
        let widths = Tensor::from_shape(&[n], widths)?.into_tvalue();
        crate::no_panic(
            || format!("Running a packed batch of {n} samples"),
            || plan.run(tvec!(batch.into_tvalue(), widths)),
        )
    }

    /// The reference: each sample alone through the original model (batch of one, its
    /// own width, no padding).
    pub fn run_one_by_one(
        &self,
        samples: &[impl Borrow<Tensor>],
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.sample.check(samples)?;
        self.width_table(&widths(samples, self.sample.axis))?;
        samples
            .iter()
            .enumerate()
            .map(|(ix, sample)| {
                self.run_alone(sample.borrow())
                    .with_context(|| format!("Running sample {ix} alone"))
            })
            .collect()
    }

    /// One sample alone through the original model, as [`Self::run_one_by_one`] runs
    /// each, the sample checked as [`Self::check_alone`] does.
    pub fn run_alone(&self, sample: &Tensor) -> TractResult<TVec<Tensor>> {
        self.sample.check_sample(0, sample, None)?;
        let w = sample.shape()[self.sample.axis];
        self.width_table(&[w as i64])?;
        let key = PlanKey {
            variant: Variant::Padded,
            n: 1,
            width: w,
        };
        let (plan, _) = self.plan(key, sample)?;
        let batch = self.upload(&[sample], w)?;
        let outputs = crate::no_panic(
            || format!("Running a sample of width {w} alone"),
            || plan.run(tvec!(batch)),
        )?;
        // The batch axis may have moved (a transpose): remove it where it lies.
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
    }

    /// Whether sample `ix` can run at all, whatever its batch: it agrees with the
    /// [`SampleFact`] (and with `first`, a sample it may share a batch with), the model
    /// takes its width, and a batch of it alone needs at most `budget` bytes.
    pub fn check_alone(
        &self,
        ix: usize,
        sample: &Tensor,
        first: Option<(usize, &Tensor)>,
        budget: u64,
    ) -> TractResult<()> {
        self.sample.check_sample(ix, sample, first)?;
        let w = sample.shape()[self.sample.axis];
        self.width_table(&[w as i64])
            .with_context(|| format!("sample {ix} (width {w})"))?;
        let peak = self.peak_memory(1, self.padded_width(w))?;
        ensure!(
            peak <= budget,
            "sample {ix} (width {w}) alone needs {peak} bytes, above the budget of {budget} bytes"
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
        let widths = widths(samples, self.sample.axis);
        let table = self.width_table(&widths)?;
        let padded = *widths.iter().max().context("no sample")? as usize;
        let key = PlanKey {
            variant: Variant::Padded,
            n: samples.len(),
            width: padded,
        };
        let (plan, _) = self.plan(key, samples[0].borrow())?;
        let batch = self.upload(samples, padded)?;
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

    /// The widths table for these input widths.
    pub fn width_table(&self, widths: &[i64]) -> TractResult<Tensor> {
        let table = self
            .model
            .ragged
            .model
            .nodes()
            .iter()
            .find_map(|n| n.op_as::<crate::ops::WidthTable>())
            .context("the ragged model has no widths table")?;
        table.compute(widths)
    }
}
