// tract's CumSum: running sums along one axis of a contiguous tensor seen as
// [outer, len, inner], forwards or backwards, inclusive or exclusive. One thread per line
// (each (outer, inner) pair), adding in the order tract's host kernel adds, so that float
// sums round alike. Lines are short in what exporters write (positions from an attention
// mask: a sequence's length).

#include "common.cuh"
#include "args.cuh"

#define CUMSUM_KERNEL(NAME, T)                                                            \
extern "C" __global__ void NAME(const T *x, T *y, const CumSumGeom g)                     \
{                                                                                         \
    FOR_EACH(line, g.lines) {                                                             \
        const i64 base = (line / g.inner) * g.len * g.inner + line % g.inner;             \
        T acc = 0;                                                                        \
        for (i64 k = 0; k < g.len; ++k) {                                                 \
            const i64 at = base + (g.reverse ? g.len - 1 - k : k) * g.inner;              \
            const T v = x[at];                                                            \
            if (g.exclusive) {                                                            \
                y[at] = acc;                                                              \
                acc += v;                                                                 \
            } else {                                                                      \
                acc += v;                                                                 \
                y[at] = acc;                                                              \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
}

CUMSUM_KERNEL(cumsum_i32, int)
CUMSUM_KERNEL(cumsum_i64, i64)
CUMSUM_KERNEL(cumsum_f32, float)
