//! Dense convolutions of a small kernel on the host, computed directly (no im2col).
//!
//! tract lowers a 3x3 convolution to a matrix product over an im2col matrix it packs
//! lazily, tile by tile, from a padded copy of the input (`Pad`, then `LazyIm2col`): on
//! PP-OCRv4 det's head (96 to 24 channels at a quarter of the page) that ran at about
//! half of its kernels' speed, the gathering and the padding taking as long as the
//! arithmetic. Here the input is copied once into zero-padded planes, and each block of 16
//! output points of 4 output channels keeps its 8 accumulators in AVX registers across
//! every input channel and tap; the 16 points of every input channel's rows (a few
//! kilobytes) stay in the L1 cache while all the output channels are computed over them.
//! Where the CPU has two 512-bit FMA units (tract-linalg's probe: AMD Zen 5, Intel's
//! server cores) a block is 32 points in AVX-512 registers: twice the arithmetic a cycle
//! (PP-OCRv4 det's head on a Zen 5, benches/NOTES.md). Not on one unit (Zen 4), where
//! 512-bit operations run at the 256-bit ones' rate.
//!
//! The arithmetic is tract's matrix product's: for each output point a fused multiply-add
//! per input channel and tap, in the order of tract's im2col (input channel, then kernel
//! row, then kernel column), from zero, then the bias added; where tract's packing reads a
//! zero of the padding this multiplies it too. The same bits as tract's plan on most
//! shapes, within a rounding on the others (tiny outputs, where tract takes another
//! path; tests/it/host_ops.rs). Either way each output point's arithmetic is its own, the
//! same in a ragged batch and alone.

use tract_core::internal::*;
use tract_core::ops::cnn::{Conv, PoolSpec};

/// Output channels computed together.
const CHANNELS: usize = 4;
/// The most output channels this op takes. With more, tract's matrix product fills its
/// kernels' rows and packs the im2col tiles over as many channels, and is as fast or
/// faster (3x3 on one core of an AMD Zen 4: 16 and 32 channels 1.5x
/// faster here, 24 channels at PP-OCRv4 det's 176x240 2x; 64 channels at 56x56 11% slower,
/// 128 at 28x28 even, 256 at 14x14 7% slower).
const MAX_CHANNELS: usize = 32;
/// Output points computed together along a row: two vectors of 8 (AVX).
const POINTS: usize = 16;
/// The same with AVX-512: two vectors of 16.
const POINTS_512: usize = 32;

/// Whether blocks are computed with AVX-512 (module doc).
fn wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && tract_linalg::x86_64::fma_width::has_dual_avx512_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A dense convolution over NCHW f32 (module doc): stride and dilation 1, one group,
/// kernel and bias baked in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostConv {
    pool_spec: PoolSpec,
    /// `[CO / 4, CI, KH, KW, 4]`: each tap's four output channels side by side.
    kernel: Arc<Tensor>,
    /// `[CO]`.
    bias: Arc<Tensor>,
    ci: usize,
    co: usize,
}

impl HostConv {
    /// The op for `conv` on an input of `input` (concrete), its kernel and bias constants:
    /// where it computes a convolution this op takes (f32, NCHW, two spatial axes, one
    /// group, a kernel of more than one tap and at most 7x7, stride and dilation 1, output
    /// channels a multiple of 4 up to [`MAX_CHANNELS`], kernel as OIHW, an AVX and FMA CPU);
    /// none otherwise.
    pub fn for_conv(
        conv: &Conv,
        input: &TypedFact,
        kernel: &TypedFact,
        bias: &TypedFact,
    ) -> TractResult<Option<HostConv>> {
        #[cfg(target_arch = "x86_64")]
        let cpu = std::arch::is_x86_feature_detected!("avx")
            && std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let cpu = false;
        let spec = &conv.pool_spec;
        let (ci, co) = (conv.input_channels(), conv.output_channels());
        let fits = cpu
            && conv.group == 1
            && co.is_multiple_of(CHANNELS)
            && co <= MAX_CHANNELS
            && spec.strides().iter().all(|s| *s == 1)
            && spec.dilations().iter().all(|d| *d == 1)
            && spec.kernel_shape.iter().product::<usize>() > 1
            && spec.kernel_shape.iter().all(|k| *k <= 7);
        if !fits {
            return Ok(None);
        }
        let Some((k, bias)) = super::conv_constants(conv, input, kernel, bias)? else {
            return Ok(None);
        };
        let k = k.try_as_plain_ram()?;
        let k = k.as_slice::<f32>()?;
        // [CO, CI, KH, KW] -> [CO / 4, CI, KH, KW, 4].
        let taps = ci * spec.kernel_shape.iter().product::<usize>();
        let mut blocked = vec![0f32; k.len()];
        for o in 0..co {
            for t in 0..taps {
                blocked[((o / CHANNELS) * taps + t) * CHANNELS + o % CHANNELS] = k[o * taps + t];
            }
        }
        Ok(Some(HostConv {
            pool_spec: spec.clone(),
            kernel: tensor1(&blocked).into_arc_tensor(),
            bias: tensor1(&bias).into_arc_tensor(),
            ci,
            co,
        }))
    }
}

