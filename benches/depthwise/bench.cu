// The tiled depthwise kernels of kernels/depthwise.cu on PP-OCRv4 rec's depthwise layers
// (a batch of 32 padded to 1408 px) and a few odd shapes: each checked bit for bit against
// the strip or general kernel (what the host runs where a tile does not apply) and timed
// with events (median of 20); SWEEP lists the tiles to try (each must be instantiated in
// kernels/depthwise.cu). Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -I kernels -I benches/depthwise benches/depthwise/bench.cu -o /tmp/dw && /tmp/dw
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define SWEEP(X) X(3, 1, 1, 8) X(3, 1, 2, 8) X(3, 2, 1, 4) X(3, 2, 2, 4) X(5, 1, 1, 8) X(5, 1, 3, 8) X(5, 2, 1, 4) X(7, 1, 2, 8)
#include "../../kernels/depthwise.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s (line %d)\n", #x, cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

static void fastdiv(unsigned d, unsigned out[2]) {
    unsigned long long dd = d < 1 ? 1 : d;
    unsigned l = 0; while ((1ull << l) < dd) l++;
    unsigned __int128 m = (((unsigned __int128)1 << 32) * (((unsigned __int128)1 << l) - dd)) / dd + 1;
    out[0] = (unsigned)m; out[1] = l;
}

struct Shape { const char *name; int n, c, h, w, k, sh, sw; };

typedef void (*Kernel)(const float *, const float *, const float *, float *, const DepthwiseGeom);

