//! A fused chain on the host: a [`Program`] run in one pass over its output.
//!
//! tract's CPU runtime fuses element-wise ops only along a line (`OptBinChain`): a value
//! read twice, as hard-swish reads its input, ends the line, and each line reads and
//! writes the whole activation. A program here reads each operand once and writes its
//! output once, whatever the shape of the chain.
//!
//! The output is walked in **rows**: the longest run of trailing axes along which each
//! operand is either read whole (its extents are the output's there) or not at all
//! (broadcast along all of them: a per-channel scale of an NCHW activation, a scalar).
//! Within a row an operand is then a contiguous slice or one value, so each link is a
//! plain loop over a block of floats, which the compiler vectorises, and the links'
//! values stay in buffers small enough for the L1 cache.
//!
//! Where the CPU has AVX, a program is first compiled into [`Step`]s for a register
//! interpreter: blocks of eight vectors, the last link's value held in eight vector
//! registers (the **accumulator**) from one link to the next, only the values read again
//! later saved to memory. Link by link over blocks in memory, a chain cost three cycles a
//! vector a link (the interpretation and the loads and stores between links), six times
//! its arithmetic. The interpreter is one macro instantiated for 256-bit vectors (AVX) and
//! for 512-bit ones (AVX-512F), taken where the CPU has two 512-bit FMA units (AMD Zen 5:
//! PP-OCRv4 rec's chains 1.6x faster than in 256-bit vectors; benches/NOTES.md).
//!
//! Rows, cut into pieces of at most 256 blocks, are spread over the threads tract's
//! executor lends the run (a batch with cores to itself, `schedule::lanes`); each element
//! is computed alike on any thread.
//!
//! The contract is [`Program::eval`]'s: each element of each link is [`BinKind::apply`]
//! of its two arguments, in the program's order, rounded to f32; so the same bits as the
//! reference evaluation and as tract's ops one by one (tests/it/elementwise.rs).

use tract_core::internal::*;

use super::{Arg, BinKind, HostNodes, Program, fuse_chains};

/// How many elements of a row each link computes at a time: its values stay in the L1
/// cache (a chain of 16 links holds 16 KiB) while the loop is long enough to vectorise.
const BLOCK: usize = 256;

/// A fused chain on the host (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedElementwise {
    pub program: Program,
}

impl Op for FusedElementwise {
    fn name(&self) -> StaticName {
        "FusedElementwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![self.program.to_string()])
    }

    op_as_typed_op!();
}

impl EvalOp for FusedElementwise {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        Ok(tvec!(run(&self.program, inputs)?.into_tvalue()))
    }
}

impl TypedOp for FusedElementwise {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let shapes: Vec<&[TDim]> = inputs.iter().map(|f| &*f.shape).collect();
        let shape = tract_core::broadcast::multi_broadcast(&shapes)
            .context("fused element-wise: operands do not broadcast")?;
        Ok(tvec!(f32::fact(shape)))
    }

    as_op!();
}

/// Fuses the chains of a model on tract's CPU runtime into [`FusedElementwise`] nodes.
/// Returns how many chains were fused.
pub fn fuse_host(model: &mut TypedModel) -> TractResult<usize> {
    let fused = fuse_chains(model, &HostNodes, &|_, program, _, _| {
        Ok(Box::new(FusedElementwise {
            program: program.clone(),
        }))
    })?;
    model.compact()?;
    Ok(fused)
}

/// How an operand is read along a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    /// A contiguous slice of the row's length.
    Whole,
    /// One value for the whole row.
    Broadcast,
}

/// Where each operand's row starts, row after row: the outer axes (those before the
/// row's) and each operand's strides along them (0 where it is broadcast).
struct Rows {
    outer: Vec<usize>,
    strides: Vec<Vec<usize>>,
    reads: Vec<Read>,
    len: usize,
}

