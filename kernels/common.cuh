// Shared helpers of tract-ragged's kernels.
//
// Compiled by NVRTC at first use, without any CUDA header: only builtins, so that a
// machine with the driver and NVRTC but no toolkit headers still compiles them.

typedef long long i64;
typedef unsigned long long u64;

#define RAGGED_INF __int_as_float(0x7f800000)
// The lowest finite float: what tract's max pools start from (T::min_value()), so that a
// window over nothing but padding gives what it gives on tract's CPU, not -inf.
#define RAGGED_LOWEST __int_as_float(0xff7fffff)
#define WARP 32

// Coordinate along an axis of a contiguous tensor, from a flat index: the axis' stride
// and extent.
__device__ __forceinline__ i64 coord(i64 flat, i64 stride, i64 dim) {
    return (flat / stride) % dim;
}

// n / d and n % d for n < 2^31, from d's multiplier and shift computed on the host
// (`FastDiv`, src/cuda/fastdiv.rs): a multiply-high, an add and a shift, where a division
// by a runtime divisor is some twenty instructions.
__device__ __forceinline__ unsigned fast_div(unsigned n, const unsigned (&f)[2]) {
    return (__umulhi(n, f[0]) + n) >> f[1];
}
__device__ __forceinline__ unsigned fast_mod(unsigned n, unsigned d, const unsigned (&f)[2]) {
    return n - fast_div(n, f) * d;
}

// Half precision without a header: an f16 is its 16 bits, converted to f32 when read and
// rounded to nearest even when written (PTX's cvt, as __half's conversions do). Kernels
// templated on the element type T (float or f16) compute in f32 either way:
// `to_f32(x[i])`, `y[i] = from_f32<T>(v)`.
struct f16 { unsigned short bits; };
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}
// An f32 value rounded to f16 and back: what an op computing in f16 gives, for +, -, *, /
// (f32 carries more than twice f16's precision, so rounding its result to f16 rounds the
// exact result: no double-rounding error).
__device__ __forceinline__ float round_f16(float v) { return to_f32(from_f32<f16>(v)); }
// Four f16 read or written at once (8 bytes, aligned): the half counterpart of float4.
struct alignas(8) f16x4 { f16 x, y, z, w; };
// The lowest finite value of T, in f32: what tract's max pools start from.
template <typename T> __device__ __forceinline__ float lowest();
template <> __device__ __forceinline__ float lowest<float>() { return RAGGED_LOWEST; }
template <> __device__ __forceinline__ float lowest<f16>() { return -65504.0f; }

// KERNEL(NAME_bK, T) for elements of K = 1, 2, 4 and 8 bytes: kernels that move bits
// whatever they encode (masks, pads, edge fills), one per element size.
#define FOR_EACH_ELEMENT_SIZE(KERNEL, NAME) \
    KERNEL(NAME##_b1, unsigned char)        \
    KERNEL(NAME##_b2, unsigned short)       \
    KERNEL(NAME##_b4, unsigned int)         \
    KERNEL(NAME##_b8, unsigned long long)

// Grid-stride loop over `total` items.
#define FOR_EACH(i, total) \
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (total); i += (i64)gridDim.x * blockDim.x)

__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// Block-wide reductions: every thread gets the result. `shared` holds one float per warp;
// the leading barrier lets a block call them back to back.
__device__ float block_max(float v, float *shared) {
    v = warp_max(v);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + WARP - 1) / WARP;
        v = warp_max(lane < warps ? shared[lane] : -RAGGED_INF);
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    return shared[0];
}

__device__ float block_sum(float v, float *shared) {
    v = warp_sum(v);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + WARP - 1) / WARP;
        v = warp_sum(lane < warps ? shared[lane] : 0.0f);
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    return shared[0];
}
