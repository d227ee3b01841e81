// Resampling one axis of a resize, by the plan tract makes for it on the host: each
// output position is the sum of `window` input positions times their weights, or the
// extrapolation value. The tensor is [outer, len, inner], contiguous; one thread per
// output element.
//
// Same bits as tract's CPU resize: the taps of weight zero skipped, the others added in
// order, each product rounded before the sum (no multiply-add). f16 tensors are read and
// written as f16 and summed in f32 (the weights are f32).

#include "common.cuh"
#include "args.cuh"

template <typename TI, typename TO>
__device__ void resample(const TI *x, TO *y, const int *indices, const float *weights,
                         const int *extrapolated, const ResampleGeom &g)
{
    FOR_EACH(i, g.total) {
        const i64 k = i % g.inner;
        const i64 o = (i / g.inner) % g.len_out;
        const i64 b = i / (g.inner * g.len_out);
        float acc = 0.0f;
        if (extrapolated[o]) {
            acc = g.extrapolation;
        } else {
            const TI *src = x + b * g.len_in * g.inner + k;
            for (i64 t = 0; t < g.window; t++) {
                const float w = weights[o * g.window + t];
                if (w == 0.0f) continue;
                acc = __fadd_rn(acc, __fmul_rn(w, to_f32(src[(i64)indices[o * g.window + t] * g.inner])));
            }
        }
        y[i] = from_f32<TO>(acc);
    }
}

// ragged_resample_{in}_{out}: one axis from a tensor of `in` to one of `out`; several axes
// go through f32 tensors, as tract's CPU resizes an f16 tensor in f32 and rounds it once.
#define RESAMPLE(NAME, TI, TO)                                                            \
extern "C" __global__ void NAME(const TI *x, TO *y, const int *indices,                   \
                                const float *weights, const int *extrapolated,            \
                                const ResampleGeom g)                                     \
{                                                                                         \
    resample(x, y, indices, weights, extrapolated, g);                                    \
}

RESAMPLE(ragged_resample_f32_f32, float, float)
RESAMPLE(ragged_resample_f16_f16, f16, f16)
RESAMPLE(ragged_resample_f16_f32, f16, float)
RESAMPLE(ragged_resample_f32_f16, float, f16)