impl Rows {
    fn new(shape: &[usize], operands: &[&[usize]]) -> Rows {
        let rank = shape.len();
        // Each operand's extents aligned to the output's axes (broadcasting's rule: the
        // trailing axes match, missing leading ones are 1).
        let aligned: Vec<Vec<usize>> = operands
            .iter()
            .map(|s| {
                let mut a = vec![1; rank - s.len()];
                a.extend_from_slice(s);
                a
            })
            .collect();
        let mut reads: Vec<Option<Read>> = vec![None; operands.len()];
        let mut first = rank;
        while first > 0 {
            let axis = first - 1;
            if shape[axis] != 1 {
                let here: Vec<Read> = aligned
                    .iter()
                    .map(|a| {
                        if a[axis] == shape[axis] {
                            Read::Whole
                        } else {
                            Read::Broadcast
                        }
                    })
                    .collect();
                if reads
                    .iter()
                    .zip(&here)
                    .any(|(r, h)| r.is_some_and(|r| r != *h))
                {
                    break;
                }
                for (r, h) in reads.iter_mut().zip(here) {
                    *r = Some(h);
                }
            }
            first -= 1;
        }
        let strides = aligned
            .iter()
            .map(|a| {
                // Row-major strides of the operand, 0 along the axes it is broadcast on.
                let mut strides = vec![0; first];
                let mut stride: usize = a[first..].iter().product();
                for axis in (0..first).rev() {
                    if a[axis] == shape[axis] && a[axis] != 1 {
                        strides[axis] = stride;
                    }
                    stride *= a[axis];
                }
                strides
            })
            .collect();
        Rows {
            outer: shape[..first].to_vec(),
            strides,
            // An operand no axis of the row decides (all of extent 1) is one value a row.
            reads: reads
                .into_iter()
                .map(|r| r.unwrap_or(Read::Broadcast))
                .collect(),
            len: shape[first..].iter().product(),
        }
    }

    fn count(&self) -> usize {
        self.outer.iter().product()
    }

    /// Where `operand`'s part of row `row` starts.
    fn start(&self, operand: usize, mut row: usize) -> usize {
        let mut offset = 0;
        for (axis, extent) in self.outer.iter().enumerate().rev() {
            offset += (row % extent) * self.strides[operand][axis];
            row /= extent;
        }
        offset
    }
}

/// What a link reads over a block: a slice of the block's length, or one value.
#[derive(Clone, Copy)]
enum Src<'a> {
    Slice(&'a [f32]),
    Value(f32),
}

/// `out[i] = f(a[i], b[i])` over a block: one loop per case, for the compiler to
/// vectorise.
#[inline(always)]
fn apply_with(f: impl Fn(f32, f32) -> f32, a: Src, b: Src, out: &mut [f32]) {
    match (a, b) {
        (Src::Slice(a), Src::Slice(b)) => {
            for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
                *o = f(*a, *b);
            }
        }
        (Src::Slice(a), Src::Value(b)) => {
            for (o, a) in out.iter_mut().zip(a) {
                *o = f(*a, b);
            }
        }
        (Src::Value(a), Src::Slice(b)) => {
            for (o, b) in out.iter_mut().zip(b) {
                *o = f(a, *b);
            }
        }
        (Src::Value(a), Src::Value(b)) => out.fill(f(a, b)),
    }
}

/// One link over a block, as [`BinKind::apply`] computes each element.
#[inline(always)]
fn apply(kind: BinKind, a: Src, b: Src, out: &mut [f32]) {
    match kind {
        BinKind::Add => apply_with(|a, b| a + b, a, b, out),
        BinKind::Sub => apply_with(|a, b| a - b, a, b, out),
        BinKind::Mul => apply_with(|a, b| a * b, a, b, out),
        BinKind::Div => apply_with(|a, b| a / b, a, b, out),
        BinKind::Min => apply_with(|a: f32, b: f32| a.min(b), a, b, out),
        BinKind::Max => apply_with(|a: f32, b: f32| a.max(b), a, b, out),
    }
}

/// Runs `program` on `inputs` (its operands, f32, broadcasting as tract does), in rows
/// (module doc). The output takes the buffer of an operand of its shape that nothing
/// else holds, as tract's own element-wise ops do: no new memory to allocate and fault
/// in, which costs more than the arithmetic.
pub(crate) fn run(program: &Program, inputs: TVec<TValue>) -> TractResult<Tensor> {
    run_in(program, inputs, Way::best())
}