impl Op for HostConv {
    fn name(&self) -> StaticName {
        "HostConv".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(self.pool_spec.info())
    }

    op_as_typed_op!();
}

impl EvalOp for HostConv {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        Ok(tvec!(self.run(&input)?.into_tvalue()))
    }
}

impl TypedOp for HostConv {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let shape = self.pool_spec.output_shape(&inputs[0].shape)?;
        Ok(tvec!(f32::fact(&shape.shape)))
    }

    /// A multiply-add per output point, input channel and tap, as tract's `Conv` counts.
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        let output = self.pool_spec.output_shape(&inputs[0].shape)?;
        let points: TDim = output.shape.iter().product();
        let taps = self.ci * self.pool_spec.kernel_shape.iter().product::<usize>();
        Ok(tvec!((Cost::FMA(f32::datum_type()), points * taps)))
    }

    as_op!();
}

impl HostConv {
    fn run(&self, input: &Tensor) -> TractResult<Tensor> {
        let &[n, c, h, w] = input.shape() else {
            bail!("HostConv: an input of shape {:?}, not NCHW", input.shape());
        };
        ensure!(
            c == self.ci,
            "HostConv: {c} channels for a kernel of {}",
            self.ci
        );
        let computed = self.pool_spec.computed_padding(&[h, w]);
        let [kh, kw] = [
            self.pool_spec.kernel_shape[0],
            self.pool_spec.kernel_shape[1],
        ];
        let (oh, ow) = (computed[0].convoluted, computed[1].convoluted);
        let (pt, pl) = (computed[0].pad_before, computed[1].pad_before);
        let geo = Geometry::new(c, self.co, [kh, kw], [oh, ow]);
        let (rows, len) = (geo.rows, geo.len);
        #[cfg(target_arch = "x86_64")]
        let wide = wide();
        let mut padded = vec![0f32; c * rows * len];
        // SAFETY: f32 has no invalid bit patterns, and every element is written below:
        // each block's points are stored, the last block's through a buffer.
        let mut output = unsafe { Tensor::uninitialized::<f32>(&[n, self.co, oh, ow])? };
        let x = input.try_as_plain_ram()?;
        let x = x.as_slice::<f32>()?;
        let kernel = self.kernel.try_as_plain_ram()?;
        let kernel = kernel.as_slice::<f32>()?;
        let bias = self.bias.try_as_plain_ram()?;
        let bias = bias.as_slice::<f32>()?;
        let mut view = output.try_as_plain_ram_mut()?;
        let out = view.as_slice_mut::<f32>()?;
        for (sample, out) in out
            .chunks_mut((self.co * oh * ow).max(1))
            .enumerate()
            .take(n)
        {
            let x = &x[sample * c * h * w..][..c * h * w];
            // The planes too are filled across the threads, a channel each: on many
            // cores a serial copy of the input would weigh as much as the arithmetic.
            let copy = c * rows * len;
            // A plane of no value (an empty input) has nothing to fill, and no rows to
            // split.
            tract_linalg::multithread::par_chunks_mut(
                &mut padded,
                (rows * len).max(1),
                copy,
                |first, planes| {
                    for (ch, plane) in (first..).zip(planes.chunks_mut((rows * len).max(1))) {
                        for iy in 0..h {
                            let y = iy + pt;
                            if y >= rows {
                                break;
                            }
                            // Input column `ix` lands at `ix + pl`, within the row while it
                            // is read at all.
                            let count = w.min(len.saturating_sub(pl));
                            plane[y * len + pl..][..count]
                                .copy_from_slice(&x[(ch * h + iy) * w..][..count]);
                        }
                    }
                    Ok(())
                },
            )?;
            // Rows of the output across the cores tract's executor lends this run (none
            // on a lane of its own), every channel of a row on the same thread: each
            // block of points of the input rows is read once for all the channels, as
            // on one thread (split by channels, every thread read the whole input, and
            // two threads were slower than one on PP-OCRv4 det's head).
            ensure!(
                out.len() == self.co * oh * ow,
                "HostConv: an output of {} values for {}x{oh}x{ow}",
                out.len(),
                self.co
            );
            let work = self.co * oh * ow * c * kh * kw;
            let (padded, target) = (&padded, Target(out.as_mut_ptr()));
            let mut rows = vec![(); oh];
            tract_linalg::multithread::par_chunks_mut(&mut rows, 1, work, |first, chunk| {
                let target = &target;
                #[cfg(target_arch = "x86_64")]
                {
                    // SAFETY: `for_conv` took this op only on a CPU with AVX and FMA;
                    // `target` is this sample's output, `co * oh * ow` values (checked
                    // above), and each call writes its own rows of it.
                    // `wide()` said the CPU has AVX-512 too.
                    unsafe {
                        let rows = first..first + chunk.len();
                        if wide {
                            avx512::blocks(padded, kernel, bias, &geo, target.0, rows)
                        } else {
                            avx::blocks(padded, kernel, bias, &geo, target.0, rows)
                        }
                    };
                    Ok(())
                }
                #[cfg(not(target_arch = "x86_64"))]
                bail!("HostConv runs on x86_64 CPUs with AVX and FMA only")
            })?;
        }
        Ok(output)
    }
}

