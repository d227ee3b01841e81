//! Depthwise convolutions on the host, vectorised along the output's width at every
//! position, borders and strides included.
//!
//! tract's `DepthWise` splits the output into zones: inside, its kernel runs 32 points at a
//! time; in the border zones and at any stride along the width, one point at a time. Text
//! lines are a few pixels high (PP-OCRv4 rec's maps are 12, 6 and 3 rows): with a 5x5
//! kernel, a third of the rows are border rows, and its depthwise layers ran at 15 GFLOP/s
//! (2 at a stride of 2 along the width), a fifth of ONNX Runtime's speed on the same shapes.
//!
//! Where the CPU has AVX, channels go **eight at a time**, one per lane of a vector (the
//! layout ONNX Runtime's NCHWc kernels use): eight planes are interleaved (8x8 transposes)
//! into a buffer zero-padded to every value the output reads (for a band of output rows:
//! the work is cut into groups of channels and bands of rows, over the executor's
//! threads), so that every tap of every output point, at any
//! stride and dilation and at the borders, is one aligned load of eight channels, and the
//! eight channels' weights for a tap are one vector. Each output row is computed in blocks
//! of eight points, their eight accumulators in registers across all the taps, then
//! transposed back into the eight output planes. Plane by plane, each tap's eight points
//! are an unaligned load (a third of them across a cache line) and the weight a broadcast:
//! PP-OCRv4 rec's 14 depthwise layers took 7.6 ms of a 1024 px line so on one core, 6.3
//! ms eight channels at a time, where the transposes in and out are about 40% of the op.
//! Where the CPU has two 512-bit FMA units (AMD Zen 5) and the stride along the width is
//! 1, two blocks go at a time, a 512-bit vector holding two neighbouring points' eight
//! channels: the same arithmetic per point, rec's depthwise layers a fifth faster.
//!
//! Without AVX, each plane is copied into such a buffer of its own, in **phases** along
//! the width at a stride `s` above 1 (every `s`-th value from an offset), so that every
//! tap of every output point reads a contiguous run, and each output row is computed in
//! blocks of 32 points.
//!
//! The arithmetic is tract's, element by element, on both paths: the bias, then for each
//! tap in the kernel's order one multiply and one add (no fused multiply-add). Where tract skips a
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
        Ok(tvec!(self.run(&input, true)?.into_tvalue()))
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

impl Geometry {
    /// The rows and the width of the zero-padded input that output rows of `points`
    /// points each (the output's width rounded up to whole blocks) read.
    fn padded(&self, points: usize) -> (usize, usize) {
        let rows = (self.oh.max(1) - 1) * self.stride[0] + (self.kh - 1) * self.dilation[0] + 1;
        let width =
            points.max(1).saturating_sub(1) * self.stride[1] + (self.kw - 1) * self.dilation[1] + 1;
        (rows, width)
    }
}

impl HostDepthwise {
    /// The convolution of `input`: eight channels at a time where the CPU has AVX and
    /// `blocked`, else plane by plane (module doc); the same bits either way.
    fn run(&self, input: &Tensor, blocked: bool) -> TractResult<Tensor> {
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
        // each output point by its block, bias first.
        let mut output = unsafe { Tensor::uninitialized::<f32>(&[n, c, geo.oh, geo.ow])? };
        let x = input.try_as_plain_ram()?.as_slice::<f32>()?;
        let kernel = self.kernel.try_as_plain_ram()?.as_slice::<f32>()?;
        let bias = self.bias.try_as_plain_ram()?.as_slice::<f32>()?;
        let mut view = output.try_as_plain_ram_mut()?;
        let out = view.as_slice_mut::<f32>()?;
        let op = Planes {
            geo,
            n,
            c,
            x,
            kernel,
            bias,
        };
        ensure!(
            x.len() == n * c * h * w && out.len() == n * c * geo.oh * geo.ow,
            "HostDepthwise: tensors of {} and {} values for {n}x{c} planes",
            x.len(),
            out.len()
        );
        match blocked {
            #[cfg(target_arch = "x86_64")]
            true if std::arch::is_x86_feature_detected!("avx") => {
                // SAFETY: the CPU supports AVX; the sizes of `x` and `out` were checked.
                unsafe { lanes::run(&op, out) }
            }
            _ => op.run_planes(out),
        }
        Ok(output)
    }
}

