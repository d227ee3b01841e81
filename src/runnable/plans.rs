//! The plans a runnable prepared, one per batch size and padded extents.
//!
//! A model typed with a symbolic batch N and width W runs as it is, but tract runs such a
//! plan several times slower than one prepared for concrete shapes (measured on PP-OCRv4
//! rec on the CPU: 1064 ms against 138 ms for N=3, W=333). So the runnable keeps a cache of
//! plans, one per batch size and padded width, each prepared from the symbolic model with
//! N and W set (or, for a model typed per shape, typed and transformed at that shape). The
//! padded width is rounded up to a bucket ([`Bucketing`]): the masks make the extra
//! padding harmless, and the buckets keep the cache small.
//!
//! Where preparing a plan costs far more than running a batch (a device: 60-100 ms to
//! prepare a plan and capture its graphs, against a millisecond for a small batch), a
//! batch whose plan is not held may instead run on a larger plan held, padded with copies
//! of its narrowest sample whose outputs are dropped ([`Renting`]): the masks make the
//! larger extents exact, and each sample's outputs are its own whatever else the batch
//! holds. It pays the extra cells; once what a shape paid that way would pass what its
//! own plan costs, it prepares its own (buying after renting for as long as the purchase
//! costs: never more than twice what knowing the future would have paid). The server's
//! gatherings, a new batch size and width every time, then run on the plans its first
//! batches prepared.

use std::collections::HashSet;

use super::*;

/// How padded widths are rounded up before a plan is prepared for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucketing {
    /// One plan per exact width.
    Exact,
    /// Widths rounded up so that each octave holds `steps` buckets (8: at most 12.5% of
    /// padding added), and at least to a multiple of `min_step`.
    Geometric {
        /// Buckets per octave of widths.
        steps: usize,
        /// The smallest step between buckets.
        min_step: usize,
    },
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
    /// The padded width a batch of widths up to `w` gets.
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

/// Which model a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Variant {
    /// The transformed model: exact.
    Ragged = 0,
    /// The original model on a padded batch: what everybody does, inexact.
    Padded = 1,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    pub(super) variant: Variant,
    pub(super) n: usize,
    /// The padded extent of each ragged axis.
    pub(super) extents: TVec<usize>,
}

/// A batch's leave to run on a larger plan held rather than prepare its own (module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Renting {
    /// What a new plan costs, in padded cells ([`crate::Schedule::new_plan`]).
    pub(crate) new_plan: f64,
    /// The bytes a batch run on a larger plan may take.
    pub(crate) budget: u64,
}

/// A batch shape: batch size and padded extents.
pub(crate) type Shape = (usize, TVec<usize>);

fn cells((n, extents): &Shape) -> u64 {
    (n * extents.iter().product::<usize>()) as u64
}

/// The ragged plans a runnable holds and what each shape not held paid so far running on
/// larger ones: what the cut prices batches with, and what a batch rents from.
#[derive(Clone, Debug, Default)]
pub(crate) struct HeldPlans {
    shapes: HashSet<Shape>,
    paid: HashMap<Shape, f64>,
}

impl HeldPlans {
    /// Whether a plan of `shape` is held.
    pub(crate) fn contains(&self, shape: &Shape) -> bool {
        self.shapes.contains(shape)
    }

    /// Takes `shape` as held (a plan the cut will prepare).
    pub(crate) fn insert(&mut self, shape: Shape) {
        self.shapes.insert(shape);
    }

    /// The shape of the held plan a batch of `shape` (not held) may run on: of those at
    /// least as large in batch size and along every ragged axis, whose extra cells added
    /// to what `shape` paid so far stay below `renting.new_plan`, and for which `fits`
    /// (the batch's bytes at that shape within `renting.budget`), the one of fewest cells;
    /// with its extra cells.
    pub(crate) fn rentable(
        &self,
        shape: &Shape,
        renting: &Renting,
        fits: impl Fn(&Shape) -> bool,
    ) -> Option<(Shape, u64)> {
        let own = cells(shape);
        let paid = self.paid.get(shape).copied().unwrap_or(0.0);
        let mut larger: Vec<(&Shape, u64)> = self
            .shapes
            .iter()
            .filter(|held| {
                held.0 >= shape.0
                    && held.1.len() == shape.1.len()
                    && held.1.iter().zip(&shape.1).all(|(h, s)| h >= s)
            })
            .map(|held| (held, cells(held) - own))
            .filter(|(_, extra)| paid + (*extra as f64) < renting.new_plan)
            .collect();
        larger.sort_by_key(|(held, extra)| (*extra, (*held).clone()));
        larger
            .into_iter()
            .find(|(held, _)| fits(held))
            .map(|(held, extra)| (held.clone(), extra))
    }
}