/// How a program is run: link by link over blocks in memory, or in the register
/// interpreter in 256-bit (AVX) or 512-bit (`wide`, AVX-512F) vectors. All give the same
/// bits (the tests run each the CPU has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Blocks,
    Registers { wide: bool },
}

impl Way {
    /// The register interpreter where the CPU has AVX, in 512-bit vectors where it has
    /// two 512-bit FMA units (tract-linalg's probe; on one, as on Zen 4, they run at the
    /// 256-bit ones' rate).
    fn best() -> Way {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            let wide = std::arch::is_x86_feature_detected!("avx512f")
                && tract_linalg::x86_64::fma_width::has_dual_avx512_fma();
            return Way::Registers { wide };
        }
        Way::Blocks
    }
}

/// [`run`], the way `way` says (the CPU must have its instructions).
fn run_in(program: &Program, inputs: TVec<TValue>, way: Way) -> TractResult<Tensor> {
    ensure!(
        inputs.len() == program.operands,
        "fused element-wise: {} operands for a program of {}",
        inputs.len(),
        program.operands
    );
    ensure!(
        !program.links.is_empty(),
        "fused element-wise: an empty program"
    );
    for (i, t) in inputs.iter().enumerate() {
        ensure!(
            t.datum_type() == f32::datum_type(),
            "fused element-wise: operand {i} is {:?}, not f32",
            t.datum_type()
        );
    }
    let shapes: Vec<TVec<usize>> = inputs.iter().map(|t| t.shape().into()).collect();
    let shape = tract_core::broadcast::multi_broadcast(&shapes)
        .context("fused element-wise: operands do not broadcast")?;
    let rows = Rows::new(
        &shape,
        &shapes.iter().map(|s| &**s).collect::<Vec<&[usize]>>(),
    );
    let reused = (0..inputs.len()).find(|&i| *shapes[i] == *shape && inputs[i].is_exclusive());
    let mut inputs: Vec<Option<TValue>> = inputs.into_iter().map(Some).collect();
    let mut output = match reused.and_then(|i| inputs[i].take()) {
        Some(t) => t.into_tensor(),
        // SAFETY: f32 has no invalid bit patterns, and every element is written below:
        // the rows cover the output, and each block of a row is copied in once computed.
        None => unsafe { Tensor::uninitialized::<f32>(&shape)? },
    };
    let out = output.as_ptr_mut::<f32>()?;
    let data = inputs
        .iter()
        .map(|t| match t {
            Some(t) => t.as_ptr::<f32>(),
            None => Ok(out as *const f32),
        })
        .collect::<TractResult<Vec<*const f32>>>()?;
    #[cfg(target_arch = "x86_64")]
    if let Way::Registers { wide } = way {
        ensure!(
            std::arch::is_x86_feature_detected!("avx")
                && (!wide || std::arch::is_x86_feature_detected!("avx512f")),
            "fused element-wise: {way:?} on a CPU without its instructions"
        );
        let (steps, slots) = compile(program);
        let piece = if wide { avx512::PIECE } else { avx::PIECE };
        // Pieces of rows across the threads tract's executor lends this run (none on a
        // lane of its own): each element is its own, whichever thread computes it.
        let units = rows.count() * rows.len.div_ceil(piece).max(1);
        let mut pieces = vec![(); units];
        let shared = Pointers { data: &data, out };
        tract_linalg::multithread::par_chunks_mut(
            &mut pieces,
            1,
            rows.count() * rows.len,
            |first, chunk| {
                let shared = &shared;
                let pieces = first..first + chunk.len();
                // SAFETY: the CPU supports AVX (and AVX-512F where `wide`); the pointers
                // are the operands' and the output's data, of the shapes `rows` was made
                // from; the pieces of different calls are different elements of the output.
                unsafe {
                    if wide {
                        avx512::run(&steps, slots, &rows, shared.data, shared.out, pieces)
                    } else {
                        avx::run(&steps, slots, &rows, shared.data, shared.out, pieces)
                    }
                };
                Ok(())
            },
        )?;
        return Ok(output);
    }
    let mut values = vec![[0f32; BLOCK]; program.links.len()];
    let result = program.links.len() - 1;
    let mut starts = vec![0; data.len()];
    for row in 0..rows.count() {
        for (operand, start) in starts.iter_mut().enumerate() {
            *start = rows.start(operand, row);
        }
        let mut at = 0;
        while at < rows.len {
            let n = BLOCK.min(rows.len - at);
            for (k, link) in program.links.iter().enumerate() {
                let (done, rest) = values.split_at_mut(k);
                let src = |arg: Arg| match arg {
                    // SAFETY: an operand's rows lie within it (`Rows`), and this block
                    // within its row; the slice lives only during this link, before the
                    // block is copied into the output (which may be this operand).
                    Arg::Operand(i) => unsafe {
                        match rows.reads[i] {
                            Read::Whole => Src::Slice(std::slice::from_raw_parts(
                                data[i].add(starts[i] + at),
                                n,
                            )),
                            Read::Broadcast => Src::Value(*data[i].add(starts[i])),
                        }
                    },
                    Arg::Value(v) => Src::Slice(&done[v][..n]),
                };
                apply(link.kind, src(link.a), src(link.b), &mut rest[0][..n]);
            }
            // SAFETY: the block lies within the output (its rows cover it, in order);
            // every read of this block's operands is done, and no later block reads it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    values[result].as_ptr(),
                    out.add(row * rows.len + at),
                    n,
                )
            };
            at += n;
        }
    }
    Ok(output)
}

