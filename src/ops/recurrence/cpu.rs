//! The recurrence on the host: per direction, the input products of every step in one
//! matrix product, then step by step the recurrent product of the states and the cell.
//!
//! Each sample's row of a product depends on that row alone (the products sum over the
//! same blocks whatever the batch), and a sample past its length is not updated: a sample
//! gets the same bits in any batch as alone.

use tract_core::internal::*;
use tract_core::ndarray::linalg::general_mat_mul;
use tract_core::ndarray::{
    Array2, Array3, Array4, ArrayView1, ArrayView2, ArrayView3, ArrayViewMut1, Axis, Ix2, Ix3, s,
};

use super::{Activation, Cell, Recurrence};

/// One direction's weights.
struct Weights<'a> {
    w: ArrayView2<'a, f32>,
    r: ArrayView2<'a, f32>,
    /// `Wb` then `Rb`, or none.
    b: Option<ArrayView1<'a, f32>>,
    p: Option<ArrayView1<'a, f32>>,
}

impl Recurrence {
    /// Each sample's length (`sequence_lens`, or the padded length `t`), checked.
    fn lengths(&self, inputs: &[TValue], n: usize, t: usize) -> TractResult<Vec<usize>> {
        let Some(s) = self.inputs.slots().lengths else {
            return Ok(vec![t; n]);
        };
        let given = inputs[s].cast_to::<i64>()?;
        let given = given.to_plain_array_view::<i64>()?;
        ensure!(
            given.len() == n,
            "{}: sequence_lens holds {} lengths for {n} samples",
            self.cell.name(),
            given.len()
        );
        given
            .iter()
            .enumerate()
            .map(|(sample, &l)| {
                ensure!(
                    (0..=t as i64).contains(&l),
                    "{}: sample {sample} has length {l}, outside 0..={t}",
                    self.cell.name()
                );
                Ok(l as usize)
            })
            .collect()
    }

