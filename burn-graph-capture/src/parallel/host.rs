//! Collectives on the host, through the group's rendezvous: what CPU backends (Flex)
//! run, so that the data-parallel step is tested without GPUs. Every rank receives every
//! rank's values and reduces them in rank order, so all ranks hold the same bits.

use burn::tensor::{DType, TensorData};

use super::error::{CollectiveFailure, Disagreement, DistError, GroupMisuse};
use super::group::RankLink;
use crate::cause::Cause;

/// Each tensor averaged elementwise over the ranks: summed in rank order in f32, then
/// divided by the number of ranks; returned in each tensor's own dtype.
pub(crate) fn all_reduce_mean(
    member: &RankLink,
    tensors: Vec<TensorData>,
) -> Result<Vec<TensorData>, DistError> {
    let values: Vec<Vec<f32>> = tensors.iter().map(as_f32).collect::<Result<_, _>>()?;
    let gathered = member.all_gather(encode(&values))?;
    let world = gathered.len() as f32;
    let mut sums: Vec<Vec<f32>> = Vec::new();
    for payload in gathered.iter() {
        let theirs = decode(payload, &values)?;
        if sums.is_empty() {
            sums = theirs;
        } else {
            for (sum, other) in sums.iter_mut().zip(theirs) {
                sum.iter_mut().zip(other).for_each(|(s, o)| *s += o);
            }
        }
    }
    Ok(tensors
        .into_iter()
        .zip(sums)
        .map(|(tensor, mut sum)| {
            sum.iter_mut().for_each(|s| *s /= world);
            TensorData::new(sum, tensor.shape.clone()).convert_dtype(tensor.dtype)
        })
        .collect())
}

/// `root`'s tensors on every rank.
pub(crate) fn broadcast(
    member: &RankLink,
    tensors: Vec<TensorData>,
    root: usize,
) -> Result<Vec<TensorData>, DistError> {
    let values: Vec<Vec<f32>> = tensors.iter().map(as_f32).collect::<Result<_, _>>()?;
    let gathered = member.all_gather(encode(&values))?;
    let payload = gathered
        .get(root)
        .ok_or(DistError::InvalidUse(GroupMisuse::RankOutOfRange {
            rank: root,
            world: gathered.len(),
        }))?;
    let theirs = decode(payload, &values)?;
    Ok(tensors
        .into_iter()
        .zip(theirs)
        .map(|(tensor, values)| {
            TensorData::new(values, tensor.shape.clone()).convert_dtype(tensor.dtype)
        })
        .collect())
}

fn as_f32(data: &TensorData) -> Result<Vec<f32>, DistError> {
    let data = match data.dtype {
        DType::F32 => data.clone(),
        _ => data.clone().convert_dtype(DType::F32),
    };
    data.to_vec::<f32>()
        .map_err(|err| DistError::Collective(CollectiveFailure::TensorRead(Cause::new(err))))
}

/// Every tensor's values, little-endian, one after the other.
fn encode(values: &[Vec<f32>]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|tensor| tensor.iter().flat_map(|v| v.to_le_bytes()))
        .collect()
}

/// Another rank's payload, split like `like`; a payload of another size means the ranks
/// gave tensors of other sizes.
fn decode(payload: &[u8], like: &[Vec<f32>]) -> Result<Vec<Vec<f32>>, DistError> {
    let expected: usize = like.iter().map(|t| t.len() * 4).sum();
    if payload.len() != expected {
        return Err(DistError::Mismatch(Disagreement::TensorBytes {
            given: payload.len(),
            expected,
        }));
    }
    let mut floats = payload
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    Ok(like
        .iter()
        .map(|tensor| floats.by_ref().take(tensor.len()).collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::{DataParallel, DataParallelConfig};

    fn run_ranks<T: Send + 'static>(
        world: usize,
        f: impl Fn(&RankLink) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let group = DataParallel::new(world, &DataParallelConfig::new()).unwrap();
        let f = std::sync::Arc::new(f);
        let handles: Vec<_> = group
            .members()
            .unwrap()
            .into_iter()
            .map(|member| {
                let f = f.clone();
                std::thread::spawn(move || f(&member))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn the_mean_is_the_same_on_every_rank_and_keeps_shape_and_dtype() {
        let results = run_ranks(3, |member: &RankLink| {
            let r = member.rank() as f32;
            let a = TensorData::new(vec![r, 2.0 * r, 1.0], [3]);
            let b = TensorData::new(vec![r as f64 + 0.5; 4], [2, 2]);
            all_reduce_mean(member, vec![a, b]).unwrap()
        });
        for result in &results {
            assert_eq!(result, &results[0]);
        }
        assert_eq!(results[0][0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 1.0]);
        assert_eq!(results[0][1].shape.to_vec(), vec![2, 2]);
        assert_eq!(results[0][1].dtype, DType::F64);
        assert_eq!(results[0][1].to_vec::<f64>().unwrap(), vec![1.5; 4]);
    }

    #[test]
    fn broadcast_hands_out_the_roots_values() {
        let results = run_ranks(2, |member| {
            let mine = TensorData::new(vec![member.rank() as f32 + 10.0; 2], [2]);
            broadcast(member, vec![mine], 1).unwrap()
        });
        for result in results {
            assert_eq!(result[0].to_vec::<f32>().unwrap(), vec![11.0, 11.0]);
        }
    }

    #[test]
    fn tensors_of_other_sizes_are_a_mismatch() {
        let results = run_ranks(2, |member| {
            let size = 2 + member.rank();
            all_reduce_mean(member, vec![TensorData::new(vec![1.0f32; size], [size])])
        });
        for result in results {
            assert!(matches!(result, Err(DistError::Mismatch(_))), "{result:?}");
        }
    }
}