/// One depthwise convolution's operands: `n` x `c` input planes `x` (NCHW), the kernel
/// `[c, kh, kw]` and the bias `[c]`.
struct Planes<'a> {
    geo: Geometry,
    n: usize,
    c: usize,
    x: &'a [f32],
    kernel: &'a [f32],
    bias: &'a [f32],
}

impl Planes<'_> {
    /// Plane by plane into `out` (NCHW): the path of CPUs without AVX (module doc).
    fn run_planes(&self, out: &mut [f32]) {
        let geo = &self.geo;
        let plane_in = geo.h * geo.w;
        let plane_out = geo.oh * geo.ow;
        let taps = geo.kh * geo.kw;
        let mut padded = Padded::new(geo);
        let mut row = vec![0f32; padded.blocks * BLOCK];
        let run_row = row_loop();
        for (plane, out) in out
            .chunks_mut(plane_out.max(1))
            .enumerate()
            .take(self.n * self.c)
        {
            let ch = plane % self.c;
            padded.fill(&self.x[plane * plane_in..][..plane_in], geo);
            let weights = &self.kernel[ch * taps..][..taps];
            for (oy, out) in out.chunks_mut(geo.ow.max(1)).enumerate().take(geo.oh) {
                run_row(
                    &padded,
                    weights,
                    self.bias[ch],
                    oy * geo.stride[0] * padded.len,
                    &mut row,
                );
                out.copy_from_slice(&row[..geo.ow]);
            }
        }
    }
}

/// Eight channels at a time, a lane each (module doc).
#[cfg(target_arch = "x86_64")]
mod lanes {
    use super::{Geometry, Planes};
    use std::arch::x86_64::*;

    /// Channels in a vector.
    const LANES: usize = 8;
    /// Output points a block computes, each a vector of channels held in a register.
    const POINTS: usize = 8;

    /// The values of eight channels at one point: one aligned vector.
    #[repr(C, align(32))]
    #[derive(Clone, Copy, Default)]
    struct Lanes([f32; LANES]);

    /// Eight planes interleaved, zero-padded to every value the output reads: `rows` rows
    /// of `len` points from padded row `top` on (the rows a band of output rows reads),
    /// room for whole blocks of output points.
    struct Interleaved {
        values: Vec<Lanes>,
        top: usize,
        rows: usize,
        len: usize,
        /// The output's width rounded up to whole blocks.
        blocks: usize,
    }

    impl Interleaved {
        /// Room for the rows that `band` output rows read.
        fn new(geo: &Geometry, band: usize) -> Interleaved {
            let blocks = geo.ow.div_ceil(POINTS);
            let (rows, len) = geo.padded(blocks * POINTS);
            let rows = rows.min(band_rows(geo, band));
            Interleaved {
                values: vec![Lanes::default(); rows * len],
                top: 0,
                rows,
                len,
                blocks,
            }
        }
    }

    /// The padded rows that `band` output rows read.
    fn band_rows(geo: &Geometry, band: usize) -> usize {
        (band.max(1) - 1) * geo.stride[0] + (geo.kh - 1) * geo.dilation[0] + 1
    }

    /// The 8x8 transpose of `r`: lane `i` of output `j` is lane `j` of input `i`.
    #[target_feature(enable = "avx")]
    #[inline]
    fn transpose(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }

    /// Output rows computed together on a thread, at least: fewer and the rows a band
    /// reads above and below its own would be copied in as often as its own.
    const MIN_BAND: usize = 8;

