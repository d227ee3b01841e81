//! Kernel arguments passed by value: each struct is defined once, in Rust, and declared
//! to CUDA from that definition.
//!
//! A kernel taking a struct by value reads it with the layout its C declaration gives,
//! while the host writes it with Rust's. Written twice by hand, the two drift apart
//! silently (a field added on one side shifts every field after it). So
//! [`kernel_args!`](crate::kernel_args) defines the `repr(C)` struct and its
//! [`KernelArgs::declaration`]: the C declaration, generated from the same field list,
//! followed by `static_assert`s of its size and of every field's offset as Rust computed
//! them. The kernel sources include the generated declarations (`#include "args.cuh"`,
//! replaced when a kernel file is compiled: [`super::kernels`]); a layout that differs
//! fails the kernel's compilation, naming the struct.

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
    /// The C declaration of the struct, with assertions of its size and field offsets.
    fn declaration() -> String;
}

/// The C declaration of a struct named `name`: `fields` as (name, C base type, array
/// declarator, offset), `size` its size, as Rust laid it out.
pub fn declare(name: &str, size: usize, fields: &[(&str, &str, String, usize)]) -> String {
    let mut c = format!("struct {name} {{\n");
    for (field, base, dims, _) in fields {
        let _ = writeln!(c, "    {base} {field}{dims};");
    }
    c += "};\n";
    let _ = writeln!(
        c,
        "static_assert(sizeof({name}) == {size}, \"{name}: the Rust and CUDA layouts differ in size\");"
    );
    for (field, _, _, offset) in fields {
        let _ = writeln!(
            c,
            "static_assert(__builtin_offsetof({name}, {field}) == {offset}, \"{name}.{field}: the Rust and CUDA layouts differ\");"
        );
    }
    c
}

/// Defines a kernel argument struct: `repr(C)`, plain old data, with its C declaration
/// ([`KernelArgs`]). Fields are integers, floats, or arrays of them.
#[macro_export]
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
            fn declaration() -> String {
                use $crate::cuda::abi::CType;
                $crate::cuda::abi::declare(
                    stringify!($name),
                    std::mem::size_of::<$name>(),
                    &[$((
                        stringify!($field),
                        <$ty as CType>::BASE,
                        <$ty as CType>::dims(),
                        std::mem::offset_of!($name, $field),
                    )),*],
                )
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
        assert!(c.contains("__builtin_offsetof(Probe, b) == 8"), "{c}");
        assert!(c.contains("__builtin_offsetof(Probe, c) == 16"), "{c}");
        assert!(c.contains("__builtin_offsetof(Probe, d) == 40"), "{c}");
    }
}
