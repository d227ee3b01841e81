//! Depthwise convolutions on the host, vectorised along the output's width at every
//! position, borders and strides included.
//!
//! tract's `DepthWise` splits the output into zones: inside, its kernel runs 32 points at a
//! time; in the border zones and at any stride along the width, one point at a time. Text
//! lines are a few pixels high (PP-OCRv4 rec's maps are 12, 6 and 3 rows): with a 5x5
//! kernel, a third of the rows are border rows, and its depthwise layers ran at 15 GFLOP/s
//! (2 at a stride of 2 along the width), a fifth of ONNX Runtime's speed on the same shapes.
//!
//! Here each plane is first copied into a buffer zero-padded to every value the output
//! reads (the zeros written once per op: every plane covers the same cells), in **phases**
//! along the width at a stride `s` above 1 (every `s`-th value from an offset), so that
//! every tap of every output point reads a contiguous run, borders included. Each output
//! row is then computed in blocks of 32 points, four AVX accumulators held in registers
//! across all the taps.
//!
//! The arithmetic is tract's, element by element: the bias, then for each tap in the
//! kernel's order one multiply and one add (no fused multiply-add). Where tract skips a
//! tap over the padding, this adds `k * 0`, which changes no value (it can only turn a -0
//! into +0): the values of tract's `DepthWise` (tests/it/host_ops.rs), and the ragged batch
//! and the sample alone compute alike.

use tract_core::internal::*;
use tract_core::ops::cnn::{Conv, PoolSpec};

/// A depthwise convolution over NCHW f32 (module doc): one input, kernel and bias baked in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostDepthwise {
    pool_spec: PoolSpec,
    /// `[C, KH, KW]`.
    kernel: Arc<Tensor>,
    /// `[C]`.
    bias: Arc<Tensor>,
}

impl HostDepthwise {
    /// The op for `conv` on an input of `input` (concrete), its kernel and bias
    /// constants: where it computes a depthwise convolution this op takes (f32, NCHW,
    /// two spatial axes, one channel per group, kernel as OIHW); none otherwise.
    pub fn for_conv(
        conv: &Conv,
        input: &TypedFact,
        kernel: &TypedFact,
        bias: &TypedFact,
    ) -> TractResult<Option<HostDepthwise>> {
        let spec = &conv.pool_spec;
        let channels = conv.input_channels();
        let depthwise =
            conv.group > 1 && conv.group == channels && conv.output_channels() == channels;
        if !depthwise {
            return Ok(None);
        }
        let Some((k, bias)) = super::conv_constants(conv, input, kernel, bias)? else {
            return Ok(None);
        };
        let kernel =
            (*k).clone()
                .into_shape(&[channels, spec.kernel_shape[0], spec.kernel_shape[1]])?;
        let bias = tensor1(&bias);
        Ok(Some(HostDepthwise {
            pool_spec: spec.clone(),
            kernel: kernel.into_arc_tensor(),
            bias: bias.into_arc_tensor(),
        }))
    }
}

impl Op for HostDepthwise {
    fn name(&self) -> StaticName {
        "HostDepthwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(self.pool_spec.info())
    }

    op_as_typed_op!();
}

impl EvalOp for HostDepthwise {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        Ok(tvec!(self.run(&input)?.into_tvalue()))
    }
}

impl TypedOp for HostDepthwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let shape = self.pool_spec.output_shape(&inputs[0].shape)?;
        Ok(tvec!(f32::fact(&shape.shape)))
    }

    as_op!();
}

/// One plane's geometry, in points.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    stride: [usize; 2],
    dilation: [usize; 2],
    pad: [usize; 2],
}

