//! A depthwise 2-D convolution on the device, f32 or f16, channels first, one filter per channel
//! (`kernels/depthwise.cu`), for the convolutions [`crate::cuda::conv_routing`] marked
//! [`Depthwise`].
//!
//! tract-cuda runs every convolution through cuDNN with one fixed algorithm (implicit
//! precomputed GEMM), which is slow on one filter per channel; a direct kernel reads and
//! writes at the memory bandwidth. Three kernels, each element's bits the same in all
//! three (one summation order, fixed per element, whatever the batch or kernel): "same"
//! square filters of 3, 5 or 7 taps on rows of a multiple of 4 run tiles of rows x
//! outputs per thread from aligned chunks of 4 (float4, f16x4) (60-72% of the memory bound on PP-OCRv4
//! rec's layers, benches/NOTES.md); other filters with unit stride and dilation along
//! the width a strip of 4 outputs per thread; the rest one output per thread.

use cudarc::driver::LaunchConfig;
use tract_core::internal::*;
use tract_core::ops::cnn::Conv;
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use crate::cuda::abi::KernelArgs;
use crate::cuda::conv_routing::{DEPTHWISE_MAX_TAPS as MAX_TAPS, Depthwise};
use crate::cuda::fastdiv::{FastDiv, fast_div};
use crate::cuda::launch::{contiguous_floats, launch};
use crate::cuda::nvrtc::KernelFile;

use super::DeviceOp;

crate::kernel_args! {
    /// A depthwise convolution of `c` channels, `ih x iw` to `oh x ow`.
    pub struct DepthwiseGeom {
        c: u32,
        ih: u32,
        iw: u32,
        oh: u32,
        ow: u32,
        kh: i32,
        kw: i32,
        sh: i32,
        sw: i32,
        dh: i32,
        dw: i32,
        ph: i32,
        pw: i32,
        /// Output elements: one thread each.
        total: u32,
        /// Planes (samples x channels): a block row each (strip and general kernels).
        planes: u32,
        /// Tiles: strips of outputs per row, bands of rows per plane, tiles in all.
        strips: u32,
        bands: u32,
        items: u32,
        div_strips: FastDiv,
        div_bands: FastDiv,
        div_c: FastDiv,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "depthwise",
    source: include_str!("../../../kernels/depthwise.cu"),
    args: DepthwiseGeom::declaration,
};

/// A depthwise convolution on the device (module doc). Inputs: data, kernel (OIHW), bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaDepthwise(pub Conv);

/// The convolutions marked [`Depthwise`] (on f32 or f16).
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    match node.op_as::<Depthwise>() {
        Some(Depthwise(conv)) if super::is_float_kernel_type(dt) => {
            Ok(Some(Box::new(CudaDepthwise(conv.clone()))))
        }
        _ => Ok(None),
    }
}

device_op!(CudaDepthwise);