/// The operands' and the output's data, shared by the threads that compute pieces of
/// the output: each piece reads its own elements of the operands (or one broadcast value)
/// and writes its own elements of the output.
struct Pointers<'a> {
    data: &'a [*const f32],
    out: *mut f32,
}

// SAFETY: the threads read the operands, and write disjoint pieces of the output, each
// reading an operand that is the output's buffer only at the elements it writes.
unsafe impl Send for Pointers<'_> {}
// SAFETY: as above.
unsafe impl Sync for Pointers<'_> {}

/// Where a step reads: an operand of the fused node, or a saved value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepSrc {
    Operand(usize),
    Slot(usize),
}

/// One instruction of the register interpreter (module doc), on the accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// `acc = src`.
    Load(StepSrc),
    /// `acc = kind(acc, src)`.
    Op(BinKind, StepSrc),
    /// `acc = kind(src, acc)`.
    RevOp(BinKind, StepSrc),
    /// `acc = kind(acc, acc)`.
    Square(BinKind),
    /// `slot = acc`.
    Save(usize),
}

/// The steps of `program` and how many slots they save values to. A link's value is
/// in the accumulator for the next link; it is saved only where a later link reads it.
fn compile(program: &Program) -> (Vec<Step>, usize) {
    let links = &program.links;
    let reads = |l: &super::Link, v: usize| l.a == Arg::Value(v) || l.b == Arg::Value(v);
    let mut slot_of = vec![None; links.len()];
    let mut slots = 0;
    for (k, slot) in slot_of.iter_mut().enumerate() {
        if links.iter().skip(k + 2).any(|l| reads(l, k)) {
            *slot = Some(slots);
            slots += 1;
        }
    }
    // What link `j` reads as `arg`: the accumulator (None) or a source.
    let source = |j: usize, arg: Arg| -> Option<StepSrc> {
        match arg {
            Arg::Operand(i) => Some(StepSrc::Operand(i)),
            Arg::Value(v) if v + 1 == j => None,
            // A value two links back or more: saved (`slot_of`), since link `j` reads it.
            Arg::Value(v) => Some(StepSrc::Slot(slot_of[v].unwrap_or_default())),
        }
    };
    let mut steps = vec![];
    for (j, link) in links.iter().enumerate() {
        match (source(j, link.a), source(j, link.b)) {
            (None, None) => steps.push(Step::Square(link.kind)),
            (None, Some(b)) => steps.push(Step::Op(link.kind, b)),
            (Some(a), None) => steps.push(Step::RevOp(link.kind, a)),
            (Some(a), Some(b)) => steps.extend([Step::Load(a), Step::Op(link.kind, b)]),
        }
        if let Some(slot) = slot_of[j] {
            steps.push(Step::Save(slot));
        }
    }
    (steps, slots)
}

