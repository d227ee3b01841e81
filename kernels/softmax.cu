// Softmax over a ragged axis, each row over its sample's valid prefix only; f32 or f16
// (computed in f32).
//
// A row is `len` elements `inner` apart in a contiguous tensor; one block per row.
// Positions past the width are 0, and so is every position of a row lying in the padded
// region of another ragged axis (o_row >= 0): the queries past a sample's width in
// attention scores.

#include "common.cuh"
#include "args.cuh"

template <typename T>
__device__ void softmax(const T *x, T *y, const i64 *table, const SoftmaxGeom &g)
{
    __shared__ float shared[WARP];
    const i64 len = g.len, inner = g.inner;
    const int log_softmax = g.log_softmax;
    const i64 r = blockIdx.x;
    const i64 base = (r / inner) * len * inner + r % inner;
    const i64 n = coord(base, g.batch_stride, g.batch_dim);
    i64 w = table[g.w_row * g.table_n + n];
    if (w > len) w = len;
    if (g.o_row >= 0 && coord(base, g.o_stride, g.o_dim) >= table[g.o_row * g.table_n + n]) w = 0;

    float m = -RAGGED_INF;
    for (i64 l = threadIdx.x; l < w; l += blockDim.x) m = fmaxf(m, to_f32(x[base + l * inner]));
    m = block_max(m, shared);
    float s = 0.0f;
    for (i64 l = threadIdx.x; l < w; l += blockDim.x) s += expf(to_f32(x[base + l * inner]) - m);
    s = block_sum(s, shared);
    const float log_s = logf(s);
    for (i64 l = threadIdx.x; l < len; l += blockDim.x) {
        const i64 ix = base + l * inner;
        float v = 0.0f;
        if (l < w) {
            const float xv = to_f32(x[ix]);
            v = log_softmax ? xv - m - log_s : expf(xv - m) / s;
        }
        y[ix] = from_f32<T>(v);
    }
}

extern "C" __global__ void ragged_softmax_f32(const float *x, float *y, const i64 *table, const SoftmaxGeom g)
{
    softmax(x, y, table, g);
}

extern "C" __global__ void ragged_softmax_f16(const f16 *x, f16 *y, const i64 *table, const SoftmaxGeom g)
{
    softmax(x, y, table, g);
}
