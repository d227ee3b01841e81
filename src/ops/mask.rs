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
    pub fn fills_any(&self, shape: &[usize], table: &ArrayView2<i64>) -> TractResult<bool> {
        self.axes.check(shape, table, "RaggedMask")?;
        let samples = shape[self.axes.batch];
        Ok(self.axes.ragged.iter().any(|r| {
            (0..samples).any(|sample| (table[[r.row, sample]].max(0) as usize) < shape[r.axis])
        }))
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