impl DeviceOp for CudaDepthwise {
    const NAME: &'static str = "CudaDepthwise";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        ensure!(inputs.len() == 3, "{op}: data, kernel and bias");
        let inputs = contiguous_floats(&inputs, op)?;
        let (x, k, b) = (inputs[0], inputs[1], inputs[2]);
        let dt = x.datum_type();
        let suffix = super::float_kernel(dt, op)?;
        let spec = &self.0.pool_spec;
        let shape = x.shape();
        ensure!(
            shape.len() == 4 && k.len() == shape[1] * spec.kernel_shape.iter().product::<usize>(),
            "{op}: input {shape:?} and kernel {:?} are not one 2-D filter per channel",
            k.shape()
        );
        ensure!(
            b.len() == shape[1],
            "{op}: {} biases for {} channels",
            b.len(),
            shape[1]
        );
        ensure!(
            spec.kernel_shape.iter().product::<usize>() <= MAX_TAPS,
            "{op}: filters of more than {MAX_TAPS} taps"
        );
        let padding = spec.computed_padding(&shape[2..]);
        let output_shape = [
            shape[0],
            shape[1],
            padding[0].convoluted,
            padding[1].convoluted,
        ];
        let output = make_tensor_for_node(ctx, dt, &output_shape)?;
        let total = output.len();
        ensure!(
            total <= i32::MAX as usize && x.len() <= i32::MAX as usize,
            "{op}: tensors of 2^31 elements or more are not supported"
        );
        if total > 0 {
            let int = |v: usize| v as i32;
            let mut geom = DepthwiseGeom {
                c: shape[1] as u32,
                ih: shape[2] as u32,
                iw: shape[3] as u32,
                oh: output_shape[2] as u32,
                ow: output_shape[3] as u32,
                kh: int(spec.kernel_shape[0]),
                kw: int(spec.kernel_shape[1]),
                sh: int(spec.stride(0)),
                sw: int(spec.stride(1)),
                dh: int(spec.dilation(0)),
                dw: int(spec.dilation(1)),
                ph: int(padding[0].pad_before),
                pw: int(padding[1].pad_before),
                total: total as u32,
                planes: (shape[0] * shape[1]) as u32,
                strips: 0,
                bands: 0,
                items: 0,
                div_strips: [0; 2],
                div_bands: [0; 2],
                div_c: [0; 2],
            };
            // Chunks of 4 elements: float4 or f16x4.
            let aligned = [x, &output]
                .iter()
                .all(|t| t.buffer_offset::<usize>() % (4 * dt.size_of()) == 0);
            let (name, cfg) = match Tile::of(spec, &geom, aligned) {
                Some(tile) => {
                    geom.strips = geom.ow.div_ceil(tile.outputs);
                    geom.bands = geom.oh.div_ceil(tile.rows);
                    // At most one tile per output element: below 2^31 (checked above).
                    geom.items = geom.planes * geom.bands * geom.strips;
                    geom.div_strips = fast_div(geom.strips);
                    geom.div_bands = fast_div(geom.bands);
                    geom.div_c = fast_div(geom.c);
                    let cfg = LaunchConfig {
                        grid_dim: (geom.items.div_ceil(128), 1, 1),
                        block_dim: (128, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    (tile.kernel(suffix), cfg)
                }
                None => {
                    // Unit stride and dilation along the width: a strip of outputs per thread.
                    let strip =
                        spec.stride(1) == 1 && spec.dilation(1) == 1 && spec.kernel_shape[1] <= 7;
                    let (name, per_plane) = if strip {
                        (
                            format!("ragged_depthwise_{suffix}_s1"),
                            output_shape[2] * output_shape[3].div_ceil(4),
                        )
                    } else {
                        (
                            format!("ragged_depthwise_{suffix}"),
                            output_shape[2] * output_shape[3],
                        )
                    };
                    let planes = shape[0] * shape[1];
                    let rows = planes.min(65535);
                    let cfg = LaunchConfig {
                        grid_dim: (
                            per_plane.div_ceil(256).clamp(1, 65535) as u32,
                            rows as u32,
                            planes.div_ceil(rows) as u32,
                        ),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    (name, cfg)
                }
            };
            // SAFETY: ragged_depthwise_{f32,f16}*(x, k, b, y, DepthwiseGeom): x is [N, c, ih,
            // iw], k c filters of kh x kw (at most MAX_TAPS; K x K for a tile), b c biases, y
            // `total` of [N, c, oh, ow], all contiguous and of one type (checked above); a
            // block row per plane, rows past the last plane leave; a thread per tile, those
            // past `items` leave; a tile's reads and writes of 4 elements on rows aligned to
            // 4 elements (`Tile::of`).
            unsafe { launch(&KERNELS, &name, cfg, &[x, k, b, &output], &geom) }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

/// A tile of `rows` output rows x `outputs` outputs per thread (`depthwise_tile` in
/// kernels/depthwise.cu), for the convolutions its kernels are instantiated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tile {
    taps: u32,
    stride: u32,
    rows: u32,
    outputs: u32,
}

impl Tile {
    /// The tile for `geom`, where one applies: a "same" square filter of 3, 5 or 7 taps
    /// (padding before of (taps - 1) / 2 along the width), unit dilation, width stride 1
    /// or 2, input rows of a multiple of 4 with `aligned` tensors (float4 chunks). Bands of
    /// several rows need unit stride along the height. The shapes measured best on the
    /// H200 (benches/depthwise/bench.cu): 8 outputs at width stride 1, 4 at 2; bands of 2
    /// rows, 3 for 5 x 5 filters.
    fn of(
        spec: &tract_core::ops::cnn::PoolSpec,
        geom: &DepthwiseGeom,
        aligned: bool,
    ) -> Option<Tile> {
        let taps = geom.kw;
        let applies = matches!(taps, 3 | 5 | 7)
            && geom.kh == taps
            && geom.pw == (taps - 1) / 2
            && spec.dilation(0) == 1
            && spec.dilation(1) == 1
            && matches!(geom.sw, 1 | 2)
            && geom.iw.is_multiple_of(4)
            && aligned;
        if !applies {
            return None;
        }
        let rows = match (geom.sh, taps) {
            (1, 5) => 3,
            (1, _) => 2,
            _ => 1,
        };
        Some(Tile {
            taps: taps as u32,
            stride: geom.sw as u32,
            rows,
            outputs: if geom.sw == 1 { 8 } else { 4 },
        })
    }

    /// Its kernel's name for elements of `suffix` (`f32`, `f16`: `DEPTHWISE_TILE`
    /// instantiates every [`Tile::of`] may give, for both).
    fn kernel(&self, suffix: &str) -> String {
        format!(
            "ragged_depthwise_{suffix}_k{}s{}r{}",
            self.taps, self.stride, self.rows
        )
    }
}

impl TypedOp for CudaDepthwise {
    /// The convolution's own (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| self.0.output_facts(facts))
    }

    as_op!();
}