    /// Computes every output plane of `op` into `out` (NCHW), eight channels at a time.
    /// With the threads tract's executor lends this run (none on a lane of its own), the
    /// work is cut into groups of eight channels and, where the groups are fewer than the
    /// threads can share (PP-OCRv4 det's first layers have 16 channels at a quarter of
    /// the page), bands of output rows: each output point's arithmetic is its own,
    /// whichever group, band and thread compute it.
    ///
    /// # Safety
    /// The CPU supports AVX; `op.x` holds `n * c * h * w` values and `out`
    /// `n * c * oh * ow`.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn run(op: &Planes, out: &mut [f32]) {
        let geo = &op.geo;
        let plane_out = geo.oh * geo.ow;
        if plane_out == 0 || op.c == 0 {
            return;
        }
        let groups = op.c.div_ceil(LANES);
        let threads = super::super::executor_threads();
        // Four units a thread, as tract's own splits: the units of unequal cost even out.
        let bands = match threads {
            0 | 1 => 1,
            t => (4 * t)
                .div_ceil(groups)
                .min(geo.oh.div_ceil(MIN_BAND))
                .max(1),
        };
        let band = geo.oh.div_ceil(bands);
        let bands = geo.oh.div_ceil(band);
        let work = op.c * plane_out * geo.kh * geo.kw;
        for (image, out) in out.chunks_mut(op.c * plane_out).enumerate().take(op.n) {
            let target = Target(out.as_mut_ptr());
            let mut units = vec![(); groups * bands];
            // Errors cannot come from `unit`; a failed thread pool is tract's panic.
            let _ =
                tract_linalg::multithread::par_chunks_mut(&mut units, 1, work, |first, chunk| {
                    let target = &target;
                    let mut il = Interleaved::new(geo, band);
                    let mut row = vec![Lanes::default(); il.blocks * POINTS];
                    let mut spare = Vec::new();
                    for u in first..first + chunk.len() {
                        let (g, b) = (u / bands, u % bands);
                        let rows = b * band..((b + 1) * band).min(geo.oh);
                        // SAFETY: AVX, as this function's caller promised; `target` is this
                        // image's `c * oh * ow` values, and each unit writes its own rows of
                        // its own channels' planes.
                        unsafe {
                            unit(
                                op,
                                image,
                                g * LANES,
                                rows,
                                &mut il,
                                &mut row,
                                &mut spare,
                                target.0,
                            )
                        };
                    }
                    Ok(())
                });
        }
    }

    /// An image's output, written by the threads that compute its units, each its own
    /// rows of its own planes.
    struct Target(*mut f32);

    // SAFETY: the threads write disjoint rows of the output's planes through it, nothing
    // else.
    unsafe impl Send for Target {}
    // SAFETY: as above.
    unsafe impl Sync for Target {}

    /// Output rows `rows` of image `image`'s channels `first..first + 8` (fewer at the
    /// last group) into `out` (the image's `c` output planes).
    ///
    /// # Safety
    /// The CPU supports AVX; `op.x` holds `n * c * h * w` values; `out` points to `c * oh *
    /// ow` values, whose rows `rows` of these channels nothing else reads or writes
    /// meanwhile; `il` was made for at least `rows.len()` output rows.
    #[target_feature(enable = "avx")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn unit(
        op: &Planes,
        image: usize,
        first: usize,
        rows: std::ops::Range<usize>,
        il: &mut Interleaved,
        row: &mut [Lanes],
        spare: &mut Vec<f32>,
        out: *mut f32,
    ) {
        let geo = &op.geo;
        let (plane_in, plane_out) = (geo.h * geo.w, geo.oh * geo.ow);
        let channels = (op.c - first).min(LANES);
        assert!(
            first < op.c
                && op.x.len() >= (op.n * op.c) * plane_in
                && rows.end <= geo.oh
                && il.rows >= band_rows(geo, rows.len()),
            "HostDepthwise: a unit beyond the tensors"
        );
        let taps = geo.kh * geo.kw;
        let mut bias = Lanes::default();
        let mut weights = vec![Lanes::default(); taps];
        for l in 0..channels {
            bias.0[l] = op.bias[first + l];
            for (t, w) in weights.iter_mut().enumerate() {
                w.0[l] = op.kernel[(first + l) * taps + t];
            }
        }
        // Lanes past the last channel read zeros and write to a plane nobody reads.
        if channels < LANES && spare.len() < plane_out {
            spare.resize(plane_out, 0.0);
        }
        let zeros = vec![0f32; if channels < LANES { plane_in } else { 0 }];
        let planes: [&[f32]; LANES] = std::array::from_fn(|l| match l < channels {
            true => &op.x[(image * op.c + first + l) * plane_in..][..plane_in],
            false => &zeros[..],
        });
        let outs: [*mut f32; LANES] = std::array::from_fn(|l| match l < channels {
            // SAFETY: channel `first + l` is below `c`: its plane is within `out`.
            true => unsafe { out.add((first + l) * plane_out) },
            false => spare.as_mut_ptr(),
        });
        // Two blocks a 512-bit vector's pair of points where the CPU has two 512-bit FMA
        // units (tract-linalg's probe; not Zen 4, whose 512-bit operations run at the
        // 256-bit ones' rate).
        let wide = std::arch::is_x86_feature_detected!("avx512f")
            && tract_linalg::x86_64::fma_width::has_dual_avx512_fma();
        // SAFETY: AVX is enabled here, AVX-512F where `wide`; each of `outs` has
        // `plane_out` values.
        unsafe {
            fill(il, geo, &planes, rows.start * geo.stride[0]);
            for oy in rows {
                row_blocks(il, geo, &weights, &bias, oy, row, &outs, wide);
            }
        }
    }

    /// Interleaves the eight `planes` into `il`, from padded row `top` on: every value
    /// of its rows written, the zeros of the padding included (a buffer serves one band
    /// after another).
    #[target_feature(enable = "avx")]
    unsafe fn fill(il: &mut Interleaved, geo: &Geometry, planes: &[&[f32]; LANES], top: usize) {
        let [pt, pl] = geo.pad;
        il.top = top;
        // The input points a padded row holds.
        let width = geo.w.min(il.len.saturating_sub(pl));
        for (y, dst) in (top..).zip(il.values.chunks_exact_mut(il.len.max(1))) {
            let Some(iy) = y.checked_sub(pt).filter(|iy| *iy < geo.h) else {
                dst.fill(Lanes::default());
                continue;
            };
            let (left, rest) = dst.split_at_mut(pl.min(il.len));
            let (dst, right) = rest.split_at_mut(width);
            left.fill(Lanes::default());
            right.fill(Lanes::default());
            let mut ix = 0;
            while ix + LANES <= width {
                // SAFETY: each plane holds row `iy` of `geo.w >= ix + 8` values; `dst` holds
                // `width >= ix + 8` aligned vectors.
                unsafe {
                    let mut r = [_mm256_setzero_ps(); LANES];
                    for (r, plane) in r.iter_mut().zip(planes) {
                        *r = _mm256_loadu_ps(plane[iy * geo.w + ix..].as_ptr());
                    }
                    for (j, v) in transpose(r).into_iter().enumerate() {
                        _mm256_store_ps(dst[ix + j].0.as_mut_ptr(), v);
                    }
                }
                ix += LANES;
            }
            for (x, d) in dst.iter_mut().enumerate().skip(ix) {
                for (l, plane) in planes.iter().enumerate() {
                    d.0[l] = plane[iy * geo.w + x];
                }
            }
        }
    }

    /// Output row `oy` of eight channels into their planes `outs`, in blocks of points:
    /// for each point the bias, then each tap in the kernel's order, one multiply and one
    /// add; a block past the row's end through `row`. Where `wide` (AVX-512F, a stride of
    /// 1 along the width) two blocks at a time, two points a 512-bit vector.
    #[target_feature(enable = "avx")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_blocks(
        il: &Interleaved,
        geo: &Geometry,
        weights: &[Lanes],
        bias: &Lanes,
        oy: usize,
        row: &mut [Lanes],
        outs: &[*mut f32; LANES],
        wide: bool,
    ) {
        let [sh, sw] = geo.stride;
        let [dh, dw] = geo.dilation;
        let values = il.values.as_ptr();
        let blocks = row.len() / POINTS;
        let mut block = 0;
        // SAFETY: every index read is below `rows * len` by construction of `Interleaved`
        // (the last block's last point at the last tap is the padded row's last value);
        // AVX-512F where `wide` (the caller's).
        unsafe {
            if wide && sw == 1 {
                while block + 2 <= blocks {
                    let line = (oy * sh - il.top) * il.len + block * POINTS;
                    let [first, second] =
                        wide_pair(values.add(line), geo, il.len, dh, dw, weights, bias);
                    store(first, block, geo, oy, row, outs);
                    store(second, block + 1, geo, oy, row, outs);
                    block += 2;
                }
            }
            let b = _mm256_load_ps(bias.0.as_ptr());
            while block < blocks {
                let mut acc = [b; POINTS];
                for ky in 0..geo.kh {
                    let line = (oy * sh - il.top + ky * dh) * il.len + block * POINTS * sw;
                    for kx in 0..geo.kw {
                        let k = _mm256_load_ps(weights[ky * geo.kw + kx].0.as_ptr());
                        let at = values.add(line + kx * dw);
                        for (p, a) in acc.iter_mut().enumerate() {
                            let v = _mm256_load_ps((*at.add(p * sw)).0.as_ptr());
                            *a = _mm256_add_ps(*a, _mm256_mul_ps(k, v));
                        }
                    }
                }
                store(acc, block, geo, oy, row, outs);
                block += 1;
            }
        }
    }

    /// Two blocks of points from `at` (their first point at the first tap) at a stride of
    /// 1: each 512-bit accumulator two neighbouring points, each point's arithmetic that
    /// of a 256-bit block (the bias, then per tap one multiply and one add).
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `at` is within the interleaved rows with every tap of
    /// both blocks' points after it.
    #[target_feature(enable = "avx512f")]
    unsafe fn wide_pair(
        at: *const Lanes,
        geo: &Geometry,
        len: usize,
        dh: usize,
        dw: usize,
        weights: &[Lanes],
        bias: &Lanes,
    ) -> [[__m256; POINTS]; 2] {
        // SAFETY: the caller's.
        unsafe {
            let b = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_load_ps(
                bias.0.as_ptr(),
            ))));
            let mut acc = [b; POINTS];
            for ky in 0..geo.kh {
                for kx in 0..geo.kw {
                    let w = _mm256_load_ps(weights[ky * geo.kw + kx].0.as_ptr());
                    let k = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(w)));
                    let tap = at.add(ky * dh * len + kx * dw) as *const f32;
                    for (j, a) in acc.iter_mut().enumerate() {
                        let v = _mm512_loadu_ps(tap.add(2 * j * LANES));
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(k, v));
                    }
                }
            }
            let mut halves = [[_mm256_setzero_ps(); POINTS]; 2];
            for (j, a) in acc.iter().enumerate() {
                let (lo, hi) = (
                    _mm512_castps512_ps256(*a),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a))),
                );
                // Points 2j and 2j + 1 of the sixteen.
                halves[(2 * j) / POINTS][(2 * j) % POINTS] = lo;
                halves[(2 * j + 1) / POINTS][(2 * j + 1) % POINTS] = hi;
            }
            halves
        }
    }

    /// Block `block` of output row `oy` (its eight points of eight channels) into the
    /// channels' planes: transposed into eight runs of eight points where the block is
    /// whole, through `row` where it passes the row's end.
    ///
    /// # Safety
    /// The CPU supports AVX; each of `outs` holds the output's `oh * ow` values.
    #[target_feature(enable = "avx")]
    unsafe fn store(
        acc: [__m256; POINTS],
        block: usize,
        geo: &Geometry,
        oy: usize,
        row: &mut [Lanes],
        outs: &[*mut f32; LANES],
    ) {
        let x = block * POINTS;
        // SAFETY: points `x..x + 8` of row `oy` where whole, the row's remaining points
        // otherwise (the caller's planes).
        unsafe {
            if x + POINTS <= geo.ow {
                for (l, v) in transpose(acc).into_iter().enumerate() {
                    _mm256_storeu_ps(outs[l].add(oy * geo.ow + x), v);
                }
            } else {
                let out = &mut row[x..x + POINTS];
                for (o, a) in out.iter_mut().zip(acc) {
                    _mm256_store_ps(o.0.as_mut_ptr(), a);
                }
                for (p, point) in out.iter().enumerate().take(geo.ow.saturating_sub(x)) {
                    for (l, plane) in outs.iter().enumerate() {
                        *plane.add(oy * geo.ow + x + p) = point.0[l];
                    }
                }
            }
        }
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
        let sw = geo.stride[1];
        let [dh, dw] = geo.dilation;
        let blocks = geo.ow.div_ceil(BLOCK);
        let (rows, width) = geo.padded(blocks * BLOCK);
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

#[cfg(test)]
mod tests {
    use super::*;
    use tract_linalg::multithread::multithread_tract_scope;

    /// Values in [-1, 1) from a seed (an LCG: the library has no random crate).
    fn values(seed: &mut u64, len: usize) -> Vec<f32> {
        (0..len)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Eight channels at a time gives the bits of plane by plane: channel counts around
    /// multiples of eight, every kernel size, stride, dilation and padding, widths around
    /// whole blocks.
    #[test]
    fn eight_channels_at_a_time_give_the_bits_of_plane_by_plane() {
        #[cfg(target_arch = "x86_64")]
        if !std::arch::is_x86_feature_detected!("avx") {
            return;
        }
        let mut seed = 7u64;
        let (mut cases, mut spread, mut banded) = (0, 0, 0);
        let executor = tract_linalg::multithread::Executor::multithread(3);
        for case in 0..400usize {
            let pick = |k: usize, m: usize| (case * k + case / 7) % m;
            let (n, c) = (1 + pick(1, 2), 1 + pick(5, 19));
            let (kh, kw) = (1 + pick(3, 5), 1 + pick(7, 5));
            let (sh, sw) = (1 + pick(11, 2), 1 + pick(13, 3));
            let (dh, dw) = (1 + pick(17, 2), 1 + pick(19, 2));
            let (pt, pl) = (pick(23, 3), pick(29, 3));
            let (h, w) = (1 + pick(31, 30), 1 + pick(37, 60));
            let (eh, ew) = (h + 2 * pt, w + 2 * pl);
            if eh <= dh * (kh - 1) || ew <= dw * (kw - 1) {
                continue;
            }
            let geo = Geometry {
                h,
                w,
                oh: (eh - dh * (kh - 1) - 1) / sh + 1,
                ow: (ew - dw * (kw - 1) - 1) / sw + 1,
                kh,
                kw,
                stride: [sh, sw],
                dilation: [dh, dw],
                pad: [pt, pl],
            };
            let x = values(&mut seed, n * c * h * w);
            let kernel = values(&mut seed, c * kh * kw);
            let bias = values(&mut seed, c);
            let op = Planes {
                geo,
                n,
                c,
                x: &x,
                kernel: &kernel,
                bias: &bias,
            };
            let mut planes = vec![f32::NAN; n * c * geo.oh * geo.ow];
            op.run_planes(&mut planes);
            let mut blocked = vec![f32::NAN; planes.len()];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports AVX (checked above); the sizes are the op's.
            unsafe {
                lanes::run(&op, &mut blocked)
            };
            #[cfg(not(target_arch = "x86_64"))]
            op.run_planes(&mut blocked);
            let same = |other: &[f32]| {
                planes
                    .iter()
                    .zip(other)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            };
            assert!(same(&blocked), "case {case}: {geo:?}, n {n}, c {c}");
            // The groups and bands of rows spread over three threads of tract's executor.
            let mut threaded = vec![f32::NAN; planes.len()];
            #[cfg(target_arch = "x86_64")]
            multithread_tract_scope(executor.clone(), || {
                // SAFETY: as above.
                unsafe { lanes::run(&op, &mut threaded) }
            });
            #[cfg(not(target_arch = "x86_64"))]
            op.run_planes(&mut threaded);
            assert!(
                same(&threaded),
                "case {case}, 3 threads: {geo:?}, n {n}, c {c}"
            );
            let threaded = c * geo.oh * geo.ow * kh * kw >= 32768;
            spread += usize::from(c > 8 && threaded);
            banded += usize::from(geo.oh > 8 && threaded);
            cases += 1;
        }
        assert!(cases > 200, "{cases} cases");
        assert!(spread > 20, "{spread} cases spread over threads");
        assert!(banded > 20, "{banded} cases cut into bands of rows");
    }
}