/// The plans prepared so far, the least recently used dropped past `capacity`: a plan
/// holds its own copy of the weights (packed for its shapes) and, on a device, its
/// buffers, so a run over samples of many widths one by one (a plan per width) would
/// otherwise grow with every new width.
///
/// Plans the latest run used are never dropped for that run's next one: a run whose
/// batches take more shapes than the capacity keeps the first ones it met and prepares
/// the others each time, instead of dropping each plan just before its next use (a run
/// meets its shapes in the same order every time, the case where least-recently-used
/// misses on every shape, and a plan takes tens of milliseconds to prepare on a device).
#[derive(Debug)]
pub(super) struct PlanCache {
    pub(super) capacity: usize,
    clock: u64,
    /// The clock when the latest run began: plans used since are that run's.
    run_began: u64,
    pub(super) plans: HashMap<PlanKey, (Arc<dyn Runnable>, u64)>,
    /// Plans prepared since the cache was made, kept or not.
    prepared: u64,
    /// The extra cells each ragged shape not held paid running on larger plans.
    paid: HashMap<Shape, f64>,
}

impl PlanCache {
    /// Enough for the batch sizes and width buckets of a run of any size (a few per
    /// octave of widths), a fraction of what per-width plans would take.
    pub(super) const DEFAULT_CAPACITY: usize = 32;

    pub(super) fn new(capacity: usize) -> PlanCache {
        PlanCache {
            capacity: capacity.max(1),
            clock: 0,
            run_began: 0,
            plans: HashMap::default(),
            prepared: 0,
            paid: HashMap::default(),
        }
    }

    pub(super) fn get(&mut self, key: &PlanKey) -> Option<Arc<dyn Runnable>> {
        self.clock += 1;
        let clock = self.clock;
        self.plans.get_mut(key).map(|(plan, used)| {
            *used = clock;
            plan.clone()
        })
    }

    /// A run begins: the plans it uses from now on are kept for its next one (type doc).
    pub(super) fn begin_run(&mut self) {
        self.clock += 1;
        self.run_began = self.clock;
    }

    /// Keeps `plan` for `key` (or the one another thread kept first), dropping the least
    /// recently used beyond the capacity of those the latest run has not used; where it
    /// used them all, `plan` serves this batch without being kept.
    pub(super) fn insert(&mut self, key: PlanKey, plan: Arc<dyn Runnable>) -> Arc<dyn Runnable> {
        if let Some(kept) = self.get(&key) {
            return kept;
        }
        self.prepared += 1;
        if self.plans.len() >= self.capacity {
            let oldest = self
                .plans
                .iter()
                .filter(|(_, (_, used))| *used < self.run_began)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.plans.remove(&k),
                None => return plan,
            };
        }
        if key.variant == Variant::Ragged {
            self.paid.remove(&(key.n, key.extents.clone()));
        }
        self.clock += 1;
        self.plans.insert(key, (plan.clone(), self.clock));
        plan
    }

    /// Adds `extra` cells to what `shape` paid running on larger plans. What shapes never
    /// prepared paid is forgotten past a bound, as if they were new.
    fn pay(&mut self, shape: Shape, extra: u64) {
        if self.paid.len() >= Self::PAID_KEPT && !self.paid.contains_key(&shape) {
            self.paid.clear();
        }
        *self.paid.entry(shape).or_default() += extra as f64;
    }

    /// Shapes whose rents are kept (a shape costs a few dozen bytes).
    const PAID_KEPT: usize = 4096;
}

