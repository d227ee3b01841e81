//! A fused kernel's geometry: the operands seen through the views tract-cuda had fused
//! into their reads, broadcast against the output, and the axes merged wherever every
//! operand walks them as one run.

use tract_core::internal::*;
use tract_gpu::ops::change_axes::GpuAxisOp;

use super::codegen::MAX_RANK;

/// An operand's shape and strides seen through the axis ops tract-cuda had fused into
/// its read: reshapes and moved axes as new shapes and strides over the same memory, as
/// tract-cuda applies them (a reshape that changes the shape lays it out anew).
pub fn view(
    mut shape: TVec<usize>,
    mut strides: TVec<isize>,
    ops: &[GpuAxisOp],
    symbols: &SymbolValues,
) -> TractResult<(TVec<usize>, TVec<isize>)> {
    for axis_op in ops {
        let before = shape.clone();
        match &axis_op.inner {
            AxisOp::Reshape(skip, from, to) => {
                let from = from.iter().map(|d| d.eval(symbols)).collect();
                let to = to.iter().map(|d| d.eval(symbols)).collect();
                AxisOp::Reshape(*skip, from, to).change_shape_array(&mut shape, false)?;
            }
            other => other.change_shape_array(&mut shape, false)?,
        }
        if let AxisOp::Move(from, to) = axis_op.inner {
            let moved = strides.remove(from);
            strides.insert(to, moved);
        } else if shape != before {
            strides = Tensor::natural_strides(&shape);
        }
    }
    Ok((shape, strides))
}

/// Each operand's strides against the output's extents, 0 along its broadcast axes.
pub fn broadcast_strides(
    out: &[usize],
    operands: &[(&[usize], &[isize])],
) -> TractResult<Vec<TVec<isize>>> {
    operands
        .iter()
        .enumerate()
        .map(|(i, (shape, strides))| {
            ensure!(
                shape.len() == out.len(),
                "fused element-wise: operand {i} of rank {} for an output of rank {}",
                shape.len(),
                out.len()
            );
            (0..out.len())
                .map(|d| {
                    if shape[d] == out[d] && out[d] != 1 {
                        Ok(strides[d])
                    } else if shape[d] == 1 {
                        Ok(0)
                    } else {
                        bail!("fused element-wise: operand {i} of shape {shape:?} does not broadcast to {out:?}")
                    }
                })
                .collect()
        })
        .collect()
}

/// Drops the axes of extent one, then merges each axis into the next wherever every
/// operand walks the pair as one run (its stride there is the next one's times the next
/// extent): a per-channel operand keeps the channel axis apart, the rest collapses.
pub fn merge_axes(dims: &mut TVec<usize>, strides: &mut [TVec<isize>]) {
    let mut d = 0;
    while d < dims.len() && dims.len() > 1 {
        if dims[d] == 1 {
            dims.remove(d);
            strides.iter_mut().for_each(|s| {
                s.remove(d);
            });
        } else {
            d += 1;
        }
    }
    let mut d = 0;
    while d + 1 < dims.len() {
        let inner = dims[d + 1] as isize;
        if strides.iter().all(|s| s[d] == s[d + 1] * inner) {
            dims[d + 1] *= dims[d];
            dims.remove(d);
            strides.iter_mut().for_each(|s| {
                s.remove(d);
            });
        } else {
            d += 1;
        }
    }
}

/// The kernel's geometry for an output of extents `out` and the operands' views.
pub fn geometry(
    out: &[usize],
    operands: &[(TVec<usize>, TVec<isize>)],
) -> TractResult<(TVec<usize>, Vec<TVec<isize>>)> {
    let views: Vec<(&[usize], &[isize])> = operands.iter().map(|(s, t)| (&**s, &**t)).collect();
    let mut strides = broadcast_strides(out, &views)?;
    let mut dims: TVec<usize> = out.into();
    merge_axes(&mut dims, &mut strides);
    ensure!(
        dims.len() <= MAX_RANK,
        "fused element-wise: {} axes after merging, the kernel addresses {MAX_RANK}",
        dims.len()
    );
    Ok((dims, strides))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_merges_what_runs_together() {
        // A [2, 3, 4, 5] output, a full operand, a per-channel one, a scalar: the channel
        // axis stays apart, the spatial axes merge.
        let out = [2, 3, 4, 5];
        let mut strides = broadcast_strides(
            &out,
            &[
                (&[2, 3, 4, 5], &[60, 20, 5, 1]),
                (&[1, 3, 1, 1], &[3, 1, 1, 1]),
                (&[1, 1, 1, 1], &[1, 1, 1, 1]),
            ],
        )
        .unwrap();
        let mut dims: TVec<usize> = out.into();
        merge_axes(&mut dims, &mut strides);
        assert_eq!(&*dims, &[2, 3, 20]);
        assert_eq!(&*strides[0], &[60, 20, 1]);
        assert_eq!(&*strides[1], &[0, 1, 0]);
        assert_eq!(&*strides[2], &[0, 0, 0]);
        // A transposed view does not merge with its neighbours.
        let mut strides = broadcast_strides(&[4, 5], &[(&[4, 5], &[1, 4])]).unwrap();
        let mut dims: TVec<usize> = tvec![4, 5];
        merge_axes(&mut dims, &mut strides);
        assert_eq!(&*dims, &[4, 5]);
        assert!(broadcast_strides(&[4, 5], &[(&[4, 3], &[3, 1])]).is_err());
    }
}
