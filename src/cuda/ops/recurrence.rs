//! [`Recurrence`] on the device, through cuDNN's RNN API ([`crate::cuda::cudnn_rnn`]).
//!
//! cuDNN rather than a kernel of ours: it takes each sample's length with the padded
//! layouts ragged batches have, runs the recurrent products of a step for the whole batch
//! as one GEMM and fuses each step's gates, which is where a recurrence's time goes.
//! Its cells are the standard ones: LSTM (sigmoid, tanh, tanh), GRU with
//! `linear_before_reset` (PyTorch's and Keras' GRU), RNN with tanh or ReLU, without
//! `clip` or peepholes. Any other recurrence is refused when the plan is made, naming the
//! node and what cuDNN lacks: never a recurrence silently left on the host.
//!
//! Around cuDNN:
//! - **Weights.** cuDNN wants them in a weight space of its own layout (its gate order:
//!   i, f, c, o for an LSTM, r, z, h for a GRU, where ONNX has i, o, f, c and z, r, h).
//!   Each thread's state of the op fills one from `W`, `R` and `B` on the device, once,
//!   and keeps it.
//! - **Lengths.** The descriptors take each sample's length on the host, the forward pass
//!   on the device: the op reads the lengths twice, as a host input (appended after the
//!   device inputs, [`CudaRecurrence::host_inputs`]) and as a device one. Without lengths
//!   every sample runs the whole sequence.
//! - **Layouts.** Batch first, ONNX's `Y` `[N, T, D, H]` is cuDNN's `[N, T, D*H]`: cuDNN
//!   writes it. Sequence first with two directions, cuDNN's `[T, N, 2H]` is not ONNX's
//!   `[T, 2, N, H]`: written in a scratch and permuted (tract-cuda's copy kernel); so are
//!   the states of two directions batch first (`[N, 2, H]` against cuDNN's `[2, N, H]`).
//! - **A single reverse direction**, which cuDNN has not: each sample's steps reversed
//!   within its length (`kernels/recurrence.cu`), run forward, reversed back.

use std::cell::RefCell;

use cudarc::driver::{CudaSlice, DevicePtr};
use tract_core::internal::*;
use tract_cuda::kernels::array::cuda_copy_nd_dispatch;
use tract_cuda::kernels::get_cuda_view;
use tract_gpu::tensor::{DeviceTensor, DeviceTensorExt};
use tract_gpu::turn_handler::make_tensor_for_node_output;
use tract_gpu::utils::facts_to_device_facts;

use super::f32_only;
use crate::cuda::abi::KernelArgs;
use crate::cuda::cudnn_rnn::{self, DataDescriptor, DropoutDescriptor, RnnConfig, RnnDescriptor};
use crate::cuda::knobs::TRACT_RAGGED_TF32;
use crate::cuda::launch::{Stream, contiguous, grid_over, launch, with_stream};
use crate::cuda::nvrtc::KernelFile;
use crate::cuda::op_states::{self, OpStates};
use crate::ops::recurrence::{Activation, Cell, Direction, Recurrence};

use super::DeviceOp;

crate::kernel_args! {
    /// A `[T, N, V]` or `[N, T, V]` tensor: its steps and samples, their strides.
    pub struct ReverseGeom {
        total: i64,
        vector: i64,
        t: i64,
        t_stride: i64,
        n: i64,
        n_stride: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "recurrence",
    source: include_str!("../../../kernels/recurrence.cu"),
    args: ReverseGeom::declaration,
};

/// [`Recurrence`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaRecurrence {
    pub op: Recurrence,
    /// Whether cuDNN may run its GEMMs on TF32 tensor cores.
    pub tf32: bool,
}

/// What cuDNN cannot run of `op`, if anything.
fn beyond_cudnn(op: &Recurrence) -> Option<String> {
    use Activation::*;
    let acts = |d: usize| op.activations_of(d);
    let standard = (0..op.direction.count()).all(|d| match op.cell {
        Cell::Lstm => acts(d) == [Sigmoid, Tanh, Tanh],
        Cell::Gru => acts(d) == [Sigmoid, Tanh],
        Cell::Rnn => acts(d) == acts(0) && (acts(d) == [Tanh] || acts(d) == [Relu]),
    });
    if !standard {
        return Some(format!("activations {:?}", op.activations));
    }
    if op.clip.is_some() {
        return Some("clip".into());
    }
    if op.inputs.peepholes {
        return Some("peepholes".into());
    }
    if op.input_forget {
        return Some("input_forget".into());
    }
    if op.cell == Cell::Gru && !op.linear_before_reset {
        return Some("linear_before_reset 0".into());
    }
    None
}

