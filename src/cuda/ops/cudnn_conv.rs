//! Convolutions through cuDNN with the math type chosen per descriptor, for the
//! convolutions [`crate::cuda::conv_routing`] marked [`Dense`].
//!
//! tract-cuda runs these convolutions through cuDNN too, with the same algorithm
//! (implicit precomputed GEMM) and the bias added by a separate element-wise op, but with
//! cuDNN's default math type, which lets f32 convolutions run on TF32 tensor cores from
//! Ampere on: 10 bits of mantissa, a relative error near 1e-3 (measured on PP-OCRv4 rec on
//! an H200: 1.5e-4 on the probabilities), far from what the exactness contract promises.
//! Here each convolution descriptor says `CUDNN_FMA_MATH` (f32 arithmetic only), or the
//! default math type where `TRACT_RAGGED_TF32` asks for TF32. So the choice holds for one
//! plan, without touching the process's environment.
//!
//! f16 tensors (a model in half precision) run in cuDNN's pseudo-half configuration: f16
//! data, f32 compute (the convolution descriptor's type), tensor cores allowed; each output
//! is one f32 sum rounded to f16 once, whatever the batch. tract-cuda would run them on
//! its own direct f16 kernel instead (1% of the memory bound on PP-OCRv4 rec's stem).
//!
//! cuDNN descriptors are made with a thread's cuDNN handle and are not `Send`: like
//! tract-cuda, the op keeps them per thread, keyed by the session and node, dropped with
//! the session. Unlike tract-cuda, it keeps those of the last [`SHAPES_KEPT`] input shapes,
//! not one: a plan over symbols runs every batch shape on one state, and making a
//! convolution's descriptors again at each new shape costs the host more than the
//! device's convolution of a small batch.

use std::cell::RefCell;

use cudarc::cudnn::sys::{cudnnConvolutionFwdAlgo_t, cudnnConvolutionMode_t, cudnnMathType_t};
use cudarc::cudnn::{
    ConvDescriptor, ConvForward, CudnnDataType, FilterDescriptor, TensorDescriptor,
};
use cudarc::driver::DeviceRepr;
use tract_core::internal::*;
use tract_core::ops::cnn::Conv;
use tract_cuda::kernels::{get_cuda_view, get_cuda_view_mut};
use tract_gpu::tensor::{DeviceTensor, DeviceTensorExt};
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use crate::cuda::conv_routing::Dense;
use crate::cuda::knobs::TRACT_RAGGED_TF32;
use crate::cuda::launch::{Stream, contiguous, with_stream};
use crate::cuda::op_states::{self, OpStates};

use super::DeviceOp;

/// The algorithm tract-cuda uses: same algorithm, same bits as its f32 path.
const ALGO: cudnnConvolutionFwdAlgo_t =
    cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;

/// A convolution through cuDNN, without bias, f32 or f16 (module doc). Inputs: data,
/// kernel (OIHW).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaCudnnConv {
    pub conv: Conv,
    /// Whether cuDNN may run it on TF32 tensor cores.
    pub tf32: bool,
}

/// The convolutions marked [`Dense`] (on f32 or f16).
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    match node.op_as::<Dense>() {
        Some(Dense(conv)) if super::is_float_kernel_type(dt) => Ok(Some(Box::new(CudaCudnnConv {
            conv: conv.clone(),
            tf32: TRACT_RAGGED_TF32.get(),
        }))),
        _ => Ok(None),
    }
}

device_op!(CudaCudnnConv);

/// The descriptors of one convolution for one input shape, and its workspace size: tensors
/// of `T` (f32 or f16), computed in f32.
struct Descriptors<T: CudnnDataType> {
    input_shape: TVec<usize>,
    conv: ConvDescriptor<f32>,
    x: TensorDescriptor<T>,
    w: FilterDescriptor<T>,
    y: TensorDescriptor<T>,
    workspace: usize,
}

/// The tensor types cuDNN convolves for us, and their one and zero (cuDNN's alpha and
/// beta, which it takes as f32 for both).
trait ConvType: CudnnDataType<Scalar = f32> + DeviceRepr + Copy {
    const ONE: Self;
    const ZERO: Self;
}

