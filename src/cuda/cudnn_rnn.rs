//! cuDNN's RNN API as ragged-cuda's recurrences use it: a cuDNN handle per thread, the
//! descriptors (destroyed with their owner), and where cuDNN wants each weight matrix.
//!
//! cudarc wraps cuDNN's convolutions but not its RNNs, and keeps its cuDNN handle to
//! itself: the recurrences call cuDNN's C API with a handle of their own, one per thread
//! (a handle is not to be shared between threads), made the first time a thread runs one
//! and bound to the thread's tract-cuda stream at every use.
//!
//! What cuDNN gives a recurrence (`cudnnRNNForward`, `CUDNN_RNN_ALGO_STANDARD`): each
//! sample's sequence length in the data descriptors (`seqLengthArray`, with the padded
//! layouts and `CUDNN_RNN_PADDED_IO_ENABLED`), the reverse direction of a bidirectional
//! recurrence starting at each sample's own end, the output zero past it
//! (`paddingFill`), the final states at each sample's last step: ONNX's `sequence_lens`
//! semantics, which is what a sample alone computes.

use std::cell::RefCell;

use cudarc::cudnn::CudnnError;
use cudarc::cudnn::sys::{self, cudnnDataType_t, cudnnStatus_t};
use cudarc::driver::CudaStream;
use tract_core::internal::*;

/// cudnn.h's `CUDNN_RNN_PADDED_IO_ENABLED`: the padded (unpacked) data layouts.
const PADDED_IO_ENABLED: u32 = 1;

fn check(status: cudnnStatus_t, what: &str) -> TractResult<()> {
    status
        .result()
        .map_err(|e: CudnnError| anyhow::Error::new(e).context(format!("cuDNN: {what}")))
}

struct Handle(sys::cudnnHandle_t);

/// This thread's cuDNN handle, bound to its stream: only [`with_handle`] gives one.
#[derive(Clone, Copy)]
pub struct ThreadHandle(sys::cudnnHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a handle this thread made and no descriptor outlives (descriptors are
        // per thread too, dropped with the session before the thread ends).
        unsafe { sys::cudnnDestroy(self.0) };
    }
}

thread_local! {
    static HANDLE: RefCell<Option<Handle>> = const { RefCell::new(None) };
}

/// This thread's cuDNN handle, bound to `stream`.
pub fn with_handle<R>(
    stream: &CudaStream,
    f: impl FnOnce(ThreadHandle) -> TractResult<R>,
) -> TractResult<R> {
    let handle = HANDLE.with_borrow_mut(|slot| -> TractResult<sys::cudnnHandle_t> {
        if let Some(h) = slot {
            return Ok(h.0);
        }
        // Making a handle synchronises the device: it happens in the first plain run of a
        // recurrence on this thread, which holds graph::quiet's lock (never in a capture:
        // a plan is captured on a thread after a plain run there made its op states).
        let mut handle = std::ptr::null_mut();
        // SAFETY: cudnnCreate writes a new handle into `handle`.
        let status = unsafe { sys::cudnnCreate(&mut handle) };
        check(status, "cudnnCreate")?;
        *slot = Some(Handle(handle));
        Ok(handle)
    })?;
    // SAFETY: the handle is this thread's; the stream lives while `stream` is borrowed.
    let status = unsafe { sys::cudnnSetStream(handle, stream.cu_stream() as sys::cudaStream_t) };
    check(status, "cudnnSetStream")?;
    f(ThreadHandle(handle))
}

macro_rules! descriptor {
    ($name:ident, $raw:ty, $create:ident, $destroy:ident) => {
        pub struct $name(pub $raw);

        impl $name {
            pub fn new() -> TractResult<$name> {
                let mut raw = std::ptr::null_mut();
                // SAFETY: the call writes a new descriptor into `raw`.
                let status = unsafe { sys::$create(&mut raw) };
                check(status, stringify!($create))?;
                Ok($name(raw))
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: a descriptor made by `new`, destroyed once.
                unsafe { sys::$destroy(self.0) };
            }
        }
    };
}

descriptor!(
    RnnDescriptor,
    sys::cudnnRNNDescriptor_t,
    cudnnCreateRNNDescriptor,
    cudnnDestroyRNNDescriptor
);
descriptor!(
    DataDescriptor,
    sys::cudnnRNNDataDescriptor_t,
    cudnnCreateRNNDataDescriptor,
    cudnnDestroyRNNDataDescriptor
);
descriptor!(
    TensorDescriptor,
    sys::cudnnTensorDescriptor_t,
    cudnnCreateTensorDescriptor,
    cudnnDestroyTensorDescriptor
);
descriptor!(
    DropoutDescriptor,
    sys::cudnnDropoutDescriptor_t,
    cudnnCreateDropoutDescriptor,
    cudnnDestroyDropoutDescriptor
);