/// Our recurrence, f32, the cells cuDNN runs; an error for any other.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<Recurrence>() else {
        return Ok(None);
    };
    f32_only(dt, "a recurrence")?;
    if let Some(what) = beyond_cudnn(op) {
        bail!(
            "ragged-cuda: the {} {} has {what}, which cuDNN's RNN does not run (it runs the \
             standard cells): run this model on the CPU",
            op.cell.name(),
            node.name
        );
    }
    Ok(Some(Box::new(CudaRecurrence {
        op: op.clone(),
        tf32: TRACT_RAGGED_TF32.get(),
    })))
}

impl CudaRecurrence {
    /// The inputs of the host node this op also reads on the host, appended after its
    /// device inputs: the lengths.
    pub fn host_inputs(&self) -> TVec<usize> {
        self.op.inputs.slots().lengths.into_iter().collect()
    }

    fn config(&self, input: usize) -> RnnConfig {
        use cudarc::cudnn::sys::cudnnRNNMode_t::*;
        RnnConfig {
            mode: match self.op.cell {
                Cell::Lstm => CUDNN_LSTM,
                Cell::Gru => CUDNN_GRU,
                Cell::Rnn if self.op.activations[0] == Activation::Relu => CUDNN_RNN_RELU,
                Cell::Rnn => CUDNN_RNN_TANH,
            },
            bidirectional: self.op.direction == Direction::Bidirectional,
            bias: self.op.inputs.bias,
            input,
            hidden: self.op.hidden,
            tf32: self.tf32,
        }
    }

    /// ONNX's gate (its block of rows in `W` and `R`) for cuDNN's linear layer `gate`.
    fn onnx_gate(&self, gate: usize) -> usize {
        match self.op.cell {
            // cuDNN i, f, c, o; ONNX i, o, f, c.
            Cell::Lstm => [0, 2, 3, 1][gate],
            // cuDNN r, z, h; ONNX z, r, h.
            Cell::Gru => [1, 0, 2][gate],
            Cell::Rnn => 0,
        }
    }
}

device_op!(CudaRecurrence);

/// One thread's state of one recurrence: cuDNN's descriptors and its weight space.
struct State {
    rnn: RnnDescriptor,
    _dropout: DropoutDescriptor,
    weights: CudaSlice<u8>,
    /// The device addresses of `W`, `R` and `B` the weight space was filled from.
    filled_from: [u64; 3],
    /// What the data descriptors were made for: padded length, input size, lengths.
    data: Option<(
        usize,
        usize,
        Vec<i32>,
        DataDescriptor,
        DataDescriptor,
        usize,
    )>,
}

thread_local! {
    /// Per session and node: this thread's states (cuDNN objects are per thread).
    static STATES: RefCell<OpStates<State>> = RefCell::default();
}

/// Frees this thread's states of sessions ended on other threads ([`op_states`]).
pub(crate) fn sweep() {
    op_states::sweep(&STATES);
}

fn address(t: &DeviceTensor, stream: &Stream) -> u64 {
    let view = get_cuda_view(t);
    let (ptr, _sync) = view.device_ptr(stream.stream);
    ptr
}

impl CudaRecurrence {
    /// Fills `state`'s weight space from `W`, `R` and `B` (device, ONNX's layout), for
    /// an input of `input` features.
    fn fill_weights(
        &self,
        stream: &Stream,
        handle: cudnn_rnn::ThreadHandle,
        state: &mut State,
        weights: [Option<&DeviceTensor>; 3],
        input: usize,
    ) -> TractResult<()> {
        let from = weights.map(|t| t.map(|t| address(t, stream)).unwrap_or(0));
        if state.filled_from == from {
            return Ok(());
        }
        let (h, gates) = (self.op.hidden, self.op.cell.gates());
        let size = state.weights.len();
        let space = {
            let (ptr, _sync) = state.weights.device_ptr(stream.stream);
            ptr
        };
        let f32s = std::mem::size_of::<f32>() as u64;
        for d in 0..self.op.direction.count() {
            for lin in 0..2 * gates {
                let gate = self.onnx_gate(lin % gates);
                let recurrent = lin >= gates;
                let (matrix, bias) =
                    cudnn_rnn::weight_params(handle, &state.rnn, d, lin, space, size)?;
                let (source, cols) = if recurrent {
                    (from[1], h)
                } else {
                    (from[0], input)
                };
                ensure!(
                    matrix.len == h * cols,
                    "cuDNN's matrix {lin} of direction {d} holds {} values, {} expected",
                    matrix.len,
                    h * cols
                );
                let offset = ((d * gates * h + gate * h) * cols) as u64;
                copy(
                    stream,
                    matrix.address,
                    source + offset * f32s,
                    matrix.len * 4,
                )?;
                if let (Some(bias), Some(_)) = (bias, weights[2]) {
                    ensure!(
                        bias.len == h,
                        "cuDNN's bias {lin} holds {} values",
                        bias.len
                    );
                    let offset =
                        (d * 2 * gates * h + (recurrent as usize) * gates * h + gate * h) as u64;
                    copy(stream, bias.address, from[2] + offset * f32s, h * 4)?;
                }
            }
        }
        state.filled_from = from;
        Ok(())
    }
}

