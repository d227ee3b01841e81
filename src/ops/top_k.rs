//! The k largest values of each row along the last axis, and their positions: an output
//! reduced where it is computed, for users who read only that (a CTC decoder reads the
//! best class of each step, a classifier its top 5).
//!
//! Rows are the last axis (a model's class axis); values come out in descending order,
//! of equal values the lower position first (numpy's and tract's argmax pick the first
//! maximum). Each pick is the best of the row among what is below the previous pick in
//! that order, which is also how the CUDA kernel picks (`kernels/top_k.cu`): the same
//! values and positions from the same row, bit for bit. A NaN is never picked; a row with
//! fewer than k values that are not NaN gives NaN at position -1 for the rest.

use tract_core::internal::*;

/// The top `k` of each row along the last axis: values (the input's type, f32) and
/// positions (i64), each shaped as the input with the last axis of extent `k`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopK {
    pub k: usize,
}

/// Whether `(v, i)` comes before `(best_v, best_i)`: greater, or equal and earlier.
fn before(v: f32, i: usize, best: Option<(f32, usize)>) -> bool {
    match best {
        None => !v.is_nan(),
        Some((bv, bi)) => v > bv || (v == bv && i < bi),
    }
}

/// The top `k` of one row, into `values` and `positions` (module doc).
pub fn top_k_row(row: &[f32], values: &mut [f32], positions: &mut [i64]) {
    let mut previous: Option<(f32, usize)> = None;
    for (value, position) in values.iter_mut().zip(positions.iter_mut()) {
        let mut best: Option<(f32, usize)> = None;
        for (i, &v) in row.iter().enumerate() {
            // Strictly after the previous pick in the order.
            let after = match previous {
                None => true,
                Some(p) => !before(v, i, Some(p)) && (v, i) != p,
            };
            if after && before(v, i, best) {
                best = Some((v, i));
            }
        }
        (*value, *position) = best.map_or((f32::NAN, -1), |(v, i)| (v, i as i64));
        previous = best;
        if best.is_none() {
            // Nothing left: the rest stay NaN at -1.
            previous = Some((f32::NEG_INFINITY, usize::MAX));
        }
    }
}

impl Op for TopK {
    fn name(&self) -> StaticName {
        "RaggedTopK".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("top {} along the last axis", self.k)])
    }

    op_as_typed_op!();
}

impl EvalOp for TopK {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let x = args_1!(inputs);
        let shape = x.shape();
        let classes = *shape.last().context("RaggedTopK: a scalar input")?;
        let rows = x.len() / classes.max(1);
        let x = x.to_plain_array_view::<f32>()?;
        let x = x.as_slice().context("RaggedTopK: a tensor out of order")?;
        let mut values = vec![0f32; rows * self.k];
        let mut positions = vec![0i64; rows * self.k];
        for r in 0..rows {
            let (lo, hi) = (r * self.k, (r + 1) * self.k);
            top_k_row(
                &x[r * classes..(r + 1) * classes],
                &mut values[lo..hi],
                &mut positions[lo..hi],
            );
        }
        let mut out_shape: TVec<usize> = shape.into();
        *out_shape.last_mut().context("scalar")? = self.k;
        Ok(tvec!(
            tensor1(&values).into_shape(&out_shape)?.into_tvalue(),
            tensor1(&positions).into_shape(&out_shape)?.into_tvalue(),
        ))
    }
}

impl TypedOp for TopK {
    /// One pass over its input.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        Ok(crate::ops::written(inputs[0]))
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let x = inputs[0];
        ensure!(
            x.datum_type == f32::datum_type(),
            "RaggedTopK: {:?} values, f32 only",
            x.datum_type
        );
        let mut shape = x.shape.to_tvec();
        let last = shape.last_mut().context("RaggedTopK: a scalar input")?;
        if let Ok(classes) = last.to_usize() {
            ensure!(
                classes >= self.k,
                "the top {} of rows of {classes} values",
                self.k
            );
        }
        *last = self.k.to_dim();
        Ok(tvec!(
            f32::fact(shape.clone()),
            i64::datum_type().fact(shape)
        ))
    }

    as_op!();
}

#[cfg(test)]
mod tests {
    use super::top_k_row;

    #[test]
    fn picks_descend_and_ties_go_to_the_first() {
        let row = [0.5, 2.0, f32::NAN, 2.0, -1.0, 0.5];
        let (mut v, mut p) = ([0f32; 4], [0i64; 4]);
        top_k_row(&row, &mut v, &mut p);
        assert_eq!(p, [1, 3, 0, 5]);
        assert_eq!(v, [2.0, 2.0, 0.5, 0.5]);
        let (mut v, mut p) = ([0f32; 3], [0i64; 3]);
        top_k_row(&[f32::NAN, 1.0, f32::NAN], &mut v, &mut p);
        assert_eq!(&p, &[1, -1, -1]);
        assert!(v[0] == 1.0 && v[1].is_nan() && v[2].is_nan());
    }
}
