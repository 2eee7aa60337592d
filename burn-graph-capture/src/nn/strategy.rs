//! Which way a layer's recurrence (LSTM or GRU) runs on the GPU, decided in this one place.
//!
//! - *Stepwise*: per time step one recurrent GEMM and the cell's work each way (for the
//!   LSTM fused kernels, `lstm/cube/stepwise.rs`; for the GRU plain tensor ops). It serves
//!   every shape and dtype.
//! - *Persistent* (`lstm/cube/persistent/`, `gru/cube/`): the whole time loop in one
//!   cooperative launch each way; each block keeps its hidden units' slice of `W_h` in
//!   shared memory for the sequence, and the blocks meet at a grid-wide barrier after each
//!   step. It serves fp32 where the slices fit in shared memory with one block per SM, and
//!   it replaces about three kernels per step and direction with one launch.
//!
//! The choice is a pure function of the shape and the device's SM count, so a shape makes
//! the same choice at every step (warmup, capture and replays agree), and it is traced
//! once per shape (target `burn_graph_capture::recurrence`).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Hidden units per block at least: fewer blocks meet at each barrier.
const MIN_UNITS: usize = 4;
/// Hidden units per block at most (registers: each lane keeps a sum per gate and unit).
const MAX_UNITS: usize = 8;
/// Shared memory a block may use without opting in to more (static `__shared__`).
const SHARED_BYTES: usize = 48 * 1024;
/// Threads per block at most (each warp takes `rows` batch rows at a time, rows beyond
/// loop).
const MAX_WARPS: usize = 32;
/// Partial sums a lane may keep (`rows · gates · units`), so that they stay in registers.
const MAX_SUMS: usize = 64;
/// Partial sums a whole block may keep: half of an SM's 64 Ki registers, since a block of
/// `t` threads leaves each lane `65536 / t` registers (`__launch_bounds__(THREADS, 1)`).
/// Beyond it the sums spill: on the H200 four rows of 16 sums in 32 warps took 3.98 ms at
/// 128/32/512 against 2.05 for two rows (session 18).
const BLOCK_SUMS: usize = 32 * 1024;

/// Which recurrence [`choose`] should pick; the default is `Auto`.
///
/// Set it for a whole process with [`set_recurrence_preference`] or the environment
/// variable `BURN_GRAPH_CAPTURE_RECURRENCE` (`auto`, `stepwise` or `persistent`, read once).
/// Benchmarks and tests use it to run both ways side by side; a training run needs it
/// only to work around a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecurrencePreference {
    /// The persistent recurrence where it applies, else stepwise.
    Auto,
    /// Always stepwise.
    Stepwise,
    /// The persistent recurrence wherever it fits, even where `Auto` would not take it.
    Persistent,
}

/// 0: not set yet (read the environment); else `RecurrencePreference` + 1.
static PREFERENCE: AtomicU8 = AtomicU8::new(0);

const PREFERENCE_VAR: &str = "BURN_GRAPH_CAPTURE_RECURRENCE";

/// Sets the [`RecurrencePreference`] of every later `FusedLstm` and `FusedGru` call in
/// this process.
/// A graph already captured keeps the kernels it recorded.
pub fn set_recurrence_preference(preference: RecurrencePreference) {
    PREFERENCE.store(encode(preference), Ordering::Relaxed);
}

/// The preference in force: the last one set, else the environment's, else `Auto`.
pub fn recurrence_preference() -> RecurrencePreference {
    match PREFERENCE.load(Ordering::Relaxed) {
        0 => {
            let preference = from_env(std::env::var(PREFERENCE_VAR).ok().as_deref());
            // Another thread may have set one meanwhile: keep that.
            let _ = PREFERENCE.compare_exchange(
                0,
                encode(preference),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            decode(PREFERENCE.load(Ordering::Relaxed))
        }
        value => decode(value),
    }
}

fn encode(preference: RecurrencePreference) -> u8 {
    match preference {
        RecurrencePreference::Auto => 1,
        RecurrencePreference::Stepwise => 2,
        RecurrencePreference::Persistent => 3,
    }
}

fn decode(value: u8) -> RecurrencePreference {
    match value {
        2 => RecurrencePreference::Stepwise,
        3 => RecurrencePreference::Persistent,
        _ => RecurrencePreference::Auto,
    }
}

/// The environment variable's preference; an unknown value is warned about and ignored.
fn from_env(value: Option<&str>) -> RecurrencePreference {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => RecurrencePreference::Auto,
        Some("stepwise") => RecurrencePreference::Stepwise,
        Some("persistent") => RecurrencePreference::Persistent,
        Some(other) => {
            tracing::warn!("{PREFERENCE_VAR}={other:?} is not auto, stepwise or persistent: auto");
            RecurrencePreference::Auto
        }
    }
}

