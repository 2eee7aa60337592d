//! Seeds per device, as `B::seed` sets them, and the generator streams handed out from
//! them.
//!
//! Every trainer draws from a stream of its own: the `n`-th stream taken since a device
//! was seeded has the key `mix(seed, n)`. A program that seeds, then builds its trainers
//! in the same order, draws the same numbers in every run, graphed or eager. A device
//! never seeded gets a seed from the operating system's entropy, as Burn's own
//! generators do.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use burn_backend::DeviceId;

/// The generator of one device: its seed, how many streams were taken from it, and how
/// often it was seeded (so that a trainer sees a reseed).
#[derive(Clone, Copy, Debug)]
struct DeviceSeed {
    seed: u64,
    taken: u64,
    epoch: u64,
}

static SEEDS: Mutex<Option<HashMap<DeviceId, DeviceSeed>>> = Mutex::new(None);

/// One stream of a device's generator: the Philox key a trainer draws with, and the
/// seeding it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    /// The Philox key.
    pub key: u64,
    /// Which seeding of the device it came from.
    pub epoch: u64,
}

/// Seeds `device`'s generator: the streams taken from now on start over from `seed`.
pub fn set(device: DeviceId, seed: u64) {
    with_seeds(|seeds| {
        let epoch = seeds.get(&device).map_or(1, |s| s.epoch + 1);
        seeds.insert(
            device,
            DeviceSeed {
                seed,
                taken: 0,
                epoch,
            },
        );
    });
}

/// The next stream of `device`'s generator.
pub fn take(device: DeviceId) -> Stream {
    with_seeds(|seeds| {
        let entry = seeds.entry(device).or_insert_with(|| DeviceSeed {
            seed: RandomState::new().hash_one(device),
            taken: 0,
            epoch: 0,
        });
        let key = mix(entry.seed, entry.taken);
        entry.taken += 1;
        Stream {
            key,
            epoch: entry.epoch,
        }
    })
}

/// Which seeding `device` is at (0 before any).
pub fn epoch(device: DeviceId) -> u64 {
    with_seeds(|seeds| seeds.get(&device).map_or(0, |s| s.epoch))
}

fn with_seeds<T>(f: impl FnOnce(&mut HashMap<DeviceId, DeviceSeed>) -> T) -> T {
    let mut seeds = SEEDS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    f(seeds.get_or_insert_with(HashMap::new))
}

/// The key of stream `n` under `seed`: SplitMix64's finalizer of their sum, a bijection,
/// so that the streams of one seed never share a key.
fn mix(seed: u64, n: u64) -> u64 {
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: u16) -> DeviceId {
        // A type id no real backend uses, so these tests share no entry with others.
        DeviceId::new(0xfff0, index)
    }

    #[test]
    fn a_seed_gives_the_same_streams_in_the_same_order() {
        let d = device(1);
        set(d, 42);
        let first = [take(d), take(d)];
        set(d, 42);
        let again = [take(d), take(d)];
        assert_eq!(first[0].key, again[0].key);
        assert_eq!(first[1].key, again[1].key);
        assert_ne!(first[0].key, first[1].key);
        assert_eq!(again[0].epoch, first[0].epoch + 1);
        assert_eq!(epoch(d), again[0].epoch);
    }

    #[test]
    fn seeds_and_devices_are_apart() {
        let (a, b) = (device(2), device(3));
        set(a, 7);
        set(b, 7);
        assert_eq!(take(a).key, take(b).key);
        set(a, 8);
        set(b, 7);
        assert_ne!(take(a).key, take(b).key);
    }

    #[test]
    fn an_unseeded_device_still_hands_out_distinct_streams() {
        let d = device(4);
        assert_eq!(epoch(d), 0);
        assert_ne!(take(d).key, take(d).key);
    }
}
