//! The mask: a fill value over the padded region of every ragged axis.
//!
//! Masking is how a dense op gets to compute, at every valid position, exactly what a
//! sample alone computes there: right before the op, the padded region is made to hold
//! what the sample reads past its border when alone.
//!
//! - 0 before a convolution (alone, its right padding is zeros) and before a sum or a
//!   contraction over the axis (padded cells then add nothing);
//! - -inf before a max pool or a max reduction (alone, padding never wins a max), +inf
//!   before a min;
//! - the pad value before a constant pad along the axis, so that the pad lands right
//!   after each sample's width rather than after the padded width.
//!
//! The mask **selects**, it does not multiply: whatever was in the padded region, NaN
//! or infinities from earlier ops on garbage, is replaced. That is why carried ops
//! never need one: garbage stays where it was until the next op that could read it,
//! which is masked.

use std::fmt;

use tract_core::internal::*;
use tract_core::ndarray::{ArrayView2, Axis};
use tract_linalg::multithread::par_chunks_mut;

use super::{SampleAxes, table_view};

/// The value a mask writes, relative to the tensor's datum type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fill {
    Zero,
    One,
    /// -inf for floats, the lowest value for integers, false for booleans.
    Lowest,
    /// +inf for floats, the highest value for integers, true for booleans.
    Highest,
}

impl Fill {
    /// The fill as a scalar of `dt`.
    pub fn scalar(&self, dt: DatumType) -> TractResult<Arc<Tensor>> {
        let t = match self {
            Fill::Zero => Tensor::zero_scalar_dt(dt)?,
            Fill::One => tensor0(1i8).cast_to_dt(dt)?.into_owned(),
            Fill::Lowest | Fill::Highest => {
                let low = *self == Fill::Lowest;
                macro_rules! ext {
                    ($t:ty) => {
                        if low {
                            tensor0(<$t>::MIN)
                        } else {
                            tensor0(<$t>::MAX)
                        }
                    };
                }
                match dt {
                    DatumType::F16 => tensor0(if low {
                        f16::NEG_INFINITY
                    } else {
                        f16::INFINITY
                    }),
                    DatumType::F32 => tensor0(if low {
                        f32::NEG_INFINITY
                    } else {
                        f32::INFINITY
                    }),
                    DatumType::F64 => tensor0(if low {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    }),
                    DatumType::I8 => ext!(i8),
                    DatumType::I16 => ext!(i16),
                    DatumType::I32 => ext!(i32),
                    DatumType::I64 => ext!(i64),
                    DatumType::U8 => ext!(u8),
                    DatumType::U16 => ext!(u16),
                    DatumType::U32 => ext!(u32),
                    DatumType::U64 => ext!(u64),
                    DatumType::Bool => tensor0(!low),
                    dt => bail!("no {self:?} fill value for {dt:?}"),
                }
            }
        };
        Ok(t.into_arc_tensor())
    }
}

/// Writes `fill` (a scalar of the input's type) at every position past a sample's width
/// along any of its ragged axes. Inputs: the tensor, the widths table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mask {
    pub axes: SampleAxes,
    pub fill: Arc<Tensor>,
}

impl fmt::Display for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self
            .axes
            .ragged
            .iter()
            .map(|r| format!("{}(row {})", r.axis, r.row))
            .collect();
        write!(
            f,
            "batch axis {}, ragged {}, fill {:?}",
            self.axes.batch,
            axes.join(" "),
            self.fill
        )
    }
}

impl Op for Mask {
    fn name(&self) -> StaticName {
        "RaggedMask".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![self.to_string()])
    }

    op_as_typed_op!();
}

impl Mask {
    fn fill_t<T: Datum + Copy>(&self, x: &mut Tensor, table: &ArrayView2<i64>) -> TractResult<()> {
        let fill = *self.fill.try_as_plain_ram()?.to_scalar::<T>()?;
        let batch = self.axes.batch;
        let mut view = x.to_plain_array_view_mut::<T>()?;
        for (sample, mut sample_view) in view.axis_iter_mut(Axis(batch)).enumerate() {
            for r in &self.axes.ragged {
                // The sample view has lost the batch axis.
                let axis = r.axis - (r.axis > batch) as usize;
                let w = table[[r.row, sample]] as usize;
                sample_view
                    .slice_axis_mut(Axis(axis), (w..).into())
                    .fill(fill);
            }
        }
        Ok(())
    }