impl ConvType for f32 {
    const ONE: f32 = 1.0;
    const ZERO: f32 = 0.0;
}

impl ConvType for f16 {
    const ONE: f16 = f16::ONE;
    const ZERO: f16 = f16::ZERO;
}

/// A node's descriptors, for its tensors' type.
enum Typed {
    F32(Descriptors<f32>),
    F16(Descriptors<f16>),
}

impl Typed {
    /// Whether these are the descriptors of inputs of type `dt` and shape `shape`.
    fn fits(&self, dt: DatumType, shape: &[usize]) -> bool {
        match self {
            Typed::F32(d) => dt == DatumType::F32 && &*d.input_shape == shape,
            Typed::F16(d) => dt == DatumType::F16 && &*d.input_shape == shape,
        }
    }
}

/// How many input shapes a node keeps descriptors for, per thread and session (module
/// doc): a server's gatherings bring a few dozen batch shapes over and over.
pub const SHAPES_KEPT: usize = 64;

/// A node's descriptors by input shape, the most recently used last, at most
/// [`SHAPES_KEPT`] of them.
struct Kept<T>(Vec<T>);

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept(vec![])
    }
}

impl<T> Kept<T> {
    /// The entry that `fits`, made by `make` unless kept (the least recently used one
    /// dropped when full), now the most recently used.
    fn get_or_make(
        &mut self,
        fits: impl Fn(&T) -> bool,
        make: impl FnOnce() -> TractResult<T>,
    ) -> TractResult<&T> {
        match self.0.iter().position(fits) {
            Some(ix) => {
                let used = self.0.remove(ix);
                self.0.push(used);
            }
            None => {
                let made = make()?;
                if self.0.len() >= SHAPES_KEPT {
                    self.0.remove(0);
                }
                self.0.push(made);
            }
        }
        self.0.last().context("descriptors just kept")
    }
}

thread_local! {
    /// Per session and node: the descriptors this thread made (module doc).
    static DESCRIPTORS: RefCell<OpStates<Kept<Typed>>> = RefCell::default();
}

/// Frees this thread's descriptors of sessions ended on other threads ([`op_states`]).
pub(crate) fn sweep() {
    op_states::sweep(&DESCRIPTORS);
}

/// Dims and strides of a tensor of `shape` for cuDNN, a 1-D convolution's made 2-D.
fn nd(shape: &[usize], strides: &[isize]) -> TractResult<(Vec<i32>, Vec<i32>)> {
    let int = |v: isize| i32::try_from(v).context("cuDNN takes 32-bit dims and strides");
    let mut dims = shape
        .iter()
        .map(|d| int(*d as isize))
        .collect::<TractResult<Vec<_>>>()?;
    let mut strides = strides
        .iter()
        .map(|s| int(*s))
        .collect::<TractResult<Vec<_>>>()?;
    if dims.len() == 3 {
        dims.push(1);
        strides.push(1);
    }
    Ok((dims, strides))
}

