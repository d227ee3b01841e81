// tract's PrefixMatMul over i32 (ONNX's MatMulInteger, once its operands are cast to i32
// and their zero points subtracted: src/cuda/integer_products.rs): for every element of
// the output, the sum over k of a's and b's elements along k. One thread per output
// element; the host gives, per output axis (padded with leading ones to 6 axes), the
// stride of a and of b along it (0 where one broadcasts, or lacks the axis), and their
// strides along k. The sums wrap as tract's i32 kernels do (unsigned arithmetic: no
// undefined overflow); 8-bit operands over any k an encoder has stay far from it.

#include "common.cuh"
#include "args.cuh"

extern "C" __global__ void integer_matmul_i32(const int *a, const int *b, int *c,
                                              const IntegerMatMulGeom g)
{
    FOR_EACH(o, g.total) {
        i64 rest = o, at_a = 0, at_b = 0;
        for (int d = 5; d >= 0; --d) {
            const i64 x = rest % g.dims[d];
            rest /= g.dims[d];
            at_a += x * g.a_strides[d];
            at_b += x * g.b_strides[d];
        }
        unsigned acc = 0;
        for (i64 k = 0; k < g.k; ++k) {
            acc += (unsigned)a[at_a + k * g.a_k] * (unsigned)b[at_b + k * g.b_k];
        }
        c[o] = (int)acc;
    }
}
