// Max, sum and average pooling over up to three spatial axes, channels first (NCHW) or
// last (NHWC), with ONNX semantics: padding, strides, dilations, ceil mode, and both
// count_include_pad conventions.
//
// Along a ragged axis (its table row in rows[] >= 0), a sample's cells past its width are
// treated as padding: never read, never counted. The average's divisor is then the
// sample's own, as it would be alone; with the table row of the input widths.
//
// One thread per output element, the input contiguous; f32 or f16 (computed in f32).

#include "common.cuh"
#include "args.cuh"

template <typename T>
__device__ void pool(const T *x, T *y, const i64 *table, const PoolGeom &g)
{
    FOR_EACH(i, g.total) {
        i64 rem = i, o[3] = {0, 0, 0}, c;
        if (g.channels_last) {
            c = rem % g.c; rem /= g.c;
            for (int a = g.spatial - 1; a >= 0; a--) { o[a] = rem % g.out_dims[a]; rem /= g.out_dims[a]; }
        } else {
            for (int a = g.spatial - 1; a >= 0; a--) { o[a] = rem % g.out_dims[a]; rem /= g.out_dims[a]; }
            c = rem % g.c; rem /= g.c;
        }
        const i64 n = rem;
        i64 ext[3], stride[3], volume = 1;
        for (int a = 0; a < 3; a++) ext[a] = a < g.spatial ? g.in_dims[a] : 1;
        for (int a = 0; a < g.spatial; a++)
            if (g.rows[a] >= 0) ext[a] = table[g.rows[a] * g.table_n + n];
        for (int a = g.spatial - 1; a >= 0; a--) { stride[a] = volume * (g.channels_last ? g.c : 1); volume *= g.in_dims[a]; }
        for (int a = g.spatial; a < 3; a++) stride[a] = 0;
        const i64 base = g.channels_last ? n * volume * g.c + c : (n * g.c + c) * volume;
        const i64 k0 = g.k[0], k1 = g.spatial > 1 ? g.k[1] : 1, k2 = g.spatial > 2 ? g.k[2] : 1;

        float acc = g.is_max ? lowest<T>() : 0.0f;
        i64 valid = 0;
        for (i64 t0 = 0; t0 < k0; t0++) {
            const i64 p0 = o[0] * g.s[0] - g.pb[0] + t0 * g.d[0];
            if (p0 < 0 || p0 >= ext[0]) continue;
            for (i64 t1 = 0; t1 < k1; t1++) {
                const i64 p1 = g.spatial > 1 ? o[1] * g.s[1] - g.pb[1] + t1 * g.d[1] : 0;
                if (p1 < 0 || p1 >= ext[1]) continue;
                for (i64 t2 = 0; t2 < k2; t2++) {
                    const i64 p2 = g.spatial > 2 ? o[2] * g.s[2] - g.pb[2] + t2 * g.d[2] : 0;
                    if (p2 < 0 || p2 >= ext[2]) continue;
                    const float v = to_f32(x[base + p0 * stride[0] + p1 * stride[1] + p2 * stride[2]]);
                    acc = g.is_max ? fmaxf(acc, v) : acc + v;
                    valid++;
                }
            }
        }
        if (!g.is_max && g.normalize) {
            i64 count = valid;
            if (g.count_include_pad) {
                count = 1;
                for (int a = 0; a < g.spatial; a++) {
                    i64 taps = g.k[a];
                    if (g.ceil_mode) {
                        // The last window may overhang the explicit padding: its overhang is
                        // not counted.
                        taps = 0;
                        for (i64 t = 0; t < g.k[a]; t++)
                            if (o[a] * g.s[a] + t * g.d[a] < g.pb[a] + ext[a] + g.pa[a]) taps++;
                    }
                    count *= taps;
                }
            }
            acc = count == 0 ? 0.0f : acc * (1.0f / (float)count);
        }
        y[i] = from_f32<T>(acc);
    }
}

extern "C" __global__ void ragged_pool_f32(const float *x, float *y, const i64 *table, const PoolGeom g)
{
    pool(x, y, table, g);
}

extern "C" __global__ void ragged_pool_f16(const f16 *x, f16 *y, const i64 *table, const PoolGeom g)
{
    pool(x, y, table, g);
}
