//! What a batch needs in memory, by batch size and padded extents: its peak (from the
//! transformed model's symbolic shapes, computed once per shape), the weights each plan
//! holds a copy of, and what a sample's outputs take. The scheduler fits batches to its
//! budget with these; the padded extents a batch runs at are decided here too.

use super::*;

impl RaggedRunnable {
    /// The peak memory, in bytes, of a ragged batch of `n` samples padded to `padded` (one
    /// extent per ragged axis), from the transformed model's symbolic shapes
    /// (`crate::memory::MemoryWalk`). A model typed per shape scales its probe's.
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
    pub(super) fn shape_values(&self, n: usize, padded: &[usize]) -> SymbolValues {
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
    pub(super) fn probe_cells(&self) -> TractResult<(u64, u64)> {
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

    pub(super) fn eval_peak_memory(&self, n: usize, padded: &[usize]) -> TractResult<u64> {
        let values = self.shape_values(n, padded);
        let walk = match self.walk.get() {
            Some(walk) => walk,
            None => {
                let walk = crate::memory::MemoryWalk::new(&self.model.ragged.model)?;
                self.walk.get_or_init(|| walk)
            }
        };
        let probe = walk.peak(&values)?;
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
}
