// Resampling one axis of a resize, by the plan tract makes for it on the host: each
// output position is the sum of `window` input positions times their weights, or the
// extrapolation value. The tensor is [outer, len, inner], contiguous; one thread per
// output element.
//
// Same bits as tract's CPU resize: the taps of weight zero skipped, the others added in
// order, each product rounded before the sum (no multiply-add).

#include "common.cuh"
#include "args.cuh"

extern "C" __global__ void ragged_resample_f32(const float *x, float *y, const int *indices,
                                               const float *weights, const int *extrapolated,
                                               const ResampleGeom g)
{
    FOR_EACH(i, g.total) {
        const i64 k = i % g.inner;
        const i64 o = (i / g.inner) % g.len_out;
        const i64 b = i / (g.inner * g.len_out);
        float acc = 0.0f;
        if (extrapolated[o]) {
            acc = g.extrapolation;
        } else {
            const float *src = x + b * g.len_in * g.inner + k;
            for (i64 t = 0; t < g.window; t++) {
                const float w = weights[o * g.window + t];
                if (w == 0.0f) continue;
                acc = __fadd_rn(acc, __fmul_rn(w, src[(i64)indices[o * g.window + t] * g.inner]));
            }
        }
        y[i] = acc;
    }
}
