//! Average pooling along ragged axes with per-sample divisors.
//!
//! With the padded region masked to 0, a sum pool gives every valid position exactly a
//! sample's own sum. The divisor is what differs: alone, a window hanging past the
//! sample's right edge counts only the cells inside (`count_include_pad=0`), or the cells
//! inside plus the explicit padding, up to `w + pad` (`count_include_pad=1` in ONNX ceil
//! mode, where a last window may overhang even the padding). In the batch the same window
//! lies over masked cells that tract's pool would count. So the sum pool is tract's, with
//! normalisation off, and this op divides each position by the count the sample would use.

use tract_core::internal::*;
use tract_core::ndarray::{ArrayView2, IxDyn};
use tract_core::num_traits::Float;
use tract_core::ops::cnn::{PaddingSpec, PoolSpec, SumPool};

use super::{SampleAxes, table_view};
use crate::transform::width::Window;

/// `AveragePool` along one or two ragged axes. Inputs: the tensor, masked to 0 past each
/// sample's widths; the widths table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MaskedAvgPool {
    pub pool_spec: PoolSpec,
    pub count_include_pad: bool,
    /// The input's sample axes: the pooled ragged axes among them.
    pub axes: SampleAxes,
    /// Each pooled ragged axis, and its geometry.
    pub windows: TVec<(usize, Window)>,
}

impl Op for MaskedAvgPool {
    fn name(&self) -> StaticName {
        "RaggedMaskedAvgPool".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        let mut info = self.pool_spec.info();
        let axes: Vec<String> = self.windows.iter().map(|(a, _)| a.to_string()).collect();
        info.push(format!(
            "ragged axes {}, count_include_pad: {}",
            axes.join(","),
            self.count_include_pad
        ));
        Ok(info)
    }

    op_as_typed_op!();
}

/// How many taps of the window at output position `out` a divisor counts, along one axis
/// of input extent `extent`.
fn taps(
    out: usize,
    extent: usize,
    (before, after): (usize, usize),
    (kernel, dilation, stride): (usize, usize, usize),
    count_include_pad: bool,
    ceil: bool,
) -> usize {
    let start = (out * stride) as isize - before as isize;
    let inside = |limit: isize| {
        (0..kernel)
            .filter(|k| {
                let pos = start + (k * dilation) as isize;
                pos < limit && (count_include_pad || pos >= 0)
            })
            .count()
    };
    match (count_include_pad, ceil) {
        (false, _) => inside(extent as isize),
        (true, true) => inside((extent + after) as isize),
        (true, false) => kernel,
    }
}