    pub(super) fn eval_f32(&self, inputs: &[TValue]) -> TractResult<TVec<TValue>> {
        let slots = self.inputs.slots();
        let x = inputs[0].to_plain_array_view::<f32>()?;
        let x = x.into_dimensionality::<Ix3>()?;
        let (seq_axis, batch_axis) = self.x_axes();
        let (t, n, c) = (x.shape()[seq_axis], x.shape()[batch_axis], x.shape()[2]);
        let (h, dirs) = (self.hidden, self.direction.count());
        let lengths = self.lengths(inputs, n, t)?;
        let w = inputs[1].to_plain_array_view::<f32>()?;
        let w = w.into_dimensionality::<Ix3>()?;
        let r = inputs[2].to_plain_array_view::<f32>()?;
        let r = r.into_dimensionality::<Ix3>()?;
        let b = slots.bias.map(|s| view2(&inputs[s])).transpose()?;
        let p = slots.peepholes.map(|s| view2(&inputs[s])).transpose()?;
        let state = |slot: Option<usize>| -> TractResult<Option<ArrayView3<f32>>> {
            slot.map(|s| {
                Ok(inputs[s]
                    .to_plain_array_view::<f32>()?
                    .into_dimensionality::<Ix3>()?)
            })
            .transpose()
        };
        let (h0, c0) = (state(slots.initial_h)?, state(slots.initial_c)?);
        // Rows of `X` in memory order: (step, sample) or (sample, step).
        let x = x.as_standard_layout();
        let rows = x.view().into_shape_with_order((t * n, c))?;
        let row = |step: usize, sample: usize| {
            if self.batch_first {
                sample * t + step
            } else {
                step * n + sample
            }
        };
        let y_shape: [usize; 4] = if self.batch_first {
            [n, t, dirs, h]
        } else {
            [t, dirs, n, h]
        };
        let state_shape: [usize; 3] = if self.batch_first {
            [n, dirs, h]
        } else {
            [dirs, n, h]
        };
        let mut y = Array4::<f32>::zeros(y_shape);
        let mut y_h = Array3::<f32>::zeros(state_shape);
        let mut y_c = Array3::<f32>::zeros(state_shape);
        let state_of = |a: &ArrayView3<f32>, d: usize| -> Array2<f32> {
            if self.batch_first {
                a.slice(s![.., d, ..]).to_owned()
            } else {
                a.slice(s![d, .., ..]).to_owned()
            }
        };
        for d in 0..dirs {
            let weights = Weights {
                w: w.index_axis(Axis(0), d),
                r: r.index_axis(Axis(0), d),
                b: b.as_ref().map(|b| b.index_axis(Axis(0), d)),
                p: p.as_ref().map(|p| p.index_axis(Axis(0), d)),
            };
            let mut hs = h0
                .as_ref()
                .map(|a| state_of(a, d))
                .unwrap_or_else(|| Array2::zeros((n, h)));
            let mut cs = c0
                .as_ref()
                .map(|a| state_of(a, d))
                .unwrap_or_else(|| Array2::zeros((n, h)));
            let xw = self.input_products(&rows.view(), &weights);
            let reverse = self.direction.reverse(d);
            let acts = self.activations_of(d);
            let mut hr = Array2::<f32>::zeros((n, self.cell.gates() * h));
            for step in 0..t {
                let at = if reverse { t - 1 - step } else { step };
                let active: Vec<usize> = (0..n).filter(|&k| at < lengths[k]).collect();
                if active.is_empty() {
                    continue;
                }
                general_mat_mul(1.0, &hs, &weights.r.t(), 0.0, &mut hr);
                match self.cell {
                    Cell::Lstm => {
                        for &k in &active {
                            let (hk, ck) = (hs.row_mut(k), cs.row_mut(k));
                            self.lstm(xw.row(row(at, k)), hr.row(k), hk, ck, &weights, acts);
                        }
                    }
                    Cell::Rnn => {
                        for &k in &active {
                            let mut hk = hs.row_mut(k);
                            let (xk, rk) = (xw.row(row(at, k)), hr.row(k));
                            for j in 0..h {
                                hk[j] = acts[0].apply(self.clipped(xk[j] + rk[j]));
                            }
                        }
                    }
                    Cell::Gru => {
                        self.gru_step(&xw, &mut hs, &hr, &active, |k| row(at, k), &weights, acts)
                    }
                }
                for &k in &active {
                    let mut out = if self.batch_first {
                        y.slice_mut(s![k, at, d, ..])
                    } else {
                        y.slice_mut(s![at, d, k, ..])
                    };
                    out.assign(&hs.row(k));
                }
            }
            let (mut yh, mut yc) = if self.batch_first {
                (y_h.slice_mut(s![.., d, ..]), y_c.slice_mut(s![.., d, ..]))
            } else {
                (y_h.slice_mut(s![d, .., ..]), y_c.slice_mut(s![d, .., ..]))
            };
            yh.assign(&hs);
            yc.assign(&cs);
        }
        let mut outputs = tvec!(
            y.into_tensor().into_tvalue(),
            y_h.into_tensor().into_tvalue()
        );
        if self.cell == Cell::Lstm {
            outputs.push(y_c.into_tensor().into_tvalue());
        }
        Ok(outputs)
    }

    #[inline]
    fn clipped(&self, a: f32) -> f32 {
        match self.clip {
            Some(clip) => a.clamp(-clip, clip),
            None => a,
        }
    }

    /// `X W^T + Wb`, for every row of `X`, with the recurrent biases `Rb` added where
    /// they sum with the recurrent product (all but a GRU's h gate with
    /// `linear_before_reset`, where the reset gate scales `Ht-1 Rh^T + Rbh`).
    fn input_products(&self, rows: &ArrayView2<f32>, weights: &Weights) -> Array2<f32> {
        let h = self.hidden;
        let g = self.cell.gates() * h;
        let mut xw = Array2::<f32>::zeros((rows.shape()[0], g));
        general_mat_mul(1.0, rows, &weights.w.t(), 0.0, &mut xw);
        if let Some(b) = weights.b {
            let mut bias: Vec<f32> = (0..g).map(|j| b[j]).collect();
            let folded = if self.cell == Cell::Gru && self.linear_before_reset {
                2 * h
            } else {
                g
            };
            for (j, v) in bias.iter_mut().enumerate().take(folded) {
                *v += b[g + j];
            }
            for mut r in xw.axis_iter_mut(Axis(0)) {
                for (v, b) in r.iter_mut().zip(&bias) {
                    *v += b;
                }
            }
        }
        xw
    }