/// `acc[i] = f(acc[i], b[i])` (or `f(b[i], acc[i])` reversed) over a block of the
/// register interpreter: a macro, so that each operation is inlined into the block's loop
/// (as functions, LLVM left them calls, and chains took 1.7x their time).
#[cfg(target_arch = "x86_64")]
macro_rules! interpreter_lanes {
    ($acc:ident, $fetch:expr, $rev:expr, $w:literal, $load:path, $f:expr) => {{
        let f = $f;
        match ($fetch, $rev) {
            (Fetch::Ptr(p), false) => {
                for (i, a) in $acc.iter_mut().enumerate() {
                    *a = f(*a, $load(p.add($w * i)));
                }
            }
            (Fetch::Ptr(p), true) => {
                for (i, a) in $acc.iter_mut().enumerate() {
                    *a = f($load(p.add($w * i)), *a);
                }
            }
            (Fetch::Splat(b), false) => {
                for a in $acc.iter_mut() {
                    *a = f(*a, b);
                }
            }
            (Fetch::Splat(b), true) => {
                for a in $acc.iter_mut() {
                    *a = f(b, *a);
                }
            }
        }
    }};
}

/// One link's operation over a block of the register interpreter.
#[cfg(target_arch = "x86_64")]
macro_rules! interpreter_binary {
    (
        $kind:expr, $acc:ident, $fetch:expr, $rev:expr, $w:literal, $load:path,
        $add:path, $sub:path, $mul:path, $div:path, $min:path, $max:path
    ) => {
        match $kind {
            BinKind::Add => interpreter_lanes!($acc, $fetch, $rev, $w, $load, |a, b| $add(a, b)),
            BinKind::Sub => interpreter_lanes!($acc, $fetch, $rev, $w, $load, |a, b| $sub(a, b)),
            BinKind::Mul => interpreter_lanes!($acc, $fetch, $rev, $w, $load, |a, b| $mul(a, b)),
            BinKind::Div => interpreter_lanes!($acc, $fetch, $rev, $w, $load, |a, b| $div(a, b)),
            BinKind::Min => interpreter_lanes!($acc, $fetch, $rev, $w, $load, |a, b| $min(a, b)),
            BinKind::Max => interpreter_lanes!($acc, $fetch, $rev, $w, $load, |a, b| $max(a, b)),
        }
    };
}

