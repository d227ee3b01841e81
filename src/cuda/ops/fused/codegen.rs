//! The C source of a fused chain's kernel, generated per variant: the merged rank of its
//! geometry and the class of each operand, both fixed for a plan.
//!
//! Knowing them when compiling turns the index arithmetic into what each operand needs
//! and nothing more. The kernels take their geometry by value ([`FusedGeometry`], and
//! [`FusedMaskGeom`] when they write a mask), declared from the Rust structs
//! ([`crate::cuda::abi`]).

use tract_core::internal::*;

use crate::cuda::abi::KernelArgs;
use crate::elementwise::{MAX_OPERANDS, Program};

/// The most axes a fused kernel addresses, after merging the axes it can.
pub const MAX_RANK: usize = 6;

crate::kernel_args! {
    /// What a fused kernel is told of the shapes: the output's extents, the elements under
    /// each axis, and each operand's strides in elements (0 along a broadcast axis).
    /// 32-bit: the op refuses larger tensors.
    pub struct FusedGeometry {
        dims: [u32; MAX_RANK],
        inner: [u32; MAX_RANK],
        strides: [[u32; MAX_RANK]; MAX_OPERANDS],
    }
}

crate::kernel_args! {
    /// A mask written by the kernel: each element's sample from the batch axis' stride and
    /// extent, its position along the ragged axis from that axis', its width from row
    /// `row` of the widths table; past it, `fill`.
    pub struct FusedMaskGeom {
        table_n: u32,
        batch_stride: u32,
        batch_dim: u32,
        ragged_stride: u32,
        ragged_dim: u32,
        row: i32,
        fill: f32,
    }
}

/// How an operand is read, which decides how much index arithmetic its load costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Laid out as the output: its offset is the output's index.
    Dense,
    /// One value for all: read once per thread.
    Scalar,
    /// Varies along one axis only (a per-channel scale): one division and one modulo.
    Axis(usize),
    /// Anything else (a transposed view): the coordinates on every axis.
    Strided,
}

impl Class {
    pub fn of(dims: &[usize], strides: &[isize]) -> Class {
        let moving: Vec<usize> = (0..dims.len()).filter(|d| strides[*d] != 0).collect();
        if moving.is_empty() {
            Class::Scalar
        } else if strides == &*Tensor::natural_strides(dims) {
            Class::Dense
        } else if moving.len() == 1 {
            Class::Axis(moving[0])
        } else {
            Class::Strided
        }
    }
}

/// A kernel of a fused chain is generated for the rank of its merged geometry and the
/// class of each operand: both are fixed for a plan, and knowing them when compiling
/// turns the index arithmetic into what each operand needs and nothing more.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub rank: usize,
    pub classes: TVec<Class>,
    /// Whether the kernel writes a mask ([`super::FusedMask`]).
    pub masked: bool,
}

impl Variant {
    pub fn of(dims: &[usize], strides: &[TVec<isize>], masked: bool) -> Variant {
        Variant {
            rank: dims.len(),
            classes: strides.iter().map(|s| Class::of(dims, s)).collect(),
            masked,
        }
    }
}