    /// One LSTM step of one sample: gates i, o, f, c in ONNX's order.
    fn lstm(
        &self,
        xw: ArrayView1<f32>,
        hr: ArrayView1<f32>,
        mut hk: ArrayViewMut1<f32>,
        mut ck: ArrayViewMut1<f32>,
        weights: &Weights,
        acts: &[Activation],
    ) {
        let h = self.hidden;
        let (f, g, hh) = (acts[0], acts[1], acts[2]);
        let peep =
            |gate: usize, j: usize, c: f32| weights.p.map(|p| p[gate * h + j] * c).unwrap_or(0.0);
        for j in 0..h {
            let c_prev = ck[j];
            let i = f.apply(self.clipped(xw[j] + hr[j] + peep(0, j, c_prev)));
            let forget = if self.input_forget {
                1.0 - i
            } else {
                f.apply(self.clipped(xw[2 * h + j] + hr[2 * h + j] + peep(2, j, c_prev)))
            };
            let cand = g.apply(self.clipped(xw[3 * h + j] + hr[3 * h + j]));
            let c = forget * c_prev + i * cand;
            let o = f.apply(self.clipped(xw[h + j] + hr[h + j] + peep(1, j, c)));
            ck[j] = c;
            hk[j] = o * hh.apply(c);
        }
    }

    /// One GRU step of the active samples: gates z, r, h in ONNX's order.
    #[allow(clippy::too_many_arguments)]
    fn gru_step(
        &self,
        xw: &Array2<f32>,
        hs: &mut Array2<f32>,
        hr: &Array2<f32>,
        active: &[usize],
        row: impl Fn(usize) -> usize,
        weights: &Weights,
        acts: &[Activation],
    ) {
        let h = self.hidden;
        let g3 = 3 * h;
        let (f, g) = (acts[0], acts[1]);
        let rbh = |j: usize| weights.b.map(|b| b[g3 + 2 * h + j]).unwrap_or(0.0);
        let mut zs = Array2::<f32>::zeros((hs.shape()[0], h));
        let mut candidate_input = Array2::<f32>::zeros((hs.shape()[0], h));
        for &k in active {
            let (xk, rk) = (xw.row(row(k)), hr.row(k));
            for j in 0..h {
                let z = f.apply(self.clipped(xk[j] + rk[j]));
                let r = f.apply(self.clipped(xk[h + j] + rk[h + j]));
                zs[[k, j]] = z;
                candidate_input[[k, j]] = if self.linear_before_reset {
                    xk[2 * h + j] + r * (rk[2 * h + j] + rbh(j))
                } else {
                    r * hs[[k, j]]
                };
            }
        }
        if !self.linear_before_reset {
            // (r . Ht-1) Rh^T: a second product per step.
            let rh = weights.r.slice(s![2 * h..3 * h, ..]);
            let mut product = Array2::<f32>::zeros((hs.shape()[0], h));
            general_mat_mul(1.0, &candidate_input, &rh.t(), 0.0, &mut product);
            for &k in active {
                let xk = xw.row(row(k));
                for j in 0..h {
                    candidate_input[[k, j]] = xk[2 * h + j] + product[[k, j]];
                }
            }
        }
        for &k in active {
            for j in 0..h {
                let cand = g.apply(self.clipped(candidate_input[[k, j]]));
                let z = zs[[k, j]];
                hs[[k, j]] = (1.0 - z) * cand + z * hs[[k, j]];
            }
        }
    }
}

fn view2(t: &TValue) -> TractResult<ArrayView2<'_, f32>> {
    Ok(t.to_plain_array_view::<f32>()?
        .into_dimensionality::<Ix2>()?)
}
