//! One ragged batch: its samples packed (uploaded), its plan run with the widths table,
//! each sample's outputs cropped to its widths (downloaded); or a batch the caller packed,
//! its raw outputs returned. Errors and tract's panics say which batch was running; a
//! failure the backend calls transient (another run's making) runs the batch again.

use super::*;

/// How a batch was run, for the curious and for `--verbose`.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// How many samples the batch held.
    pub samples: usize,
    /// The padded extent of the last ragged axis (the only one of a line).
    pub padded_width: usize,
    /// The padded extent of each ragged axis.
    pub padded: TVec<usize>,
    /// Whether the plan was prepared for this run (false: taken from the cache).
    pub prepared: bool,
    /// The plan it ran on, for people: batch size, padded extents, runtime, segments.
    pub plan: String,
    /// How many segments the plan runs in (1: one plan; more for a model too large for
    /// tract's optimizer in one piece, [`crate::segment`]).
    pub segments: usize,
}

/// How many times a batch runs before a failure the backend calls transient
/// ([`crate::backend::Backend::is_transient`]) is reported.
const TRANSIENT_TRIES: usize = 3;

impl RaggedRunnable {
    /// Runs samples of a model of one input as one ragged batch ([`Self::run_batch`]),
    /// with what the run did.
    pub fn run_batch_with_info(
        &self,
        samples: &[impl Borrow<Tensor>],
    ) -> TractResult<(Vec<TVec<Tensor>>, RunInfo)> {
        self.sample.check(samples)?;
        self.run_checked(samples, None)
    }

    /// [`Self::run_batch_with_info`] on samples already checked (by `run_many`, once for
    /// all its batches); where `renting` allows, on a larger plan held rather than a new
    /// one of its own ([`super::plans`]).
    pub(crate) fn run_checked(
        &self,
        samples: &[impl Borrow<Tensor>],
        renting: Option<&Renting>,
    ) -> TractResult<(Vec<TVec<Tensor>>, RunInfo)> {
        self.only_input()?;
        let own = samples.len();
        let preparing = Instant::now();
        let (widths, padded) = self.batch_shape(samples)?;
        let rented = match renting {
            Some(renting) => self.rent(own, &padded, renting)?,
            None => None,
        };
        let mut samples: Vec<&Tensor> = samples.iter().map(|s| s.borrow()).collect();
        let (plan, prepared, widths, padded) = match rented {
            Some((plan, (n, extents))) => {
                // Copies of the narrowest sample fill the larger plan; their outputs are
                // dropped.
                let narrowest = (0..own)
                    .min_by_key(|i| samples[*i].len())
                    .context("no sample")?;
                let filler = samples[narrowest];
                samples.resize(n, filler);
                let widths = crate::batch::widths(&samples, &self.sample.axes);
                (plan, false, widths, extents)
            }
            None => {
                let like = *samples.first().context("no sample")?;
                let (plan, prepared) = self.ragged_plan_at(own, &padded, like)?;
                (plan, prepared, widths, padded)
            }
        };
        let preparing = preparing.elapsed();
        let n = samples.len();
        let started = Instant::now();
        // Waits for turns before this batch were other batches'.
        crate::backend::turns::waited();
        let shape = extents_string(&padded);
        let what = || format!("Running a ragged batch of {n} samples padded to {shape}");
        let attempt = || -> TractResult<Vec<TVec<Tensor>>> {
            let upload =
                timeline::phase(Phase::Upload, n, &padded, || self.upload(&samples, &padded));
            let mut inputs = tvec!(upload?);
            inputs.extend(widths_inputs(&widths)?);
            let outputs = self.run_plan(&*plan, inputs, n, &padded, &what)?;
            self.crop_batch(&outputs, n, &padded)
        };
        let mut tries = 1;
        let mut cropped = loop {
            match attempt() {
                Err(e) if tries < TRANSIENT_TRIES && self.backend().is_transient(&e) => {
                    log::info!("{}, tried again: {e:#}", what());
                    tries += 1;
                }
                outcome => break outcome?,
            }
        };
        cropped.truncate(own);
        // Without the wait for the lane's turn: another batch's run, not this one's.
        let took = started
            .elapsed()
            .saturating_sub(crate::backend::turns::waited());
        if prepared {
            self.measured
                .record_new_plan(n, &padded, preparing.as_secs_f64(), took.as_secs_f64());
        } else {
            self.measured.record_batch(n, &padded, took.as_secs_f64());
        }
        let segments = crate::segment::count(&*plan);
        let info = RunInfo {
            samples: own,
            padded_width: *padded.last().context("no ragged axis")?,
            padded,
            prepared,
            plan: format!(
                "ragged N={n} W={shape} on {}{}{}",
                self.runtime.name(),
                if segments > 1 {
                    format!(", in {segments} segments")
                } else {
                    String::new()
                },
                if n > own {
                    format!(", held, filled up from {own} samples")
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
                        name: None,
                        input: None,
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
pub(super) fn slices(widths: &[Vec<i64>]) -> Vec<&[i64]> {
    widths.iter().map(|w| w.as_slice()).collect()
}

/// The largest width along each ragged axis.
pub(super) fn maxima(widths: &[Vec<i64>]) -> TractResult<Vec<usize>> {
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
