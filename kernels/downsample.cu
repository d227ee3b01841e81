// tract's Downsample: every `stride`-th position along one axis from `modulo` on (what a
// strided 1x1 convolution reads, once tract has split the stride off it). One thread per
// element of the output; a contiguous tensor as [outer, axis, inner].

#include "common.cuh"
#include "args.cuh"

#define DOWNSAMPLE_KERNEL(NAME, T)                                                        \
extern "C" __global__ void NAME(const T *x, T *y, const DownsampleGeom g)                 \
{                                                                                         \
    FOR_EACH(i, g.total) {                                                                \
        const i64 inner = i % g.inner;                                                    \
        const i64 c = (i / g.inner) % g.out_dim;                                          \
        const i64 outer = i / (g.inner * g.out_dim);                                      \
        y[i] = x[(outer * g.in_dim + c * g.stride + g.modulo) * g.inner + inner];        \
    }                                                                                     \
}

FOR_EACH_ELEMENT_SIZE(DOWNSAMPLE_KERNEL, downsample)