/// The register interpreter (module doc) for one width of vectors: `$v` of `$w` floats,
/// under `$feature`, with its intrinsics. Each link is one vector operation lane by lane,
/// as [`BinKind::apply`] computes it, so the same bits at either width.
#[cfg(target_arch = "x86_64")]
macro_rules! interpreter {
    (
        $(#[$doc:meta])* mod $name:ident: $feature:literal, $v:ty, $w:literal,
        zero $zero:path, load $load:path, store $store:path, splat $splat:path,
        add $add:path, sub $sub:path, mul $mul:path, div $div:path,
        min $min:path, max $max:path $(,)?
    ) => {
        $(#[$doc])*
        mod $name {
            use std::arch::x86_64::*;

            use super::{BinKind, Read, Rows, Step, StepSrc};

            /// Vectors in a block: the accumulator's registers.
            const V: usize = 8;
            /// Floats in a block.
            const LEN: usize = V * $w;

            /// What a step reads, or an operand along the current row: vectors from
            /// memory, or one value in every lane.
            #[derive(Clone, Copy)]
            enum Fetch {
                Ptr(*const f32),
                Splat($v),
            }

            /// The steps over one block of `LEN` floats: operands from `row` at `at`, the
            /// result stored at `out`.
            ///
            /// # Safety
            /// The CPU has the feature; each `Fetch::Ptr` holds `at + LEN` floats, `out`
            /// `LEN`, and `slots` one block per slot the steps use.
            #[target_feature(enable = $feature)]
            unsafe fn block(
                steps: &[Step],
                row: &[Fetch],
                at: usize,
                slots: &mut [[$v; V]],
                out: *mut f32,
            ) {
                let fetch = |src: StepSrc, slots: &[[$v; V]]| -> Fetch {
                    match src {
                        StepSrc::Operand(i) => match row[i] {
                            // SAFETY: the row holds `at + LEN` floats (the caller's).
                            Fetch::Ptr(p) => Fetch::Ptr(unsafe { p.add(at) }),
                            Fetch::Splat(v) => Fetch::Splat(v),
                        },
                        StepSrc::Slot(k) => Fetch::Ptr(slots[k].as_ptr() as *const f32),
                    }
                };
                let mut acc = [$zero(); V];
                for step in steps {
                    // SAFETY: each fetched pointer holds a block (above; a slot is one).
                    unsafe {
                        match *step {
                            Step::Load(src) => match fetch(src, slots) {
                                Fetch::Ptr(p) => {
                                    for (i, a) in acc.iter_mut().enumerate() {
                                        *a = $load(p.add($w * i));
                                    }
                                }
                                Fetch::Splat(v) => acc = [v; V],
                            },
                            Step::Op(kind, src) => {
                                interpreter_binary!(kind, acc, fetch(src, slots), false, $w,
                                    $load, $add, $sub, $mul, $div, $min, $max)
                            }
                            Step::RevOp(kind, src) => {
                                interpreter_binary!(kind, acc, fetch(src, slots), true, $w,
                                    $load, $add, $sub, $mul, $div, $min, $max)
                            }
                            Step::Square(kind) => {
                                let copy = acc;
                                let fetch = Fetch::Ptr(copy.as_ptr() as *const f32);
                                interpreter_binary!(kind, acc, fetch, false, $w,
                                    $load, $add, $sub, $mul, $div, $min, $max)
                            }
                            Step::Save(k) => slots[k] = acc,
                        }
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    // SAFETY: `out` holds a block (the caller's).
                    unsafe { $store(out.add($w * i), *a) };
                }
            }

            /// Floats of a row in a piece (whole blocks): a row is cut into pieces of this
            /// length, the last one shorter, so that one long row spreads over threads too.
            pub(super) const PIECE: usize = LEN * 256;

            /// Runs `steps` over the pieces `pieces` of the output `out` (row `p / k`,
            /// floats `p % k * PIECE..` of it, `k` pieces a row), the operands at `data`.
            ///
            /// # Safety
            /// The CPU has the feature; `data` and `out` point to the operands and the
            /// output of the shapes `rows` was made from; an operand may be the output's
            /// buffer (each block's operands are read before its result is stored).
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn run(
                steps: &[Step],
                slots: usize,
                rows: &Rows,
                data: &[*const f32],
                out: *mut f32,
                pieces: std::ops::Range<usize>,
            ) {
                let mut slots = vec![[$zero(); V]; slots];
                let mut row = vec![Fetch::Splat($zero()); data.len()];
                // The last partial block of a row, its operands and result copied through
                // here.
                let mut tails = vec![[0f32; LEN]; data.len()];
                let mut tail_row = row.clone();
                let mut tail_out = [0f32; LEN];
                let per_row = rows.len.div_ceil(PIECE).max(1);
                for p in pieces {
                    let (r, piece) = (p / per_row, p % per_row);
                    let (from, to) = (piece * PIECE, ((piece + 1) * PIECE).min(rows.len));
                    for (i, src) in row.iter_mut().enumerate() {
                        let start = rows.start(i, r);
                        // SAFETY: an operand's rows lie within it (`Rows`).
                        *src = unsafe {
                            match rows.reads[i] {
                                Read::Whole => Fetch::Ptr(data[i].add(start)),
                                Read::Broadcast => Fetch::Splat($splat(*data[i].add(start))),
                            }
                        };
                    }
                    // SAFETY: the row's output lies within the output.
                    let out_row = unsafe { out.add(r * rows.len) };
                    // Pieces but the row's last are whole blocks (`PIECE`).
                    let whole = (to / LEN * LEN).max(from);
                    let mut at = from;
                    while at < whole {
                        // SAFETY: blocks up to `whole` lie within the row.
                        unsafe { block(steps, &row, at, &mut slots, out_row.add(at)) };
                        at += LEN;
                    }
                    let n = to - whole;
                    if n > 0 {
                        for ((tail, src), dst) in tails.iter_mut().zip(&row).zip(tail_row.iter_mut()) {
                            *dst = match *src {
                                Fetch::Ptr(p) => {
                                    // SAFETY: the row's last `n` floats.
                                    tail[..n].copy_from_slice(unsafe {
                                        std::slice::from_raw_parts(p.add(whole), n)
                                    });
                                    Fetch::Ptr(tail.as_ptr())
                                }
                                splat => splat,
                            };
                        }
                        // SAFETY: the tails hold a block each.
                        unsafe {
                            block(steps, &tail_row, 0, &mut slots, tail_out.as_mut_ptr());
                            std::ptr::copy_nonoverlapping(tail_out.as_ptr(), out_row.add(whole), n);
                        }
                    }
                }
            }
        }
    };
}

/// `a.min(b)` and `a.max(b)` as Rust compiles them on x86, lane by lane: `minps(b, a)`
/// (`maxps`), and `b` where `a` is NaN.
#[cfg(target_arch = "x86_64")]
mod nan_aware {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx")]
    pub(super) fn min256(a: __m256, b: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a);
        _mm256_blendv_ps(_mm256_min_ps(b, a), b, nan)
    }

    #[inline]
    #[target_feature(enable = "avx")]
    pub(super) fn max256(a: __m256, b: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a);
        _mm256_blendv_ps(_mm256_max_ps(b, a), b, nan)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn min512(a: __m512, b: __m512) -> __m512 {
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a);
        _mm512_mask_blend_ps(nan, _mm512_min_ps(b, a), b)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn max512(a: __m512, b: __m512) -> __m512 {
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a);
        _mm512_mask_blend_ps(nan, _mm512_max_ps(b, a), b)
    }
}

#[cfg(target_arch = "x86_64")]
interpreter! {
    /// The register interpreter in 256-bit vectors (AVX).
    mod avx: "avx", __m256, 8,
    zero _mm256_setzero_ps, load _mm256_loadu_ps, store _mm256_storeu_ps, splat _mm256_set1_ps,
    add _mm256_add_ps, sub _mm256_sub_ps, mul _mm256_mul_ps, div _mm256_div_ps,
    min super::nan_aware::min256, max super::nan_aware::max256,
}

#[cfg(target_arch = "x86_64")]
interpreter! {
    /// The register interpreter in 512-bit vectors (AVX-512F), where the CPU has two
    /// 512-bit FMA units (tract-linalg's probe): twice the floats an instruction.
    mod avx512: "avx512f", __m512, 16,
    zero _mm512_setzero_ps, load _mm512_loadu_ps, store _mm512_storeu_ps, splat _mm512_set1_ps,
    add _mm512_add_ps, sub _mm512_sub_ps, mul _mm512_mul_ps, div _mm512_div_ps,
    min super::nan_aware::min512, max super::nan_aware::max512,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elementwise::Link;
    use tract_core::ndarray::ArrayViewD;

    /// `run` gives the bits of the reference evaluation on `operands`, shape included,
    /// in the register interpreter and link by link.
    fn assert_reference_bits(program: &Program, operands: &[Tensor], what: &str) {
        let views: Vec<ArrayViewD<f32>> = operands
            .iter()
            .map(|t| t.to_plain_array_view::<f32>().unwrap())
            .collect();
        let expected = program.eval(&views).unwrap();
        // Each way this CPU can run, the registers' pieces also spread over three threads
        // of tract's executor.
        let threads = tract_linalg::multithread::Executor::multithread(3);
        let mut ways = vec![(Way::Blocks, false)];
        #[cfg(target_arch = "x86_64")]
        for wide in [false, true] {
            if std::arch::is_x86_feature_detected!("avx")
                && (!wide || std::arch::is_x86_feature_detected!("avx512f"))
            {
                ways.extend([
                    (Way::Registers { wide }, false),
                    (Way::Registers { wide }, true),
                ]);
            }
        }
        for (way, spread) in ways {
            let values: TVec<TValue> = operands.iter().map(|t| t.clone().into_tvalue()).collect();
            let found = match spread {
                true => tract_linalg::multithread::multithread_tract_scope(threads.clone(), || {
                    run_in(program, values, way)
                }),
                false => run_in(program, values, way),
            }
            .unwrap();
            assert_eq!(found.shape(), expected.shape(), "{what}");
            let found = found.to_plain_array_view::<f32>().unwrap();
            for (i, (f, e)) in found.iter().zip(expected.iter()).enumerate() {
                let how = format!("{way:?}");
                assert_eq!(
                    f.to_bits(),
                    e.to_bits(),
                    "{what} in {how} at {i}: {f} against {e}"
                );
            }
        }
    }

    /// Deterministic values of `shape`, none equal, some negative.
    fn tensor(shape: &[usize], seed: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i as f32 + seed) * 0.7311).sin() * 3.0)
            .collect();
        Tensor::from_shape(shape, &v).unwrap()
    }

    /// Every link kind, operands read whole, per channel, per row, per column, as
    /// scalars and with fewer axes than the output, rows longer than a block: the bits
    /// of the reference evaluation.
    #[test]
    fn rows_give_the_reference_bits() {
        use Arg::*;
        let kinds = [
            BinKind::Add,
            BinKind::Mul,
            BinKind::Max,
            BinKind::Min,
            BinKind::Sub,
            BinKind::Div,
        ];
        let links: Vec<Link> = (0..kinds.len())
            .map(|k| Link {
                kind: kinds[k],
                a: if k == 0 { Operand(0) } else { Value(k - 1) },
                b: Operand(1 + k % 5),
            })
            .chain([Link {
                kind: BinKind::Mul,
                a: Value(kinds.len() - 1),
                b: Operand(0),
            }])
            .collect();
        let program = Program { operands: 6, links };
        for (n, c, h, w) in [
            (2, 3, 4, 5),
            (3, 2, 5, 300),
            (1, 4, 1, 1000),
            (2, 1, 3, 257),
            // Rows longer than a piece of the register interpreter, over threads.
            (2, 3, 2, 17000),
            (1, 2, 1, 40000),
        ] {
            let operands = [
                tensor(&[n, c, h, w], 1.0),
                tensor(&[1, c, 1, 1], 2.0),
                tensor(&[n, 1, h, w], 3.0),
                tensor(&[w], 4.0),
                tensor(&[], 5.0),
                tensor(&[n, c, 1, w], 6.0),
            ];
            assert_reference_bits(&program, &operands, &format!("{n}x{c}x{h}x{w}"));
        }
    }

    /// Links reading two operands, a value reversed, a value squared, values read again
    /// many links later (saved), over rows shorter and longer than a block of the
    /// register interpreter, with NaNs, infinities and both zeros: the reference bits.
    #[test]
    fn every_step_gives_the_reference_bits() {
        use Arg::*;
        let link = |kind, a, b| Link { kind, a, b };
        let links = vec![
            link(BinKind::Sub, Operand(1), Operand(0)),
            link(BinKind::Div, Operand(2), Value(0)),
            link(BinKind::Mul, Value(1), Value(1)),
            link(BinKind::Max, Value(0), Value(2)),
            link(BinKind::Min, Value(3), Operand(3)),
            link(BinKind::Sub, Value(2), Value(4)),
            link(BinKind::Add, Operand(0), Operand(1)),
            link(BinKind::Div, Value(5), Value(6)),
            link(BinKind::Min, Operand(1), Value(7)),
            link(BinKind::Max, Value(8), Operand(0)),
        ];
        let program = Program { operands: 4, links };
        let (steps, slots) = compile(&program);
        assert_eq!(slots, 3, "{steps:?}");
        let specials = [
            f32::NAN,
            -0.0,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.5,
            -2.25,
        ];
        for (c, w) in [(2, 1), (3, 63), (2, 64), (1, 65), (2, 130), (1, 333)] {
            let special = |shape: &[usize], seed: usize| {
                let n: usize = shape.iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|i| specials[(i * 3 + seed * 5 + i / 7) % specials.len()])
                    .collect();
                Tensor::from_shape(shape, &v).unwrap()
            };
            let operands = [
                special(&[c, w], 0),
                special(&[c, w], 1),
                tensor(&[c, 1], 2.0),
                special(&[w], 3),
            ];
            assert_reference_bits(&program, &operands, &format!("{c}x{w}"));
        }
    }
}
