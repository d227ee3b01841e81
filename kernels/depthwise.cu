// Depthwise 2-D convolution (one filter per channel), channels first, f32 or f16 (read into
// f32, summed in f32, rounded to f16 once): each output element sums its window of its own
// channel, then adds the channel's bias.
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
template <typename T>
__device__ __forceinline__ void stage_filter(float *filter, const T *k, unsigned c,
                                             const DepthwiseGeom &g)
{
    const int taps = g.kh * g.kw;
    for (int j = threadIdx.x; j < taps; j += blockDim.x) filter[j] = to_f32(k[(u64)c * taps + j]);
    __syncthreads();
}

// Four consecutive elements from a row at a 4-element aligned chunk, and back.
__device__ __forceinline__ float4 load4(const float *row, unsigned chunk)
{
    return __ldg(reinterpret_cast<const float4 *>(row) + chunk);
}
__device__ __forceinline__ float4 load4(const f16 *row, unsigned chunk)
{
    const f16x4 h = reinterpret_cast<const f16x4 *>(row)[chunk];
    return make_float4(to_f32(h.x), to_f32(h.y), to_f32(h.z), to_f32(h.w));
}
__device__ __forceinline__ void store4(float *o, float a, float b, float c, float d)
{
    *reinterpret_cast<float4 *>(o) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(f16 *o, float a, float b, float c, float d)
{
    f16x4 h;
    h.x = from_f32<f16>(a); h.y = from_f32<f16>(b); h.z = from_f32<f16>(c); h.w = from_f32<f16>(d);
    *reinterpret_cast<f16x4 *>(o) = h;
}
__device__ __forceinline__ float ldg_f32(const float *p) { return __ldg(p); }
__device__ __forceinline__ float ldg_f32(const f16 *p)
{
    f16 h;
    h.bits = __ldg(&p->bits);
    return to_f32(h);
}

template <typename T>
__device__ void depthwise(const T *x, const T *k, const T *b, T *y, const DepthwiseGeom &g)
{
    const unsigned plane = blockIdx.y + blockIdx.z * gridDim.y;
    if (plane >= g.planes) return;
    const unsigned c = plane % g.c;
    __shared__ float filter[DEPTHWISE_MAX_TAPS];
    stage_filter(filter, k, c, g);
    const T *in = x + (u64)plane * g.ih * g.iw;
    T *out = y + (u64)plane * g.oh * g.ow;
    const float bias = to_f32(b[c]);
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
                acc += to_f32(in[yy * g.iw + xx]) * filter[a * g.kw + t];
            }
        }
        out[j] = from_f32<T>(acc + bias);
    }
}

// Unit stride and dilation along the width, filters of at most 7 columns: each thread
// computes STRIP consecutive outputs of a row from one window of the input row held in
// registers (kw + STRIP - 1 loads instead of kw x STRIP). Out-of-bounds columns read as
// zero and their products are added (a zero: the same sum, up to the sign of a zero);
// each element's summation order is the general kernel's, rows then columns.
#define STRIP 4
#define S1_MAX_KW 7

template <typename T>
__device__ void depthwise_s1(const T *x, const T *k, const T *b, T *y, const DepthwiseGeom &g)
{
    const unsigned plane = blockIdx.y + blockIdx.z * gridDim.y;
    if (plane >= g.planes) return;
    const unsigned c = plane % g.c;
    __shared__ float filter[DEPTHWISE_MAX_TAPS];
    stage_filter(filter, k, c, g);
    const T *in = x + (u64)plane * g.ih * g.iw;
    T *out = y + (u64)plane * g.oh * g.ow;
    const float bias = to_f32(b[c]);
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
            const T *row = in + yy * g.iw;
            float win[S1_MAX_KW + STRIP - 1];
#pragma unroll
            for (int q = 0; q < S1_MAX_KW + STRIP - 1; q++) {
                const int xx = x0 + q;
                win[q] = (q < g.kw + STRIP - 1 && xx >= 0 && xx < (int)g.iw) ? to_f32(row[xx]) : 0.0f;
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
            if (ow0 + r < (int)g.ow) out[oh * g.ow + ow0 + r] = from_f32<T>(acc[r] + bias);
        }
    }
}

#define DEPTHWISE_GENERAL(T, SUFFIX)                                                                  \
    extern "C" __global__ void ragged_depthwise_##SUFFIX(const T *x, const T *k, const T *b, T *y,    \
                                                         const DepthwiseGeom g)                       \
    {                                                                                                 \
        depthwise(x, k, b, y, g);                                                                     \
    }                                                                                                 \
    extern "C" __global__ void ragged_depthwise_##SUFFIX##_s1(const T *x, const T *k, const T *b,     \
                                                              T *y, const DepthwiseGeom g)            \
    {                                                                                                 \
        depthwise_s1(x, k, b, y, g);                                                                  \
    }
DEPTHWISE_GENERAL(float, f32)
DEPTHWISE_GENERAL(f16, f16)

