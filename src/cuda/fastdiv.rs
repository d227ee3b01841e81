//! Divisions by a divisor known at launch, as our kernels do them: a multiply-high, an
//! add and a shift instead of a division.
//!
//! A GPU has no integer divider: `n / d` by a runtime `d` is a sequence of some twenty
//! instructions, and an element-wise kernel that finds an element's coordinates with a
//! few of them per element is held by those instructions below the memory bandwidth
//! (the fused chains of PP-OCRv4 rec ran at 31% of it with four per element). The host
//! computes each divisor's multiplier and shift once (`FastDiv::new`, Granlund and
//! Montgomery's method for 32-bit numerators), the kernel `fast_div` (`common.cuh`).
//! The quotient is exact for every numerator below 2^31, which the kernels that use it
//! check their tensors stay below.

/// A divisor as a kernel divides by it: `[multiplier, shift]`, with
/// `n / d == (umulhi(n, multiplier) + n) >> shift` for every `n < 2^31`.
pub type FastDiv = [u32; 2];

/// The [`FastDiv`] of `d`, for `1 <= d <= 2^31` (a zero divides as one: the kernels
/// never divide by an extent of zero, a tensor of no element is not launched).
pub fn fast_div(d: u32) -> FastDiv {
    let d = d.clamp(1, 1 << 31) as u64;
    // The smallest l with 2^l >= d.
    let l = 64 - (d - 1).leading_zeros() as u64;
    let multiplier = (((1u128 << 32) * ((1u128 << l) - d as u128)) / d as u128 + 1) as u32;
    [multiplier, l as u32]
}

/// What a kernel computes for `n / d` from `d`'s [`FastDiv`] (tests).
#[cfg(test)]
fn divide(n: u32, [multiplier, shift]: FastDiv) -> u32 {
    let high = ((n as u64 * multiplier as u64) >> 32) as u32;
    // The kernels' numerators are below 2^31: the sum does not wrap.
    (high + n) >> shift
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotients_are_exact_below_two_to_the_31() {
        let mut divisors: Vec<u32> = (1..=1100).collect();
        for p in 1..=31 {
            let p = 1u32 << p;
            divisors.extend([p - 1, p, p + 1]);
        }
        divisors.extend([6625, 176 * 6625, 3 * 48 * 1408, (1 << 31) - 1, 1 << 31]);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut numerators: Vec<u32> = (0..2048).collect();
        numerators.extend([(1 << 31) - 1, (1 << 31) - 2, 1 << 30, (1 << 30) - 1]);
        for _ in 0..4096 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            numerators.push((state >> 33) as u32);
        }
        for d in &divisors {
            let f = fast_div(*d);
            for n in numerators
                .iter()
                .chain(&[d - 1, *d, d.saturating_mul(3) & 0x7fff_ffff])
            {
                let n = n & 0x7fff_ffff;
                assert_eq!(divide(n, f), n / d, "{n} / {d} with {f:?}");
            }
        }
    }
}
