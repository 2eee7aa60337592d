//! Monthly sunspot numbers (NOAA NGDC, public domain; see `data/README.md`) as a
//! one-step-ahead forecasting task.
//!
//! The series is split in time: the first 80 % trains, the rest is held out. Values are
//! standardized with the training split's mean and deviation. A training window of
//! `seq_len` months is the input; the target at each month is the *change* to the next
//! month, so a model that outputs zero is the naive forecast (last value repeated) and
//! anything it learns must beat that baseline.

use burn::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::Batch;

/// The embedded CSV (`year,month,sunspots`).
const CSV: &str = include_str!("../data/sunspots_monthly.csv");

/// Share of the series, from its start, used for training.
const TRAIN_SHARE: f64 = 0.8;

/// Why the embedded series could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SeriesError {
    /// A line that is not `year,month,value`.
    #[error("line {line}: expected `year,month,sunspots`, found {text:?}")]
    Malformed { line: usize, text: String },
    /// Too few months to train and evaluate with windows of this length.
    #[error("{months} months cannot hold a training window of {seq_len} plus a held-out split")]
    TooShort { months: usize, seq_len: usize },
}

/// The monthly series, standardized, with its split point.
#[derive(Clone, Debug)]
pub struct Sunspots {
    /// Raw monthly means, in sunspot numbers.
    pub raw: Vec<f32>,
    /// `(raw - mean) / std`, with the training split's mean and deviation.
    pub standardized: Vec<f32>,
    /// First month of the held-out split.
    pub split: usize,
    /// Training split's mean.
    pub mean: f32,
    /// Training split's standard deviation.
    pub std: f32,
}

/// Held-out errors of the model and of the naive forecast, in sunspot numbers.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Evaluation {
    /// Root mean squared error of the model's one-month-ahead forecasts.
    pub rmse: f32,
    /// Root mean squared error of repeating the last month.
    pub naive_rmse: f32,
    /// Months forecast.
    pub months: usize,
}

impl Sunspots {
    /// The embedded series.
    pub fn load() -> Result<Self, SeriesError> {
        Self::parse(CSV)
    }

    /// Parses `year,month,sunspots` lines after a header line.
    pub fn parse(csv: &str) -> Result<Self, SeriesError> {
        let mut raw = Vec::new();
        for (index, text) in csv.lines().enumerate().skip(1) {
            let malformed = || SeriesError::Malformed {
                line: index + 1,
                text: text.to_owned(),
            };
            let value = text.split(',').nth(2).ok_or_else(malformed)?;
            raw.push(value.trim().parse::<f32>().map_err(|_| malformed())?);
        }
        let split = (raw.len() as f64 * TRAIN_SHARE) as usize;
        let train = &raw[..split];
        let mean = train.iter().sum::<f32>() / split.max(1) as f32;
        let var = train.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / split.max(1) as f32;
        let std = var.sqrt().max(f32::EPSILON);
        let standardized = raw.iter().map(|v| (v - mean) / std).collect();
        Ok(Self {
            raw,
            standardized,
            split,
            mean,
            std,
        })
    }

    /// Start months of the training windows: every `stride` months, each window
    /// (`seq_len` inputs and one month beyond) inside the training split.
    pub fn window_starts(&self, seq_len: usize, stride: usize) -> Result<Vec<usize>, SeriesError> {
        let too_short = SeriesError::TooShort {
            months: self.raw.len(),
            seq_len,
        };
        if seq_len == 0 || self.split < seq_len + 1 || self.split == self.raw.len() {
            return Err(too_short);
        }
        Ok((0..=self.split - seq_len - 1)
            .step_by(stride.max(1))
            .collect())
    }

    /// Start months of held-out windows, every `stride` months: each window's
    /// inputs and targets lie in the held-out split.
    pub fn held_out_starts(
        &self,
        seq_len: usize,
        stride: usize,
    ) -> Result<Vec<usize>, SeriesError> {
        let end = self.raw.len();
        if seq_len == 0 || self.split + seq_len + 1 > end {
            return Err(SeriesError::TooShort {
                months: end,
                seq_len,
            });
        }
        Ok((self.split..=end - seq_len - 1)
            .step_by(stride.max(1))
            .collect())
    }

    /// One epoch of full batches over every training window, shuffled (a partial last batch
    /// is dropped, so every step has the same shape and replays one graph).
    pub fn epoch(
        &self,
        seq_len: usize,
        batch: usize,
        rng: &mut StdRng,
    ) -> Result<Vec<Vec<usize>>, SeriesError> {
        let mut starts = self.window_starts(seq_len, 1)?;
        starts.shuffle(rng);
        Ok(starts
            .chunks_exact(batch.max(1))
            .map(<[usize]>::to_vec)
            .collect())
    }

