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
