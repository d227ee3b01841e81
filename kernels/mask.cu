// The ragged mask: a copy of the input with a fill value past each sample's width.
//
// The mask selects, it does not multiply: NaN or infinities in the padded region are
// replaced. One kernel per element size: a mask moves bits, whatever they encode, and the
// fill comes as the bits of a value of the tensor's type.
//
// The widths table is `[K, N]` i64 on the device, row-major; the tensor is contiguous.
// Up to two ragged axes (attention scores carry the width twice); r1_row < 0 when one.

#include "common.cuh"

#define RAGGED_MASK(NAME, T)                                                            \
extern "C" __global__ void NAME(                                                        \
    const T *x, T *y, const i64 *table, i64 total, i64 table_n,                         \
    i64 batch_stride, i64 batch_dim,                                                    \
    i64 r0_stride, i64 r0_dim, i64 r0_row,                                              \
    i64 r1_stride, i64 r1_dim, i64 r1_row,                                              \
    T fill)                                                                             \
{                                                                                       \
    FOR_EACH(i, total) {                                                                \
        const i64 n = coord(i, batch_stride, batch_dim);                                \
        bool pad = coord(i, r0_stride, r0_dim) >= table[r0_row * table_n + n];          \
        if (r1_row >= 0) pad = pad || coord(i, r1_stride, r1_dim) >= table[r1_row * table_n + n]; \
        y[i] = pad ? fill : x[i];                                                       \
    }                                                                                   \
}

RAGGED_MASK(ragged_mask_b1, unsigned char)
RAGGED_MASK(ragged_mask_b2, unsigned short)
RAGGED_MASK(ragged_mask_b4, unsigned int)
RAGGED_MASK(ragged_mask_b8, u64)