    /// Whether any position of a tensor of `shape` lies past its sample's width along
    /// a ragged axis, i.e. whether [`Mask::apply`] would write anything.
    fn fills_any(&self, shape: &[usize], table: &ArrayView2<i64>) -> TractResult<bool> {
        self.axes.check(shape, table, "RaggedMask")?;
        let samples = shape[self.axes.batch];
        Ok(self.axes.ragged.iter().any(|r| {
            (0..samples).any(|sample| (table[[r.row, sample]].max(0) as usize) < shape[r.axis])
        }))
    }

    /// Whether [`Mask::by_rows`] takes a tensor of `shape`: rows long enough to pay for
    /// their arithmetic, the batch axis not the last.
    fn fits_rows(&self, shape: &[usize]) -> bool {
        self.axes.batch + 1 < shape.len() && shape.last().is_some_and(|last| *last >= 8)
    }

    /// `x` masked, row by row along its last axis, the rows over the threads of tract's
    /// executor: in place where this op holds `x`'s only reference, else into a new
    /// tensor written in one pass (each row's values before its cut copied, the rest
    /// filled), rather than a copy of the whole tensor then the fill. For a tensor
    /// [`Mask::fits_rows`] takes.
    fn by_rows(&self, x: TValue, table: &ArrayView2<i64>) -> TractResult<Tensor> {
        dispatch_copy!(Self::by_rows_t(x.datum_type())(self, x, table))
    }

    fn by_rows_t<T: Datum + Copy>(
        &self,
        x: TValue,
        table: &ArrayView2<i64>,
    ) -> TractResult<Tensor> {
        let shape: TVec<usize> = x.shape().into();
        let rank = shape.len();
        ensure!(
            self.fits_rows(&shape),
            "RaggedMask: rows of {shape:?} taken"
        );
        let last = shape[rank - 1];
        let fill = *self.fill.try_as_plain_ram()?.to_scalar::<T>()?;
        // Rows between two steps of each axis but the last.
        let mut steps: TVec<usize> = tvec![1; rank];
        for axis in (0..rank - 1).rev() {
            steps[axis] = steps[axis + 1]
                * if axis + 1 < rank - 1 {
                    shape[axis + 1]
                } else {
                    1
                };
        }
        let at = |row: usize, axis: usize| (row / steps[axis]) % shape[axis];
        // The values of row `row` that lie within its sample.
        let cut = |row: usize| {
            let sample = at(row, self.axes.batch);
            self.axes.ragged.iter().fold(last, |cut, r| {
                let w = table[[r.row, sample]].max(0) as usize;
                match r.axis == rank - 1 {
                    true => cut.min(w),
                    false if at(row, r.axis) >= w => 0,
                    false => cut,
                }
            })
        };
        let len = x.len();
        // In place where `x` is this op's alone; else a new tensor, the input kept to copy
        // from.
        let (mut out, input) = match x.is_exclusive() {
            true => (x.into_tensor(), None),
            // SAFETY: every value is written below: a row's values before its cut copied,
            // the others filled; T is a copied type.
            false => (unsafe { Tensor::uninitialized::<T>(&shape)? }, Some(x)),
        };
        let src = input.as_ref().map(|x| x.try_as_plain_ram()).transpose()?;
        let src = src.as_ref().map(|v| v.as_slice::<T>()).transpose()?;
        par_chunks_mut(
            out.try_as_plain_ram_mut()?.as_slice_mut::<T>()?,
            last,
            len,
            |first, chunk: &mut [T]| {
                for (row, values) in (first..).zip(chunk.chunks_exact_mut(last)) {
                    let cut = cut(row);
                    if let Some(src) = src {
                        values[..cut].copy_from_slice(&src[row * last..][..cut]);
                    }
                    values[cut..].fill(fill);
                }
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// Masks `x` in place.
    pub fn apply(&self, x: &mut Tensor, table: &ArrayView2<i64>) -> TractResult<()> {
        self.axes.check(x.shape(), table, "RaggedMask")?;
        ensure!(
            self.fill.datum_type() == x.datum_type(),
            "RaggedMask: fill is {:?}, tensor is {:?}",
            self.fill.datum_type(),
            x.datum_type()
        );
        dispatch_copy!(Self::fill_t(x.datum_type())(self, x, table))
    }
}

impl EvalOp for Mask {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (x, table) = args_2!(inputs);
        let table = table_view(&table)?;
        // A batch whose samples all span the padded extent (a sample alone, or samples
        // of one size) has nothing to mask; the input, often shared with another
        // consumer, is then passed on rather than copied.
        if !self.fills_any(x.shape(), &table)? {
            return Ok(tvec!(x));
        }
        if self.fits_rows(x.shape()) {
            return Ok(tvec!(self.by_rows(x, &table)?.into_tvalue()));
        }
        let mut x = x.into_tensor();
        self.apply(&mut x, &table)?;
        Ok(tvec!(x.into_tvalue()))
    }
}

impl TypedOp for Mask {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        ensure!(inputs[0].datum_type == self.fill.datum_type());
        Ok(tvec!(inputs[0].datum_type.fact(inputs[0].shape.clone())))
    }

    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        Ok(tvec!((
            Cost::Buffer(inputs[0].datum_type),
            inputs[0].shape.volume()
        )))
    }