static PERSISTENT_LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// Launches of the persistent kernels in this process so far (forward and backward each
/// count one), for tests and benchmarks to tell which recurrence ran. A graph's replays
/// do not count: they launch nothing on the host.
pub fn persistent_launches() -> u64 {
    PERSISTENT_LAUNCHES.load(Ordering::Relaxed)
}

/// Counts one launch of a persistent kernel.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn count_persistent_launch() {
    PERSISTENT_LAUNCHES.fetch_add(1, Ordering::Relaxed);
}

/// Which recurrent cell a layer runs: it sets how many gate columns of `W_h` each hidden
/// unit owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cell {
    /// Four gates (input, forget, cell, output).
    Lstm,
    /// Three gates (update, reset, new).
    Gru,
}

impl Cell {
    /// Gate columns per hidden unit.
    pub fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }
}

/// Which way through the sequence a recurrence runs: each direction is chosen on its own
/// (either backward reads either forward's output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// The forward pass.
    Forward,
    /// The backward pass.
    Backward,
}

/// One layer's recurrence problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecurrenceShape {
    /// Batch rows.
    pub batch: usize,
    /// Time steps.
    pub time: usize,
    /// Hidden units.
    pub hidden: usize,
}

/// The launch of a persistent recurrence: `blocks` blocks of `warps` warps, each block
/// owning `units` consecutive hidden units (the last block may own fewer), each warp
/// taking `rows` batch rows at a time (every weight it reads from shared memory serves
/// them all).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PersistentGrid {
    /// Hidden units per block.
    pub units: usize,
    /// Blocks: at most one per SM.
    pub blocks: usize,
    /// Warps per block, at most 32.
    pub warps: usize,
    /// Batch rows a warp computes at once: one lane per row and unit, and at most
    /// 64 partial sums per lane.
    pub rows: usize,
}

/// How a layer's recurrence runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Recurrence {
    /// A GEMM and a cell kernel per step.
    Stepwise,
    /// One cooperative launch per direction.
    Persistent(PersistentGrid),
}

/// The recurrence for `direction` of a `cell` layer of `shape` of fp32 (`fp32`) on a
/// device of `sms` SMs, under `preference`.
///
/// Persistent where a block of [`MIN_UNITS`]..=[`MAX_UNITS`] units per SM covers the hidden
/// size and its slice of `W_h` (`4 · gates · units · hidden` bytes) fits in 48 KiB; `Auto`
/// also leaves LSTM batches over [`auto_max_batch`] stepwise, where per-step GEMMs use the
/// GPU better. Each warp takes as many batch rows as its lanes and the block's registers
/// ([`BLOCK_SUMS`]) allow.
pub fn choose(
    cell: Cell,
    direction: Direction,
    shape: RecurrenceShape,
    fp32: bool,
    sms: usize,
    preference: RecurrencePreference,
) -> Recurrence {
    let RecurrenceShape {
        batch,
        time,
        hidden,
    } = shape;
    if preference == RecurrencePreference::Stepwise
        || !fp32
        || sms == 0
        || batch == 0
        || time == 0
        || hidden == 0
    {
        return Recurrence::Stepwise;
    }
    if preference == RecurrencePreference::Auto && batch > auto_max_batch(cell, direction) {
        return Recurrence::Stepwise;
    }
    let units = hidden.div_ceil(sms).max(MIN_UNITS);
    if units > MAX_UNITS || slice_bytes(cell, units, hidden) > SHARED_BYTES {
        return Recurrence::Stepwise;
    }
    let sums = cell.gates() * units;
    let max_rows = (32 / units).min(MAX_SUMS / sums).max(1);
    let warps = |rows: usize| batch.div_ceil(rows).min(MAX_WARPS);
    let mut rows = batch.div_ceil(MAX_WARPS).min(max_rows);
    while rows > 1 && rows * sums * 32 * warps(rows) > BLOCK_SUMS {
        rows -= 1;
    }
    Recurrence::Persistent(PersistentGrid {
        units,
        blocks: hidden.div_ceil(units),
        warps: warps(rows),
        rows,
    })
}