/// One layer of a recurrence as cuDNN sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RnnConfig {
    pub mode: sys::cudnnRNNMode_t,
    pub bidirectional: bool,
    pub bias: bool,
    pub input: usize,
    pub hidden: usize,
    /// TF32 tensor cores allowed (`TRACT_RAGGED_TF32`); else f32 arithmetic only.
    pub tf32: bool,
}

fn int(v: usize, what: &str) -> TractResult<i32> {
    i32::try_from(v).with_context(|| format!("cuDNN takes a 32-bit {what}, not {v}"))
}

/// The RNN descriptor of `config` (with the dropout descriptor it keeps a reference to).
pub fn rnn_descriptor(
    handle: ThreadHandle,
    config: &RnnConfig,
) -> TractResult<(RnnDescriptor, DropoutDescriptor)> {
    let dropout = DropoutDescriptor::new()?;
    // SAFETY: no dropout: no random states to hold (what PyTorch does for inference).
    let status = unsafe {
        sys::cudnnSetDropoutDescriptor(dropout.0, handle.0, 0.0, std::ptr::null_mut(), 0, 0)
    };
    check(status, "cudnnSetDropoutDescriptor")?;
    let rnn = RnnDescriptor::new()?;
    let math = if config.tf32 {
        sys::cudnnMathType_t::CUDNN_DEFAULT_MATH
    } else {
        sys::cudnnMathType_t::CUDNN_FMA_MATH
    };
    // SAFETY: a descriptor made above, set once, with the dropout descriptor alive as
    // long as it (returned together).
    let status = unsafe {
        sys::cudnnSetRNNDescriptor_v8(
            rnn.0,
            sys::cudnnRNNAlgo_t::CUDNN_RNN_ALGO_STANDARD,
            config.mode,
            if config.bias {
                sys::cudnnRNNBiasMode_t::CUDNN_RNN_DOUBLE_BIAS
            } else {
                sys::cudnnRNNBiasMode_t::CUDNN_RNN_NO_BIAS
            },
            if config.bidirectional {
                sys::cudnnDirectionMode_t::CUDNN_BIDIRECTIONAL
            } else {
                sys::cudnnDirectionMode_t::CUDNN_UNIDIRECTIONAL
            },
            sys::cudnnRNNInputMode_t::CUDNN_LINEAR_INPUT,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            math,
            int(config.input, "input size")?,
            int(config.hidden, "hidden size")?,
            int(config.hidden, "projection size")?,
            1,
            dropout.0,
            PADDED_IO_ENABLED,
        )
    };
    check(status, "cudnnSetRNNDescriptor_v8")?;
    Ok((rnn, dropout))
}

/// A data descriptor of `[T, N, vector]` (sequence major) or `[N, T, vector]` (batch
/// major), padded, each sample `lengths[n]` long, zero past it.
pub fn data_descriptor(
    batch_major: bool,
    t: usize,
    vector: usize,
    lengths: &[i32],
) -> TractResult<DataDescriptor> {
    let desc = DataDescriptor::new()?;
    let layout = if batch_major {
        sys::cudnnRNNDataLayout_t::CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
    } else {
        sys::cudnnRNNDataLayout_t::CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
    };
    let mut fill = 0f32;
    // SAFETY: `lengths` holds N lengths, read during the call; the fill is a float, as
    // the data type says.
    let status = unsafe {
        sys::cudnnSetRNNDataDescriptor(
            desc.0,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            layout,
            int(t, "sequence length")?,
            int(lengths.len(), "batch size")?,
            int(vector, "vector size")?,
            lengths.as_ptr(),
            &mut fill as *mut f32 as *mut std::ffi::c_void,
        )
    };
    check(status, "cudnnSetRNNDataDescriptor")?;
    Ok(desc)
}

/// A fully packed f32 tensor descriptor of `dims`.
pub fn tensor_descriptor(dims: &[usize]) -> TractResult<TensorDescriptor> {
    let desc = TensorDescriptor::new()?;
    let dims: Vec<i32> = dims
        .iter()
        .map(|d| int(*d, "dim"))
        .collect::<TractResult<_>>()?;
    let mut strides = vec![1i32; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    // SAFETY: `dims` and `strides` hold `dims.len()` values each, read during the call.
    let status = unsafe {
        sys::cudnnSetTensorNdDescriptor(
            desc.0,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            dims.len() as i32,
            dims.as_ptr(),
            strides.as_ptr(),
        )
    };
    check(status, "cudnnSetTensorNdDescriptor")?;
    Ok(desc)
}

/// The bytes of the weight space `rnn` takes.
pub fn weight_space_size(handle: ThreadHandle, rnn: &RnnDescriptor) -> TractResult<usize> {
    let mut size = 0usize;
    // SAFETY: writes the size of a descriptor made with this handle.
    let status = unsafe { sys::cudnnGetRNNWeightSpaceSize(handle.0, rnn.0, &mut size) };
    check(status, "cudnnGetRNNWeightSpaceSize")?;
    Ok(size)
}

/// A range of device memory: its address and how many f32 it holds.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub address: u64,
    pub len: usize,
}

