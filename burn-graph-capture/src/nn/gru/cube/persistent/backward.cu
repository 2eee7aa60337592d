// The GRU backward recurrence in one launch, mirroring forward.cu: block `blockIdx.x` owns
// hidden units [j0, j0 + UNITS) and keeps their rows of W_h in shared memory. Going back
// from the last step, warp `w` takes ROWS batch rows at a time: its lanes split the
// hidden gradient that step t + 1 sends back through W_h (dhp_{t+1}[b] . W_h[j, :]), and
// lane r * UNITS + u adds row r's states' gradient and the carried dh_{t+1} z_{t+1} (kept
// in d_h0, which only that lane touches until the end), then writes unit j0 + u's gate
// gradients: dxp = (da_z, da_r, da_n) for the input projection and dhp = (da_z, da_r,
// da_n r) for the hidden one. The blocks meet after each step, since step t - 1 reads
// every gate gradient of step t. Last, d_h0 = dhp_0 . W_h^T + carried + d_states[0].
//
// The weight and bias gradients are not computed here: one GEMM and one sum over the
// sequence (gru/cube/mod.rs).

#define THREE_H (3 * HIDDEN)
#define DS_AT(t, b, j) ((offset_t)(t) * DS_S0 + (offset_t)(b) * DS_S1 + (offset_t)(j) * DS_S2)
#define ST_AT(t, b, j) ((offset_t)(t) * ST_S0 + (offset_t)(b) * ST_S1 + (offset_t)(j) * ST_S2)
#define GA_AT(t, b, c) ((offset_t)(t) * GA_S0 + (offset_t)(b) * GA_S1 + (offset_t)(c) * GA_S2)
#define DX_AT(t, b, c) ((offset_t)(t) * DX_S0 + (offset_t)(b) * DX_S1 + (offset_t)(c) * DX_S2)
#define DP_AT(t, b, c) ((offset_t)(t) * DP_S0 + (offset_t)(b) * DP_S1 + (offset_t)(c) * DP_S2)
#define DH_AT(b, j) ((offset_t)(b) * DH_S0 + (offset_t)(j) * DH_S1)
#define P_ROUNDS ((THREE_H + 31) / 32)

// This lane's share of rows b0.. of dhp_t . W_h[j0 + u, :], summed over the warp; returns
// the sum of row `my_row` and unit `my_unit` (zero for a lane that owns none).
__device__ __forceinline__ float gru_hidden_gradient(const float* dhp, const float* w, int t,
                                                     int b0, int lane, int my_row,
                                                     int my_unit) {
    float dh[ROWS][UNITS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int u = 0; u < UNITS; ++u) {
            dh[r][u] = 0.0f;
        }
    }
#pragma unroll 8
    for (int round = 0; round < P_ROUNDS; ++round) {
        const int c = round * 32 + lane;
        if (c < THREE_H) {
            float d[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                // Written by other blocks in the previous step: read from L2.
                d[r] = b0 + r < BATCH ? __ldcg(dhp + DP_AT(t, b0 + r, c)) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < UNITS; ++u) {
                const float weight = w[u * THREE_H + c];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    dh[r][u] += d[r] * weight;
                }
            }
        }
    }
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        rnn_warp_sum<UNITS>(dh[r]);
#pragma unroll
        for (int u = 0; u < UNITS; ++u) {
            if (my_row == r && my_unit == u) {
                mine = dh[r][u];
            }
        }
    }
    return mine;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gru_persistent_backward(const float* __restrict__ d_states, const float* __restrict__ states,
                        const float* __restrict__ gates, const float* __restrict__ wh,
                        float* __restrict__ dxp, float* dhp, float* __restrict__ d_h0,
                        unsigned int* counter) {
    // w[u * 3H + c] = W_h[j0 + u, c]: lanes read along c.
    __shared__ float w[UNITS * THREE_H];
    const int j0 = blockIdx.x * UNITS;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int index = threadIdx.x; index < UNITS * THREE_H; index += THREADS) {
        const int j = j0 + index / THREE_H;
        const int c = index % THREE_H;
        w[index] = j < HIDDEN ? wh[(offset_t)j * WH_S0 + (offset_t)c * WH_S1] : 0.0f;
    }
    __syncthreads();
    // The (row, unit) this lane updates.
    const int my_row = lane / UNITS;
    const int my_unit = lane % UNITS;
    const int j = j0 + my_unit;

    for (int step = 0; step < TIME; ++step) {
        const int t = TIME - 1 - step;
        for (int b0 = warp * ROWS; b0 < BATCH; b0 += WARPS * ROWS) {
            float dh_rec = 0.0f;
            if (step > 0) {
                dh_rec = gru_hidden_gradient(dhp, w, t + 1, b0, lane, my_row, my_unit);
            }
            const int b = b0 + my_row;
            if (my_row < ROWS && b < BATCH && j < HIDDEN) {
                float dh = d_states[DS_AT(t + 1, b, j)];
                if (step > 0) {
                    dh += d_h0[DH_AT(b, j)] + dh_rec;
                }
                const float z = gates[GA_AT(t, b, j)];
                const float r = gates[GA_AT(t, b, HIDDEN + j)];
                const float n = gates[GA_AT(t, b, 2 * HIDDEN + j)];
                const float hn = gates[GA_AT(t, b, 3 * HIDDEN + j)];
                const float h_prev = states[ST_AT(t, b, j)];
                const float da_n = dh * (1.0f - z) * (1.0f - n * n);
                const float da_z = dh * (h_prev - n) * z * (1.0f - z);
                const float da_r = da_n * hn * r * (1.0f - r);
                dxp[DX_AT(t, b, j)] = da_z;
                dxp[DX_AT(t, b, HIDDEN + j)] = da_r;
                dxp[DX_AT(t, b, 2 * HIDDEN + j)] = da_n;
                dhp[DP_AT(t, b, j)] = da_z;
                dhp[DP_AT(t, b, HIDDEN + j)] = da_r;
                dhp[DP_AT(t, b, 2 * HIDDEN + j)] = da_n * r;
                d_h0[DH_AT(b, j)] = dh * z;
            }
        }
        rnn_grid_sync(counter, step + 1);
    }

    for (int b0 = warp * ROWS; b0 < BATCH; b0 += WARPS * ROWS) {
        const float dh_rec = gru_hidden_gradient(dhp, w, 0, b0, lane, my_row, my_unit);
        const int b = b0 + my_row;
        if (my_row < ROWS && b < BATCH && j < HIDDEN) {
            d_h0[DH_AT(b, j)] = d_h0[DH_AT(b, j)] + dh_rec + d_states[DS_AT(0, b, j)];
        }
    }
}
