// The ragged mask: a copy of the input with a fill value past each sample's width.
//
// The mask selects, it does not multiply: NaN or infinities in the padded region are
// replaced. One kernel per element size: a mask moves bits, whatever they encode, and the
// fill comes as the bits of a value of the tensor's type, in the low bytes of `fill`.
//
// The widths table is `[K, N]` i64 on the device, row-major; the tensor is contiguous.
// Up to two ragged axes (attention scores carry the width twice); r1_row < 0 when one.
//
// Index arithmetic is 32-bit (the host refuses tensors of 2^31 elements or more): a
// 64-bit division costs several times a 32-bit one, and with three of them per element
// a 64-bit kernel runs far below the memory bandwidth.

#include "common.cuh"
#include "args.cuh"

#define RAGGED_MASK(NAME, T)                                                             \
extern "C" __global__ void NAME(const T *x, T *y, const i64 *table, const MaskGeom g)    \
{                                                                                        \
    const T fill = (T)g.fill;                                                            \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < g.total;                \
         i += gridDim.x * blockDim.x) {                                                  \
        const unsigned n = (i / g.batch_stride) % g.batch_dim;                           \
        bool pad = (i64)((i / g.r0_stride) % g.r0_dim) >= table[g.r0_row * g.table_n + n]; \
        if (g.r1_row >= 0)                                                               \
            pad = pad || (i64)((i / g.r1_stride) % g.r1_dim) >= table[g.r1_row * g.table_n + n]; \
        y[i] = pad ? fill : x[i];                                                        \
    }                                                                                    \
}

FOR_EACH_ELEMENT_SIZE(RAGGED_MASK, ragged_mask)

// The common case in rows: one ragged axis, after the batch axis. The tensor is `rows`
// rows (the axes up to the ragged one) of `row_len` elements (the ragged axis and the
// axes after it, `inner` elements per step of the ragged axis); a row belongs to sample
// (row / rows_per_sample) % batch_dim and keeps its first width x inner elements. One
// division per row instead of four per element.
#define RAGGED_MASK_ROWS(NAME, T)                                                        \
extern "C" __global__ void NAME(const T *x, T *y, const i64 *table, const MaskRowsGeom g) \
{                                                                                        \
    const T fill = (T)g.fill;                                                            \
    for (unsigned r = blockIdx.y; r < g.rows; r += gridDim.y) {                          \
        const unsigned n = (r / g.rows_per_sample) % g.batch_dim;                        \
        const i64 kept = table[g.row * g.table_n + n] * (i64)g.inner;                    \
        const unsigned keep = kept < 0 ? 0u : (kept > g.row_len ? g.row_len : (unsigned)kept); \
        const T *xr = x + (u64)r * g.row_len;                                            \
        T *yr = y + (u64)r * g.row_len;                                                  \
        for (unsigned j = blockIdx.x * blockDim.x + threadIdx.x; j < g.row_len;          \
             j += gridDim.x * blockDim.x)                                                \
            yr[j] = j < keep ? xr[j] : fill;                                             \
    }                                                                                    \
}

FOR_EACH_ELEMENT_SIZE(RAGGED_MASK_ROWS, ragged_mask_rows)
