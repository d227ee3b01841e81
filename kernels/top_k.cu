// The top k of each row along the last axis (ops::TopK): one warp per row; each pick is
// the best of the row among what comes after the previous pick in the order (greater
// value, or equal value and lower position), as the CPU picks: the same values and
// positions, bit for bit. A NaN is never picked; a row with nothing left gives NaN at -1.

#include "common.cuh"
#include "args.cuh"

// Whether (v, i) comes before (bv, bi) in the order; bi < 0: nothing yet.
__device__ __forceinline__ bool top_before(float v, i64 i, float bv, i64 bi) {
    if (bi < 0) return !isnan(v);
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void ragged_top_k_f32(const float *x, float *values, i64 *positions,
                                            const TopKGeom g)
{
    const i64 row = (blockIdx.x * (i64)blockDim.x + threadIdx.x) / WARP;
    const int lane = threadIdx.x % WARP;
    // The whole warp has the same row: it leaves together.
    if (row >= g.rows) return;
    const float *r = x + row * g.classes;
    float pv = 0.0f;
    i64 pi = -2; // -2: no previous pick; -1: nothing left
    for (i64 k = 0; k < g.k; k++) {
        float bv = 0.0f;
        i64 bi = -1;
        if (pi != -1) {
            for (i64 i = lane; i < g.classes; i += WARP) {
                const float v = r[i];
                const bool after = pi == -2 || (!top_before(v, i, pv, pi) && !(v == pv && i == pi));
                if (after && top_before(v, i, bv, bi)) {
                    bv = v;
                    bi = i;
                }
            }
        }
        for (int o = WARP / 2; o > 0; o >>= 1) {
            const float ov = __shfl_down_sync(0xffffffff, bv, o);
            const i64 oi = __shfl_down_sync(0xffffffff, bi, o);
            if (oi >= 0 && top_before(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        bv = __shfl_sync(0xffffffff, bv, 0);
        bi = __shfl_sync(0xffffffff, bi, 0);
        if (lane == 0) {
            values[row * g.k + k] = bi < 0 ? __int_as_float(0x7fc00000) : bv;
            positions[row * g.k + k] = bi;
        }
        if (bi < 0) {
            pi = -1;
        } else {
            pv = bv;
            pi = bi;
        }
    }
}
