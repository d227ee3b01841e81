//! Which of tract-linalg's f32 matrix kernels the host's products run, on x86-64 CPUs with
//! two 512-bit FMA units (AMD Zen 5, Intel's server cores).
//!
//! tract-linalg picks a kernel for each product (a 1x1 convolution, a `MatMul`) by asking
//! its dispatch **tiers** in order of precedence; on AMD with AVX-512 its tier is a linear
//! cost model fitted on one desktop Zen 5, and on the shapes of convolutional networks it
//! answers `16x12`, which runs at 0.70-0.75 of the `32x6` and `48x4` kernels' speed on an
//! EPYC Zen 5 (PP-OCRv4 rec's 1x1 convolutions, m = the positions, n = the output
//! channels: 660x480x480 in 2.10 ms against 1.53 and 1.46; 1320x240x240 in 0.93 against
//! 0.76 and 0.79; benches/NOTES.md), and at 0.90-0.95 of them on the very data its model
//! was fitted to. On an Intel Xeon with two 512-bit FMA units (the GPU machine's host,
//! AVX512-FP16) tract's tiers run PP-OCRv4 rec 4-17% slower end to end than this one
//! (benches/NOTES.md): the speeds below are Zen 5's, the pack they save is saved there too.
//! This module submits a tier of ours, above tract's, to tract-linalg's
//! registry (`inventory`): for an f32 product whose m and n are known it takes the kernel
//! of the best measured speed times the share of its tiles' cells that hold results, and
//! leaves every other query (other types, a vector product, an unknown extent, another
//! CPU) to tract's tiers. Its candidates are tract's kernels and ours that read the
//! activation in place (`unpacked`); a kernel of tract's needs its operand packed first,
//! which the tier weighs as a few more output columns to compute.
//!
//! The choice only moves which tile shape computes an output cell; each cell is still one
//! sum over k in k's order, so a sample's result does not depend on the batch it ran in
//! (the ragged tests compare a batch with its samples alone, bit for bit where the
//! contract asks it). `TRACT_RAGGED_HOST_KERNELS=0` leaves the choice to tract.
//!
//! The tier is registered wherever tract-ragged is linked: a program that calls only
//! tract's APIs links it with `use tract_ragged as _;` (tract's own CLI through
//! `tract_ragged::link()`); otherwise the linker leaves it out and tract's tiers decide.

use tract_core::declare_knob;
#[cfg(target_arch = "x86_64")]
use tract_core::internal::*;
#[cfg(target_arch = "x86_64")]
use tract_linalg::isa::{Arch, Isa, IsaSet};
#[cfg(target_arch = "x86_64")]
use tract_linalg::mmm::{Query, Suitable};
#[cfg(target_arch = "x86_64")]
use tract_linalg::mmm_tiers::MmmTier;

declare_knob!(
    scopable TRACT_RAGGED_HOST_KERNELS,
    bool,
    true,
    "cpu: on x86-64 CPUs with two 512-bit FMA units (AMD Zen 5, Intel Xeons), pick the f32 matrix kernels of a plan's products by the fill of their tiles and their speed measured on Zen 5 (PP-OCRv4 rec's products take 13-16% less time than on tract-linalg's choice there, the whole run 4-17% less on a Xeon; off: its cost model picks)."
);

declare_knob!(
    scopable TRACT_RAGGED_UNPACKED_PRODUCTS,
    bool,
    true,
    "cpu: where TRACT_RAGGED_HOST_KERNELS picks a kernel, weigh tract-ragged's kernels, which read the activations in place, against tract-linalg's and their pack (the same bits; PP-OCRv4 det's page 20% faster on one Zen 5 core; off: tract-linalg's kernels and their pack)."
);

/// A kernel the tier may answer, its tile (`mr` x `nr`), its speed relative to the
/// fastest at full tiles, measured on an EPYC Zen 5 at PP-OCRv4 rec's shapes (module doc,
/// benches/NOTES.md), and whether it reads the activation in place (ours, `unpacked`)
/// or after tract's pack.
#[cfg(target_arch = "x86_64")]
struct Choice {
    name: &'static str,
    mr: usize,
    nr: usize,
    speed: f32,
    in_place: bool,
}

#[cfg(target_arch = "x86_64")]
const fn tracts(name: &'static str, mr: usize, nr: usize, speed: f32) -> Choice {
    Choice {
        name,
        mr,
        nr,
        speed,
        in_place: false,
    }
}

#[cfg(target_arch = "x86_64")]
const fn ours(name: &'static str, mr: usize, nr: usize, speed: f32) -> Choice {
    Choice {
        name,
        mr,
        nr,
        speed,
        in_place: true,
    }
}

