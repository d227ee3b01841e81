// One axis resampled with each sample's own plan (RaggedSampleResample): output position o
// of sample n is the sum over `window` taps of weight times input position, from the
// plan [N, len_out, window] made on the host as tract plans the sample alone.
//
// The tensor is [outer, len, inner], contiguous, the batch axis among outer or inner
// (by its stride and extent in the output); one thread per output element. Same bits as
// tract's CPU resize: zero weights skipped, the others added in tap order from zero, each
// product rounded before the sum (no multiply-add). f16 tensors are read and written as
// f16 and summed in f32 (the weights are f32).

#include "common.cuh"
#include "args.cuh"

template <typename T>
__device__ void sample_resample(const T *x, T *y, const int *indices, const float *weights,
                                const SampleResampleGeom &g)
{
    FOR_EACH(i, g.total) {
        const i64 k = i % g.inner;
        const i64 o = (i / g.inner) % g.len_out;
        const i64 b = i / (g.inner * g.len_out);
        const i64 n = coord(i, g.batch_stride, g.batch_dim);
        const T *src = x + b * g.len_in * g.inner + k;
        const i64 row = (n * g.len_out + o) * g.window;
        float acc = 0.0f;
        for (i64 t = 0; t < g.window; t++) {
            const float w = weights[row + t];
            if (w == 0.0f) continue;
            acc = __fadd_rn(acc, __fmul_rn(w, to_f32(src[(i64)indices[row + t] * g.inner])));
        }
        y[i] = from_f32<T>(acc);
    }
}

extern "C" __global__ void ragged_sample_resample_f32(const float *x, float *y,
                                                      const int *indices, const float *weights,
                                                      const SampleResampleGeom g)
{
    sample_resample(x, y, indices, weights, g);
}

extern "C" __global__ void ragged_sample_resample_f16(const f16 *x, f16 *y,
                                                      const int *indices, const float *weights,
                                                      const SampleResampleGeom g)
{
    sample_resample(x, y, indices, weights, g);
}
