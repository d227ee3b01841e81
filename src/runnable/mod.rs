//! A ragged model prepared on a runtime: [`RaggedRunnable`].
//!
//! It holds the [`RaggedModel`], the runtime and its backend, the knobs its plans are
//! prepared under, what every sample must agree with, and what the scheduler learnt
//! running it. Its parts, in the order a batch meets them:
//! - `plans`: the plans prepared so far, one per batch size and padded-width bucket;
//! - `memory`: what a batch of a given shape needs, for the scheduler's budget;
//! - `execute`: one batch packed, run and cropped, or a batch the caller packed;
//! - `alone`: each sample alone through the original model (the reference), and the
//!   checks a sample passes before it may join any batch;
//! - `ahead`: one by one, the next samples' plans prepared on other threads.
//!
//! The verbs a caller uses ([`crate::run`]) are built on these.

use crate::error::{BadSample, OutOfMemory};
use std::borrow::Borrow;
use std::sync::Mutex;
use std::time::Instant;

use tract_core::internal::*;
use tract_core::knobs::KnobScope;

use crate::backend::Backend;
use crate::batch::{SampleFact, widths};
use crate::schedule::cost::CellCosts;
use crate::schedule::measured::Measurements;
use crate::spec::Extent;
pub(crate) use crate::spec::extents_string;
use crate::timeline::{self, Phase};
use crate::transform::ragged_with;

pub(crate) mod ahead;
mod alone;
mod execute;
mod memory;
mod plans;

pub use crate::model::RaggedModel;
use crate::model::{Source, type_at};
pub use execute::RunInfo;
pub(crate) use execute::widths_inputs;
use execute::{maxima, slices};
pub use plans::Bucketing;
pub(crate) use plans::{HeldPlans, Renting, Shape};
use plans::{PlanCache, PlanKey, Variant};

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
    /// How padded widths are rounded up to the widths plans are prepared for.
    pub bucketing: Bucketing,
    plans: Mutex<PlanCache>,
    /// Per variant (ragged, padded), the one plan of the symbolic model where the runtime
    /// runs every batch shape on it (`plans::symbolic_plan`).
    symbolic: [Mutex<Option<Arc<dyn Runnable>>>; 2],
    /// Per variant, whether its symbolic model is prepared in one piece (not in
    /// segments), where it has been asked.
    in_one_piece: [std::sync::OnceLock<bool>; 2],
    /// Peak memory by batch size and padded extents, computed once.
    memory: Mutex<HashMap<(usize, TVec<usize>), u64>>,
    /// The transformed model's tensors, walked for their peak at any shape; made on first
    /// use.
    walk: std::sync::OnceLock<crate::memory::MemoryWalk>,
    /// What the scheduler learnt running it: costs, batch times.
    pub(crate) measured: Measurements,
}

impl RaggedRunnable {
    pub(crate) fn new(
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
            largest: model.largest,
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
            symbolic: Default::default(),
            in_one_piece: Default::default(),
            memory: Mutex::new(HashMap::default()),
            walk: std::sync::OnceLock::new(),
            measured: Measurements::default(),
        })
    }

    /// The transformed model it runs.
    pub fn model(&self) -> &RaggedModel {
        &self.model
    }

    /// What every sample must agree with.
    pub fn sample_fact(&self) -> &SampleFact {
        &self.sample
    }

    /// The tract runtime its plans are prepared on.
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
        self.symbolic = Default::default();
        self.in_one_piece = Default::default();
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

    /// What a cell costs by batch size on this runnable, once measured.
    pub fn measured_costs(&self) -> Option<CellCosts> {
        self.measured.costs()
    }

    /// A batch's fixed part in padded cells, fitted to the batches this runnable ran
    /// (`crate::schedule::fit`), and how many batches the fit has; none until they
    /// allow a fit.
    pub fn fitted_overhead(&self) -> Option<(u64, usize)> {
        self.measured.fitted_overhead()
    }
}