/// Bytes of a block's slice of `W_h` (fp32): every gate column of its units.
fn slice_bytes(cell: Cell, units: usize, hidden: usize) -> usize {
    4 * cell.gates() * units * hidden
}

/// Batches above this stay stepwise under `Auto`. On the H200 (graphed Adam step,
/// `bench/results/rnn-2026-12-04.md`) the persistent LSTM took 1.40 ms against 2.14
/// stepwise at 64/64/256 and 1.73 against 1.85 at 96/32/512; at 128/32/512 its forward
/// kernel took 0.78 ms against 0.73 for the stepwise forward's kernels (each block's four
/// units of 128 rows make it compute-bound), its backward 0.60 against 0.65, so there
/// the forward runs stepwise and the backward persistent. Larger batches were not
/// measured. The GRU's stepwise recurrence is plain ops (a few kernels per step beside the
/// GEMM): persistent took 1.67 ms against 5.29 at 128/32/512, so the GRU has no limit.
fn auto_max_batch(cell: Cell, direction: Direction) -> usize {
    match (cell, direction) {
        (Cell::Lstm, Direction::Forward) => 96,
        (Cell::Lstm, Direction::Backward) => 128,
        (Cell::Gru, _) => usize::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Cell::{Gru, Lstm};
    use Direction::{Backward, Forward};
    use RecurrencePreference::{Auto, Persistent, Stepwise};

    fn shape(batch: usize, time: usize, hidden: usize) -> RecurrenceShape {
        RecurrenceShape {
            batch,
            time,
            hidden,
        }
    }

    fn grid(choice: Recurrence) -> PersistentGrid {
        match choice {
            Recurrence::Persistent(grid) => grid,
            Recurrence::Stepwise => panic!("stepwise"),
        }
    }

    #[test]
    fn the_benchmark_sizes_choose_as_measured_on_an_h200() {
        let sms = 132;
        assert_eq!(
            grid(choose(Lstm, Forward, shape(8, 64, 128), true, sms, Auto)),
            PersistentGrid {
                units: 4,
                blocks: 32,
                warps: 8,
                rows: 1,
            }
        );
        assert_eq!(
            grid(choose(Lstm, Forward, shape(32, 64, 256), true, sms, Auto)).blocks,
            64
        );
        // Faster persistent up to batch 96, slower forward at 128 (measured): stepwise
        // unless forced; the backward stays persistent there, and not beyond. Two rows a
        // warp, as the block's registers allow.
        let medium = grid(choose(Lstm, Forward, shape(96, 32, 512), true, sms, Auto));
        assert_eq!((medium.warps, medium.rows), (32, 2));
        let large = shape(128, 32, 512);
        assert_eq!(
            choose(Lstm, Forward, large, true, sms, Auto),
            Recurrence::Stepwise
        );
        let backward = grid(choose(Lstm, Backward, large, true, sms, Auto));
        assert_eq!((backward.warps, backward.rows), (32, 2));
        let larger = shape(160, 32, 512);
        assert_eq!(
            choose(Lstm, Backward, larger, true, sms, Auto),
            Recurrence::Stepwise
        );
        let forced = grid(choose(Lstm, Forward, large, true, sms, Persistent));
        assert_eq!(
            (forced.units, forced.blocks, forced.warps, forced.rows),
            (4, 128, 32, 2)
        );
        // The GRU's stepwise recurrence is plain ops: persistent at batch 128 too.
        let gru = grid(choose(Gru, Forward, large, true, sms, Auto));
        assert_eq!((gru.warps, gru.rows), (32, 2));
    }

    #[test]
    fn blocks_never_outnumber_sms_and_cover_every_unit() {
        for cell in [Lstm, Gru] {
            for sms in [1, 7, 80, 132] {
                for hidden in 1..700 {
                    let choice = choose(cell, Forward, shape(4, 3, hidden), true, sms, Auto);
                    if let Recurrence::Persistent(g) = choice {
                        assert!(g.blocks <= sms, "{hidden} units on {sms} SMs: {g:?}");
                        assert!(g.blocks * g.units >= hidden);
                        assert!((g.blocks - 1) * g.units < hidden, "an empty block: {g:?}");
                        assert!(slice_bytes(cell, g.units, hidden) <= SHARED_BYTES);
                        assert!(g.rows * g.units <= 32, "a lane per row and unit: {g:?}");
                        assert!(g.rows * g.units * cell.gates() <= MAX_SUMS);
                    }
                }
            }
        }
    }

    #[test]
    fn a_gru_fits_larger_hidden_sizes_than_an_lstm() {
        // Five units of 640 rows: 51 200 bytes of LSTM gates, 38 400 of GRU gates.
        let wide = shape(8, 16, 640);
        assert_eq!(
            choose(Lstm, Forward, wide, true, 132, Auto),
            Recurrence::Stepwise
        );
        assert_eq!(grid(choose(Gru, Forward, wide, true, 132, Auto)).units, 5);
    }

    #[test]
    fn what_does_not_fit_runs_stepwise() {
        // W_h slices beyond 48 KiB per block.
        assert_eq!(
            choose(Lstm, Forward, shape(8, 64, 1024), true, 132, Persistent),
            Recurrence::Stepwise
        );
        assert_eq!(
            choose(Lstm, Forward, shape(8, 64, 128), false, 132, Auto),
            Recurrence::Stepwise
        );
        assert_eq!(
            choose(Lstm, Forward, shape(8, 0, 128), true, 132, Auto),
            Recurrence::Stepwise
        );
        assert_eq!(
            choose(Lstm, Forward, shape(0, 4, 128), true, 132, Auto),
            Recurrence::Stepwise
        );
        assert_eq!(
            choose(Lstm, Forward, shape(8, 4, 128), true, 0, Auto),
            Recurrence::Stepwise
        );
    }

    #[test]
    fn warps_take_more_rows_at_larger_batches_within_their_registers() {
        let at = |cell, batch, hidden| {
            grid(choose(
                cell,
                Forward,
                shape(batch, 4, hidden),
                true,
                132,
                Persistent,
            ))
        };
        let g = at(Lstm, 40, 100);
        assert_eq!((g.rows, g.warps), (2, 20));
        // Four rows of 12 sums would need 48 Ki registers in 32 warps: two rows.
        let g = at(Gru, 128, 256);
        assert_eq!((g.rows, g.warps), (2, 32));
        // Eight units of four gates (50 units on 7 SMs): 32 sums a row, one row in 32
        // warps.
        let g = grid(choose(
            Lstm,
            Forward,
            shape(512, 4, 50),
            true,
            7,
            Persistent,
        ));
        assert_eq!((g.units, g.rows, g.warps), (8, 1, 32));
        for batch in 1..300 {
            let g = at(Lstm, batch, 256);
            assert!(g.warps * g.rows >= batch.min(32 * g.rows), "{batch}: {g:?}");
            assert!(
                g.warps <= MAX_WARPS && g.rows * g.units <= 32,
                "{batch}: {g:?}"
            );
            let sums = g.rows * g.units * Lstm.gates();
            assert!(sums * 32 * g.warps <= BLOCK_SUMS, "{batch}: {g:?}");
        }
    }

    #[test]
    fn preferences_decide_between_both_where_both_fit() {
        let big_batch = shape(512, 8, 64);
        assert_eq!(
            choose(Lstm, Forward, big_batch, true, 132, Auto),
            Recurrence::Stepwise
        );
        assert_eq!(
            grid(choose(Lstm, Forward, big_batch, true, 132, Persistent)).warps,
            32
        );
        assert_eq!(
            choose(Lstm, Forward, shape(8, 64, 128), true, 132, Stepwise),
            Recurrence::Stepwise
        );
    }

    #[test]
    fn the_environment_names_a_preference() {
        assert_eq!(from_env(None), Auto);
        assert_eq!(from_env(Some("persistent")), Persistent);
        assert_eq!(from_env(Some(" stepwise ")), Stepwise);
        assert_eq!(from_env(Some("fast")), Auto);
        for preference in [Auto, Stepwise, Persistent] {
            assert_eq!(decode(encode(preference)), preference);
        }
    }
}