impl MaskedAvgPool {
    fn normalize_t<T: Datum + Float>(
        &self,
        sums: &mut Tensor,
        input_shape: &[usize],
        table: &ArrayView2<i64>,
    ) -> TractResult<()>
    where
        usize: tract_core::num_traits::AsPrimitive<T>,
    {
        use tract_core::num_traits::AsPrimitive;
        let data_shape = self.pool_spec.data_format.shape(input_shape)?;
        let hw_axes: TVec<usize> = data_shape.hw_axes().collect();
        let ceil = matches!(
            self.pool_spec.padding,
            PaddingSpec::ExplicitOnnxPool(_, _, true)
        );
        let output_shape = sums.shape().to_vec();
        // Divisors along each spatial axis: per output position, and per sample too along
        // the ragged one.
        let mut dense: Vec<Vec<usize>> = vec![];
        for (geo, &axis) in hw_axes.iter().enumerate() {
            let extent = input_shape[axis];
            let comp = self.pool_spec.padding.compute_one(
                geo,
                &extent,
                self.pool_spec.kernel_shape[geo],
                self.pool_spec.dilation(geo),
                self.pool_spec.stride(geo),
            );
            let geometry = (
                self.pool_spec.kernel_shape[geo],
                self.pool_spec.dilation(geo),
                self.pool_spec.stride(geo),
            );
            dense.push(
                (0..output_shape[axis])
                    .map(|o| {
                        let pads = (comp.pad_before, comp.pad_after);
                        taps(o, extent, pads, geometry, self.count_include_pad, ceil)
                    })
                    .collect(),
            );
        }
        // Per pooled ragged axis, per sample, per output position: the sample's divisor.
        let mut per_sample: Vec<(usize, Vec<Vec<usize>>)> = vec![];
        for (axis, window) in &self.windows {
            let row = self
                .axes
                .ragged_at(*axis)
                .context("pooled axis is not ragged")?
                .row;
            let geometry = (window.kernel, window.dilation, window.stride);
            let counts = table
                .row(row)
                .iter()
                .map(|&w| {
                    let (before, after, _) = window.padded(w as usize);
                    (0..output_shape[*axis])
                        .map(|o| {
                            let pads = (before, after);
                            taps(o, w as usize, pads, geometry, self.count_include_pad, ceil)
                        })
                        .collect()
                })
                .collect();
            per_sample.push((*axis, counts));
        }
        let mut view = sums.to_plain_array_view_mut::<T>()?;
        for (coords, value) in view.indexed_iter_mut() {
            let coords: &IxDyn = &coords;
            let sample = coords[self.axes.batch];
            let mut count = 1usize;
            for (geo, &axis) in hw_axes.iter().enumerate() {
                count *= match per_sample.iter().find(|(a, _)| *a == axis) {
                    Some((_, counts)) => counts[sample][coords[axis]],
                    None => dense[geo][coords[axis]],
                };
            }
            // Same arithmetic as tract's pool: the sum times the reciprocal of the count.
            // A window with no valid cell lies in the padded region: it stays 0 there.
            *value = if count == 0 {
                T::zero()
            } else {
                *value * count.as_().recip()
            };
        }
        Ok(())
    }
}

impl EvalOp for MaskedAvgPool {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (x, table) = args_2!(inputs);
        let table = table_view(&table)?;
        self.axes.check(x.shape(), &table, "RaggedMaskedAvgPool")?;
        let input_shape = x.shape().to_vec();
        let sum_pool = SumPool::new(self.pool_spec.clone(), self.count_include_pad, false);
        let mut sums = sum_pool.eval(ctx, tvec!(x))?.remove(0).into_tensor();
        match sums.datum_type() {
            DatumType::F32 => self.normalize_t::<f32>(&mut sums, &input_shape, &table)?,
            DatumType::F16 => self.normalize_t::<f16>(&mut sums, &input_shape, &table)?,
            DatumType::F64 => self.normalize_t::<f64>(&mut sums, &input_shape, &table)?,
            dt => bail!("RaggedMaskedAvgPool: unsupported type {dt:?}"),
        }
        Ok(tvec!(sums.into_tvalue()))
    }
}

impl TypedOp for MaskedAvgPool {
    /// Every input value summed once, every output divided once.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let dt = inputs[0].datum_type;
        let out = self.output_facts(inputs)?[0].shape.volume();
        Ok(tvec!(
            (Cost::FMA(dt), inputs[0].shape.volume()),
            (Cost::Div(dt), out)
        ))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        self.pool_spec.output_facts(&inputs[..1])
    }

    as_op!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_count_cells_inside() {
        // kernel 3, stride 1, one cell of padding each side, extent 4.
        let g = (3, 1, 1);
        assert_eq!(taps(0, 4, (1, 1), g, false, false), 2);
        assert_eq!(taps(1, 4, (1, 1), g, false, false), 3);
        assert_eq!(taps(3, 4, (1, 1), g, false, false), 2);
        assert_eq!(taps(3, 4, (1, 1), g, true, false), 3);
        // ceil mode, kernel 2, stride 2, no padding, extent 5: the last window overhangs.
        assert_eq!(taps(2, 5, (0, 0), (2, 1, 2), true, true), 1);
        assert_eq!(taps(2, 5, (0, 0), (2, 1, 2), false, true), 1);
    }
}