impl CudaCudnnConv {
    fn descriptors<T: CudnnDataType>(
        &self,
        stream: &Stream,
        x: &DeviceTensor,
        w: &DeviceTensor,
        y: &DeviceTensor,
    ) -> TractResult<Descriptors<T>> {
        let spec = &self.conv.pool_spec;
        let data = spec.data_format.shape(x.shape())?;
        let int = |v: usize| i32::try_from(v).context("cuDNN takes 32-bit geometry");
        let mut pads = spec
            .computed_padding(data.hw_dims())
            .iter()
            .map(|p| int(p.pad_before))
            .collect::<TractResult<Vec<_>>>()?;
        let mut strides = spec
            .strides()
            .iter()
            .map(|s| int(*s))
            .collect::<TractResult<Vec<_>>>()?;
        let mut dilations = spec
            .dilations()
            .iter()
            .map(|d| int(*d))
            .collect::<TractResult<Vec<_>>>()?;
        if data.hw_rank() == 1 {
            pads.push(0);
            strides.push(1);
            dilations.push(1);
        }
        let cudnn = stream.cudnn;
        let mut conv = cudnn.create_convnd::<f32>(
            &pads,
            &strides,
            &dilations,
            cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
        )?;
        conv.set_group_count(int(self.conv.group)?)?;
        // f16 data may use tensor cores (f32 accumulation): the precision asked for.
        let half = T::DATA_TYPE != f32::DATA_TYPE;
        conv.set_math_type(if self.tf32 || half {
            cudnnMathType_t::CUDNN_DEFAULT_MATH
        } else {
            cudnnMathType_t::CUDNN_FMA_MATH
        })?;
        // cuDNN takes N and C, then the spatial dims; the strides say the layout (channels
        // first or last) of a contiguous tensor.
        let tensor = |shape: &[usize]| -> TractResult<(Vec<i32>, Vec<i32>)> {
            let shaped = spec.data_format.shape(shape)?;
            let n = *shaped.n().context("cuDNN convolutions need a batch axis")?;
            let n_stride = *shaped
                .n_stride()
                .context("cuDNN convolutions need a batch axis")?;
            let mut dims = vec![n, *shaped.c()];
            dims.extend(shaped.hw_dims());
            let mut strides = vec![n_stride as isize, *shaped.c_stride() as isize];
            strides.extend(shaped.hw_strides().iter().map(|s| *s as isize));
            nd(&dims, &strides)
        };
        let (x_dims, x_strides) = tensor(x.shape())?;
        let (y_dims, y_strides) = tensor(y.shape())?;
        let x_desc = cudnn.create_nd_tensor::<T>(&x_dims, &x_strides)?;
        let y_desc = cudnn.create_nd_tensor::<T>(&y_dims, &y_strides)?;
        let (w_dims, _) = nd(w.shape(), &Tensor::natural_strides(w.shape()))?;
        let w_desc = cudnn.create_nd_filter::<T>(
            cudarc::cudnn::sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            &w_dims,
        )?;
        let workspace = ConvForward {
            conv: &conv,
            x: &x_desc,
            w: &w_desc,
            y: &y_desc,
        }
        .get_workspace_size(ALGO)?;
        Ok(Descriptors {
            input_shape: x.shape().into(),
            conv,
            x: x_desc,
            w: w_desc,
            y: y_desc,
            workspace,
        })
    }
}

impl CudaCudnnConv {
    /// Runs the convolution of `x` by `w` into `y`, tensors of `T`, with this thread's
    /// descriptors `d`.
    fn forward<T: ConvType>(
        stream: &Stream,
        d: &Descriptors<T>,
        x: &DeviceTensor,
        w: &DeviceTensor,
        y: &DeviceTensor,
    ) -> TractResult<()> {
        let forward = ConvForward {
            conv: &d.conv,
            x: &d.x,
            w: &d.w,
            y: &d.y,
        };
        let xv = get_cuda_view(x);
        let wv = get_cuda_view(w);
        let mut yv = get_cuda_view_mut(y);
        let as_t = "a device tensor of its type as bytes";
        // SAFETY: the three tensors hold `T` (the caller matched their type): their bytes
        // are `len` of them, read as such.
        let (src, filter, mut dst) = unsafe {
            (
                xv.transmute::<T>(x.len()).context(as_t)?,
                wv.transmute::<T>(w.len()).context(as_t)?,
                yv.transmute_mut::<T>(y.len()).context(as_t)?,
            )
        };
        let mut workspace = match d.workspace {
            0 => None,
            // SAFETY: scratch for cuDNN, which writes it before it reads it.
            bytes => Some(unsafe { stream.stream.alloc::<u8>(bytes) }?),
        };
        stream.profiled(|| {
            // SAFETY: the descriptors were made for these tensors' shapes, strides and type
            // (rebuilt when the input shape or type changes), on this thread's handle and
            // stream; alpha and beta f32, as cuDNN takes them for f32 and f16 data.
            unsafe {
                forward.launch(
                    ALGO,
                    workspace.as_mut().map(|w| w.as_view_mut()).as_mut(),
                    (T::ONE, T::ZERO),
                    &src,
                    &filter,
                    &mut dst,
                )
            }
            .map_err(|e| anyhow!("{}: cudnnConvolutionForward: {e:?}", Self::NAME))
        })
    }
}

