// tract's GatherElements: for every coordinate of the indices, the data at that coordinate
// with the axis' coordinate replaced by the index found there (counted from the end when
// negative). One thread per element of the output (the indices' shape), over contiguous
// tensors of rank up to 6 (the host pads shorter shapes with leading ones). An index out
// of the axis reads nothing and gives 0: the device has no error to raise mid-kernel, and
// tract's host kernel fails there instead.

#include "common.cuh"
#include "args.cuh"

#define GATHER_ELEMENTS_KERNEL(NAME, T, I)                                                \
extern "C" __global__ void NAME(const T *data, const I *indices, T *y,                    \
                                const GatherElementsGeom g)                               \
{                                                                                         \
    FOR_EACH(o, g.total) {                                                                \
        i64 rest = o, at = 0;                                                             \
        for (int d = 5; d >= 0; --d) {                                                    \
            const i64 c = rest % g.out_dims[d];                                           \
            rest /= g.out_dims[d];                                                        \
            if (d != g.axis) at += c * g.data_strides[d];                                 \
        }                                                                                 \
        i64 ix = (i64)indices[o];                                                         \
        if (ix < 0) ix += g.axis_dim;                                                     \
        y[o] = (ix >= 0 && ix < g.axis_dim) ? data[at + ix * g.data_strides[g.axis]]      \
                                            : (T)0;                                       \
    }                                                                                     \
}

#define GATHER_ELEMENTS_I64(NAME, T) GATHER_ELEMENTS_KERNEL(NAME, T, i64)
#define GATHER_ELEMENTS_I32(NAME, T) GATHER_ELEMENTS_KERNEL(NAME, T, int)
FOR_EACH_ELEMENT_SIZE(GATHER_ELEMENTS_I64, gather_elements_i64)
FOR_EACH_ELEMENT_SIZE(GATHER_ELEMENTS_I32, gather_elements_i32)