    /// The batch of windows starting at `starts`: inputs `[batch, seq_len, 1]`, targets
    /// the next month's change `[batch, seq_len, 1]`.
    pub fn batch<B: Backend>(
        &self,
        starts: &[usize],
        seq_len: usize,
        device: &B::Device,
    ) -> Batch<B> {
        let z = &self.standardized;
        let x: Vec<f32> = starts
            .iter()
            .flat_map(|&s| z[s..s + seq_len].to_vec())
            .collect();
        let y: Vec<f32> = starts
            .iter()
            .flat_map(|&s| (s..s + seq_len).map(|t| z[t + 1] - z[t]))
            .collect();
        let shape = [starts.len(), seq_len, 1];
        Batch {
            x: Tensor::from_data(TensorData::new(x, shape), device),
            y: Tensor::from_data(TensorData::new(y, shape), device),
        }
    }

    /// Inputs for forecasting every held-out month: the series from `context` months
    /// before the split up to the month before the last, as `[1, months, 1]`.
    pub fn held_out_input<B: Backend>(&self, context: usize, device: &B::Device) -> Tensor<B, 3> {
        let from = self.split.saturating_sub(context + 1);
        let inputs = self.standardized[from..self.raw.len() - 1].to_vec();
        let months = inputs.len();
        Tensor::from_data(TensorData::new(inputs, [1, months, 1]), device)
    }

    /// Scores predicted changes (the model's output for [`Self::held_out_input`]) on the
    /// held-out months, against the naive forecast.
    pub fn evaluate(&self, context: usize, predicted_changes: &[f32]) -> Evaluation {
        let from = self.split.saturating_sub(context + 1);
        let (mut model, mut naive, mut months) = (0.0f64, 0.0f64, 0usize);
        for (offset, change) in predicted_changes.iter().enumerate() {
            let last = from + offset;
            let next = last + 1;
            if next < self.split {
                continue;
            }
            let forecast = self.raw[last] + change * self.std;
            model += f64::from(forecast - self.raw[next]).powi(2);
            naive += f64::from(self.raw[last] - self.raw[next]).powi(2);
            months += 1;
        }
        let rmse = |sum: f64| (sum / months.max(1) as f64).sqrt() as f32;
        Evaluation {
            rmse: rmse(model),
            naive_rmse: rmse(naive),
            months,
        }
    }
}

/// A seeded RNG for shuffling windows.
pub fn shuffler(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn the_embedded_series_is_the_whole_monthly_record() {
        let series = Sunspots::load().unwrap();
        assert_eq!(series.raw.len(), 3126, "Jan 1749 to Jun 2009");
        assert_eq!(series.raw[0], 58.0);
        assert_eq!(series.split, 2500);
        let mean = series.standardized[..series.split].iter().sum::<f32>() / 2500.0;
        assert!(mean.abs() < 1e-4, "{mean}");
    }

    #[test]
    fn a_malformed_line_is_named() {
        let err = Sunspots::parse("year,month,sunspots\n1749,1,58\n1749,2\n").unwrap_err();
        assert!(
            matches!(err, SeriesError::Malformed { line: 3, .. }),
            "{err}"
        );
    }

    #[test]
    fn windows_stay_inside_the_training_split() {
        let series = Sunspots::load().unwrap();
        let starts = series.window_starts(64, 8).unwrap();
        assert!(starts.iter().all(|s| s + 64 < series.split));
        assert!(
            Sunspots::parse("h\n1,1,1\n1,2,2\n")
                .unwrap()
                .window_starts(4, 1)
                .is_err()
        );
    }

    #[test]
    fn targets_are_next_month_changes() {
        let series = Sunspots::load().unwrap();
        let batch = series.batch::<Flex>(&[10], 4, &Default::default());
        let x = batch.x.into_data().to_vec::<f32>().unwrap();
        let y = batch.y.into_data().to_vec::<f32>().unwrap();
        assert_eq!(x, series.standardized[10..14]);
        assert_eq!(y[3], series.standardized[14] - series.standardized[13]);
    }

    #[test]
    fn zero_changes_score_as_the_naive_forecast() {
        let series = Sunspots::load().unwrap();
        let input = series.held_out_input::<Flex>(16, &Default::default());
        let months = input.dims()[1];
        let eval = series.evaluate(16, &vec![0.0; months]);
        assert_eq!(eval.months, series.raw.len() - series.split);
        assert_eq!(eval.rmse, eval.naive_rmse);
        assert!(eval.naive_rmse > 10.0, "{eval:?}");
    }
}