impl DeviceOp for CudaCudnnConv {
    const NAME: &'static str = "CudaCudnnConv";
    const NEEDS_PLAN: bool = true;

    fn info(&self) -> TractResult<Vec<String>> {
        let mut info = self.conv.info()?;
        info.push(format!("tf32: {}", self.tf32));
        Ok(info)
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        ensure!(inputs.len() == 2, "{op}: data and kernel");
        let (x, w) = (inputs[0].to_device_tensor()?, inputs[1].to_device_tensor()?);
        let dt = x.datum_type();
        ensure!(
            super::is_float_kernel_type(dt) && w.datum_type() == dt,
            "{op}: f32 or f16 data and kernel, got {dt:?} and {:?}",
            w.datum_type()
        );
        contiguous(x, op)?;
        contiguous(w, op)?;
        let output_shape = self.conv.pool_spec.output_shape(x.shape())?;
        let y = make_tensor_for_node(ctx, dt, &output_shape.shape)?;
        if y.len() == 0 {
            return Ok(tvec!(y.into_tensor().into_tvalue()));
        }
        with_stream(|stream| {
            DESCRIPTORS.with_borrow_mut(|cache| {
                let kept = cache.get_or_try_insert_with((ctx.session, ctx.node_id), || {
                    TractResult::Ok(Kept::<Typed>::default())
                })?;
                let descriptors = kept.get_or_make(
                    |d| d.fits(dt, x.shape()),
                    || {
                        crate::counters::count(crate::counters::Event::ConvDescriptors);
                        Ok(match dt {
                            DatumType::F16 => Typed::F16(self.descriptors(stream, x, w, &y)?),
                            _ => Typed::F32(self.descriptors(stream, x, w, &y)?),
                        })
                    },
                )?;
                match descriptors {
                    Typed::F32(d) => Self::forward(stream, d, x, w, &y),
                    Typed::F16(d) => Self::forward(stream, d, x, w, &y),
                }
            })
        })?;
        Ok(tvec!(y.into_tensor().into_tvalue()))
    }

    fn drop_session(&self, session: SessionId, node_id: usize) {
        op_states::end(&DESCRIPTORS, session, node_id);
    }
}

impl TypedOp for CudaCudnnConv {
    /// The convolution's own (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.conv.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| {
            let zero = facts[0].datum_type.scalar_fact();
            self.conv.output_facts(&[facts[0], facts[1], &zero])
        })
    }

    as_op!();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shape met again is found, not made; past `SHAPES_KEPT` shapes the least
    /// recently used one is dropped, and a failed make keeps what was kept.
    #[test]
    fn descriptors_are_kept_for_the_latest_shapes() -> TractResult<()> {
        let mut kept = Kept::<usize>::default();
        let mut made = 0;
        let mut get = |kept: &mut Kept<usize>, shape: usize| -> TractResult<usize> {
            kept.get_or_make(
                |k| *k == shape,
                || {
                    made += 1;
                    Ok(shape)
                },
            )
            .copied()
        };
        for shape in 0..SHAPES_KEPT {
            assert_eq!(get(&mut kept, shape)?, shape);
        }
        // 0 used again: 1 is now the least recently used.
        get(&mut kept, 0)?;
        get(&mut kept, SHAPES_KEPT)?;
        get(&mut kept, 0)?;
        get(&mut kept, 2)?;
        assert_eq!(kept.0.len(), SHAPES_KEPT);
        assert!(!kept.0.contains(&1), "the least recently used is dropped");
        assert!(kept.0.contains(&0) && kept.0.contains(&SHAPES_KEPT));
        assert_eq!(made, SHAPES_KEPT + 1);
        let failed = kept.get_or_make(|k| *k == 1000, || bail!("no descriptors"));
        assert!(failed.is_err());
        assert_eq!(kept.0.len(), SHAPES_KEPT);
        Ok(())
    }
}