/// An asynchronous device-to-device copy of `bytes` on `stream`.
fn copy(stream: &Stream, dst: u64, src: u64, bytes: usize) -> TractResult<()> {
    // SAFETY: both ranges are device memory of at least `bytes` (checked by the callers
    // against the tensors' and cuDNN's sizes), ordered on this stream.
    unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.stream.cu_stream()) }
        .map_err(|e| {
            anyhow::Error::new(e).context(format!("{}: copying weights", CudaRecurrence::NAME))
        })
}

/// `src` permuted into `dst`: `strides` are `src`'s strides for each axis of `dst`.
fn permute(src: &DeviceTensor, strides: &[isize], dst: &DeviceTensor) -> TractResult<()> {
    cuda_copy_nd_dispatch(src, 0, strides, dst, 0, dst.shape(), dst.strides())
}

impl DeviceOp for CudaRecurrence {
    const NAME: &'static str = "CudaRecurrence";
    const NEEDS_PLAN: bool = true;

    fn name(&self) -> StaticName {
        format!("CudaCudnn{}", self.op.cell.name()).into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        let mut info = self.op.info()?;
        info.push(format!("tf32: {}", self.tf32));
        Ok(info)
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let what = Self::NAME;
        let slots = self.op.inputs.slots();
        ensure!(
            inputs.len() == slots.count + self.host_inputs().len(),
            "{what}: {} inputs, {} expected",
            inputs.len(),
            slots.count + self.host_inputs().len()
        );
        let device = |ix: usize| -> TractResult<&DeviceTensor> {
            let t = inputs[ix].to_device_tensor()?;
            contiguous(t, what)?;
            Ok(t)
        };
        let x = device(0)?;
        f32_only(x.datum_type(), what)?;
        let (w, r) = (device(1)?, device(2)?);
        let b = slots.bias.map(device).transpose()?;
        let (h0, c0) = (
            slots.initial_h.map(device).transpose()?,
            slots.initial_c.map(device).transpose()?,
        );
        let batch_first = self.op.batch_first;
        let (t, n, c) = if batch_first {
            (x.shape()[1], x.shape()[0], x.shape()[2])
        } else {
            (x.shape()[0], x.shape()[1], x.shape()[2])
        };
        let (h, dirs) = (self.op.hidden, self.op.direction.count());
        ensure!(t > 0 && n > 0, "{what}: an empty batch or sequence");
        let lengths: Vec<i32> = match slots.lengths {
            Some(_) => {
                let host = inputs[slots.count].cast_to::<i32>()?;
                host.to_plain_array_view::<i32>()?.iter().copied().collect()
            }
            None => vec![t as i32; n],
        };
        ensure!(
            lengths.len() == n,
            "{what}: {} lengths for {n} samples",
            lengths.len()
        );
        for (sample, l) in lengths.iter().enumerate() {
            ensure!(
                (1..=t as i32).contains(l),
                "{what}: sample {sample} has length {l}: cuDNN runs lengths 1..={t}"
            );
        }
        let y_shape: TVec<usize> = if batch_first {
            tvec!(n, t, dirs, h)
        } else {
            tvec!(t, dirs, n, h)
        };
        let state_shape: TVec<usize> = if batch_first {
            tvec!(n, dirs, h)
        } else {
            tvec!(dirs, n, h)
        };
        let dt = f32::datum_type();
        let y = make_tensor_for_node_output(ctx, 0, dt, &y_shape)?;
        let y_h = make_tensor_for_node_output(ctx, 1, dt, &state_shape)?;
        let y_c = (self.op.cell == Cell::Lstm)
            .then(|| make_tensor_for_node_output(ctx, 2, dt, &state_shape))
            .transpose()?;
        let reverse = self.op.direction == Direction::Reverse;
        // cuDNN's states are [D, N, H]: ONNX's batch first with two directions are not.
        let permuted_states = batch_first && dirs == 2;
        // cuDNN's output is [T, N, D*H] or [N, T, D*H]: ONNX's only sequence first with
        // two directions is not the same bytes.
        let permuted_y = !batch_first && dirs == 2;
        let cudnn_state = |s: Option<&DeviceTensor>| -> TractResult<Option<DeviceTensor>> {
            match s {
                Some(s) if permuted_states => {
                    let tmp = DeviceTensor::uninitialized_dt(dt, &[dirs, n, h])?;
                    // [N, D, H] read as [D, N, H].
                    permute(s, &[h as isize, (dirs * h) as isize, 1], &tmp)?;
                    Ok(Some(tmp))
                }
                _ => Ok(None),
            }
        };
        let (hx_tmp, cx_tmp) = (cudnn_state(h0)?, cudnn_state(c0)?);
        let hy_tmp = permuted_states
            .then(|| DeviceTensor::uninitialized_dt(dt, &[dirs, n, h]))
            .transpose()?;
        let cy_tmp = (permuted_states && y_c.is_some())
            .then(|| DeviceTensor::uninitialized_dt(dt, &[dirs, n, h]))
            .transpose()?;
        let y_tmp = (permuted_y || reverse)
            .then(|| DeviceTensor::uninitialized_dt(dt, &[x.shape()[0], x.shape()[1], dirs * h]))
            .transpose()?;
        let (t_stride, n_stride) = if batch_first { (1, t) } else { (n, 1) };
        let reverse_geom = |vector: usize| ReverseGeom {
            total: (t * n * vector) as i64,
            vector: vector as i64,
            t: t as i64,
            t_stride: (t_stride * vector) as i64,
            n: n as i64,
            n_stride: (n_stride * vector) as i64,
        };
        // Without lengths every sample runs the whole sequence: cuDNN still takes them.
        let full_lengths = slots
            .lengths
            .is_none()
            .then(|| DeviceTensor::uninitialized_dt(i32::datum_type(), &[n]))
            .transpose()?;
        let lengths_dev = match (slots.lengths, &full_lengths) {
            (Some(s), _) => device(s)?,
            (None, Some(full)) => full,
            (None, None) => bail!("{what}: no lengths"),
        };
        ensure!(
            lengths_dev.datum_type() == i32::datum_type() && lengths_dev.len() == n,
            "{what}: the lengths on the device must be {n} i32"
        );
        let x_rev = reverse
            .then(|| DeviceTensor::uninitialized_dt(dt, x.shape()))
            .transpose()?;
        with_stream(|stream| {
            let lengths_addr = address(lengths_dev, stream);
            if full_lengths.is_some() {
                // SAFETY: N i32 at that address (allocated above), set on this stream.
                unsafe {
                    cudarc::driver::sys::cuMemsetD32Async(
                        lengths_addr,
                        t as u32,
                        n,
                        stream.stream.cu_stream(),
                    )
                }
                .result()
                .map_err(|e| anyhow::Error::new(e).context(format!("{what}: lengths")))?;
            }
            if let Some(x_rev) = &x_rev {
                // SAFETY: ragged_reverse_f32(x, y, lengths, ReverseGeom): x and y hold
                // T x N x C f32 in the layout the strides say, lengths N i32 in 1..=T.
                unsafe {
                    launch(
                        &KERNELS,
                        "ragged_reverse_f32",
                        grid_over(t * n * c),
                        &[x, x_rev, lengths_dev],
                        &reverse_geom(c),
                    )
                }?;
            }
            cudnn_rnn::with_handle(stream.stream, |handle| {
                STATES.with_borrow_mut(|states| -> TractResult<()> {
                    let key = (ctx.session, ctx.node_id);
                    let state = states.get_or_try_insert_with(key, || -> TractResult<State> {
                        let (rnn_desc, dropout) =
                            cudnn_rnn::rnn_descriptor(handle, &self.config(c))?;
                        let size = cudnn_rnn::weight_space_size(handle, &rnn_desc)?;
                        // SAFETY: filled by fill_weights before any forward pass reads it.
                        let weights = unsafe { stream.stream.alloc::<u8>(size) }?;
                        Ok(State {
                            rnn: rnn_desc,
                            _dropout: dropout,
                            weights,
                            filled_from: [0; 3],
                            data: None,
                        })
                    })?;
                    self.fill_weights(stream, handle, state, [Some(w), Some(r), b], c)?;
                    let stale = state
                        .data
                        .as_ref()
                        .is_none_or(|(dt, dc, dl, ..)| (*dt, *dc, dl) != (t, c, &lengths));
                    if stale {
                        let x_desc = cudnn_rnn::data_descriptor(batch_first, t, c, &lengths)?;
                        let y_desc =
                            cudnn_rnn::data_descriptor(batch_first, t, dirs * h, &lengths)?;
                        let work = cudnn_rnn::workspace_size(handle, &state.rnn, &x_desc)?;
                        state.data = Some((t, c, lengths.clone(), x_desc, y_desc, work));
                    }
                    let (_, _, _, x_desc, y_desc, work) =
                        state.data.as_ref().context("descriptors just made")?;
                    let h_desc = cudnn_rnn::tensor_descriptor(&[dirs, n, h])?;
                    let workspace = match *work {
                        0 => None,
                        // SAFETY: scratch for cuDNN, which writes it before it reads it.
                        bytes => Some(unsafe { stream.stream.alloc::<u8>(bytes) }?),
                    };
                    let workspace = match &workspace {
                        Some(w) => {
                            let (ptr, _sync) = w.device_ptr(stream.stream);
                            (ptr, *work)
                        }
                        None => (0, 0),
                    };
                    let weights = {
                        let (ptr, _sync) = state.weights.device_ptr(stream.stream);
                        (ptr, state.weights.len())
                    };
                    let opt = |t: Option<&DeviceTensor>| t.map(|t| address(t, stream)).unwrap_or(0);
                    let buffers = cudnn_rnn::Buffers {
                        lengths: lengths_addr,
                        x: address(x_rev.as_ref().unwrap_or(x), stream),
                        y: address(y_tmp.as_ref().unwrap_or(&y), stream),
                        hx: opt(hx_tmp.as_ref().or(h0)),
                        hy: address(hy_tmp.as_ref().unwrap_or(&y_h), stream),
                        cx: opt(cx_tmp.as_ref().or(c0)),
                        cy: opt(cy_tmp.as_ref().or(y_c.as_ref())),
                        weights,
                        workspace,
                    };
                    stream.profiled(|| {
                        // SAFETY: the descriptors were made for these shapes and lengths
                        // (rebuilt when they change), f32 throughout; x is T x N x C, y
                        // T x N x D*H, the states D x N x H (or absent), the weight space
                        // cuDNN's own size, the workspace what cuDNN asked for.
                        unsafe {
                            cudnn_rnn::forward(
                                handle, &state.rnn, x_desc, y_desc, &h_desc, &buffers,
                            )
                        }
                    })
                })
            })?;
            if let Some(y_tmp) = &y_tmp {
                if reverse {
                    // SAFETY: as above, over T x N x H (one direction: ONNX's Y is the
                    // same bytes as cuDNN's output).
                    unsafe {
                        launch(
                            &KERNELS,
                            "ragged_reverse_f32",
                            grid_over(t * n * h),
                            &[y_tmp, &y, lengths_dev],
                            &reverse_geom(h),
                        )
                    }?;
                } else {
                    // [T, N, D, H] read as [T, D, N, H].
                    let (n_, d_, h_) = (n as isize, dirs as isize, h as isize);
                    permute(y_tmp, &[n_ * d_ * h_, h_, d_ * h_, 1], &y)?;
                }
            }
            // [D, N, H] read as [N, D, H].
            let state_strides = [h as isize, (n * h) as isize, 1];
            if let Some(hy) = &hy_tmp {
                permute(hy, &state_strides, &y_h)?;
            }
            if let (Some(cy), Some(y_c)) = (&cy_tmp, &y_c) {
                permute(cy, &state_strides, y_c)?;
            }
            Ok(())
        })?;
        let mut outputs = tvec!(
            y.into_tensor().into_tvalue(),
            y_h.into_tensor().into_tvalue()
        );
        if let Some(y_c) = y_c {
            outputs.push(y_c.into_tensor().into_tvalue());
        }
        Ok(outputs)
    }

    fn drop_session(&self, session: SessionId, node_id: usize) {
        op_states::end(&STATES, session, node_id);
    }
}

impl TypedOp for CudaRecurrence {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.op.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let count = self.op.inputs.slots().count;
        facts_to_device_facts(&inputs[..count], |facts| self.op.output_facts(facts))
    }

    as_op!();
}