/// The kernel source of a program for a variant: one thread per output element
/// (grid-stride), each operand read once, the links in order, one write.
///
/// The index arithmetic is what the operands' classes need: none for a dense operand (its
/// offset is the output's index), none per element for a scalar (read once), one division
/// and one modulo for an operand along one axis, the coordinates on every axis only when
/// some operand is strided. 32-bit throughout (unsigned division is several times cheaper
/// than 64-bit): tensors of 2^31 elements and more are refused, as tract-cuda's own
/// element-wise kernels do not address them either. Computing every operand's offset from
/// all coordinates, in 64 bits, runs at a tenth of the memory bandwidth (measured on
/// PP-OCRv4 rec).
pub fn source(program: &Program, variant: &Variant) -> String {
    let k = program.operands;
    let rank = variant.rank;
    let params: String = (0..k)
        .map(|i| format!(", const float* __restrict__ p{i}"))
        .collect();
    let scalars: String = (0..k)
        .filter(|i| variant.classes[*i] == Class::Scalar)
        .map(|i| format!("    const float s{i} = p{i}[0];\n"))
        .collect();
    let any_strided = variant.classes.contains(&Class::Strided);
    let mut coords = String::new();
    if any_strided {
        coords += "        I rem = i;\n";
        for d in (0..rank).rev() {
            coords += &format!("        const I c{d} = rem % g.dims[{d}]; rem /= g.dims[{d}];\n");
        }
    } else {
        let mut axes: Vec<usize> = variant
            .classes
            .iter()
            .filter_map(|c| match c {
                Class::Axis(d) => Some(*d),
                _ => None,
            })
            .collect();
        axes.sort();
        axes.dedup();
        for d in axes {
            let c = match (d == 0, d + 1 == rank) {
                (true, true) => "i".to_string(),
                (true, false) => format!("i / g.inner[{d}]"),
                (false, true) => format!("i % g.dims[{d}]"),
                (false, false) => format!("(i / g.inner[{d}]) % g.dims[{d}]"),
            };
            coords += &format!("        const I c{d} = {c};\n");
        }
    }
    let loads: String = (0..k)
        .map(|i| {
            let value = match variant.classes[i] {
                Class::Dense => format!("p{i}[i]"),
                Class::Scalar => format!("s{i}"),
                Class::Axis(d) => format!("p{i}[c{d} * g.strides[{i}][{d}]]"),
                Class::Strided => {
                    let offset = (0..rank)
                        .map(|d| format!("c{d} * g.strides[{i}][{d}]"))
                        .collect::<Vec<_>>()
                        .join(" + ");
                    format!("p{i}[{offset}]")
                }
            };
            format!("        const float x{i} = {value};\n")
        })
        .collect();
    let links: String = program
        .links
        .iter()
        .enumerate()
        .map(|(j, l)| {
            format!(
                "        const float v{j} = {};\n",
                l.kind.c_expr(&l.a.to_string(), &l.b.to_string())
            )
        })
        .collect();
    let last = program.links.len() - 1;
    let (mask_params, write) = if variant.masked {
        (
            ", const long long* __restrict__ table, const FusedMaskGeom m",
            format!(
                "        const I mn = (i / m.batch_stride) % m.batch_dim;\n        const bool pad = (long long)((i / m.ragged_stride) % m.ragged_dim) >= table[m.row * m.table_n + mn];\n        out[i] = pad ? m.fill : v{last};\n"
            ),
        )
    } else {
        ("", format!("        out[i] = v{last};\n"))
    };
    let classes = format!("{:?}", variant.classes);
    let mut src = format!(
        "// {program}\n// rank {rank}, operands {classes}, masked {}\n",
        variant.masked
    );
    src += &FusedGeometry::declaration();
    if variant.masked {
        src += &FusedMaskGeom::declaration();
    }
    src += &format!(
        r#"
extern "C" __global__ void fused_elementwise(float* __restrict__ out{params}, const FusedGeometry g, unsigned int n{mask_params}) {{
    typedef unsigned int I;
{scalars}    for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {{
{coords}{loads}{links}{write}    }}
}}
"#
    );
    src
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elementwise::{Arg, BinKind, Link};

    #[test]
    fn source_reads_each_operand_once_and_chains_links() {
        let program = Program {
            operands: 2,
            links: vec![
                Link {
                    kind: BinKind::Add,
                    a: Arg::Operand(0),
                    b: Arg::Operand(1),
                },
                Link {
                    kind: BinKind::Max,
                    a: Arg::Value(0),
                    b: Arg::Operand(0),
                },
            ],
        };
        // A full operand and a per-channel one (along axis 1 of 3).
        let variant = Variant {
            rank: 3,
            classes: tvec![Class::Dense, Class::Axis(1)],
            masked: false,
        };
        let src = source(&program, &variant);
        assert!(src.contains("const float x0 = p0[i];"), "{src}");
        assert!(
            src.contains("const I c1 = (i / g.inner[1]) % g.dims[1];"),
            "{src}"
        );
        assert!(
            src.contains("const float x1 = p1[c1 * g.strides[1][1]];"),
            "{src}"
        );
        assert!(src.contains("const float v0 = x0 + x1;"));
        assert!(src.contains("const float v1 = fmaxf(v0, x0);"));
        assert!(src.contains("out[i] = v1;"));
        assert!(src.contains("void fused_elementwise("));
        assert!(
            !src.contains("rem"),
            "no full coordinates without a strided operand"
        );
        // A transposed operand needs every coordinate; a scalar is read once.
        let variant = Variant {
            rank: 2,
            classes: tvec![Class::Strided, Class::Scalar],
            masked: true,
        };
        let src = source(&program, &variant);
        assert!(src.contains("const I c0 = rem % g.dims[0];"), "{src}");
        assert!(
            src.contains("p0[c0 * g.strides[0][0] + c1 * g.strides[0][1]]"),
            "{src}"
        );
        assert!(src.contains("const float s1 = p1[0];"), "{src}");
        assert!(src.contains("const float x1 = s1;"), "{src}");
        // The mask writes the fill past the sample's width, the chain's value before.
        assert!(src.contains("out[i] = pad ? m.fill : v1;"), "{src}");
        assert!(src.contains("table[m.row * m.table_n + mn]"), "{src}");
        assert!(src.contains("struct FusedMaskGeom {"), "{src}");
    }

    #[test]
    fn operands_are_classed_by_their_strides() {
        let dims = [2, 3, 20];
        assert_eq!(Class::of(&dims, &[60, 20, 1]), Class::Dense);
        assert_eq!(Class::of(&dims, &[0, 0, 0]), Class::Scalar);
        assert_eq!(Class::of(&dims, &[0, 1, 0]), Class::Axis(1));
        assert_eq!(Class::of(&dims, &[3, 1, 0]), Class::Strided);
        assert_eq!(Class::of(&dims, &[1, 2, 6]), Class::Strided);
    }
}
