//! Each sample alone: the reference every batch is to match (the original model on a
//! batch of one at the sample's own widths, no padding), the checks a sample passes
//! before it may join any batch (its fact, its widths, its memory alone), and, for
//! comparisons, the original model on a batch padded with zeros (what everybody does).

use super::*;

impl RaggedRunnable {
    /// One sample alone through the original model on its plan ([`Self::alone_plan`]), as
    /// [`Self::run_one_by_one`] runs each, the sample checked as [`Self::check_alone`]
    /// does.
    pub(crate) fn run_alone(
        &self,
        sample: &Tensor,
        (plan, extents): (Arc<dyn Runnable>, TVec<usize>),
    ) -> TractResult<TVec<Tensor>> {
        self.only_input()?;
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
        self.check_extents_alone(ix, &self.sample.widths_of(sample), budget)
    }

    /// What [`Self::check_alone`] can tell from a sample's shape alone (the model takes
    /// its widths, a batch of it alone needs at most `budget` bytes), for a sample not
    /// read yet: from what its file declares, before its data is read or inflated. A
    /// shape of another rank passes here: the whole check says what is wrong with it.
    pub fn check_shape_alone(&self, ix: usize, shape: &[usize], budget: u64) -> TractResult<()> {
        let extents: Option<TVec<usize>> = self
            .sample
            .axes
            .iter()
            .map(|a| shape.get(*a).copied())
            .collect();
        match extents {
            Some(extents) if shape.len() == self.sample.dims.len() => {
                self.check_extents_alone(ix, &extents, budget)
            }
            _ => Ok(()),
        }
    }

    fn check_extents_alone(&self, ix: usize, extents: &[usize], budget: u64) -> TractResult<()> {
        let shape = extents_string(extents);
        let widths: Vec<Vec<i64>> = extents.iter().map(|e| vec![*e as i64]).collect();
        // Too narrow for the model: the sample's own fault.
        self.width_table_axes(&slices(&widths)).map_err(|e| {
            anyhow!(BadSample {
                index: ix,
                name: None,
                input: None,
                reason: format!("sample {ix} (width {shape}): {e:#}"),
            })
        })?;
        let peak = self.peak_memory(1, &self.padded_extents(extents))?;
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
}
