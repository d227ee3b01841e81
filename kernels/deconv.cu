// Transposed convolution (ONNX ConvTranspose, tract's Deconv), channels first, over up to
// three spatial axes: each output element sums the taps of every input element that
// scatters to it. Kernel laid out as tract holds it, OIHW: [C_out, C_in / group, k...].
//
// One thread per output element; tract-cuda has no transposed convolution, and the
// PP-OCR detection head's are small (2x2 stride 2 upsamplings). f32 or f16 (summed in f32).

#include "common.cuh"
#include "args.cuh"

template <typename T>
__device__ void deconv(const T *x, const T *w, const T *b, T *y, const DeconvGeom &g)
{
    FOR_EACH(i, g.total) {
        i64 rem = i, o[3] = {0, 0, 0};
        for (int a = g.spatial - 1; a >= 0; a--) { o[a] = rem % g.out_dims[a]; rem /= g.out_dims[a]; }
        const i64 oc = rem % g.co;
        const i64 n = rem / g.co;
        const i64 cig = g.ci / g.groups, cog = g.co / g.groups;
        const i64 group = oc / cog;
        i64 in_vol = 1, k_vol = 1;
        for (int a = 0; a < g.spatial; a++) { in_vol *= g.in_dims[a]; k_vol *= g.k[a]; }
        const i64 k0 = g.k[0], k1 = g.spatial > 1 ? g.k[1] : 1, k2 = g.spatial > 2 ? g.k[2] : 1;
        const i64 in1 = g.spatial > 1 ? g.in_dims[1] : 1, in2 = g.spatial > 2 ? g.in_dims[2] : 1;
        float acc = to_f32(g.bias_len == 1 ? b[0] : b[oc]);
        for (i64 t0 = 0; t0 < k0; t0++) {
            const i64 p0 = o[0] + g.pb[0] - t0 * g.d[0];
            if (p0 < 0 || p0 % g.s[0]) continue;
            const i64 i0 = p0 / g.s[0];
            if (i0 >= g.in_dims[0]) continue;
            for (i64 t1 = 0; t1 < k1; t1++) {
                i64 i1 = 0;
                if (g.spatial > 1) {
                    const i64 p1 = o[1] + g.pb[1] - t1 * g.d[1];
                    if (p1 < 0 || p1 % g.s[1]) continue;
                    i1 = p1 / g.s[1];
                    if (i1 >= in1) continue;
                }
                for (i64 t2 = 0; t2 < k2; t2++) {
                    i64 i2 = 0;
                    if (g.spatial > 2) {
                        const i64 p2 = o[2] + g.pb[2] - t2 * g.d[2];
                        if (p2 < 0 || p2 % g.s[2]) continue;
                        i2 = p2 / g.s[2];
                        if (i2 >= in2) continue;
                    }
                    const i64 at = (i0 * in1 + i1) * in2 + i2;
                    const i64 tap = (t0 * k1 + t1) * k2 + t2;
                    for (i64 icg = 0; icg < cig; icg++) {
                        const i64 ic = group * cig + icg;
                        acc += to_f32(x[(n * g.ci + ic) * in_vol + at]) * to_f32(w[(oc * cig + icg) * k_vol + tap]);
                    }
                }
            }
        }
        y[i] = from_f32<T>(acc);
    }
}

extern "C" __global__ void ragged_deconv_f32(const float *x, const float *w, const float *b, float *y, const DeconvGeom g)
{
    deconv(x, w, b, y, g);
}

extern "C" __global__ void ragged_deconv_f16(const f16 *x, const f16 *w, const f16 *b, f16 *y, const DeconvGeom g)
{
    deconv(x, w, b, y, g);
}