    as_op!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::RaggedAxis;
    use tract_core::ndarray::Array2;
    use tract_linalg::multithread::{Executor, multithread_tract_scope};

    /// Row by row (in place, and into a new tensor while another reference holds the
    /// input; on one thread and on three) gives the bits of the whole-tensor mask: shapes
    /// whose batch axis is first or not, ragged along the last axis or another or both.
    #[test]
    fn rows_mask_as_the_whole_tensor_does() -> TractResult<()> {
        let mut seed = 11u64;
        let mut next = |m: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as usize) % m
        };
        let pool = Executor::multithread(3);
        let mut taken = 0;
        for case in 0..200 {
            let rank = 3 + next(2);
            let batch = next(rank - 1);
            let mut shape: TVec<usize> = (0..rank).map(|_| 1 + next(12)).collect();
            shape[rank - 1] = 4 + next(300);
            let free: Vec<usize> = (0..rank).filter(|a| *a != batch).collect();
            let mut ragged: TVec<RaggedAxis> = tvec![RaggedAxis {
                axis: rank - 1,
                row: 0
            }];
            if next(2) == 0 {
                ragged[0].axis = free[next(free.len() - 1)];
            }
            if next(2) == 0 {
                let other = free.iter().copied().find(|a| *a != ragged[0].axis).unwrap();
                ragged.push(RaggedAxis {
                    axis: other,
                    row: 1,
                });
            }
            let n = shape[batch];
            let table = Array2::from_shape_fn((2, n), |(row, _)| {
                let extent = ragged
                    .iter()
                    .find(|r| r.row == row)
                    .map_or(1, |r| shape[r.axis]);
                (next(extent + 1)) as i64
            });
            let mask = Mask {
                axes: SampleAxes { batch, ragged },
                fill: Fill::Lowest.scalar(f32::datum_type())?,
            };
            let len = shape.iter().product::<usize>();
            let values: Vec<f32> = (0..len).map(|i| i as f32).collect();
            let x = Tensor::from_shape(&shape, &values)?;
            let mut expected = x.clone();
            mask.apply(&mut expected, &table.view())?;
            if !mask.fits_rows(&shape) {
                continue;
            }
            taken += 1;
            for threads in [false, true] {
                let run = |x: TValue| match threads {
                    true => {
                        multithread_tract_scope(pool.clone(), || mask.by_rows(x, &table.view()))
                    }
                    false => mask.by_rows(x, &table.view()),
                };
                let alone = run(x.clone().into_tvalue())?;
                assert_eq!(alone, expected, "case {case}, in place, threads {threads}");
                let shared = x.clone().into_tvalue();
                let held = shared.clone();
                let copied = run(shared)?;
                assert_eq!(copied, expected, "case {case}, shared, threads {threads}");
                assert_eq!(*held, x, "case {case}: the shared input changed");
            }
        }
        assert!(taken > 100, "{taken} cases taken row by row");
        Ok(())
    }
}
