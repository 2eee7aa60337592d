// Shared by the persistent LSTM and GRU kernels (see persistent.rs). The generated prelude
// defines BATCH, TIME, HIDDEN, UNITS (hidden units per block), BLOCKS, WARPS, ROWS (batch
// rows a warp computes at once) and every tensor's strides in elements; one kernel is
// compiled per configuration.
#define THREADS (WARPS * 32)
#define FULL_WARP 0xffffffffu

typedef long long offset_t;

__device__ __forceinline__ float rnn_sigmoid(float x) {
    return 1.0f / (1.0f + expf(0.0f - x));
}

// An acquire load at device scope: what the other blocks wrote before they arrived is
// visible after it.
__device__ __forceinline__ unsigned int rnn_load_acquire(const unsigned int* address) {
    unsigned int value;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
    return value;
}

// The `round`-th (1-based) meeting of all blocks. `counter` starts at zero and only grows,
// so a block that arrives early at the next round cannot release a late one. The launch is
// cooperative, so every block is resident and the spin ends.
__device__ __forceinline__ void rnn_grid_sync(unsigned int* counter, unsigned int round) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
        const unsigned int target = round * BLOCKS;
        while (rnn_load_acquire(counter) < target) {
        }
        __threadfence();
    }
    __syncthreads();
}

// Adds each lane's partial sums over the warp; every lane ends with the totals.
template <int N>
__device__ __forceinline__ void rnn_warp_sum(float (&values)[N]) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
        for (int n = 0; n < N; ++n) {
            values[n] += __shfl_xor_sync(FULL_WARP, values[n], offset);
        }
    }
}

// Adds each of N values (N a power of two, at most 32) over the warp, transposed: lane L
// ends with the total of value L >> (5 - log2 N) (2^(5 - log2 N) lanes hold each one). At
// each of the first log2 N rounds a lane keeps half of its values and trades the other
// half with its partner, so the sums take N - 1 + 5 - log2 N shuffles where
// `rnn_warp_sum` takes 5 N. Returns the lane's total.
template <int N>
__device__ __forceinline__ float rnn_warp_transpose_sum(float (&values)[N], int lane) {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N: a power of two up to 32");
#pragma unroll
    for (int round = 0; round < 5; ++round) {
        const int offset = 16 >> round;
        const int half = (N >> round) / 2;
        if (half >= 1) {
            const bool upper = (lane & offset) != 0;
#pragma unroll
            for (int i = 0; i < half; ++i) {
                const float send = upper ? values[i] : values[i + half];
                const float keep = upper ? values[i + half] : values[i];
                values[i] = keep + __shfl_xor_sync(FULL_WARP, send, offset);
            }
        } else {
            values[0] += __shfl_xor_sync(FULL_WARP, values[0], offset);
        }
    }
    return values[0];
}

// The smallest power of two at least n, and its log2: the transposed sums' sizes.
__host__ __device__ constexpr int rnn_pow2(int n) {
    return n <= 1 ? 1 : 2 * rnn_pow2((n + 1) / 2);
}
__host__ __device__ constexpr int rnn_log2(int n) {
    return n <= 1 ? 0 : 1 + rnn_log2(n / 2);
}