// "Same" square filters of 3, 5 or 7 taps, unit dilation, width strides of 1 or 2, rows
// whose width is a multiple of 4 (aligned chunks of 4): each thread computes a tile of RB
// output rows x ST outputs, from the input rows its tile's windows cover, each read once
// as aligned chunks of 4 (float4, or f16x4) (a chunk is inside the row or wholly outside it: zeros) into
// registers; the filter in registers. The index is flattened over (plane, band of RB rows,
// strip of ST outputs), so that planes of a few rows fill their blocks. Each element's
// summation order is the general kernel's (rows, then columns, in increasing order; zeros
// where the window leaves the row): its bits are the strip kernel's, which
// benches/depthwise/bench.cu checks on PP-OCRv4 rec's layers. RB > 1 needs unit stride
// along the height (the host picks RB = 1 otherwise).
template <typename T, int K, int SW, int RB, int ST>
__device__ __forceinline__ void depthwise_tile(const T *__restrict__ x, const T *__restrict__ k,
                                                const T *__restrict__ b, T *__restrict__ y,
                                                const DepthwiseGeom &g)
{
    constexpr int PW = (K - 1) / 2;
    constexpr int OFF = (4 - PW % 4) % 4;
    constexpr int SPAN = SW * (ST - 1) + K;
    constexpr int NW = (OFF + SPAN + 3) / 4;
    const unsigned j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= g.items) return;
    const unsigned row = fast_div(j, g.div_strips), s = j - row * g.strips;
    const unsigned plane = fast_div(row, g.div_bands), band = row - plane * g.bands;
    const unsigned c = fast_mod(plane, g.c, g.div_c);
    float f[K * K];
#pragma unroll
    for (int q = 0; q < K * K; q++) f[q] = ldg_f32(k + (u64)c * (K * K) + q);
    const T *in = x + (u64)plane * g.ih * g.iw;
    const int a0 = (int)s * (ST * SW) - PW - OFF;
    float acc[RB][ST];
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
        for (int q = 0; q < ST; q++) acc[r][q] = 0.0f;
    const int oh0 = (int)band * RB;
    // Input rows i from the band's first window's top: output row r reads rows r .. r + K - 1
    // (RB > 1 only at unit stride along the height, which the host checks), each in
    // increasing order, each row's columns in increasing order: the general kernel's order.
    constexpr int ROWS_IN = RB - 1 + K;
    const int top = oh0 * g.sh - g.ph;
#pragma unroll
    for (int i = 0; i < ROWS_IN; i++) {
        const int yy = top + i;
        if (yy < 0 || yy >= (int)g.ih) continue;
        const T *rowp = in + (u64)yy * g.iw;
        float win[4 * NW];
#pragma unroll
        for (int q = 0; q < NW; q++) {
            const int col = a0 + 4 * q;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (col >= 0 && col < (int)g.iw) v = load4(rowp, (unsigned)col >> 2);
            win[4 * q] = v.x; win[4 * q + 1] = v.y; win[4 * q + 2] = v.z; win[4 * q + 3] = v.w;
        }
#pragma unroll
        for (int r = 0; r < RB; r++) {
            const int a = i - r;
            if (a < 0 || a >= K) continue;
#pragma unroll
            for (int t = 0; t < K; t++) {
                const float w = f[a * K + t];
#pragma unroll
                for (int q = 0; q < ST; q++) acc[r][q] = fmaf(win[OFF + q * SW + t], w, acc[r][q]);
            }
        }
    }
    const float bias = ldg_f32(b + c);
    T *out = y + (u64)plane * g.oh * g.ow;
    const int ow0 = (int)s * ST;
#pragma unroll
    for (int r = 0; r < RB; r++) {
        const int oh = oh0 + r;
        if (oh >= (int)g.oh) break;
        T *o = out + (u64)oh * g.ow + ow0;
        if ((g.ow & 3) == 0) {
#pragma unroll
            for (int q = 0; q < ST; q += 4)
                if (ow0 + q < (int)g.ow)
                    store4(o + q, acc[r][q] + bias, acc[r][q + 1] + bias, acc[r][q + 2] + bias,
                           acc[r][q + 3] + bias);
        } else {
#pragma unroll
            for (int q = 0; q < ST; q++)
                if (ow0 + q < (int)g.ow) o[q] = from_f32<T>(acc[r][q] + bias);
        }
    }
}

#define DEPTHWISE_TILE_T(T, SUFFIX, K, SW, RB, ST)                                                    \
    extern "C" __global__ void ragged_depthwise_##SUFFIX##_k##K##s##SW##r##RB(                        \
        const T *x, const T *k, const T *b, T *y, const DepthwiseGeom g)                             \
    {                                                                                                 \
        depthwise_tile<T, K, SW, RB, ST>(x, k, b, y, g);                                              \
    }
#define DEPTHWISE_TILE(K, SW, RB, ST)                                                                 \
    DEPTHWISE_TILE_T(float, f32, K, SW, RB, ST) DEPTHWISE_TILE_T(f16, f16, K, SW, RB, ST)
// The tiles measured best on the H200 (NOTES): 8 outputs wide at width stride 1, 4 at 2;
// bands of 2 rows (3 for 5 x 5 filters) at height stride 1.
DEPTHWISE_TILE(3, 1, 1, 8) DEPTHWISE_TILE(3, 1, 2, 8) DEPTHWISE_TILE(3, 2, 1, 4) DEPTHWISE_TILE(3, 2, 2, 4)
DEPTHWISE_TILE(5, 1, 1, 8) DEPTHWISE_TILE(5, 1, 3, 8) DEPTHWISE_TILE(5, 2, 1, 4) DEPTHWISE_TILE(5, 2, 3, 4)
DEPTHWISE_TILE(7, 1, 1, 8) DEPTHWISE_TILE(7, 1, 2, 8) DEPTHWISE_TILE(7, 2, 1, 4) DEPTHWISE_TILE(7, 2, 2, 4)
