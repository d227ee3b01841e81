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

/// A link's loop as this build compiles it (SSE2 on x86_64).
fn apply_baseline(kind: BinKind, a: Src, b: Src, out: &mut [f32]) {
    apply(kind, a, b, out)
}

/// A link's loop in 256-bit vectors: the same operations lane by lane (no fused
/// multiply-add), so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn apply_avx(kind: BinKind, a: Src, b: Src, out: &mut [f32]) {
    apply(kind, a, b, out)
}

/// The widest loop this CPU runs.
fn link_loop() -> fn(BinKind, Src, Src, &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU supports AVX, which is all `apply_avx` enables.
        return |kind, a, b, out| unsafe { apply_avx(kind, a, b, out) };
    }
    apply_baseline
}

/// Runs `program` on `inputs` (its operands, f32, broadcasting as tract does), in rows
/// (module doc). The output takes the buffer of an operand of its shape that nothing
/// else holds, as tract's own element-wise ops do: no new memory to allocate and fault
/// in, which costs more than the arithmetic.
pub(crate) fn run(program: &Program, inputs: TVec<TValue>) -> TractResult<Tensor> {
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
    let apply = link_loop();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elementwise::Link;
    use tract_core::ndarray::ArrayViewD;

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
        ] {
            let operands = [
                tensor(&[n, c, h, w], 1.0),
                tensor(&[1, c, 1, 1], 2.0),
                tensor(&[n, 1, h, w], 3.0),
                tensor(&[w], 4.0),
                tensor(&[], 5.0),
                tensor(&[n, c, 1, w], 6.0),
            ];
            let values: TVec<TValue> = operands.iter().map(|t| t.clone().into_tvalue()).collect();
            let found = run(&program, values).unwrap();
            let views: Vec<ArrayViewD<f32>> = operands
                .iter()
                .map(|t| t.to_plain_array_view::<f32>().unwrap())
                .collect();
            let expected = program.eval(&views).unwrap();
            assert_eq!(found.shape(), expected.shape());
            let found = found.to_plain_array_view::<f32>().unwrap();
            for (f, e) in found.iter().zip(expected.iter()) {
                assert_eq!(f.to_bits(), e.to_bits(), "{n}x{c}x{h}x{w}");
            }
        }
    }
}