/// Ours read a panel's rows where they lie, a row's `mr` values across more cache lines
/// than in a packed panel: at 32 rows and fewer as fast as tract's kernels (a few percent
/// slower at k = 480, faster at k <= 128 where the store counts), wider ones slower (64x3
/// at 0.65 on k = 480), so only those are ours.
#[cfg(target_arch = "x86_64")]
const CHOICES: &[Choice] = &[
    ours("ragged_avx512_f32_32x6", 32, 6, 1.0),
    ours("ragged_avx512_f32_32x5", 32, 5, 0.9),
    ours("ragged_avx512_f32_16x12", 16, 12, 0.85),
    ours("ragged_avx512_f32_16x8", 16, 8, 0.75),
    tracts("avx512_mmm_f32_32x6", 32, 6, 1.0),
    tracts("avx512_mmm_f32_48x4", 48, 4, 1.0),
    tracts("avx512_mmm_f32_32x5", 32, 5, 0.93),
    tracts("avx512_mmm_f32_64x3", 64, 3, 0.93),
    tracts("avx512_mmm_f32_80x2", 80, 2, 0.75),
    tracts("avx512_mmm_f32_16x12", 16, 12, 0.75),
    tracts("avx512_mmm_f32_16x8", 16, 8, 0.72),
];

/// A product's pack, in output columns of the product: tract's pack copies the m x k
/// activation once, the product computes n columns over it, so a pack costs about what a
/// few columns do (measured: 5 on PP-OCRv4 det's first 1x1 convolution, n = 16, its pack
/// 4.3 ms against 13.9; 8 to 37 on rec's, 2 to 7% of their time; benches/NOTES.md). A
/// packed kernel's speed is weighed by `n / (n + PACK_COLUMNS)` against ours.
#[cfg(target_arch = "x86_64")]
const PACK_COLUMNS: f32 = 8.0;

/// The share of `tiles` of `r` covering `x` cells that hold results.
#[cfg(target_arch = "x86_64")]
fn fill(x: usize, r: usize) -> f32 {
    x as f32 / (x.div_ceil(r) * r) as f32
}

/// The kernel of [`CHOICES`] with the best speed times fill of m and n, among the suitable
/// ones; None to leave the query to tract's tiers.
#[cfg(target_arch = "x86_64")]
fn preferred(
    _isa: &IsaSet,
    dt: DatumType,
    query: &Query,
    suitable: &[Suitable],
) -> Option<&'static str> {
    let plain_f32 = dt == DatumType::F32
        && query.activation == DatumType::F32
        && matches!(
            query.weight,
            tract_linalg::WeightType::Plain(DatumType::F32)
        );
    let (Some(m), Some(n)) = (query.m, query.n) else {
        return None;
    };
    if !plain_f32 || m == 0 || n < 2 || !TRACT_RAGGED_HOST_KERNELS.get() {
        return None;
    }
    let unpacked = TRACT_RAGGED_UNPACKED_PRODUCTS.get();
    CHOICES
        .iter()
        .filter(|c| unpacked || !c.in_place)
        .filter(|c| tract_linalg::mmm::suitable_named(suitable, c.name).is_some())
        .map(|c| {
            let pack = if unpacked && !c.in_place {
                n as f32 / (n as f32 + PACK_COLUMNS)
            } else {
                1.0
            };
            (c.speed * pack * fill(m, c.mr) * fill(n, c.nr), c.name)
        })
        .fold(
            None,
            |best: Option<(f32, &'static str)>, (score, name)| match best {
                Some((b, _)) if b >= score => best,
                _ => Some((score, name)),
            },
        )
        .map(|(_, name)| name)
}

/// Our tier's name in tract-linalg's ladder.
#[cfg(target_arch = "x86_64")]
const TIER_NAME: &str = "tract-ragged f32, two 512-bit FMA units";

/// AVX-512 and two 512-bit FMA units (tract-linalg's own probe), whatever the vendor.
#[cfg(target_arch = "x86_64")]
fn applies(isa: &IsaSet) -> bool {
    isa.has(Isa::X86_64Avx512f)
        && isa.has(Isa::X86_64Fma)
        && tract_linalg::x86_64::fma_width::has_dual_avx512_fma()
}

