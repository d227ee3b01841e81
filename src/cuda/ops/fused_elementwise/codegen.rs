//! The C source of a fused chain's kernel, generated per variant: the merged rank of its
//! geometry and the class of each operand, both fixed for a plan.
//!
//! Knowing them when compiling turns the index arithmetic into what each operand needs
//! and nothing more. The kernels take their geometry by value ([`FusedGeometry`], and
//! [`FusedMaskGeom`] when they write a mask), declared from the Rust structs
//! ([`crate::cuda::abi`]).

use tract_core::internal::*;

use crate::cuda::abi::KernelArgs;
use crate::cuda::fastdiv::FastDiv;
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
        /// `dims` and `inner` as the kernel divides by them.
        dims_div: [FastDiv; MAX_RANK],
        inner_div: [FastDiv; MAX_RANK],
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
        /// The four extents above as the kernel divides by them.
        batch_stride_div: FastDiv,
        batch_dim_div: FastDiv,
        ragged_stride_div: FastDiv,
        ragged_dim_div: FastDiv,
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
    /// Whether a thread takes 4 consecutive elements, its dense operands and its output
    /// read and written as float4 ([`Variant::vectorizable`]).
    pub vector: bool,
    /// Whether the operands and the output are f16 (else f32): each link then rounds to
    /// f16, as tract-cuda's f16 kernels compute it.
    pub half: bool,
}

impl Variant {
    pub fn of(
        dims: &[usize],
        strides: &[TVec<isize>],
        masked: bool,
        vector: bool,
        half: bool,
    ) -> Variant {
        Variant {
            rank: dims.len(),
            classes: strides.iter().map(|s| Class::of(dims, s)).collect(),
            masked,
            vector,
            half,
        }
    }

    /// Whether a chain over `dims` (merged) with operands of `strides` can take 4
    /// elements a thread: the last axis a multiple of 4, so that 4 consecutive elements
    /// share every other coordinate, and no operand that varies along it other than a dense
    /// one (a dense operand is read as float4). A mask also needs the 4 in one sample and
    /// either at one position along the ragged axis or at 4 consecutive ones
    /// (`mask_strides`: the batch axis' and the ragged axis' strides in the output and
    /// the ragged axis' extent). The pointers' alignment is the caller's to check.
    pub fn vectorizable(
        dims: &[usize],
        strides: &[TVec<isize>],
        mask_strides: Option<(usize, usize, usize)>,
    ) -> bool {
        let Some(last) = dims.len().checked_sub(1) else {
            return false;
        };
        let classes_ok = strides.iter().all(|s| match Class::of(dims, s) {
            Class::Dense | Class::Scalar => true,
            Class::Axis(d) => d != last,
            Class::Strided => false,
        });
        let mask_ok = match mask_strides {
            None => true,
            Some((batch_stride, ragged_stride, ragged_dim)) => {
                batch_stride % 4 == 0
                    && (ragged_stride % 4 == 0 || (ragged_stride == 1 && ragged_dim % 4 == 0))
            }
        };
        dims[last].is_multiple_of(4) && classes_ok && mask_ok
    }
}

/// How a variant's kernel reads, computes and writes its elements: f32 as they are; f16
/// read into f32, each link's value rounded to f16 (what tract-cuda's f16 op gives: see
/// `round_f16` in kernels/common.cuh), written as f16. The f32 kernels' sources are
/// untouched by it.
struct Element {
    half: bool,
}

