// Pads in edge and reflect modes (ONNX's `Pad`, tract's `PadMode::Edge` / `Reflect`):
// every output position reads the input at its coordinates less the padding before,
// clamped into the input (edge) or mirrored about its first and last positions without
// repeating them (reflect), axis by axis. Constant pads are tract-gpu's.
//
// One thread per output element of a contiguous tensor; an axis by its output stride and
// extent, its input stride and extent, and its padding before.

#include "common.cuh"
#include "args.cuh"

// The input coordinate an output coordinate `o` reads along an axis of input extent `n`
// padded by `before`: clamped (edge) or mirrored (reflect: -1 reads 1, n reads n - 2).
// The host checks that a reflect pad is shorter than the extent, so one mirror suffices.
__device__ __forceinline__ i64 source(i64 o, i64 before, i64 n, i64 reflect)
{
    const i64 c = o - before;
    if (c < 0) return reflect ? -c : 0;
    if (c >= n) return reflect ? 2 * (n - 1) - c : n - 1;
    return c;
}

#define PAD_KERNEL(NAME, T)                                                               \
extern "C" __global__ void NAME(const T *x, T *y, const PadGeom g)                        \
{                                                                                         \
    FOR_EACH(i, g.total) {                                                                \
        i64 src = 0;                                                                      \
        for (int a = 0; a < g.rank; a++) {                                                \
            const i64 o = coord(i, g.out_stride[a], g.out_dim[a]);                        \
            src += source(o, g.before[a], g.in_dim[a], g.reflect) * g.in_stride[a];       \
        }                                                                                 \
        y[i] = x[src];                                                                    \
    }                                                                                     \
}

FOR_EACH_ELEMENT_SIZE(PAD_KERNEL, ragged_pad)
