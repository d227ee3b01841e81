// Depthwise 2-D convolution (one filter per channel), channels first, f32: each output
// element sums its window of its own channel, then adds the channel's bias.
//
// tract-cuda runs every convolution through cuDNN with one fixed algorithm (implicit
// precomputed GEMM), which is slow on depthwise filters: 0.66 ms for a 5x5 one on a
// [32, 240, 12, 352] activation that a direct kernel reads and writes at the memory
// bandwidth. A block row per plane (sample x channel: no division to find it, its filter
// staged once in shared memory, its bias in a register), one thread per output element of
// the plane along the width (coalesced), the window read through the caches; the
// summation order is fixed per element, whatever the batch.

#include "common.cuh"
#include "args.cuh"

// The most taps a filter may have (7 x 7 and under; the host checks).
#define DEPTHWISE_MAX_TAPS 64

// Channel c's filter into the block's shared memory, for every thread of the block.
__device__ __forceinline__ void stage_filter(float *filter, const float *k, unsigned c,
                                             const DepthwiseGeom &g)
{
    const int taps = g.kh * g.kw;
    for (int j = threadIdx.x; j < taps; j += blockDim.x) filter[j] = k[(u64)c * taps + j];
    __syncthreads();
}

extern "C" __global__ void ragged_depthwise_f32(const float *x, const float *k, const float *b,
                                                float *y, const DepthwiseGeom g)
{
    const unsigned plane = blockIdx.y + blockIdx.z * gridDim.y;
    if (plane >= g.planes) return;
    const unsigned c = plane % g.c;
    __shared__ float filter[DEPTHWISE_MAX_TAPS];
    stage_filter(filter, k, c, g);
    const float *in = x + (u64)plane * g.ih * g.iw;
    float *out = y + (u64)plane * g.oh * g.ow;
    const float bias = b[c];
    const unsigned per_plane = g.oh * g.ow;
    for (unsigned j = blockIdx.x * blockDim.x + threadIdx.x; j < per_plane; j += gridDim.x * blockDim.x) {
        const unsigned oh = j / g.ow, ow = j - oh * g.ow;
        const int y0 = (int)oh * g.sh - g.ph, x0 = (int)ow * g.sw - g.pw;
        float acc = 0.0f;
        for (int a = 0; a < g.kh; a++) {
            const int yy = y0 + a * g.dh;
            if (yy < 0 || yy >= (int)g.ih) continue;
            for (int t = 0; t < g.kw; t++) {
                const int xx = x0 + t * g.dw;
                if (xx < 0 || xx >= (int)g.iw) continue;
                acc += in[yy * g.iw + xx] * filter[a * g.kw + t];
            }
        }
        out[j] = acc + bias;
    }
}

// Unit stride and dilation along the width, filters of at most 7 columns: each thread
// computes STRIP consecutive outputs of a row from one window of the input row held in
// registers (kw + STRIP - 1 loads instead of kw x STRIP). Out-of-bounds columns read as
// zero and their products are added (a zero: the same sum, up to the sign of a zero);
// each element's summation order is the general kernel's, rows then columns.
#define STRIP 4
#define S1_MAX_KW 7

extern "C" __global__ void ragged_depthwise_f32_s1(const float *x, const float *k, const float *b,
                                                   float *y, const DepthwiseGeom g)
{
    const unsigned plane = blockIdx.y + blockIdx.z * gridDim.y;
    if (plane >= g.planes) return;
    const unsigned c = plane % g.c;
    __shared__ float filter[DEPTHWISE_MAX_TAPS];
    stage_filter(filter, k, c, g);
    const float *in = x + (u64)plane * g.ih * g.iw;
    float *out = y + (u64)plane * g.oh * g.ow;
    const float bias = b[c];
    const unsigned strips = (g.ow + STRIP - 1) / STRIP;
    const unsigned per_plane = g.oh * strips;
    for (unsigned j = blockIdx.x * blockDim.x + threadIdx.x; j < per_plane; j += gridDim.x * blockDim.x) {
        const unsigned oh = j / strips, s = j - oh * strips;
        const int ow0 = (int)s * STRIP;
        const int y0 = (int)oh * g.sh - g.ph, x0 = ow0 - g.pw;
        float acc[STRIP];
#pragma unroll
        for (int r = 0; r < STRIP; r++) acc[r] = 0.0f;
        for (int a = 0; a < g.kh; a++) {
            const int yy = y0 + a * g.dh;
            if (yy < 0 || yy >= (int)g.ih) continue;
            const float *row = in + yy * g.iw;
            float win[S1_MAX_KW + STRIP - 1];
#pragma unroll
            for (int q = 0; q < S1_MAX_KW + STRIP - 1; q++) {
                const int xx = x0 + q;
                win[q] = (q < g.kw + STRIP - 1 && xx >= 0 && xx < (int)g.iw) ? row[xx] : 0.0f;
            }
#pragma unroll
            for (int t = 0; t < S1_MAX_KW; t++) {
                if (t < g.kw) {
                    const float f = filter[a * g.kw + t];
#pragma unroll
                    for (int r = 0; r < STRIP; r++) acc[r] += win[t + r] * f;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < STRIP; r++) {
            if (ow0 + r < (int)g.ow) out[oh * g.ow + ow0 + r] = acc[r] + bias;
        }
    }
}
