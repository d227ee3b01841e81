//! f32 matrix kernels that read the activations where they lie: the products of a
//! convolutional network without their pack.
//!
//! tract runs a 1x1 convolution as a product whose m axis is the positions and whose k
//! axis is the input channels. Its x86 kernels read m in packed panels (`mr` values of
//! one k, then the next k), so before each product an `OptMatMulPack` node copies the
//! whole activation into panels. In NCHW the activation already is those panels, only a
//! channel plane apart instead of `mr` values: tract-linalg's `StridedKMajor` format
//! hands a kernel each panel as a pointer and that k stride, with no copy (it exists for
//! its Arm SME kernel; on any other layout it packs, and the kernel reads the packed
//! panel through the same descriptor). These kernels read that format, in AVX-512, and
//! store a tile whose m axis is contiguous with whole-vector writes where tract's
//! kernels write each value apart. On PP-OCRv4 rec and det the packs took 6-8% of the
//! CPU time, and det's products of short k lost as much again to the store
//! (benches/NOTES.md).
//!
//! Read in place, a panel's row of `mr` values is not aligned to the cache lines as a
//! packed one is: at 32 rows and fewer these kernels run as fast as tract's (a few
//! percent slower at k = 480, faster where k is short and the store counts), a 64-row
//! one 1.6x slower at k = 480. So the tiles here are 32x6, 32x5, 16x12 and 16x8; the
//! tier weighs them against tract's wider ones and their pack.
//!
//! The contract is tract's kernels' arithmetic, to the bit: each cell is one sum over k
//! in k's order, one fused multiply-add a step from zero, the fused operations after it
//! one f32 operation each with tract's operand order, and denormal inputs read as zero
//! (tract's kernels set MXCSR's DAZ bit; so do these). So a sample alone and in a batch
//! agree whichever kernel each got; a unit test compares them with tract's on every tile
//! shape, tails and denormals included.
//!
//! They are registered in tract-linalg's kernel registry (`inventory`), never preferred by
//! its own selection ([`NEVER_PREFERRED`]): only our tier (`kernels`) names them.
//!
//! [`NEVER_PREFERRED`]: tract_linalg::isa::NEVER_PREFERRED

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    use tract_core::internal::*;
    use tract_linalg::isa::{Arch, Isa, IsaReq, NEVER_PREFERRED};
    use tract_linalg::mmm::{DynKernel, FusedKerSpec, FusedSpec, MatMatMul, OutputStoreKer};
    use tract_linalg::mmm_routines::MmmRoutine;
    use tract_linalg::pack::PackedFormat;
    use tract_linalg::strided_panel::StridedKMajor;

    /// Every kernel of this module (`register!` below): its tile (`mr`, `nr`) and its name.
    #[cfg(test)]
    pub const KERNELS: &[(usize, usize, &str)] = &[
        (16, 8, "ragged_avx512_f32_16x8"),
        (16, 12, "ragged_avx512_f32_16x12"),
        (32, 5, "ragged_avx512_f32_32x5"),
        (32, 6, "ragged_avx512_f32_32x6"),
    ];

    /// What `StridedKMajor` hands a kernel as `pa`: tract-linalg's three machine words,
    /// the panel's first value, the bytes from one k to the next, and how many of its
    /// `mr` lanes hold values (fewer only in a last panel read in place; the rest of it
    /// may be outside the allocation).
    #[repr(C)]
    struct PanelDesc {
        ptr: *const f32,
        k_byte_stride: isize,
        valid: usize,
    }

    /// MXCSR as tract's x86 kernels run: every exception masked, round to nearest,
    /// denormal inputs read as zero (DAZ), denormal results kept.
    const MXCSR_DAZ: u32 = 0x1FC0;

    /// One kernel call: a tile of `16 * V` x `NR` over the fused operations of `specs`,
    /// up to `Done`. 0 when done; 1 for an operation these kernels do not run (the
    /// quantized ones, a packing or a store of another type).
    ///
    /// SAFETY: the pointers of `specs` address what tract-linalg's loop prepared for
    /// this tile (panels of `k` steps, tiles of `16 * V` x `NR` cells of f32), on a CPU
    /// with AVX-512F.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn kernel<const V: usize, const NR: usize>(specs: &[FusedKerSpec<f32>]) -> isize {
        let mut saved: u32 = 0;
        // SAFETY: MXCSR is read into and loaded from valid u32s; the state is restored
        // before returning, as tract's kernels do.
        unsafe {
            asm!("stmxcsr [{}]", in(reg) &mut saved, options(nostack));
            asm!("ldmxcsr [{}]", in(reg) &MXCSR_DAZ, options(nostack, readonly));
        }
        // SAFETY: the caller's contract.
        let status = unsafe { run::<V, NR>(specs) };
        // SAFETY: as above.
        unsafe { asm!("ldmxcsr [{}]", in(reg) &saved, options(nostack, readonly)) };
        status
    }

    #[target_feature(enable = "avx512f,fma")]
    unsafe fn run<const V: usize, const NR: usize>(specs: &[FusedKerSpec<f32>]) -> isize {
        let mut ab = [[_mm512_setzero_ps(); V]; NR];
        // `$e` assigned to every accumulator `$x` of column `$j`, rows `16 $v ..`. The
        // operations keep tract's operand order (its `vminps acc, operand, acc`). A macro,
        // not closures: those would not get this function's target features.
        macro_rules! each {
            ($j:ident, $v:ident, $x:ident => $e:expr) => {{
                for ($j, col) in ab.iter_mut().enumerate() {
                    for ($v, $x) in col.iter_mut().enumerate() {
                        let _ = ($j, $v);
                        *$x = $e;
                    }
                }
            }};
        }
        // SAFETY: the caller's contract on the pointers of `specs`, for every operation.
        unsafe {
            for spec in specs {
                match *spec {
                    FusedKerSpec::Done => break,
                    FusedKerSpec::Clear => ab = [[_mm512_setzero_ps(); V]; NR],
                    FusedKerSpec::LoadTile(col_major, _) => {
                        each!(j, v, x => _mm512_loadu_ps(col_major.add((j * V + v) * 16)))
                    }
                    FusedKerSpec::ScalarMin(s) => {
                        let s = _mm512_set1_ps(s);
                        each!(j, v, x => _mm512_min_ps(s, *x))
                    }
                    FusedKerSpec::ScalarMax(s) => {
                        let s = _mm512_set1_ps(s);
                        each!(j, v, x => _mm512_max_ps(s, *x))
                    }
                    FusedKerSpec::ScalarAdd(s) => {
                        let s = _mm512_set1_ps(s);
                        each!(j, v, x => _mm512_add_ps(s, *x))
                    }
                    FusedKerSpec::ScalarMul(s) => {
                        let s = _mm512_set1_ps(s);
                        each!(j, v, x => _mm512_mul_ps(s, *x))
                    }
                    FusedKerSpec::ScalarSub(s) => {
                        let s = _mm512_set1_ps(s);
                        each!(j, v, x => _mm512_sub_ps(s, *x))
                    }
                    FusedKerSpec::ScalarSubF(s) => {
                        let s = _mm512_set1_ps(s);
                        each!(j, v, x => _mm512_sub_ps(*x, s))
                    }
                    FusedKerSpec::LeakyRelu(alpha) => {
                        let alpha = _mm512_set1_ps(alpha);
                        let zero = _mm512_setzero_ps();
                        each!(j, v, x => {
                            let negative = _mm512_cmp_ps_mask::<_CMP_LT_OS>(*x, zero);
                            _mm512_mask_mul_ps(*x, negative, *x, alpha)
                        })
                    }
                    FusedKerSpec::PerRowMin(p) => {
                        each!(j, v, x => _mm512_min_ps(_mm512_loadu_ps(p.add(v * 16)), *x))
                    }
                    FusedKerSpec::PerRowMax(p) => {
                        each!(j, v, x => _mm512_max_ps(_mm512_loadu_ps(p.add(v * 16)), *x))
                    }
                    FusedKerSpec::PerRowAdd(p) => {
                        each!(j, v, x => _mm512_add_ps(_mm512_loadu_ps(p.add(v * 16)), *x))
                    }
                    FusedKerSpec::PerRowMul(p) => {
                        each!(j, v, x => _mm512_mul_ps(_mm512_loadu_ps(p.add(v * 16)), *x))
                    }
                    FusedKerSpec::PerRowSub(p) => {
                        each!(j, v, x => _mm512_sub_ps(_mm512_loadu_ps(p.add(v * 16)), *x))
                    }
                    FusedKerSpec::PerRowSubF(p) => {
                        each!(j, v, x => _mm512_sub_ps(*x, _mm512_loadu_ps(p.add(v * 16))))
                    }
                    FusedKerSpec::PerColMin(p) => {
                        each!(j, v, x => _mm512_min_ps(_mm512_set1_ps(*p.add(j)), *x))
                    }
                    FusedKerSpec::PerColMax(p) => {
                        each!(j, v, x => _mm512_max_ps(_mm512_set1_ps(*p.add(j)), *x))
                    }
                    FusedKerSpec::PerColAdd(p) => {
                        each!(j, v, x => _mm512_add_ps(_mm512_set1_ps(*p.add(j)), *x))
                    }
                    FusedKerSpec::PerColMul(p) => {
                        each!(j, v, x => _mm512_mul_ps(_mm512_set1_ps(*p.add(j)), *x))
                    }
                    FusedKerSpec::PerColSub(p) => {
                        each!(j, v, x => _mm512_sub_ps(_mm512_set1_ps(*p.add(j)), *x))
                    }
                    FusedKerSpec::PerColSubF(p) => {
                        each!(j, v, x => _mm512_sub_ps(*x, _mm512_set1_ps(*p.add(j))))
                    }
                    FusedKerSpec::AddRowColProducts(rows, cols) => each!(j, v, x => {
                        let row = _mm512_loadu_ps(rows.add(v * 16));
                        _mm512_fmadd_ps(row, _mm512_set1_ps(*cols.add(j)), *x)
                    }),
                    FusedKerSpec::AddUnicast(other) => {
                        if other.item_size != 4 {
                            return 1;
                        }
                        each!(j, v, x => _mm512_add_ps(*x, load(&other, j, v)))
                    }
                    FusedKerSpec::Store(tile) => {
                        if tile.item_size != 4 {
                            return 1;
                        }
                        store::<V, NR>(&tile, &ab)
                    }
                    FusedKerSpec::AddMatMul { k, pa, pb, packing } => {
                        if packing != 0 {
                            return 1;
                        }
                        add_mat_mul::<V, NR>(&mut ab, k, &*(pa as *const PanelDesc), pb as _)
                    }
                    FusedKerSpec::QScale(..)
                    | FusedKerSpec::RoundingShiftRight(..)
                    | FusedKerSpec::ShiftLeft(..) => return 1,
                }
            }
        }
        0
    }

    /// The 16 values of a tile at column `j`, rows `16 v ..`: one vector where the rows
    /// are contiguous, one value at a time otherwise.
    #[target_feature(enable = "avx512f")]
    unsafe fn load(tile: &OutputStoreKer, j: usize, v: usize) -> __m512 {
        // SAFETY: the tile's cells are f32s of the caller's tile.
        unsafe {
            let first = tile
                .ptr
                .offset(tile.col_byte_stride * j as isize + tile.row_byte_stride * 16 * v as isize);
            if tile.row_byte_stride == 4 {
                _mm512_loadu_ps(first as *const f32)
            } else {
                let mut values = [0f32; 16];
                for (i, value) in values.iter_mut().enumerate() {
                    *value = *(first.offset(tile.row_byte_stride * i as isize) as *const f32);
                }
                _mm512_loadu_ps(values.as_ptr())
            }
        }
    }

    /// Writes the accumulators to the tile: whole vectors where its rows are contiguous
    /// (a 1x1 convolution's output, and tract's scratch tile at the borders).
    #[target_feature(enable = "avx512f")]
    unsafe fn store<const V: usize, const NR: usize>(
        tile: &OutputStoreKer,
        ab: &[[__m512; V]; NR],
    ) {
        // SAFETY: the tile's cells are f32s of the caller's tile.
        unsafe {
            for (j, col) in ab.iter().enumerate() {
                for (v, x) in col.iter().enumerate() {
                    let first = tile.ptr.offset(
                        tile.col_byte_stride * j as isize + tile.row_byte_stride * 16 * v as isize,
                    );
                    if tile.row_byte_stride == 4 {
                        _mm512_storeu_ps(first as *mut f32, *x);
                    } else {
                        let mut values = [0f32; 16];
                        _mm512_storeu_ps(values.as_mut_ptr(), *x);
                        for (i, value) in values.iter().enumerate() {
                            *(first.offset(tile.row_byte_stride * i as isize) as *mut f32) = *value;
                        }
                    }
                }
            }
        }
    }

    /// `ab += a b` over `k` steps, `a` the panel `desc` describes, `b` a packed panel of
    /// `NR` values a step.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn add_mat_mul<const V: usize, const NR: usize>(
        ab: &mut [[__m512; V]; NR],
        k: usize,
        desc: &PanelDesc,
        b: *const f32,
    ) {
        let stride = desc.k_byte_stride / 4;
        let mut acc = *ab;
        // SAFETY: `desc` addresses `k` steps of `valid` values, `b` `k` steps of `NR`.
        unsafe {
            if desc.valid >= V * 16 {
                for step in 0..k {
                    let a_k = desc.ptr.offset(stride * step as isize);
                    let mut a = [_mm512_setzero_ps(); V];
                    for (v, a_v) in a.iter_mut().enumerate() {
                        *a_v = _mm512_loadu_ps(a_k.add(v * 16));
                    }
                    let b_k = b.add(step * NR);
                    for (j, col) in acc.iter_mut().enumerate() {
                        let b_j = _mm512_set1_ps(*b_k.add(j));
                        for (x, a_v) in col.iter_mut().zip(&a) {
                            *x = _mm512_fmadd_ps(*a_v, b_j, *x);
                        }
                    }
                }
            } else {
                // A last panel read in place: lanes past `valid` are not read, they may
                // lie past the allocation.
                let mut masks: [__mmask16; V] = [0; V];
                for (v, mask) in masks.iter_mut().enumerate() {
                    let lanes = desc.valid.saturating_sub(v * 16).min(16);
                    *mask = ((1u32 << lanes) - 1) as __mmask16;
                }
                for step in 0..k {
                    let a_k = desc.ptr.offset(stride * step as isize);
                    let mut a = [_mm512_setzero_ps(); V];
                    for ((v, a_v), mask) in a.iter_mut().enumerate().zip(masks) {
                        *a_v = _mm512_maskz_loadu_ps(mask, a_k.wrapping_add(v * 16));
                    }
                    let b_k = b.add(step * NR);
                    for (j, col) in acc.iter_mut().enumerate() {
                        let b_j = _mm512_set1_ps(*b_k.add(j));
                        for (x, a_v) in col.iter_mut().zip(&a) {
                            *x = _mm512_fmadd_ps(*a_v, b_j, *x);
                        }
                    }
                }
            }
        }
        *ab = acc;
    }

    /// The kernel of `16 * V` x `NR` as tract-linalg runs kernels: A in the strided
    /// format (packing 0), B packed as tract's AVX-512 kernels pack theirs.
    fn make<const MR: usize, const V: usize, const NR: usize>(
        name: &'static str,
    ) -> Box<dyn MatMatMul> {
        debug_assert_eq!(MR, 16 * V);
        fn call<const V: usize, const NR: usize>(specs: &[FusedKerSpec<f32>]) -> isize {
            // SAFETY: tract-linalg calls a kernel only where it is runnable (AVX-512F, the
            // `isa` below), with the specs of one tile.
            unsafe { kernel::<V, NR>(specs) }
        }
        let b = PackedFormat::new(DatumType::F32, NR, 4);
        let kernel = DynKernel::<MR, NR, f32> {
            name: name.to_string(),
            kernel: call::<V, NR>,
            arch: Some(Arch::X86_64),
            emulated: || false,
            packings: vec![(Box::new(StridedKMajor::new(MR)), Box::new(b))],
            stores: vec![DatumType::F32],
            built: true,
            isa: IsaReq::ANY.needing(&[Isa::X86_64Avx512f, Isa::X86_64Fma]),
            boost: || NEVER_PREFERRED,
            can_fuse: |spec| {
                !matches!(
                    spec,
                    FusedSpec::QScale(..)
                        | FusedSpec::RoundingShiftRight(..)
                        | FusedSpec::ShiftLeft(..)
                )
            },
            row_major_store: false,
        };
        kernel.mmm()
    }

    macro_rules! register {
        ($($mr:literal x $nr:literal / $v:literal),*) => {$(
            inventory::submit! {
                MmmRoutine {
                    make: || make::<$mr, $v, $nr>(concat!("ragged_avx512_f32_", $mr, "x", $nr)),
                }
            }
        )*};
    }
    register!(16 x 8 / 1, 16 x 12 / 1, 32 x 5 / 2, 32 x 6 / 2);
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use tract_core::internal::*;
    use tract_linalg::BinOp;
    use tract_linalg::mmm::{AsInputValue, FusedSpec, MatMatMul, MmmDispatch};

    /// Values of both signs and many magnitudes, a denormal every 11th (tract's kernels
    /// read those as zero), a negative zero every 17th.
    fn values(len: usize, salt: usize) -> Vec<f32> {
        (0..len)
            .map(|i| match (i + salt) % 187 {
                x if x % 11 == 0 => {
                    f32::from_bits(0x0000_4000 + x as u32) * if x % 2 == 0 { 1.0 } else { -1.0 }
                }
                x if x % 17 == 0 => -0.0,
                _ => ((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0 - 1.0,
            })
            .collect()
    }

    fn tensor(shape: &[usize], salt: usize) -> TractResult<Tensor> {
        tensor1(&values(shape.iter().product(), salt)).into_shape(shape)
    }

    /// `a b` (m x k by k x n) through `mmm` with every fused operation a convolution may
    /// get, `a` stored k-major (`in_place`: each k's m values contiguous, what the
    /// strided format reads where it lies) or m-major, the result m-contiguous or not.
    fn product(
        mmm: &dyn MatMatMul,
        (m, k, n): (usize, usize, usize),
        in_place: bool,
        m_contiguous: bool,
    ) -> TractResult<Tensor> {
        let a = tensor(&[m, k], 1)?;
        let (a, k_axis, m_axis) = if in_place {
            (a.permute_axes(&[1, 0])?, 0, 1)
        } else {
            (a, 1, 0)
        };
        let b = tensor(&[k, n], 2)?;
        let per_row = tensor(&[m], 3)?;
        let per_col = tensor(&[n], 4)?;
        let unicast = tensor(&[m, n], 5)?;
        let (six, zero, alpha) = (tensor0(6f32), tensor0(0f32), tensor0(0.1f32));
        let (pack_a, pack_b) = &mmm.packings()[0];
        let pa = pack_a.prepare_one(&a, k_axis, m_axis)?;
        let pb = pack_b.prepare_one(&b, 0, 1)?;
        let (mut c, c_axes) = if m_contiguous {
            (Tensor::zero::<f32>(&[n, m])?, (1, 0))
        } else {
            (Tensor::zero::<f32>(&[m, n])?, (0, 1))
        };
        // SAFETY: every operand is of the extents the product runs over.
        unsafe {
            let store = mmm
                .c_view(Some(c_axes.0), Some(c_axes.1))
                .wrap(&c.view_mut());
            let other = mmm.c_view(Some(0), Some(1)).wrap(&unicast.view());
            mmm.run(
                m,
                n,
                &[
                    FusedSpec::AddMatMul {
                        a: AsInputValue::Borrowed(&*pa),
                        b: AsInputValue::Borrowed(&*pb),
                        packing: 0,
                    },
                    FusedSpec::BinPerRow(per_row.view(), BinOp::Add),
                    FusedSpec::BinPerCol(per_col.view(), BinOp::Mul),
                    FusedSpec::BinPerRow(per_row.view(), BinOp::SubF),
                    FusedSpec::BinPerCol(per_col.view(), BinOp::Sub),
                    FusedSpec::AddUnicast(other),
                    FusedSpec::LeakyRelu(&alpha),
                    FusedSpec::BinScalar(&zero, BinOp::Max),
                    FusedSpec::BinScalar(&six, BinOp::Min),
                    FusedSpec::Store(store),
                ],
            )?;
        }
        Ok(c)
    }

    fn bits(t: &Tensor) -> TractResult<Vec<u32>> {
        Ok(t.try_as_plain_ram()?
            .as_slice::<f32>()?
            .iter()
            .map(|x| x.to_bits())
            .collect())
    }

    /// Each of our kernels gives the bits of tract's kernel of its tile (and so of every
    /// f32 kernel, `kernels`' test), its operand read in place or packed, its tile stored
    /// whole or value by value, on extents with tails in m and n.
    #[test]
    fn each_kernel_gives_the_bits_of_tracts_kernel_of_its_tile() -> TractResult<()> {
        let runnable = MmmDispatch::native().runnable();
        let find = |name: &str| runnable.iter().find(|k| k.name().eq(name));
        let mut compared = 0;
        for (mr, nr, name) in super::x86::KERNELS {
            let (Some(ours), Some(theirs)) =
                (find(name), find(&format!("avx512_mmm_f32_{mr}x{nr}")))
            else {
                continue;
            };
            for (m, k, n) in [(181, 37, 13), (mr * 2, 64, nr * 3), (5, 3, 1)] {
                for m_contiguous in [true, false] {
                    let reference = bits(&product(&**theirs, (m, k, n), true, m_contiguous)?)?;
                    for in_place in [true, false] {
                        let got = bits(&product(&**ours, (m, k, n), in_place, m_contiguous)?)?;
                        let differ = got.iter().zip(&reference).filter(|(x, y)| x != y).count();
                        assert_eq!(
                            differ, 0,
                            "{name} against tract's at {m}x{k}x{n}, in place {in_place}, \
                             m contiguous {m_contiguous}"
                        );
                        compared += 1;
                    }
                }
            }
        }
        assert!(
            compared > 0 || !tract_linalg::isa::native().has(tract_linalg::isa::Isa::X86_64Avx512f),
            "no kernel compared on a CPU with AVX-512"
        );
        Ok(())
    }
}
