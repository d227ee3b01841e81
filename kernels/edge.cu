// Edge replication: every position past a sample's width along one or two ragged axes
// reads the sample's last valid position there (clamped coordinates), as an op clamping
// its reads to the extent would read for the sample alone; or, mirrored, the position as
// far before the last valid one as it is past it (a reflect pad's).
//
// One thread per element of a contiguous tensor; a ragged axis by its stride, its extent
// and its row in the widths table (row < 0: no second axis).

#include "common.cuh"
#include "args.cuh"

// How far back position c, past width w, reads: to the last valid position w - 1, or
// mirrored about it to 2(w - 1) - c, at most to position 0.
__device__ __forceinline__ i64 back(i64 c, i64 w, i64 reflect)
{
    const i64 d = c - (w - 1);
    return reflect ? (2 * d < c ? 2 * d : c) : d;
}

#define EDGE_KERNEL(NAME, T)                                                              \
extern "C" __global__ void NAME(const T *x, T *y, const i64 *table, const EdgeGeom g)     \
{                                                                                         \
    FOR_EACH(i, g.total) {                                                                \
        const i64 n = coord(i, g.batch_stride, g.batch_dim);                              \
        i64 src = i;                                                                      \
        const i64 c0 = coord(i, g.a0_stride, g.a0_dim);                                   \
        const i64 w0 = table[g.a0_row * g.table_n + n];                                   \
        if (w0 >= 1 && c0 >= w0) src -= back(c0, w0, g.reflect) * g.a0_stride;            \
        if (g.a1_row >= 0) {                                                              \
            const i64 c1 = coord(i, g.a1_stride, g.a1_dim);                               \
            const i64 w1 = table[g.a1_row * g.table_n + n];                               \
            if (w1 >= 1 && c1 >= w1) src -= back(c1, w1, g.reflect) * g.a1_stride;        \
        }                                                                                 \
        y[i] = x[src];                                                                    \
    }                                                                                     \
}

FOR_EACH_ELEMENT_SIZE(EDGE_KERNEL, ragged_edge)