impl RaggedRunnable {
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
        let (widths, padded) = self.batch_shape(samples)?;
        let like = samples.first().context("no sample")?.borrow();
        let (plan, prepared) = self.ragged_plan_at(samples.len(), &padded, like)?;
        Ok((plan, prepared, widths, padded))
    }

    /// The plan of a ragged batch of `n` samples like `like` padded to `padded`, prepared
    /// on first use, with whether it was prepared now.
    pub(super) fn ragged_plan_at(
        &self,
        n: usize,
        padded: &TVec<usize>,
        like: &Tensor,
    ) -> TractResult<(Arc<dyn Runnable>, bool)> {
        let key = PlanKey {
            variant: Variant::Ragged,
            n,
            extents: padded.clone(),
        };
        self.plan(key, like)
    }

    /// The widths of a ragged batch of `samples` (checked) along each ragged axis, and the
    /// extents they are padded to.
    pub(crate) fn batch_shape(
        &self,
        samples: &[impl Borrow<Tensor>],
    ) -> TractResult<(Vec<Vec<i64>>, TVec<usize>)> {
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
        Ok((widths, padded))
    }

    /// Prepares the plan a batch of `samples` (checked) runs on, without running it.
    pub(crate) fn prepare_batch(&self, samples: &[&Tensor]) -> TractResult<()> {
        self.ragged_plan(samples).map(|_| ())
    }

    /// Keeps at most `capacity` prepared plans (32 by default), dropping the least
    /// recently used. Plans prepared before are dropped.
    pub fn with_plan_capacity(mut self, capacity: usize) -> RaggedRunnable {
        self.plans = Mutex::new(PlanCache::new(capacity));
        self
    }

    /// A run (a call of one of the verbs) begins: the plans it uses are kept for its next
    /// one ([`PlanCache`]).
    pub(crate) fn begin_run(&self) {
        if let Ok(mut plans) = self.plans.lock() {
            plans.begin_run();
        }
    }

    /// How many prepared plans the runnable holds.
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().map(|p| p.plans.len()).unwrap_or(0)
    }

    /// The ragged plans held (the batches that need no new plan) and what shapes not held
    /// paid running on larger ones.
    pub(crate) fn held_plans(&self) -> HeldPlans {
        self.held_plans_paid_by(None)
    }

    /// [`Self::held_plans`], with what `only` paid alone where given (a batch's run asks
    /// for its own shape's: not a copy of every shape's, on each batch).
    fn held_plans_paid_by(&self, only: Option<&Shape>) -> HeldPlans {
        self.plans
            .lock()
            .map(|p| HeldPlans {
                shapes: p
                    .plans
                    .keys()
                    .filter(|k| k.variant == Variant::Ragged)
                    .map(|k| (k.n, k.extents.clone()))
                    .collect(),
                paid: match only {
                    None => p.paid.clone(),
                    Some(shape) => p
                        .paid
                        .get(shape)
                        .map(|paid| (shape.clone(), *paid))
                        .into_iter()
                        .collect(),
                },
            })
            .unwrap_or_default()
    }

    /// Whether a batch of `shape` takes at most `budget` bytes.
    pub(crate) fn fits(&self, (n, extents): &Shape, budget: u64) -> bool {
        self.peak_memory(*n, extents)
            .is_ok_and(|bytes| bytes <= budget)
    }

    /// Whether batches may run on larger plans than their own: a model of one input (the
    /// fillers are copies of a sample's one tensor).
    pub(crate) fn can_rent(&self) -> bool {
        self.only_input().is_ok()
    }

    /// The larger plan held that a batch of `n` samples padded to `padded` runs on, as
    /// `renting` allows (module doc), with its batch size and extents; the rent paid.
    /// None where its own plan is held, or none may be rented.
    pub(crate) fn rent(
        &self,
        n: usize,
        padded: &[usize],
        renting: &Renting,
    ) -> TractResult<Option<(Arc<dyn Runnable>, Shape)>> {
        if renting.new_plan <= 0.0 || !self.can_rent() {
            return Ok(None);
        }
        let shape: Shape = (n, padded.into());
        let held = self.held_plans_paid_by(Some(&shape));
        if held.contains(&shape) {
            return Ok(None);
        }
        let fits = |s: &Shape| self.fits(s, renting.budget);
        let Some((larger, extra)) = held.rentable(&shape, renting, fits) else {
            return Ok(None);
        };
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| anyhow!("plan cache poisoned"))?;
        let key = PlanKey {
            variant: Variant::Ragged,
            n: larger.0,
            extents: larger.1.clone(),
        };
        // Dropped since the snapshot: the batch prepares its own.
        let Some(plan) = plans.get(&key) else {
            return Ok(None);
        };
        plans.pay(shape, extra);
        Ok(Some((plan, larger)))
    }

    /// How many plans the runnable prepared so far, kept or not: against the batches run,
    /// how often a batch's shape was new (or came back after its plan was dropped).
    pub fn prepared_plans(&self) -> u64 {
        self.plans.lock().map(|p| p.prepared).unwrap_or(0)
    }

    /// The symbol values giving the model input the shape of a batch of `n` samples of
    /// padded extents `padded` (one per ragged axis), and of `like` along its other dims.
    pub(super) fn symbol_values(
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
    pub(super) fn concrete(&self, key: &PlanKey, like: &Tensor) -> TractResult<TypedModel> {
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
                    crate::top_k_outputs::top_k_outputs(&mut model, own, k)?;
                }
                Ok(model)
            }
        }
    }

    /// The plan for `key`, prepared on first use. Prepared outside the cache's lock: a
    /// slow preparation does not hold other batch shapes back.
    pub(super) fn plan(
        &self,
        key: PlanKey,
        like: &Tensor,
    ) -> TractResult<(Arc<dyn Runnable>, bool)> {
        if let Some(plan) = self
            .plans
            .lock()
            .map_err(|_| anyhow!("plan cache poisoned"))?
            .get(&key)
        {
            return Ok((plan, false));
        }
        if let Some(symbolic) = self.symbolic_plan(&key, like)? {
            return Ok(symbolic);
        }
        let shape = format!("N={}, W={}", key.n, extents_string(&key.extents));
        let what = || format!("Preparing a plan for {shape} on {}", self.runtime.name());
        let plan: Arc<dyn Runnable> = crate::no_panic(what, || {
            let concrete = self
                .concrete(&key, like)
                .with_context(|| format!("Making the model concrete for {shape}"))?;
            self.prepare(concrete, &key, &shape, &RunOptions::default())
        })?;
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| anyhow!("plan cache poisoned"))?;
        Ok((plans.insert(key, plan), true))
    }

    /// Whether the runtime runs every batch shape on one plan of the symbolic model
    /// ([`crate::backend::Backend::symbolic_plans`]): where the model is typed with
    /// symbols and prepared in one piece, and the backend says so under the runnable's
    /// knobs.
    pub(crate) fn plans_every_shape(&self) -> bool {
        matches!(self.model.source, Source::Symbolic { .. })
            && self.in_knob_scope(|| self.backend.symbolic_plans())
            // Known once its first plan is asked for.
            && self.in_one_piece[Variant::Ragged as usize]
                .get()
                .copied()
                .unwrap_or(true)
    }

    /// The plan of the symbolic model of `key`'s variant, prepared on first use and kept
    /// for the runnable's life, where the runtime runs every batch shape on it
    /// ([`Self::plans_every_shape`]); none otherwise.
    ///
    /// The first key's extents size its memory (`like` along the other axes): a device
    /// runtime lays its arena out over the symbols, then sizes it at each run's.
    fn symbolic_plan(
        &self,
        key: &PlanKey,
        like: &Tensor,
    ) -> TractResult<Option<(Arc<dyn Runnable>, bool)>> {
        let Source::Symbolic { original } = &self.model.source else {
            return Ok(None);
        };
        if !self.plans_every_shape() {
            return Ok(None);
        }
        let slot = &self.symbolic[key.variant as usize];
        // Held while preparing: the other threads wait for the one plan.
        let mut slot = slot.lock().map_err(|_| anyhow!("symbolic plan poisoned"))?;
        if let Some(plan) = slot.as_ref() {
            return Ok(Some((plan.clone(), false)));
        }
        let model = match key.variant {
            Variant::Ragged => &self.model.ragged.model,
            Variant::Padded => original,
        };
        // A model prepared in segments keeps a plan per shape: each segment's plan would
        // resolve its symbols from its own inputs alone, which may not carry them all.
        let in_one_piece = self.in_one_piece[key.variant as usize].get_or_init(|| {
            self.in_knob_scope(|| {
                matches!(
                    crate::segment::Segments::cut(
                        model,
                        crate::segment::TRACT_RAGGED_SEGMENT.get()
                    ),
                    Ok(None)
                )
            })
        });
        if !in_one_piece {
            return Ok(None);
        }
        let model = model.clone();
        let shape = "every batch shape";
        let what = || format!("Preparing a plan for {shape} on {}", self.runtime.name());
        let plan: Arc<dyn Runnable> = crate::no_panic(what, || {
            let mut hints = SymbolValues::default();
            for (symbol, value) in self.symbol_values(key.n, &key.extents, like)? {
                hints.set(&symbol, value.to_i64()?);
            }
            let options = RunOptions {
                memory_sizing_hints: Some(hints),
                ..RunOptions::default()
            };
            self.prepare(model, key, shape, &options)
        })?;
        *slot = Some(plan.clone());
        if let Ok(mut plans) = self.plans.lock() {
            plans.prepared += 1;
        }
        Ok(Some((plan, true)))
    }

    /// The plan of `model` (for `key`, labelled `shape`) with the runtime's `options`,
    /// under the runnable's knobs.
    fn prepare(
        &self,
        mut model: TypedModel,
        key: &PlanKey,
        shape: &str,
        options: &RunOptions,
    ) -> TractResult<Arc<dyn Runnable>> {
        self.backend
            .before_prepare(&mut model)
            .with_context(|| format!("Rewriting the model for {shape}"))?;
        let prepare = || crate::segment::prepare_with_options(&*self.runtime, model, options);
        let plan = timeline::phase(Phase::Prepare, key.n, &key.extents, || {
            self.in_knob_scope(prepare)
        });
        let what = || format!("Preparing a plan for {shape} on {}", self.runtime.name());
        Ok(plan.with_context(what)?.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of the plans held at least as large along every axis, the one of fewest cells that
    /// fits, while what the shape paid plus the extra stays below a new plan's price.
    #[test]
    fn a_batch_rents_the_smallest_larger_plan_that_fits_while_it_costs_less() {
        let mut held = HeldPlans::default();
        for shape in [
            (4, tvec!(64)),
            (8, tvec!(40)),
            (2, tvec!(400)),
            (3, tvec!(32)),
        ] {
            held.insert(shape);
        }
        let renting = Renting {
            new_plan: 1000.0,
            budget: 0,
        };
        let all = |_: &Shape| true;
        let two_of_40: Shape = (2, tvec!(40));
        // (4, 64): 256 cells, 176 more than the batch's 80; (8, 40): 320; (2, 400): 800;
        // (3, 32) is narrower.
        assert_eq!(
            held.rentable(&two_of_40, &renting, all),
            Some(((4, tvec!(64)), 176))
        );
        let not_4 = |s: &Shape| s.0 != 4;
        assert_eq!(
            held.rentable(&two_of_40, &renting, not_4),
            Some(((8, tvec!(40)), 240))
        );
        // Nothing larger along the batch size, or the width.
        assert_eq!(held.rentable(&(9, tvec!(8)), &renting, all), None);
        assert_eq!(held.rentable(&(1, tvec!(401)), &renting, all), None);
        // What the shape paid counts: 900 + 176 passes the price.
        held.paid.insert(two_of_40.clone(), 900.0);
        assert_eq!(held.rentable(&two_of_40, &renting, all), None);
        held.paid.insert(two_of_40.clone(), 800.0);
        assert_eq!(
            held.rentable(&two_of_40, &renting, all),
            Some(((4, tvec!(64)), 176))
        );
    }
}