// Our tier (module doc), above every tier of tract-linalg's (theirs go up to 8).
#[cfg(target_arch = "x86_64")]
inventory::submit! {
    MmmTier {
        arch: Some(Arch::X86_64),
        precedence: 20,
        name: TIER_NAME,
        applies,
        preferred,
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use tract_core::knobs::KnobScope;
    use tract_linalg::mmm::{AsInputValue, FusedSpec, MmmDispatch};

    #[test]
    fn the_fill_of_the_tiles_decides_between_kernels_of_one_speed() {
        assert_eq!(fill(96, 32), 1.0);
        assert_eq!(fill(96, 48), 1.0);
        assert!(fill(100, 48) < fill(100, 32) && fill(100, 32) < 1.0);
    }

    fn query(m: usize, k: usize, n: usize) -> Query {
        Query::plain(DatumType::F32, Some(m), Some(k), Some(n))
    }

    /// PP-OCRv4 rec's largest 1x1 convolution (660 positions, 480 channels in and out)
    /// gets a 32x6 or 48x4 tile where the CPU has them, our kernel that reads in place
    /// unless `TRACT_RAGGED_UNPACKED_PRODUCTS` is off; a vector product, an unknown
    /// extent, another type and the knob off are left to tract's tiers.
    #[test]
    fn a_product_of_known_extents_gets_a_kernel_of_full_tiles() {
        let d = MmmDispatch::native();
        let isa = tract_linalg::isa::native();
        let q = query(660, 480, 480);
        let suitable = d.suitable(&q);
        let has = |name: &str| tract_linalg::mmm::suitable_named(&suitable, name).is_some();
        let answer = preferred(&isa, DatumType::F32, &q, &suitable);
        if has("avx512_mmm_f32_32x6") {
            assert!(
                matches!(
                    answer,
                    Some("ragged_avx512_f32_32x6" | "ragged_avx512_f32_48x4")
                ),
                "{answer:?}"
            );
            // Few output columns: the pack weighs more than a fuller packed tile gains
            // (PP-OCRv4 det's first 1x1 convolution, 16 channels in and out).
            let det = query(286_720, 16, 16);
            let answer = preferred(&isa, DatumType::F32, &det, &d.suitable(&det));
            assert_eq!(answer, Some("ragged_avx512_f32_32x6"));
            let packed = KnobScope::new([("TRACT_RAGGED_UNPACKED_PRODUCTS", "0")]).unwrap();
            let answer = packed.enter(|| preferred(&isa, DatumType::F32, &q, &suitable));
            assert!(
                matches!(answer, Some("avx512_mmm_f32_32x6" | "avx512_mmm_f32_48x4")),
                "{answer:?}"
            );
        } else {
            assert_eq!(answer, None);
        }
        let mut vector = query(660, 480, 1);
        assert_eq!(
            preferred(&isa, DatumType::F32, &vector, &d.suitable(&vector)),
            None
        );
        vector.m = None;
        vector.n = Some(480);
        assert_eq!(
            preferred(&isa, DatumType::F32, &vector, &d.suitable(&vector)),
            None
        );
        assert_eq!(preferred(&isa, DatumType::I32, &q, &suitable), None);
        let off = KnobScope::new([("TRACT_RAGGED_HOST_KERNELS", "0")]).unwrap();
        assert_eq!(
            off.enter(|| preferred(&isa, DatumType::F32, &q, &suitable)),
            None
        );
    }

    /// The tier is in tract-linalg's registry, and heads the native ladder where it
    /// applies.
    #[test]
    fn the_tier_is_registered_above_tracts() {
        assert!(tract_linalg::mmm_tiers::declared().any(|t| t.name == TIER_NAME));
        let native = MmmDispatch::native();
        if applies(&tract_linalg::isa::native()) {
            assert_eq!(native.tiers().first().map(|t| t.name), Some(TIER_NAME));
        } else {
            assert!(native.tiers().iter().all(|t| t.name != TIER_NAME));
        }
    }

    /// What lets the tier pick by shape: every f32 kernel of this CPU gives a product the
    /// same bits (one sum over k, in k's order, per cell), so a sample alone and in a
    /// batch, whose extents differ, agree whichever kernel each got.
    #[test]
    fn every_f32_kernel_gives_a_product_the_same_bits() -> TractResult<()> {
        let (m, k, n) = (70, 93, 37);
        let value = |i: usize, salt: usize| ((i * 7919 + salt) % 1009) as f32 / 1009.0 - 0.5;
        let a =
            tensor1(&(0..m * k).map(|i| value(i, 1)).collect::<Vec<_>>()).into_shape(&[m, k])?;
        let b =
            tensor1(&(0..k * n).map(|i| value(i, 2)).collect::<Vec<_>>()).into_shape(&[k, n])?;
        let mut reference: Option<(String, Tensor)> = None;
        let mut compared = 0;
        for mmm in MmmDispatch::native().runnable() {
            let name = mmm.name().to_string();
            let ours = CHOICES.iter().any(|c| c.name == name);
            if !(ours || name.starts_with("fma_mmm_f32")) || mmm.nr() == 1 {
                continue;
            }
            compared += 1;
            let mut c = Tensor::zero::<f32>(&[m, n])?;
            let (pack_a, pack_b) = &mmm.packings()[0];
            let pa = pack_a.prepare_one(&a, 1, 0)?;
            let pb = pack_b.prepare_one(&b, 0, 1)?;
            // SAFETY: `a`, `b` and `c` are of the extents the product is run over.
            unsafe {
                let store = mmm.c_view(Some(0), Some(1)).wrap(&c.view_mut());
                mmm.run(
                    m,
                    n,
                    &[
                        FusedSpec::AddMatMul {
                            a: AsInputValue::Borrowed(&*pa),
                            b: AsInputValue::Borrowed(&*pb),
                            packing: 0,
                        },
                        FusedSpec::Store(store),
                    ],
                )?;
            }
            match &reference {
                None => reference = Some((name, c)),
                Some((first, r)) => assert!(
                    r.try_as_plain_ram()?
                        .as_slice::<f32>()?
                        .iter()
                        .zip(c.try_as_plain_ram()?.as_slice::<f32>()?)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{name} and {first} differ"
                ),
            }
        }
        assert!(
            compared > 1 || !std::arch::is_x86_feature_detected!("fma"),
            "{compared}"
        );
        Ok(())
    }
}