impl Element {
    fn ty(&self) -> &'static str {
        if self.half { "f16" } else { "float" }
    }

    fn vector_ty(&self) -> &'static str {
        if self.half { "f16x4" } else { "float4" }
    }

    fn load(&self, value: String) -> String {
        if self.half {
            format!("to_f32({value})")
        } else {
            value
        }
    }

    fn link(&self, value: String) -> String {
        if self.half {
            format!("round_f16({value})")
        } else {
            value
        }
    }

    fn store(&self, value: &str) -> String {
        if self.half {
            format!("from_f32<f16>({value})")
        } else {
            value.to_string()
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
    let el = Element { half: variant.half };
    let scalars: String = (0..k)
        .filter(|i| variant.classes[*i] == Class::Scalar)
        .map(|i| format!("    const float s{i} = {};\n", el.load(format!("p{i}[0]"))))
        .collect();
    let any_strided = variant.classes.contains(&Class::Strided);
    let mut coords = String::new();
    if any_strided {
        coords += "        I rem = i;\n";
        for d in (0..rank).rev() {
            coords += &format!(
                "        const I q{d} = fast_div(rem, g.dims_div[{d}]); const I c{d} = rem - q{d} * g.dims[{d}]; rem = q{d};\n"
            );
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
                (true, false) => format!("fast_div(i, g.inner_div[{d}])"),
                (false, true) => format!("fast_mod(i, g.dims[{d}], g.dims_div[{d}])"),
                (false, false) => {
                    format!("fast_mod(fast_div(i, g.inner_div[{d}]), g.dims[{d}], g.dims_div[{d}])")
                }
            };
            coords += &format!("        const I c{d} = {c};\n");
        }
    }
    if variant.vector {
        return vector_source(program, variant, &el, &scalars, &coords);
    }
    let loads: String = (0..k)
        .map(|i| {
            let value = match variant.classes[i] {
                Class::Dense => el.load(format!("p{i}[i]")),
                Class::Scalar => format!("s{i}"),
                Class::Axis(d) => el.load(format!("p{i}[c{d} * g.strides[{i}][{d}]]")),
                Class::Strided => {
                    let offset = (0..rank)
                        .map(|d| format!("c{d} * g.strides[{i}][{d}]"))
                        .collect::<Vec<_>>()
                        .join(" + ");
                    el.load(format!("p{i}[{offset}]"))
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
                el.link(l.kind.c_expr(&l.a.to_string(), &l.b.to_string()))
            )
        })
        .collect();
    let last = program.links.len() - 1;
    let value = el.store(&format!("v{last}"));
    let write = if variant.masked {
        format!(
            "{MASK_POSITION}        const bool pad = (long long)at >= table[m.row * m.table_n + mn];\n        out[i] = pad ? {} : {value};\n",
            el.store("m.fill")
        )
    } else {
        format!("        out[i] = {value};\n")
    };
    kernel(
        program,
        variant,
        &el,
        &scalars,
        &format!(
            "    for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {{\n{coords}{loads}{links}{write}    }}\n"
        ),
    )
}

/// A masked kernel's element `i`: its sample `mn` and its position `at` along the ragged
/// axis.
const MASK_POSITION: &str = "        const I mn = fast_mod(fast_div(i, m.batch_stride_div), m.batch_dim, m.batch_dim_div);\n        const I at = fast_mod(fast_div(i, m.ragged_stride_div), m.ragged_dim, m.ragged_dim_div);\n";

/// The source of a fused kernel around `body`, its loop over elements: the shared
/// helpers, the argument structs, the signature (the output, one pointer per operand, the
/// geometry, the element count, and a masked kernel's widths table and mask geometry),
/// the scalars read once.
fn kernel(program: &Program, variant: &Variant, el: &Element, scalars: &str, body: &str) -> String {
    let ty = el.ty();
    let params: String = (0..program.operands)
        .map(|i| format!(", const {ty}* __restrict__ p{i}"))
        .collect();
    let mask_params = if variant.masked {
        ", const long long* __restrict__ table, const FusedMaskGeom m"
    } else {
        ""
    };
    let mut src = format!(
        "// {program}\n// rank {}, operands {:?}, masked {}{}{}\n",
        variant.rank,
        variant.classes,
        variant.masked,
        if variant.vector {
            ", 4 elements a thread"
        } else {
            ""
        },
        if variant.half { ", f16" } else { "" }
    );
    src += crate::cuda::nvrtc::COMMON;
    src += &FusedGeometry::declaration();
    if variant.masked {
        src += &FusedMaskGeom::declaration();
    }
    src += &format!(
        r#"
extern "C" __global__ void fused_elementwise({ty}* __restrict__ out{params}, const FusedGeometry g, unsigned int n{mask_params}) {{
    typedef unsigned int I;
{scalars}{body}}}
"#
    );
    src
}

/// The kernel of a [`Variant::vector`] variant: a thread takes the 4 consecutive elements
/// from `i = 4 v` on, their coordinates but the last shared (`coords`, of `i`), its dense
/// operands read as float4, the others once; the links written out per element, in the
/// same order as the scalar kernel, so every element is computed as it is there; one
/// float4 write.
fn vector_source(
    program: &Program,
    variant: &Variant,
    el: &Element,
    scalars: &str,
    coords: &str,
) -> String {
    let k = program.operands;
    let vty = el.vector_ty();
    let mut body = String::new();
    for i in 0..k {
        body += &match variant.classes[i] {
            Class::Dense => {
                format!("        const {vty} w{i} = reinterpret_cast<const {vty}*>(p{i})[v];\n")
            }
            Class::Scalar => String::new(),
            Class::Axis(d) => {
                format!(
                    "        const float a{i} = {};\n",
                    el.load(format!("p{i}[c{d} * g.strides[{i}][{d}]]"))
                )
            }
            // Never vectorizable: a compilation error, not wrong values.
            Class::Strided => {
                format!("#error \"operand {i} is strided: not 4 elements a thread\"\n")
            }
        };
    }
    let lanes = ["x", "y", "z", "w"];
    let last = program.links.len() - 1;
    if variant.masked {
        body += MASK_POSITION;
        body += "        const long long width = table[m.row * m.table_n + mn];\n";
        // The 4 share a position, or (the ragged axis innermost) take 4 consecutive ones.
        body += "        const I step = m.ragged_stride == 1 ? 1u : 0u;\n";
    }
    body += &format!("        {vty} r;\n");
    for (e, lane) in lanes.iter().enumerate() {
        for i in 0..k {
            let value = match variant.classes[i] {
                Class::Dense => el.load(format!("w{i}.{lane}")),
                Class::Scalar => format!("s{i}"),
                _ => format!("a{i}"),
            };
            body += &format!("        const float x{i}_{e} = {value};\n");
        }
        for (j, l) in program.links.iter().enumerate() {
            body += &format!(
                "        const float v{j}_{e} = {};\n",
                el.link(
                    l.kind
                        .c_expr(&format!("{}_{e}", l.a), &format!("{}_{e}", l.b))
                )
            );
        }
        let value = el.store(&format!("v{last}_{e}"));
        body += &if variant.masked {
            format!(
                "        r.{lane} = (long long)(at + {e}u * step) >= width ? {} : {value};\n",
                el.store("m.fill")
            )
        } else {
            format!("        r.{lane} = {value};\n")
        };
    }
    body += &format!("        reinterpret_cast<{vty}*>(out)[v] = r;\n");
    kernel(
        program,
        variant,
        el,
        scalars,
        &format!(
            "    for (I v = blockIdx.x * blockDim.x + threadIdx.x; v < n / 4; v += gridDim.x * blockDim.x) {{\n        const I i = v * 4;\n{coords}{body}    }}\n"
        ),
    )
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
            vector: false,
            half: false,
        };
        let src = source(&program, &variant);
        assert!(src.contains("const float x0 = p0[i];"), "{src}");
        assert!(
            src.contains(
                "const I c1 = fast_mod(fast_div(i, g.inner_div[1]), g.dims[1], g.dims_div[1]);"
            ),
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
            vector: false,
            half: false,
        };
        let src = source(&program, &variant);
        assert!(src.contains("const I c0 = rem - q0 * g.dims[0];"), "{src}");
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
    fn four_elements_a_thread_read_dense_operands_as_float4() {
        let program = Program {
            operands: 2,
            links: vec![Link {
                kind: BinKind::Add,
                a: Arg::Operand(0),
                b: Arg::Operand(1),
            }],
        };
        let variant = Variant {
            rank: 3,
            classes: tvec![Class::Dense, Class::Axis(1)],
            masked: true,
            vector: true,
            half: false,
        };
        let src = source(&program, &variant);
        assert!(
            src.contains("const float4 w0 = reinterpret_cast<const float4*>(p0)[v];"),
            "{src}"
        );
        assert!(
            src.contains("const float a1 = p1[c1 * g.strides[1][1]];"),
            "{src}"
        );
        for (e, lane) in ["x", "y", "z", "w"].iter().enumerate() {
            assert!(
                src.contains(&format!("const float x0_{e} = w0.{lane};")),
                "{src}"
            );
            assert!(
                src.contains(&format!("const float v0_{e} = x0_{e} + x1_{e};")),
                "{src}"
            );
            assert!(
                src.contains(&format!(
                    "r.{lane} = (long long)(at + {e}u * step) >= width ? m.fill : v0_{e};"
                )),
                "{src}"
            );
        }
        assert!(
            src.contains("reinterpret_cast<float4*>(out)[v] = r;"),
            "{src}"
        );
        assert!(src.contains("v < n / 4"), "{src}");
    }

    #[test]
    fn f16_chains_read_into_f32_round_each_link_and_write_f16() {
        let program = Program {
            operands: 2,
            links: vec![
                Link {
                    kind: BinKind::Mul,
                    a: Arg::Operand(0),
                    b: Arg::Operand(1),
                },
                Link {
                    kind: BinKind::Add,
                    a: Arg::Value(0),
                    b: Arg::Operand(0),
                },
            ],
        };
        let scalar = Variant {
            rank: 2,
            classes: tvec![Class::Dense, Class::Scalar],
            masked: true,
            vector: false,
            half: true,
        };
        let src = source(&program, &scalar);
        assert!(
            src.contains(
                "void fused_elementwise(f16* __restrict__ out, const f16* __restrict__ p0"
            ),
            "{src}"
        );
        assert!(src.contains("const float s1 = to_f32(p1[0]);"), "{src}");
        assert!(src.contains("const float x0 = to_f32(p0[i]);"), "{src}");
        assert!(
            src.contains("const float v0 = round_f16(x0 * x1);"),
            "{src}"
        );
        assert!(
            src.contains("const float v1 = round_f16(v0 + x0);"),
            "{src}"
        );
        assert!(
            src.contains("out[i] = pad ? from_f32<f16>(m.fill) : from_f32<f16>(v1);"),
            "{src}"
        );
        let vector = Variant {
            vector: true,
            ..scalar.clone()
        };
        let src = source(&program, &vector);
        assert!(
            src.contains("const f16x4 w0 = reinterpret_cast<const f16x4*>(p0)[v];"),
            "{src}"
        );
        assert!(src.contains("const float x0_2 = to_f32(w0.z);"), "{src}");
        assert!(
            src.contains("reinterpret_cast<f16x4*>(out)[v] = r;"),
            "{src}"
        );
        // f32 and f16, scalar and 4 a thread, masked or not, along an axis or strided:
        // each compiles as the plan would compile it.
        if !crate::cuda::nvrtc::nvrtc_for_tests() {
            return;
        }
        for half in [false, true] {
            for (classes, vector) in [
                (tvec![Class::Dense, Class::Scalar], true),
                (tvec![Class::Dense, Class::Axis(1)], true),
                (tvec![Class::Strided, Class::Axis(0)], false),
            ] {
                for masked in [false, true] {
                    let variant = Variant {
                        rank: 2,
                        classes: classes.clone(),
                        masked,
                        vector,
                        half,
                    };
                    let src = source(&program, &variant);
                    crate::cuda::nvrtc::compile_for_tests("fused", &src, true)
                        .unwrap_or_else(|e| panic!("{variant:?}: {e:#}\n{src}"));
                }
            }
        }
    }

    #[test]
    fn chains_take_four_elements_only_where_the_four_share_their_coordinates() {
        let dense = |dims: &[usize]| -> TVec<isize> { Tensor::natural_strides(dims) };
        let dims = [2, 3, 8];
        // Dense and per-channel operands, last axis a multiple of 4.
        assert!(Variant::vectorizable(
            &dims,
            &[dense(&dims), tvec![0, 1, 0]],
            None
        ));
        // An operand along the last axis, or a last axis of 6, or a transposed operand.
        assert!(!Variant::vectorizable(
            &dims,
            &[dense(&dims), tvec![0, 0, 1]],
            None
        ));
        assert!(!Variant::vectorizable(&[2, 6], &[dense(&[2, 6])], None));
        assert!(!Variant::vectorizable(&[4, 4], &[tvec![1, 4]], None));
        // Masks: the ragged axis innermost (4 consecutive positions) or outer (one).
        assert!(Variant::vectorizable(
            &dims,
            &[dense(&dims)],
            Some((24, 1, 8))
        ));
        assert!(Variant::vectorizable(
            &dims,
            &[dense(&dims)],
            Some((24, 8, 3))
        ));
        assert!(!Variant::vectorizable(
            &dims,
            &[dense(&dims)],
            Some((24, 2, 4))
        ));
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