impl HostDepthwise {
    fn run(&self, input: &Tensor) -> TractResult<Tensor> {
        let &[n, c, h, w] = input.shape() else {
            bail!(
                "HostDepthwise: an input of shape {:?}, not NCHW",
                input.shape()
            );
        };
        let computed = self.pool_spec.computed_padding(&[h, w]);
        let (strides, dilations) = (self.pool_spec.strides(), self.pool_spec.dilations());
        let geo = Geometry {
            h,
            w,
            oh: computed[0].convoluted,
            ow: computed[1].convoluted,
            kh: self.kernel.shape()[1],
            kw: self.kernel.shape()[2],
            stride: [strides[0], strides[1]],
            dilation: [dilations[0], dilations[1]],
            pad: [computed[0].pad_before, computed[1].pad_before],
        };
        ensure!(
            c == self.kernel.shape()[0],
            "HostDepthwise: {c} channels for a kernel of {}",
            self.kernel.shape()[0]
        );
        // SAFETY: f32 has no invalid bit patterns, and every element is written below:
        // each plane's rows are filled with the bias before any tap.
        let mut output = unsafe { Tensor::uninitialized::<f32>(&[n, c, geo.oh, geo.ow])? };
        let x = input.try_as_plain_ram()?.as_slice::<f32>()?;
        let kernel = self.kernel.try_as_plain_ram()?.as_slice::<f32>()?;
        let bias = self.bias.try_as_plain_ram()?.as_slice::<f32>()?;
        let mut view = output.try_as_plain_ram_mut()?;
        let out = view.as_slice_mut::<f32>()?;
        let plane_in = h * w;
        let plane_out = geo.oh * geo.ow;
        let taps = geo.kh * geo.kw;
        let mut padded = Padded::new(&geo);
        let mut row = vec![0f32; padded.blocks * BLOCK];
        let run_row = row_loop();
        for (plane, out) in out.chunks_mut(plane_out.max(1)).enumerate().take(n * c) {
            let ch = plane % c;
            padded.fill(&x[plane * plane_in..][..plane_in], &geo);
            let weights = &kernel[ch * taps..][..taps];
            for (oy, out) in out.chunks_mut(geo.ow.max(1)).enumerate().take(geo.oh) {
                run_row(
                    &padded,
                    weights,
                    bias[ch],
                    oy * geo.stride[0] * padded.len,
                    &mut row,
                );
                out.copy_from_slice(&row[..geo.ow]);
            }
        }
        Ok(output)
    }
}

/// Output points computed together: four 256-bit accumulators, kept in registers across
/// the taps.
const BLOCK: usize = 32;

/// One input plane, zero-padded to every value the output reads, in phases along its
/// width (module doc): phase `p` of padded row `y` holds the padded row's values `p, p + s,
/// p + 2s, ...` (at a stride `s` of 1, the padded row itself). Rows and phases are `len`
/// long, room for whole blocks of output points.
struct Padded {
    values: Vec<f32>,
    rows: usize,
    len: usize,
    blocks: usize,
    /// Each tap's offset in `values` for output row 0, point 0, in the kernel's order.
    taps: Vec<usize>,
}

impl Padded {
    fn new(geo: &Geometry) -> Padded {
        let [sh, sw] = geo.stride;
        let [dh, dw] = geo.dilation;
        let blocks = geo.ow.div_ceil(BLOCK);
        let rows = (geo.oh.max(1) - 1) * sh + (geo.kh - 1) * dh + 1;
        let width = (blocks * BLOCK - 1) * sw + (geo.kw - 1) * dw + 1;
        let len = width.div_ceil(sw);
        let taps = (0..geo.kh)
            .flat_map(|ky| (0..geo.kw).map(move |kx| (ky, kx)))
            .map(|(ky, kx)| {
                let t = kx * dw;
                ((t % sw) * rows + ky * dh) * len + t / sw
            })
            .collect();
        Padded {
            values: vec![0.0; sw * rows * len],
            rows,
            len,
            blocks,
            taps,
        }
    }

