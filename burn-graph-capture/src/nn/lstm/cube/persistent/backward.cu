// The backward recurrence in one launch, mirroring forward.cu: block `blockIdx.x` owns
// hidden units [j0, j0 + UNITS) and keeps their rows of W_h in shared memory. Going back
// from the last step, warp `w` takes batch rows w, w + WARPS, ...: its lanes split the
// hidden gradient that step t + 1 sends back (dz_{t+1}[b] . W_h[j, :]), and lane u turns
// it into unit j0 + u's gate gradients dz_t and the carried cell gradient (kept in
// d_c0, which only that thread touches until the end). The blocks meet after each step,
// since step t - 1 reads every gate gradient of step t. Last, the initial state's
// gradients: d_h0 = dz_0 . W_h^T + d_states[0, 0], d_c0 = carried + d_states[1, 0].
//
// The weight gradients are not computed here: d_xp is dz itself, d_W_h one GEMM over the
// sequence (mod.rs).

#define FOUR_H (4 * HIDDEN)
#define DS_AT(kind, t, b, j) \
    ((offset_t)(kind) * DS_S0 + (offset_t)(t) * DS_S1 + (offset_t)(b) * DS_S2 + (offset_t)(j) * DS_S3)
#define ST_AT(kind, t, b, j) \
    ((offset_t)(kind) * ST_S0 + (offset_t)(t) * ST_S1 + (offset_t)(b) * ST_S2 + (offset_t)(j) * ST_S3)
#define GA_AT(t, b, c) ((offset_t)(t) * GA_S0 + (offset_t)(b) * GA_S1 + (offset_t)(c) * GA_S2)
#define DZ_AT(t, b, c) ((offset_t)(t) * DZ_S0 + (offset_t)(b) * DZ_S1 + (offset_t)(c) * DZ_S2)
#define DH_AT(b, j) ((offset_t)(b) * DH_S0 + (offset_t)(j) * DH_S1)
#define DC_AT(b, j) ((offset_t)(b) * DC_S0 + (offset_t)(j) * DC_S1)
#define Z_ROUNDS ((FOUR_H + 31) / 32)

// Lane-split dot products of dz_t[b] with the block's rows of W_h, summed over the warp.
__device__ __forceinline__ void lstm_hidden_gradient(const float* dz, const float* w, int t,
                                                     int b, int lane, float (&dh)[UNITS]) {
#pragma unroll
    for (int u = 0; u < UNITS; ++u) {
        dh[u] = 0.0f;
    }
#pragma unroll 8
    for (int round = 0; round < Z_ROUNDS; ++round) {
        const int c = round * 32 + lane;
        if (c < FOUR_H) {
            // Written by other blocks in the previous step: read from L2.
            const float d = __ldcg(dz + DZ_AT(t, b, c));
#pragma unroll
            for (int u = 0; u < UNITS; ++u) {
                dh[u] += d * w[u * FOUR_H + c];
            }
        }
    }
    rnn_warp_sum<UNITS>(dh);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
lstm_persistent_backward(const float* __restrict__ d_states, const float* __restrict__ states,
                         const float* __restrict__ gates, const float* __restrict__ wh,
                         float* dz, float* __restrict__ d_h0, float* __restrict__ d_c0,
                         unsigned int* counter) {
    // w[u * 4H + c] = W_h[j0 + u, c]: lanes read along c.
    __shared__ float w[UNITS * FOUR_H];
    const int j0 = blockIdx.x * UNITS;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int index = threadIdx.x; index < UNITS * FOUR_H; index += THREADS) {
        const int j = j0 + index / FOUR_H;
        const int c = index % FOUR_H;
        w[index] = j < HIDDEN ? wh[(offset_t)j * WH_S0 + (offset_t)c * WH_S1] : 0.0f;
    }
    __syncthreads();

    for (int step = 0; step < TIME; ++step) {
        const int t = TIME - 1 - step;
        for (int b = warp; b < BATCH; b += WARPS) {
            float dh_rec[UNITS];
            if (step > 0) {
                lstm_hidden_gradient(dz, w, t + 1, b, lane, dh_rec);
            }
#pragma unroll
            for (int u = 0; u < UNITS; ++u) {
                const int j = j0 + u;
                if (lane == u && j < HIDDEN) {
                    float dh = d_states[DS_AT(0, t + 1, b, j)];
                    float dc_in = d_states[DS_AT(1, t + 1, b, j)];
                    if (step > 0) {
                        dh += dh_rec[u];
                        dc_in += d_c0[DC_AT(b, j)];
                    }
                    const float i = gates[GA_AT(t, b, j)];
                    const float f = gates[GA_AT(t, b, HIDDEN + j)];
                    const float g = gates[GA_AT(t, b, 2 * HIDDEN + j)];
                    const float o = gates[GA_AT(t, b, 3 * HIDDEN + j)];
                    const float tanh_c = tanhf(states[ST_AT(1, t + 1, b, j)]);
                    const float c_prev = states[ST_AT(1, t, b, j)];
                    const float d_c = dc_in + dh * o * (1.0f - tanh_c * tanh_c);
                    dz[DZ_AT(t, b, j)] = d_c * g * i * (1.0f - i);
                    dz[DZ_AT(t, b, HIDDEN + j)] = d_c * c_prev * f * (1.0f - f);
                    dz[DZ_AT(t, b, 2 * HIDDEN + j)] = d_c * i * (1.0f - g * g);
                    dz[DZ_AT(t, b, 3 * HIDDEN + j)] = dh * tanh_c * o * (1.0f - o);
                    d_c0[DC_AT(b, j)] = d_c * f;
                }
            }
        }
        rnn_grid_sync(counter, step + 1);
    }

    for (int b = warp; b < BATCH; b += WARPS) {
        float dh_rec[UNITS];
        lstm_hidden_gradient(dz, w, 0, b, lane, dh_rec);
#pragma unroll
        for (int u = 0; u < UNITS; ++u) {
            const int j = j0 + u;
            if (lane == u && j < HIDDEN) {
                d_h0[DH_AT(b, j)] = dh_rec[u] + d_states[DS_AT(0, 0, b, j)];
                d_c0[DC_AT(b, j)] = d_c0[DC_AT(b, j)] + d_states[DS_AT(1, 0, b, j)];
            }
        }
    }
}
