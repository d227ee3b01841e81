// Around cuDNN's recurrences: what it does not do itself.
//
// cuDNN has no single reverse direction. A sample of length l runs it as the forward
// direction over its steps reversed within its length (step t reads step l-1-t), and its
// outputs are reversed back the same way; steps past l are zero, as cuDNN leaves them.
// The tensor is [T, N, V] (sequence major) or [N, T, V] (batch major), contiguous: the
// steps `t_stride` apart, the samples `n_stride` apart.

#include "common.cuh"
#include "args.cuh"

extern "C" __global__ void ragged_reverse_f32(const float *x, float *y, const int *lengths, const ReverseGeom g)
{
    FOR_EACH(i, g.total) {
        const i64 v = i % g.vector;
        const i64 t = coord(i, g.t_stride, g.t);
        const i64 n = coord(i, g.n_stride, g.n);
        const i64 l = lengths[n];
        float value = 0.0f;
        if (t < l) value = x[(l - 1 - t) * g.t_stride + n * g.n_stride + v];
        y[i] = value;
    }
}