    /// Copies the plane `x` in. The zeros around it are written once, by [`Padded::new`]:
    /// every plane of the op covers the same values.
    fn fill(&mut self, x: &[f32], geo: &Geometry) {
        let sw = geo.stride[1];
        let [pt, pl] = geo.pad;
        for iy in 0..geo.h {
            let y = iy + pt;
            if y >= self.rows {
                break;
            }
            let row = &x[iy * geo.w..][..geo.w];
            for p in 0..sw {
                // Phase `p` holds padded values `p + q * sw`, input `p + q * sw - pl`: from
                // the first `q` whose input is in the row.
                let q0 = if p >= pl { 0 } else { (pl - p).div_ceil(sw) };
                let first = p + q0 * sw - pl;
                if first >= geo.w || q0 >= self.len {
                    continue;
                }
                let phase = &mut self.values[(p * self.rows + y) * self.len..][q0..self.len];
                if sw == 1 {
                    let n = phase.len().min(geo.w);
                    phase[..n].copy_from_slice(&row[..n]);
                } else {
                    for (dst, v) in phase.iter_mut().zip(row[first..].iter().step_by(sw)) {
                        *dst = *v;
                    }
                }
            }
        }
    }
}

/// One output row, in whole blocks into `out`: for each point the bias, then each tap
/// in the kernel's order, one multiply and one add, reading `padded` from `row` on.
fn row_portable(padded: &Padded, weights: &[f32], bias: f32, row: usize, out: &mut [f32]) {
    for (b, out) in out.chunks_exact_mut(BLOCK).enumerate() {
        out.fill(bias);
        for (k, tap) in weights.iter().zip(&padded.taps) {
            let src = &padded.values[tap + row + b * BLOCK..][..BLOCK];
            for (a, v) in out.iter_mut().zip(src) {
                *a += k * v;
            }
        }
    }
}

/// [`row_portable`] in 256-bit vectors, the block's accumulators in registers across the
/// taps: the same operations lane by lane, so the same bits.
///
/// # Safety
/// The CPU supports AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn row_avx(padded: &Padded, weights: &[f32], bias: f32, row: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let b = _mm256_set1_ps(bias);
    for (block, out) in out.chunks_exact_mut(BLOCK).enumerate() {
        let (mut v0, mut v1, mut v2, mut v3) = (b, b, b, b);
        for (k, tap) in weights.iter().zip(&padded.taps) {
            let src = &padded.values[tap + row + block * BLOCK..][..BLOCK];
            // SAFETY: `src` holds a block, read in four runs of eight.
            unsafe {
                let p = src.as_ptr();
                let k = _mm256_set1_ps(*k);
                v0 = _mm256_add_ps(v0, _mm256_mul_ps(k, _mm256_loadu_ps(p)));
                v1 = _mm256_add_ps(v1, _mm256_mul_ps(k, _mm256_loadu_ps(p.add(8))));
                v2 = _mm256_add_ps(v2, _mm256_mul_ps(k, _mm256_loadu_ps(p.add(16))));
                v3 = _mm256_add_ps(v3, _mm256_mul_ps(k, _mm256_loadu_ps(p.add(24))));
            }
        }
        // SAFETY: `out` holds a block, written in four runs of eight.
        unsafe {
            let o = out.as_mut_ptr();
            _mm256_storeu_ps(o, v0);
            _mm256_storeu_ps(o.add(8), v1);
            _mm256_storeu_ps(o.add(16), v2);
            _mm256_storeu_ps(o.add(24), v3);
        }
    }
}

type RowFn = fn(&Padded, &[f32], f32, usize, &mut [f32]);

/// The widest loop this CPU runs.
fn row_loop() -> RowFn {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX, which is all `row_avx` enables.
        return |padded, weights, bias, row, out| unsafe {
            row_avx(padded, weights, bias, row, out)
        };
    }
    row_portable
}

/// Replaces each convolution of `model` (concrete) that [`HostDepthwise`] takes by it.
/// Returns how many.
pub fn depthwise_on_host(model: &mut TypedModel) -> TractResult<usize> {
    super::replace_convs(model, HostDepthwise::for_conv)
}