/// Where, in a weight space at `space` of `size` bytes, cuDNN wants the matrix and the
/// bias of linear layer `lin` of pseudo-layer `layer` (a direction); no bias without
/// biases.
pub fn weight_params(
    handle: ThreadHandle,
    rnn: &RnnDescriptor,
    layer: usize,
    lin: usize,
    space: u64,
    size: usize,
) -> TractResult<(Region, Option<Region>)> {
    let (m, b) = (TensorDescriptor::new()?, TensorDescriptor::new()?);
    let (mut m_addr, mut b_addr) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the weight space is `size` bytes at `space`, made for this descriptor; cuDNN
    // writes two addresses inside it and describes them in `m` and `b`.
    let status = unsafe {
        sys::cudnnGetRNNWeightParams(
            handle.0,
            rnn.0,
            int(layer, "layer")?,
            size,
            space as *const std::ffi::c_void,
            int(lin, "linear layer")?,
            m.0,
            &mut m_addr,
            b.0,
            &mut b_addr,
        )
    };
    check(status, "cudnnGetRNNWeightParams")?;
    let elements = |d: &TensorDescriptor| -> TractResult<usize> {
        let (mut dt, mut rank) = (cudnnDataType_t::CUDNN_DATA_FLOAT, 0i32);
        let (mut dims, mut strides) = ([0i32; 8], [0i32; 8]);
        // SAFETY: reads back a descriptor cuDNN set, at most 8 dims.
        let status = unsafe {
            sys::cudnnGetTensorNdDescriptor(
                d.0,
                8,
                &mut dt,
                &mut rank,
                dims.as_mut_ptr(),
                strides.as_mut_ptr(),
            )
        };
        check(status, "cudnnGetTensorNdDescriptor")?;
        Ok(dims[..rank.clamp(0, 8) as usize]
            .iter()
            .map(|d| (*d).max(0) as usize)
            .product())
    };
    let matrix = Region {
        address: m_addr as u64,
        len: elements(&m)?,
    };
    let bias = (!b_addr.is_null())
        .then(|| {
            Ok::<_, TractError>(Region {
                address: b_addr as u64,
                len: elements(&b)?,
            })
        })
        .transpose()?;
    Ok((matrix, bias))
}

/// The workspace bytes an inference forward pass over `x` takes.
pub fn workspace_size(
    handle: ThreadHandle,
    rnn: &RnnDescriptor,
    x: &DataDescriptor,
) -> TractResult<usize> {
    let (mut work, mut reserve) = (0usize, 0usize);
    // SAFETY: writes two sizes for descriptors made with this handle.
    let status = unsafe {
        sys::cudnnGetRNNTempSpaceSizes(
            handle.0,
            rnn.0,
            sys::cudnnForwardMode_t::CUDNN_FWD_MODE_INFERENCE,
            x.0,
            &mut work,
            &mut reserve,
        )
    };
    check(status, "cudnnGetRNNTempSpaceSizes")?;
    Ok(work)
}

/// The device buffers of one forward pass, as addresses (0 for none).
pub struct Buffers {
    pub lengths: u64,
    pub x: u64,
    pub y: u64,
    pub hx: u64,
    pub hy: u64,
    pub cx: u64,
    pub cy: u64,
    pub weights: (u64, usize),
    pub workspace: (u64, usize),
}

/// `cudnnRNNForward` in inference mode.
///
/// # Safety
/// Every address is a device buffer of the size the descriptors say (`lengths` N i32,
/// `x` and `y` as their data descriptors, the states as `h`), or 0 for an absent state.
pub unsafe fn forward(
    handle: ThreadHandle,
    rnn: &RnnDescriptor,
    x_desc: &DataDescriptor,
    y_desc: &DataDescriptor,
    h_desc: &TensorDescriptor,
    b: &Buffers,
) -> TractResult<()> {
    let p = |a: u64| a as *const std::ffi::c_void;
    let m = |a: u64| a as *mut std::ffi::c_void;
    // SAFETY: the caller's.
    let status = unsafe {
        sys::cudnnRNNForward(
            handle.0,
            rnn.0,
            sys::cudnnForwardMode_t::CUDNN_FWD_MODE_INFERENCE,
            b.lengths as *const i32,
            x_desc.0,
            p(b.x),
            y_desc.0,
            m(b.y),
            h_desc.0,
            p(b.hx),
            m(b.hy),
            h_desc.0,
            p(b.cx),
            m(b.cy),
            b.weights.1,
            p(b.weights.0),
            b.workspace.1,
            m(b.workspace.0),
            0,
            std::ptr::null_mut(),
        )
    };
    check(status, "cudnnRNNForward")
}
