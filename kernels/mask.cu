// The ragged mask: a copy of the input with a fill value past each sample's width.
//
// The mask selects, it does not multiply: NaN or infinities in the padded region are
// replaced. One kernel per element size: a mask moves bits, whatever they encode, and the
// fill comes as the bits of a value of the tensor's type.
//
// The widths table is `[K, N]` i64 on the device, row-major; the tensor is contiguous.
// Up to two ragged axes (attention scores carry the width twice); r1_row < 0 when one.
//
// Index arithmetic is 32-bit (the host refuses tensors of 2^31 elements or more): a
// 64-bit division costs several times a 32-bit one, and with three of them per element
// the 64-bit kernel ran far below the memory bandwidth.

#include "common.cuh"

#define RAGGED_MASK(NAME, T)                                                             \
extern "C" __global__ void NAME(                                                         \
    const T *x, T *y, const i64 *table, unsigned total, unsigned table_n,                \
    unsigned batch_stride, unsigned batch_dim,                                           \
    unsigned r0_stride, unsigned r0_dim, int r0_row,                                     \
    unsigned r1_stride, unsigned r1_dim, int r1_row,                                     \
    T fill)                                                                              \
{                                                                                        \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;                  \
         i += gridDim.x * blockDim.x) {                                                  \
        const unsigned n = (i / batch_stride) % batch_dim;                               \
        bool pad = (i64)((i / r0_stride) % r0_dim) >= table[r0_row * table_n + n];       \
        if (r1_row >= 0)                                                                 \
            pad = pad || (i64)((i / r1_stride) % r1_dim) >= table[r1_row * table_n + n]; \
        y[i] = pad ? fill : x[i];                                                        \
    }                                                                                    \
}

RAGGED_MASK(ragged_mask_b1, unsigned char)
RAGGED_MASK(ragged_mask_b2, unsigned short)
RAGGED_MASK(ragged_mask_b4, unsigned int)
RAGGED_MASK(ragged_mask_b8, u64)

// The common case in rows: one ragged axis, after the batch axis. The tensor is `rows`
// rows (the axes up to the ragged one) of `row_len` elements (the ragged axis and the
// axes after it, `inner` elements per step of the ragged axis); a row belongs to sample
// (row / rows_per_sample) % batch_dim and keeps its first width x inner elements. One
// division per row instead of four per element: the general kernel above ran at a tenth
// of the memory bandwidth on PP-OCRv4 rec.
#define RAGGED_MASK_ROWS(NAME, T)                                                        \
extern "C" __global__ void NAME(                                                         \
    const T *x, T *y, const i64 *table, unsigned rows, unsigned row_len, unsigned inner,\
    unsigned rows_per_sample, unsigned batch_dim, unsigned table_n, int row_ix, T fill)  \
{                                                                                        \
    for (unsigned r = blockIdx.y; r < rows; r += gridDim.y) {                            \
        const unsigned n = (r / rows_per_sample) % batch_dim;                            \
        const i64 kept = table[row_ix * table_n + n] * (i64)inner;                       \
        const unsigned keep = kept < 0 ? 0u : (kept > row_len ? row_len : (unsigned)kept); \
        const T *xr = x + (u64)r * row_len;                                              \
        T *yr = y + (u64)r * row_len;                                                    \
        for (unsigned j = blockIdx.x * blockDim.x + threadIdx.x; j < row_len;            \
             j += gridDim.x * blockDim.x)                                                \
            yr[j] = j < keep ? xr[j] : fill;                                             \
    }                                                                                    \
}

RAGGED_MASK_ROWS(ragged_mask_rows_b1, unsigned char)
RAGGED_MASK_ROWS(ragged_mask_rows_b2, unsigned short)
RAGGED_MASK_ROWS(ragged_mask_rows_b4, unsigned int)
RAGGED_MASK_ROWS(ragged_mask_rows_b8, u64)
