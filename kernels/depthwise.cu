// Depthwise 2-D convolution (one filter per channel), channels first, f32: each output
// element sums its window of its own channel, then adds the channel's bias.
//
// tract-cuda runs every convolution through cuDNN with one fixed algorithm (implicit
// precomputed GEMM), which is slow on depthwise filters: 0.66 ms for a 5x5 one on a
// [32, 240, 12, 352] activation that a direct kernel reads and writes at the memory
// bandwidth. One thread per output element, along the width (coalesced), the window read
// through the caches; the summation order is fixed per element, whatever the batch.

#include "common.cuh"
#include "args.cuh"

extern "C" __global__ void ragged_depthwise_f32(const float *x, const float *k, const float *b,
                                                float *y, const DepthwiseGeom g)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < g.total; i += gridDim.x * blockDim.x) {
        const unsigned ow = i % g.ow;
        unsigned r = i / g.ow;
        const unsigned oh = r % g.oh;
        r /= g.oh;
        const unsigned c = r % g.c;
        const float *plane = x + (u64)r * g.ih * g.iw;
        const float *filter = k + (u64)c * g.kh * g.kw;
        const int y0 = (int)oh * g.sh - g.ph, x0 = (int)ow * g.sw - g.pw;
        float acc = 0.0f;
        for (int a = 0; a < g.kh; a++) {
            const int yy = y0 + a * g.dh;
            if (yy < 0 || yy >= (int)g.ih) continue;
            for (int t = 0; t < g.kw; t++) {
                const int xx = x0 + t * g.dw;
                if (xx < 0 || xx >= (int)g.iw) continue;
                acc += plane[yy * g.iw + xx] * filter[a * g.kw + t];
            }
        }
        y[i] = acc + b[c];
    }
}