/// A sample's output, written by the threads that compute its rows, each its own rows.
struct Target(*mut f32);

// SAFETY: the threads write disjoint rows of the output through it, nothing else.
unsafe impl Send for Target {}
// SAFETY: as above.
unsafe impl Sync for Target {}

/// One sample's sizes, in points.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    ci: usize,
    co: usize,
    kh: usize,
    kw: usize,
    /// Rows and length of a padded plane.
    rows: usize,
    len: usize,
    oh: usize,
    ow: usize,
}

impl Geometry {
    /// A sample's sizes, its padded planes every row the output reads and whole blocks of
    /// points long (of either width's blocks).
    fn new(ci: usize, co: usize, [kh, kw]: [usize; 2], [oh, ow]: [usize; 2]) -> Geometry {
        Geometry {
            ci,
            co,
            kh,
            kw,
            rows: oh + kh - 1,
            len: ow.div_ceil(POINTS_512) * POINTS_512 + kw - 1,
            oh,
            ow,
        }
    }
}

/// The blocks of one width of vectors: `$v` of `$w` floats under `$feature`, blocks of
/// `$points` (two vectors) of [`CHANNELS`] channels, with its intrinsics. Each point's
/// arithmetic is the same at either width (module doc).
#[cfg(target_arch = "x86_64")]
macro_rules! blocks {
    (
        $(#[$doc:meta])* mod $name:ident: $feature:literal, $v:ty, $w:literal, $points:ident,
        zero $zero:path, load $load:path, store $store:path, splat $splat:path,
        fmadd $fmadd:path, add $add:path $(,)?
    ) => {
        $(#[$doc])*
        mod $name {
            use std::arch::x86_64::*;

            use super::{CHANNELS, Geometry, $points};

            /// Output rows `rows` of every channel of one sample into `out` (`[co, oh,
            /// ow]`), from its padded planes.
            ///
            /// # Safety
            /// The CPU has the feature and FMA; `padded` holds `ci` planes of `rows * len`,
            /// whole blocks long, `kernel` the blocked taps of `co` channels, `bias` `co`
            /// values; `out` points to `co * oh * ow` values, whose rows `rows` nothing else
            /// reads or writes meanwhile.
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn blocks(
                padded: &[f32],
                kernel: &[f32],
                bias: &[f32],
                geo: &Geometry,
                out: *mut f32,
                rows: std::ops::Range<usize>,
            ) {
                let taps = geo.ci * geo.kh * geo.kw;
                let blocks = geo.co / CHANNELS;
                assert!(
                    padded.len() >= geo.ci * geo.rows * geo.len
                        && blocks * CHANNELS == geo.co
                        && kernel.len() >= geo.co * taps
                        && bias.len() >= geo.co
                        && rows.end <= geo.oh
                        && geo.rows >= geo.oh + geo.kh - 1
                        && geo.len >= geo.ow.div_ceil($points) * $points + geo.kw - 1,
                    "HostConv: buffers smaller than their geometry"
                );
                let plane = geo.rows * geo.len;
                let mut last = [0f32; $points * CHANNELS];
                // SAFETY: every pointer below stays within its buffer: a block's rows of
                // each plane, whole blocks of points and the kernel's columns, the kernel's
                // taps of a block of channels, the output's rows (the sizes asserted above).
                unsafe {
                    for oy in rows {
                        let mut x0 = 0;
                        while x0 < geo.ow {
                            for block in 0..blocks {
                                let mut acc = [[$zero(); 2]; CHANNELS];
                                let mut k = kernel.as_ptr().add(block * taps * CHANNELS);
                                for ch in 0..geo.ci {
                                    for ky in 0..geo.kh {
                                        let row = padded
                                            .as_ptr()
                                            .add(ch * plane + (oy + ky) * geo.len + x0);
                                        for kx in 0..geo.kw {
                                            let v0 = $load(row.add(kx));
                                            let v1 = $load(row.add(kx + $w));
                                            for (c, acc) in acc.iter_mut().enumerate() {
                                                let w = $splat(*k.add(c));
                                                acc[0] = $fmadd(w, v0, acc[0]);
                                                acc[1] = $fmadd(w, v1, acc[1]);
                                            }
                                            k = k.add(CHANNELS);
                                        }
                                    }
                                }
                                let n = (geo.ow - x0).min($points);
                                for (c, acc) in acc.iter().enumerate() {
                                    let o = block * CHANNELS + c;
                                    let b = $splat(bias[o]);
                                    let (a0, a1) = ($add(acc[0], b), $add(acc[1], b));
                                    let dst = out.add((o * geo.oh + oy) * geo.ow + x0);
                                    if n == $points {
                                        $store(dst, a0);
                                        $store(dst.add($w), a1);
                                    } else {
                                        let tmp = last.as_mut_ptr().add(c * $points);
                                        $store(tmp, a0);
                                        $store(tmp.add($w), a1);
                                        std::ptr::copy_nonoverlapping(tmp, dst, n);
                                    }
                                }
                            }
                            x0 += $points;
                        }
                    }
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
blocks! {
    /// Blocks of 16 points in 256-bit vectors (AVX and FMA).
    mod avx: "avx,fma", __m256, 8, POINTS,
    zero _mm256_setzero_ps, load _mm256_loadu_ps, store _mm256_storeu_ps,
    splat _mm256_set1_ps, fmadd _mm256_fmadd_ps, add _mm256_add_ps,
}

#[cfg(target_arch = "x86_64")]
blocks! {
    /// Blocks of 32 points in 512-bit vectors (AVX-512F).
    mod avx512: "avx512f", __m512, 16, POINTS_512,
    zero _mm512_setzero_ps, load _mm512_loadu_ps, store _mm512_storeu_ps,
    splat _mm512_set1_ps, fmadd _mm512_fmadd_ps, add _mm512_add_ps,
}

/// Replaces each convolution of `model` (concrete) that [`HostConv`] takes by it.
/// Returns how many.
pub fn convs_on_host(model: &mut TypedModel) -> TractResult<usize> {
    super::replace_convs(model, HostConv::for_conv)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// AVX-512's blocks give every point the bits of AVX's, partial last blocks and
    /// kernels of every size up to 7 included.
    #[test]
    fn blocks_of_either_width_give_the_same_bits() {
        if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            return;
        }
        let mut seed = 7u32;
        let mut value = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for (ci, co, kh, kw, oh, ow) in [
            (3usize, 8usize, 3usize, 3usize, 5usize, 77usize),
            (5, 4, 1, 7, 2, 32),
            (2, 12, 5, 2, 3, 9),
        ] {
            let geo = Geometry::new(ci, co, [kh, kw], [oh, ow]);
            let (rows, len) = (geo.rows, geo.len);
            let padded: Vec<f32> = (0..ci * rows * len).map(|_| value()).collect();
            let kernel: Vec<f32> = (0..co * ci * kh * kw).map(|_| value()).collect();
            let bias: Vec<f32> = (0..co).map(|_| value()).collect();
            let mut narrow = vec![0f32; co * oh * ow];
            let mut wide = vec![1f32; co * oh * ow];
            // SAFETY: the CPU has AVX, FMA and AVX-512F (checked above); the buffers are
            // of the geometry's sizes.
            unsafe {
                avx::blocks(&padded, &kernel, &bias, &geo, narrow.as_mut_ptr(), 0..oh);
                avx512::blocks(&padded, &kernel, &bias, &geo, wide.as_mut_ptr(), 0..oh);
            }
            let differ = narrow
                .iter()
                .zip(&wide)
                .filter(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(differ.count(), 0, "{geo:?}");
        }
    }
}