int main() {
    std::vector<Shape> shapes = {
        {"Conv.3", 32, 32, 24, 704, 3, 1, 1},   {"Conv.5", 32, 64, 24, 704, 3, 1, 1},
        {"Conv.7", 32, 64, 24, 704, 3, 2, 1},   {"Conv.9", 32, 128, 12, 704, 3, 1, 1},
        {"Conv.11", 32, 128, 12, 704, 3, 1, 2}, {"Conv.13", 32, 240, 12, 352, 5, 1, 1},
        {"Conv.21", 32, 240, 12, 352, 5, 2, 1}, {"Conv.25", 32, 480, 6, 352, 5, 1, 1},
        {"Conv.29", 32, 480, 6, 352, 5, 2, 1},  {"Conv.31", 32, 480, 3, 352, 5, 1, 1},
        {"odd", 3, 7, 5, 37, 5, 1, 1}, {"w356", 4, 240, 7, 356, 5, 1, 1}, {"w356s2", 4, 64, 9, 356, 3, 1, 2},
    };
    size_t maxn = 0;
    for (auto &s : shapes) maxn = std::max(maxn, (size_t)s.n * s.c * s.h * s.w);
    std::vector<float> hx(maxn), hk(480 * 49), hb(480);
    unsigned st = 12345;
    auto rnd = [&]() { st = st * 1664525u + 1013904223u; return ((st >> 8) / 16777216.0f) * 2.f - 1.f; };
    for (auto &v : hx) v = rnd();
    for (auto &v : hk) v = rnd();
    for (auto &v : hb) v = rnd();
    float *x, *k, *b, *y0, *y1;
    CK(cudaMalloc(&x, maxn * 4)); CK(cudaMalloc(&k, hk.size() * 4)); CK(cudaMalloc(&b, hb.size() * 4));
    CK(cudaMalloc(&y0, maxn * 4)); CK(cudaMalloc(&y1, maxn * 4));
    CK(cudaMemcpy(x, hx.data(), maxn * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, hk.data(), hk.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    printf("%-8s %-10s %9s %8s %6s %s\n", "layer", "kernel", "time(us)", "GB/s", "bound", "bits");
    double total_ref = 0, total_best = 0;
    for (auto &s : shapes) {
        const int p = (s.k - 1) / 2;
        const int oh = (s.h + 2 * p - s.k) / s.sh + 1, ow = (s.w + 2 * p - s.k) / s.sw + 1;
        const size_t out_n = (size_t)s.n * s.c * oh * ow, in_n = (size_t)s.n * s.c * s.h * s.w;
        DepthwiseGeom g{};
        g.c = s.c; g.ih = s.h; g.iw = s.w; g.oh = oh; g.ow = ow; g.kh = s.k; g.kw = s.k;
        g.sh = s.sh; g.sw = s.sw; g.dh = 1; g.dw = 1; g.ph = p; g.pw = p;
        g.total = out_n; g.planes = s.n * s.c;
        const double bytes = (in_n + out_n) * 4.0;
        auto time = [&](Kernel kern, dim3 grid, dim3 block, float *y) {
            std::vector<float> ms;
            for (int r = 0; r < 23; r++) {
                CK(cudaEventRecord(e0));
                kern<<<grid, block>>>(x, k, b, y, g);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float t; CK(cudaEventElapsedTime(&t, e0, e1));
                if (r >= 3) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            return ms[ms.size() / 2] * 1000.0;
        };
        // Reference: the kernel in kernels/depthwise.cu, launched as src/cuda/ops/depthwise.rs does.
        const bool strip = s.sw == 1;
        const size_t per_plane = strip ? (size_t)oh * ((ow + 3) / 4) : (size_t)oh * ow;
        const unsigned planes = s.n * s.c, rows = std::min(planes, 65535u);
        dim3 rgrid(std::min<size_t>(std::max<size_t>((per_plane + 255) / 256, 1), 65535), rows, (planes + rows - 1) / rows);
        CK(cudaMemset(y0, 0xff, out_n * 4));
        double tref = time(strip ? ragged_depthwise_f32_s1 : ragged_depthwise_f32, rgrid, dim3(256), y0);
        std::vector<float> ref(out_n), got(out_n);
        CK(cudaMemcpy(ref.data(), y0, out_n * 4, cudaMemcpyDeviceToHost));
        printf("%-8s %-10s %9.1f %8.0f %5.0f%%\n", s.name, strip ? "s1" : "general", tref, bytes / tref / 1e3, bytes / tref / 1e3 / 4814 * 100);
        total_ref += tref;
        double best = tref;
        struct Cand { const char *name; Kernel kern; int rb; int st; };
        std::vector<Cand> cands;
#define CAND(K_, SW_, RB_, ST_)                                                                   \
        if (s.k == K_ && s.sw == SW_ && (RB_ == 1 || s.sh == 1) && s.w % 4 == 0)                    \
            cands.push_back({"k" #K_ "s" #SW_ "r" #RB_ "w" #ST_, ragged_depthwise_f32_k##K_##s##SW_##r##RB_, RB_, ST_});
        SWEEP(CAND)
        for (auto &cd : cands) {
            for (int bs : {128}) {
                g.strips = (ow + cd.st - 1) / cd.st; g.bands = (oh + cd.rb - 1) / cd.rb;
                g.items = planes * g.bands * g.strips;
                fastdiv(g.strips, g.div_strips); fastdiv(g.bands, g.div_bands); fastdiv(g.c, g.div_c);
                CK(cudaMemset(y1, 0xff, out_n * 4));
                double t = time(cd.kern, dim3((g.items + bs - 1) / bs), dim3(bs), y1);
                CK(cudaMemcpy(got.data(), y1, out_n * 4, cudaMemcpyDeviceToHost));
                size_t diff = 0; double maxd = 0;
                for (size_t i = 0; i < out_n; i++) {
                    if (memcmp(&got[i], &ref[i], 4)) { diff++; maxd = std::max(maxd, (double)fabsf(got[i] - ref[i])); }
                }
                char bits[64];
                if (diff) snprintf(bits, 64, "%zu differ, max %.2e", diff, maxd); else snprintf(bits, 64, "identical");
                printf("%-8s %-10s/%3d %9.1f %8.0f %5.0f%% %s\n", "", cd.name, bs, t, bytes / t / 1e3, bytes / t / 1e3 / 4814 * 100, bits);
                if (!diff && t < best) best = t;
            }
        }
        total_best += best;
    }
    printf("sum over the layers: reference %.1f us, best identical candidate %.1f us\n", total_ref, total_best);
    return 0;
}
