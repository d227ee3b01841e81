//! Kernel arguments passed by value: each struct is defined once, in Rust, and declared
//! to CUDA from that definition.
//!
//! A kernel taking a struct by value reads it with the layout its C declaration gives,
//! while the host writes it with Rust's. Written twice by hand, the two drift apart
//! silently (a field added on one side shifts every field after it). So
//! [`kernel_args!`](crate::kernel_args) defines the `repr(C)` struct and its
//! [`KernelArgs::declaration`]: the C declaration, generated from the same field list,
//! followed by a `static_assert` of its size as Rust computed it. The kernel sources
//! include the generated declarations (`#include "args.cuh"`, replaced when a kernel file
//! is compiled: [`super::nvrtc`]); a size that differs fails the kernel's compilation,
//! naming the struct. NVRTC has no `offsetof`, so the fields' offsets are checked on the
//! device instead: [`offsets_probe`] is a kernel writing where CUDA put each field, which
//! the GPU tests compare with [`KernelArgs::offsets`].

use std::fmt::Write;

pub use cudarc::driver::DeviceRepr;

/// A field type a kernel argument may hold, and how C spells it.
pub trait CType {
    /// The C type of the element: `unsigned`, `long long`, `float`.
    const BASE: &'static str;
    /// The array declarator after the field's name: `[3]`, `[16][6]`, or nothing.
    fn dims() -> String {
        String::new()
    }
}

macro_rules! c_type {
    ($($t:ty => $c:literal),*) => { $(impl CType for $t { const BASE: &'static str = $c; })* };
}

c_type!(i32 => "int", u32 => "unsigned", i64 => "long long", u64 => "unsigned long long", f32 => "float");

impl<T: CType, const N: usize> CType for [T; N] {
    const BASE: &'static str = T::BASE;
    fn dims() -> String {
        format!("[{N}]{}", T::dims())
    }
}

/// A struct passed by value to a kernel, declared to CUDA from its Rust definition.
pub trait KernelArgs: DeviceRepr + Copy {
    /// The struct's name, in Rust and in C.
    const NAME: &'static str;
    /// The C declaration of the struct, with an assertion of its size.
    fn declaration() -> String;
    /// Each field's name and offset, as Rust laid them out.
    fn offsets() -> Vec<(&'static str, usize)>;
}

/// The C declaration of a struct named `name`: `fields` as (name, C base type, array
/// declarator), `size` its size as Rust laid it out.
pub fn declare(name: &str, size: usize, fields: &[(&str, &str, String)]) -> String {
    let mut c = format!("struct {name} {{\n");
    for (field, base, dims) in fields {
        let _ = writeln!(c, "    {base} {field}{dims};");
    }
    c += "};\n";
    let _ = writeln!(
        c,
        "static_assert(sizeof({name}) == {size}, \"{name}: the Rust and CUDA layouts differ in size\");"
    );
    c
}

/// A kernel `probe(unsigned long long *out)` writing, one per field of `T`, where CUDA
/// placed it: to compare with [`KernelArgs::offsets`].
pub fn offsets_probe<T: KernelArgs>() -> String {
    let name = T::NAME;
    let mut c = T::declaration();
    let _ = writeln!(
        c,
        "extern \"C\" __global__ void probe(unsigned long long *out) {{\n    {name} g;\n    const char *base = (const char *)&g;"
    );
    for (ix, (field, _)) in T::offsets().iter().enumerate() {
        let _ = writeln!(
            c,
            "    out[{ix}] = (unsigned long long)((const char *)&g.{field} - base);"
        );
    }
    c += "}\n";
    c
}

/// Defines a kernel argument struct: `repr(C)`, plain old data, with its C declaration
/// ([`KernelArgs`]). Fields are integers, floats, or arrays of them.
#[macro_export]
#[doc(hidden)]
macro_rules! kernel_args {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        $vis struct $name {
            $($(#[$fmeta])* pub $field: $ty),*
        }

        // SAFETY: `repr(C)` plain old data (integers, floats, arrays of them), which the
        // kernels declare from `declaration()`: same fields, same order, and assertions
        // that the size and every offset are Rust's.
        unsafe impl $crate::cuda::abi::DeviceRepr for $name {}

        impl $crate::cuda::abi::KernelArgs for $name {
            const NAME: &'static str = stringify!($name);

            fn declaration() -> String {
                use $crate::cuda::abi::CType;
                $crate::cuda::abi::declare(
                    stringify!($name),
                    std::mem::size_of::<$name>(),
                    &[$((
                        stringify!($field),
                        <$ty as CType>::BASE,
                        <$ty as CType>::dims(),
                    )),*],
                )
            }

            fn offsets() -> Vec<(&'static str, usize)> {
                vec![$((stringify!($field), std::mem::offset_of!($name, $field))),*]
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::kernel_args! {
        struct Probe {
            a: u32,
            b: u64,
            c: [[i32; 3]; 2],
            d: f32,
        }
    }

    #[test]
    fn declarations_follow_the_rust_layout() {
        let c = Probe::declaration();
        assert!(
            c.contains("struct Probe {\n    unsigned a;\n    unsigned long long b;\n"),
            "{c}"
        );
        assert!(c.contains("    int c[2][3];\n    float d;\n};"), "{c}");
        // a at 0, b aligned to 8, c after b, d after c; the size rounded up to 8.
        assert!(c.contains("sizeof(Probe) == 48"), "{c}");
        assert_eq!(Probe::offsets(), [("a", 0), ("b", 8), ("c", 16), ("d", 40)]);
        let probe = offsets_probe::<Probe>();
        assert!(
            probe.contains("out[3] = (unsigned long long)((const char *)&g.d - base);"),
            "{probe}"
        );
    }
}
